#!/bin/bash
# s18 GPU run 3 (one H200): abort_race_2gpu_1proc after its fix (the abort is
# timed from the first completed group), each run with a cold plan cache
# (the condition that made it fail), output kept.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run3.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G
cd $G
fails=0
for i in 1 2 3 4 5 6; do
  export MK_CACHE_DIR=/tmp/mkc-s18-cold-$i
  timeout 60 ./mk_gpu_tests --quick --only abort_race_2gpu_1proc > $O/abort-$i.log 2>&1 || fails=$((fails+1))
  grep -E "groups before|PASS|FAIL" $O/abort-$i.log
done
echo "abort_race cold-cache runs failed: $fails of 6"
echo "== memcheck abort_race_2gpu_1proc --quick (cold cache)"
MK_CACHE_DIR=/tmp/mkc-s18-cold-m timeout 120 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 ./mk_gpu_tests --quick --only abort_race_2gpu_1proc 2>&1 | tail -3; echo "   rc=${PIPESTATUS[0]}"
