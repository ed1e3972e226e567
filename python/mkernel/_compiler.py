"""The compiler from Python: `mkc` run as a subprocess (the same binary the
command line uses, shipped in the package)."""
import os
import subprocess

from . import _lib


class CompileError(RuntimeError):
    """mkc refused: the schedule did not prove, did not compile, or the
    arguments were wrong. The message is mkc's explanation."""

    def __init__(self, message, returncode):
        self.returncode = returncode
        super().__init__(message)


def mkc(*args, check=True):
    """Runs `mkc ARGS...`; returns its standard output. check=True raises
    CompileError with mkc's message when it exits non-zero."""
    exe = _lib.mkc_path()
    if not os.path.exists(exe):
        raise CompileError("mkc not found at %s (set MK_MKC, or reinstall the package)" % exe, 127)
    p = subprocess.run([exe] + [str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and p.returncode != 0:
        raise CompileError((p.stderr.strip() or p.stdout.strip() or "mkc failed") +
                           "\n  (command: mkc %s)" % " ".join(str(a) for a in args), p.returncode)
    return p.stdout


def _schedule_args(schedule, ranks, root, topology):
    if os.path.exists(str(schedule)):
        args = [str(schedule)]
    else:
        args = ["--schedule", str(schedule)]
    if ranks is not None:
        args += ["--ranks", int(ranks)]
    if root is not None:
        args += ["--root", int(root)]
    if topology is not None:
        args += ["--topology", topology]
    return args


def verify(schedule=None, ranks=None, root=None, topology=None, strict=False, dtype=None, fusion=None):
    """Proves that `schedule` (a built-in name such as "allreduce.ring", or a
    file: MSCCL XML, MSCCL++ JSON, mKernel IR JSON) computes its collective.
    strict=True also requires bit-identical results on every rank (for
    `dtype` only, when given). fusion="NAME" also checks that fusion's code
    on the CPU (mk.verify.E020-E022); without a schedule, only that.
    Returns mkc's report; raises CompileError with the counterexample if not."""
    if schedule is None and fusion is None:
        raise ValueError("verify needs a schedule, a fusion, or both")
    args = ["verify"] + (_schedule_args(schedule, ranks, root, topology) if schedule is not None else [])
    if strict:
        args.append("--strict")
    if dtype is not None:
        args += ["--dtype", dtype]
    if fusion is not None:
        args += ["--fusion", fusion]
    return mkc(*args)


def compile(schedule, out, ranks=None, dtype="fp32", op="sum", arch="sm_90", root=None, topology=None,
            extra=()):
    """Compiles `schedule` into a plan directory `out` (plan.json and cubins)
    that the runtime loads through MK_PLAN_DIR. Returns `out`."""
    args = ["compile"] + _schedule_args(schedule, ranks, root, topology)
    args += ["--dtype", dtype, "--op", op, "--arch", arch, "-o", str(out)] + list(extra)
    mkc(*args)
    return str(out)
