#!/bin/bash
# s23 GPU run 5 (one GPU), also run 6 (the final build: one plan per element
# size, not bytes; bench skipped with BENCH=0). All-gather, broadcast and all-to-all now run one
# byte (uint8) plan for every element type, counts in bytes. Correctness of
# the scenarios that call them with several dtypes and odd counts, then
# their speed (mk_bench --share-gpu, 8 ranks, graphs; compare with run 2,
# the typed plans, on another H100 of the same kind: a proxy).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu/g2
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run5.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s23b
cd $G
for s in share_gpu_6ranks_1proc ranks_share_gpu_4ranks_1proc edge_values_share_gpu_3ranks_1proc; do
  ts=$(date +%s)
  timeout 60 ./mk_gpu_tests --quick --only =$s > $O/$s.log 2>&1; rc=$?
  echo "$(grep -E "^(PASS|FAIL|SKIP)" $O/$s.log | head -1) rc=$rc ($(( $(date +%s) - ts )) s)"
  [ $rc -ne 0 ] && tail -5 $O/$s.log
done
[ "${BENCH:-1}" = 1 ] && timeout 90 ./mk_bench --share-gpu -g 8 -c allgather,alltoall,broadcast -d bf16 -b 8 -e 8M -f 16 -G --batches 10 --no-nccl \
  --out $O/bench-bytes-n8.md > $O/bench.log 2>&1
echo "== bench rc=$?"
grep -E "^\| (allgather|alltoall|broadcast)" $O/bench-bytes-n8.md | awk -F'|' '{printf "  %s %s %s\n", $2, $3, $5}'
