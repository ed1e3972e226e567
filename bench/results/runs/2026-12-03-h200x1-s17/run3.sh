#!/bin/bash
# s17 GPU run 3 (one H200): after run 2 showed (a) the resource copies' host
# cost (a plan's resource key serialised per call: cached per plan instance
# now) and (b) no group kernel at 3 ranks sharing the GPU (copies need lanes
# that do not fit: a call with no room now chains onto an existing lane),
# the group scenarios, memcheck, composites, and mk_group_bench again.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run3.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s17
cd $G
for s in group_fused_share_gpu_3ranks_1proc group_fused_share_gpu_2ranks_2proc group_unfused_share_gpu_2ranks_1proc composite_share_gpu_3ranks_1proc; do
  echo "== $s --quick"
  MK_DEBUG=1 timeout 60 ./mk_gpu_tests --quick --only $s > $O/$s.log 2>&1; rc=$?
  tail -2 $O/$s.log; echo "   rc=$rc; group kernels built: $(grep -c 'group kernel mk_group_.* ready' $O/$s.log), refused: $(grep -c 'runs as one launch per call' $O/$s.log)"
done
echo "== memcheck group_fused_share_gpu_3ranks_1proc --quick"
timeout 90 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 ./mk_gpu_tests --quick --only group_fused_share_gpu_3ranks_1proc 2>&1 | tail -3; echo "   rc=${PIPESTATUS[0]}"
echo "== mk_group_bench --ranks 1 (eager)"
timeout 60 ./mk_group_bench --ranks 1 2>&1 | tail -5
echo "== mk_group_bench --ranks 1 --graph"
timeout 60 ./mk_group_bench --ranks 1 --graph 2>&1 | tail -5
echo "== mk_group_bench --share-gpu --ranks 2"
timeout 60 ./mk_group_bench --share-gpu --ranks 2 2>&1 | tail -5
