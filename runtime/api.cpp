// The C API (include/mk.h). Every entry point validates its arguments, turns
// exceptions into an mkResult_t and records the message for mkGetLastError.
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_set>

#include "mk.h"
#include "compiler/verify/reference.hpp"
#include "mk/error.hpp"
#include "runtime/comm.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/env.hpp"
#include "runtime/status.hpp"

namespace mk::rt {

bool debug_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("MK_DEBUG");
    return e && *e && std::strcmp(e, "0") != 0;
  }();
  return on;
}

void debug_log(const std::string& msg) {
  if (debug_enabled()) std::fprintf(stderr, "[mkernel] %s\n", msg.c_str());
}

namespace {

thread_local std::string t_last_error = "no error";
thread_local int t_group_depth = 0;

std::mutex& live_mutex() {
  static std::mutex m;
  return m;
}
std::unordered_set<const Comm*>& live() {
  static std::unordered_set<const Comm*> s;
  return s;
}

void remember(Comm* c) {
  std::lock_guard<std::mutex> lock(live_mutex());
  live().insert(c);
}

Comm* check_comm(mkComm_t comm) {
  auto* c = reinterpret_cast<Comm*>(comm);
  if (!c) fail(mkInvalidArgument, "the communicator is NULL");
  std::lock_guard<std::mutex> lock(live_mutex());
  if (!live().count(c))
    fail(mkInvalidArgument, "invalid communicator: destroyed, aborted, or not created by mkCommInit*");
  return c;
}

// Runs f; `c` (set by f once the communicator is known) receives the message too.
template <typename F>
mkResult_t guard(Comm*& c, F&& f) {
  try {
    f();
    return mkSuccess;
  } catch (const RtError& e) {
    t_last_error = e.what();
    if (c) {
      std::lock_guard<std::mutex> lock(live_mutex());
      if (live().count(c)) c->last_error = e.what();
    }
    debug_log(std::string("error: ") + e.what());
    return e.code();
  } catch (const mk::Error& e) {
    t_last_error = e.what();
    return mkInvalidArgument;
  } catch (const std::bad_alloc&) {
    t_last_error = "out of host memory";
    return mkSystemError;
  } catch (const std::exception& e) {
    t_last_error = std::string("internal error: ") + e.what();
    return mkInternalError;
  }
}

struct Call {
  Collective coll;
  const void* send;
  void* recv;
  size_t count;
  int dtype;
  int op;
  int root;
};

const char* coll_api_name(Collective c) {
  switch (c) {
    case Collective::allreduce: return "mkAllReduce";
    case Collective::allgather: return "mkAllGather";
    case Collective::reducescatter: return "mkReduceScatter";
    case Collective::broadcast: return "mkBroadcast";
    case Collective::reduce: return "mkReduce";
    case Collective::alltoall: return "mkAllToAll";
  }
  return "collective";
}

bool overlaps(uintptr_t a, size_t an, uintptr_t b, size_t bn) { return an && bn && a < b + bn && b < a + an; }

// The registered buffer that address `p` lies in: its window, and p's offset
// in it; -1 when p lies in none. A range that starts in one and runs past its
// end is a count mismatch.
int check_registered(const Comm& c, const void* p, size_t bytes, const char* what, const char* api, int64_t* offset) {
  const uintptr_t x = reinterpret_cast<uintptr_t>(p);
  auto it = c.registered.upper_bound(x);
  if (it == c.registered.begin()) return -1;
  --it;
  const uintptr_t end = it->first + it->second.bytes;
  if (x >= end) return -1;
  if (x + bytes > end)
    fail(mkInvalidArgument, fmt::format("{}: {} needs {} bytes at {:p}, but the registered buffer it lies in ends "
                                        "{} bytes after it (count mismatch)",
                                        api, what, bytes, p, end - x));
  *offset = int64_t(x - it->first);
  return it->second.window;
}

// MK_ZERO_COPY=0: registered buffers still go through scratch (for comparisons).
bool zero_copy_enabled() {
  static const bool on = env::zero_copy();
  return on;
}

// Zero-copy pays an entry and an exit barrier (two flag round trips) to save
// the staging copies: on 2 x H200 it is slower up to 1 MiB, even at 4 MiB and
// faster from 16 MiB on (bench/results/2026-11-30-h200x2-bf16-registered.md). The size is
// the larger buffer, as in the benchmark; every rank computes the same choice.
int64_t zero_copy_min_bytes() {
  static const int64_t v = env::zero_copy_min_bytes();
  return v;
}

// A validated call, ready to launch (mkGroupStart/End queue these).
struct Pending {
  Call k;
  Comm* c;
  CUstream stream;
  DType dt;
  RedOp op;
  int64_t bytes;         // per rank: count * element size
  size_t in_bytes;       // the send buffer (nranks x bytes for reduce-scatter, all-to-all)
  size_t out_bytes;      // the receive buffer (nranks x bytes for all-gather, all-to-all)
  bool need_send;        // broadcast: only the root's send buffer is read
  bool need_recv;        // reduce: only the root's receive buffer is written
  bool zc = false;       // every buffer of the call is registered: zero-copy plan
  Comm::ZcCall zcc;
};

thread_local std::vector<Pending> t_pending;

bool special_stream(CUstream s) {
  // NULL, cudaStreamLegacy (0x1), cudaStreamPerThread (0x2): resolved through
  // the current context.
  return reinterpret_cast<uintptr_t>(s) <= 2;
}

// Everything that can be checked without the GPU: done at call time, also
// inside a group, so that errors point at the offending call.
Pending validate(const Call& k, Comm* c, cudaStream_t stream) {
  const char* api = coll_api_name(k.coll);
  if (c->aborted.load()) fail(mkInvalidUsage, std::string(api) + ": the communicator was aborted");
  if (c->async_error.load() != mkSuccess)
    fail(mkResult_t(c->async_error.load()), std::string(api) + ": " + c->async_message);
  if (k.dtype < 0 || k.dtype >= mkNumTypes)
    fail(mkInvalidArgument, fmt::format("{}: datatype {} is not an mkDataType_t", api, k.dtype));
  const bool reduces = collective_reduces(k.coll);
  if (reduces && (k.op < 0 || k.op >= mkNumOps))
    fail(mkInvalidArgument, fmt::format("{}: reduction op {} is not an mkRedOp_t", api, k.op));
  const bool rooted = k.coll == Collective::broadcast || k.coll == Collective::reduce;
  if (rooted && (k.root < 0 || k.root >= c->nranks))
    fail(mkInvalidArgument, fmt::format("{}: root {} is not a rank of {}", api, k.root, c->nranks));
  const DType dt = DType(k.dtype);
  const size_t es = dtype_size(dt);
  if (k.count > size_t(INT64_MAX) / es / size_t(c->nranks))
    fail(mkInvalidArgument, fmt::format("{}: count {} is too large", api, k.count));
  const size_t bytes = k.count * es;
  const int64_t count = int64_t(k.count);
  Pending p{k,
            c,
            reinterpret_cast<CUstream>(stream),
            dt,
            reduces ? RedOp(k.op) : RedOp::sum,
            int64_t(bytes),
            size_t(verify::input_elems(k.coll, c->nranks, count)) * es,
            size_t(verify::output_elems(k.coll, c->nranks, count)) * es,
            !(k.coll == Collective::broadcast && c->rank != k.root),
            !(k.coll == Collective::reduce && c->rank != k.root),
            false,
            {}};
  if (k.count == 0) return p;
  const size_t in_bytes = p.in_bytes, out_bytes = p.out_bytes;
  const bool need_send = p.need_send, need_recv = p.need_recv;
  auto check_ptr = [&](const void* ptr, const char* what) {
    if (!ptr) fail(mkInvalidArgument, fmt::format("{}: {} is NULL (count {})", api, what, k.count));
    if (reinterpret_cast<uintptr_t>(ptr) % es != 0)
      fail(mkInvalidArgument, fmt::format("{}: {} {:p} is not aligned to its {}-byte element type {}", api, what, ptr,
                                          es, name(dt)));
  };
  if (need_send) check_ptr(k.send, "sendbuff");
  if (need_recv) check_ptr(k.recv, "recvbuff");
  if (need_send && need_recv) {
    const uintptr_t sp = reinterpret_cast<uintptr_t>(k.send), rp = reinterpret_cast<uintptr_t>(k.recv);
    bool inplace = false;
    switch (k.coll) {
      case Collective::allgather: inplace = sp == rp + uintptr_t(c->rank) * bytes; break;
      case Collective::reducescatter: inplace = rp == sp + uintptr_t(c->rank) * bytes; break;
      case Collective::alltoall:
        if (sp == rp) fail(mkInvalidArgument, "mkAllToAll: in-place (sendbuff == recvbuff) is not supported");
        break;
      default: inplace = sp == rp; break;
    }
    if (!inplace && overlaps(sp, in_bytes, rp, out_bytes))
      fail(mkInvalidArgument, fmt::format("{}: sendbuff and recvbuff overlap without being in-place (in-place "
                                          "means {})",
                                          api,
                                          k.coll == Collective::allgather       ? "sendbuff == recvbuff + rank*count"
                                          : k.coll == Collective::reducescatter ? "recvbuff == sendbuff + rank*count"
                                                                                : "sendbuff == recvbuff"));
  }
  return p;
}

// The checks that read communicator state; caller holds c->mu.
void check_locked(Pending& p) {
  Comm* c = p.c;
  const Call& k = p.k;
  const char* api = coll_api_name(k.coll);
  if (!c->registered.empty()) {
    Comm::ZcCall z;
    bool all = true;  // every buffer of the call is registered
    if (p.need_send)
      all &= (z.in_window = check_registered(*c, k.send, p.in_bytes, "sendbuff", api, &z.in_offset)) >= 0;
    if (p.need_recv)
      all &= (z.out_window = check_registered(*c, k.recv, p.out_bytes, "recvbuff", api, &z.out_offset)) >= 0;
    if (all && zero_copy_enabled() && int64_t(std::max(p.in_bytes, p.out_bytes)) >= zero_copy_min_bytes()) {
      z.in_bytes = int64_t(p.in_bytes);
      z.out_bytes = int64_t(p.out_bytes);
      const bool rooted = k.coll == Collective::broadcast || k.coll == Collective::reduce;
      z.call_sig = uint64_t(k.coll) | uint64_t(p.dt) << 8 | uint64_t(p.op) << 16 |
                   uint64_t(uint32_t(rooted ? k.root : 0)) << 32;
      p.zc = true;
      p.zcc = z;
    }
  }
  // The stream must belong to the communicator's GPU (checked once per stream).
  if (p.stream != c->checked_stream || special_stream(p.stream)) {
    std::unique_ptr<CtxGuard> g;
    if (special_stream(p.stream)) g = std::make_unique<CtxGuard>(c->ctx);
    CUcontext sctx = nullptr;
    CUresult r = cu().cuStreamGetCtx(p.stream, &sctx);
    if (r != CUDA_SUCCESS) fail(mkInvalidArgument, std::string(api) + ": invalid stream: " + cu_error_string(r));
    if (sctx != c->ctx) {
      CUdevice sd = -1;
      CUcontext keep = nullptr;
      cu().cuCtxGetCurrent(&keep);
      cu().cuCtxSetCurrent(sctx);
      cu().cuCtxGetDevice(&sd);
      cu().cuCtxSetCurrent(keep);
      fail(mkInvalidArgument, fmt::format("{}: the stream belongs to GPU {}, the communicator (rank {}) to GPU {}",
                                          api, int(sd), c->rank, c->device));
    }
    if (!special_stream(p.stream)) c->checked_stream = p.stream;
  }
}

// Finds (or, first time, creates) the plan instance. Creation loads code and
// allocates: it must happen before any kernel of the same group is launched.
// Caller holds c->mu.
PlanInstance& resolve_locked(Pending& p) {
  Comm& c = *p.c;
  if (PlanInstance* found = c.find(p.k.coll, p.dt, p.op, p.bytes, p.zc)) return *found;
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  cu().cuStreamIsCapturing(p.stream, &capture);
  if (capture != CU_STREAM_CAPTURE_STATUS_NONE)
    fail(mkInvalidUsage, fmt::format("{}: the first call of this collective/type/size ({} {} bytes) happens during "
                                     "CUDA graph capture; it compiles and allocates, which capture forbids. Issue "
                                     "it once before capturing (as a warm-up)",
                                     coll_api_name(p.k.coll), name(p.dt), p.bytes));
  CtxGuard g(c.ctx);
  return c.instance(p.k.coll, p.dt, p.op, p.bytes, p.zc, p.stream);
}

// Caller holds c->mu.
void launch_locked(Pending& p, PlanInstance& inst) {
  Comm& c = *p.c;
  const char* api = coll_api_name(p.k.coll);
  std::unique_ptr<CtxGuard> g;
  if (special_stream(p.stream)) g = std::make_unique<CtxGuard>(c.ctx);
  // One communicator's kernels must not overlap: order a new stream after the
  // previous one (not needed within one stream, not possible in capture).
  if (c.used && p.stream != c.last_stream) {
    CUstreamCaptureStatus a = CU_STREAM_CAPTURE_STATUS_NONE, b = CU_STREAM_CAPTURE_STATUS_NONE;
    cu().cuStreamIsCapturing(p.stream, &a);
    cu().cuStreamIsCapturing(c.last_stream, &b);
    // Best effort: the previous stream may have been destroyed since (its work
    // then completes on its own, and the record fails harmlessly).
    if (a == CU_STREAM_CAPTURE_STATUS_NONE && b == CU_STREAM_CAPTURE_STATUS_NONE &&
        cu().cuEventRecord(c.order_event, c.last_stream) == CUDA_SUCCESS)
      MK_CU(cu().cuStreamWaitEvent(p.stream, c.order_event, 0), "ordering streams");
  }
  const plan::Kernel& kern = *inst.kernel;
  dev::Args a = c.args(inst, p.k.send, p.k.recv, int64_t(p.k.count), p.k.root, int32_t(dtype_size(p.dt)), p.zcc);
  void* params[] = {&a};
  CUresult r = cu().cuLaunchKernel(inst.fn, unsigned(kern.grid), 1, 1, unsigned(kern.threads), 1, 1, 0, p.stream,
                                   params, nullptr);
  if (r != CUDA_SUCCESS) fail(mkUnhandledCudaError, std::string(api) + ": kernel launch failed: " + cu_error_string(r));
  c.last_stream = p.stream;
  c.used = true;
  inst.res->last = &inst;
}

mkResult_t collective(const Call& k, mkComm_t comm, cudaStream_t stream) {
  Comm* c = nullptr;
  return guard(c, [&] {
    c = check_comm(comm);
    Pending p = validate(k, c, stream);
    if (k.count == 0) return;
    std::lock_guard<std::mutex> lock(c->mu);  // the one lock of the hot path
    check_locked(p);
    if (t_group_depth > 0) {
      t_pending.push_back(p);
      return;
    }
    PlanInstance& inst = resolve_locked(p);
    launch_locked(p, inst);
  });
}

}  // namespace
}  // namespace mk::rt

using namespace mk;
using namespace mk::rt;

extern "C" {

mkResult_t mkGetVersion(int* version) {
  if (!version) {
    t_last_error = "mkGetVersion: version is NULL";
    return mkInvalidArgument;
  }
  *version = MK_VERSION_CODE;
  return mkSuccess;
}

const char* mkGetErrorString(mkResult_t result) {
  switch (result) {
    case mkSuccess: return "no error";
    case mkUnhandledCudaError: return "unhandled cuda error (run with MK_DEBUG=1 for details)";
    case mkSystemError: return "unhandled system error (network, memory, driver)";
    case mkInternalError: return "internal error - please report this issue";
    case mkInvalidArgument: return "invalid argument (run with MK_DEBUG=1 for details)";
    case mkInvalidUsage: return "invalid usage (run with MK_DEBUG=1 for details)";
    case mkRemoteError: return "remote process exited or there was a network error";
    case mkInProgress: return "operation in progress";
    default: return "unknown result code";
  }
}

const char* mkGetLastError(mkComm_t comm) {
  if (comm) {
    std::lock_guard<std::mutex> lock(live_mutex());
    auto* c = reinterpret_cast<Comm*>(comm);
    if (live().count(c) && !c->last_error.empty()) return c->last_error.c_str();
  }
  return t_last_error.c_str();
}

mkResult_t mkGetUniqueId(mkUniqueId* uniqueId) {
  Comm* none = nullptr;
  return guard(none, [&] {
    if (!uniqueId) fail(mkInvalidArgument, "mkGetUniqueId: uniqueId is NULL");
    bootstrap_create_id(uniqueId);
  });
}

mkResult_t mkCommInitRank(mkComm_t* comm, int nranks, mkUniqueId commId, int rank) {
  Comm* none = nullptr;
  return guard(none, [&] {
    if (!comm) fail(mkInvalidArgument, "mkCommInitRank: comm is NULL");
    *comm = nullptr;
    Comm* c = comm_init_rank(nranks, commId, rank);
    remember(c);
    *comm = reinterpret_cast<mkComm_t>(c);
  });
}

mkResult_t mkCommInitAll(mkComm_t* comms, int ndev, const int* devlist) {
  Comm* none = nullptr;
  return guard(none, [&] {
    if (!comms) fail(mkInvalidArgument, "mkCommInitAll: comms is NULL");
    auto all = comm_init_all(ndev, devlist);
    for (int i = 0; i < ndev; ++i) {
      remember(all[size_t(i)]);
      comms[i] = reinterpret_cast<mkComm_t>(all[size_t(i)]);
    }
  });
}

static void forget(Comm* c) {
  std::lock_guard<std::mutex> lock(live_mutex());
  live().erase(c);
}

mkResult_t mkCommDestroy(mkComm_t comm) {
  Comm* c = nullptr;
  Comm* none = nullptr;  // the comm is gone when an error could be reported
  return guard(none, [&] {
    c = check_comm(comm);
    forget(c);
    {
      CtxGuard g(c->ctx);
      // Our kernels end by themselves (or by the watchdog); wait for them.
      cu().cuCtxSynchronize();
    }
    delete c;
  });
}

mkResult_t mkCommAbort(mkComm_t comm) {
  Comm* c = nullptr;
  Comm* none = nullptr;
  return guard(none, [&] {
    c = check_comm(comm);
    forget(c);
    c->aborted.store(true);
    if (c->host_abort) *c->host_abort = 1;  // running kernels give up within microseconds
    {
      CtxGuard g(c->ctx);
      cu().cuCtxSynchronize();
    }
    delete c;
  });
}

mkResult_t mkCommGetAsyncError(mkComm_t comm, mkResult_t* asyncError) {
  Comm* c = nullptr;
  return guard(c, [&] {
    c = check_comm(comm);
    if (!asyncError) fail(mkInvalidArgument, "mkCommGetAsyncError: asyncError is NULL");
    *asyncError = c->poll_async_error();
    if (*asyncError != mkSuccess) {
      c->last_error = c->async_message;
      t_last_error = c->async_message;
    }
  });
}

mkResult_t mkCommCount(const mkComm_t comm, int* count) {
  Comm* none = nullptr;
  return guard(none, [&] {
    Comm* c = check_comm(comm);
    if (!count) fail(mkInvalidArgument, "mkCommCount: count is NULL");
    *count = c->nranks;
  });
}

mkResult_t mkCommCuDevice(const mkComm_t comm, int* device) {
  Comm* none = nullptr;
  return guard(none, [&] {
    Comm* c = check_comm(comm);
    if (!device) fail(mkInvalidArgument, "mkCommCuDevice: device is NULL");
    *device = c->device;
  });
}

mkResult_t mkCommUserRank(const mkComm_t comm, int* rank) {
  Comm* none = nullptr;
  return guard(none, [&] {
    Comm* c = check_comm(comm);
    if (!rank) fail(mkInvalidArgument, "mkCommUserRank: rank is NULL");
    *rank = c->rank;
  });
}

mkResult_t mkCommRegister(const mkComm_t comm, void* buff, size_t size, void** handle) {
  Comm* c = nullptr;
  return guard(c, [&] {
    c = check_comm(comm);
    comm_register(*c, buff, size, handle);
  });
}

mkResult_t mkCommDeregister(const mkComm_t comm, void* handle) {
  Comm* c = nullptr;
  return guard(c, [&] {
    c = check_comm(comm);
    comm_deregister(*c, handle);
  });
}

mkResult_t mkAllReduce(const void* sendbuff, void* recvbuff, size_t count, mkDataType_t datatype, mkRedOp_t op,
                       mkComm_t comm, cudaStream_t stream) {
  return collective({Collective::allreduce, sendbuff, recvbuff, count, int(datatype), int(op), 0}, comm, stream);
}

mkResult_t mkBroadcast(const void* sendbuff, void* recvbuff, size_t count, mkDataType_t datatype, int root,
                       mkComm_t comm, cudaStream_t stream) {
  return collective({Collective::broadcast, sendbuff, recvbuff, count, int(datatype), 0, root}, comm, stream);
}

mkResult_t mkReduce(const void* sendbuff, void* recvbuff, size_t count, mkDataType_t datatype, mkRedOp_t op, int root,
                    mkComm_t comm, cudaStream_t stream) {
  return collective({Collective::reduce, sendbuff, recvbuff, count, int(datatype), int(op), root}, comm, stream);
}

mkResult_t mkAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, mkDataType_t datatype, mkComm_t comm,
                       cudaStream_t stream) {
  return collective({Collective::allgather, sendbuff, recvbuff, sendcount, int(datatype), 0, 0}, comm, stream);
}

mkResult_t mkReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, mkDataType_t datatype,
                           mkRedOp_t op, mkComm_t comm, cudaStream_t stream) {
  return collective({Collective::reducescatter, sendbuff, recvbuff, recvcount, int(datatype), int(op), 0}, comm,
                    stream);
}

mkResult_t mkAllToAll(const void* sendbuff, void* recvbuff, size_t count, mkDataType_t datatype, mkComm_t comm,
                      cudaStream_t stream) {
  return collective({Collective::alltoall, sendbuff, recvbuff, count, int(datatype), 0, 0}, comm, stream);
}

mkResult_t mkGroupStart(void) {
  ++t_group_depth;
  return mkSuccess;
}

mkResult_t mkGroupEnd(void) {
  if (t_group_depth == 0) {
    t_last_error = "mkGroupEnd without mkGroupStart";
    return mkInvalidUsage;
  }
  if (--t_group_depth > 0) return mkSuccess;
  std::vector<Pending> calls;
  calls.swap(t_pending);
  Comm* c = nullptr;
  return guard(c, [&] {
    // First every plan instance (code loads and allocations may wait for
    // running kernels), then every launch: kernels of one group wait for
    // each other, so none may be launched before all can be.
    std::vector<PlanInstance*> inst;
    for (auto& p : calls) {
      c = check_comm(reinterpret_cast<mkComm_t>(p.c));
      std::lock_guard<std::mutex> lock(c->mu);
      inst.push_back(&resolve_locked(p));
    }
    for (size_t i = 0; i < calls.size(); ++i) {
      c = check_comm(reinterpret_cast<mkComm_t>(calls[i].c));
      std::lock_guard<std::mutex> lock(c->mu);
      launch_locked(calls[i], *inst[i]);
    }
  });
}

}  // extern "C"
