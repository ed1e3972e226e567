#!/bin/bash
# s18 GPU run 1 (one H200): fusion prologues (templates/prims.cuh Combine now
# takes the plan's prologue; every kernel's code changed): the prologue
# scenarios against the PreMulSum op bit for bit and float64, memcheck, and a
# regression cross-section of kernels without a prologue.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run1.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s18
cd $G
run() {  # name limit [args]
  local s=$1 t=$2; shift 2
  echo "== $s $*"
  local t0=$(date +%s)
  timeout $t ./mk_gpu_tests "$@" --only $s > $O/$s$SUF.log 2>&1; local rc=$?
  tail -3 $O/$s$SUF.log; echo "   rc=$rc ($(( $(date +%s) - t0 )) s)"
}
run prologue_share_gpu_3ranks_1proc 150
run prologue_share_gpu_2ranks_2proc 120 --quick
echo "== memcheck prologue_share_gpu_3ranks_1proc --quick"
timeout 150 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 ./mk_gpu_tests --quick --only prologue_share_gpu_3ranks_1proc 2>&1 | tail -3; echo "   rc=${PIPESTATUS[0]}"
for s in matrix_1rank premulsum_share_gpu_3ranks_1proc fused_share_gpu_3ranks_1proc edge_values_share_gpu_3ranks_1proc group_fused_share_gpu_3ranks_1proc; do
  run $s 90 --quick
done
