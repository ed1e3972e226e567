#!/bin/bash
# s12 GPU run 2 (one H200): Lamport units in flight per thread
# (MK_TUNE lamport_units 1, 2, 4) against LL packets (lamport=0) in graphs,
# small sizes twice in alternating order (noise); the one-pass bucket
# stretched to 1 and 4 MiB with each unit count and with 32 instances;
# memcheck of the 1- and 2-unit code paths. (Output names: = and , become _.)
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run2.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s12
B="$G/mk_bench --share-gpu -g 2"
C=allreduce,allgather,reducescatter,alltoall
L="commit $(cat $R/.commit 2>/dev/null)+lamport_units, one H200 (nvidia-h200), ranks sharing it"
run() { local tag=$1; shift; echo "== $tag: $*"; local t0=$(date +%s%N); "$@" | grep -E "rror|WRONG|failed"; echo "   ($(( ($(date +%s%N) - t0) / 1000000 )) ms)"; }
for pass in a b; do
  for t in lamport=0 lamport_units=1 lamport_units=2 lamport_units=4; do
    MK_TUNE=$t run small-$t-$pass timeout 60 $B -c $C -b 1K -e 256K -f 4 -G --label "$L, $t" --out $O/small-${t//[=,]/_}-$pass.md
  done
done
export MK_ALGO=allreduce=allreduce.one_shot
for t in ll_max=1048576,lamport_units=1 ll_max=1048576,lamport_units=2 ll_max=1048576 ll_max=4194304,ll_instances=32 ll_max=4194304,ll_instances=32,lamport_units=2 ll_max=4194304,ll_instances=64; do
  MK_TUNE=$t run mid-$t timeout 60 $B -c $C -b 256K -e 4M -G --label "$L, one_shot, $t" --out $O/mid-${t//[=,]/_}.md
done
unset MK_ALGO
run mid-default timeout 60 $B -c $C -b 256K -e 4M -G --label "$L, default" --out $O/mid-default.md
echo "== memcheck"
for u in 1 2; do
MK_TUNE=lamport_units=$u timeout 100 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 $B -c $C -d fp32 -b 100 -e 1M -f 6 -n 2 --batches 2 --warmup-ms 0 2>&1 | grep -E "ERROR SUMMARY|WRONG|rror" | tail -3; echo "   rc=${PIPESTATUS[0]}"
done
echo "== done"
