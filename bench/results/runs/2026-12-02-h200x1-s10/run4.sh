#!/bin/bash
# s10 GPU run 4 (one H200), after the review's fixes (the streaming loop's
# quarter batches for small tiles changed device code): the proxy tables
# again (bf16; fp32 at a few sizes), memcheck, mk_bench's process mode with
# NCCL at 1 rank (the path the 2-GPU run will use), and the GPU suite's
# matrix and boundary scenarios.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run4.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-r4
B="$G/mk_bench --share-gpu -g 2"
ALL=allreduce,allgather,reducescatter,broadcast,reduce,alltoall
L="commit 318d381, one H200 (nvidia-h200), ranks sharing it"
run() { local tag=$1; shift; echo "== $tag: $*"; local t0=$(date +%s%N); "$@" | grep -E "^  |rror|WRONG|failed"; echo "   ($(( ($(date +%s%N) - t0) / 1000000 )) ms)"; }
run eager timeout 170 $B -c $ALL -b 8 -e 256M --prewarm --label "$L" --out $O/eager.md --json $O/eager.json --plot $O/eager.svg
run graph timeout 120 $B -c allreduce,allgather,reducescatter -b 8 -e 16M -G --label "$L" --out $O/graph.md
run reg timeout 90 $B -c allreduce,allgather,reducescatter -b 1M -e 256M -f 4 --register --label "$L" --out $O/reg.md
run fp32 timeout 90 $B -c allreduce,allgather,reducescatter -d fp32 -b 1K -e 64M -f 8 --batches 10
echo "== memcheck"
MK_ZERO_COPY_MIN_BYTES=0 timeout 120 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 $B -c $ALL -b 8 -e 4M -f 8 -n 2 --batches 2 --warmup-ms 0 2>&1 | grep -E "ERROR SUMMARY|WRONG|rror" | tail -3; echo "   rc=${PIPESTATUS[0]}"
run nccl-1rank timeout 90 $G/mk_bench -g 1 -c allreduce,allgather,reducescatter -b 1K -e 16M -f 16 --batches 5 --out $O/nccl-1rank.md
run nccl-1rank-reg timeout 90 $G/mk_bench -g 1 -c allreduce,allgather -b 1M -e 16M -f 16 --batches 5 --register
t0=$(date +%s); timeout 200 $G/mk_gpu_tests --prewarm 90 | tail -1; echo "prewarm $(( $(date +%s) - t0 )) s"
timeout 150 $G/mk_gpu_tests --quick --only matrix | grep -E "PASS|FAIL|passed"
timeout 100 $G/mk_gpu_tests --quick --only sizes | grep -E "PASS|FAIL|passed"
echo "== done"
