#!/bin/bash
# s15 GPU run 6 (one H200): vector accessors move whole 16-byte words (union of
# uint4 words; run 5 copied a struct of bf16 structs). As run 5: the
# built-ins (element path kept, same per-thread order: rank 0's residual is
# misaligned in some calls, so ranks take different paths and must still
# agree bit-wise): the fused scenarios (auto, forced tail, forced kernel),
# memcheck (quick), then bench/fused_rmsnorm.py at world 1.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run6.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s15
cd $G
for s in fused_share_gpu_3ranks_1proc fused_share_gpu_2ranks_2proc fused_tail_share_gpu_3ranks_1proc fused_kernel_share_gpu_2ranks_1proc; do
  echo "== $s"; timeout 100 ./mk_gpu_tests --only $s 2>&1 | tail -3; echo "   rc=${PIPESTATUS[0]}"
done
echo "== memcheck fused_share_gpu_3ranks_1proc --quick"
timeout 120 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 ./mk_gpu_tests --quick --only fused_share_gpu_3ranks_1proc 2>&1 | grep -E "ERROR SUMMARY|FAIL|rror|passed" | tail -5; echo "   rc=${PIPESTATUS[0]}"
unset LD_LIBRARY_PATH
export PYTHONPATH=$R/python MK_LIBMKERNEL=$G/libmkernel.so.0 MK_CACHE_DIR=/tmp/mkc-s15t
cd /tmp
TR="python3 -m torch.distributed.run --master-port 29622"
echo "== bench world 1"
timeout 100 $TR --nproc-per-node 1 $R/bench/fused_rmsnorm.py --out $O/fused-w1.md 2>&1 | grep -E "^\| |^world|rror"
echo "   rc=${PIPESTATUS[0]}"
