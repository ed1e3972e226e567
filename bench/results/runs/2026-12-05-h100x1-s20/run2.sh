#!/bin/bash
# s20 GPU run 2 (one GPU): fusion_check_trap_1rank again (its checked call now
# on a communicator created after MK_FUSION_CHECK=1: a communicator keeps the
# plans it built), then the quick suite scenario by scenario after a prewarm,
# minus run 1's scenarios, until DEADLINE seconds have passed (FROM=NAME
# starts at that scenario; PREWARM=0 skips the prewarm).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O/suite
exec > >(tee $O/run2.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s20
cd $G
t0=$(date +%s); deadline=${DEADLINE:-550}
echo "== fusion_check_trap_1rank"
timeout 60 ./mk_gpu_tests --only =fusion_check_trap_1rank > $O/fusion_check_trap_1rank.log 2>&1; echo "   rc=$?"
cat $O/fusion_check_trap_1rank.log
if [ "${PREWARM:-1}" = 1 ]; then
  echo "== prewarm"; timeout 240 ./mk_gpu_tests --prewarm 90 2>&1 | tail -2; echo "   ($(( $(date +%s) - t0 )) s)"
fi
done_here="minmax_order_share_gpu_3ranks_1proc minmax_order_1rank fusion_check_trap_1rank fused_checked_share_gpu_2ranks_1proc fused_share_gpu_3ranks_1proc prologue_share_gpu_3ranks_1proc"
started=${FROM:+0}; started=${started:-1}
for s in $(./mk_gpu_tests --list); do
  [ "$s" = "${FROM:-}" ] && started=1
  [ "$started" = 1 ] || continue
  case " $done_here " in *" $s "*) continue;; esac
  el=$(( $(date +%s) - t0 ))
  if [ $el -ge $deadline ]; then echo "NOT RUN (time): $s"; continue; fi
  left=$(( deadline + 30 - el ))
  ts=$(date +%s)
  timeout $left ./mk_gpu_tests --quick --only =$s > $O/suite/$s.log 2>&1; rc=$?
  r=$(grep -E "^(PASS|FAIL|SKIP)[A-Z]* +$s\b" $O/suite/$s.log | head -1)
  echo "${r:-NO RESULT $s} rc=$rc ($(( $(date +%s) - ts )) s)"
  [ $rc -ne 0 ] && tail -5 $O/suite/$s.log
done
# at most 8 files come back: the scenario logs as one archive
tar czf $O/suite-logs.tgz -C $O suite && rm -rf $O/suite
