#!/bin/bash
# s13 GPU run 4 (one H200): docs/tutorial.md end to end, the GPU blocks too
# (mk_bench with the tutorial's schedule loaded by MK_SCHEDULES; torchrun with
# mkernel.torch.Communicator(schedules=[...]), two ranks sharing GPU 0).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$PWD; G=$R/build-gpu
O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/run4.log) 2>&1
export MK_TIMEOUT_MS=20000 LD_LIBRARY_PATH=$G PYTHONPATH=$R/python MK_LIBMKERNEL=$G/libmkernel.so.0
python3 -c "import torch; print('torch', torch.__version__)"; which torchrun
timeout 500 python3 $R/tests/tools/run_doc.py $R/docs/tutorial.md --build $G --gpu 2>&1 | grep -v "^W1\|Warning\|^\s*[0-9.]* \.\. " ; echo "run_doc rc=${PIPESTATUS[0]}"
echo "== done"
