#!/bin/bash
# s22 GPU run 1 (one GPU). Issue 35 changed device code: one-pass kernels run
# a reduce whose sources' kinds differ per rank as one generic op (kernel.cuh
# op_gpass: operands from the rank's table row, LL/Lamport masks at run time)
# instead of a code path per rank; Ctx::fail's work moved out of line
# (fail_record). This run: (1) speed of the old and new libraries side by
# side (mk_bench --share-gpu, graphs, the one-shot sizes), alternating;
# (2) correctness: the new 6/8-rank scenarios and the ones issue 34 touched;
# (3) memcheck and racecheck of the generic one-pass op and of the failure path.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run1.log) 2>&1
export MK_TIMEOUT_MS=20000
nvidia-smi -L
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
bench() {  # which ranks dtype round
  local w=$1 n=$2 t=$3 k=$4
  echo "== bench $w n=$n $t round $k"
  local t0=$(date +%s)
  MK_CACHE_DIR=/tmp/mkc-$w LD_LIBRARY_PATH=$G/$w timeout 240 $G/new/mk_bench --share-gpu -g $n -c allreduce -d $t \
    -b 8 -e 256K -f 4 -G --batches 15 --label "$w" --out $O/bench-$w-n$n-$t-r$k.md > $O/bench-$w-n$n-$t-r$k.log 2>&1
  echo "   rc=$? ($(( $(date +%s) - t0 )) s)"
  grep -E "^\|" $O/bench-$w-n$n-$t-r$k.md | head -14
}
# first use (cold cache, includes JIT) then warm rounds, old and new alternating
for k in 1 2; do
  for w in old new; do bench $w 8 bf16 $k; done
done
for w in new old; do bench $w 8 fp32 1; bench $w 4 bf16 1; done
cd $G/new
export LD_LIBRARY_PATH=$G/new MK_CACHE_DIR=/tmp/mkc-new
run() {  # name limit [args]
  local s=$1 t=$2; shift 2
  echo "== $s $*"
  local t0=$(date +%s)
  timeout $t ./mk_gpu_tests "$@" --only =$s > $O/$s.log 2>&1; local rc=$?
  tail -2 $O/$s.log; echo "   rc=$rc ($(( $(date +%s) - t0 )) s)"
}
for s in share_gpu_6ranks_1proc share_gpu_8ranks_1proc premulsum_share_gpu_8ranks_1proc prologue_share_gpu_8ranks_1proc \
         share_gpu_3ranks_1proc ranks_share_gpu_4ranks_1proc share_gpu_10ranks_1proc_wide killed_peer_2proc \
         stalled_rank_2proc abort_race_2gpu_1proc abort_tells_peer_2proc registered_1rank registered_2gpu_1proc \
         registered_errors_2proc premulsum_share_gpu_3ranks_1proc fused_share_gpu_3ranks_1proc \
         fused_checked_share_gpu_2ranks_1proc split_2ranks_2proc bad_input_1rank wrong_arch_plan edge_values_share_gpu_3ranks_1proc; do
  run $s 150 --quick
done
san() {  # tool name limit
  echo "== $1 $2 --quick"
  timeout $3 /usr/local/cuda/bin/compute-sanitizer --tool $1 --error-exitcode 9 ./mk_gpu_tests --quick --only =$2 > $O/$1-$2.log 2>&1
  echo "   rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" $O/$1-$2.log | tail -3
}
san memcheck share_gpu_6ranks_1proc 120
san racecheck share_gpu_6ranks_1proc 150
san memcheck stalled_rank_2proc 90
