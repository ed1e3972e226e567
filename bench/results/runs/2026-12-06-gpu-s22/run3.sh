#!/bin/bash
# s22 GPU run 3 (one GPU). Run 2: the generic one-pass op kept bandwidth
# (GEN fast path) but cost 1-2 us at small sizes (the table row's two
# dependent constant-memory loads in the first reduce's chain; partial units
# still loaded source by source). v3: the row in registers at the function's
# start (kernel.cuh Row), packets loaded before plain sources on the slow path.
# Old (HEAD 69e857a) and v3 side by side, alternating; then PreMulSum at 8
# ranks (generic op with a prologue) and memcheck/racecheck of the 6-rank
# one-pass scenario on v3.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=/tmp/out; mkdir -p $O
trap 'tar -C /tmp -czf $OUT/run3.tgz out 2>/dev/null' EXIT
exec > >(tee $O/run3.log) 2>&1
export MK_TIMEOUT_MS=20000
nvidia-smi -L
bench() {  # which ranks dtype round
  local w=$1 n=$2 t=$3 k=$4
  local f=$O/bench-$w-n$n-$t-r$k
  MK_CACHE_DIR=/tmp/mkc-$w LD_LIBRARY_PATH=$G/$w timeout 120 $G/v3/mk_bench --share-gpu -g $n -c allreduce -d $t \
    -b 8 -e 256K -f 4 -G --batches 15 --no-nccl --label "$w" --out $f.md > $f.log 2>&1
  echo "== bench $w n=$n $t round $k rc=$?"
  grep -E "^\| allreduce" $f.md | head -8 | awk -F'|' '{printf "  %s %s / %s\n", $3, $5, $8}'
}
for k in 1 2; do for w in old v3; do bench $w 8 bf16 $k; done; done
for w in v3 old; do bench $w 4 bf16 1; bench $w 8 int32 1; bench $w 8 fp32 1; done
cd $G/v3
export LD_LIBRARY_PATH=$G/v3 MK_CACHE_DIR=/tmp/mkc-v3
san() {  # tool name limit
  timeout $3 /usr/local/cuda/bin/compute-sanitizer --tool $1 --error-exitcode 9 ./mk_gpu_tests --quick --only =$2 > $O/$1-$2.log 2>&1
  echo "== $1 $2 --quick rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" $O/$1-$2.log | tail -3
}
san memcheck share_gpu_6ranks_1proc 100
san racecheck share_gpu_6ranks_1proc 120
t0=$(date +%s); timeout 200 ./mk_gpu_tests --quick --only =premulsum_share_gpu_8ranks_1proc > $O/premulsum8.log 2>&1
echo "== premulsum_share_gpu_8ranks_1proc rc=$? ($(( $(date +%s) - t0 )) s)"; tail -3 $O/premulsum8.log
