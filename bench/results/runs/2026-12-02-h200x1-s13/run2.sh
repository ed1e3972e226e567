#!/bin/bash
# s13 GPU run 2 (one H200): branch wip/peer-pointers-by-value (build-gpu/peer/)
# against main (build-gpu/, its JIT cache warm from run 1): graphs and eager
# 1 KiB - 4 MiB, alternating main and branch three times; memcheck of the
# branch; the branch's GPU suite scenarios that launch every kind of kernel.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; M=$R/build-gpu; P=$R/build-gpu/peer
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run2.log) 2>&1
export MK_TIMEOUT_MS=20000
C=allreduce,allgather,reducescatter,alltoall
L="one H200 (nvidia-h200), ranks sharing it"
t0=$(date +%s); LD_LIBRARY_PATH=$P MK_CACHE_DIR=/tmp/mkc-peer timeout 200 $P/mk_gpu_tests --prewarm 90 | tail -1; echo "prewarm $(( $(date +%s) - t0 )) s"
bench() { local who=$1 dir=$2 cache=$3; shift 3
  LD_LIBRARY_PATH=$dir MK_CACHE_DIR=$cache timeout 60 $dir/mk_bench --share-gpu -g 2 -c $C "$@" --label "$L, $who" --out $O/b.md | grep -E "rror|WRONG|failed"
  cat $O/b.md >> $O/cmp.md; rm -f $O/b.md; }
for i in 1 2 3; do
  bench main $M /tmp/mkc-main -b 1K -e 4M -G; bench peer $P /tmp/mkc-peer -b 1K -e 4M -G
  echo "== round $i graphs"
done
bench main $M /tmp/mkc-main -b 8 -e 4M -f 4; bench peer $P /tmp/mkc-peer -b 8 -e 4M -f 4; echo "== eager"
echo "== memcheck (branch)"
LD_LIBRARY_PATH=$P MK_CACHE_DIR=/tmp/mkc-peer timeout 120 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 $P/mk_bench --share-gpu -g 3 -c $C -d fp32 -b 100 -e 1M -f 6 -n 2 --batches 2 --warmup-ms 0 2>&1 | grep -E "ERROR SUMMARY|WRONG|rror" | tail -3; echo "   rc=${PIPESTATUS[0]}"
for s in matrix_2gpu edge_values graphs_2gpu sizes_2gpu_1proc share_gpu_3ranks split killed_peer abort_race; do
  t0=$(date +%s); LD_LIBRARY_PATH=$P MK_CACHE_DIR=/tmp/mkc-peer timeout 150 $P/mk_gpu_tests --quick --only $s >> $O/suite-peer.log 2>&1; echo "suite $s rc=$? $(( $(date +%s) - t0 )) s"
done
grep -E "^(PASS|FAIL|SKIP)" $O/suite-peer.log
echo "== done"
