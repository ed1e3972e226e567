#!/bin/bash
# s17 GPU run 1 (one H200): composites (mkCompositeRun: stages of different
# plans chained on one lane, or side by side), groups whose dependent calls now
# chain instead of splitting, the shared record_failure of Ctx::fail and the
# chain barrier, a regression cross-section, memcheck, and mk_group_bench
# (now with the zero-step composite). Binaries built on the CPU machine
# (Release, build/) and carried in build-gpu/.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run1.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s17
cd $G
nvidia-smi -L
for s in composite_share_gpu_3ranks_1proc composite_share_gpu_2ranks_2proc composite_1rank; do
  echo "== $s"
  MK_DEBUG=1 timeout 240 ./mk_gpu_tests --only $s > $O/$s.log 2>&1; rc=$?
  tail -3 $O/$s.log; echo "   rc=$rc; group kernels built: $(grep -c 'group kernel mk_group_.* ready' $O/$s.log), refused: $(grep -c 'runs as one launch per call' $O/$s.log)"
done
echo "== memcheck composite_share_gpu_3ranks_1proc --quick"
timeout 240 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 ./mk_gpu_tests --quick --only composite_share_gpu_3ranks_1proc 2>&1 | tail -4; echo "   rc=${PIPESTATUS[0]}"
for s in group_fused_share_gpu_3ranks_1proc group_fused_1rank killed_peer_2proc stalled_rank_2proc matrix_1rank premulsum_share_gpu_3ranks_1proc fused_share_gpu_3ranks_1proc; do
  echo "== $s --quick"
  timeout 150 ./mk_gpu_tests --quick --only $s 2>&1 | tail -2; echo "   rc=${PIPESTATUS[0]}"
done
echo "== mk_group_bench --ranks 1 (eager)"
timeout 150 ./mk_group_bench --ranks 1 2>&1 | tail -6
echo "== mk_group_bench --ranks 1 --graph"
timeout 150 ./mk_group_bench --ranks 1 --graph 2>&1 | tail -6
echo "== mk_group_bench --share-gpu --ranks 2"
timeout 150 ./mk_group_bench --share-gpu --ranks 2 2>&1 | tail -6
