#!/bin/bash
# s10 GPU run 3, part B (one H200): the final one-GPU proxy tables (mk_bench
# --share-gpu: eager, graphs, registered), compute-sanitizer memcheck over
# the bench's small sizes after the device-code split, and mkc tune end to
# end (ranks sharing the GPU) with the bench then reading its table.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run3b.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-final
B="$G/mk_bench --share-gpu -g 2"
ALL=allreduce,allgather,reducescatter,broadcast,reduce,alltoall
L="commit 99b8c84 (+ uncommitted run scripts), one H200 (nvidia-h200), ranks sharing it"
run() { local tag=$1; shift; echo "== $tag: $*"; local t0=$(date +%s%N); "$@" | grep -E "^  |rror|WRONG|failed"; echo "   ($(( ($(date +%s%N) - t0) / 1000000 )) ms)"; }
run eager timeout 170 $B -c $ALL -b 8 -e 256M --prewarm --label "$L" --out $O/eager.md --json $O/eager.json --plot $O/eager.svg
run graph timeout 120 $B -c allreduce,allgather,reducescatter -b 8 -e 16M -G --label "$L" --out $O/graph.md
run reg timeout 90 $B -c allreduce,allgather,reducescatter -b 1M -e 256M -f 4 --register --label "$L" --out $O/reg.md
CS=/usr/local/cuda/bin/compute-sanitizer
for mode in "" "--register"; do
  echo "== memcheck $mode"
  MK_ZERO_COPY_MIN_BYTES=0 timeout 120 $CS --tool memcheck --error-exitcode 9 $B -c $ALL -b 8 -e 256K -f 32 -n 2 --batches 2 --warmup-ms 0 $mode 2>&1 | grep -E "ERROR SUMMARY|WRONG|rror" | tail -5
  echo "   rc=${PIPESTATUS[0]}"
done
echo "== mkc tune"
t0=$(date +%s); MK_CACHE_DIR=/tmp/mkc-tune timeout 200 $G/mkc tune -n 2 --share-gpu --colls allreduce,allgather,reducescatter --min-bytes 4096 --max-bytes 16777216 --batches 3 -o $O/select-proxy.json 2>&1 | grep -v "^mkc tune: [0-9]*/"; echo "tune rc=${PIPESTATUS[0]} $(( $(date +%s) - t0 )) s"
MK_SELECT_FILE=$O/select-proxy.json MK_CACHE_DIR=/tmp/mkc-tune run with-table timeout 60 $B -c allreduce,allgather,reducescatter -b 4K -e 16M -f 4 --no-inplace --batches 10 --out $O/with-table.md
echo "== done"
