#!/bin/bash
# s11 GPU run 2 (one H200): the copy-engine suite scenarios after a prewarm
# (run 1's ran out of time compiling the matrix's kernel plans), and the
# proxy with the default tile (by rank count: 10 MiB at 2 ranks).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run2.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s11
CE="allgather=allgather.ce,alltoall=alltoall.ce,broadcast=broadcast.ce"
B="$G/mk_bench --share-gpu -g 2"
L="commit $(cat $R/.commit 2>/dev/null), one H200 (nvidia-h200), ranks sharing it"
run() { local tag=$1; shift; echo "== $tag: $*"; local t0=$(date +%s%N); "$@" | grep -E "^  |rror|WRONG|failed|PASS|FAIL|passed|checked"; echo "   ($(( ($(date +%s%N) - t0) / 1000000 )) ms)"; }
MK_ALGO=$CE run ce-eager timeout 60 $B -c allgather,alltoall,broadcast -b 1M -e 256M -f 4 --label "$L, copy engines (default tile)" --out $O/ce-eager.md
MK_ALGO=$CE run ce-graph timeout 60 $B -c allgather,broadcast -b 1M -e 256M -f 4 -G --label "$L, copy engines (default tile), graphs" --out $O/ce-graph.md
t0=$(date +%s); timeout 200 $G/mk_gpu_tests --prewarm 90 | tail -1; echo "prewarm $(( $(date +%s) - t0 )) s"
run suite-ce timeout 280 $G/mk_gpu_tests --quick --only copy_engine
echo "== done"
