#!/bin/bash
# s24 GPU run 3 (one GPU): the rest of the quick suite not run in s23-s24 (same build as run 2).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu/s24
O=${OUT:-/tmp/out}; mkdir -p $O/suite
exec > >(tee $O/run3.log) 2>&1
export LD_LIBRARY_PATH=$G MK_TIMEOUT_MS=20000
cd $G
ms() { echo $(( $(date +%s%N) / 1000000 )); }
t() { local s=$(ms); "$@" > /tmp/t.out 2>&1; local rc=$?; printf "%6d ms rc=%d  %s\n" $(( $(ms) - s )) $rc "$*"; [ $rc -ne 0 ] && tail -3 /tmp/t.out; }
echo "== B: scenarios"
export MK_CACHE_DIR=/tmp/mkc-s24c
t0=$(date +%s); deadline=${DEADLINE:-450}
for s in killed_peer_2proc stalled_rank_2proc fusion_check_trap_1rank fused_checked_share_gpu_2ranks_1proc \
         copy_engine_share_gpu_3ranks_1proc wrong_arch_plan host_time_1rank registered_2gpu_1proc abort_tells_peer_2proc \
         prologue_share_gpu_8ranks_1proc premulsum_share_gpu_8ranks_1proc generic_share_gpu_8ranks_1proc matrix_2gpu_1proc; do
  el=$(( $(date +%s) - t0 ))
  if [ $el -ge $deadline ]; then echo "NOT RUN (time): $s"; continue; fi
  left=$(( deadline + 30 - el )); [ $left -gt 300 ] && left=300
  ts=$(date +%s)
  timeout $left ./mk_gpu_tests --quick --only =$s > $O/suite/$s.log 2>&1; rc=$?
  r=$(grep -E "^(PASS|FAIL|SKIP)[A-Z]* +$s" $O/suite/$s.log | head -1)
  echo "${r:-NO RESULT $s} rc=$rc ($(( $(date +%s) - ts )) s)"
  [ $rc -ne 0 ] && tail -4 $O/suite/$s.log
done
tar czf $O/suite3-logs.tgz -C $O suite && rm -rf $O/suite
