#!/bin/bash
# s10 GPU run 2 (one H200): this tree (32 instances, 16 loads in flight,
# one-pass LL kernels, PDL, zero-copy allreduce.direct / reducescatter.pull)
# in mk_bench's one-GPU proxy: eager sweep of all six collectives, graphs,
# registered buffers, LL knob and PDL comparisons; then compute-sanitizer
# memcheck over the bench's small sizes (every collective, eager, graph,
# registered).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run2.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-new
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem --format=csv,noheader
B="$G/mk_bench --share-gpu -g 2"
ALL=allreduce,allgather,reducescatter,broadcast,reduce,alltoall
run() { local tag=$1; shift; echo "== $tag: $*"; local t0=$(date +%s%N); "$@" | grep -E "^  |rror|WRONG|failed"; echo "   ($(( ($(date +%s%N) - t0) / 1000000 )) ms)"; }
run eager timeout 150 $B -c $ALL -b 8 -e 256M --prewarm --out $O/eager.md --json $O/eager.json --plot $O/eager.svg
run graph timeout 90 $B -c allreduce,allgather,reducescatter -b 8 -e 16M -f 4 -G --out $O/graph.md --json $O/graph.json
run graph-nopdl env MK_PDL=0 timeout 60 $B -c allreduce -b 1K -e 1M -f 4 -G --no-inplace --out $O/graph-nopdl.md
run eager-nopdl env MK_PDL=0 timeout 60 $B -c allreduce -b 1K -e 1M -f 4 --no-inplace --out $O/eager-nopdl.md
run graph-noonepass env MK_TUNE=one_pass=0 MK_CACHE_DIR=/tmp/mkc-nop timeout 60 $B -c allreduce,allgather -b 1K -e 64K -f 4 -G --no-inplace --out $O/graph-noonepass.md
run reg timeout 90 $B -c allreduce,allgather,reducescatter -b 1M -e 256M -f 4 --register --out $O/reg.md --json $O/reg.json
for t in ll_instances=8 ll_instances=16 ll_max=262144 ll_max=262144,ll_instances=8 ll_max=262144,ll_instances=16; do
  MK_TUNE=$t MK_CACHE_DIR=/tmp/mkc-ll run "ll $t" timeout 40 $B -c allreduce,allgather,reducescatter -b 4K -e 256K -f 4 -G --no-inplace --batches 10 --warmup-ms 0
done
for t in simple_instances=24 simple_instances=32,simple_loads=8; do
  MK_TUNE=$t MK_CACHE_DIR=/tmp/mkc-s run "simple $t" timeout 40 $B -c allgather,reducescatter -b 16M -e 256M -f 4 --no-inplace --batches 10 --warmup-ms 0
done
CS=/usr/local/cuda/bin/compute-sanitizer
for mode in "" "--register"; do
  echo "== memcheck $mode"
  MK_ZERO_COPY_MIN_BYTES=0 timeout 120 $CS --tool memcheck --error-exitcode 9 $B -c $ALL -b 8 -e 256K -f 32 -n 2 --batches 2 --warmup-ms 0 $mode 2>&1 | grep -E "ERROR SUMMARY|WRONG|rror|^  " | cut -c1-140 | tail -40
  echo "   rc=${PIPESTATUS[0]}"
done
echo "== done"
