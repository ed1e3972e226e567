#!/bin/bash
# s10 GPU run 3 (one H200), part A: the GPU suite in quick mode on the final
# device code (one-pass LL, the split primitives, PDL, zero-copy
# allreduce.direct / reducescatter.pull, table selection).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run3.log) 2>&1
export LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-suite MK_TIMEOUT_MS=60000
nvidia-smi -L
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
t0=$(date +%s); timeout 250 $G/mk_gpu_tests --prewarm $arch | tail -3; echo "prewarm $(( $(date +%s) - t0 )) s"
t0=$(date +%s); timeout 300 $G/mk_gpu_tests --quick; echo "suite rc=$? $(( $(date +%s) - t0 )) s"
