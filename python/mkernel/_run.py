"""`mkernel-run CMD ARGS...`: runs CMD with mKernel's NCCL-compatible
libnccl.so.2 preloaded (see docs/migrating-from-nccl.md)."""
import os
import sys

from . import _lib


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        sys.stderr.write("usage: mkernel-run CMD [ARGS...]   (runs CMD with mKernel's libnccl.so.2 preloaded)\n")
        return 0 if argv else 2
    shim = os.path.abspath(_lib.nccl_shim_path())
    if not os.path.exists(shim):
        sys.stderr.write("mkernel-run: mKernel's libnccl.so.2 not found at %s (set MK_NCCL_SHIM)\n" % shim)
        return 2
    env = dict(os.environ)
    pre = env.get("LD_PRELOAD")
    env["LD_PRELOAD"] = shim + (":" + pre if pre else "")
    env.setdefault("MK_LIBMKERNEL", os.path.abspath(_lib.libmkernel_path()))
    env.update(NCCL_NVLS_ENABLE="0", NVSHMEM_DISABLE_NVLS="1", TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as e:
        sys.stderr.write("mkernel-run: cannot run %s: %s\n" % (argv[0], e))
        return 127


if __name__ == "__main__":
    sys.exit(main())
