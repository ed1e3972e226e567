#!/bin/bash
# s14 GPU run 5 (one H200, 2 ranks sharing it: a proxy, not NVLink): what the
# PreMulSum prologue costs. mk_bench in CUDA graphs, bf16, all-reduce and
# reduce-scatter, plain sum vs --premulsum (scalar 1: same sums, checked),
# alternating, in one run.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run5.log) 2>&1
export LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-s14b
cd $O
for i in 1 2; do
  for mode in sum premulsum; do
    extra=""; [ $mode = premulsum ] && extra="--premulsum"
    echo "== $mode (sweep $i)"
    timeout 110 $G/mk_bench --share-gpu -g 2 -d bf16 -c allreduce,reducescatter -b 1K -e 64M -f 4 -G --no-inplace \
      --batches 10 --warmup-ms 20 --no-probe --prewarm $extra --out $O/$mode-$i.md 2>&1 | tail -2
  done
done
grep -h "^|" $O/*.md | head -80
