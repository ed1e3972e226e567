#!/bin/bash
# s14 GPU run 1 (one H200): PreMulSum on the GPU (ranks sharing it) against
# the float64 reference, then memcheck of one PreMulSum scenario, then the
# quick suite for regressions (Args grew to 176 bytes; every kernel changed).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run1.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s14
cd $G
for s in premulsum_share_gpu_3ranks_1proc premulsum_share_gpu_2ranks_2proc; do
  echo "== $s"; timeout 400 ./mk_gpu_tests --only $s 2>&1 | tail -6; echo "   rc=${PIPESTATUS[0]}"
done
echo "== memcheck premulsum_share_gpu_3ranks_1proc"
timeout 300 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 ./mk_gpu_tests --only premulsum_share_gpu_3ranks_1proc 2>&1 | grep -E "ERROR SUMMARY|FAIL|rror|passed" | tail -5; echo "   rc=${PIPESTATUS[0]}"
echo "== done"
