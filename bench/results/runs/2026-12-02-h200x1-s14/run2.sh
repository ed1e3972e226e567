#!/bin/bash
# s14 GPU run 2 (one H200): the quick suite on the PreMulSum binaries (Args
# is 176 bytes and every kernel's prims changed), scenarios one GPU can run.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run2.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s14
cd $G
timeout 560 ./mk_gpu_tests --quick --skip huge_2gpu_2proc 2>&1 | grep -E "^(PASS|FAIL|SKIP)|passed|FAIL|rror" | tail -60
echo "   rc=${PIPESTATUS[0]}"
