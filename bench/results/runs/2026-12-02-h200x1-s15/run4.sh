#!/bin/bash
# s15 GPU run 4 (one H200): after the epilogue kernel stopped reading the
# host-mapped abort word (PCIe reads of many blocks queued: 1.1 us a block)
# and the row context's loads became plain: the fused scenarios (auto and
# both forced modes), then bench/fused_rmsnorm.py at world 1 (runtime's
# choice, forced tail, forced kernel).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run4.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s15
cd $G
for s in fused_share_gpu_3ranks_1proc fused_tail_share_gpu_3ranks_1proc fused_kernel_share_gpu_2ranks_1proc; do
  echo "== $s"; timeout 100 ./mk_gpu_tests --only $s 2>&1 | tail -3; echo "   rc=${PIPESTATUS[0]}"
done
unset LD_LIBRARY_PATH
export PYTHONPATH=$R/python MK_LIBMKERNEL=$G/libmkernel.so.0 MK_CACHE_DIR=/tmp/mkc-s15t
cd /tmp
TR="python3 -m torch.distributed.run --master-port 29620"
for m in auto tail kernel; do
  echo "== bench world 1 (MK_FUSED_EPILOGUE=$m)"
  MK_FUSED_EPILOGUE=$m timeout 100 $TR --nproc-per-node 1 $R/bench/fused_rmsnorm.py --out $O/fused-w1-$m.md 2>&1 | grep -E "^\| |^world|rror"
  echo "   rc=${PIPESTATUS[0]}"
done
