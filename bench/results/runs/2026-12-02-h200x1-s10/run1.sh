#!/bin/bash
# s10 GPU run 1 (one H200): the new mk_bench in its one-GPU proxy mode (2 ranks
# as one process, concurrent kernels) on the session-9 kernels (build-gpu/base)
# and this tree's (build-gpu), then sweeps of the simple protocol's knobs, then
# the GPU suite's boundary scenarios (the open 64 KiB question).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run1.log) 2>&1
export MK_TIMEOUT_MS=20000
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem --format=csv,noheader
B="$G/mk_bench --share-gpu -g 2"
run() { local tag=$1; shift; echo "== $tag: $*"; local t0=$(date +%s%N); "$@" | grep -E "^  |rror|WRONG|failed"; echo "   ($(( ($(date +%s%N) - t0) / 1000000 )) ms)"; }
# 1. session-9 kernels vs this tree's, eager, 8 B .. 256 MiB
for lib in base new; do
  L=$G; [ $lib = base ] && L=$G/base
  LD_LIBRARY_PATH=$L MK_CACHE_DIR=/tmp/mkc-$lib run eager-$lib timeout 170 $B -b 8 -e 256M --prewarm --out $O/eager-$lib.md --json $O/eager-$lib.json --plot $O/eager-$lib.svg
done
# 2. graphs (the 16 KiB target), this tree
LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-new run graph-new timeout 60 $B -c allreduce,allgather,reducescatter -b 8 -e 4M -f 4 -G --out $O/graph-new.md
LD_LIBRARY_PATH=$G/base MK_CACHE_DIR=/tmp/mkc-base run graph-base timeout 60 $B -c allreduce -b 8 -e 4M -f 4 -G --out $O/graph-base.md
# 3. registered buffers (zero-copy from 4 MiB)
LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-new run reg-new timeout 60 $B -c allreduce,allgather,reducescatter -b 1M -e 256M -f 4 --register --out $O/reg-new.md
# 4. knob sweep: all-reduce 16-256 MiB out-of-place
for inst in 16 24 32; do for lt in 8,0 16,0 4,1 8,1; do for tile in 262144 65536; do
  t="simple_instances=$inst,simple_loads=${lt%,*},simple_pipeline=${lt#*,},max_tile=$tile"
  LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-sweep MK_TUNE=$t run "sweep $t" timeout 40 $B -c allreduce -b 16M -e 256M -f 4 --no-inplace --batches 10 --warmup-ms 0
done; done; done
# 5. the GPU suite's boundary scenarios (16 KiB, 64 KiB, 256 KiB +-16 B) on this tree
LD_LIBRARY_PATH=$G MK_CACHE_DIR=/tmp/mkc-new timeout 170 $G/mk_gpu_tests --quick --only sizes
echo "== done"
