#!/bin/bash
# The multi-node speed table's runs on one GPU host (docs/multi-node.md, "Speed"):
# the loopback socket's ceilings, the GPU micro-benchmarks, the proxy with an
# emulated device, and mKernel's 2x1 and 2x2 all-reduce through MK_NET=socket
# with ranks of one process standing in for the nodes (MK_HOST_ID=a,b /
# a,a,b,b), plus the one-node phases the 2x2 is compared with.
#
#   bench/net_speed.sh BUILD_DIR OUT_DIR
#
# BUILD_DIR holds mk_bench, mk_net_bench and libmkernel.so.0 (a build folder or
# a folder of carried binaries). Every table lands in OUT_DIR as markdown.
set -u
d=${1:?usage: bench/net_speed.sh BUILD_DIR OUT_DIR}
out=${2:?usage: bench/net_speed.sh BUILD_DIR OUT_DIR}
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export LD_LIBRARY_PATH=$d:${LD_LIBRARY_PATH:-}
mkdir -p "$out"
step() { echo "=== $(date +%T) $*"; }
nvidia-smi -L 2>/dev/null
NET="MK_NET=socket MK_SOCKET_IFNAME==lo MK_TIMEOUT_MS=60000"
step "socket ceiling"
for s in ${STREAMS:-2 1}; do
  MK_SOCKET_NSTREAMS=$s MK_SOCKET_IFNAME==lo timeout 60 "$d/mk_net_bench" socket --mib 1024 --sizes 256K,1M,4M | tee "$out/socket-$s.md"
done
step "proxy, emulated device"
for c in 1 4; do
  MK_SOCKET_IFNAME==lo timeout 90 "$d/mk_net_bench" proxy --mib 1024 --sizes 256K,1M,4M --conns $c | tee "$out/proxy-$c.md"
done
step "GPU stores into pinned memory, trigger round trip"
timeout 60 "$d/mk_net_bench" gpu | tee "$out/gpu.md"
B="--share-gpu --no-nccl --batches ${BATCHES:-5} -n ${ITERS:-5} -f 4 -e 256M --no-inplace"
step "2x1 all-reduce"
env $NET MK_HOST_ID=a,b timeout 150 "$d/mk_bench" -g 2 -c allreduce -d fp32 $B -b 8 \
  --label "2x1 MK_NET=socket loopback, ranks of one process sharing the GPU" --out "$out/ar-2x1.md" | tail -22
step "2x2 all-reduce"
env $NET MK_HOST_ID=a,a,b,b timeout 150 "$d/mk_bench" -g 4 -c allreduce -d fp32 $B -b 16 \
  --label "2x2 MK_NET=socket loopback, ranks of one process sharing the GPU" --out "$out/ar-2x2.md" | tail -22
step "phases of the 2x2: reduce-scatter and all-gather inside one node of 2"
timeout 120 "$d/mk_bench" -g 2 -c reducescatter,allgather -d fp32 $B -b 16 \
  --label "1x2 phases, ranks of one process sharing the GPU" --out "$out/phase-node.md" | tail -30
step done
