#!/bin/bash
# s9 GPU run B: examples/torch/train_gpt.py with --backend mkernel against
# NCCL (world 1) and gloo (world 2 sharing GPU 0: NCCL refuses that), DDP and
# FSDP, and through the wheel's mkernel-run (the NCCL-compatible library).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run16.log) 2>&1
python3 -m pip install --no-index --no-deps --no-build-isolation -C build-dir=$R/gpu-pkg/native -C prebuilt=$R/gpu-pkg/native/prebuilt $R 2>&1 | tail -1
cd /tmp
export MK_CACHE_DIR=/tmp/mkcache-t
TR="python3 -m torch.distributed.run --master-port 29612"
T=$R/examples/torch/train_gpt.py
run() { echo "== $*"; timeout 240 "$@" 2>&1 | grep -E "^step|median|calls by|prewarm|Error|error|mkernel-nccl|stats" | grep -v "^W1"; }
run $TR --nproc-per-node 1 $T --backend nccl
run $TR --nproc-per-node 1 $T --backend mkernel
run $TR --nproc-per-node 2 $T --share-gpu --backend gloo
run $TR --nproc-per-node 2 $T --share-gpu --backend mkernel
run $TR --nproc-per-node 2 $T --share-gpu --backend mkernel --prewarm
run $TR --nproc-per-node 2 $T --share-gpu --backend gloo --fsdp
run $TR --nproc-per-node 2 $T --share-gpu --backend mkernel --fsdp
MK_NCCL_STATS=1 run mkernel-run $TR --nproc-per-node 2 $T --share-gpu --backend nccl
