#!/bin/bash
# s19 GPU run 3 (one H200): mk_bench --fused with its stronger check (every
# way, NCCL's included, on NaN-poisoned outputs against a float64 reference,
# per row), eager at 1 rank and at 2 ranks sharing the GPU.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run3.log) 2>&1
export LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s19
cd $G
echo "== mk_bench --fused --ranks 1"
timeout 240 ./mk_bench --fused --ranks 1 --out $O/fused-r1.md; echo "   rc=$?"
echo "== mk_bench --fused --share-gpu --ranks 2"
timeout 240 ./mk_bench --fused --share-gpu --ranks 2 --out $O/fused-r2share.md; echo "   rc=$?"
