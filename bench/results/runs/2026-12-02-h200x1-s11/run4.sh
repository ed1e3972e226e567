#!/bin/bash
# s11 GPU run 4 (one H200): reduce-scatter and all-reduce on copy engines
# (reducescatter.ce, allreduce.ce: copy-engine transfers, a kernel reducing
# each tile as it lands). Correctness: 3 ranks sharing the GPU (every dtype
# and op), memcheck over the bench (every batch checked); then the proxy side
# by side with the SM kernels; then the 2-rank suite scenarios.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run4.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s11
CE="allgather=allgather.ce,alltoall=alltoall.ce,broadcast=broadcast.ce,reducescatter=reducescatter.ce,allreduce=allreduce.ce"
B="$G/mk_bench --share-gpu -g 2"
L="commit $(cat $R/.commit 2>/dev/null), one H200 (nvidia-h200), ranks sharing it"
run() { local tag=$1; shift; echo "== $tag: $*"; local t0=$(date +%s%N); "$@" | grep -E "^  |rror|WRONG|failed|PASS|FAIL|passed|checked"; echo "   ($(( ($(date +%s%N) - t0) / 1000000 )) ms)"; }
run suite-3ranks timeout 150 $G/mk_gpu_tests --only copy_engine_share_gpu_3ranks
echo "== memcheck (reduce-scatter and all-reduce on copy engines, 64 KiB tiles, every batch checked)"
MK_ALGO=$CE MK_TUNE=ce_tile=65536 timeout 120 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 $B -c allreduce,reducescatter -b 8 -e 4M -f 8 -n 2 --batches 2 --warmup-ms 0 2>&1 | grep -E "ERROR SUMMARY|WRONG|rror" | tail -3; echo "   rc=${PIPESTATUS[0]}"
run sm-eager timeout 60 $B -c allreduce,reducescatter -b 1M -e 256M -f 4 --label "$L, SM kernels" --out $O/sm-eager.md
MK_ALGO=$CE run ce-eager timeout 60 $B -c allreduce,reducescatter -b 1M -e 256M -f 4 --label "$L, copy engines (default tile)" --out $O/ce-eager.md
MK_ALGO=$CE run ce-eager-fp32 timeout 60 $B -c allreduce,reducescatter -d fp32 -b 1M -e 64M -f 8 --batches 10
run suite-2ranks timeout 240 $G/mk_gpu_tests --quick --only copy_engine_2gpu
echo "== done"
