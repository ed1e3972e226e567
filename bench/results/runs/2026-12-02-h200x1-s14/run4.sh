#!/bin/bash
# s14 GPU run 4 (one H200): tests/gpu/torch_check.py at world 2 sharing the
# GPU, with its new PREMUL_SUM checks (number and tensor factors, all_reduce
# and reduce_scatter_tensor, fp32 and bf16; must not go to NCCL).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run4.log) 2>&1
export PYTHONPATH=$R/python MK_LIBMKERNEL=$G/libmkernel.so.0 MK_CACHE_DIR=/tmp/mkc-s14t
cd /tmp
TR="python3 -m torch.distributed.run --master-port 29617"
timeout 330 $TR --nproc-per-node 2 $R/tests/gpu/torch_check.py --share-gpu 2>&1 | grep -E "TORCH CHECK|FAIL|SKIP|calls by|Error|rror"
echo "   rc=${PIPESTATUS[0]}"
