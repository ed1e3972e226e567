#!/bin/bash
# s13 GPU run 5 (one H200): after the review fixes (init agrees on the IR of
# every user schedule a communicator can run): the split scenarios on main's
# binaries, and a schedule from MK_SCHEDULES serving all-reduce again.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu; F=$R/tests/fixtures
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run5.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s13b
t0=$(date +%s); timeout 300 $G/mk_gpu_tests --quick --only split > $O/suite-split.log 2>&1; echo "suite split rc=$? $(( $(date +%s) - t0 )) s"
grep -E "^(PASS|FAIL|SKIP)" $O/suite-split.log
echo "== MK_SCHEDULES mscclpp 2 ranks bf16, graphs"
MK_SCHEDULES=mine2=$F/mscclpp/allreduce_tbg_2.json MK_ALGO=allreduce=mine2 timeout 120 $G/mk_bench --share-gpu -g 2 -c allreduce -b 1K -e 4M -f 4 -G 2>&1 | grep -E "allreduce .*(ok|WRONG)|rror" | head -12
echo "== done"
