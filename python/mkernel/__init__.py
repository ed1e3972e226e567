"""mKernel: GPU collectives compiled into fused CUDA kernels.

    import mkernel
    uid = mkernel.get_unique_id()                  # rank 0, then share it
    comm = mkernel.Communicator(nranks, rank, uid, device=gpu)
    comm.all_reduce(ptr, ptr, count, "bf16", "sum", stream)
    mkernel.verify("allreduce.ring", ranks=8)      # the compiler: prove a schedule
    mkernel.compile("allreduce.ring", ranks=8, out="plans/", dtype="bf16")

PyTorch: `mkernel.torch` (ops, the "mkernel" process-group backend).
NCCL programs unchanged: `mkernel-run CMD` (the NCCL-compatible library).
`python -m mkernel ...` is the compiler's command line, `mkc`.
"""
from ._api import (DTYPES, OPS, SPLIT_NOCOLOR, Communicator, MkError, get_unique_id, group, set_device,
                   version)
from ._compiler import CompileError, compile, mkc, verify
from ._lib import libmkernel_path, nccl_shim_path, prebuilt_dir

__version__ = "0.1.0"


def prewarm(comm, dtypes=("bf16", "fp16", "fp32"), ops=("sum",), threads=0):
    """Compiles every plan `comm` may pick for the six collectives in `dtypes`
    and `ops` before the first step (on all cores with threads=0). Plans the
    package ships, and plans compiled before (the kernel cache), load in
    milliseconds. Call it on every rank (it is local: no communication)."""
    comm = getattr(comm, "mk", comm)  # a mkernel.torch.Communicator holds one
    comm.prewarm(dtypes=dtypes, ops=ops, threads=threads)


__all__ = ["Communicator", "MkError", "CompileError", "get_unique_id", "group", "set_device", "version", "compile",
           "verify", "mkc", "prewarm", "DTYPES", "OPS", "SPLIT_NOCOLOR", "libmkernel_path", "nccl_shim_path",
           "prebuilt_dir"]
