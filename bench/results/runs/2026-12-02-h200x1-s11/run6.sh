#!/bin/bash
# s11 GPU run 6 (one H200): the final code after the review's fixes (issue
# steps, reduce kernels loaded with the instance, capture streams): 3 ranks
# sharing the GPU on every copy-engine collective, dtype and op; graphs with
# every batch checked.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run6.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s11
CE="allgather=allgather.ce,alltoall=alltoall.ce,broadcast=broadcast.ce,reducescatter=reducescatter.ce,allreduce=allreduce.ce"
timeout 100 $G/mk_gpu_tests --only copy_engine_share_gpu_3ranks | grep -E "PASS|FAIL|checked|passed"
MK_ALGO=$CE timeout 50 $G/mk_bench --share-gpu -g 2 -c allreduce,allgather,broadcast -b 1M -e 64M -f 8 -G --batches 10 | grep -E "^  |rror|WRONG"
echo "== done"
