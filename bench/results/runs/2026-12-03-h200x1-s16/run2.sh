#!/bin/bash
# s16 GPU run 2 (one H200): group kernels take their argument as
# __grid_constant__ (run 1: fused groups 6-14x slower than one launch per
# call; suspected a per-thread local copy of the whole GroupArgs). Group
# scenarios, memcheck, the bench, and the local memory of the group cubins.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run2.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s16b
cd $G
for s in group_fused_share_gpu_3ranks_1proc group_fused_share_gpu_2ranks_2proc group_fused_1rank; do
  echo "== $s"
  timeout 200 ./mk_gpu_tests --only $s 2>&1 | tail -2; echo "   rc=${PIPESTATUS[0]}"
done
echo "== memcheck group_fused_share_gpu_3ranks_1proc --quick"
timeout 200 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 ./mk_gpu_tests --quick --only group_fused_share_gpu_3ranks_1proc 2>&1 | tail -2; echo "   rc=${PIPESTATUS[0]}"
for a in "--ranks 1" "--ranks 1 --graph" "--share-gpu --ranks 2"; do
  echo "== mk_group_bench $a"
  timeout 120 ./mk_group_bench $a 2>&1 | tail -3
done
echo "== local memory (bytes per thread) of group and plan cubins"
for f in $(ls $MK_CACHE_DIR/*.cubin 2>/dev/null | head -400); do
  /usr/local/cuda/bin/cuobjdump --dump-resource-usage $f 2>/dev/null | grep -E "Function|STACK" | paste - - | sed -E 's/.*Function ([^ :]*).*STACK:([0-9]+).*LOCAL:([0-9]+).*/\1 stack=\2 local=\3/'
done | sort | uniq | grep -E "group|stack=[1-9]|local=[1-9]" | head -30
