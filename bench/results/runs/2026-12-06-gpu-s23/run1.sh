#!/bin/bash
# s23 GPU run 1 (one GPU). Issue 35: NVRTC's --Ofast-compile (MK_FAST_COMPILE
# = 0 | min | mid | max). What each level costs a call (mk_bench --share-gpu,
# graphs, 8 and 4 ranks sharing the GPU: a proxy), levels alternating, fresh
# cache each; cold compile times on this 16-core host (mkc compile, rank 0's
# plan and the plan of every rank); correctness at each level.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu/fc
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run1.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G
nvidia-smi -L; nproc
bench() {  # level ranks lo hi round
  local l=$1 n=$2 f=$O/bench-fc$1-n$2-$3-r$5
  MK_FAST_COMPILE=$l MK_CACHE_DIR=/tmp/mkc-fc$l timeout 200 $G/mk_bench --share-gpu -g $n -c allreduce -d bf16 \
    -b $3 -e $4 -f 4 -G --batches 15 --no-nccl --label "fc=$l" --out $f.md > $f.log 2>&1
  echo "== bench fc=$l n=$n $3..$4 round $5 rc=$?"
  grep -E "^\| allreduce" $f.md | awk -F'|' '{printf "  %s %s / %s\n", $3, $5, $8}'
}
for l in 0 min mid max; do bench $l 8 8 256K 1; done
for l in mid min 0; do bench $l 8 8 256K 2; done
for l in 0 min mid; do bench $l 8 1M 64M 1; done
for l in mid min 0; do bench $l 4 8 256K 1; done
echo "== cold compile on this host (mkc compile, bf16 sum, fresh cache)"
for l in 0 min mid max; do
  for s in "allreduce.one_shot 8 --rank=0" "allreduce.one_shot 8" "allreduce.two_shot 16 --rank=0" "alltoall.direct 16 --rank=0" "allreduce.ring 64 --rank=0" "allreduce.one_shot 64 --rank=0"; do
    set -- $s; rm -rf /tmp/p /tmp/cc
    MK_CACHE_DIR=/tmp/cc $G/mkc compile -s $1 -n $2 $3 --dtype bf16 --fast-compile $l -o /tmp/p > /tmp/c.log 2>&1
    echo "  fc=$l $s rc=$? $(grep -o 'cubin(s); [0-9]* ms' /tmp/c.log)"
  done
done
cd $G
run() {  # name limit suffix
  local t0=$(date +%s)
  timeout $2 ./mk_gpu_tests --quick --only =$1 > $O/$1$3.log 2>&1; local rc=$?
  echo "== $1 MK_FAST_COMPILE=${MK_FAST_COMPILE:-} rc=$rc ($(( $(date +%s) - t0 )) s)"; tail -1 $O/$1$3.log
}
for l in min mid max; do
  export MK_FAST_COMPILE=$l MK_CACHE_DIR=/tmp/mkc-t$l
  run share_gpu_6ranks_1proc 90 -$l
  run ranks_share_gpu_4ranks_1proc 90 -$l
done
unset MK_FAST_COMPILE
