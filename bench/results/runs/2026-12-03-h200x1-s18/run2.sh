#!/bin/bash
# s18 GPU run 2 (one H200): mk_bench --fused (bench/fused_bench.cpp), fused
# all-reduce + residual + RMSNorm against mKernel's and NCCL's all-reduce
# followed by two kernels; one rank (eager and graph) and two ranks sharing
# the GPU: one-GPU proxies. Then the abort_race flake of s17 in a loop,
# each run's output kept.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run2.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s18
cd $G
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
echo "== mk_bench --fused --ranks 1 (eager)"
timeout 200 ./mk_bench --fused --ranks 1 --out $O/fused-1rank-eager.md
echo "== mk_bench --fused --ranks 1 --graph"
timeout 200 ./mk_bench --fused --ranks 1 --graph --out $O/fused-1rank-graph.md
echo "== mk_bench --fused --share-gpu --ranks 2"
timeout 150 ./mk_bench --fused --share-gpu --ranks 2 --out $O/fused-2share.md
run() {  # name limit [args]
  local s=$1 t=$2; shift 2
  echo "== $s $*"
  local t0=$(date +%s)
  timeout $t ./mk_gpu_tests "$@" --only $s > $O/$s$SUF.log 2>&1; local rc=$?
  tail -3 $O/$s$SUF.log; echo "   rc=$rc ($(( $(date +%s) - t0 )) s)"
}
for i in 1 2 3 4 5 6; do SUF=-$i run abort_race_2gpu_1proc 40 --quick; done
grep -l FAIL $O/abort_race_2gpu_1proc-*.log 2>/dev/null | while read f; do echo "== failed: $f"; tail -30 $f; done
