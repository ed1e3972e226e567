#!/bin/bash
# s13 GPU run 1 (one H200), main's binaries (build-gpu/): prewarm, a sweep of
# the simple protocol's largest tile (MK_TUNE=max_tile: smaller tiles = more
# steps a launch, the pipeline fills sooner) for all-reduce and
# reduce-scatter 512 KiB - 64 MiB in graphs, then the whole quick GPU suite.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run1.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-main
B="$G/mk_bench --share-gpu -g 2"
L="one H200 (nvidia-h200), ranks sharing it"
t0=$(date +%s); timeout 200 $G/mk_gpu_tests --prewarm 90 | tail -1; echo "prewarm $(( $(date +%s) - t0 )) s"
for t in 262144 131072 65536 32768 16384; do
  t0=$(date +%s%N)
  MK_TUNE=max_tile=$t timeout 60 $B -c allreduce,reducescatter -b 512K -e 64M -G --label "$L, MK_TUNE=max_tile=$t" --out $O/t.md | grep -E "rror|WRONG|failed"
  echo "== max_tile $t ($(( ($(date +%s%N) - t0) / 1000000 )) ms)"; cat $O/t.md >> $O/tiles.md; rm -f $O/t.md
done
t0=$(date +%s); timeout 340 $G/mk_gpu_tests --quick > $O/suite.log 2>&1; echo "suite rc=$? $(( $(date +%s) - t0 )) s"
grep -E "^(PASS|FAIL|SKIP)|mk_gpu_tests:" $O/suite.log
echo "== done"
