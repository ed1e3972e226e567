#!/bin/bash
# s16 GPU run 3 (one H200): the chain barrier reads only the device abort
# word (run 2: still 6-14x slower; every block read the host-mapped abort
# flag once per barrier). Group scenarios and the bench.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run3.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s16c
cd $G
for s in group_fused_share_gpu_3ranks_1proc group_fused_share_gpu_2ranks_2proc; do
  echo "== $s"
  timeout 200 ./mk_gpu_tests --only $s 2>&1 | tail -2; echo "   rc=${PIPESTATUS[0]}"
done
for a in "--ranks 1" "--ranks 1 --graph" "--share-gpu --ranks 2"; do
  echo "== mk_group_bench $a"
  timeout 120 ./mk_group_bench $a 2>&1 | tail -3
done
