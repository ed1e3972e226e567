#!/bin/bash
# s11 GPU run 3 (one H200): three ranks sharing the GPU in one process, the
# copy-engine collectives alone (run 2 ran out of time before this scenario).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 MK_TIMEOUT_MS=20000
export LD_LIBRARY_PATH=$PWD/build-gpu MK_CACHE_DIR=/tmp/mkc-s11
(time timeout 300 build-gpu/mk_gpu_tests --only copy_engine_share_gpu_3ranks) 2>&1 | tail -8 | tee $OUT/run3.log
