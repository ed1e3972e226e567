#!/bin/bash
# s9 GPU run C, after the review's fixes: torch_check at world 1 and 2, and
# train_gpt --backend mkernel at world 2 (DDP, FSDP) with the full shipped set
# (1-rank plans, int32/int64 for the collectives that move data).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run18.log) 2>&1
python3 -m pip install --no-index --no-deps --no-build-isolation -C build-dir=$R/gpu-pkg/native -C prebuilt=$R/gpu-pkg/native/prebuilt $R 2>&1 | tail -1
cd /tmp
TR="python3 -m torch.distributed.run --master-port 29614"
T=$R/examples/torch/train_gpt.py
export MK_CACHE_DIR=/tmp/mkc-r18
timeout 200 $TR --nproc-per-node 1 $R/tests/gpu/torch_check.py 2>&1 | grep -E "TORCH CHECK|FAIL|calls by|Error"
timeout 300 $TR --nproc-per-node 2 $R/tests/gpu/torch_check.py --share-gpu 2>&1 | grep -E "TORCH CHECK|FAIL|calls by|Error"
run() { echo "== $*"; timeout 200 "$@" 2>&1 | grep -E "^step|median|calls by|Error|error" ; }
export MK_CACHE_DIR=/tmp/mkc-r18b
run $TR --nproc-per-node 1 $T --backend mkernel
run $TR --nproc-per-node 2 $T --share-gpu --backend gloo
run $TR --nproc-per-node 2 $T --share-gpu --backend mkernel
run $TR --nproc-per-node 2 $T --share-gpu --backend mkernel --fsdp
