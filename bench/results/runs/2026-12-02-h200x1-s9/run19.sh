#!/bin/bash
# s9 GPU run D: mk_bench --share-gpu (2 ranks, processes, on the one H200,
# mKernel only): the current kernels, then a variant with 8 (not 4) 16-byte
# loads in flight per thread in the simple protocol's copy/reduce loop
# (templates/kernel.cuh prim_simple: U = NS <= 2 ? 8 : (NS <= 4 ? 4 : 2);
# built in a scratch copy, not committed). gpu-pkg/native: this commit's
# libmkernel.so.0 and shipped plans; gpu-pkg/variant: the variant's library.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run19.log) 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
B="gpu-pkg/mk_bench --ranks 2 --share-gpu --colls allreduce,allgather,reducescatter --min-bytes 16384 --max-bytes 268435456 --iters 20 --batches 15"
for round in 1 2; do
  echo "== round $round: current kernels (U=4)"
  LD_LIBRARY_PATH=$R/gpu-pkg/native MK_PREBUILT_DIR=$R/gpu-pkg/native/prebuilt MK_CACHE_DIR=/tmp/mkc-base timeout 250 $B --out $O/base$round.md | grep -v "^  "
  echo "== round $round: variant (U=8)"
  LD_LIBRARY_PATH=$R/gpu-pkg/variant MK_PREBUILT_DIR= MK_CACHE_DIR=/tmp/mkc-var timeout 250 $B --out $O/var$round.md | grep -v "^  "
done
