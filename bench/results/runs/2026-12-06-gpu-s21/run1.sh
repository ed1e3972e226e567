#!/bin/bash
# s21 GPU run 1 (one GPU): issue 34 changed what the device path sees of
# handles (mkCommRegister returns a token, not the buffer's address; PreMulSum
# op handles are never reused; communicator handles are ids) and how plans are
# read and written (trusted_fs); issue 33's review fixes changed the fused
# path's host side (alias verdicts, checked-accessor plans). Runs the
# scenarios those touch, then memcheck of the registered and fused ones.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run1.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s21
cd $G
nvidia-smi -L
git -C $R log -1 --format='commit %H' 2>/dev/null || true
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
t0=$(date +%s); ./mk_gpu_tests --prewarm $arch > $O/prewarm.log 2>&1; echo "prewarm rc=$? ($(( $(date +%s) - t0 )) s)"
run() {  # name limit [args]
  local s=$1 t=$2; shift 2
  echo "== $s $*"
  local t0=$(date +%s)
  timeout $t ./mk_gpu_tests "$@" --only =$s > $O/$s.log 2>&1; local rc=$?
  tail -3 $O/$s.log; echo "   rc=$rc ($(( $(date +%s) - t0 )) s)"
}
for s in registered_1rank registered_2gpu_1proc registered_2gpu_2proc registered_errors_2proc \
         premulsum_share_gpu_3ranks_1proc premulsum_share_gpu_2ranks_2proc fused_share_gpu_3ranks_1proc \
         fused_checked_share_gpu_2ranks_1proc abort_race_2gpu_1proc abort_tells_peer_2proc split_2ranks_2proc \
         bad_input_1rank wrong_arch_plan matrix_1rank; do
  run $s 60 --quick
done
san() {  # tool name limit
  echo "== $1 $2 --quick"
  timeout $3 /usr/local/cuda/bin/compute-sanitizer --tool $1 --error-exitcode 9 ./mk_gpu_tests --quick --only =$2 > $O/$1-$2.log 2>&1
  echo "   rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASS|FAIL" $O/$1-$2.log | tail -3
}
san memcheck registered_2gpu_1proc 60
san memcheck premulsum_share_gpu_3ranks_1proc 60
