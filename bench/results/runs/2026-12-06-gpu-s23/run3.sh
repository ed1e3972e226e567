#!/bin/bash
# s23 GPU run 3 (one GPU): the quick suite, scenario by scenario, on the
# final build (block groups on: every kernel with per-peer blocks runs the
# grouped code), scenarios never run before first (the generic_ twins, the
# 8-rank ones), until DEADLINE seconds have passed. Logs as one archive.
# FIRST="" SKIP="a b": the suite's order, without those (run 4: the rest).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu/g
O=${OUT:-/tmp/out}; mkdir -p $O/suite
exec > >(tee $O/run3.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s23
cd $G
t0=$(date +%s); deadline=${DEADLINE:-540}
first=${FIRST-"generic_share_gpu_6ranks_1proc generic_share_gpu_8ranks_1proc generic_premulsum_share_gpu_8ranks_1proc generic_prologue_share_gpu_8ranks_1proc share_gpu_8ranks_1proc"}
seen=" ${SKIP:-} "
for s in $first $(./mk_gpu_tests --list); do
  case " $seen " in *" $s "*) continue;; esac
  seen="$seen $s"
  el=$(( $(date +%s) - t0 ))
  if [ $el -ge $deadline ]; then echo "NOT RUN (time): $s"; continue; fi
  left=$(( deadline + 40 - el )); [ $left -gt 150 ] && left=150
  ts=$(date +%s)
  timeout $left ./mk_gpu_tests --quick --only =$s > $O/suite/$s.log 2>&1; rc=$?
  r=$(grep -E "^(PASS|FAIL|SKIP)[A-Z]* +$s\b" $O/suite/$s.log | head -1)
  echo "${r:-NO RESULT $s} rc=$rc ($(( $(date +%s) - ts )) s)"
  [ $rc -ne 0 ] && tail -4 $O/suite/$s.log
done
tar czf $O/suite-logs.tgz -C $O suite && rm -rf $O/suite
