#!/bin/bash
# s22 GPU run 4 (one GPU), the final build. Default: a code path per rank in
# one-pass kernels, as before, each rank compiling only its own
# (codegen: served class); new templates (fail_record out of line, runtime
# LL masks plumbing, GEN paths unused). Old (HEAD 69e857a) vs v4 default vs
# v4 with MK_TUNE=one_pass_generic=1, alternating; then correctness of both
# paths (6 ranks, one process: six plans, one per rank) and memcheck.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=/tmp/out; mkdir -p $O
trap 'tar -C /tmp -czf $OUT/run4.tgz out 2>/dev/null' EXIT
exec > >(tee $O/run4.log) 2>&1
export MK_TIMEOUT_MS=20000
nvidia-smi -L
bench() {  # lib label ranks dtype round [tune]
  local w=$1 lab=$2 n=$3 t=$4 k=$5
  local f=$O/bench-$lab-n$n-$t-r$k
  MK_TUNE=${6:-} MK_CACHE_DIR=/tmp/mkc-$lab LD_LIBRARY_PATH=$G/$w timeout 150 $G/v4/mk_bench --share-gpu -g $n -c allreduce -d $t \
    -b 8 -e 256K -f 4 -G --batches 15 --no-nccl --label "$lab" --out $f.md > $f.log 2>&1
  echo "== bench $lab n=$n $t round $k rc=$?"
  grep -E "^\| allreduce" $f.md | head -8 | awk -F'|' '{printf "  %s %s / %s\n", $3, $5, $8}'
}
for k in 1 2; do bench old old 8 bf16 $k; bench v4 v4 8 bf16 $k; done
bench v4 v4gen 8 bf16 1 one_pass_generic=1
bench v4 v4 4 bf16 1; bench old old 4 bf16 1
cd $G/v4
export LD_LIBRARY_PATH=$G/v4 MK_CACHE_DIR=/tmp/mkc-v4
run() {  # name limit
  local t0=$(date +%s)
  timeout $2 ./mk_gpu_tests --quick --only =$1 > $O/$1${3:-}.log 2>&1; local rc=$?
  echo "== $1 ${MK_TUNE:-} rc=$rc ($(( $(date +%s) - t0 )) s)"; tail -1 $O/$1${3:-}.log
}
run share_gpu_6ranks_1proc 60
MK_TUNE=one_pass_generic=1 run share_gpu_6ranks_1proc 60 -generic
run ranks_share_gpu_4ranks_1proc 60
timeout 100 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 ./mk_gpu_tests --quick --only =share_gpu_6ranks_1proc > $O/memcheck.log 2>&1
echo "== memcheck share_gpu_6ranks_1proc rc=$?"; grep -E "ERROR SUMMARY|passed" $O/memcheck.log | tail -2
