#!/usr/bin/env bash
# Session 8: nccl_check (a program written against nccl.h only) against the
# system NCCL and against mKernel's libnccl.so.2.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
P=$(cd "$(dirname "$0")" && pwd)
export MK_CACHE_DIR=/tmp/mkcache MK_TIMEOUT_MS=60000
nvidia-smi -L
ls -la /usr/lib/x86_64-linux-gnu/libnccl.so.2* 2>&1 | head -3
SHIM=$P/nccl/libnccl.so.2
cd $OUT
( time "$P/nccl_check" 0 > nccl_1rank.txt ) 2> nccl_1rank.err; tail -3 nccl_1rank.err
( time env LD_PRELOAD=$SHIM MK_NCCL_STATS=1 "$P/nccl_check" 0 > mk_1rank.txt ) 2> mk_1rank.err; tail -14 mk_1rank.err
echo "== diff NCCL vs mKernel, 1 rank:"; diff nccl_1rank.txt mk_1rank.txt > diff_1rank.txt && echo IDENTICAL; wc -l < nccl_1rank.txt
( time env LD_PRELOAD=$SHIM MK_NCCL_FALLBACK=all MK_NCCL_STATS=1 "$P/nccl_check" 0 > fallback_1rank.txt ) 2> fallback_1rank.err; tail -12 fallback_1rank.err
echo "== diff NCCL vs MK_NCCL_FALLBACK=all, 1 rank:"; diff nccl_1rank.txt fallback_1rank.txt > diff_fallback.txt && echo IDENTICAL
( time env LD_PRELOAD=$SHIM MK_NCCL_STATS=1 "$P/nccl_check" 0,0 > mk_2rank.txt ) 2> mk_2rank.err; tail -14 mk_2rank.err
echo "== 2 ranks on one GPU: lines not ok:"; grep -vc " ok hash" mk_2rank.txt
( time env LD_PRELOAD=$SHIM "$P/nccl_check" 0,0,0 > mk_3rank.txt ) 2> mk_3rank.err; tail -4 mk_3rank.err
echo "== 3 ranks on one GPU: lines not ok:"; grep -vc " ok hash" mk_3rank.txt
echo "== real NCCL with a GPU twice (expected to refuse):"; "$P/nccl_check" 0,0 2>&1 | head -3
echo "== abort from a second thread (shim, 2 ranks):"; timeout 120 env LD_PRELOAD=$SHIM "$P/nccl_check" 0,0 --abort > abort.txt 2> abort.err; echo "rc=$?"; tail -3 abort.err
