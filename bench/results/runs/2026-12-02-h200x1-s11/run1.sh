#!/bin/bash
# s11 GPU run 1 (one H200): the copy-engine path (allgather.ce, alltoall.ce,
# broadcast.ce; runtime/ce.hpp). Correctness: the GPU suite's copy_engine_*
# scenarios (ranks sharing the GPU, one process and two), memcheck over the
# bench with every size checked; then the one-GPU proxy side by side: SM
# kernels vs copy engines, eager and in graphs; and the quick matrix as a
# regression check of the kernel path.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run1.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s11
CE="allgather=allgather.ce,alltoall=alltoall.ce,broadcast=broadcast.ce"
B="$G/mk_bench --share-gpu -g 2"
L="commit $(cat $R/.commit 2>/dev/null), one H200 (nvidia-h200), ranks sharing it"
run() { local tag=$1; shift; echo "== $tag: $*"; local t0=$(date +%s%N); "$@" | grep -E "^  |rror|WRONG|failed|PASS|FAIL|passed"; echo "   ($(( ($(date +%s%N) - t0) / 1000000 )) ms)"; }
nvidia-smi -L
run suite-ce timeout 200 $G/mk_gpu_tests --quick --only copy_engine
echo "== memcheck (copy engines, 64 KiB tiles, every batch checked)"
MK_ALGO=$CE MK_TUNE=ce_tile=65536 timeout 150 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 $B -c allgather,alltoall,broadcast -b 8 -e 4M -f 8 -n 2 --batches 2 --warmup-ms 0 2>&1 | grep -E "ERROR SUMMARY|WRONG|rror" | tail -3; echo "   rc=${PIPESTATUS[0]}"
run sm-eager timeout 90 $B -c allgather,alltoall,broadcast -b 1M -e 256M -f 4 --label "$L, SM kernels" --out $O/sm-eager.md
MK_ALGO=$CE run ce-eager timeout 90 $B -c allgather,alltoall,broadcast -b 1M -e 256M -f 4 --label "$L, copy engines (4 MiB tiles)" --out $O/ce-eager.md
MK_ALGO=$CE MK_TUNE=ce_tile=16777216 run ce-eager-16m timeout 90 $B -c allgather,alltoall,broadcast -b 16M -e 256M -f 4 --label "$L, copy engines (16 MiB tiles)" --out $O/ce-eager-16m.md
run sm-graph timeout 60 $B -c allgather,broadcast -b 1M -e 64M -f 4 -G --label "$L, SM kernels, graphs" --out $O/sm-graph.md
MK_ALGO=$CE run ce-graph timeout 60 $B -c allgather,broadcast -b 1M -e 64M -f 4 -G --label "$L, copy engines, graphs" --out $O/ce-graph.md
run suite-matrix timeout 150 $G/mk_gpu_tests --quick --only matrix
echo "== done"
