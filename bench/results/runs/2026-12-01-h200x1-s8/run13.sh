#!/usr/bin/env bash
# Session 8: examples/torch/train_gpt.py under PyTorch on NCCL and on mKernel's libnccl.so.2.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
P=$(cd "$(dirname "$0")" && pwd)
R=$(cd "$P/.." && pwd)
export MK_CACHE_DIR=/tmp/mkcache MK_TIMEOUT_MS=120000
PY=""
for p in /opt/venv/bin/python3 /root/venv/bin/python3 /venv/bin/python3 $(ls -d /opt/*/bin/python3 /root/*/bin/python3 /home/*/*/bin/python3 /workspace/*/bin/python3 2>/dev/null) python3; do
  if "$p" -c "import torch" 2>/dev/null; then PY=$p; break; fi
done
echo "python: $PY"; "$PY" -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())"
export PATH=$(dirname "$PY"):$PATH
SHIM=$P/nccl/libnccl.so.2
T="$R/examples/torch/train_gpt.py"
cd $OUT
run() { name=$1; shift; echo "== $name"; timeout 200 "$@" > $name.txt 2> $name.err; echo "rc=$?"; grep -E "median|Error|error" $name.txt $name.err | head -5; }
run nccl_w1 torchrun --nproc-per-node 1 "$T"
run mk_w1 env LD_PRELOAD=$SHIM MK_NCCL_STATS=1 torchrun --nproc-per-node 1 "$T"
echo "== losses NCCL vs mKernel, world 1:"; diff <(grep -o 'step [0-9]* loss [0-9.]*' nccl_w1.txt) <(grep -o 'step [0-9]* loss [0-9.]*' mk_w1.txt) && echo IDENTICAL
run mk_w2 env LD_PRELOAD=$SHIM MK_NCCL_STATS=1 torchrun --nproc-per-node 2 "$T" --share-gpu
run gloo_w2 torchrun --nproc-per-node 2 "$T" --share-gpu --backend gloo
echo "== losses mKernel vs gloo, world 2 on one GPU:"; paste <(grep -o 'loss [0-9.]*' mk_w2.txt) <(grep -o 'loss [0-9.]*' gloo_w2.txt) | head -25
run mk_w2_fsdp env LD_PRELOAD=$SHIM MK_NCCL_STATS=1 torchrun --nproc-per-node 2 "$T" --share-gpu --fsdp
run gloo_w2_fsdp torchrun --nproc-per-node 2 "$T" --share-gpu --fsdp --backend gloo
echo "== losses mKernel vs gloo, FSDP world 2 on one GPU:"; paste <(grep -o 'loss [0-9.]*' mk_w2_fsdp.txt) <(grep -o 'loss [0-9.]*' gloo_w2_fsdp.txt) | head -25
tail -12 mk_w2.err
