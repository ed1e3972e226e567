#!/bin/bash
# s18 GPU run 4 (one H200): tests/gpu/torch_check.py at world 2 sharing the
# GPU, now with torch.ops.mkernel.all_reduce_premulsum (the prologue fusion)
# next to the other fused ops; then the two one-process benchmarks after
# their timing loop was shared (bench/batch_timer.hpp).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run4.log) 2>&1
export PYTHONPATH=$R/python MK_LIBMKERNEL=$G/libmkernel.so.0 MK_CACHE_DIR=/tmp/mkc-s18t
cd /tmp
TR="python3 -m torch.distributed.run --master-port 29618"
timeout 300 $TR --nproc-per-node 2 $R/tests/gpu/torch_check.py --share-gpu 2>&1 | grep -E "TORCH CHECK|FAIL|SKIP|calls by|Error|rror|premulsum"
echo "   rc=${PIPESTATUS[0]}"
# the benchmarks after their timing moved into bench/batch_timer.hpp (ce3292c)
cd $G
export LD_LIBRARY_PATH=$G
echo "== mk_bench --fused --ranks 1 --tokens 1,1024 --hidden 4096"
timeout 100 ./mk_bench --fused --ranks 1 --tokens 1,1024 --hidden 4096 2>&1 | tail -4
echo "== mk_group_bench --ranks 1 --graph"
timeout 100 ./mk_group_bench --ranks 1 --graph 2>&1 | tail -5
