#!/bin/bash
# s13 GPU run 6 (one H200): compute-sanitizer memcheck of main's built-in
# kernels (binaries of f6312f2; device code unchanged since 51b445f), default
# selection, 2 ranks fp32 and 3 ranks bf16 sharing the GPU, odd sizes.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run6.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s13c
C=allreduce,allgather,reducescatter,alltoall,broadcast,reduce
for cfg in "-g 2 -d fp32" "-g 3 -d bf16"; do
  echo "== memcheck $cfg"
  timeout 200 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 $G/mk_bench --share-gpu $cfg -c $C -b 100 -e 1M -f 6 -n 2 --batches 2 --warmup-ms 0 2>&1 | grep -E "ERROR SUMMARY|WRONG|rror" | tail -3; echo "   rc=${PIPESTATUS[0]}"
done
echo "== done"
