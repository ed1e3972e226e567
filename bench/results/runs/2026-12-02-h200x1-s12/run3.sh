#!/bin/bash
# s12 GPU run 3 (one H200): the final code (Lamport packets on by default,
# one unit in flight per thread). Tables: graphs 1 KiB - 4 MiB with Lamport
# and with LL packets (lamport=0) in the same run; the one-shot all-reduce
# and the direct schedules in one pass up to 1 MiB with 32 instances and two
# units (a candidate `mkc tune --knobs full` measures); eager. Then memcheck
# and the GPU suite (all but the copy-engine scenarios, unchanged).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run3.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s12
B="$G/mk_bench --share-gpu -g 2"
C=allreduce,allgather,reducescatter,alltoall
L="commit $(cat $R/.commit 2>/dev/null), one H200 (nvidia-h200), ranks sharing it"
run() { local tag=$1; shift; echo "== $tag: $*"; local t0=$(date +%s%N); "$@" | grep -E "rror|WRONG|failed"; echo "   ($(( ($(date +%s%N) - t0) / 1000000 )) ms)"; }
run graph timeout 60 $B -c $C -b 1K -e 4M -G --label "$L" --out $O/graph.md --json $O/graph.json
MK_TUNE=lamport=0 run graph-ll timeout 60 $B -c $C -b 1K -e 4M -G --label "$L, MK_TUNE=lamport=0 (LL packets)" --out $O/graph-ll.md
MK_ALGO=allreduce=allreduce.one_shot MK_TUNE=ll_max=1048576,ll_instances=32,lamport_units=2 run graph-mid timeout 60 $B -c $C -b 256K -e 1M -G --label "$L, MK_ALGO=allreduce=allreduce.one_shot MK_TUNE=ll_max=1048576,ll_instances=32,lamport_units=2" --out $O/graph-mid.md
run eager timeout 60 $B -c $C -b 8 -e 4M -f 4 --label "$L" --out $O/eager.md
run fp32 timeout 60 $B -c $C -d fp32 -b 1K -e 1M -f 4 -G --batches 10
echo "== memcheck"
timeout 100 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 $B -c $C -d fp32 -b 100 -e 1M -f 6 -n 2 --batches 2 --warmup-ms 0 2>&1 | grep -E "ERROR SUMMARY|WRONG|rror" | tail -3; echo "   rc=${PIPESTATUS[0]}"
t0=$(date +%s); timeout 200 $G/mk_gpu_tests --prewarm 90 | tail -1; echo "prewarm $(( $(date +%s) - t0 )) s"
t0=$(date +%s); timeout 330 $G/mk_gpu_tests --quick --skip copy_engine > $O/suite.log 2>&1; echo "suite rc=$? $(( $(date +%s) - t0 )) s"
grep -E "^(PASS|FAIL|SKIP)|mk_gpu_tests:" $O/suite.log
echo "== done"
