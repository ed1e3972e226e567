#!/bin/bash
# s9 GPU run A: the Python package on the GPU host (pip install . with a
# prebuilt native tree), mkernel.torch checks at world 1 and world 2 sharing
# GPU 0, first-call latency with and without shipped plans, the C++ quick suite.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run15.log) 2>&1
set -x
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 --version; python3 -c "import torch; print(torch.__version__, torch.cuda.nccl.version())"
time python3 -m pip install --no-index --no-deps --no-build-isolation -C build-dir=$R/gpu-pkg/native -C prebuilt=$R/gpu-pkg/native/prebuilt $R 2>&1 | tail -3
cd /tmp
python3 -c "import mkernel, mkernel.torch; print(mkernel.__file__, mkernel.version())"
python3 -c "import torch.distributed as dist; print(sorted(m for m in dir(dist.ProcessGroup) if not m.startswith('__')))"
TR="python3 -m torch.distributed.run --master-port 29611"
export MK_CACHE_DIR=/tmp/mkcache-a
timeout 300 $TR --nproc-per-node 1 $R/tests/gpu/torch_check.py 2>&1 | grep -v "^W1\|Warning" | tail -20
timeout 400 $TR --nproc-per-node 2 $R/tests/gpu/torch_check.py --share-gpu 2>&1 | grep -v "^W1\|Warning" | tail -30
echo "== latency: shipped plans, empty cache"
MK_CACHE_DIR=/tmp/mkcache-l1 MK_DEBUG=1 timeout 200 $TR --nproc-per-node 2 $R/tests/gpu/torch_check.py --share-gpu --latency 2>&1 | grep -E "first|using|compiled plan" | sort | uniq -c | sort -rn | head -30
echo "== latency: no shipped plans, empty cache (NVRTC)"
MK_PREBUILT_DIR= MK_CACHE_DIR=/tmp/mkcache-l2 timeout 200 $TR --nproc-per-node 2 $R/tests/gpu/torch_check.py --share-gpu --latency 2>&1 | grep -E "first"
echo "== latency: no shipped plans, warm cache"
MK_PREBUILT_DIR= MK_CACHE_DIR=/tmp/mkcache-l2 timeout 200 $TR --nproc-per-node 2 $R/tests/gpu/torch_check.py --share-gpu --latency 2>&1 | grep -E "first"
echo "== prewarm: no shipped plans, empty cache"
MK_PREBUILT_DIR= MK_CACHE_DIR=/tmp/mkcache-l3 timeout 200 python3 -c "
import time, mkernel
mkernel.set_device(0)
c = mkernel.Communicator.init_all([0, 0])
t = time.perf_counter(); mkernel.prewarm(c[0], dtypes=['bf16','fp16','fp32']); print('prewarm 3 dtypes rank 0 of 2, all cores: %.0f ms' % ((time.perf_counter()-t)*1e3))
t = time.perf_counter(); mkernel.prewarm(c[1], dtypes=['bf16','fp16','fp32']); print('prewarm rank 1 (plans shared): %.0f ms' % ((time.perf_counter()-t)*1e3))
for x in c: x.destroy()
"
cd $R
echo "== C++ quick GPU suite"
LD_LIBRARY_PATH=$R/gpu-pkg/native MK_CACHE_DIR=/tmp/mkcache-q timeout 280 gpu-pkg/mk_gpu_tests --quick 2>&1 | tail -15
