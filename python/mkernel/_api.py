"""The C API of include/mk.h as Python: communicators, collectives on raw
device pointers and CUDA streams, groups; every failure is an MkError with
mKernel's message."""
import contextlib
import ctypes
import math
import os
import struct

from . import _lib

SUCCESS, UNHANDLED_CUDA_ERROR, SYSTEM_ERROR, INTERNAL_ERROR = 0, 1, 2, 3
INVALID_ARGUMENT, INVALID_USAGE, REMOTE_ERROR, IN_PROGRESS = 4, 5, 6, 7
_RESULT_NAMES = {
    0: "mkSuccess",
    1: "mkUnhandledCudaError",
    2: "mkSystemError",
    3: "mkInternalError",
    4: "mkInvalidArgument",
    5: "mkInvalidUsage",
    6: "mkRemoteError",
    7: "mkInProgress",
}

# ncclDataType_t / mkDataType_t values, by every name a user may write.
DTYPES = {
    "int8": 0, "char": 0, "uint8": 1, "int32": 2, "int": 2, "uint32": 3, "int64": 4, "uint64": 5,
    "fp16": 6, "float16": 6, "half": 6, "fp32": 7, "float32": 7, "float": 7, "fp64": 8, "float64": 8,
    "double": 8, "bf16": 9, "bfloat16": 9, "fp8e4m3": 10, "float8_e4m3fn": 10, "fp8e5m2": 11,
    "float8_e5m2": 11,
}
DTYPE_SIZES = {0: 1, 1: 1, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8, 9: 2, 10: 1, 11: 1}
OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
SPLIT_NOCOLOR = -1


def _fp8_decode(code, ebits, mbits):
    bias = (1 << (ebits - 1)) - 1
    sign = -1.0 if code & 0x80 else 1.0
    e = (code >> mbits) & ((1 << ebits) - 1)
    m = code & ((1 << mbits) - 1)
    if ebits == 4 and e == 15 and m == 7:
        return math.nan  # e4m3: no infinities, one NaN code per sign
    if ebits == 5 and e == 31:
        return math.nan if m else sign * math.inf
    if e == 0:
        return sign * m * 2.0 ** (1 - bias - mbits)
    return sign * (1 + m / float(1 << mbits)) * 2.0 ** (e - bias)


def _fp8_encode(x, ebits, mbits):
    """Nearest fp8 code (ties to the even mantissa; zeros keep their sign), saturating
    to the largest finite value, as mKernel's device conversions do. A
    non-finite scalar is refused."""
    if math.isnan(x) or math.isinf(x):
        raise ValueError("a PreMulSum scalar must be finite")
    finite = [(code, _fp8_decode(code, ebits, mbits)) for code in range(256)]
    finite = [(c, v) for c, v in finite if not (math.isnan(v) or math.isinf(v))]
    top = max(v for _, v in finite)
    x = max(-top, min(top, x))  # saturate first: far out, every distance rounds alike
    best, err = None, math.inf
    for code, v in finite:
        d = abs(v - x)
        if d < err or (d == err and best % 2 == 1 and code % 2 == 0):
            best, err = code, d
    if best == 0 and math.copysign(1.0, x) < 0:
        best = 0x80  # -0.0, and negatives that round to zero, keep their sign (as the device's conversion)
    return best


def _scalar_bytes(x, code):
    """The bytes of number `x` in dtype `code` (little-endian)."""
    if code in (0, 1, 2, 3, 4, 5):
        fmt = {0: "b", 1: "B", 2: "i", 3: "I", 4: "q", 5: "Q"}[code]
        return struct.pack("<" + fmt, int(x))
    x = float(x)
    if math.isnan(x) or math.isinf(x):
        raise ValueError("a PreMulSum scalar must be finite")
    if code == 6:
        return struct.pack("<e", x)
    if code == 7:
        return struct.pack("<f", x)
    if code == 8:
        return struct.pack("<d", x)
    if code == 9:  # bf16: float32 rounded to nearest even
        (u,) = struct.unpack("<I", struct.pack("<f", x))
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16 if (u & 0x7F800000) != 0x7F800000 else u >> 16
        return struct.pack("<H", u & 0xFFFF)
    return bytes([_fp8_encode(x, 4, 3) if code == 10 else _fp8_encode(x, 5, 2)])


class MkError(RuntimeError):
    """A failed mKernel call. `code` is the mkResult_t (NCCL's ncclResult_t
    values), `name` its name, the message mKernel's words for what went wrong."""

    def __init__(self, code, message, call=""):
        self.code = int(code)
        self.name = _RESULT_NAMES.get(self.code, "mkResult(%d)" % self.code)
        self.call = call
        super().__init__("%s: %s (%s)" % (call, message, self.name) if call else "%s (%s)" % (message, self.name))


def _fn(name):
    fn = getattr(_lib.lib(), name, None)
    if fn is None:
        raise MkError(INTERNAL_ERROR, "%s lacks %s: it is older than this Python package" %
                      (_lib.libmkernel_path(), name), name)
    return fn


# The calls that may return mkInProgress as an answer (nonblocking init and
# split, a group holding them); from every other call it is an error: the
# communicator is not ready yet.
_MAY_BE_IN_PROGRESS = {"mkCommInitRankConfig", "mkCommSplit", "mkGroupEnd"}


def _check(name, r, comm=None):
    if r == SUCCESS or (r == IN_PROGRESS and name in _MAY_BE_IN_PROGRESS):
        return r
    # the calling thread's last error: always the message of this failure
    # (the communicator's may be another thread's)
    msg = _lib.lib().mkGetLastError(None)
    if r == IN_PROGRESS and not msg:
        msg = b"the communicator is still being created (nonblocking init): poll ready() first"
    raise MkError(r, msg.decode("utf-8", "replace") if msg else "no message", name)


def call(name, *args, comm=None):
    return _check(name, _fn(name)(*args), comm)


def version():
    """mKernel's version code (major*10000 + minor*100 + patch)."""
    v = ctypes.c_int()
    call("mkGetVersion", ctypes.byref(v))
    return v.value


def dtype_code(dtype):
    """An mkDataType_t from a name ("bf16", "float32", ...), an int, or a
    torch/numpy dtype (by its name)."""
    if isinstance(dtype, bool):
        raise MkError(INVALID_ARGUMENT, "unknown dtype %r" % (dtype,))
    if isinstance(dtype, int):
        if dtype in DTYPE_SIZES:
            return dtype
        raise MkError(INVALID_ARGUMENT, "unknown dtype %d (mkDataType_t is 0..11)" % dtype)
    s = str(dtype)
    for prefix in ("torch.", "numpy.", "mk"):
        if s.startswith(prefix):
            s = s[len(prefix):]
    s = s.lower()
    if s in DTYPES:
        return DTYPES[s]
    raise MkError(INVALID_ARGUMENT, "unknown dtype %r; known: %s" % (dtype, ", ".join(sorted(DTYPES))))


def op_code(op):
    if isinstance(op, bool):
        raise MkError(INVALID_ARGUMENT, "unknown reduction op %r" % (op,))
    if isinstance(op, int):
        if 0 <= op < 2**31:  # 5 and above: PreMulSum handles (Communicator.premul_sum), checked by the library
            return op
        raise MkError(INVALID_ARGUMENT, "unknown reduction op %d (mkRedOp_t is 0..4, PreMulSum ops 5 and up)" % op)
    s = str(op).lower()
    if s.startswith("mk"):
        s = s[2:]
    if s in OPS:
        return OPS[s]
    raise MkError(INVALID_ARGUMENT, "unknown reduction op %r; known: %s" % (op, ", ".join(OPS)))


def pointer(buf, what="buffer"):
    """A device address from an int, a torch tensor (data_ptr), an object with
    __cuda_array_interface__ (CuPy, Numba), or None (NULL)."""
    if buf is None:
        return None
    if isinstance(buf, bool):
        raise MkError(INVALID_ARGUMENT, "%s: expected a device pointer, got %r" % (what, buf))
    if isinstance(buf, int):
        return buf or None
    if hasattr(buf, "data_ptr"):
        return buf.data_ptr() or None
    cai = getattr(buf, "__cuda_array_interface__", None)
    if cai is not None:
        return cai["data"][0] or None
    if isinstance(buf, ctypes.c_void_p):
        return buf.value
    raise MkError(INVALID_ARGUMENT, "%s: expected a device pointer (int, tensor or __cuda_array_interface__), got %s"
                  % (what, type(buf).__name__))


def stream_handle(stream):
    """A cudaStream_t from None/0 (the legacy default stream), an int, a
    torch.cuda.Stream (cuda_stream) or a CuPy stream (ptr)."""
    if stream is None:
        return None
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream or None
    for attr in ("cuda_stream", "ptr", "handle"):
        v = getattr(stream, attr, None)
        if isinstance(v, int):
            return v or None
    raise MkError(INVALID_ARGUMENT, "stream: expected a CUDA stream (int, torch.cuda.Stream), got %s" %
                  type(stream).__name__)


def get_unique_id():
    """A new unique id (128 bytes): create it on one rank, give it to all."""
    uid = _lib.UniqueId()
    call("mkGetUniqueId", ctypes.byref(uid))
    return ctypes.string_at(ctypes.addressof(uid), 128)  # all 128 bytes (.internal stops at a NUL)


def _uid(unique_id):
    raw = bytes(unique_id)
    if len(raw) != 128:
        raise MkError(INVALID_ARGUMENT, "unique id must be 128 bytes (from get_unique_id), got %d" % len(raw))
    uid = _lib.UniqueId()
    ctypes.memmove(ctypes.byref(uid), raw, 128)
    return uid


def _schedule_list(schedules):
    """None, a path, or a list of paths (str, bytes or os.PathLike) -> the
    ':'-separated bytes mkConfig_t.schedules takes (None for none). Paths are
    made absolute, so that a relative name holding '=' is not read as NAME=PATH."""
    if schedules is None:
        return None
    if isinstance(schedules, (str, bytes, os.PathLike)):
        schedules = [schedules]
    out = []
    for p in schedules:
        raw = os.fsencode(p)
        if not raw or b":" in raw or b"\0" in raw:
            raise MkError(INVALID_ARGUMENT, "schedules: %r is not a usable path (empty, or holds ':', the list "
                          "separator, or a NUL)" % (p,))
        out.append(os.path.abspath(raw))
    return b":".join(out) or None


def make_config(blocking=None, max_ctas=None, min_ctas=None, name=None, split_share=None, net_name=None,
                schedules=None, span_nodes=None):
    c = _lib.Config()
    c.size = ctypes.sizeof(_lib.Config)
    c.magic = _lib.CONFIG_MAGIC
    c.version = version()
    for f, _ in _lib.Config._fields_[3:]:
        if f not in ("netName", "commName", "schedules"):
            setattr(c, f, _lib.UNDEF_INT)
    if blocking is not None:
        c.blocking = 1 if blocking else 0
    if max_ctas is not None:
        c.maxCTAs = int(max_ctas)
    if min_ctas is not None:
        c.minCTAs = int(min_ctas)
    if split_share is not None:
        c.splitShare = 1 if split_share else 0
    if span_nodes is not None:
        if span_nodes not in _lib.SPAN_NODES:
            raise MkError(INVALID_ARGUMENT, "span_nodes=%r: expected 'fail' or 'bootstrap'" % (span_nodes,))
        c.spanNodes = _lib.SPAN_NODES[span_nodes]
    # kept alive with the struct: ctypes holds the bytes objects
    c._keep = [x.encode() if isinstance(x, str) else x for x in (name, net_name, _schedule_list(schedules))]
    c.commName = c._keep[0]
    c.netName = c._keep[1]
    c.schedules = c._keep[2]
    return c


def set_device(device):
    """Makes `device`'s primary context current on this thread through the
    driver (what cudaSetDevice does), for programs without a CUDA runtime of
    their own. mKernel's communicators use the calling thread's current device."""
    cuda = _driver()
    dev = ctypes.c_int()
    ctx = ctypes.c_void_p()
    steps = (("cuDeviceGet", lambda: cuda.cuDeviceGet(ctypes.byref(dev), int(device))),
             ("cuDevicePrimaryCtxRetain", lambda: cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)),
             ("cuCtxSetCurrent", lambda: cuda.cuCtxSetCurrent(ctx)))
    for name, step in steps:
        r = step()
        if r != 0:
            raise MkError(UNHANDLED_CUDA_ERROR, "%s(device %d) failed with CUDA error %d" % (name, device, r), name)


_cuda = None


def _driver():
    global _cuda
    if _cuda is None:
        try:
            d = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise MkError(UNHANDLED_CUDA_ERROR, "no NVIDIA driver: libcuda.so.1 cannot be loaded (%s)" % e) from None
        r = d.cuInit(0)
        if r != 0:
            raise MkError(UNHANDLED_CUDA_ERROR, "cuInit failed with CUDA error %d (no usable GPU?)" % r, "cuInit")
        _cuda = d
    return _cuda


class Communicator:
    """An mKernel communicator: one rank of `nranks`.

        uid = mkernel.get_unique_id()            # on rank 0, then share it
        comm = mkernel.Communicator(nranks, rank, uid, device=local_gpu)
        comm.all_reduce(x_ptr, x_ptr, count, "bf16", "sum", stream)

    Buffers are device pointers (ints), torch tensors or objects with
    __cuda_array_interface__; counts are in elements, as in NCCL. `device`
    (optional) is made current on this thread first; otherwise the thread's
    current device is used. blocking=False returns at once: poll ready().
    schedules: schedule files (a path or a list: .cpp DSL files, .so plugins,
    MSCCL .xml, MSCCL++ or mKernel IR .json) loaded and proved at init, that
    MK_ALGO and MK_SELECT_FILE can then name (docs/schedules.md); every rank
    must pass the same files.
    span_nodes: what init does when the ranks sit on several nodes (this
    build has no network transport): "fail" (default: MkError naming two
    ranks' hosts) or "bootstrap" (a bootstrap-only communicator: see
    bootstrap_only; its split by node gives full communicators). Every rank
    must pass the same value.
    """

    def __init__(self, nranks, rank, unique_id, device=None, blocking=None, max_ctas=None, name=None,
                 schedules=None, span_nodes=None, _handle=None):
        self._h = None
        if _handle is not None:
            self._h = _handle
            return
        if device is not None:
            set_device(device)
        h = ctypes.c_void_p()
        cfg = make_config(blocking=blocking, max_ctas=max_ctas, name=name, schedules=schedules,
                          span_nodes=span_nodes)
        try:
            call("mkCommInitRankConfig", ctypes.byref(h), int(nranks), _uid(unique_id), int(rank), ctypes.byref(cfg))
        except MkError:
            if h.value:
                _fn("mkCommDestroy")(h)
            raise
        self._h = h

    @classmethod
    def init_all(cls, devices):
        """Ranks 0..len(devices)-1 in this process, rank i on devices[i] (an
        int: that many ranks on GPUs 0..n-1). A GPU may appear more than once."""
        if isinstance(devices, int):
            devices = list(range(devices))
        n = len(devices)
        if n < 1:
            raise MkError(INVALID_ARGUMENT, "init_all: no devices")
        hs = (ctypes.c_void_p * n)()
        devs = (ctypes.c_int * n)(*[int(d) for d in devices])
        call("mkCommInitAll", hs, n, devs)
        return [cls(0, 0, None, _handle=ctypes.c_void_p(hs[i])) for i in range(n)]

    # -- state -------------------------------------------------------------
    @property
    def handle(self):
        """The mkComm_t as an int (0 once destroyed)."""
        return self._h.value if self._h else 0

    def _live(self):
        if not self._h:
            raise MkError(INVALID_USAGE, "this communicator was destroyed")
        return self._h

    def _int(self, name):
        v = ctypes.c_int()
        call(name, self._live(), ctypes.byref(v), comm=self._h)
        return v.value

    @property
    def size(self):
        return self._int("mkCommCount")

    @property
    def rank(self):
        return self._int("mkCommUserRank")

    @property
    def device(self):
        return self._int("mkCommCuDevice")

    @property
    def nodes(self):
        """The nodes this communicator's ranks sit on (1 on one node)."""
        return self._int("mkCommNodeCount")

    @property
    def bootstrap_only(self):
        """True when its ranks span nodes and it was made with
        span_nodes="bootstrap": it runs no collectives (they raise MkError),
        only bootstrap_broadcast, split, destroy and abort. The same on every
        rank, so a caller can hand such a group to another library whole."""
        return self._int("mkCommIsBootstrapOnly") == 1

    def async_error(self):
        """mkSuccess (0), mkInProgress (7) while a nonblocking init or split
        runs, or the sticky error code of an earlier failure."""
        v = ctypes.c_int()
        call("mkCommGetAsyncError", self._live(), ctypes.byref(v), comm=self._h)
        return v.value

    def ready(self):
        """True once the communicator is usable; raises its error if it failed."""
        e = self.async_error()
        if e == IN_PROGRESS:
            return False
        if e != SUCCESS:
            _check("mkCommGetAsyncError", e, self._h)
        return True

    def last_error(self):
        m = _lib.lib().mkGetLastError(self._h)
        return m.decode("utf-8", "replace") if m else ""

    # -- lifetime ----------------------------------------------------------
    def split(self, color, key=None, blocking=None, max_ctas=None, name=None):
        """mkCommSplit: ranks passing the same color form a new communicator
        (None for color=SPLIT_NOCOLOR)."""
        h = ctypes.c_void_p()
        cfg = make_config(blocking=blocking, max_ctas=max_ctas, name=name)
        call("mkCommSplit", self._live(), int(color), self.rank if key is None else int(key), ctypes.byref(h),
             ctypes.byref(cfg), comm=self._h)
        return Communicator(0, 0, None, _handle=h) if h.value else None

    def shrink(self, exclude, abort=False, max_ctas=None, name=None):
        """mkCommShrink: a communicator of this one's ranks without the ranks
        in `exclude` (dead or hung ones), called by every remaining rank and
        by none of the excluded; works after a failure. abort=True stops this
        communicator's kernels first (MK_SHRINK_ABORT)."""
        ranks = [int(r) for r in exclude]
        arr = (ctypes.c_int * max(1, len(ranks)))(*ranks)
        h = ctypes.c_void_p()
        cfg = make_config(max_ctas=max_ctas, name=name)
        call("mkCommShrink", self._live(), arr, len(ranks), ctypes.byref(h), ctypes.byref(cfg), 1 if abort else 0,
             comm=self._h)
        return Communicator(0, 0, None, _handle=h)

    def finalize(self):
        call("mkCommFinalize", self._live(), comm=self._h)

    def destroy(self):
        if self._h:
            h, self._h = self._h, None
            call("mkCommDestroy", h)

    def abort(self):
        """Stops this communicator's kernels, tells the peers; safe from any thread."""
        if self._h:
            h, self._h = self._h, None
            call("mkCommAbort", h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy() if exc[0] is None else self.abort()

    def __del__(self):
        # Destroying waits for the GPU: do it explicitly (destroy/abort or a
        # with-block). Interpreter exit leaves live communicators to the OS.
        pass

    # -- registration and setup -------------------------------------------
    def register(self, buf, nbytes):
        """Zero-copy registration (mkCommRegister); returns the handle."""
        h = ctypes.c_void_p()
        call("mkCommRegister", self._live(), pointer(buf), int(nbytes), ctypes.byref(h), comm=self._h)
        return h.value

    def deregister(self, handle):
        call("mkCommDeregister", self._live(), ctypes.c_void_p(handle), comm=self._h)

    def bootstrap_broadcast(self, data, root=0):
        """Host bytes (at most 4096) from `root` to every rank, over the
        bootstrap connection; every rank passes the same length."""
        data = bytes(data)
        buf = ctypes.create_string_buffer(data, len(data))
        call("mkCommBootstrapBroadcast", self._live(), buf, len(data), int(root), comm=self._h)
        return buf.raw[:len(data)]

    def prewarm(self, dtypes=("bf16", "fp16", "fp32"), ops=("sum",), threads=0):
        """Compiles (or loads) every plan this communicator may pick for the
        six collectives in these dtypes and ops ("premulsum" included), on
        `threads` threads (0: all cores), so the first collective does not
        wait for NVRTC."""
        d = [dtype_code(x) for x in dtypes]
        temp = []  # "premulsum": a PreMulSum op made for the call (one plan per dtype serves every scalar)
        o = []
        for x in ops:
            if isinstance(x, str) and x.lower() in ("premulsum", "premul_sum"):
                temp.append(self.premul_sum(1, "fp32"))
                o.append(temp[-1])
            else:
                o.append(op_code(x))
        da = (ctypes.c_int * max(len(d), 1))(*d)
        oa = (ctypes.c_int * max(len(o), 1))(*o)
        try:
            call("mkCommPrewarm", self._live(), da, len(d), oa, len(o), int(threads), comm=self._h)
        finally:
            for h in temp:
                self.destroy_op(h)

    def premul_sum(self, scalar, dtype):
        """A PreMulSum op (mkRedOpCreatePreMulSum): all_reduce, reduce and
        reduce_scatter in `dtype` with it sum each rank's input times that
        rank's own `scalar` (a Python number, copied now). Returns the op
        handle (an int); free it with destroy_op."""
        code = dtype_code(dtype)
        try:
            raw = _scalar_bytes(scalar, code)
        except (struct.error, TypeError, ValueError, OverflowError) as e:
            raise MkError(INVALID_ARGUMENT, "premul_sum: scalar %r does not fit %s (%s)" % (scalar, dtype, e))
        buf = ctypes.create_string_buffer(raw.ljust(8, b"\0"), 8)
        op = ctypes.c_int()
        call("mkRedOpCreatePreMulSum", ctypes.byref(op), buf, code, 1, self._live(), comm=self._h)
        return op.value

    def premul_sum_device(self, ptr, dtype):
        """A PreMulSum op whose scalar (of type `dtype`) lives in GPU memory at
        `ptr` (an int address on this communicator's GPU) and is read by every
        call's kernel when it runs; keep it alive until the op is destroyed."""
        op = ctypes.c_int()
        call("mkRedOpCreatePreMulSum", ctypes.byref(op), pointer(ptr, "scalar"), dtype_code(dtype), 0, self._live(),
             comm=self._h)
        return op.value

    def destroy_op(self, op):
        """Frees a PreMulSum op (mkRedOpDestroy)."""
        call("mkRedOpDestroy", int(op), self._live(), comm=self._h)

    # -- collectives -------------------------------------------------------
    def all_reduce(self, sendbuf, recvbuf, count, dtype, op="sum", stream=None):
        call("mkAllReduce", pointer(sendbuf, "sendbuf"), pointer(recvbuf, "recvbuf"), int(count), dtype_code(dtype),
             op_code(op), self._live(), stream_handle(stream), comm=self._h)

    def all_reduce_fused(self, sendbuf, recvbuf, count, dtype, fusion, operands, scalars=(), row=0, op="sum",
                         stream=None):
        """mkAllReduceFused: the all-reduce with fusion `fusion`'s prologue
        on every input element as it is read and its epilogue on every row
        of `row` elements of recvbuf ("allreduce.rmsnorm",
        "allreduce.fp8_rows", "allreduce.premulsum" (a prologue only), or one
        a schedule file registers). `operands`: device buffers in the
        fusion's order; `scalars`: numbers (each rank its own for a
        prologue)."""
        operands, scalars = list(operands), list(scalars)
        if len(operands) > 6 or len(scalars) > 4:
            raise MkError(INVALID_ARGUMENT, "all_reduce_fused: at most 6 operands and 4 scalars")
        f = _lib.Fusion()
        f.name = str(fusion).encode()
        for k, o in enumerate(operands):
            f.operands[k] = pointer(o, "operands[%d]" % k)
        for k, v in enumerate(scalars):
            f.scalars[k] = float(v)
        f.row = int(row)
        call("mkAllReduceFused", pointer(sendbuf, "sendbuf"), pointer(recvbuf, "recvbuf"), int(count),
             dtype_code(dtype), op_code(op), ctypes.byref(f), self._live(), stream_handle(stream), comm=self._h)

    def composite(self, name, buffers, count, dtype, op="sum", stream=None):
        """mkCompositeRun: the stages of composite `name` (a schedule file's
        MK_COMPOSITE, e.g. "composite.zero_step") as one kernel. `buffers`:
        one device buffer per name the composite declares, in its order
        (`mkc composite NAME -n N` lists them); `count`: every stage's count."""
        buffers = list(buffers)
        arr = (ctypes.c_void_p * max(1, len(buffers)))()
        for k, b in enumerate(buffers):
            arr[k] = pointer(b, "buffers[%d]" % k)
        call("mkCompositeRun", str(name).encode(), arr, len(buffers), int(count), dtype_code(dtype), op_code(op),
             self._live(), stream_handle(stream), comm=self._h)

    def broadcast(self, sendbuf, recvbuf, count, dtype, root=0, stream=None):
        call("mkBroadcast", pointer(sendbuf, "sendbuf"), pointer(recvbuf, "recvbuf"), int(count), dtype_code(dtype),
             int(root), self._live(), stream_handle(stream), comm=self._h)

    def reduce(self, sendbuf, recvbuf, count, dtype, op="sum", root=0, stream=None):
        call("mkReduce", pointer(sendbuf, "sendbuf"), pointer(recvbuf, "recvbuf"), int(count), dtype_code(dtype),
             op_code(op), int(root), self._live(), stream_handle(stream), comm=self._h)

    def all_gather(self, sendbuf, recvbuf, sendcount, dtype, stream=None):
        call("mkAllGather", pointer(sendbuf, "sendbuf"), pointer(recvbuf, "recvbuf"), int(sendcount),
             dtype_code(dtype), self._live(), stream_handle(stream), comm=self._h)

    def reduce_scatter(self, sendbuf, recvbuf, recvcount, dtype, op="sum", stream=None):
        call("mkReduceScatter", pointer(sendbuf, "sendbuf"), pointer(recvbuf, "recvbuf"), int(recvcount),
             dtype_code(dtype), op_code(op), self._live(), stream_handle(stream), comm=self._h)

    def all_to_all(self, sendbuf, recvbuf, count, dtype, stream=None):
        """count: elements each rank sends to each rank."""
        call("mkAllToAll", pointer(sendbuf, "sendbuf"), pointer(recvbuf, "recvbuf"), int(count), dtype_code(dtype),
             self._live(), stream_handle(stream), comm=self._h)

    def __repr__(self):
        if not self._h:
            return "<mkernel.Communicator destroyed>"
        try:
            return "<mkernel.Communicator rank %d of %d on GPU %d>" % (self.rank, self.size, self.device)
        except MkError as e:
            return "<mkernel.Communicator (%s)>" % e.name


@contextlib.contextmanager
def group():
    """mkGroupStart/End: the calls inside are issued together at the end (all
    or nothing). One thread driving several communicators needs it."""
    call("mkGroupStart")
    try:
        yield
    except BaseException:
        # mkGroupEnd still has to run to leave the group; the user's error wins
        try:
            call("mkGroupEnd")
        except MkError:
            pass
        raise
    call("mkGroupEnd")
