#!/bin/bash
# s20 GPU run 1 (one GPU): issue 33's device changes. Float max/min are now
# commutative and associative bit for bit (NaNs ignored, +0 above -0), and
# fused plans can be built with checked epilogue accessors (MK_FUSION_CHECK=1).
# New scenarios: minmax_order_* (zeros of two signs and NaNs, every rank the
# same bits), fused_checked_* (the fused scenario with checked accessors: no
# false trap), fusion_check_trap_1rank (a row-5-only store past the row that
# the CPU checker cannot reach: traps with its message). Then the unchecked
# fused and prologue scenarios, and memcheck / racecheck of the new ones.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run1.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s20
cd $G
nvidia-smi -L
run() {  # name limit [args]
  local s=$1 t=$2; shift 2
  echo "== $s $*"
  local t0=$(date +%s)
  timeout $t ./mk_gpu_tests "$@" --only =$s > $O/$s.log 2>&1; local rc=$?
  tail -4 $O/$s.log; echo "   rc=$rc ($(( $(date +%s) - t0 )) s)"
}
run minmax_order_share_gpu_3ranks_1proc 120 --quick
run minmax_order_1rank 60 --quick
run fusion_check_trap_1rank 60
run fused_checked_share_gpu_2ranks_1proc 150 --quick
run fused_share_gpu_3ranks_1proc 90 --quick
run prologue_share_gpu_3ranks_1proc 60 --quick
san() {  # tool name limit
  echo "== $1 $2 --quick"
  timeout $3 /usr/local/cuda/bin/compute-sanitizer --tool $1 --error-exitcode 9 ./mk_gpu_tests --quick --only =$2 > $O/$1-$2.log 2>&1
  echo "   rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASS|FAIL" $O/$1-$2.log | tail -3
}
san memcheck minmax_order_share_gpu_3ranks_1proc 90
san racecheck minmax_order_1rank 90
san memcheck fused_checked_share_gpu_2ranks_1proc 90
