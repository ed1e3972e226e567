#!/bin/bash
# s19 GPU run 1 (one H200): after the s18 review's fixes (templates: P::Pre
# defaults to NoPre through PreOf<P>; q.scalar(k)/r.scalar(k) return 0 past
# the 4 slots; runtime passes only the declared scalars and finds the
# epilogue kernel in the module): the prologue and fused scenarios, a
# regression cross-section, memcheck of both fusion kinds.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run1.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s19
cd $G
nvidia-smi -L
run() {  # name limit [args]
  local s=$1 t=$2; shift 2
  echo "== $s $*"
  local t0=$(date +%s)
  timeout $t ./mk_gpu_tests "$@" --only $s > $O/$s.log 2>&1; local rc=$?
  tail -3 $O/$s.log; echo "   rc=$rc ($(( $(date +%s) - t0 )) s)"
}
run prologue_share_gpu_3ranks_1proc 150
run prologue_share_gpu_2ranks_2proc 60 --quick
run fused_share_gpu_3ranks_1proc 70 --quick
run group_fused_share_gpu_3ranks_1proc 60 --quick
run premulsum_share_gpu_3ranks_1proc 50 --quick
run matrix_1rank 50 --quick
for s in prologue_share_gpu_3ranks_1proc fused_share_gpu_3ranks_1proc; do
  echo "== memcheck $s --quick"
  timeout 60 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 ./mk_gpu_tests --quick --only $s > $O/memcheck-$s.log 2>&1
  echo "   rc=$?"; grep -E "ERROR SUMMARY|PASS|FAIL" $O/memcheck-$s.log | tail -3
done
