#!/bin/bash
# s15 GPU run 7 (one H200): regressions of the quick suite after Args grew to
# 272 bytes (every kernel reads it) and kernels' tails changed: a cross-section
# of scenarios (plain matrix, ranks sharing, zero-copy, graphs, edge values,
# bad input, a killed peer, split), --quick, within one call's time.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run7.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s15
cd $G
for s in matrix_1rank share_gpu_3ranks_1proc registered_2gpu_1proc graphs_2gpu_1proc edge_values_share_gpu_3ranks_1proc bad_input_1rank killed_peer_2proc split_2ranks_2proc share_gpu_10ranks_1proc_wide; do
  echo "== $s"; timeout 80 ./mk_gpu_tests --quick --only $s 2>&1 | grep -E "^PASS|^FAIL|FAILED|passed" | tail -2; echo "   rc=${PIPESTATUS[0]}"
done
