#!/bin/bash
# s24 GPU run 2 (one GPU), the build with mkGroupEnd resolving the plans of
# several communicators side by side. NVRTC's own cache (the driver's
# compute cache, NVRTC 12.9+) is off (CUDA_CACHE_DISABLE=1): every compile
# is cold. A: 8 ranks of one process (one thread, grouped calls) first call,
# cold then warm, fp64 and bf16-max all-reduce at 8 B (one-pass one-shot, a
# plan per rank); the same plans compiled one after another by mkc for
# comparison. B: scenarios that run mkGroupEnd's first calls on several
# communicators (first use inside a global-mode capture, abort from another
# thread), and the 8-rank matrix scenario that ran past 150-200 s before.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 CUDA_CACHE_DISABLE=1
R=$PWD; G=$R/build-gpu/s24
O=${OUT:-/tmp/out}; mkdir -p $O/suite
exec > >(tee $O/run2.log) 2>&1
export LD_LIBRARY_PATH=$G MK_TIMEOUT_MS=20000
cd $G
ms() { echo $(( $(date +%s%N) / 1000000 )); }
t() { local s=$(ms); "$@" > /tmp/t.out 2>&1; local rc=$?; printf "%6d ms rc=%d  %s\n" $(( $(ms) - s )) $rc "$*"; [ $rc -ne 0 ] && tail -3 /tmp/t.out; }
echo "== A: 8 ranks of one process, first call (cold) and again (warm cache)"
for d in "fp64" "bf16"; do
  rm -rf /tmp/a3
  for k in cold warm; do
    MK_CACHE_DIR=/tmp/a3 t ./mk_bench --share-gpu -g 8 -c allreduce -d $d -b 8 -e 8 --no-nccl --batches 1 -n 1 --warmup-ms 0 --no-inplace
  done
done
rm -rf /tmp/a2; s=$(ms)
for r in 0 1 2 3 4 5 6 7; do MK_CACHE_DIR=/tmp/a2 ./mkc compile -s allreduce.one_shot -n 8 --dtype fp64 --op sum --rank $r -o /tmp/a2p$r > /dev/null 2>&1 || echo "rank $r failed"; done
printf "   %6d ms: mkc, the 8 rank plans of one_shot 8 fp64 one after another\n" $(( $(ms) - s ))
echo "== B: scenarios"
export MK_CACHE_DIR=/tmp/mkc-s24b
t0=$(date +%s); deadline=${DEADLINE:-420}
for s in first_use_capture_2gpu_1proc abort_race_2gpu_1proc two_comms_2gpu_1proc back_to_back_2gpu_1proc \
         group_fused_share_gpu_3ranks_1proc split_4ranks_1proc ranks_share_gpu_4ranks_1proc share_gpu_8ranks_1proc; do
  el=$(( $(date +%s) - t0 ))
  if [ $el -ge $deadline ]; then echo "NOT RUN (time): $s"; continue; fi
  left=$(( deadline + 30 - el )); [ $left -gt 300 ] && left=300
  ts=$(date +%s)
  timeout $left ./mk_gpu_tests --quick --only =$s > $O/suite/$s.log 2>&1; rc=$?
  r=$(grep -E "^(PASS|FAIL|SKIP)[A-Z]* +$s" $O/suite/$s.log | head -1)
  echo "${r:-NO RESULT $s} rc=$rc ($(( $(date +%s) - ts )) s)"
  [ $rc -ne 0 ] && tail -4 $O/suite/$s.log
done
tar czf $O/suite2-logs.tgz -C $O suite && rm -rf $O/suite
