#!/bin/bash
# s15 GPU run 1 (one H200): fused epilogues (mkAllReduceFused: allreduce.rmsnorm,
# allreduce.fp8_rows) against the float64 references, ranks sharing the GPU;
# then PreMulSum after its rounding fixes (9c4c129, 13a6fca: never run on a GPU);
# then memcheck of the fused scenario (quick).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run1.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s15
cd $G
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for s in fused_share_gpu_3ranks_1proc fused_share_gpu_2ranks_2proc premulsum_share_gpu_3ranks_1proc premulsum_share_gpu_2ranks_2proc; do
  echo "== $s"; timeout 200 ./mk_gpu_tests --only $s 2>&1 | tail -8; echo "   rc=${PIPESTATUS[0]}"
done
echo "== memcheck fused_share_gpu_3ranks_1proc --quick"
timeout 150 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 ./mk_gpu_tests --quick --only fused_share_gpu_3ranks_1proc 2>&1 | grep -E "ERROR SUMMARY|FAIL|rror|passed" | tail -5; echo "   rc=${PIPESTATUS[0]}"
echo "== done"
