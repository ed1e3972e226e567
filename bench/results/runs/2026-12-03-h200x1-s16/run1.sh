#!/bin/bash
# s16 GPU run 1 (one H200): groups as one kernel (MK_GROUP_FUSE), the body/
# chain split of every generated kernel, a regression cross-section, memcheck,
# and mk_group_bench. Binaries built on the CPU machine and carried in build-gpu/.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run1.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s16
cd $G
nvidia-smi -L
for s in group_fused_share_gpu_3ranks_1proc group_fused_share_gpu_2ranks_2proc group_fused_1rank group_unfused_share_gpu_2ranks_1proc; do
  echo "== $s"
  MK_DEBUG=1 timeout 200 ./mk_gpu_tests --only $s > $O/$s.log 2>&1; rc=$?
  tail -3 $O/$s.log; echo "   rc=$rc; group kernels built: $(grep -c 'group kernel mk_group_.* ready' $O/$s.log), refused: $(grep -c 'runs as one launch per call' $O/$s.log)"
done
echo "== memcheck group_fused_share_gpu_3ranks_1proc --quick"
timeout 200 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 ./mk_gpu_tests --quick --only group_fused_share_gpu_3ranks_1proc 2>&1 | tail -4; echo "   rc=${PIPESTATUS[0]}"
for s in matrix_1rank fused_share_gpu_3ranks_1proc graphs_2gpu_1proc premulsum_share_gpu_3ranks_1proc killed_peer_2proc registered_2gpu_1proc; do
  echo "== $s --quick"
  timeout 150 ./mk_gpu_tests --quick --only $s 2>&1 | tail -2; echo "   rc=${PIPESTATUS[0]}"
done
echo "== mk_group_bench --ranks 1 (eager)"
timeout 120 ./mk_group_bench --ranks 1 2>&1 | tail -5
echo "== mk_group_bench --ranks 1 --graph"
timeout 120 ./mk_group_bench --ranks 1 --graph 2>&1 | tail -5
echo "== mk_group_bench --share-gpu --ranks 2"
timeout 120 ./mk_group_bench --share-gpu --ranks 2 2>&1 | tail -5
