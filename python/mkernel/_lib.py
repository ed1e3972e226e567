"""Where the package's native files are, and libmkernel.so.0 opened through ctypes.

Nothing here is compiled against Python: one wheel serves every CPython 3.
The library is opened on first use, so `import mkernel` works on machines
without a GPU or driver; calls then fail with mKernel's own message.
"""
import ctypes
import os
import threading

_HERE = os.path.dirname(os.path.abspath(__file__))


def _prefix():
    # The wheel's layout: mkernel/{bin,lib,share} beside this file, the same
    # tree `cmake --install` writes. MK_PREFIX points at another one (a
    # build's install prefix).
    return os.environ.get("MK_PREFIX") or _HERE


def path(*parts):
    return os.path.join(_prefix(), *parts)


def libmkernel_path():
    """libmkernel.so.0 this package uses: MK_LIBMKERNEL, else the package's own."""
    env = os.environ.get("MK_LIBMKERNEL")
    return env if env else path("lib", "libmkernel.so.0")


def mkc_path():
    return os.environ.get("MK_MKC") or path("bin", "mkc")


def nccl_shim_path():
    return os.environ.get("MK_NCCL_SHIM") or path("lib", "mkernel", "nccl", "libnccl.so.2")


def prebuilt_dir():
    return path("share", "mkernel", "prebuilt")


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


class Fusion(ctypes.Structure):
    # mkFusion_t (include/mk.h): a fused epilogue's name, operands, scalars, row.
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("operands", ctypes.c_void_p * 6),
        ("scalars", ctypes.c_double * 4),
        ("row", ctypes.c_int64),
    ]


class Config(ctypes.Structure):
    # mkConfig_t (include/mk.h): NCCL 2.28's ncclConfig_t, field for field.
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("magic", ctypes.c_uint),
        ("version", ctypes.c_uint),
        ("blocking", ctypes.c_int),
        ("cgaClusterSize", ctypes.c_int),
        ("minCTAs", ctypes.c_int),
        ("maxCTAs", ctypes.c_int),
        ("netName", ctypes.c_char_p),
        ("splitShare", ctypes.c_int),
        ("trafficClass", ctypes.c_int),
        ("commName", ctypes.c_char_p),
        ("collnetEnable", ctypes.c_int),
        ("CTAPolicy", ctypes.c_int),
        ("shrinkShare", ctypes.c_int),
        ("nvlsCTAs", ctypes.c_int),
        ("nChannelsPerNetPeer", ctypes.c_int),
        ("nvlinkCentricSched", ctypes.c_int),
        ("schedules", ctypes.c_char_p),
        ("spanNodes", ctypes.c_int),
    ]


UNDEF_INT = -2147483648
CONFIG_MAGIC = 0xCAFEBEEF
SPAN_NODES = {"fail": 0, "bootstrap": 1}  # mkConfig_t.spanNodes (MK_SPAN_NODES_*)

_c = ctypes
_P = _c.c_void_p
_R = _c.c_int
_S = _c.c_size_t
# name: (argument types); every function returns mkResult_t unless listed below.
_SIGNATURES = {
    "mkGetVersion": [_c.POINTER(_c.c_int)],
    "mkGetErrorString": [_R],
    "mkGetLastError": [_P],
    "mkGetUniqueId": [_c.POINTER(UniqueId)],
    "mkCommInitRank": [_c.POINTER(_P), _c.c_int, UniqueId, _c.c_int],
    "mkCommInitRankConfig": [_c.POINTER(_P), _c.c_int, UniqueId, _c.c_int, _c.POINTER(Config)],
    "mkCommInitAll": [_c.POINTER(_P), _c.c_int, _c.POINTER(_c.c_int)],
    "mkCommSplit": [_P, _c.c_int, _c.c_int, _c.POINTER(_P), _c.POINTER(Config)],
    "mkCommShrink": [_P, _c.POINTER(_c.c_int), _c.c_int, _c.POINTER(_P), _c.POINTER(Config), _c.c_int],
    "mkCommFinalize": [_P],
    "mkCommDestroy": [_P],
    "mkCommAbort": [_P],
    "mkCommGetAsyncError": [_P, _c.POINTER(_R)],
    "mkCommCount": [_P, _c.POINTER(_c.c_int)],
    "mkCommCuDevice": [_P, _c.POINTER(_c.c_int)],
    "mkCommUserRank": [_P, _c.POINTER(_c.c_int)],
    "mkCommNodeCount": [_P, _c.POINTER(_c.c_int)],
    "mkCommIsBootstrapOnly": [_P, _c.POINTER(_c.c_int)],
    "mkCommRegister": [_P, _P, _S, _c.POINTER(_P)],
    "mkCommDeregister": [_P, _P],
    "mkCommBootstrapBroadcast": [_P, _P, _S, _c.c_int],
    "mkCommPrewarm": [_P, _c.POINTER(_c.c_int), _c.c_int, _c.POINTER(_c.c_int), _c.c_int, _c.c_int],
    "mkRedOpCreatePreMulSum": [_c.POINTER(_c.c_int), _P, _c.c_int, _c.c_int, _P],
    "mkRedOpDestroy": [_c.c_int, _P],
    "mkAllReduce": [_P, _P, _S, _c.c_int, _c.c_int, _P, _P],
    "mkAllReduceFused": [_P, _P, _S, _c.c_int, _c.c_int, _c.POINTER(Fusion), _P, _P],
    "mkCompositeRun": [_c.c_char_p, _c.POINTER(_P), _c.c_int, _S, _c.c_int, _c.c_int, _P, _P],
    "mkBroadcast": [_P, _P, _S, _c.c_int, _c.c_int, _P, _P],
    "mkReduce": [_P, _P, _S, _c.c_int, _c.c_int, _c.c_int, _P, _P],
    "mkAllGather": [_P, _P, _S, _c.c_int, _P, _P],
    "mkReduceScatter": [_P, _P, _S, _c.c_int, _c.c_int, _P, _P],
    "mkAllToAll": [_P, _P, _S, _c.c_int, _P, _P],
    "mkGroupStart": [],
    "mkGroupEnd": [],
}
_RESTYPES = {"mkGetErrorString": _c.c_char_p, "mkGetLastError": _c.c_char_p}

_lock = threading.Lock()
_lib = None
_error = None


def lib():
    """The opened libmkernel.so.0 (raises OSError with the reason once, then always)."""
    global _lib, _error
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            if _error is not None:
                raise OSError(_error)
            p = libmkernel_path()
            try:
                # RTLD_LOCAL: libmkernel's symbols stay its own; it opens
                # libcuda.so.1 and NVRTC itself when a call needs them.
                handle = ctypes.CDLL(p, mode=os.RTLD_LOCAL | os.RTLD_NOW)
            except OSError as e:
                _error = "mkernel: cannot load %s: %s (set MK_LIBMKERNEL to libmkernel.so.0)" % (p, e)
                raise OSError(_error) from None
            for name, args in _SIGNATURES.items():
                fn = getattr(handle, name, None)
                if fn is None:
                    continue  # an older library: calling it says so (see api.call)
                fn.argtypes = args
                fn.restype = _RESTYPES.get(name, _R)
            _lib = handle
    return _lib
