#!/bin/bash
# s15 GPU run 2 (one H200): tests/gpu/torch_check.py at world 2 sharing the
# GPU (now with the fused ops: all_reduce_rmsnorm, all_reduce_fp8, eager,
# torch.compile, CUDA graph); then bench/fused_rmsnorm.py at world 1 (fused
# vs mKernel + torch ops vs NCCL + torch ops) and world 2 sharing the GPU
# (fused vs mKernel + torch ops; NCCL cannot share a GPU).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run2.log) 2>&1
export PYTHONPATH=$R/python MK_LIBMKERNEL=$G/libmkernel.so.0 MK_CACHE_DIR=/tmp/mkc-s15t
cd /tmp
TR="python3 -m torch.distributed.run --master-port 29618"
timeout 200 $TR --nproc-per-node 2 $R/tests/gpu/torch_check.py --share-gpu 2>&1 | grep -E "TORCH CHECK|FAIL|SKIP|calls by|Error|rror"
echo "   rc=${PIPESTATUS[0]}"
echo "== bench world 1"
timeout 200 $TR --nproc-per-node 1 $R/bench/fused_rmsnorm.py --out $O/fused-w1.md 2>&1 | grep -vE "^\s*$|Warning|warn"
echo "   rc=${PIPESTATUS[0]}"
echo "== bench world 2 sharing GPU 0"
timeout 150 $TR --nproc-per-node 2 $R/bench/fused_rmsnorm.py --share-gpu --out $O/fused-w2share.md 2>&1 | grep -vE "^\s*$|Warning|warn"
echo "   rc=${PIPESTATUS[0]}"
