#!/bin/bash
# s13 GPU run 3 (one H200): user schedules from MK_SCHEDULES serving the
# collectives through MK_ALGO, checked by mk_bench on every timed batch (ranks
# sharing the GPU): an MSCCL++ plan for 2 ranks, an MSCCL ring for 8 ranks, an
# MSCCL reduce-scatter for 4 ranks, a DSL file compiled at init (g++ there);
# memcheck of one; then the suite's copy-engine scenarios run 1 did not reach.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu; F=$R/tests/fixtures
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run3.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s13
L="one H200 (nvidia-h200), ranks sharing it"
run() { local tag=$1; shift; echo "== $tag"; local t0=$(date +%s%N); "$@" --out $O/b.md > $O/b.log 2>&1; echo "   rc=$? ($(( ($(date +%s%N) - t0) / 1000000 )) ms)"; grep -E "rror|WRONG|failed" $O/b.log | head -5; cat $O/b.md >> $O/user.md 2>/dev/null; rm -f $O/b.md; }
MK_SCHEDULES=mine2=$F/mscclpp/allreduce_tbg_2.json MK_ALGO=allreduce=mine2 \
  run "mscclpp 2 ranks bf16 graphs" timeout 120 $G/mk_bench --share-gpu -g 2 -c allreduce -b 1K -e 16M -G --label "$L, MK_SCHEDULES=mine2=allreduce_tbg_2.json MK_ALGO=allreduce=mine2"
MK_SCHEDULES=mine2=$F/mscclpp/allreduce_tbg_2.json MK_ALGO=allreduce=mine2 \
  run "mscclpp 2 ranks fp32 eager" timeout 120 $G/mk_bench --share-gpu -g 2 -c allreduce -d fp32 -b 100 -e 4M -f 7 --label "$L, MK_SCHEDULES=mine2=allreduce_tbg_2.json MK_ALGO=allreduce=mine2"
MK_SCHEDULES=ring8=$F/msccl/allreduce_ring_8.xml MK_ALGO=allreduce=ring8 \
  run "msccl ring 8 ranks bf16" timeout 150 $G/mk_bench --share-gpu -g 8 -c allreduce -b 1K -e 4M -f 4 --label "$L, MK_SCHEDULES=ring8=allreduce_ring_8.xml MK_ALGO=allreduce=ring8"
MK_SCHEDULES=rs4=$F/msccl/reducescatter_ring_4.xml MK_ALGO=reducescatter=rs4 \
  run "msccl reduce-scatter 4 ranks fp32" timeout 120 $G/mk_bench --share-gpu -g 4 -c reducescatter -d fp32 -b 1K -e 4M -f 4 --label "$L, MK_SCHEDULES=rs4=reducescatter_ring_4.xml MK_ALGO=reducescatter=rs4"
MK_SCHEDULES=$F/dsl/hand_allreduce.cpp MK_ALGO=allreduce=test.hand_allreduce \
  run "DSL file 3 ranks bf16" timeout 150 $G/mk_bench --share-gpu -g 3 -c allreduce -b 1K -e 4M -f 4 --label "$L, MK_SCHEDULES=hand_allreduce.cpp MK_ALGO=allreduce=test.hand_allreduce"
echo "== memcheck (mine2, fp32)"
MK_SCHEDULES=mine2=$F/mscclpp/allreduce_tbg_2.json MK_ALGO=allreduce=mine2 timeout 150 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 $G/mk_bench --share-gpu -g 2 -c allreduce -d fp32 -b 100 -e 1M -f 6 -n 2 --batches 2 --warmup-ms 0 2>&1 | grep -E "ERROR SUMMARY|WRONG|rror" | tail -3; echo "   rc=${PIPESTATUS[0]}"
t0=$(date +%s); timeout 240 $G/mk_gpu_tests --quick --only copy_engine > $O/suite-ce.log 2>&1; echo "suite copy_engine rc=$? $(( $(date +%s) - t0 )) s"
grep -E "^(PASS|FAIL|SKIP)" $O/suite-ce.log
echo "== done"
