#!/usr/bin/env bash
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
P=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH=$P:${LD_LIBRARY_PATH:-} MK_CACHE_DIR=/tmp/mkcache MK_TIMEOUT_MS=60000 MK_TEST_LIMIT_S=200
nvidia-smi -L
( (time "$P/mk_gpu_tests" --prewarm 90) 2>&1 | tail -3 ) | tee $OUT/prewarm.txt
"$P/mk_gpu_tests" --quick --skip sizes 2>&1 | tee $OUT/quick.txt | grep -E "^(PASS|FAIL)|FAILED|mk_gpu_tests:"
HD="allreduce=allreduce.halving_doubling,allgather=allgather.hier,reducescatter=reducescatter.hier"
HI="allreduce=allreduce.hier,allgather=allgather.hier,reducescatter=reducescatter.hier"
( for t in share_gpu_2ranks_1proc share_gpu_4ranks_1proc_4mib; do echo "== MK_ALGO=$HD $t"; MK_ALGO=$HD "$P/mk_gpu_tests" --quick --only $t 2>&1 | tail -2; done
  for t in share_gpu_2ranks_1proc share_gpu_3ranks_1proc; do echo "== MK_ALGO=$HI $t"; MK_ALGO=$HI "$P/mk_gpu_tests" --quick --only $t 2>&1 | tail -2; done ) | tee $OUT/algo.txt
CS=/usr/local/cuda/bin/compute-sanitizer
( echo "== memcheck MK_ALGO=$HD share_gpu_2ranks_1proc"; MK_ALGO=$HD timeout 150 $CS --tool memcheck "$P/mk_gpu_tests" --quick --only share_gpu_2ranks_1proc 2>&1 | tail -3
  echo "== memcheck MK_ALGO=$HI share_gpu_3ranks_1proc"; MK_ALGO=$HI timeout 150 $CS --tool memcheck "$P/mk_gpu_tests" --quick --only share_gpu_3ranks_1proc 2>&1 | tail -3
  echo "== memcheck matrix_1rank"; timeout 150 $CS --tool memcheck "$P/mk_gpu_tests" --quick --only matrix_1rank 2>&1 | tail -3 ) | tee $OUT/memcheck.txt
