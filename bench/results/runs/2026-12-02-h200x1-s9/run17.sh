#!/bin/bash
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run17.log) 2>&1
python3 -m pip install --no-index --no-deps --no-build-isolation -C build-dir=$R/gpu-pkg/native -C prebuilt=$R/gpu-pkg/native/prebuilt $R 2>&1 | tail -1
cd /tmp
TR="python3 -m torch.distributed.run --master-port 29613"
T=$R/examples/torch/train_gpt.py
echo "== world 2 DDP, fresh cache, MK_DEBUG"
MK_CACHE_DIR=/tmp/mkc-d1 MK_DEBUG=1 timeout 200 $TR --nproc-per-node 2 $T --share-gpu --backend mkernel --steps 4 2>&1 | grep -E "^step|using|compiled plan|ready|rank 0:" | grep -v "rank 1" | cut -c1-220 | head -40
echo "== world 1 DDP, fresh cache (1-rank plans now shipped)"
MK_CACHE_DIR=/tmp/mkc-d2 timeout 200 $TR --nproc-per-node 1 $T --backend mkernel --steps 6 2>&1 | grep -E "^step"
