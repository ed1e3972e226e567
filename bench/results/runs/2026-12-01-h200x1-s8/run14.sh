#!/usr/bin/env bash
# Session 8, after the review fixes (per-call routing in groups): nccl_check at 1 rank on NCCL and
# mKernel, and the PyTorch example at world 2 on one GPU, on mKernel.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
P=$(cd "$(dirname "$0")" && pwd)
R=$(cd "$P/.." && pwd)
export MK_CACHE_DIR=/tmp/mkcache MK_TIMEOUT_MS=120000
SHIM=$P/nccl/libnccl.so.2
cd $OUT
"$P/nccl_check" 0 > nccl_1rank.txt 2>/dev/null
env LD_PRELOAD=$SHIM "$P/nccl_check" 0 > mk_1rank.txt 2> mk_1rank.err; tail -1 mk_1rank.err
echo "== diff NCCL vs mKernel, 1 rank:"; diff nccl_1rank.txt mk_1rank.txt > /dev/null && echo "IDENTICAL ($(wc -l < mk_1rank.txt) lines)"
T="$R/examples/torch/train_gpt.py"
for mode in "" "--fsdp"; do
  echo "== torch world 2 on one GPU $mode"
  env LD_PRELOAD=$SHIM MK_NCCL_STATS=1 timeout 200 torchrun --nproc-per-node 2 "$T" --share-gpu $mode > mk$mode.txt 2> mk$mode.err; echo "rc=$?"
  timeout 200 torchrun --nproc-per-node 2 "$T" --share-gpu --backend gloo $mode > gloo$mode.txt 2>/dev/null
  diff <(grep -o 'step [0-9]* loss [0-9.]*' mk$mode.txt) <(grep -o 'step [0-9]* loss [0-9.]*' gloo$mode.txt) > /dev/null && echo "losses IDENTICAL to gloo ($(grep -c '^step' mk$mode.txt) steps)"
  grep median mk$mode.txt gloo$mode.txt; grep -A4 "calls by library" mk$mode.err | head -5
done
