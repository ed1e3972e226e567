#!/bin/bash
# s12 GPU run 1 (one H200): Lamport packets in one-pass kernels (float
# dtypes). Graph latency proxy with lamport=1 (default) vs 0 from 1 KiB to
# 4 MiB; the one-pass bucket stretched to 4 MiB (ll_max) to see where one
# pass stops paying; memcheck; the GPU suite's matrix and sizes.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run1.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s12
B="$G/mk_bench --share-gpu -g 2"
C=allreduce,allgather,reducescatter,alltoall
L="commit $(cat $R/.commit 2>/dev/null)+lamport, one H200 (nvidia-h200), ranks sharing it"
run() { local tag=$1; shift; echo "== $tag: $*"; local t0=$(date +%s%N); "$@" | grep -E "^  |rror|WRONG|failed|PASS|FAIL|passed"; echo "   ($(( ($(date +%s%N) - t0) / 1000000 )) ms)"; }
run graph-lamport timeout 60 $B -c $C -b 1K -e 4M -G --label "$L, lamport=1" --out $O/graph-lamport.md
MK_TUNE=lamport=0 run graph-ll timeout 60 $B -c $C -b 1K -e 4M -G --label "$L, lamport=0" --out $O/graph-ll.md
export MK_ALGO=allreduce=allreduce.one_shot
MK_TUNE=ll_max=4194304 run graph-1pass4M-lamport timeout 60 $B -c $C -b 256K -e 4M -G --label "$L, one pass to 4 MiB, lamport=1" --out $O/graph-1pass4M-lamport.md
MK_TUNE=ll_max=4194304,lamport=0 run graph-1pass4M-ll timeout 60 $B -c $C -b 256K -e 4M -G --label "$L, one pass to 4 MiB, lamport=0" --out $O/graph-1pass4M-ll.md
MK_TUNE=ll_max=4194304 run eager-1pass4M-lamport timeout 60 $B -c $C -b 256K -e 4M --label "$L, one pass to 4 MiB, eager" --out $O/eager-1pass4M-lamport.md
unset MK_ALGO
run eager-default timeout 60 $B -c $C -b 256K -e 4M --label "$L, eager" --out $O/eager-default.md
run fp32-graph timeout 60 $B -c $C -d fp32 -b 1K -e 4M -f 4 -G --batches 10
run fp16-graph timeout 60 $B -c allreduce,reducescatter -d fp16 -b 1K -e 1M -f 8 -G --batches 10
echo "== memcheck"
timeout 100 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 $B -c $C -b 8 -e 1M -f 8 -n 2 --batches 2 --warmup-ms 0 2>&1 | grep -E "ERROR SUMMARY|WRONG|rror" | tail -3; echo "   rc=${PIPESTATUS[0]}"
MK_ALGO=allreduce=allreduce.one_shot MK_TUNE=ll_max=4194304 timeout 100 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 $B -c $C -d fp32 -b 100 -e 4M -f 6 -n 2 --batches 2 --warmup-ms 0 2>&1 | grep -E "ERROR SUMMARY|WRONG|rror" | tail -3; echo "   rc=${PIPESTATUS[0]}"
t0=$(date +%s); timeout 200 $G/mk_gpu_tests --prewarm 90 | tail -1; echo "prewarm $(( $(date +%s) - t0 )) s"
timeout 120 $G/mk_gpu_tests --quick --only matrix | grep -E "PASS|FAIL|passed"
timeout 80 $G/mk_gpu_tests --quick --only sizes | grep -E "PASS|FAIL|passed"
echo "== done"
