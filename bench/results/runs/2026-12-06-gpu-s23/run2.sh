#!/bin/bash
# s23 GPU run 2 (one GPU). Issue 35: codegen's block groups (adjacent thread
# blocks that run the same steps with other peers share one function, j =
# the block's index among them; MK_TUNE block_groups=0 restores a function
# per block). (1) speed, groups on vs off, alternating (mk_bench
# --share-gpu, graphs, 8 ranks on one GPU: a proxy), five collectives;
# (2) memcheck and racecheck of grouped kernels; (3) cold compile on this
# 16-core host, rank 0's plan.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu/g
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run2.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G
nvidia-smi -L
bench() {  # groups ranks round
  local g=$1 n=$2 f=$O/bench-g$1-n$2-r$3
  MK_TUNE=block_groups=$g MK_CACHE_DIR=/tmp/mkc-g$g timeout 200 $G/mk_bench --share-gpu -g $n \
    -c allreduce,allgather,reducescatter,alltoall,broadcast -d bf16 -b 8 -e 8M -f 16 -G --batches 10 --no-nccl \
    --label "block_groups=$g" --out $f.md > $f.log 2>&1
  echo "== bench block_groups=$g n=$n round $3 rc=$?"
  grep -E "^\| (allreduce|allgather|reducescatter|alltoall|broadcast)" $f.md | awk -F'|' '{printf "  %s %s %s / %s\n", $2, $3, $5, $8}'
}
bench 1 8 1; bench 0 8 1; bench 1 8 2; bench 0 8 2
echo "== cold compile on this host (mkc compile --rank 0, bf16 sum, fresh cache)"
for g in 1 0; do
  for s in "allreduce.two_shot 16" "alltoall.direct 16" "allgather.direct 16" "allreduce.one_shot 16" "allreduce.two_shot 64" "allreduce.one_shot 64" "allreduce.one_shot 8" "allreduce.ring 64"; do
    set -- $s; rm -rf /tmp/p /tmp/cc
    MK_CACHE_DIR=/tmp/cc $G/mkc compile -s $1 -n $2 --rank 0 --dtype bf16 --tune block_groups=$g -o /tmp/p > /tmp/c.log 2>&1
    echo "  block_groups=$g $s rc=$? $(grep -o 'cubin(s); [0-9]* ms' /tmp/c.log)"
  done
done
cd $G
export MK_CACHE_DIR=/tmp/mkc-g1
for tool in memcheck racecheck; do
  for s in share_gpu_6ranks_1proc ranks_share_gpu_4ranks_1proc; do
    timeout 150 /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 9 ./mk_gpu_tests --quick --only =$s > $O/$tool-$s.log 2>&1
    echo "== $tool $s rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed" $O/$tool-$s.log | tail -2
  done
done
