#!/bin/bash
# s17 GPU run 4 (one H200): a regression cross-section (--quick) over what the
# session's runtime changes touch indirectly (every call's arguments now name
# their resource set; groups; capture; abort; splits; copy engines).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run4.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s17
cd $G
for s in two_comms_2gpu_1proc back_to_back_2gpu_1proc graphs_2gpu_2proc first_use_capture_2gpu_1proc abort_race_2gpu_1proc registered_2gpu_2proc edge_values_share_gpu_3ranks_1proc copy_engine_share_gpu_3ranks_1proc split_4ranks_1proc bad_input_1rank composite_share_gpu_2ranks_2proc; do
  echo "== $s --quick"
  timeout 45 ./mk_gpu_tests --quick --only $s 2>&1 | tail -1; echo "   rc=${PIPESTATUS[0]}"
done
