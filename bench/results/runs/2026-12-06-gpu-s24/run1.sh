#!/bin/bash
# s24 GPU run 1 (one GPU). A: the first call of an unshipped configuration on
# this 16-core host (cold caches): `mkc compile --rank 0` (what one rank's
# first call compiles) for the configurations issue 35 names, the eight
# ranks' plans of a one-pass all-reduce one after another (what ranks of one
# process did before s24) against `mk_bench --share-gpu -g 8`'s first call
# (8 ranks of one process: their plans now compile together). B: the quick
# suite's scenarios that exercise s23-s24's changes (one plan per element
# size for all-gather/broadcast/all-to-all, the fusion check per dtype, the
# per-class compiles of ranks of one process), then memcheck on one.
# (Run 1 lost part A's wall times: no bc there; run 2 is part A again, PART_B=0.)
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu/s24
O=${OUT:-/tmp/out}; mkdir -p $O/suite
exec > >(tee $O/run1.log) 2>&1
export LD_LIBRARY_PATH=$G MK_TIMEOUT_MS=20000
cd $G
echo "== host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo)"; nvidia-smi -L
ms() { echo $(( $(date +%s%N) / 1000000 )); }
t() { local s=$(ms); "$@" > /tmp/t.out 2>&1; local rc=$?; printf "%6d ms rc=%d  %s\n" $(( $(ms) - s )) $rc "$*"; [ $rc -ne 0 ] && tail -3 /tmp/t.out; grep -o "NVRTC [0-9]*; bucket.*\|NVRTC [0-9]*)" /tmp/t.out | head -1; }
echo "== A1: mkc compile --rank 0, cold (fresh MK_CACHE_DIR each)"
for c in "allreduce.one_shot -n 8 --dtype fp64 --op sum" "allreduce.one_shot -n 8 --dtype bf16 --op max" \
         "allreduce.one_shot -n 8 --dtype fp32 --op sum" "allreduce.two_shot -n 8 --dtype bf16 --op sum" \
         "allreduce.one_shot -n 64 --dtype bf16 --op sum" "allreduce.two_shot -n 64 --dtype bf16 --op sum" \
         "allreduce.ring -n 64 --dtype bf16 --op sum" "allgather.direct -n 64 --dtype bf16 --op sum" \
         "allreduce.ring -n 8 --dtype bf16 --op sum --fusion allreduce.rmsnorm" \
         "allreduce.halving_doubling -n 8 --dtype bf16 --op sum --fusion allreduce.fp8_rows"; do
  rm -rf /tmp/a1; MK_CACHE_DIR=/tmp/a1 t ./mkc compile -s $c --rank 0 -o /tmp/a1p
done
echo "== A2: the 8 ranks' plans of one_shot 8 fp64 sum one after another (one process before s24), cold"
rm -rf /tmp/a2; s=$(ms)
for r in 0 1 2 3 4 5 6 7; do MK_CACHE_DIR=/tmp/a2 ./mkc compile -s allreduce.one_shot -n 8 --dtype fp64 --op sum --rank $r -o /tmp/a2p$r > /dev/null 2>&1 || echo "rank $r failed"; done
printf "   %6d ms for 8 rank plans in a row\n" $(( $(ms) - s ))
echo "== A3: mk_bench --share-gpu -g 8 fp64 8 B, cold then warm (8 ranks of one process; first call = cold - warm)"
for k in cold warm; do
  [ $k = cold ] && rm -rf /tmp/a3
  MK_CACHE_DIR=/tmp/a3 t ./mk_bench --share-gpu -g 8 -c allreduce -d fp64 -b 8 -e 8 --no-nccl --batches 1 -n 1 --warmup-ms 0 --no-inplace
done
[ "${PART_B:-1}" = 1 ] || exit 0
echo "== B: scenarios"
export MK_CACHE_DIR=/tmp/mkc-s24
t0=$(date +%s); deadline=${DEADLINE:-470}
for s in edge_values_share_gpu_3ranks_1proc share_gpu_6ranks_1proc ranks_share_gpu_4ranks_1proc fused_share_gpu_3ranks_1proc \
         fused_kernel_share_gpu_2ranks_1proc fused_tail_share_gpu_3ranks_1proc group_fused_share_gpu_3ranks_1proc \
         prologue_share_gpu_3ranks_1proc premulsum_share_gpu_3ranks_1proc registered_1rank graphs_2gpu_1proc \
         share_gpu_8ranks_1proc composite_1rank minmax_order_1rank bad_input_1rank; do
  el=$(( $(date +%s) - t0 ))
  if [ $el -ge $deadline ]; then echo "NOT RUN (time): $s"; continue; fi
  left=$(( deadline + 30 - el )); [ $left -gt 200 ] && left=200
  ts=$(date +%s)
  timeout $left ./mk_gpu_tests --quick --only =$s > $O/suite/$s.log 2>&1; rc=$?
  r=$(grep -E "^(PASS|FAIL|SKIP)[A-Z]* +$s" $O/suite/$s.log | head -1)
  echo "${r:-NO RESULT $s} rc=$rc ($(( $(date +%s) - ts )) s)"
  [ $rc -ne 0 ] && tail -4 $O/suite/$s.log
done
el=$(( $(date +%s) - t0 ))
if [ $el -lt $(( deadline + 20 )) ]; then
  timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 ./mk_gpu_tests --quick --only =edge_values_share_gpu_3ranks_1proc > $O/memcheck.log 2>&1
  echo "== memcheck edge_values_share_gpu_3ranks_1proc rc=$? $(grep -E 'ERROR SUMMARY' $O/memcheck.log | tail -1)"
fi
tar czf $O/suite-logs.tgz -C $O suite && rm -rf $O/suite
