#!/bin/bash
# s17 GPU run 2 (one H200): a group's repeated calls of one plan now take
# copies of its resources in turn (side by side in a group kernel instead of
# chained): the group scenarios fused and unfused, memcheck, composites and
# graphs again, and mk_group_bench. Binaries carried in build-gpu/.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run2.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s17
cd $G
for s in group_fused_share_gpu_3ranks_1proc group_fused_share_gpu_2ranks_2proc group_fused_1rank group_unfused_share_gpu_2ranks_1proc; do
  echo "== $s"
  q=; case $s in *1rank|*unfused*) q=--quick;; esac
  MK_DEBUG=1 timeout 120 ./mk_gpu_tests $q --only $s > $O/$s.log 2>&1; rc=$?
  tail -2 $O/$s.log; echo "   rc=$rc; group kernels built: $(grep -c 'group kernel mk_group_.* ready' $O/$s.log), refused: $(grep -c 'runs as one launch per call' $O/$s.log)"
done
echo "== memcheck group_fused_share_gpu_3ranks_1proc --quick"
timeout 120 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 ./mk_gpu_tests --quick --only group_fused_share_gpu_3ranks_1proc 2>&1 | tail -3; echo "   rc=${PIPESTATUS[0]}"
for s in composite_share_gpu_3ranks_1proc graphs_2gpu_1proc; do
  echo "== $s --quick"
  timeout 60 ./mk_gpu_tests --quick --only $s 2>&1 | tail -2; echo "   rc=${PIPESTATUS[0]}"
done
echo "== mk_group_bench --ranks 1 (eager)"
timeout 60 ./mk_group_bench --ranks 1 2>&1 | tail -5
echo "== mk_group_bench --ranks 1 --graph"
timeout 60 ./mk_group_bench --ranks 1 --graph 2>&1 | tail -5
echo "== mk_group_bench --share-gpu --ranks 2"
timeout 60 ./mk_group_bench --share-gpu --ranks 2 2>&1 | tail -5
