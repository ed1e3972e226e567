#!/bin/bash
# s19 GPU run 4 (one H200): the quick suite, scenario by scenario, after the
# s18 review's template changes (every kernel's traits and scalars), minus
# the scenarios runs 1-2 already ran on this build. `PREWARM=0` skips the
# parallel plan compile (a warm machine that already has the cache);
# `FROM=NAME` starts at that scenario; new scenarios stop starting once
# DEADLINE seconds have passed.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O/suite
exec > >(tee $O/run4.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s19
cd $G
t0=$(date +%s); deadline=${DEADLINE:-540}
if [ "${PREWARM:-1}" = 1 ]; then
  echo "== prewarm"; timeout 240 ./mk_gpu_tests --prewarm 90 2>&1 | tail -2; echo "   ($(( $(date +%s) - t0 )) s)"
fi
done_here="prologue_share_gpu_3ranks_1proc prologue_share_gpu_2ranks_2proc fused_share_gpu_3ranks_1proc group_fused_share_gpu_3ranks_1proc premulsum_share_gpu_3ranks_1proc matrix_1rank"
started=${FROM:+0}; started=${started:-1}
for s in $(./mk_gpu_tests --list); do
  [ "$s" = "${FROM:-}" ] && started=1
  [ "$started" = 1 ] || continue
  case " $done_here " in *" $s "*) continue;; esac
  el=$(( $(date +%s) - t0 ))
  if [ $el -ge $deadline ]; then echo "NOT RUN (time): $s"; continue; fi
  left=$(( deadline + 25 - el ))
  ts=$(date +%s)
  timeout $left ./mk_gpu_tests --quick --only =$s > $O/suite/$s.log 2>&1; rc=$?
  r=$(grep -E "^(PASS|FAIL|SKIP)[A-Z]* +$s\b" $O/suite/$s.log | head -1)
  echo "${r:-NO RESULT $s} rc=$rc ($(( $(date +%s) - ts )) s)"
done
