#!/bin/bash
# s19 GPU run 2 (one H200): run 1's memcheck of the prologue scenario showed
# 18 "errors", all CUDA_ERROR_NOT_FOUND from cuModuleGetFunction: run 1's
# build probed each fused module for an "_epi" kernel (a prologue-only
# fusion has none). Now the registry says which fusions have one (02b8d40):
# memcheck again; and the two scenarios run 1's 50 s limit cut while they
# compiled their plans (cold cache), with more time.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run2.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s19
cd $G
run() {  # name limit [args]
  local s=$1 t=$2; shift 2
  echo "== $s $*"
  local t0=$(date +%s)
  timeout $t ./mk_gpu_tests "$@" --only $s > $O/$s.log 2>&1; local rc=$?
  tail -3 $O/$s.log; echo "   rc=$rc ($(( $(date +%s) - t0 )) s)"
}
for s in prologue_share_gpu_3ranks_1proc fused_share_gpu_3ranks_1proc; do
  echo "== memcheck $s --quick"
  timeout 90 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 ./mk_gpu_tests --quick --only $s > $O/memcheck-$s.log 2>&1
  echo "   rc=$?"; grep -E "ERROR SUMMARY|PASS|FAIL" $O/memcheck-$s.log | tail -3
done
run premulsum_share_gpu_3ranks_1proc 180 --quick
run matrix_1rank 180 --quick
