#!/bin/bash
# s22 GPU run 2 (one GPU). Run 1 found the generic one-pass op 20-30% slower
# than the per-rank code paths (mk_bench --share-gpu, one-shot sizes). Now:
# old (HEAD 69e857a), v1 (generic op whose loads stay back to back: GEN fast
# path; fail_record out of line) and v2 (v1's templates, per-rank code paths:
# what fail_record alone costs) side by side, alternating; then correctness
# of the generic op with a prologue (PreMulSum, 8 ranks) and memcheck and
# racecheck of it (6 ranks). Results in one archive.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=/tmp/out; mkdir -p $O
trap 'tar -C /tmp -czf $OUT/run2.tgz out 2>/dev/null' EXIT
exec > >(tee $O/run2.log) 2>&1
export MK_TIMEOUT_MS=20000
nvidia-smi -L
bench() {  # which ranks dtype round
  local w=$1 n=$2 t=$3 k=$4
  local f=$O/bench-$w-n$n-$t-r$k
  MK_CACHE_DIR=/tmp/mkc-$w LD_LIBRARY_PATH=$G/$w timeout 120 $G/v1/mk_bench --share-gpu -g $n -c allreduce -d $t \
    -b 8 -e 256K -f 4 -G --batches 15 --no-nccl --label "$w" --out $f.md > $f.log 2>&1
  echo "== bench $w n=$n $t round $k rc=$?"
  grep -E "^\| allreduce" $f.md | head -8 | awk -F'|' '{printf "  %s %s / %s\n", $3, $5, $8}'
}
for k in 1 2; do for w in old v1 v2; do bench $w 8 bf16 $k; done; done
for w in old v1 v2; do bench $w 4 bf16 1; bench $w 8 int32 1; done
cd $G/v1
export LD_LIBRARY_PATH=$G/v1 MK_CACHE_DIR=/tmp/mkc-v1
run() {  # name limit [args]
  local s=$1 t=$2; shift 2
  local t0=$(date +%s)
  timeout $t ./mk_gpu_tests "$@" --only =$s > $O/$s.log 2>&1; local rc=$?
  echo "== $s $* rc=$rc ($(( $(date +%s) - t0 )) s)"; tail -2 $O/$s.log
}
run premulsum_share_gpu_8ranks_1proc 150 --quick
san() {  # tool name limit
  timeout $3 /usr/local/cuda/bin/compute-sanitizer --tool $1 --error-exitcode 9 ./mk_gpu_tests --quick --only =$2 > $O/$1-$2.log 2>&1
  echo "== $1 $2 --quick rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" $O/$1-$2.log | tail -3
}
san memcheck share_gpu_6ranks_1proc 100
san racecheck share_gpu_6ranks_1proc 120
