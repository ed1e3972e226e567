"""mKernel for PyTorch, in pure Python (nothing here is compiled against torch).

Three ways in, from least to most code:

1. Zero code: `mkernel-run torchrun ... train.py` (the NCCL-compatible library).
2. The process-group backend:
       import mkernel.torch
       mkernel.torch.register()
       dist.init_process_group("cuda:mkernel,cpu:gloo")     # or "mkernel"
   Collectives mKernel runs (all_reduce, all_gather_into_tensor,
   reduce_scatter_tensor, broadcast, reduce, all_to_all_single with equal
   splits, and their list forms) run on it; everything else (send/recv,
   gather, scatter, uneven all_to_all, CPU tensors, ops it lacks) goes to a
   wrapped NCCL (CUDA) or gloo (CPU) process group made on first need.
3. The ops, for torch.compile and CUDA graphs:
       comm = mkernel.torch.Communicator()                   # over the default group
       y = torch.ops.mkernel.all_reduce(x, "sum", comm.id)
   all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all:
   functional (a new tensor), on the current CUDA stream, with fake
   implementations for torch.compile, capturable in CUDA graphs.
"""
import contextlib
import os
import threading
from typing import Tuple

import torch
import torch.distributed as dist

from . import _api

__all__ = ["Communicator", "register", "ProcessGroupMkernel", "all_reduce", "all_gather", "reduce_scatter",
           "broadcast", "reduce", "all_to_all", "mk_dtype"]

_DTYPES = {
    torch.int8: "int8", torch.uint8: "uint8", torch.int32: "int32", torch.int64: "int64",
    torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64", torch.bfloat16: "bf16",
}
for _name, _code in (("uint32", "uint32"), ("uint64", "uint64"), ("float8_e4m3fn", "fp8e4m3"),
                     ("float8_e5m2", "fp8e5m2")):
    if hasattr(torch, _name):
        _DTYPES[getattr(torch, _name)] = _code


def mk_dtype(dtype):
    """mKernel's name for a torch dtype, or None when mKernel has none."""
    return _DTYPES.get(dtype)


def _debug():
    # "1" only, as the library reads it (it warns about any other value)
    return os.environ.get("MK_DEBUG", "") == "1"


# ---- communicators --------------------------------------------------------------

_registry = {}  # id -> Communicator (the ops name their communicator by this id)
_registry_lock = threading.Lock()
_next_id = [1]
_created = {}  # (store, key) -> how many Communicators this process made over it (same order on every rank)


def _store_uid(store, key, rank, root=0):
    """The unique id, through a c10d store: `root` creates it, the others wait for it."""
    if rank == root:
        uid = _api.get_unique_id()
        store.set(key, uid)
        return uid
    return bytes(store.get(key))


class Communicator:
    """An mKernel communicator over a torch.distributed process group.

        comm = mkernel.torch.Communicator()        # default group, current device
        comm.all_reduce(x)                         # in place, current stream

    The unique id goes through the default store (rank 0 of the group creates
    it). Every rank of `group` must create it, in the same order.
    schedules=[paths] loads your own algorithms (DSL .cpp, MSCCL .xml, ...)
    at init, proved for the group's size; MK_ALGO or MK_SELECT_FILE selects
    them (docs/schedules.md). With
    store=, rank= and size= (no process group needed), key= names the id in
    that store; the caller keeps it unique. `comm.mk`
    is the underlying mkernel.Communicator (raw-pointer API); `comm.id`
    names it in torch.ops.mkernel.*.
    """

    def __init__(self, group=None, device=None, store=None, rank=None, size=None, max_ctas=None, name=None,
                 key=None, schedules=None, span_nodes=None):
        if rank is None or size is None:
            if not dist.is_initialized():
                raise RuntimeError("mkernel.torch.Communicator: torch.distributed is not initialized "
                                   "(call dist.init_process_group first, or pass store, rank and size)")
            rank = dist.get_rank(group)
            size = dist.get_world_size(group)
            if rank < 0:
                raise RuntimeError("mkernel.torch.Communicator: this process is not a member of the group")
        # A key given with a store is used as it is (the caller keeps it unique).
        # Otherwise the n-th Communicator over a store and key gets key/n: the
        # default store counted by name (each call may return a new Python
        # wrapper of it), another store by identity.
        exact = store is not None and key is not None
        store_id = "default" if store is None else id(store)
        if store is None:
            store = dist.distributed_c10d._get_default_store()
            if group is None:
                gname = "world"
            else:
                gname = getattr(group, "group_name", None) or \
                    ",".join(str(r) for r in dist.get_process_group_ranks(group))
            key = "mkernel/uid/%s" % gname
        elif key is None:
            key = "mkernel/uid"
        if not exact:
            with _registry_lock:
                n = _created.get((store_id, key), 0)
                _created[(store_id, key)] = n + 1
            key = "%s/%d" % (key, n)
        self.device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        if self.device.type != "cuda":
            raise ValueError("mkernel.torch.Communicator: device must be a CUDA device, got %s" % self.device)
        self.rank, self.size = int(rank), int(size)
        uid = _store_uid(store, key, self.rank)
        with torch.cuda.device(self.device):
            # the device's primary context (torch's) current on this thread:
            # mKernel's communicator takes the thread's current device
            _api.set_device(self.device.index if self.device.index is not None else torch.cuda.current_device())
            self.mk = _api.Communicator(self.size, self.rank, uid, max_ctas=max_ctas, name=name, schedules=schedules,
                                        span_nodes=span_nodes)
        with _registry_lock:
            self.id = _next_id[0]
            _next_id[0] += 1
            _registry[self.id] = self

    # in-place convenience methods on the current stream (tensors must be contiguous CUDA tensors)
    def _check(self, t, what="tensor"):
        if not isinstance(t, torch.Tensor) or t.device.type != "cuda" or t.layout != torch.strided:
            raise ValueError("mkernel: %s must be a dense CUDA tensor" % what)
        if t.device != self.device:
            raise ValueError("mkernel: %s is on %s but the communicator on %s" % (what, t.device, self.device))
        if not t.is_contiguous():
            raise ValueError("mkernel: %s must be contiguous" % what)
        d = mk_dtype(t.dtype)
        if d is None:
            raise TypeError("mkernel: dtype %s is not supported (supported: %s)" %
                            (t.dtype, ", ".join(str(k) for k in _DTYPES)))
        return d

    def all_reduce(self, t, op="sum", out=None):
        d = self._check(t)
        if out is None:
            out = t
        else:
            self._check(out, "out")
            if out.dtype != t.dtype or out.numel() != t.numel():
                raise ValueError("mkernel: out (%s, %d elements) must match the tensor (%s, %d elements)" %
                                 (out.dtype, out.numel(), t.dtype, t.numel()))
        self.mk.all_reduce(t, out, t.numel(), d, op, _stream(t))
        return out

    def all_reduce_rmsnorm(self, x, residual, weight, eps=1e-6):
        """(out, residual_out) of torch.ops.mkernel.all_reduce_rmsnorm on this communicator."""
        return torch.ops.mkernel.all_reduce_rmsnorm(x, residual, weight, float(eps), self.id)

    def all_reduce_premulsum(self, x, scale):
        """torch.ops.mkernel.all_reduce_premulsum on this communicator: all_reduce(x * scale)."""
        return torch.ops.mkernel.all_reduce_premulsum(x, float(scale), self.id)

    def all_reduce_fp8(self, x):
        """(out, q, scales) of torch.ops.mkernel.all_reduce_fp8 on this communicator."""
        return torch.ops.mkernel.all_reduce_fp8(x, self.id)

    def destroy(self):
        with _registry_lock:
            _registry.pop(getattr(self, "id", None), None)
        self.mk.destroy()

    def abort(self):
        with _registry_lock:
            _registry.pop(getattr(self, "id", None), None)
        self.mk.abort()


def _stream(t):
    """The current stream of `t`'s GPU (not of the current device)."""
    return torch.cuda.current_stream(t.device).cuda_stream


def _comm(cid):
    c = _registry.get(int(cid))
    if c is None:
        raise RuntimeError("mkernel: no communicator with id %d (destroyed, or made in another process)" % cid)
    return c


# ---- the ops --------------------------------------------------------------------

def _split_rows(t, size, what):
    if t.dim() == 0 or t.shape[0] % size != 0:
        raise ValueError("mkernel.%s: the first dimension (%s) must be a multiple of the group size %d" %
                         (what, tuple(t.shape), size))
    return (t.shape[0] // size,) + tuple(t.shape[1:])


def _gathered(t, size):
    """all_gather's output shape: `size` inputs along dimension 0."""
    return (size * t.shape[0],) + tuple(t.shape[1:]) if t.dim() else (size,)


def _like(t):
    """The output of the ops that keep their input's shape (real and fake)."""
    return torch.empty_like(t, memory_format=torch.contiguous_format)


def _input(t, comm):
    """The communicator, the contiguous input and its mKernel dtype (checked)."""
    c = _comm(comm)
    x = t.contiguous()
    return c, x, c._check(x)


@torch.library.custom_op("mkernel::all_reduce", mutates_args=())
def all_reduce(t: torch.Tensor, op: str, comm: int) -> torch.Tensor:
    """A new tensor: the reduction of `t` over the communicator's ranks."""
    c, x, d = _input(t, comm)
    out = _like(x)
    c.mk.all_reduce(x, out, x.numel(), d, op, _stream(x))
    return out


@all_reduce.register_fake
def _(t, op, comm):
    return _like(t)


@torch.library.custom_op("mkernel::all_gather", mutates_args=())
def all_gather(t: torch.Tensor, comm: int) -> torch.Tensor:
    """Every rank's `t`, concatenated along dimension 0 (rank order)."""
    c, x, d = _input(t, comm)
    out = x.new_empty(_gathered(x, c.size))
    c.mk.all_gather(x, out, x.numel(), d, _stream(x))
    return out


@all_gather.register_fake
def _(t, comm):
    return t.new_empty(_gathered(t, _comm(comm).size))


@torch.library.custom_op("mkernel::reduce_scatter", mutates_args=())
def reduce_scatter(t: torch.Tensor, op: str, comm: int) -> torch.Tensor:
    """This rank's block (along dimension 0) of the reduction of `t`."""
    c, x, d = _input(t, comm)
    out = x.new_empty(_split_rows(x, c.size, "reduce_scatter"))
    c.mk.reduce_scatter(x, out, out.numel(), d, op, _stream(x))
    return out


@reduce_scatter.register_fake
def _(t, op, comm):
    return t.new_empty(_split_rows(t, _comm(comm).size, "reduce_scatter"))


@torch.library.custom_op("mkernel::broadcast", mutates_args=())
def broadcast(t: torch.Tensor, root: int, comm: int) -> torch.Tensor:
    """`root`'s `t` on every rank."""
    c, x, d = _input(t, comm)
    out = _like(x)
    c.mk.broadcast(x, out, x.numel(), d, root, _stream(x))
    return out


@broadcast.register_fake
def _(t, root, comm):
    return _like(t)


@torch.library.custom_op("mkernel::reduce", mutates_args=())
def reduce(t: torch.Tensor, op: str, root: int, comm: int) -> torch.Tensor:
    """The reduction of `t` on `root`; on the other ranks a copy of their `t`."""
    c, x, d = _input(t, comm)
    out = x.clone()  # what non-root ranks get back: their input, never uninitialised memory
    c.mk.reduce(x, out, x.numel(), d, op, root, _stream(x))
    return out


@reduce.register_fake
def _(t, op, root, comm):
    return _like(t)


@torch.library.custom_op("mkernel::all_to_all", mutates_args=())
def all_to_all(t: torch.Tensor, comm: int) -> torch.Tensor:
    """Block j (along dimension 0) of `t` goes to rank j; block i of the
    result came from rank i (all_to_all_single with equal splits)."""
    c, x, d = _input(t, comm)
    _split_rows(x, c.size, "all_to_all")
    out = _like(x)
    c.mk.all_to_all(x, out, x.numel() // c.size, d, _stream(x))
    return out


@all_to_all.register_fake
def _(t, comm):
    return _like(t)


# ---- fused all-reduces (mkAllReduceFused) -------------------------------------------

def _rows_of(x, what):
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError("mkernel.%s: x must have a last dimension (the row), got shape %s" % (what, tuple(x.shape)))
    return x.shape[-1]


def _same(a, x, what, name):
    if a.shape != x.shape or a.dtype != x.dtype:
        raise ValueError("mkernel.%s: %s (%s %s) must match x (%s %s)" % (what, name, tuple(a.shape), a.dtype,
                                                                          tuple(x.shape), x.dtype))


@torch.library.custom_op("mkernel::all_reduce_rmsnorm", mutates_args=())
def all_reduce_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                       comm: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out, residual_out): residual_out = all_reduce(x) + residual and
    out = rms_norm(residual_out, weight, eps) over the last dimension, in one
    kernel (the all-reduce's). fp16, bf16, fp32; last dimension 1..16384."""
    c, xc, d = _input(x, comm)
    hidden = _rows_of(xc, "all_reduce_rmsnorm")
    _same(residual, xc, "all_reduce_rmsnorm", "residual")
    if weight.dim() != 1 or weight.shape[0] != hidden or weight.dtype != x.dtype:
        raise ValueError("mkernel.all_reduce_rmsnorm: weight must be (%d,) of %s, got %s %s" %
                         (hidden, x.dtype, tuple(weight.shape), weight.dtype))
    res, w = residual.contiguous(), weight.contiguous()
    c._check(res, "residual")
    c._check(w, "weight")
    out, res_out = _like(xc), _like(xc)
    if xc.numel() == 0:  # no rows: nothing to reduce (as all_reduce of an empty tensor)
        return out, res_out
    c.mk.all_reduce_fused(xc, out, xc.numel(), d, "allreduce.rmsnorm", [res, res_out, w], [eps], row=hidden,
                          stream=_stream(xc))
    return out, res_out


@all_reduce_rmsnorm.register_fake
def _(x, residual, weight, eps, comm):
    return _like(x), _like(x)


@torch.library.custom_op("mkernel::all_reduce_fp8", mutates_args=())
def all_reduce_fp8(x: torch.Tensor, comm: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, q, scales): out = all_reduce(x); per row of the last dimension,
    scales[row] = amax / 448 (fp32) and q = float8_e4m3fn(out / scale)."""
    c, xc, d = _input(x, comm)
    hidden = _rows_of(xc, "all_reduce_fp8")
    out = _like(xc)
    q = torch.empty(xc.shape, dtype=torch.float8_e4m3fn, device=xc.device)
    scales = torch.empty(xc.shape[:-1], dtype=torch.float32, device=xc.device)
    if xc.numel() == 0:
        return out, q, scales
    c.mk.all_reduce_fused(xc, out, xc.numel(), d, "allreduce.fp8_rows", [q, scales], row=hidden, stream=_stream(xc))
    return out, q, scales


@all_reduce_fp8.register_fake
def _(x, comm):
    return (_like(x), torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device),
            torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device))


@torch.library.custom_op("mkernel::all_reduce_premulsum", mutates_args=())
def all_reduce_premulsum(x: torch.Tensor, scale: float, comm: int) -> torch.Tensor:
    """all_reduce(x * scale), each rank's `scale` its own: the prologue
    fusion allreduce.premulsum (schedules/fused/allreduce_premulsum.cpp), in
    the all-reduce's kernel. fp16, bf16, fp32."""
    c, xc, d = _input(x, comm)
    out = _like(xc)
    if xc.numel() == 0:
        return out
    c.mk.all_reduce_fused(xc, out, xc.numel(), d, "allreduce.premulsum", [], [float(scale)], stream=_stream(xc))
    return out


@all_reduce_premulsum.register_fake
def _(x, scale, comm):
    return _like(x)


# ---- the process-group backend ---------------------------------------------------

class _PreMul:
    """PREMUL_SUM (dist._make_nccl_premul_sum): each rank's input times
    `factor` (a number, or a one-element tensor read on the GPU when the
    kernel runs), then the sum; mkRedOpCreatePreMulSum per call."""

    def __init__(self, factor):
        self.factor = factor


def _reduce_op(rop):
    for name, code in (("SUM", "sum"), ("PRODUCT", "prod"), ("MAX", "max"), ("MIN", "min"), ("AVG", "avg")):
        try:
            if rop == getattr(dist.ReduceOp, name):
                return code
        except (TypeError, RuntimeError):
            pass
    try:
        if rop == dist.ReduceOp.PREMUL_SUM:
            state = rop.__getstate__()  # (op, factor): how c10d pickles a PREMUL_SUM op
            factor = state[1] if isinstance(state, tuple) and len(state) > 1 else None
            if isinstance(factor, (int, float)) and not isinstance(factor, bool):
                return _PreMul(float(factor))
            if torch.is_tensor(factor) and factor.numel() == 1:
                return _PreMul(factor)
    except (TypeError, RuntimeError, AttributeError):
        pass
    return None  # bitwise ops, and a PREMUL_SUM whose factor this torch does not show: NCCL's


@contextlib.contextmanager
def _op_for(c, op, t):
    """The mKernel op for a call on `t`: a built-in name as it is, a
    PreMulSum made for this call (and destroyed after it: a call keeps its
    scalar)."""
    if not isinstance(op, _PreMul):
        yield op
        return
    f = op.factor
    if not t.is_floating_point():  # as torch's NCCL backend: a factor would truncate to an integer
        raise ValueError("PREMUL_SUM needs a floating-point tensor, not %s" % t.dtype)
    if torch.is_tensor(f):
        # the kernel reads the scalar on the call's stream, after this copy
        f = f.to(device=t.device, dtype=t.dtype).reshape(1)
        h = c.mk.premul_sum_device(f.data_ptr(), mk_dtype(t.dtype))
    else:
        h = c.mk.premul_sum(f, mk_dtype(t.dtype))
    try:
        yield h
    finally:
        c.mk.destroy_op(h)


_WorkBase = getattr(dist, "Work", None) or getattr(dist, "_Work")


class _Work(_WorkBase):
    """A collective issued on the current stream: wait() makes the caller's
    current stream wait for it (as NCCL's work does); the future holds the
    tensors."""

    def __init__(self, result, event, device):
        super().__init__()
        self._result = result
        self._event = event
        self._device = device
        # a CUDA-aware future: set_result records the current stream, and
        # wait()/value()/then() make their streams wait for it, as NCCL's does
        self._future = torch.futures.Future(devices=[device])
        with torch.cuda.device(device):
            self._future.set_result(result)

    def wait(self, timeout=None):
        if self._event is not None:
            torch.cuda.current_stream(self._device).wait_event(self._event)
        return True

    def is_completed(self):
        return self._event is None or self._event.query()

    def is_success(self):
        return True

    def get_future(self):
        return self._future

    def result(self):
        return self._result


class ProcessGroupMkernel(dist.ProcessGroup):
    """The "mkernel" backend (see register()). Holds one mKernel communicator
    (made on the first CUDA collective, on that tensor's device) and, made on
    first need, NCCL (CUDA) and gloo (CPU) process groups for what mKernel
    does not run. `stats` counts the calls each one ran."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        self._store = store
        self._rank_, self._size_ = rank, size
        self._timeout = timeout
        self._mk = None
        self._whole = False  # the group spans nodes: NCCL runs every call
        self._made = 0
        self._nccl = None
        self._gloo = None
        self._lock = threading.Lock()
        self.stats = {"mkernel": 0, "nccl": 0, "gloo": 0}

    # -- identity -----------------------------------------------------------
    def getBackendName(self):
        return "mkernel"

    def getRank(self):
        return self._rank_

    def getSize(self):
        return self._size_

    def __repr__(self):
        return "ProcessGroupMkernel(rank %d of %d)" % (self._rank_, self._size_)

    # -- what runs where ------------------------------------------------------
    def _comm_for(self, t):
        with self._lock:
            if self._mk is None:
                # a new key for each communicator this group makes (after an
                # abort), counted by the group itself: the same on every rank
                self._made += 1
                # a group spanning nodes gets a bootstrap-only communicator
                # (the same answer on every rank): NCCL then runs it whole
                self._mk = Communicator(device=t.device, store=self._store, rank=self._rank_, size=self._size_,
                                        key="mkernel/uid/%d" % self._made, span_nodes="bootstrap")
                self._whole = self._mk.mk.bootstrap_only
                if _debug():
                    if self._whole:
                        print("mkernel.torch: rank %d: the group spans %d nodes: NCCL runs it whole (MK_NET is "
                              "not set)" % (self._rank_, self._mk.mk.nodes))
                    else:
                        print("mkernel.torch: rank %d: mKernel communicator on %s" % (self._rank_, t.device))
            elif self._mk.device != t.device:
                raise ValueError("mkernel: this process group's communicator is on %s, the tensor on %s (one GPU "
                                 "per rank and group, as with NCCL)" % (self._mk.device, t.device))
            return self._mk

    def _mk_ok(self, *tensors):
        """The communicator if mKernel runs a collective on these tensors,
        else None (NCCL's or gloo's then). Decided by what is the same on every
        rank (device type, layout, dtype); what differs between ranks is an
        error, never a different library on different ranks."""
        if not tensors:
            return None
        for t in tensors:
            if t.device.type != "cuda" or t.layout != torch.strided or mk_dtype(t.dtype) is None:
                return None
        for t in tensors:
            if not t.is_contiguous():
                raise ValueError("mkernel: tensors must be contiguous (as with NCCL)")
            if t.device != tensors[0].device:
                raise ValueError("mkernel: tensors on %s and %s in one call" % (tensors[0].device, t.device))
        c = self._comm_for(tensors[0])
        return None if self._whole else c

    def _done(self, result, t):
        self.stats["mkernel"] += 1
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(t.device))
        return _Work(result, ev, t.device)

    def _fallback(self, tensors, what):
        cuda = any(isinstance(t, torch.Tensor) and t.device.type == "cuda" for t in tensors)
        with self._lock:
            if cuda:
                if self._nccl is None:
                    opts = dist.ProcessGroupNCCL.Options()
                    if hasattr(opts, "_timeout"):
                        opts._timeout = self._timeout
                    self._nccl = dist.ProcessGroupNCCL(dist.PrefixStore("nccl", self._store), self._rank_,
                                                      self._size_, opts)
                pg, name = self._nccl, "nccl"
            else:
                if self._gloo is None:
                    self._gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo", self._store), self._rank_,
                                                      self._size_, self._timeout)
                pg, name = self._gloo, "gloo"
        self.stats[name] += 1
        if _debug():
            print("mkernel.torch: rank %d: %s -> %s" % (self._rank_, what, name))
        return pg

    # -- collectives ----------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        opts = opts or dist.AllreduceOptions()
        op = _reduce_op(opts.reduceOp)
        c = self._mk_ok(*tensors) if len(tensors) == 1 and op else None
        if c is None:
            return self._fallback(tensors, "allreduce").allreduce(tensors, opts)
        t = tensors[0]
        with _op_for(c, op, t) as o:
            c.mk.all_reduce(t, t, t.numel(), mk_dtype(t.dtype), o, _stream(t))
        return self._done(tensors, t)

    def _root_ok(self, c, root):
        """Across nodes (MK_NET) mKernel runs a rooted collective only with its
        root on a node's first rank; NCCL runs the others (every rank passes the
        same root, so every rank routes alike)."""
        nodes = c.mk.nodes
        return nodes <= 1 or self._size_ % nodes != 0 or root % (self._size_ // nodes) == 0

    def broadcast(self, tensors, opts=None):
        opts = opts or dist.BroadcastOptions()
        c = self._mk_ok(*tensors) if len(tensors) == 1 and opts.rootTensor == 0 else None
        if c is not None and not self._root_ok(c, opts.rootRank):
            c = None
        if c is None:
            return self._fallback(tensors, "broadcast").broadcast(tensors, opts)
        t = tensors[0]
        c.mk.broadcast(t, t, t.numel(), mk_dtype(t.dtype), opts.rootRank, _stream(t))
        return self._done(tensors, t)

    def reduce(self, tensors, opts=None):
        opts = opts or dist.ReduceOptions()
        op = _reduce_op(opts.reduceOp)
        c = self._mk_ok(*tensors) if len(tensors) == 1 and op and opts.rootTensor == 0 else None
        if c is not None and not self._root_ok(c, opts.rootRank):
            c = None
        if c is None:
            return self._fallback(tensors, "reduce").reduce(tensors, opts)
        t = tensors[0]
        with _op_for(c, op, t) as o:
            c.mk.reduce(t, t, t.numel(), mk_dtype(t.dtype), o, opts.rootRank, _stream(t))
        return self._done(tensors, t)

    def _allgather_base(self, output, input, opts=None):
        opts = opts or dist.AllgatherOptions()
        c = self._mk_ok(output, input) if output.dtype == input.dtype and \
            output.numel() == input.numel() * self._size_ else None
        if c is None:
            return self._fallback([output, input], "all_gather_into_tensor")._allgather_base(output, input, opts)
        c.mk.all_gather(input, output, input.numel(), mk_dtype(input.dtype), _stream(input))
        return self._done([output], output)

    all_gather_single = _allgather_base

    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.AllgatherOptions()
        outs = output_tensors[0] if len(output_tensors) == 1 else None
        inp = input_tensors[0] if len(input_tensors) == 1 else None
        ok = (outs is not None and inp is not None and len(outs) == self._size_ and
              all(o.shape == inp.shape and o.dtype == inp.dtype and o.device == inp.device for o in outs))
        # outputs are filled by copies and the input is made contiguous: what
        # decides is what every rank shares (dtype, layout)
        ok = ok and all(t.layout == torch.strided for t in list(outs) + [inp])
        c = self._mk_ok(inp.contiguous()) if ok else None
        if c is None:
            return self._fallback(input_tensors, "allgather").allgather(output_tensors, input_tensors, opts)
        x = inp.contiguous()
        flat = x.new_empty((self._size_ * x.numel(),))
        with torch.cuda.device(x.device):
            c.mk.all_gather(x, flat, x.numel(), mk_dtype(x.dtype), _stream(x))
            for i, o in enumerate(outs):
                o.copy_(flat[i * x.numel():(i + 1) * x.numel()].view(o.shape))
        return self._done(output_tensors, x)

    def _reduce_scatter_base(self, output, input, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        op = _reduce_op(opts.reduceOp)
        c = self._mk_ok(output, input) if op and output.dtype == input.dtype and \
            input.numel() == output.numel() * self._size_ else None
        if c is None:
            return self._fallback([output, input], "reduce_scatter_tensor")._reduce_scatter_base(output, input, opts)
        with _op_for(c, op, input) as o:
            c.mk.reduce_scatter(input, output, output.numel(), mk_dtype(input.dtype), o, _stream(input))
        return self._done([output], output)

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        op = _reduce_op(opts.reduceOp)
        out = output_tensors[0] if len(output_tensors) == 1 else None
        ins = input_tensors[0] if len(input_tensors) == 1 else None
        ok = (op and out is not None and ins is not None and len(ins) == self._size_ and
              all(i.shape == out.shape and i.dtype == out.dtype and i.device == out.device for i in ins))
        ok = ok and all(t.layout == torch.strided for t in ins)  # the inputs are concatenated
        c = self._mk_ok(out) if ok else None
        if c is None:
            return self._fallback(output_tensors, "reduce_scatter").reduce_scatter(output_tensors, input_tensors,
                                                                                  opts)
        with torch.cuda.device(out.device):
            flat = torch.cat([i.reshape(-1) for i in ins])
            with _op_for(c, op, out) as o:
                c.mk.reduce_scatter(flat, out, out.numel(), mk_dtype(out.dtype), o, _stream(out))
        return self._done(output_tensors, out)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        opts = opts or dist.AllToAllOptions()
        equal = not output_split_sizes and not input_split_sizes
        c = self._mk_ok(output, input) if equal and output.dtype == input.dtype and \
            output.numel() == input.numel() and input.numel() % self._size_ == 0 else None
        if c is None:
            return self._fallback([output, input], "all_to_all_single").alltoall_base(
                output, input, output_split_sizes, input_split_sizes, opts)
        c.mk.all_to_all(input, output, input.numel() // self._size_, mk_dtype(input.dtype), _stream(input))
        return self._done([output], output)

    all_to_all_single = alltoall_base

    def barrier(self, opts=None):
        # a one-element all-reduce on this group's GPU, waited for on the host
        dev = self._mk.device if self._mk is not None else torch.device("cuda", torch.cuda.current_device())
        t = torch.zeros(1, device=dev)
        c = self._comm_for(t)
        if c is None or self._whole:
            return self._fallback([t], "barrier").barrier(opts or dist.BarrierOptions())
        c.mk.all_reduce(t, t, 1, "fp32", "sum", _stream(t))
        torch.cuda.current_stream(t.device).synchronize()
        self.stats["mkernel"] += 1
        return _Work([t], None, t.device)

    # -- everything else: NCCL (CUDA) or gloo (CPU) -----------------------------
    def send(self, tensors, dst, tag=0):
        return self._fallback(tensors, "send").send(tensors, dst, tag)

    def recv(self, tensors, src, tag=0):
        return self._fallback(tensors, "recv").recv(tensors, src, tag)

    def recv_anysource(self, tensors, tag=0):
        return self._fallback(tensors, "recv_anysource").recv_anysource(tensors, tag)

    def gather(self, output_tensors, input_tensors, opts=None):
        return self._fallback(input_tensors, "gather").gather(output_tensors, input_tensors,
                                                               opts or dist.GatherOptions())

    def scatter(self, output_tensors, input_tensors, opts=None):
        return self._fallback(output_tensors, "scatter").scatter(output_tensors, input_tensors,
                                                                  opts or dist.ScatterOptions())

    def alltoall(self, output_tensors, input_tensors, opts=None):
        return self._fallback(input_tensors, "alltoall").alltoall(output_tensors, input_tensors,
                                                                   opts or dist.AllToAllOptions())

    def allreduce_coalesced(self, tensors, opts=None):
        return self._fallback(tensors, "allreduce_coalesced").allreduce_coalesced(
            tensors, opts or dist.AllreduceCoalescedOptions())

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        return self._fallback(inputs, "allgather_into_tensor_coalesced").allgather_into_tensor_coalesced(
            outputs, inputs, opts or dist.AllgatherOptions())

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        return self._fallback(inputs, "reduce_scatter_tensor_coalesced").reduce_scatter_tensor_coalesced(
            outputs, inputs, opts or dist.ReduceScatterOptions())

    # -- lifetime -------------------------------------------------------------
    def abort(self):
        with self._lock:
            if self._mk is not None:
                self._mk.abort()
                self._mk = None
        for pg in (self._nccl, self._gloo):
            if pg is not None and hasattr(pg, "abort"):
                pg.abort()

    def shutdown(self):
        with self._lock:
            if self._mk is not None:
                self._mk.destroy()
                self._mk = None
        for pg in (self._nccl, self._gloo):
            if pg is not None and hasattr(pg, "shutdown"):
                pg.shutdown()
        if _debug():
            print("mkernel.torch: rank %d: calls %s" % (self._rank_, self.stats))


def _create(store, rank, size, timeout):
    return ProcessGroupMkernel(store, rank, size, timeout)


_registered = set()


def register(name="mkernel"):
    """Registers the distributed backend `name` ("mkernel"):
    dist.init_process_group("cuda:mkernel,cpu:gloo") or ("mkernel")."""
    if name not in _registered:
        dist.Backend.register_backend(name, _create, devices=["cuda", "cpu"])
        _registered.add(name)
    return name
