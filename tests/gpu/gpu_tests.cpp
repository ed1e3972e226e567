// GPU test suite for the mKernel runtime. Runs on a machine with NVIDIA GPUs;
// on a machine without one it prints "SKIPPED: ..." and exits 0.
//
//   mk_gpu_tests [--quick] [--only NAME] [--skip NAME] [--list]
//
// Every scenario runs in a forked child process (the parent never touches
// CUDA), so a crash or hang in one scenario is reported and the rest still
// run; each child has a time limit. Data differs per rank and per element
// (compiler/verify/reference.hpp) and results are compared with a float64 /
// exact-integer reference; outputs are poisoned before each call and guard
// bytes around every buffer are checked after.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <set>

#include "compiler/compile.hpp"
#include "compiler/verify/fused_ref.hpp"
#include "compiler/verify/reference.hpp"
#include "compiler/verify/typed.hpp"
#include "mk.h"
#include "mk/dsl.hpp"
#include "mk/fusion.hpp"
#include "mk/types.hpp"
#include "runtime/comm/comm.hpp"
#include "runtime/api/handles.hpp"
#include "runtime/driver/cuda_driver.hpp"

using namespace mk;

namespace {

// ---- plumbing ---------------------------------------------------------------

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

#define CK_CUDA(x)                                                                                  \
  do {                                                                                              \
    cudaError_t e_ = (x);                                                                           \
    if (e_ != cudaSuccess)                                                                          \
      throw Failure(std::string(#x) + ": " + cudaGetErrorString(e_) + " at line " + std::to_string(__LINE__)); \
  } while (0)

#define CK_MK(x, comm)                                                                                \
  do {                                                                                                \
    mkResult_t r_ = (x);                                                                              \
    if (r_ != mkSuccess)                                                                              \
      throw Failure(std::string(#x) + " -> " + mkGetErrorString(r_) + ": " + mkGetLastError(comm) +  \
                    " at line " + std::to_string(__LINE__));                                          \
  } while (0)

#define EXPECT(cond, msg)                                                            \
  do {                                                                               \
    if (!(cond)) throw Failure(std::string("expected ") + #cond + ": " + (msg));     \
  } while (0)

bool g_quick = false;
int64_t g_checked = 0;  // collective results checked in this process

mkDataType_t to_mk(DType t) { return mkDataType_t(int(t)); }
mkRedOp_t to_mk(RedOp o) { return mkRedOp_t(int(o)); }

// A device buffer with guard bytes on both sides.
struct GuardedBuffer {
  static constexpr size_t kGuard = 256;
  static constexpr unsigned char kPattern = 0x5a;
  char* base = nullptr;
  size_t bytes = 0;
  void alloc(size_t n) {
    bytes = n;
    CK_CUDA(cudaMalloc(&base, n + 2 * kGuard));
    CK_CUDA(cudaMemset(base, kPattern, n + 2 * kGuard));
  }
  void* ptr() const { return base + kGuard; }
  void free() {
    if (base) cudaFree(base);
    base = nullptr;
  }
  void check_guards(const char* what) const {
    std::vector<unsigned char> g(kGuard);
    for (int side = 0; side < 2; ++side) {
      CK_CUDA(cudaMemcpy(g.data(), side ? base + kGuard + bytes : base, kGuard, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < kGuard; ++i)
        if (g[i] != kPattern)
          throw Failure(std::string(what) + ": guard byte " + std::to_string(i) + (side ? " after" : " before") +
                        " the buffer was overwritten");
    }
  }
};

// A rank as the tests see it: in one-process mode all ranks live here.
struct Rank {
  int rank = 0;
  int device = 0;
  mkComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
};

struct World {
  int nranks = 1;
  bool multiprocess = false;
  std::vector<Rank> local;  // ranks driven by this process
};

int64_t in_elems(Collective c, int n, int64_t count) { return verify::input_elems(c, n, count); }
int64_t out_elems(Collective c, int n, int64_t count) { return verify::output_elems(c, n, count); }

// One collective call on every local rank, checked against the reference.
struct CallSpec {
  Collective coll = Collective::allreduce;
  DType dtype = DType::fp32;
  RedOp op = RedOp::sum;
  int64_t count = 0;
  bool inplace = false;
  int root = 0;
  uint64_t seed = 1;
};

struct RankBuffers {
  GuardedBuffer in, out;  // in-place: only `out`
  void* send = nullptr;
  void* recv = nullptr;
};

// Large buffers are generated and checked on the host's cores (half of them:
// two ranks' processes share the host): 1 GiB per call would otherwise cost
// seconds.
unsigned host_threads() { return std::max(1u, std::thread::hardware_concurrency() / 2); }

void fill_parallel(const verify::DataSpec& d, int rank, int64_t n, char* dst) {
  verify::fill_input_parallel(d, rank, n, dst, host_threads());
}

// Pinned host staging, one buffer per role (0 inputs, 1 and 2 checks), grown
// on demand and kept: GiB transfers run at full speed and pages are touched
// once per process, not once per call.
char* staging(int role, size_t n) {
  static char* buf[3] = {nullptr, nullptr, nullptr};
  static size_t cap[3] = {0, 0, 0};
  if (cap[role] < n + 16) {
    if (buf[role]) CK_CUDA(cudaFreeHost(buf[role]));
    buf[role] = nullptr;
    CK_CUDA(cudaMallocHost(&buf[role], n + 16));
    cap[role] = n + 16;
  }
  return buf[role];
}

void prepare(const World& w, const Rank& r, const CallSpec& s, RankBuffers& b, int launch) {
  const size_t es = dtype_size(s.dtype);
  const int n = w.nranks;
  const bool has_send = !(s.coll == Collective::broadcast && r.rank != s.root);
  const bool has_recv = !(s.coll == Collective::reduce && r.rank != s.root);
  const int64_t ie = in_elems(s.coll, n, s.count), oe = out_elems(s.coll, n, s.count);
  verify::DataSpec d{s.dtype, s.op, s.seed, launch, w.nranks};
  char* host = staging(0, size_t(std::max(ie, oe)) * es);
  if (s.inplace && has_send && has_recv) {
    const size_t total = size_t(std::max(ie, oe)) * es;
    if (!b.out.base) b.out.alloc(total);
    CK_CUDA(cudaMemset(b.out.ptr(), 0xA5, total));  // poison
    char* base = static_cast<char*>(b.out.ptr());
    if (s.coll == Collective::allgather) {
      b.recv = base;
      b.send = base + size_t(r.rank) * size_t(s.count) * es;
    } else if (s.coll == Collective::reducescatter) {
      b.send = base;
      b.recv = base + size_t(r.rank) * size_t(s.count) * es;
    } else {
      b.send = b.recv = base;
    }
    fill_parallel(d, r.rank, ie, host);
    CK_CUDA(cudaMemcpy(b.send, host, size_t(ie) * es, cudaMemcpyHostToDevice));
  } else {
    b.send = b.recv = nullptr;
    if (has_send) {
      if (!b.in.base) b.in.alloc(std::max<size_t>(size_t(ie) * es, 1));
      fill_parallel(d, r.rank, ie, host);
      CK_CUDA(cudaMemcpy(b.in.ptr(), host, size_t(ie) * es, cudaMemcpyHostToDevice));
      b.send = b.in.ptr();
    }
    if (has_recv) {
      if (!b.out.base) b.out.alloc(std::max<size_t>(size_t(oe) * es, 1));
      CK_CUDA(cudaMemset(b.out.ptr(), 0xA5, size_t(oe) * es));  // poison
      b.recv = b.out.ptr();
    }
  }
  // The memsets run on the legacy stream and return early, so does the upload
  // (its DMA may still run): the collective goes to a non-blocking stream,
  // which does not wait for either.
  CK_CUDA(cudaDeviceSynchronize());
}

// PreMulSum: this rank's op for the call, with the reference's scalar
// (verify::prescale_of); even seeds pass it by value, odd ones in device
// memory (one buffer per rank and dtype, kept for the process).
mkRedOp_t premul_op(const Rank& r, const CallSpec& s) {
  const double x = verify::prescale_of(s.dtype, r.rank);
  alignas(8) unsigned char bytes[8] = {};
  verify::dispatch_dtype(s.dtype, [&]<typename T>() {
    const T v = verify::Typed<T>::from_double(x);
    std::memcpy(bytes, &v, sizeof(T));
  });
  mkRedOp_t op = mkSum;
  void* scalar = bytes;
  mkScalarResidence_t where = mkScalarHostImmediate;
  if (s.seed & 1) {
    static std::map<std::pair<mkComm_t, int>, void*> on_device;
    void*& p = on_device[{r.comm, int(s.dtype)}];
    if (!p) {
      CK_CUDA(cudaMalloc(&p, 8));
      CK_CUDA(cudaMemcpy(p, bytes, 8, cudaMemcpyHostToDevice));
    }
    scalar = p;
    where = mkScalarDevice;
  }
  CK_MK(mkRedOpCreatePreMulSum(&op, scalar, to_mk(s.dtype), where, r.comm), r.comm);
  return op;
}

mkResult_t issue(const Rank& r, const CallSpec& s, const RankBuffers& b) {
  const size_t count = size_t(s.count);
  if (s.op == RedOp::premulsum) {
    // The op is destroyed right after the call: a call keeps its scalar.
    const mkRedOp_t op = premul_op(r, s);
    mkResult_t res = mkInternalError;
    switch (s.coll) {
      case Collective::allreduce:
        res = mkAllReduce(b.send, b.recv, count, to_mk(s.dtype), op, r.comm, r.stream);
        break;
      case Collective::reducescatter:
        res = mkReduceScatter(b.send, b.recv, count, to_mk(s.dtype), op, r.comm, r.stream);
        break;
      case Collective::reduce: res = mkReduce(b.send, b.recv, count, to_mk(s.dtype), op, s.root, r.comm, r.stream); break;
      default: break;
    }
    CK_MK(mkRedOpDestroy(op, r.comm), r.comm);
    return res;
  }
  switch (s.coll) {
    case Collective::allreduce:
      return mkAllReduce(b.send, b.recv, count, to_mk(s.dtype), to_mk(s.op), r.comm, r.stream);
    case Collective::allgather: return mkAllGather(b.send, b.recv, count, to_mk(s.dtype), r.comm, r.stream);
    case Collective::reducescatter:
      return mkReduceScatter(b.send, b.recv, count, to_mk(s.dtype), to_mk(s.op), r.comm, r.stream);
    case Collective::broadcast: return mkBroadcast(b.send, b.recv, count, to_mk(s.dtype), s.root, r.comm, r.stream);
    case Collective::reduce:
      return mkReduce(b.send, b.recv, count, to_mk(s.dtype), to_mk(s.op), s.root, r.comm, r.stream);
    case Collective::alltoall: return mkAllToAll(b.send, b.recv, count, to_mk(s.dtype), r.comm, r.stream);
  }
  return mkInternalError;
}

std::string describe(const CallSpec& s, int n) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s %s %s count=%lld %s root=%d (%d ranks)", std::string(name(s.coll)).c_str(),
                std::string(name(s.dtype)).c_str(), std::string(name(s.op)).c_str(), (long long)s.count,
                s.inplace ? "in-place" : "out-of-place", s.root, n);
  return buf;
}

void check(const World& w, const Rank& r, const CallSpec& s, const RankBuffers& b, int launch) {
  const size_t es = dtype_size(s.dtype);
  const int64_t ie = in_elems(s.coll, w.nranks, s.count), oe = out_elems(s.coll, w.nranks, s.count);
  if (b.in.base) b.in.check_guards(("send buffer of rank " + std::to_string(r.rank)).c_str());
  if (b.out.base) b.out.check_guards(("receive buffer of rank " + std::to_string(r.rank)).c_str());
  verify::DataSpec d{s.dtype, s.op, s.seed, launch, w.nranks};
  if (b.recv) {
    char* host = staging(1, size_t(oe) * es);
    CK_CUDA(cudaMemcpy(host, b.recv, size_t(oe) * es, cudaMemcpyDeviceToHost));
    auto res = verify::check_output_parallel(s.coll, d, w.nranks, s.root, s.count, r.rank, host, oe, host_threads());
    if (res.mismatches)
      throw Failure(describe(s, w.nranks) + ": " + std::to_string(res.mismatches) + " wrong element(s); first: " +
                    res.first_bad);
    ++g_checked;
  }
  // Out-of-place: the send buffer must be untouched.
  if (b.in.base && b.send == b.in.ptr()) {
    char* got = staging(1, size_t(ie) * es);
    char* want = staging(2, size_t(ie) * es);
    CK_CUDA(cudaMemcpy(got, b.send, size_t(ie) * es, cudaMemcpyDeviceToHost));
    fill_parallel(d, r.rank, ie, want);
    if (std::memcmp(got, want, size_t(ie) * es) != 0)
      throw Failure(describe(s, w.nranks) + ": the send buffer of rank " + std::to_string(r.rank) + " was modified");
  }
}

void sync_all(const World& w) {
  for (const Rank& r : w.local) {
    CK_CUDA(cudaSetDevice(r.device));
    CK_CUDA(cudaStreamSynchronize(r.stream));
  }
}

// A watchdog report beats a list of wrong numbers.
void check_async(const World& w) {
  for (const Rank& r : w.local) {
    mkResult_t e = mkSuccess;
    CK_MK(mkCommGetAsyncError(r.comm, &e), r.comm);
    if (e != mkSuccess) throw Failure(std::string("asynchronous error: ") + mkGetLastError(r.comm));
  }
}

// Runs one call on every local rank and checks it. In multi-process mode the
// other ranks run the same function in their own processes.
void run_checked(World& w, const CallSpec& s, int launch = 0) {
  std::vector<RankBuffers> bufs(w.local.size());
  for (size_t i = 0; i < w.local.size(); ++i) {
    CK_CUDA(cudaSetDevice(w.local[i].device));
    prepare(w, w.local[i], s, bufs[i], launch);
  }
  const auto t0 = std::chrono::steady_clock::now();
  CK_MK(mkGroupStart(), nullptr);
  for (size_t i = 0; i < w.local.size(); ++i) {
    CK_CUDA(cudaSetDevice(w.local[i].device));
    mkResult_t r = issue(w.local[i], s, bufs[i]);
    if (r != mkSuccess)
      throw Failure(describe(s, w.nranks) + ": " + mkGetErrorString(r) + ": " + mkGetLastError(w.local[i].comm));
  }
  CK_MK(mkGroupEnd(), nullptr);
  sync_all(w);
  // A call that takes far longer than its size explains (a first use that
  // compiles, or kernels that cannot all run at once) is worth a line.
  static const double slow_ms = std::getenv("MK_TEST_SLOW_MS") ? std::atof(std::getenv("MK_TEST_SLOW_MS")) : 0;
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (slow_ms > 0 && ms > slow_ms) std::printf("    slow: %s took %.1f ms\n", describe(s, w.nranks).c_str(), ms);
  check_async(w);
  for (size_t i = 0; i < w.local.size(); ++i) {
    CK_CUDA(cudaSetDevice(w.local[i].device));
    check(w, w.local[i], s, bufs[i], launch);
  }
  // Every rank's all-reduce result is the same bits (the tolerance above
  // would let ranks that round differently through): the ranks this process
  // holds, compared with the first.
  if (s.coll == Collective::allreduce && w.local.size() > 1 && s.count > 0) {
    const size_t bytes = size_t(s.count) * dtype_size(s.dtype);
    std::vector<char> first(bytes), other(bytes);
    CK_CUDA(cudaSetDevice(w.local[0].device));
    CK_CUDA(cudaMemcpy(first.data(), bufs[0].recv, bytes, cudaMemcpyDeviceToHost));
    for (size_t i = 1; i < w.local.size(); ++i) {
      CK_CUDA(cudaSetDevice(w.local[i].device));
      CK_CUDA(cudaMemcpy(other.data(), bufs[i].recv, bytes, cudaMemcpyDeviceToHost));
      if (std::memcmp(first.data(), other.data(), bytes) != 0)
        throw Failure(describe(s, w.nranks) + ": rank " + std::to_string(w.local[i].rank) +
                      "'s result differs bit-wise from rank " + std::to_string(w.local[0].rank) + "'s");
    }
  }
  for (size_t i = 0; i < w.local.size(); ++i) {
    CK_CUDA(cudaSetDevice(w.local[i].device));
    bufs[i].in.free();
    bufs[i].out.free();
  }
}

// Runs `specs` as one group on every local rank (each call its own guarded
// buffers) and checks every call: with MK_GROUP_FUSE=1 the group's calls of
// each communicator run as one group kernel (runtime/launch/enqueue.cpp).
void run_group_checked(World& w, const std::vector<CallSpec>& specs, int launch = 0) {
  std::vector<std::vector<RankBuffers>> bufs(specs.size(), std::vector<RankBuffers>(w.local.size()));
  for (size_t c = 0; c < specs.size(); ++c)
    for (size_t i = 0; i < w.local.size(); ++i) {
      CK_CUDA(cudaSetDevice(w.local[i].device));
      prepare(w, w.local[i], specs[c], bufs[c][i], launch);
    }
  CK_MK(mkGroupStart(), nullptr);
  for (size_t i = 0; i < w.local.size(); ++i)
    for (size_t c = 0; c < specs.size(); ++c) {
      CK_CUDA(cudaSetDevice(w.local[i].device));
      const mkResult_t r = issue(w.local[i], specs[c], bufs[c][i]);
      if (r != mkSuccess)
        throw Failure("group: " + describe(specs[c], w.nranks) + ": " + mkGetErrorString(r) + ": " +
                      mkGetLastError(w.local[i].comm));
    }
  CK_MK(mkGroupEnd(), nullptr);
  sync_all(w);
  check_async(w);
  for (size_t c = 0; c < specs.size(); ++c)
    for (size_t i = 0; i < w.local.size(); ++i) {
      CK_CUDA(cudaSetDevice(w.local[i].device));
      check(w, w.local[i], specs[c], bufs[c][i], launch);
      bufs[c][i].in.free();
      bufs[c][i].out.free();
    }
}

// ---- worlds ------------------------------------------------------------------

World one_process(const std::vector<int>& devices) {
  World w;
  w.nranks = int(devices.size());
  std::vector<mkComm_t> comms(devices.size());
  CK_MK(mkCommInitAll(comms.data(), int(devices.size()), devices.data()), nullptr);
  for (size_t i = 0; i < devices.size(); ++i) {
    Rank r;
    r.rank = int(i);
    r.device = devices[i];
    r.comm = comms[i];
    CK_CUDA(cudaSetDevice(r.device));
    CK_CUDA(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
    w.local.push_back(r);
  }
  return w;
}

void destroy(World& w) {
  for (Rank& r : w.local) {
    cudaSetDevice(r.device);
    if (r.comm) CK_MK(mkCommDestroy(r.comm), nullptr);
    if (r.stream) cudaStreamDestroy(r.stream);
    r.comm = nullptr;
    r.stream = nullptr;  // bad_input destroys its world early; the second destroy must not touch it
  }
}

int gpu_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

// ---- scenarios -----------------------------------------------------------------

std::vector<int64_t> matrix_counts(DType t) {
  // sizes 0, 1, 7 elements, 1 KiB + 1 element, 1 MiB (the big ones run in the size scenarios)
  const int64_t es = int64_t(dtype_size(t));
  return {0, 1, 7, 1024 / es + 1, (1 << 20) / es};
}

// Every collective x dtype x op (`ops` for the reducing ones) x size x
// in/out-of-place on this world, as calls for `f`.
void for_each_matrix_call(const World& w, const std::vector<DType>& dtypes, const std::vector<RedOp>& ops,
                          uint64_t salt, const std::function<void(const CallSpec&)>& f) {
  for (Collective c : all_collectives())
    for (DType t : dtypes)
      for (RedOp o : collective_reduces(c) ? ops : std::vector<RedOp>{RedOp::sum})
        for (int64_t count : matrix_counts(t)) {
          if (g_quick && count > 4096) continue;
          for (bool inplace : {false, true}) {
            if (inplace && c == Collective::alltoall) continue;
            CallSpec s;
            s.coll = c;
            s.dtype = t;
            s.op = o;
            s.count = count;
            s.inplace = inplace;
            s.root = (c == Collective::broadcast || c == Collective::reduce) ? (w.nranks - 1) : 0;
            s.seed = uint64_t(count * 131 + int(t) * 17 + int(o) * 3 + int(c)) + salt;
            f(s);
          }
        }
}

// PreMulSum (each rank's input times its own scalar, then the sum): every
// reducing collective x dtype, sizes through every protocol and bucket,
// in-place and out-of-place, by value and device scalars.
void premulsum(World& w) {
  for (Collective c : {Collective::allreduce, Collective::reducescatter, Collective::reduce})
    for (DType t : all_dtypes()) {
      const int64_t es = int64_t(dtype_size(t));
      for (int64_t count : {int64_t(1), int64_t(7), 1024 / es + 1, int64_t(70001), (4 << 20) / es + 3})
        for (bool inplace : {false, true}) {
          CallSpec s;
          s.coll = c;
          s.dtype = t;
          s.op = RedOp::premulsum;
          s.count = count;
          s.inplace = inplace;
          s.root = c == Collective::reduce ? w.nranks - 1 : 0;
          // the seed's parity picks the scalar's residence (premul_op): both with both placements
          s.seed = uint64_t(count * 7 + int(t) * 3 + int(c)) * 2 + uint64_t((count + int(t) + (inplace ? 1 : 0)) & 1);
          run_checked(w, s);
        }
    }
}

// ---- fused epilogues (mkAllReduceFused) ----------------------------------------

// One fused all-reduce on every local rank: allreduce.rmsnorm or
// allreduce.fp8_rows, checked against the float64 references of
// compiler/verify/fused_ref.hpp; every buffer has guard bytes, and the local
// ranks' outputs must agree bit for bit.
void fused_call(World& w, const std::string& fusion, DType t, int64_t tokens, int64_t hidden, bool inplace,
                bool residual_inplace, uint64_t seed, bool misalign = false) {
  namespace fr = mk::verify::fused;
  const int64_t count = tokens * hidden;
  const size_t es = dtype_size(t);
  const bool norm = fusion == "allreduce.rmsnorm";
  const std::string what = fmt::format("{} {} tokens {} hidden {} ({}{}{}, {} ranks)", fusion, name(t), tokens, hidden,
                                       inplace ? "in-place" : "out-of-place",
                                       residual_inplace ? ", residual updated in place" : "",
                                       misalign ? ", residual one element off a vector boundary" : "", w.nranks);
  // misalign: rank 0's residual starts one element into its allocation, so
  // that its rows cannot move as vectors (the element path, on sizes that
  // would) while the other ranks' do: the outputs must still agree bit-wise
  auto off_of = [&](const Rank& r) { return misalign && r.rank == 0 ? es : size_t(0); };
  // the exact all-reduce and its magnitude, from every rank's input
  std::vector<double> ar(static_cast<size_t>(count), 0.0), mag(static_cast<size_t>(count), 0.0);
  for (int r = 0; r < w.nranks; ++r)
    for (int64_t i = 0; i < count; ++i) {
      const double v = fr::value(seed, uint64_t(r), i, t);
      ar[size_t(i)] += v;
      mag[size_t(i)] += std::fabs(v);
    }
  std::vector<double> residual(static_cast<size_t>(count)), weight(static_cast<size_t>(hidden));
  for (int64_t i = 0; i < count; ++i) residual[size_t(i)] = fr::value(seed, 1000, i, t);
  for (int64_t j = 0; j < hidden; ++j) weight[size_t(j)] = 0.5 + fr::value(seed, 1001, j, t) * 0.25;
  const double eps_v = 1e-5;
  struct Bufs {
    GuardedBuffer in, out, a, b, c;
  };
  std::vector<Bufs> bufs(w.local.size());
  const int64_t rows = count / hidden;
  for (size_t li = 0; li < w.local.size(); ++li) {
    const Rank& r = w.local[li];
    CK_CUDA(cudaSetDevice(r.device));
    Bufs& b = bufs[li];
    std::vector<double> x(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) x[size_t(i)] = fr::value(seed, uint64_t(r.rank), i, t);
    const auto xb = fr::encode(x, t);
    b.out.alloc(size_t(count) * es);
    if (!inplace) b.in.alloc(size_t(count) * es);
    CK_CUDA(cudaMemcpy(inplace ? b.out.ptr() : b.in.ptr(), xb.data(), xb.size(), cudaMemcpyHostToDevice));
    if (!inplace) CK_CUDA(cudaMemset(b.out.ptr(), 0x7f, size_t(count) * es));  // poison
    if (norm) {
      const auto rb = fr::encode(residual, t), wb = fr::encode(weight, t);
      const size_t off = off_of(r);
      b.a.alloc(rb.size() + off);
      CK_CUDA(cudaMemcpy(static_cast<char*>(b.a.ptr()) + off, rb.data(), rb.size(), cudaMemcpyHostToDevice));
      if (!residual_inplace) {
        b.b.alloc(rb.size());
        CK_CUDA(cudaMemset(b.b.ptr(), 0x7f, rb.size()));
      }
      b.c.alloc(wb.size());
      CK_CUDA(cudaMemcpy(b.c.ptr(), wb.data(), wb.size(), cudaMemcpyHostToDevice));
    } else {
      b.a.alloc(size_t(count));
      b.b.alloc(size_t(rows) * 4);
      CK_CUDA(cudaMemset(b.a.ptr(), 0x7f, size_t(count)));
      CK_CUDA(cudaMemset(b.b.ptr(), 0x7f, size_t(rows) * 4));
    }
  }
  CK_CUDA(cudaDeviceSynchronize());
  CK_MK(mkGroupStart(), nullptr);
  for (size_t li = 0; li < w.local.size(); ++li) {
    const Rank& r = w.local[li];
    CK_CUDA(cudaSetDevice(r.device));
    Bufs& b = bufs[li];
    mkFusion_t f{};
    f.name = fusion.c_str();
    f.row = hidden;
    if (norm) {
      f.operands[0] = static_cast<char*>(b.a.ptr()) + off_of(r);
      f.operands[1] = residual_inplace ? f.operands[0] : b.b.ptr();
      f.operands[2] = b.c.ptr();
      f.scalars[0] = eps_v;
    } else {
      f.operands[0] = b.a.ptr();
      f.operands[1] = b.b.ptr();
    }
    const mkResult_t rc = mkAllReduceFused(inplace ? b.out.ptr() : b.in.ptr(), b.out.ptr(), size_t(count), to_mk(t),
                                           mkSum, &f, r.comm, r.stream);
    if (rc != mkSuccess) throw Failure(what + ": " + mkGetErrorString(rc) + ": " + mkGetLastError(r.comm));
  }
  CK_MK(mkGroupEnd(), nullptr);
  sync_all(w);
  check_async(w);
  std::vector<char> first;
  for (size_t li = 0; li < w.local.size(); ++li) {
    const Rank& r = w.local[li];
    CK_CUDA(cudaSetDevice(r.device));
    Bufs& b = bufs[li];
    auto fetch = [&](const GuardedBuffer& g, size_t bytes) {
      std::vector<char> h(bytes);
      CK_CUDA(cudaMemcpy(h.data(), g.ptr(), bytes, cudaMemcpyDeviceToHost));
      return h;
    };
    std::string bad;
    std::vector<char> outb = fetch(b.out, size_t(count) * es);
    std::vector<char> all = outb;
    if (norm) {
      const auto ref = fr::rmsnorm(ar, mag, residual, weight, eps_v, hidden, t);
      std::vector<char> rob(size_t(count) * es);
      CK_CUDA(cudaMemcpy(rob.data(), residual_inplace ? static_cast<char*>(b.a.ptr()) + off_of(r) : b.b.ptr(), rob.size(),
                         cudaMemcpyDeviceToHost));
      all.insert(all.end(), rob.begin(), rob.end());
      bad = fr::first_bad(fr::decode(rob, t), ref.residual_out, ref.residual_out_tol, "residual_out");
      if (bad.empty()) bad = fr::first_bad(fr::decode(outb, t), ref.out, ref.out_tol, "out");
    } else {
      const auto ref = fr::fp8_rows(ar, mag, hidden, t);
      const auto qb = fetch(b.a, size_t(count)), sb = fetch(b.b, size_t(rows) * 4);
      all.insert(all.end(), qb.begin(), qb.end());
      all.insert(all.end(), sb.begin(), sb.end());
      const auto scales = fr::decode(sb, DType::fp32);
      bad = fr::first_bad(scales, ref.scales, ref.scale_tol, "scales");
      if (bad.empty()) {
        // q against the reference's own scale (its tolerance covers the scale's)
        bad = fr::first_bad(fr::decode(qb, DType::fp8e4m3), ref.q, ref.q_tol, "q");
      }
      // the receive buffer keeps the all-reduce
      if (bad.empty()) {
        std::vector<double> tol(static_cast<size_t>(count));
        for (int64_t i = 0; i < count; ++i) tol[size_t(i)] = 4 * fr::eps(t) * mag[size_t(i)] + 1e-30;
        bad = fr::first_bad(fr::decode(outb, t), ar, tol, "out");
      }
    }
    if (!bad.empty()) throw Failure(what + ": rank " + std::to_string(r.rank) + ": " + bad);
    for (GuardedBuffer* g : {&b.in, &b.out, &b.a, &b.b, &b.c})
      if (g->base) g->check_guards(what.c_str());
    if (li == 0)
      first = all;
    else if (all != first)
      throw Failure(what + ": rank " + std::to_string(r.rank) + "'s outputs differ bit-wise from rank " +
                    std::to_string(w.local[0].rank) + "'s");
    ++g_checked;
  }
  for (size_t li = 0; li < w.local.size(); ++li) {
    CK_CUDA(cudaSetDevice(w.local[li].device));
    for (GuardedBuffer* g : {&bufs[li].in, &bufs[li].out, &bufs[li].a, &bufs[li].b, &bufs[li].c}) g->free();
  }
}

// Groups as one kernel: what FSDP issues (all-gathers of parameter shards),
// what DDP issues (bucket all-reduces), and one of every collective; calls
// of one plan share a lane (chained on the same blocks), others run side by
// side. Each group three times (its step counters continue).
void grouped(World& w) {
  std::vector<std::vector<CallSpec>> groups;
  const int64_t big = g_quick ? 65536 : 1 << 20;
  {
    std::vector<CallSpec> g;  // FSDP: bf16 all-gathers, equal and different sizes
    for (int i = 0; i < 8; ++i) {
      CallSpec s;
      s.coll = Collective::allgather;
      s.dtype = DType::bf16;
      s.count = i % 3 == 0 ? big + 8 * i : 1000 + 37 * i;
      s.seed = 100 + uint64_t(i);
      g.push_back(s);
    }
    groups.push_back(g);
  }
  {
    std::vector<CallSpec> g;  // DDP: fp32 sum all-reduces, one in place
    for (int i = 0; i < 6; ++i) {
      CallSpec s;
      s.coll = Collective::allreduce;
      s.count = i < 3 ? big / 2 + i : 3000 + 11 * i;
      s.inplace = i == 4;
      s.seed = 200 + uint64_t(i);
      g.push_back(s);
    }
    groups.push_back(g);
  }
  {
    std::vector<CallSpec> g;  // every collective, mixed dtypes and ops
    const std::vector<Collective> colls = all_collectives();
    for (size_t i = 0; i < colls.size(); ++i) {
      CallSpec s;
      s.coll = colls[i];
      s.dtype = i % 2 ? DType::fp16 : DType::fp32;
      s.op = i % 3 == 1 ? RedOp::max : RedOp::sum;
      s.count = 4097 + int64_t(i);
      s.root = w.nranks - 1;
      s.seed = 300 + i;
      g.push_back(s);
    }
    groups.push_back(g);
  }
  for (size_t k = 0; k < groups.size(); ++k)
    for (int launch = 0; launch < 3; ++launch) run_group_checked(w, groups[k], launch);
}

// Composites (mkCompositeRun, docs/composites.md): the built-ins' stages as
// one group kernel. composite.reduce_scatter_all_gather chains an all-gather
// after the reduce-scatter whose output it reads: `shard` must be the
// reduce-scatter of `in` and `out` the all-reduce of `in` (the same data).
// composite.zero_step runs a reduce-scatter and an unrelated all-gather side
// by side. Each composite three times (step counters continue), dtypes and
// sizes that make the stages' plans differ in grid.
void composites(World& w) {
  uint64_t seed = 1300;
  const int n = w.nranks;
  for (DType t : {DType::fp32, DType::bf16, DType::fp16})
    for (int64_t count : {int64_t(1), int64_t(1000), int64_t(4097), int64_t(g_quick ? 65536 : 1 << 20)})
      for (int launch = 0; launch < 3; ++launch) {
        CallSpec rs{Collective::reducescatter, t, RedOp::sum, count, false, 0, seed};
        CallSpec ar{Collective::allreduce, t, RedOp::sum, count * n, false, 0, seed};  // what `out` holds
        CallSpec ag{Collective::allgather, t, RedOp::sum, count, false, 0, seed + 1};
        const size_t es = dtype_size(t);
        std::vector<RankBuffers> a(w.local.size()), b(w.local.size());  // rs: in -> shard; ag: param -> params
        std::vector<GuardedBuffer> out(w.local.size());
        for (size_t i = 0; i < w.local.size(); ++i) {
          CK_CUDA(cudaSetDevice(w.local[i].device));
          prepare(w, w.local[i], rs, a[i], launch);
          prepare(w, w.local[i], ag, b[i], launch);
          out[i].alloc(size_t(count * n) * es);
          CK_CUDA(cudaMemset(out[i].ptr(), 0xA5, size_t(count * n) * es));
        }
        CK_CUDA(cudaDeviceSynchronize());
        for (const char* which : {"composite.reduce_scatter_all_gather", "composite.zero_step"}) {
          const bool chain = std::string(which).find("reduce_scatter") != std::string::npos;
          CK_MK(mkGroupStart(), nullptr);
          for (size_t i = 0; i < w.local.size(); ++i) {
            CK_CUDA(cudaSetDevice(w.local[i].device));
            void* chained[3] = {a[i].send, a[i].recv, out[i].ptr()};
            void* zero[4] = {a[i].send, a[i].recv, b[i].send, b[i].recv};
            const mkResult_t r = mkCompositeRun(which, chain ? chained : zero, chain ? 3 : 4, size_t(count),
                                                to_mk(t), mkSum, w.local[i].comm, w.local[i].stream);
            if (r != mkSuccess)
              throw Failure(std::string(which) + ": " + mkGetErrorString(r) + ": " + mkGetLastError(w.local[i].comm));
          }
          CK_MK(mkGroupEnd(), nullptr);
          sync_all(w);
          check_async(w);
          for (size_t i = 0; i < w.local.size(); ++i) {
            CK_CUDA(cudaSetDevice(w.local[i].device));
            check(w, w.local[i], rs, a[i], launch);
            if (chain) {
              RankBuffers whole;  // the all-reduce view: `in` -> `out`
              whole.in = a[i].in;
              whole.out = out[i];
              whole.send = a[i].send;
              whole.recv = out[i].ptr();
              check(w, w.local[i], ar, whole, launch);
            } else {
              check(w, w.local[i], ag, b[i], launch);
            }
            // the next composite starts from poisoned outputs again
            CK_CUDA(cudaMemset(a[i].recv, 0xA5, size_t(count) * es));
            CK_CUDA(cudaMemset(b[i].recv, 0xA5, size_t(count * n) * es));
          }
          CK_CUDA(cudaDeviceSynchronize());
        }
        for (size_t i = 0; i < w.local.size(); ++i) {
          CK_CUDA(cudaSetDevice(w.local[i].device));
          a[i].in.free();
          a[i].out.free();
          b[i].in.free();
          b[i].out.free();
          out[i].free();
        }
        seed += 2;
      }
}

void fused(World& w) {
  uint64_t seed = 900;
  for (DType t : {DType::bf16, DType::fp16, DType::fp32})
    for (int64_t hidden : {int64_t(1024), int64_t(4096), int64_t(8192), int64_t(16384), int64_t(1001)})
      for (int64_t tokens : {int64_t(1), int64_t(3), int64_t(64)}) {
        if (g_quick && tokens == 3) continue;
        // tokens 64: rank 0's residual off a vector boundary (also in --quick)
        fused_call(w, "allreduce.rmsnorm", t, tokens, hidden, false, false, seed++, tokens == 64);
        fused_call(w, "allreduce.rmsnorm", t, tokens, hidden, true, true, seed++);
        const bool odd = (seed & 1) != 0;  // in place on odd seeds
        fused_call(w, "allreduce.fp8_rows", t, tokens, hidden, odd, false, seed++);
      }
  // large: many rows per block, the simple-protocol bucket
  for (int64_t tokens : {int64_t(1024), g_quick ? int64_t(1024) : int64_t(8192)})
    fused_call(w, "allreduce.rmsnorm", DType::bf16, tokens, 4096, false, false, seed++);
  fused_call(w, "allreduce.fp8_rows", DType::bf16, 2048, 8192, true, false, seed++);
}

// A fusion prologue (allreduce.premulsum: each rank's input times its own
// scalar, schedules/fused/allreduce_premulsum.cpp): every local rank runs it
// through mkAllReduceFused, then the PreMulSum op with the same scalar
// through mkAllReduce; both must agree bit for bit, with the float64
// reference, and across ranks; guard bytes stay untouched.
void prologue_call(World& w, DType t, int64_t count, bool inplace, uint64_t seed) {
  namespace fr = mk::verify::fused;
  const size_t es = dtype_size(t), bytes = size_t(count) * es;
  const std::string what = fmt::format("allreduce.premulsum {} count {} ({}, {} ranks)", name(t), count,
                                       inplace ? "in-place" : "out-of-place", w.nranks);
  std::vector<double> want(static_cast<size_t>(count), 0.0), tol(static_cast<size_t>(count), 0.0);
  for (int r = 0; r < w.nranks; ++r)
    for (int64_t i = 0; i < count; ++i) {
      const double v = fr::value(seed, uint64_t(r), i, t) * verify::prescale_of(t, r);
      want[size_t(i)] += v;
      tol[size_t(i)] += double(w.nranks + 1) * fr::eps(t) * std::fabs(v);
    }
  struct Bufs {
    GuardedBuffer in, out_f, out_p;
  };
  std::vector<Bufs> bufs(w.local.size());
  for (size_t li = 0; li < w.local.size(); ++li) {
    const Rank& r = w.local[li];
    CK_CUDA(cudaSetDevice(r.device));
    std::vector<double> x(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) x[size_t(i)] = fr::value(seed, uint64_t(r.rank), i, t);
    const auto xb = fr::encode(x, t);
    Bufs& b = bufs[li];
    b.out_f.alloc(bytes);
    b.out_p.alloc(bytes);
    if (inplace) {
      CK_CUDA(cudaMemcpy(b.out_f.ptr(), xb.data(), bytes, cudaMemcpyHostToDevice));
      CK_CUDA(cudaMemcpy(b.out_p.ptr(), xb.data(), bytes, cudaMemcpyHostToDevice));
    } else {
      b.in.alloc(bytes);
      CK_CUDA(cudaMemcpy(b.in.ptr(), xb.data(), bytes, cudaMemcpyHostToDevice));
      CK_CUDA(cudaMemset(b.out_f.ptr(), 0x7f, bytes));  // poison
      CK_CUDA(cudaMemset(b.out_p.ptr(), 0x7f, bytes));
    }
  }
  CK_CUDA(cudaDeviceSynchronize());
  CK_MK(mkGroupStart(), nullptr);
  for (size_t li = 0; li < w.local.size(); ++li) {
    const Rank& r = w.local[li];
    CK_CUDA(cudaSetDevice(r.device));
    Bufs& b = bufs[li];
    mkFusion_t f{};
    f.name = "allreduce.premulsum";
    f.scalars[0] = verify::prescale_of(t, r.rank);
    const mkResult_t rc = mkAllReduceFused(inplace ? b.out_f.ptr() : b.in.ptr(), b.out_f.ptr(), size_t(count),
                                           to_mk(t), mkSum, &f, r.comm, r.stream);
    if (rc != mkSuccess) throw Failure(what + ": " + mkGetErrorString(rc) + ": " + mkGetLastError(r.comm));
  }
  CK_MK(mkGroupEnd(), nullptr);
  CK_MK(mkGroupStart(), nullptr);
  for (size_t li = 0; li < w.local.size(); ++li) {
    const Rank& r = w.local[li];
    CK_CUDA(cudaSetDevice(r.device));
    Bufs& b = bufs[li];
    CallSpec s;
    s.dtype = t;
    s.op = RedOp::premulsum;
    s.seed = 0;  // the scalar by value
    const mkRedOp_t op = premul_op(r, s);
    const mkResult_t rc = mkAllReduce(inplace ? b.out_p.ptr() : b.in.ptr(), b.out_p.ptr(), size_t(count), to_mk(t), op,
                                      r.comm, r.stream);
    CK_MK(mkRedOpDestroy(op, r.comm), r.comm);
    if (rc != mkSuccess) throw Failure(what + " (PreMulSum op): " + mkGetErrorString(rc) + ": " + mkGetLastError(r.comm));
  }
  CK_MK(mkGroupEnd(), nullptr);
  sync_all(w);
  check_async(w);
  std::vector<char> first;
  for (size_t li = 0; li < w.local.size(); ++li) {
    const Rank& r = w.local[li];
    CK_CUDA(cudaSetDevice(r.device));
    Bufs& b = bufs[li];
    std::vector<char> hf(bytes), hp(bytes);
    CK_CUDA(cudaMemcpy(hf.data(), b.out_f.ptr(), bytes, cudaMemcpyDeviceToHost));
    CK_CUDA(cudaMemcpy(hp.data(), b.out_p.ptr(), bytes, cudaMemcpyDeviceToHost));
    std::string bad = fr::first_bad(fr::decode(hf, t), want, tol, "out");
    if (bad.empty() && hf != hp) bad = "the prologue's result differs bit-wise from the PreMulSum op's";
    if (!bad.empty()) throw Failure(what + ": rank " + std::to_string(r.rank) + ": " + bad);
    for (GuardedBuffer* g : {&b.in, &b.out_f, &b.out_p})
      if (g->base) g->check_guards(what.c_str());
    if (li == 0)
      first = hf;
    else if (hf != first)
      throw Failure(what + ": rank " + std::to_string(r.rank) + "'s output differs bit-wise from rank " +
                    std::to_string(w.local[0].rank) + "'s");
    ++g_checked;
  }
  for (size_t li = 0; li < w.local.size(); ++li) {
    CK_CUDA(cudaSetDevice(w.local[li].device));
    for (GuardedBuffer* g : {&bufs[li].in, &bufs[li].out_f, &bufs[li].out_p}) g->free();
  }
}

void prologue(World& w) {
  uint64_t seed = 1300;
  for (DType t : {DType::bf16, DType::fp16, DType::fp32})
    for (int64_t count : {int64_t(1), int64_t(7), int64_t(1001), int64_t(65536 + 3), int64_t(1) << 22})
      for (bool inplace : {false, true}) {
        if (g_quick && count == 7) continue;
        prologue_call(w, t, count, inplace, seed++);
      }
}

void matrix(World& w) {
  for_each_matrix_call(w, all_dtypes(), all_redops(), 0, [&](const CallSpec& s) { run_checked(w, s); });
}

bool huge_selected(Collective c, DType t);

// Large messages: every collective x dtype x op at `bytes` per buffer (the
// larger of input and output), out-of-place and (if `inplace`) in place.
void large(World& w, int64_t bytes, bool inplace) {
  for (Collective c : all_collectives()) {
    const int64_t before = g_checked;
    auto t0 = std::chrono::steady_clock::now();
    for (DType t : all_dtypes())
      for (RedOp o : collective_reduces(c) ? all_redops() : std::vector<RedOp>{RedOp::sum}) {
        if (bytes >= (1ll << 30) && !huge_selected(c, t)) continue;
        CallSpec s;
        s.coll = c;
        s.dtype = t;
        s.op = o;
        int64_t per = bytes / int64_t(dtype_size(t));
        // all-gather / all-to-all / reduce-scatter buffers are nranks x count
        if (c == Collective::allgather || c == Collective::alltoall || c == Collective::reducescatter)
          per /= w.nranks;
        s.count = per;
        s.root = w.nranks - 1;
        s.seed = uint64_t(bytes % 1000003) + uint64_t(int(c) * 64 + int(t) * 8 + int(o));
        run_checked(w, s);
        s.inplace = true;
        if (inplace && c != Collective::alltoall) run_checked(w, s);
      }
    if (bytes >= (1ll << 30) && w.local[0].rank == 0) {  // progress, for long runs
      std::printf("    %s: %lld results of %lld MiB checked on rank 0 (%.0f s)\n", std::string(name(c)).c_str(),
                  (long long)(g_checked - before), (long long)(bytes >> 20),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      std::fflush(stdout);
    }
  }
}

// Around the protocol boundaries (LL up to 64 KiB, one-shot up to 256 KiB):
// many calls of one size, then the sizes on either side of each boundary,
// every one checked. bench/NOTES.md: one wrong 64 KiB result after a run of
// 16 KiB calls, with two processes on one GPU.
void boundaries(World& w) {
  struct Step {
    int64_t bytes;
    int calls;
  };
  for (Collective c : all_collectives())
    for (DType t : {DType::bf16, DType::fp32}) {
      uint64_t seed = 9000 + uint64_t(int(c) * 16 + int(t));
      for (Step st : {Step{16 << 10, 20}, Step{(64 << 10) - 16, 2}, Step{64 << 10, 3}, Step{(64 << 10) + 16, 2},
                      Step{256 << 10, 2}, Step{(256 << 10) + 16, 2}, Step{64 << 10, 2}})
        for (int i = 0; i < st.calls; ++i) {
          CallSpec s;
          s.coll = c;
          s.dtype = t;
          s.op = RedOp::sum;
          int64_t per = st.bytes / int64_t(dtype_size(t));
          if (c == Collective::allgather || c == Collective::alltoall || c == Collective::reducescatter)
            per /= w.nranks;
          s.count = per;
          s.root = w.nranks - 1;
          s.seed = seed++;
          run_checked(w, s);
        }
    }
}

// 64 MiB for everything; 1 GiB for all-reduce (fp32 sum, bf16 avg) and
// all-gather (the full 1 GiB matrix is the `huge` scenario).
void sizes(World& w) {
  boundaries(w);
  large(w, g_quick ? (4ll << 20) : (64ll << 20), true);
  if (g_quick) return;
  struct Big {
    Collective c;
    DType t;
    RedOp o;
  };
  for (Big b : {Big{Collective::allreduce, DType::fp32, RedOp::sum}, Big{Collective::allreduce, DType::bf16, RedOp::avg},
                Big{Collective::allgather, DType::bf16, RedOp::sum}}) {
    CallSpec s;
    s.coll = b.c;
    s.dtype = b.t;
    s.op = b.o;
    s.count = (1ll << 30) / int64_t(dtype_size(b.t)) / (b.c == Collective::allgather ? w.nranks : 1);
    s.seed = 77 + uint64_t(b.c);
    run_checked(w, s);
  }
}

// 1 GiB for every collective x dtype x op, out-of-place. MK_HUGE_ONLY
// ("allgather,reduce:fp32+bf16") narrows it (collectives, optionally dtypes)
// when a run must fit a time budget.
void huge(World& w) { large(w, 1ll << 30, false); }

bool huge_selected(Collective c, DType t) {
  const char* e = std::getenv("MK_HUGE_ONLY");
  if (!e || !*e) return true;
  std::string spec = std::string(",") + e + ",";
  for (size_t at = 1; at < spec.size();) {
    size_t end = spec.find(',', at);
    std::string item = spec.substr(at, end - at);
    at = end + 1;
    std::string coll = item.substr(0, item.find(':'));
    if (coll != name(c)) continue;
    if (item.find(':') == std::string::npos) return true;
    std::string types = "+" + item.substr(item.find(':') + 1) + "+";
    if (types.find("+" + std::string(name(t)) + "+") != std::string::npos) return true;
  }
  return false;
}

// 1000 back-to-back calls with changing sizes, collectives and dtypes, one sync.
void back_to_back(World& w) {
  const int calls = g_quick ? 200 : 1000;
  std::vector<CallSpec> specs;
  const Collective colls[] = {Collective::allreduce, Collective::allgather, Collective::reducescatter,
                              Collective::allreduce, Collective::broadcast, Collective::alltoall};
  const int64_t counts[] = {1, 7, 100, 1000, 4096, 7777, 65536, 100003};
  for (int i = 0; i < calls; ++i) {
    CallSpec s;
    s.coll = colls[i % 6];
    s.dtype = (i % 3 == 0) ? DType::bf16 : DType::fp32;
    s.op = RedOp::sum;
    s.count = counts[(i * 7) % 8];
    s.root = i % w.nranks;
    s.seed = uint64_t(i + 1);
    specs.push_back(s);
  }
  std::vector<std::vector<RankBuffers>> bufs(size_t(calls), std::vector<RankBuffers>(w.local.size()));
  for (int i = 0; i < calls; ++i)
    for (size_t j = 0; j < w.local.size(); ++j) {
      CK_CUDA(cudaSetDevice(w.local[j].device));
      prepare(w, w.local[j], specs[size_t(i)], bufs[size_t(i)][j], 0);
    }
  for (int i = 0; i < calls; ++i) {
    CK_MK(mkGroupStart(), nullptr);
    for (size_t j = 0; j < w.local.size(); ++j) {
      CK_CUDA(cudaSetDevice(w.local[j].device));
      mkResult_t r = issue(w.local[j], specs[size_t(i)], bufs[size_t(i)][j]);
      if (r != mkSuccess) throw Failure("call " + std::to_string(i) + ": " + mkGetLastError(w.local[j].comm));
    }
    CK_MK(mkGroupEnd(), nullptr);
  }
  sync_all(w);
  check_async(w);
  for (int i = 0; i < calls; ++i)
    for (size_t j = 0; j < w.local.size(); ++j) {
      CK_CUDA(cudaSetDevice(w.local[j].device));
      check(w, w.local[j], specs[size_t(i)], bufs[size_t(i)][j], 0);
      bufs[size_t(i)][j].in.free();
      bufs[size_t(i)][j].out.free();
    }
}

// CUDA graph: capture an all-reduce and an all-gather, replay 100 times with
// fresh inputs each time. `warm`: issue them once before capturing (as NCCL
// users do); without it the capture holds the first use of both plans.
void graphs_impl(World& w, bool warm, cudaStreamCaptureMode mode) {
  const int replays = g_quick ? 20 : 100;
  CallSpec ar;
  ar.coll = Collective::allreduce;
  ar.dtype = DType::fp32;
  ar.count = 5000;
  CallSpec ag = ar;
  ag.coll = Collective::allgather;
  ag.count = 3001;
  ag.dtype = DType::bf16;
  std::vector<RankBuffers> b1(w.local.size()), b2(w.local.size());
  std::vector<cudaGraphExec_t> execs(w.local.size());
  for (size_t j = 0; j < w.local.size(); ++j) {
    CK_CUDA(cudaSetDevice(w.local[j].device));
    prepare(w, w.local[j], ar, b1[j], 0);
    prepare(w, w.local[j], ag, b2[j], 0);
  }
  // Warm up outside capture (plans compile and load here), as with NCCL. One
  // thread driving several ranks groups its calls, as NCCL requires.
  for (int k = 0; k < (warm ? 2 : 0); ++k) {
    CK_MK(mkGroupStart(), nullptr);
    for (size_t j = 0; j < w.local.size(); ++j) {
      CK_CUDA(cudaSetDevice(w.local[j].device));
      CK_MK(issue(w.local[j], ar, b1[j]), w.local[j].comm);
      CK_MK(issue(w.local[j], ag, b2[j]), w.local[j].comm);
    }
    CK_MK(mkGroupEnd(), nullptr);
    sync_all(w);
  }
  // Every rank's stream captures at once; one thread issues the calls of all
  // ranks in a group (first use: the plans load inside the capture).
  for (size_t j = 0; j < w.local.size(); ++j) {
    CK_CUDA(cudaSetDevice(w.local[j].device));
    CK_CUDA(cudaStreamBeginCapture(w.local[j].stream, mode));
  }
  for (CallSpec* spec : {&ar, &ag}) {
    CK_MK(mkGroupStart(), nullptr);
    for (size_t j = 0; j < w.local.size(); ++j) {
      CK_CUDA(cudaSetDevice(w.local[j].device));
      CK_MK(issue(w.local[j], *spec, spec == &ar ? b1[j] : b2[j]), w.local[j].comm);
    }
    CK_MK(mkGroupEnd(), nullptr);
  }
  // Every capture ends before any graph is instantiated (instantiation is not
  // allowed while this thread still captures another stream).
  std::vector<cudaGraph_t> graphs(w.local.size());
  for (size_t j = 0; j < w.local.size(); ++j) {
    CK_CUDA(cudaSetDevice(w.local[j].device));
    CK_CUDA(cudaStreamEndCapture(w.local[j].stream, &graphs[j]));
  }
  for (size_t j = 0; j < w.local.size(); ++j) {
    CK_CUDA(cudaSetDevice(w.local[j].device));
    CK_CUDA(cudaGraphInstantiate(&execs[j], graphs[j], 0));
    CK_CUDA(cudaGraphDestroy(graphs[j]));
  }
  for (int rep = 1; rep <= replays; ++rep) {
    for (size_t j = 0; j < w.local.size(); ++j) {
      CK_CUDA(cudaSetDevice(w.local[j].device));
      // fresh inputs and poisoned outputs for this replay (launch index = rep)
      std::vector<char> host;
      for (auto [spec, buf] : {std::pair<CallSpec*, RankBuffers*>{&ar, &b1[j]}, {&ag, &b2[j]}}) {
        const size_t es = dtype_size(spec->dtype);
        const int64_t ie = in_elems(spec->coll, w.nranks, spec->count), oe = out_elems(spec->coll, w.nranks, spec->count);
        host.resize(size_t(ie) * es);
        verify::fill_input({spec->dtype, spec->op, spec->seed, rep, w.nranks}, w.local[j].rank, 0, ie, host.data());
        CK_CUDA(cudaMemcpy(buf->send, host.data(), host.size(), cudaMemcpyHostToDevice));
        CK_CUDA(cudaMemset(buf->recv, 0xA5, size_t(oe) * es));
      }
      CK_CUDA(cudaDeviceSynchronize());  // the replay's stream does not wait for the legacy stream
    }
    for (size_t j = 0; j < w.local.size(); ++j) {
      CK_CUDA(cudaSetDevice(w.local[j].device));
      CK_CUDA(cudaGraphLaunch(execs[j], w.local[j].stream));
    }
    sync_all(w);
    check_async(w);
    for (size_t j = 0; j < w.local.size(); ++j) {
      CK_CUDA(cudaSetDevice(w.local[j].device));
      check(w, w.local[j], ar, b1[j], rep);
      check(w, w.local[j], ag, b2[j], rep);
    }
  }
  for (size_t j = 0; j < w.local.size(); ++j) {
    cudaGraphExecDestroy(execs[j]);
    b1[j].in.free();
    b1[j].out.free();
    b2[j].in.free();
    b2[j].out.free();
  }
}

void graphs(World& w) { graphs_impl(w, true, cudaStreamCaptureModeThreadLocal); }
void first_use_in_capture(World& w) {
  graphs_impl(w, false, cudaStreamCaptureModeGlobal);
}

// Threads inside calls while another thread aborts (PyTorch's watchdog):
// no crash, no illegal access (run under compute-sanitizer), calls after the
// abort fail, nothing hangs.
void abort_race(World& w) {
  std::vector<float*> bufs;
  for (Rank& r : w.local) {
    CK_CUDA(cudaSetDevice(r.device));
    float* b;
    CK_CUDA(cudaMalloc(&b, 4 << 20));
    CK_CUDA(cudaMemset(b, 0, 4 << 20));
    bufs.push_back(b);
  }
  CK_CUDA(cudaDeviceSynchronize());
  std::atomic<bool> stop{false};
  std::atomic<int> calls{0}, errors{0}, polls{0};
  std::thread caller([&] {
    while (!stop.load()) {
      mkGroupStart();
      for (size_t j = 0; j < w.local.size(); ++j) {
        cudaSetDevice(w.local[j].device);
        mkAllReduce(bufs[j], bufs[j], 1 << 20, mkFloat32, mkSum, w.local[j].comm, w.local[j].stream);
      }
      (mkGroupEnd() == mkSuccess ? calls : errors)++;
    }
  });
  std::thread watchdog([&] {
    while (!stop.load())
      for (Rank& r : w.local) {
        mkResult_t e = mkSuccess;
        mkCommGetAsyncError(r.comm, &e);
        ++polls;
      }
  });
  // The abort comes 300 ms after the first group completed: with a cold
  // plan cache that group compiles its plan first (NVRTC, about half a
  // second), and an abort timed from the start landed inside it, leaving
  // no call before the abort (the s17/s18 flake).
  const auto first_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (calls.load() == 0 && errors.load() == 0 && std::chrono::steady_clock::now() < first_deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto t0 = std::chrono::steady_clock::now();
  for (Rank& r : w.local) CK_MK(mkCommAbort(r.comm), nullptr);
  const double abort_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  stop = true;
  caller.join();
  watchdog.join();
  for (Rank& r : w.local) r.comm = nullptr;
  for (size_t j = 0; j < w.local.size(); ++j) {
    CK_CUDA(cudaSetDevice(w.local[j].device));
    CK_CUDA(cudaStreamSynchronize(w.local[j].stream));  // an illegal access would show here
    CK_CUDA(cudaFree(bufs[j]));
  }
  std::printf("    %d groups before the abort, %d failed after it, %d async-error polls; aborting took %.3f s\n",
              calls.load(), errors.load(), polls.load(), abort_s);
  EXPECT(calls.load() > 0, "no call ran before the abort");
  EXPECT(errors.load() > 0, "calls after the abort did not fail");
  EXPECT(abort_s < 5, "abort took too long");
}

// Rank 1 aborts right after init; rank 0's next collective must fail fast
// (the abort word reaches it), not after the watchdog's 60 s.
void abort_tells_peer(World& w) {
  Rank& r = w.local[0];
  CK_CUDA(cudaSetDevice(r.device));
  float* buf;
  CK_CUDA(cudaMalloc(&buf, 4 << 20));
  CK_CUDA(cudaMemset(buf, 0, 4 << 20));
  CK_CUDA(cudaDeviceSynchronize());
  if (r.rank == 1) {
    CK_MK(mkCommAbort(r.comm), nullptr);
    r.comm = nullptr;
    CK_CUDA(cudaFree(buf));
    return;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto t0 = std::chrono::steady_clock::now();
  mkResult_t first = mkAllReduce(buf, buf, 1 << 20, mkFloat32, mkSum, r.comm, r.stream);
  mkResult_t err = first;
  while (err == mkSuccess) {
    CK_MK(mkCommGetAsyncError(r.comm, &err), r.comm);
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(30)) throw Failure("no error 30 s after the peer aborted");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("    rank 0 saw the peer's abort after %.3f s: %s\n", secs, mkGetLastError(r.comm));
  EXPECT(err == mkRemoteError, mkGetErrorString(err));
  EXPECT(secs < 5, "the peer's abort was not seen promptly");
  EXPECT(mkAllReduce(buf, buf, 10, mkFloat32, mkSum, r.comm, r.stream) == mkRemoteError, "sticky error");
  CK_CUDA(cudaStreamSynchronize(r.stream));
  CK_CUDA(cudaFree(buf));
  CK_MK(mkCommAbort(r.comm), nullptr);
  r.comm = nullptr;
}

// Four ranks on one GPU, 4 MiB fp32 reduce-scatter and all-reduce (which
// deadlocked when the kernels could not all be resident): correct results, or
// a clear refusal before anything is launched; never a hang.
void share_gpu_large(World& w) {
  for (Collective c : {Collective::reducescatter, Collective::allreduce}) {
    CallSpec s;
    s.coll = c;
    s.dtype = DType::fp32;
    s.count = (4 << 20) / 4;
    try {
      run_checked(w, s);
      std::printf("    %s 4 MiB fp32 on %d ranks sharing one GPU: correct\n", std::string(name(c)).c_str(), w.nranks);
    } catch (const Failure& f) {
      const std::string m = f.what();
      if (m.find("share GPU") == std::string::npos) throw;
      std::printf("    %s 4 MiB fp32 refused clearly: %s\n", std::string(name(c)).c_str(), m.c_str());
    }
  }
}

// One call per collective (odd counts, rooted at 1): for worlds whose ranks
// share one GPU across processes (time-sliced, slow).
// Across (MK_HOST_ID) nodes through the network proxy: every collective,
// fp32 and bf16, small to large, in and out of place, against the float64
// reference (run_checked).
void net_calls(World& w) {
  for (Collective c : all_collectives())
    for (DType t : {DType::fp32, DType::bf16})
      for (int64_t count : {int64_t(2), int64_t(777), int64_t(1) << 18, g_quick ? int64_t(0) : int64_t(16) << 20})
        for (bool inplace : {false, true}) {
          if (count == 0 || (inplace && c == Collective::alltoall)) continue;
          CallSpec s;
          s.coll = c;
          s.dtype = t;
          s.op = RedOp::sum;
          s.count = count;
          s.inplace = inplace;
          // across nodes a root must sit on a node's first rank (enqueue.cpp): the last node's
          s.root = (c == Collective::broadcast || c == Collective::reduce) ? (w.nranks - w.nranks / 2) % w.nranks : 0;
          s.seed = uint64_t(count * 7 + int(t) * 5 + int(c)) + 991;
          run_checked(w, s);
        }
}

// Across nodes, 8 B to 256 MiB: the reducing collectives' sizes where the
// network carries most (fp32 and bf16, in and out of place).
void net_sizes(World& w) {
  for (Collective c : {Collective::allreduce, Collective::reducescatter, Collective::allgather})
    for (DType t : {DType::fp32, DType::bf16})
      for (int64_t bytes = 8; bytes <= (int64_t(256) << 20); bytes *= g_quick ? 64 : 8)
        for (bool inplace : {false, true}) {
          CallSpec s;
          s.coll = c;
          s.dtype = t;
          s.op = RedOp::sum;
          // the larger buffer is `bytes`
          const int64_t blocks = c == Collective::allreduce ? 1 : w.nranks;
          s.count = std::max<int64_t>(1, bytes / int64_t(dtype_size(t)) / blocks);
          s.inplace = inplace;
          s.seed = uint64_t(bytes * 3 + int(t) * 5 + int(c)) + 17;
          run_checked(w, s);
        }
}

void one_each(World& w) {
  for (int i = 0; i < 6; ++i) {
    CallSpec s;
    s.coll = all_collectives()[size_t(i)];
    s.count = 777 + i;
    s.root = 1 % w.nranks;
    run_checked(w, s);
  }
}

// Two communicators over the same ranks, used alternately on two streams.
void two_comms(World& w, World& w2) {
  for (int i = 0; i < 20; ++i) {
    CallSpec s;
    s.coll = i % 2 ? Collective::allgather : Collective::allreduce;
    s.count = 1000 + i * 97;
    s.seed = uint64_t(100 + i);
    run_checked(i % 2 ? w : w2, s);
  }
}

// Children of mkCommSplit, with and without splitShare, used alternately with
// the parent (all on their own streams): a child that shares its parent's
// arena addresses a region of it the parent's plans never touch. Colors:
// even and odd parent ranks. One process splits inside a group.
World split_world(const World& w, int (*color)(int), bool share) {
  mkConfig_t cfg = MK_CONFIG_INITIALIZER;
  cfg.splitShare = share ? 1 : 0;
  World c;
  c.multiprocess = w.multiprocess;
  c.local = w.local;
  CK_MK(mkGroupStart(), nullptr);
  for (size_t i = 0; i < w.local.size(); ++i) {
    CK_CUDA(cudaSetDevice(w.local[i].device));
    CK_MK(mkCommSplit(w.local[i].comm, color(w.local[i].rank), w.local[i].rank, &c.local[i].comm, &cfg),
          w.local[i].comm);
  }
  CK_MK(mkGroupEnd(), nullptr);
  for (Rank& r : c.local) {
    CK_MK(mkCommCount(r.comm, &c.nranks), r.comm);
    CK_MK(mkCommUserRank(r.comm, &r.rank), r.comm);
    CK_CUDA(cudaSetDevice(r.device));
    CK_CUDA(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
  }
  return c;
}

void split(World& w) {
  const auto parity = [](int r) { return r % 2; };
  const auto everyone = [](int) { return 0; };
  for (bool share : {true, false}) {
    World halves = split_world(w, parity, share);
    World all = split_world(w, everyone, share);
    for (int i = 0; i < 12; ++i) {
      CallSpec s;
      s.coll = all_collectives()[size_t(i % 6)];
      s.count = 1000 + 333 * i;
      s.root = 1 % w.nranks;
      s.seed = uint64_t(300 + i);
      World& target = i % 3 == 0 ? w : i % 3 == 1 ? all : halves;
      if (&target == &halves) s.root = 0;
      run_checked(target, s);
    }
    std::printf("    splitShare=%d: parent, halves and a copy of the world checked alternately\n", int(share));
    destroy(halves);
    destroy(all);
  }
}

// ---- registered buffers (zero-copy) --------------------------------------------

// One registered arena per local rank; each call carves its buffers out of it
// at offsets that differ per rank (peers learn them at kernel entry), poisons
// the output, and the guard bytes around every buffer are checked after.
struct RegArena {
  char* base = nullptr;
  size_t bytes = 0;
  void* handle = nullptr;
};

std::vector<RegArena> register_arenas(World& w, size_t bytes) {
  std::vector<RegArena> v(w.local.size());
  for (size_t i = 0; i < w.local.size(); ++i) {
    CK_CUDA(cudaSetDevice(w.local[i].device));
    CK_CUDA(cudaMalloc(&v[i].base, bytes));
    v[i].bytes = bytes;
  }
  // Collective across processes; within one process each rank registers alone.
  for (size_t i = 0; i < w.local.size(); ++i) {
    CK_CUDA(cudaSetDevice(w.local[i].device));
    CK_MK(mkCommRegister(w.local[i].comm, v[i].base, bytes, &v[i].handle), w.local[i].comm);
  }
  return v;
}

void deregister_arenas(World& w, std::vector<RegArena>& v) {
  for (size_t i = 0; i < w.local.size(); ++i) {
    CK_CUDA(cudaSetDevice(w.local[i].device));
    CK_MK(mkCommDeregister(w.local[i].comm, v[i].handle), w.local[i].comm);
    CK_CUDA(cudaFree(v[i].base));
  }
  v.clear();
}

// Whether the instance serving this call on `r` is a zero-copy plan.
bool served_zero_copy(const Rank& r, const CallSpec& s) {
  auto* c = rt::acquire(r.comm).get();
  std::lock_guard<std::mutex> lock(c->mu);
  rt::PlanInstance* inst = c->find(s.coll, s.dtype, collective_reduces(s.coll) ? s.op : RedOp::sum,
                                   s.count * int64_t(dtype_size(s.dtype)), true);
  return inst && inst->plan->zero_copy;
}

int g_zero_copy_calls = 0;

// What the registered-buffer matrix covers (zero-copy changes addressing, not arithmetic).
const std::vector<DType> kRegisteredDtypes = {DType::fp32, DType::bf16, DType::int8, DType::fp64};
const std::vector<RedOp> kRegisteredOps = {RedOp::sum, RedOp::max, RedOp::avg};

// `unregistered_out`: the receive buffer comes from plain cudaMalloc (the call
// then goes through scratch although the send buffer is registered).
void run_registered(World& w, const CallSpec& s, std::vector<RegArena>& arenas, bool unregistered_out = false) {
  const size_t es = dtype_size(s.dtype);
  const size_t G = GuardedBuffer::kGuard;
  std::vector<RankBuffers> bufs(w.local.size());
  for (size_t i = 0; i < w.local.size(); ++i) {
    const Rank& r = w.local[i];
    CK_CUDA(cudaSetDevice(r.device));
    RegArena& a = arenas[i];
    CK_CUDA(cudaMemset(a.base, GuardedBuffer::kPattern, a.bytes));
    const size_t ie = size_t(in_elems(s.coll, w.nranks, s.count)) * es;
    const size_t oe = size_t(out_elems(s.coll, w.nranks, s.count)) * es;
    auto align = [](size_t x) { return (x + 255) / 256 * 256; };
    size_t at = 4096 * size_t(r.rank + 1);  // differs per rank
    RankBuffers& b = bufs[i];
    if (s.inplace) {
      b.out.base = a.base + at;
      b.out.bytes = std::max(ie, oe);
    } else {
      b.in.base = a.base + at;
      b.in.bytes = std::max<size_t>(ie, 1);
      at = align(at + b.in.bytes + 2 * G) + 512 * size_t(r.rank);
      if (unregistered_out) {
        b.out.alloc(std::max<size_t>(oe, 1));
      } else {
        b.out.base = a.base + at;
        b.out.bytes = std::max<size_t>(oe, 1);
      }
      at += b.out.bytes + 2 * G;
    }
    if (at > a.bytes) throw Failure("test arena too small");
    prepare(w, r, s, b, 0);
  }
  CK_MK(mkGroupStart(), nullptr);
  for (size_t i = 0; i < w.local.size(); ++i) {
    CK_CUDA(cudaSetDevice(w.local[i].device));
    mkResult_t r = issue(w.local[i], s, bufs[i]);
    if (r != mkSuccess)
      throw Failure(describe(s, w.nranks) + " (registered): " + mkGetErrorString(r) + ": " +
                    mkGetLastError(w.local[i].comm));
  }
  CK_MK(mkGroupEnd(), nullptr);
  sync_all(w);
  check_async(w);
  for (size_t i = 0; i < w.local.size(); ++i) {
    CK_CUDA(cudaSetDevice(w.local[i].device));
    check(w, w.local[i], s, bufs[i], 0);
    if (s.count > 0 && !unregistered_out && served_zero_copy(w.local[i], s)) ++g_zero_copy_calls;
    if (unregistered_out) bufs[i].out.free();
  }
}

void registered(World& w) {
  const bool big = !g_quick;
  std::vector<RegArena> arenas = register_arenas(w, big ? (160u << 20) : (16u << 20));
  g_zero_copy_calls = 0;
  int calls = 0;
  for_each_matrix_call(w, kRegisteredDtypes, kRegisteredOps, 11, [&](const CallSpec& s) {
    run_registered(w, s, arenas);
    ++calls;
  });
  // Large: 64 MiB buffers (4 MiB in quick mode) for every collective.
  for (Collective c : all_collectives()) {
    CallSpec s;
    s.coll = c;
    s.count = (big ? (64 << 20) : (4 << 20)) / 4;
    if (c == Collective::allgather || c == Collective::alltoall || c == Collective::reducescatter) s.count /= w.nranks;
    s.seed = 900 + uint64_t(c);
    run_registered(w, s, arenas);
    ++calls;
  }
  // A registered send buffer with a plain receive buffer: through scratch.
  CallSpec mixed;
  mixed.coll = Collective::allgather;
  mixed.count = 100003;
  run_registered(w, mixed, arenas, true);
  std::printf("    %d calls on registered buffers, %d of them served by zero-copy plans (rank 0)\n", calls,
              g_zero_copy_calls);
  if (w.nranks > 1) EXPECT(g_zero_copy_calls > 0, "registered buffers never used a zero-copy plan");
  deregister_arenas(w, arenas);
  // After deregistration the same kind of call runs through scratch again.
  CallSpec after;
  after.coll = Collective::allgather;
  after.count = 5000;
  run_checked(w, after);
}

// Registration errors and mismatched calls: clear errors on every rank, no hang.
void registered_errors(World& w) {
  Rank& r = w.local[0];
  CK_CUDA(cudaSetDevice(r.device));
  // Host memory cannot be registered; registration is collective, so both
  // ranks fail (rank 1 learns that rank 0's buffer was refused).
  std::vector<char> host(4096);
  char* dev = nullptr;
  CK_CUDA(cudaMalloc(&dev, 1 << 20));
  void* h = nullptr;
  mkResult_t e = mkCommRegister(r.comm, r.rank == 0 ? static_cast<void*>(host.data()) : dev, 4096, &h);
  EXPECT(e != mkSuccess, "registering host memory succeeded");
  std::printf("    rank %d: %s\n", r.rank, mkGetLastError(r.comm));
  std::string msg = mkGetLastError(r.comm);
  EXPECT(msg.find("rank 0") != std::string::npos, msg);
  // Past the end of the allocation.
  e = mkCommRegister(r.comm, dev + 4096, 1 << 20, &h);
  EXPECT(e != mkSuccess, "registering past the end of an allocation succeeded");
  // A good registration, then calls whose counts differ between the ranks:
  // the zero-copy entry check stops both kernels before anything is written.
  CK_MK(mkCommRegister(r.comm, dev, 1 << 20, &h), r.comm);
  float* f = reinterpret_cast<float*>(dev);
  CK_CUDA(cudaMemset(dev, 0x11, 1 << 20));
  CK_CUDA(cudaDeviceSynchronize());
  const size_t count = r.rank == 0 ? 50000 : 50001;
  CK_MK(mkAllGather(f, f + 2 * 50001, count, mkFloat32, r.comm, r.stream), r.comm);
  CK_CUDA(cudaStreamSynchronize(r.stream));
  mkResult_t async = mkSuccess;
  CK_MK(mkCommGetAsyncError(r.comm, &async), r.comm);
  std::printf("    rank %d, counts differ: %s: %s\n", r.rank, mkGetErrorString(async), mkGetLastError(r.comm));
  EXPECT(async != mkSuccess, "mismatched counts went unnoticed");
  // Nothing was written: the destination still holds the fill pattern.
  std::vector<uint32_t> got(2 * 50001);
  CK_CUDA(cudaMemcpy(got.data(), f + 2 * 50001, got.size() * 4, cudaMemcpyDeviceToHost));
  for (uint32_t x : got) EXPECT(x == 0x11111111u, "a mismatched zero-copy call wrote to the output");
  CK_MK(mkCommAbort(r.comm), nullptr);
  r.comm = nullptr;
  CK_CUDA(cudaFree(dev));
}

// Host time per call from the second call of a bucket on, next to a bare
// cuLaunchKernel of the very same kernel and arguments (what the driver costs
// by itself on this machine): the difference is mKernel's own overhead.
void host_time(World& w) {
  Rank& r = w.local[0];
  CK_CUDA(cudaSetDevice(r.device));
  void* buf;
  CK_CUDA(cudaMalloc(&buf, 4096 * 4));
  for (int i = 0; i < 50; ++i) CK_MK(mkAllReduce(buf, buf, 4096, mkFloat32, mkSum, r.comm, r.stream), r.comm);
  CK_CUDA(cudaStreamSynchronize(r.stream));
  auto median_us = [&](const std::function<void()>& call) {
    std::vector<double> per_batch;
    for (int batch = 0; batch < 20; ++batch) {
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 200; ++i) call();
      auto t1 = std::chrono::steady_clock::now();
      per_batch.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 200);
      CK_CUDA(cudaStreamSynchronize(r.stream));
    }
    std::sort(per_batch.begin(), per_batch.end());
    return per_batch[per_batch.size() / 2];
  };
  const double mk_us = median_us([&] { CK_MK(mkAllReduce(buf, buf, 4096, mkFloat32, mkSum, r.comm, r.stream), r.comm); });
  // The same launch, straight to the driver.
  auto* c = rt::acquire(r.comm).get();
  rt::PlanInstance& inst = [&]() -> rt::PlanInstance& {
    std::lock_guard<std::mutex> lock(c->mu);
    return c->instance(Collective::allreduce, DType::fp32, RedOp::sum, 4096 * 4, false);
  }();
  dev::Args a = c->args(inst, buf, buf, 4096, 0, 4, {});
  void* params[] = {&a};
  const double bare_us = median_us([&] {
    CUresult e = rt::cu().cuLaunchKernel(inst.fn, unsigned(inst.kernel->grid), 1, 1, unsigned(inst.kernel->threads),
                                         1, 1, 0, reinterpret_cast<CUstream>(r.stream), params, nullptr);
    if (e != CUDA_SUCCESS) throw Failure("bare launch failed");
  });
  CK_CUDA(cudaFree(buf));
  std::printf("    host time per call (4096 floats, median of 20 batches of 200): mkAllReduce %.2f us, bare "
              "cuLaunchKernel of the same kernel %.2f us, mKernel's own overhead %.2f us\n",
              mk_us, bare_us, mk_us - bare_us);
}

// ---- values next to the Lamport sentinel ----------------------------------------
//
// One-pass kernels of floats of at most 4 bytes carry Lamport packets: an
// all-ones 32-bit word means "not arrived" and a writer stores it as
// 0x7fffffff (templates/prims_lamport.cuh). fp64 keeps LL packets because
// there an all-ones word is the low half of numbers (regression: 1 - 2^-53
// and DBL_MAX arrived changed on the peer). Every value must come back
// exactly, except that an all-ones NaN may come back as another NaN.

template <typename W>
void edge_call(World& w, Collective coll, DType t, const std::vector<W>& mine, W other) {
  const int64_t count = int64_t(mine.size());
  const int64_t out_count = coll == Collective::allgather ? count * w.nranks : count;
  std::vector<void*> send(w.local.size()), recv(w.local.size());
  for (size_t i = 0; i < w.local.size(); ++i) {
    CK_CUDA(cudaSetDevice(w.local[i].device));
    std::vector<W> in(static_cast<size_t>(count));
    for (int64_t e = 0; e < count; ++e) in[size_t(e)] = w.local[i].rank == 0 ? mine[size_t(e)] : other;
    CK_CUDA(cudaMalloc(&send[i], size_t(count) * sizeof(W)));
    CK_CUDA(cudaMalloc(&recv[i], size_t(out_count) * sizeof(W)));
    CK_CUDA(cudaMemcpy(send[i], in.data(), in.size() * sizeof(W), cudaMemcpyHostToDevice));
  }
  CK_MK(mkGroupStart(), nullptr);
  for (size_t i = 0; i < w.local.size(); ++i) {
    CK_CUDA(cudaSetDevice(w.local[i].device));
    mkResult_t r = coll == Collective::allgather
                       ? mkAllGather(send[i], recv[i], size_t(count), to_mk(t), w.local[i].comm, w.local[i].stream)
                       : mkAllReduce(send[i], recv[i], size_t(count), to_mk(t), mkSum, w.local[i].comm,
                                     w.local[i].stream);
    if (r != mkSuccess) throw Failure(std::string("edge values: ") + mkGetLastError(w.local[i].comm));
  }
  CK_MK(mkGroupEnd(), nullptr);
  sync_all(w);
  check_async(w);
  auto is_nan = [](W x) {
    if constexpr (sizeof(W) == 8) return (x & 0x7ff0000000000000ull) == 0x7ff0000000000000ull && (x << 12) != 0;
    else if constexpr (sizeof(W) == 4) return (x & 0x7f800000u) == 0x7f800000u && (x & 0x7fffffu) != 0;
    else return (x & 0x7f80u) == 0x7f80u && (x & 0x7fu) != 0;  // bf16
  };
  for (size_t i = 0; i < w.local.size(); ++i) {
    CK_CUDA(cudaSetDevice(w.local[i].device));
    std::vector<W> got(static_cast<size_t>(out_count));
    CK_CUDA(cudaMemcpy(got.data(), recv[i], got.size() * sizeof(W), cudaMemcpyDeviceToHost));
    for (int64_t e = 0; e < out_count; ++e) {
      // all-reduce: rank 0's value plus zeros; all-gather: every rank's block
      const int64_t block = coll == Collective::allgather ? e / count : 0;
      const W want = coll == Collective::allreduce || block == 0 ? mine[size_t(e % count)] : other;
      const W have = got[size_t(e)];
      if (have == want || (is_nan(want) && is_nan(have))) continue;
      char msg[200];
      std::snprintf(msg, sizeof msg, "edge values: %s %s rank %d element %lld: got %#llx, want %#llx",
                    std::string(name(coll)).c_str(), std::string(name(t)).c_str(), w.local[i].rank, (long long)e,
                    (unsigned long long)have, (unsigned long long)want);
      throw Failure(msg);
    }
    CK_CUDA(cudaFree(send[i]));
    CK_CUDA(cudaFree(recv[i]));
  }
}

void edge_values(World& w) {
  // Patterns repeated over 1000 elements (the one-pass range), so that each
  // sits at every position of a 16-byte unit.
  auto repeat = [](auto pattern) {
    decltype(pattern) v;
    for (size_t e = 0; e < 1000; ++e) v.push_back(pattern[e % pattern.size()]);
    return v;
  };
  const std::vector<uint64_t> f64 = repeat(std::vector<uint64_t>{
      0x3fefffffffffffffull, 0x7fefffffffffffffull, 0xffefffffffffffffull, 0x00000000ffffffffull,
      0xffffffff00000000ull, 0x3ff0000000000000ull, 0x7ff8000000000000ull});
  edge_call<uint64_t>(w, Collective::allreduce, DType::fp64, f64, 0);
  edge_call<uint64_t>(w, Collective::allgather, DType::fp64, f64, 0x4000000000000000ull);
  const std::vector<uint32_t> f32 = repeat(std::vector<uint32_t>{0xffffffffu, 0x7fffffffu, 0xff7fffffu, 0x7f7fffffu,
                                                                 0x3f800000u, 0x80000000u, 0x00000001u});
  edge_call<uint32_t>(w, Collective::allgather, DType::fp32, f32, 0x40000000u);
  const std::vector<uint16_t> b16 =
      repeat(std::vector<uint16_t>{0xffff, 0xffff, 0x7fff, 0xff7f, 0x3f80, 0x8000, 0xffff});
  edge_call<uint16_t>(w, Collective::allgather, DType::bf16, b16, 0x4000);
  // Lamport kernels of different dtypes share scratch and step counters
  // (the resource key leaves the dtype out): alternate them.
  for (int i = 0; i < 12; ++i) {
    CallSpec s;
    s.dtype = i % 3 == 0 ? DType::fp32 : i % 3 == 1 ? DType::bf16 : DType::fp16;
    s.count = 3000 + 17 * i;
    s.seed = uint64_t(500 + i);
    run_checked(w, s);
  }
  std::printf("    fp64 all-reduce and all-gather, fp32 and bf16 all-gather of values next to the sentinel: exact; "
              "fp32/bf16/fp16 all-reduces alternated\n");
}

// ---- max and min: bit-identical whatever order ranks combine in ------------------

// The reduction of one element over ranks under max or min as defined in
// templates/reduce.cuh (written here from the definition, not the code): NaN
// operands are ignored (all NaN: NaN), +0 is the larger zero.
template <typename W>
struct MinMaxRef {
  bool is_nan(W x) const {
    if constexpr (sizeof(W) == 4) return (x & 0x7f800000u) == 0x7f800000u && (x & 0x7fffffu) != 0;
    else return (x & 0x7f80u) == 0x7f80u && (x & 0x7fu) != 0;  // bf16
  }
  double value(W x) const {
    const uint32_t bits = sizeof(W) == 4 ? uint32_t(x) : uint32_t(x) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return double(f);
  }
  bool neg(W x) const { return (x >> (sizeof(W) * 8 - 1)) & 1; }
  // whether the result's bits are `got`, for values `v` of the ranks
  bool ok(const std::vector<W>& v, W got, bool max) const {
    std::vector<W> num;
    for (W x : v)
      if (!is_nan(x)) num.push_back(x);
    if (num.empty()) return is_nan(got);
    W best = num[0];
    for (W x : num) {
      const double a = value(x), b = value(best);
      if (max ? a > b : a < b) best = x;
      else if (a == b && a == 0 && (max ? !neg(x) : neg(x))) best = x;  // +0 above -0
    }
    return got == best;
  }
};

template <typename W>
void minmax_call(World& w, DType t, RedOp op, int64_t count, const std::vector<W>& pattern) {
  const int n = w.nranks;
  auto in_of = [&](int rank, int64_t e) { return pattern[size_t((e * 7 + rank * 3 + e / 5) % int64_t(pattern.size()))]; };
  std::vector<void*> send(w.local.size()), recv(w.local.size());
  for (size_t i = 0; i < w.local.size(); ++i) {
    CK_CUDA(cudaSetDevice(w.local[i].device));
    std::vector<W> in(static_cast<size_t>(count));
    for (int64_t e = 0; e < count; ++e) in[size_t(e)] = in_of(w.local[i].rank, e);
    CK_CUDA(cudaMalloc(&send[i], size_t(count) * sizeof(W)));
    CK_CUDA(cudaMalloc(&recv[i], size_t(count) * sizeof(W)));
    CK_CUDA(cudaMemcpy(send[i], in.data(), in.size() * sizeof(W), cudaMemcpyHostToDevice));
  }
  CK_CUDA(cudaDeviceSynchronize());
  CK_MK(mkGroupStart(), nullptr);
  for (size_t i = 0; i < w.local.size(); ++i) {
    CK_CUDA(cudaSetDevice(w.local[i].device));
    const mkResult_t r = mkAllReduce(send[i], recv[i], size_t(count), to_mk(t), op == RedOp::max ? mkMax : mkMin,
                                     w.local[i].comm, w.local[i].stream);
    if (r != mkSuccess) throw Failure(std::string("minmax: ") + mkGetLastError(w.local[i].comm));
  }
  CK_MK(mkGroupEnd(), nullptr);
  sync_all(w);
  check_async(w);
  const MinMaxRef<W> ref;
  std::vector<W> first;
  for (size_t i = 0; i < w.local.size(); ++i) {
    CK_CUDA(cudaSetDevice(w.local[i].device));
    std::vector<W> got(static_cast<size_t>(count));
    CK_CUDA(cudaMemcpy(got.data(), recv[i], got.size() * sizeof(W), cudaMemcpyDeviceToHost));
    for (int64_t e = 0; e < count; ++e) {
      std::vector<W> v;
      for (int q = 0; q < n; ++q) v.push_back(in_of(q, e));
      if (!ref.ok(v, got[size_t(e)], op == RedOp::max))
        throw Failure(fmt::format("minmax: {} {} count {} rank {} element {}: got {:#x}", name(t), name(op), count,
                                  w.local[i].rank, e, uint64_t(got[size_t(e)])));
    }
    if (i == 0) first = got;
    else if (got != first)  // the same bits on every rank (NaNs included)
      throw Failure(fmt::format("minmax: {} {} count {}: rank {} differs bit-wise from rank {}", name(t), name(op), count,
                                w.local[i].rank, w.local[0].rank));
    g_checked += count;
    CK_CUDA(cudaFree(send[i]));
    CK_CUDA(cudaFree(recv[i]));
  }
}

void minmax_order(World& w) {
  // +0, -0, NaNs, and values around them, at every position of a 16-byte unit
  const std::vector<uint32_t> f32 = {0x00000000u, 0x80000000u, 0x7fc00000u, 0x3f800000u, 0xbf800000u,
                                     0x80000000u, 0x7fc00001u, 0x00000000u, 0xffc00000u, 0x00000001u};
  const std::vector<uint16_t> b16 = {0x0000, 0x8000, 0x7fc0, 0x3f80, 0xbf80, 0x8000, 0x7fc1, 0x0000, 0xffc0};
  for (RedOp op : {RedOp::max, RedOp::min})
    for (int64_t count : {int64_t(1000), int64_t(g_quick ? 70000 : 1 << 20)}) {  // one-pass and simple buckets
      minmax_call<uint32_t>(w, DType::fp32, op, count, f32);
      minmax_call<uint16_t>(w, DType::bf16, op, count, b16);
    }
  std::printf("    max and min of zeros of two signs and NaNs: every rank the same bits, NaNs ignored, +0 the larger "
              "zero\n");
}

// ---- a fusion's accessors checked on the device (MK_FUSION_CHECK=1) --------------

// Writes one element past its row, on row 5 only: rows the CPU checker runs
// (0..2) never show it; the device check does.
MK_EPILOGUE(gpu_row5_past,
  struct Epi {
    template <class R>
    MK_DEV static void row(R& r) {
      for (int i = r.first(); i < r.n; i += r.step()) r.set_out(i, r.out(i) * typename R::C(2));
      if (r.row == 5 && r.first() == 0) r.set_out(r.n, typename R::C(-1));
    }
  };
)
MK_FUSION(gpu_row5_past, "test.gpu_row5_past", "out *= 2; row 5 also writes one element past its end", ({}), ({}),
          mk::dsl::RowMode::given);

void fusion_check_trap(World& w) {
  Rank& r = w.local[0];
  CK_CUDA(cudaSetDevice(r.device));
  constexpr int64_t row = 64, rows = 8, count = row * rows;
  float *x, *out;
  CK_CUDA(cudaMalloc(&x, count * sizeof(float)));
  CK_CUDA(cudaMalloc(&out, count * sizeof(float)));
  std::vector<float> h(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) h[size_t(i)] = float(i % 13) + 1.0f;
  CK_CUDA(cudaMemcpy(x, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  mkFusion_t f{};
  f.name = "test.gpu_row5_past";
  f.row = row;
  // 1. unchecked: the call succeeds and row 6's first element is silently overwritten
  unsetenv("MK_FUSION_CHECK");
  CK_MK(mkAllReduceFused(x, out, size_t(count), mkFloat32, mkSum, &f, r.comm, r.stream), r.comm);
  CK_CUDA(cudaStreamSynchronize(r.stream));
  std::vector<float> got(h.size());
  CK_CUDA(cudaMemcpy(got.data(), out, got.size() * 4, cudaMemcpyDeviceToHost));
  // row 6's block may read, write or skip past the stray store: what it
  // leaves is told, not asserted (the point is that nothing reports it)
  std::printf("    unchecked: no error; row 6 element 0 is %g where the fusion computes %g\n", double(got[size_t(6 * row)]),
              double(h[size_t(6 * row)]) * 2);
  // 2. checked: the store traps, and says where (device printf, captured).
  // A communicator takes MK_FUSION_CHECK when it builds a plan and keeps the
  // plan: a new one sees the setting.
  setenv("MK_FUSION_CHECK", "1", 1);
  mkComm_t checked = nullptr;
  CK_MK(mkCommInitAll(&checked, 1, &r.device), nullptr);
  std::fflush(stdout);
  char path[] = "/tmp/mk-fusion-check-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) throw Failure("mkstemp");
  const int saved = dup(1);
  dup2(fd, 1);
  const mkResult_t rc = mkAllReduceFused(x, out, size_t(count), mkFloat32, mkSum, &f, checked, r.stream);
  const cudaError_t se = cudaStreamSynchronize(r.stream);
  std::fflush(stdout);
  dup2(saved, 1);
  close(saved);
  close(fd);
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  unlink(path);
  std::printf("    checked: call %s, stream %s; the kernel printed: %s", mkGetErrorString(rc), cudaGetErrorName(se),
              text.c_str());
  const std::string want = "mKernel: fusion test.gpu_row5_past (MK_FUSION_CHECK): row 5 of 64 element(s), thread 0: "
                           "r.set_out(i, v): element i = 64, outside 0..63";
  if (text.find(want) == std::string::npos) throw Failure("checked: the trap's message is missing: want '" + want + "'");
  if (se == cudaSuccess) throw Failure("checked: the stream reported no error after the trap");
  // the context is gone after a trap: leave without tearing down
  std::printf("    rank 0: the device check trapped at row 5, element 64\n");
  std::fflush(stdout);
  _exit(0);
}

// ---- bad input -------------------------------------------------------------------

void expect_error(mkResult_t got, mkResult_t want, mkComm_t comm, const char* what, const char* needle) {
  if (got != want)
    throw Failure(std::string(what) + ": expected " + mkGetErrorString(want) + ", got " + mkGetErrorString(got) +
                  " (" + mkGetLastError(comm) + ")");
  std::string msg = mkGetLastError(comm);
  if (needle && msg.find(needle) == std::string::npos)
    throw Failure(std::string(what) + ": message '" + msg + "' does not mention '" + needle + "'");
}

void bad_input(World& w) {
  Rank& r = w.local[0];
  CK_CUDA(cudaSetDevice(r.device));
  float* buf;
  CK_CUDA(cudaMalloc(&buf, 1 << 20));
  expect_error(mkAllReduce(nullptr, buf, 10, mkFloat32, mkSum, r.comm, r.stream), mkInvalidArgument, r.comm,
               "null sendbuff", "NULL");
  expect_error(mkAllReduce(buf, nullptr, 10, mkFloat32, mkSum, r.comm, r.stream), mkInvalidArgument, r.comm,
               "null recvbuff", "NULL");
  expect_error(mkAllReduce(reinterpret_cast<char*>(buf) + 1, buf, 10, mkFloat32, mkSum, r.comm, r.stream),
               mkInvalidArgument, r.comm, "misaligned sendbuff", "aligned");
  expect_error(mkAllReduce(buf, buf, 10, mkDataType_t(42), mkSum, r.comm, r.stream), mkInvalidArgument, r.comm,
               "bad dtype", "datatype");
  expect_error(mkAllReduce(buf, buf, 10, mkFloat32, mkRedOp_t(9), r.comm, r.stream), mkInvalidArgument, r.comm,
               "bad op", "op");
  expect_error(mkBroadcast(buf, buf, 10, mkFloat32, w.nranks, r.comm, r.stream), mkInvalidArgument, r.comm,
               "bad root", "root");
  expect_error(mkAllReduce(buf, buf + 3, 10, mkFloat32, mkSum, r.comm, r.stream), mkInvalidArgument, r.comm,
               "overlapping buffers", "overlap");
  expect_error(mkAllReduce(buf, buf, 10, mkFloat32, mkSum, nullptr, r.stream), mkInvalidArgument, nullptr,
               "null comm", "NULL");
  std::vector<float> host(64);
  expect_error(mkAllReduce(host.data(), buf, 10, mkFloat32, mkSum, r.comm, r.stream), mkInvalidArgument, r.comm,
               "host sendbuff", "not GPU memory");
  float* pinned = nullptr;
  CK_CUDA(cudaMallocHost(&pinned, 4096));
  expect_error(mkAllReduce(buf, pinned, 10, mkFloat32, mkSum, r.comm, r.stream), mkInvalidArgument, r.comm,
               "pinned host recvbuff", "host memory");
  CK_CUDA(cudaFreeHost(pinned));
  expect_error(mkAllReduce(buf, buf, (1 << 20) / 4 + 1, mkFloat32, mkSum, r.comm, r.stream), mkInvalidArgument,
               r.comm, "count past the allocation", "allocation ends");
  // registered buffer: a count larger than the registration
  void* handle = nullptr;
  CK_MK(mkCommRegister(r.comm, buf, 4096, &handle), r.comm);
  expect_error(mkAllReduce(buf, buf, 2048, mkFloat32, mkSum, r.comm, r.stream), mkInvalidArgument, r.comm,
               "count beyond a registered buffer", "count mismatch");
  CK_MK(mkAllReduce(buf, buf, 1024, mkFloat32, mkSum, r.comm, r.stream), r.comm);
  CK_MK(mkCommDeregister(r.comm, handle), r.comm);
  expect_error(mkCommDeregister(r.comm, handle), mkInvalidArgument, r.comm, "double deregister", "not registered");
  // zero count is a no-op even with null pointers, as in NCCL
  CK_MK(mkAllReduce(nullptr, nullptr, 0, mkFloat32, mkSum, r.comm, r.stream), r.comm);
  // a stream of another GPU
  if (gpu_count() > 1) {
    int other = (r.device + 1) % gpu_count();
    cudaStream_t s2;
    CK_CUDA(cudaSetDevice(other));
    CK_CUDA(cudaStreamCreate(&s2));
    CK_CUDA(cudaSetDevice(r.device));
    expect_error(mkAllReduce(buf, buf, 10, mkFloat32, mkSum, r.comm, s2), mkInvalidArgument, r.comm,
                 "stream on the wrong device", "stream belongs");
    cudaStreamDestroy(s2);
  }
  CK_CUDA(cudaStreamSynchronize(r.stream));
  CK_CUDA(cudaFree(buf));
  // calls after destroy
  mkComm_t dead = r.comm;
  destroy(w);
  expect_error(mkAllReduce(nullptr, nullptr, 1, mkFloat32, mkSum, dead, nullptr), mkInvalidArgument, nullptr,
               "call after destroy", "destroyed");
  int n = 0;
  expect_error(mkCommCount(dead, &n), mkInvalidArgument, nullptr, "count after destroy", "destroyed");
  // init with a rank out of range
  mkUniqueId id;
  CK_MK(mkGetUniqueId(&id), nullptr);
  mkComm_t c;
  expect_error(mkCommInitRank(&c, 2, id, 5), mkInvalidArgument, nullptr, "rank out of range", "rank 5");
  expect_error(mkCommInitRank(&c, 0, id, 0), mkInvalidArgument, nullptr, "nranks 0", "nranks");
  mkUniqueId junk;
  std::memset(&junk, 7, sizeof junk);
  expect_error(mkCommInitRank(&c, 2, junk, 0), mkInvalidArgument, nullptr, "foreign unique id", "unique id");
}

// MK_PLAN_DIR holding a plan for another architecture: a clear error.
void wrong_plan(World& w) {
  Rank& r = w.local[0];
  // The plan the runtime would pick for this call, compiled for sm_80.
  const std::string schedule = rt::choose_schedule(Collective::allreduce, 1, 400).schedule;
  compiler::CompileOptions o;
  o.arch = 80;
  auto p = compiler::compile_plan(dsl::build(*dsl::find_schedule(schedule), 1, 0), o);
  std::string dir = std::filesystem::temp_directory_path() / ("mk-wrong-plan-" + std::to_string(::getpid()));
  plan::write_dir(p, dir);
  setenv("MK_PLAN_DIR", dir.c_str(), 1);
  CK_CUDA(cudaSetDevice(r.device));
  float* buf;
  CK_CUDA(cudaMalloc(&buf, 4096));
  mkResult_t res = mkAllReduce(buf, buf, 100, mkFloat32, mkSum, r.comm, r.stream);
  expect_error(res, mkInvalidUsage, r.comm, "plan for another arch", "recompile");
  CK_CUDA(cudaFree(buf));
}

// ---- failure handling (multi-process) -------------------------------------------------

// Rank 1 dies (SIGKILL) right after init; rank 0 must report an error within
// the timeout, and abort cleanly.
void killed_peer(World& w) {
  Rank& r = w.local[0];
  if (r.rank == 1) {
    ::kill(::getpid(), SIGKILL);
  }
  CK_CUDA(cudaSetDevice(r.device));
  float* buf;
  CK_CUDA(cudaMalloc(&buf, 1 << 20));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto t0 = std::chrono::steady_clock::now();
  CK_MK(mkAllReduce(buf, buf, 100000, mkFloat32, mkSum, r.comm, r.stream), r.comm);
  mkResult_t err = mkSuccess;
  while (err == mkSuccess) {
    CK_MK(mkCommGetAsyncError(r.comm, &err), r.comm);
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(60)) throw Failure("no error after 60 s: hang");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT(err == mkRemoteError, mkGetErrorString(err));
  std::printf("    rank 0 saw the dead peer after %.2f s: %s\n", secs, mkGetLastError(r.comm));
  // further calls fail fast; abort returns promptly
  EXPECT(mkAllReduce(buf, buf, 10, mkFloat32, mkSum, r.comm, r.stream) == mkRemoteError, "calls after the error");
  auto a0 = std::chrono::steady_clock::now();
  CK_MK(mkCommAbort(r.comm), nullptr);
  std::printf("    mkCommAbort took %.3f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - a0).count());
  r.comm = nullptr;
}

// Across (MK_HOST_ID) nodes: both ranks run a collective (its connections
// made), then rank 1 dies; rank 0's next collective must fail within the
// timeout with an error naming rank 1 (its proxy sees the connection close,
// or its kernel's wait times out), never hang; abort returns promptly.
void net_killed_peer(World& w) {
  Rank& r = w.local[0];
  CK_CUDA(cudaSetDevice(r.device));
  float* buf;
  CK_CUDA(cudaMalloc(&buf, 1 << 20));
  CK_CUDA(cudaMemset(buf, 0, 1 << 20));
  CK_CUDA(cudaDeviceSynchronize());
  CK_MK(mkAllReduce(buf, buf, 100000, mkFloat32, mkSum, r.comm, r.stream), r.comm);
  CK_CUDA(cudaStreamSynchronize(r.stream));
  int x = 0;
  CK_MK(mkCommBootstrapBroadcast(r.comm, &x, sizeof x, 0), r.comm);  // both warm
  if (r.rank == 1) ::kill(::getpid(), SIGKILL);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = std::chrono::steady_clock::now();
  mkResult_t err = mkAllReduce(buf, buf, 100000, mkFloat32, mkSum, r.comm, r.stream);  // may fail at once
  while (err == mkSuccess) {
    CK_MK(mkCommGetAsyncError(r.comm, &err), r.comm);
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(60)) throw Failure("no error after 60 s: hang");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT(err == mkRemoteError, mkGetErrorString(err));
  const std::string msg = mkGetLastError(r.comm);
  EXPECT(msg.find("rank 1") != std::string::npos, msg.c_str());
  std::printf("    rank 0 saw the dead peer on the other node after %.2f s: %s\n", secs, msg.c_str());
  const auto a0 = std::chrono::steady_clock::now();
  CK_MK(mkCommAbort(r.comm), nullptr);
  std::printf("    mkCommAbort took %.3f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - a0).count());
  r.comm = nullptr;
}

// Rank 1 stalls (never calls); rank 0 times out, then rank 1 joins late and
// sees the abort too.
void stalled_rank(World& w) {
  Rank& r = w.local[0];
  CK_CUDA(cudaSetDevice(r.device));
  float* buf;
  CK_CUDA(cudaMalloc(&buf, 2 << 20));  // the call below uses 1.2 MB (the pointer check caught a 1 MiB buffer)
  if (r.rank == 1) std::this_thread::sleep_for(std::chrono::seconds(8));
  auto t0 = std::chrono::steady_clock::now();
  CK_MK(mkAllReduce(buf, buf, 300000, mkFloat32, mkSum, r.comm, r.stream), r.comm);
  mkResult_t err = mkSuccess;
  while (err == mkSuccess && cudaStreamQuery(r.stream) == cudaErrorNotReady) {
    CK_MK(mkCommGetAsyncError(r.comm, &err), r.comm);
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(60)) throw Failure("hang");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CK_CUDA(cudaStreamSynchronize(r.stream));
  CK_MK(mkCommGetAsyncError(r.comm, &err), r.comm);
  EXPECT(err == mkRemoteError, std::string("rank ") + std::to_string(r.rank) + " saw " + mkGetErrorString(err));
  std::printf("    rank %d: %s\n", r.rank, mkGetLastError(r.comm));
  // Sticky: every later call fails with the error, nobody computes garbage.
  EXPECT(mkAllReduce(buf, buf, 1000, mkFloat32, mkSum, r.comm, r.stream) == mkRemoteError, "sticky error");
  EXPECT(mkAllGather(buf, buf, 100, mkFloat32, r.comm, r.stream) == mkRemoteError, "sticky error");
  CK_MK(mkCommAbort(r.comm), nullptr);
  r.comm = nullptr;
}

// ---- scenario table ---------------------------------------------------------------

struct Scenario {
  std::string name;
  int nranks;
  bool multiprocess;
  int min_gpus;
  std::map<std::string, std::string> env;
  std::function<void(World&)> body;
  int devices_mode = 0;  // 0: rank r on GPU r % ngpu; 1: every rank on GPU 0
  bool shareable = true;  // with fewer GPUs than min_gpus: run with every rank on GPU 0
  // Processes standing in for this many nodes (MK_HOST_ID node-K, ranks node
  // by node): the ranks of other nodes are reached through MK_NET.
  int nodes = 0;
};

std::vector<Scenario> scenarios() {
  std::vector<Scenario> v;
  v.push_back({"matrix_1rank", 1, false, 1, {}, matrix});
  v.push_back({"matrix_2gpu_1proc", 2, false, 2, {}, matrix});
  v.push_back({"matrix_2gpu_2proc", 2, true, 2, {}, matrix});
  v.push_back({"sizes_1rank", 1, false, 1, {}, sizes});
  v.push_back({"sizes_2gpu_1proc", 2, false, 2, {}, sizes});
  v.push_back({"sizes_2gpu_2proc", 2, true, 2, {}, sizes});
  v.push_back({"huge_2gpu_2proc", 2, true, 2, {}, [](World& w) {
                 if (g_quick) std::printf("    (skipped in quick mode: 1 GiB for every collective, dtype and op)\n");
                 else huge(w);
               }, 0, false});
  v.push_back({"back_to_back_2gpu_2proc", 2, true, 2, {}, back_to_back});
  v.push_back({"back_to_back_2gpu_1proc", 2, false, 2, {}, back_to_back});
  v.push_back({"graphs_2gpu_2proc", 2, true, 2, {}, graphs});
  v.push_back({"graphs_2gpu_1proc", 2, false, 2, {}, graphs});
  v.push_back({"two_comms_2gpu_1proc", 2, false, 2, {},
               [](World& w) {
                 std::vector<int> devs;
                 for (auto& r : w.local) devs.push_back(r.device);
                 World w2 = one_process(devs);
                 two_comms(w, w2);
                 destroy(w2);
               }});
  v.push_back({"ranks_share_gpu_4ranks_1proc", 4, false, 1, {}, [](World& w) {
                 for (int i = 0; i < 6; ++i) {
                   CallSpec s;
                   s.coll = all_collectives()[size_t(i)];
                   s.count = 777 + i;
                   s.root = 1;
                   run_checked(w, s);
                 }
               }, 1});
  v.push_back({"registered_1rank", 1, false, 1, {}, registered});
  v.push_back({"registered_2gpu_1proc", 2, false, 2, {}, registered});
  v.push_back({"registered_2gpu_2proc", 2, true, 2, {}, registered});
  // Zero-copy from any size: the mismatched call below is small.
  v.push_back({"registered_errors_2proc", 2, true, 2, {{"MK_TIMEOUT_MS", "5000"}, {"MK_ZERO_COPY_MIN_BYTES", "0"}},
               registered_errors});
  v.push_back({"edge_values_2gpu_1proc", 2, false, 2, {}, edge_values});
  v.push_back({"edge_values_2gpu_2proc", 2, true, 2, {}, edge_values});
  v.push_back({"edge_values_share_gpu_3ranks_1proc", 3, false, 1, {}, edge_values, 1});
  v.push_back({"premulsum_share_gpu_3ranks_1proc", 3, false, 1, {}, premulsum, 1});
  v.push_back({"premulsum_share_gpu_2ranks_2proc", 2, true, 1, {}, premulsum});
  v.push_back({"prologue_share_gpu_3ranks_1proc", 3, false, 1, {}, prologue, 1});
  v.push_back({"prologue_share_gpu_2ranks_2proc", 2, true, 1, {}, prologue});
  v.push_back({"fused_share_gpu_3ranks_1proc", 3, false, 1, {}, fused, 1});
  v.push_back({"fused_share_gpu_2ranks_2proc", 2, true, 1, {}, fused});
  // Every size with the epilogue in the collective's tail, and every size in
  // the epilogue kernel (the runtime picks by row count: both paths checked
  // on every shape).
  v.push_back({"fused_tail_share_gpu_3ranks_1proc", 3, false, 1, {{"MK_FUSED_EPILOGUE", "tail"}}, fused, 1});
  v.push_back({"fused_kernel_share_gpu_2ranks_1proc", 2, false, 1, {{"MK_FUSED_EPILOGUE", "kernel"}}, fused, 1});
  // Groups as one kernel (MK_GROUP_FUSE=1: from the first time), and the
  // same groups one launch per call.
  v.push_back({"group_fused_share_gpu_3ranks_1proc", 3, false, 1, {{"MK_GROUP_FUSE", "1"}}, grouped, 1});
  v.push_back({"group_fused_share_gpu_2ranks_2proc", 2, true, 1, {{"MK_GROUP_FUSE", "1"}}, grouped});
  v.push_back({"group_fused_1rank", 1, false, 1, {{"MK_GROUP_FUSE", "1"}}, grouped});
  v.push_back({"group_unfused_share_gpu_2ranks_1proc", 2, false, 1, {{"MK_GROUP_FUSE", "0"}}, grouped, 1});
  // Composites: one group kernel per call whatever MK_GROUP_FUSE says.
  v.push_back({"composite_share_gpu_3ranks_1proc", 3, false, 1, {}, composites, 1});
  v.push_back({"composite_share_gpu_2ranks_2proc", 2, true, 1, {}, composites});
  v.push_back({"composite_1rank", 1, false, 1, {}, composites});
  v.push_back({"minmax_order_share_gpu_3ranks_1proc", 3, false, 1, {}, minmax_order, 1});
  v.push_back({"minmax_order_1rank", 1, false, 1, {}, minmax_order});
  v.push_back({"fused_checked_share_gpu_2ranks_1proc", 2, false, 1, {{"MK_FUSION_CHECK", "1"}}, fused, 1});
  v.push_back({"fusion_check_trap_1rank", 1, false, 1, {}, fusion_check_trap});
  v.push_back({"bad_input_1rank", 1, false, 1, {}, bad_input});
  v.push_back({"wrong_arch_plan", 1, false, 1, {}, wrong_plan});
  v.push_back({"killed_peer_2proc", 2, true, 1, {{"MK_TIMEOUT_MS", "3000"}}, killed_peer});
  // Two (MK_HOST_ID) nodes through the socket transport on loopback and the
  // network proxy, ranks as processes sharing the GPUs there are.
  // (Few instances and one stream per connection, as s27 ran them; the
  // FIFOs to a peer now share one connection per put size.)
  const std::map<std::string, std::string> net_env = {{"MK_NET", "socket"},
                                                      {"MK_SOCKET_IFNAME", "=lo"},
                                                      {"MK_SOCKET_NSTREAMS", "1"},
                                                      {"MK_TUNE", "simple_instances=4"},
                                                      {"MK_TIMEOUT_MS", "60000"}};
  v.push_back({"net_2x1_2proc", 2, true, 1, net_env, net_calls, 0, true, 2});
  v.push_back({"net_2x2_4proc", 4, true, 1, net_env, net_calls, 0, true, 2});
  // Ranks of one process as the nodes (MK_HOST_ID=node-0,node-1,...): their
  // kernels run concurrently on the one GPU; eager calls and CUDA graphs.
  auto net_all = [](World& w) {
    net_calls(w);
    graphs(w);
  };
  v.push_back({"net_2x1_1proc", 2, false, 1, net_env, net_all, 1, true, 2});
  v.push_back({"net_2x2_1proc", 4, false, 1, net_env, net_all, 1, true, 2});
  v.push_back({"net_sizes_2x1_1proc", 2, false, 1, net_env, net_sizes, 1, true, 2});
  v.push_back({"net_sizes_2x2_1proc", 4, false, 1, net_env, net_sizes, 1, true, 2});
  // What one node has, across nodes: PreMulSum, fused epilogues and
  // prologues, groups as one kernel, composites.
  v.push_back({"net_premulsum_2x1_1proc", 2, false, 1, net_env, premulsum, 1, true, 2});
  v.push_back({"net_fused_2x2_1proc", 4, false, 1, net_env, fused, 1, true, 2});
  v.push_back({"net_prologue_2x1_1proc", 2, false, 1, net_env, prologue, 1, true, 2});
  auto net_group_env = net_env;
  net_group_env["MK_GROUP_FUSE"] = "1";
  v.push_back({"net_group_fused_2x1_1proc", 2, false, 1, net_group_env, grouped, 1, true, 2});
  v.push_back({"net_composite_2x1_1proc", 2, false, 1, net_env, composites, 1, true, 2});
  auto net_fault_env = net_env;
  net_fault_env["MK_TIMEOUT_MS"] = "3000";
  v.push_back({"net_killed_peer_2proc", 2, true, 1, net_fault_env, net_killed_peer, 0, true, 2});
  v.push_back({"net_abort_tells_peer_2proc", 2, true, 1, net_env, abort_tells_peer, 0, true, 2});
  v.push_back({"stalled_rank_2proc", 2, true, 1, {{"MK_TIMEOUT_MS", "3000"}}, stalled_rank});
  v.push_back({"host_time_1rank", 1, false, 1, {}, host_time});
  // The runtime-trust scenarios (abort, sticky errors, first use in capture),
  // and worlds whose ranks share one GPU.
  v.push_back({"first_use_capture_1rank", 1, false, 1, {}, first_use_in_capture});
  v.push_back({"first_use_capture_2gpu_1proc", 2, false, 2, {}, first_use_in_capture});
  v.push_back({"first_use_capture_2gpu_2proc", 2, true, 2, {}, first_use_in_capture});
  v.push_back({"abort_race_2gpu_1proc", 2, false, 2, {}, abort_race});
  v.push_back({"abort_tells_peer_2proc", 2, true, 1, {{"MK_TIMEOUT_MS", "60000"}}, abort_tells_peer});
  v.push_back({"share_gpu_2ranks_1proc", 2, false, 1, {}, matrix, 1});
  v.push_back({"share_gpu_3ranks_1proc", 3, false, 1, {}, matrix, 1});
  v.push_back({"share_gpu_2ranks_2proc", 2, true, 1, {}, one_each, 1});
  v.push_back({"share_gpu_3ranks_3proc", 3, true, 1, {}, one_each, 1});
  v.push_back({"share_gpu_4ranks_1proc_4mib", 4, false, 1, {}, share_gpu_large, 1});
  // More ranks than the 8 operands generated code unrolls: reduces over every
  // rank and copies to every rank become wide ops (a loop over an operand list).
  v.push_back({"share_gpu_10ranks_1proc_wide", 10, false, 1, {}, one_each, 1});
  // Eight and six ranks in one process: the one-pass kernels (one-shot
  // all-reduce, Lamport packets for floats, LL for the rest), each rank
  // with a plan of its own code path; then the same with one code path for
  // every rank (MK_TUNE one_pass_generic=1: each rank's own input at its
  // place in the fixed order comes from its table row, kernel.cuh op_gpass),
  // with a prologue too, whose scaled sources are then told at run time.
  v.push_back({"share_gpu_8ranks_1proc", 8, false, 1, {}, matrix, 1});
  v.push_back({"share_gpu_6ranks_1proc", 6, false, 1, {}, one_each, 1});
  v.push_back({"premulsum_share_gpu_8ranks_1proc", 8, false, 1, {}, premulsum, 1});
  v.push_back({"prologue_share_gpu_8ranks_1proc", 8, false, 1, {}, prologue, 1});
  const std::map<std::string, std::string> generic = {{"MK_TUNE", "one_pass_generic=1"}};
  v.push_back({"generic_share_gpu_8ranks_1proc", 8, false, 1, generic, matrix, 1});
  v.push_back({"generic_share_gpu_6ranks_1proc", 6, false, 1, generic, one_each, 1});
  v.push_back({"generic_premulsum_share_gpu_8ranks_1proc", 8, false, 1, generic, premulsum, 1});
  v.push_back({"generic_prologue_share_gpu_8ranks_1proc", 8, false, 1, generic, prologue, 1});
  // Copy engines move all-gather, all-to-all and broadcast (runtime/launch/ce.hpp):
  // 64 KiB tiles, so that the suite's sizes cross many tiles and reuse slots.
  const std::map<std::string, std::string> ce_env = {
      {"MK_ALGO", "allgather=allgather.ce,alltoall=alltoall.ce,broadcast=broadcast.ce,reducescatter=reducescatter.ce,"
                  "allreduce=allreduce.ce"},
      {"MK_TUNE", "ce_tile=65536"}};
  auto ce_body = [](World& w) {
    matrix(w);
    boundaries(w);
    large(w, g_quick ? (4ll << 20) : (64ll << 20), true);
    graphs(w);
  };
  v.push_back({"copy_engine_2gpu_1proc", 2, false, 2, ce_env, ce_body});
  v.push_back({"copy_engine_2gpu_2proc", 2, true, 2, ce_env, ce_body});
  // Three ranks on one GPU: the copy-engine collectives alone (every dtype
  // and op, the matrix's sizes and 4 MiB, in place and out of place).
  auto ce_only = [](World& w) {
    uint64_t seed = 500;
    for (Collective c : {Collective::allgather, Collective::alltoall, Collective::broadcast,
                         Collective::reducescatter, Collective::allreduce})
      for (DType t : all_dtypes())
        for (RedOp o : collective_reduces(c) ? all_redops() : std::vector<RedOp>{RedOp::sum}) {
          std::vector<int64_t> counts = matrix_counts(t);
          counts.push_back((4 << 20) / int64_t(dtype_size(t)) / w.nranks);
          for (int64_t count : counts)
            for (bool inplace : {false, true}) {
              if (inplace && c == Collective::alltoall) continue;
              CallSpec s;
              s.coll = c;
              s.dtype = t;
              s.op = o;
              s.count = count;
              s.inplace = inplace;
              s.root = c == Collective::broadcast ? int(seed % uint64_t(w.nranks)) : 0;
              s.seed = seed++;
              run_checked(w, s);
            }
        }
  };
  v.push_back({"copy_engine_share_gpu_3ranks_1proc", 3, false, 1, ce_env, ce_only, 1});
  v.push_back({"split_4ranks_1proc", 4, false, 1, {}, split, 1});
  v.push_back({"split_2ranks_2proc", 2, true, 1, {}, split, 1});
  return v;
}

// Runs the body for one rank of a multi-process world (child process).
int run_rank(const Scenario& sc, const mkUniqueId& id, int rank, int ngpu) {
  World w;
  w.nranks = sc.nranks;
  w.multiprocess = true;
  Rank r;
  r.rank = rank;
  r.device = sc.devices_mode == 1 ? 0 : rank % ngpu;
  CK_CUDA(cudaSetDevice(r.device));
  CK_CUDA(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
  CK_MK(mkCommInitRank(&r.comm, sc.nranks, id, rank), nullptr);
  w.local.push_back(r);
  sc.body(w);
  for (Rank& x : w.local)
    if (x.comm) CK_MK(mkCommDestroy(x.comm), nullptr);
  return 0;
}

int child_main(const Scenario& sc, int ngpu, const mkUniqueId* id, int rank) {
  for (auto& [k, v] : sc.env) setenv(k.c_str(), v.c_str(), 1);
  if (sc.nodes > 1 && sc.multiprocess)
    setenv("MK_HOST_ID", ("node-" + std::to_string(rank * sc.nodes / sc.nranks)).c_str(), 1);
  if (sc.nodes > 1 && !sc.multiprocess) {  // ranks of this process as nodes: one name per rank
    std::string ids;
    for (int r = 0; r < sc.nranks; ++r) ids += (r ? ",node-" : "node-") + std::to_string(r * sc.nodes / sc.nranks);
    setenv("MK_HOST_ID", ids.c_str(), 1);
  }
  int rc = 0;
  try {
    if (sc.multiprocess) {
      rc = run_rank(sc, *id, rank, ngpu);
    } else {
      std::vector<int> devs;
      for (int r = 0; r < sc.nranks; ++r) devs.push_back(sc.devices_mode == 1 ? 0 : r % ngpu);
      World w = one_process(devs);
      sc.body(w);
      destroy(w);
    }
    if (g_checked) std::printf("    rank %d: %lld results checked\n", rank, (long long)g_checked);
  } catch (const std::exception& e) {
    std::printf("    FAILED (rank %d): %s\n", rank, e.what());
    rc = 1;
  }
  std::fflush(stdout);  // the child leaves with _exit
  return rc;
}

// Compiles every plan the scenarios need, on all cores, into the JIT cache
// (no GPU needed): the suite then spends its GPU time on GPUs.
int prewarm(int arch) {
  struct Want {
    std::string schedule;
    Collective coll;
    int n;
    DType t;
    RedOp o;
    bool zc;
    auto operator<=>(const Want&) const = default;
  };
  std::set<Want> wants;
  auto want = [&](std::initializer_list<int> ns, const std::vector<DType>& dtypes, const std::vector<RedOp>& ops,
                  bool zc) {
    for (int n : ns)
      for (Collective c : all_collectives())
        for (DType t : dtypes)
          for (RedOp o : collective_reduces(c) ? ops : std::vector<RedOp>{RedOp::sum})
            for (int64_t bytes : {int64_t(16), int64_t(1) << 30})
              wants.insert({rt::choose_schedule(c, n, bytes).schedule, c, n, t, o, zc});
  };
  want({1, 2, 3, 4}, all_dtypes(), all_redops(), false);
  want({1, 2}, kRegisteredDtypes, kRegisteredOps, true);  // the registered-buffer scenarios
  std::vector<Want> list(wants.begin(), wants.end());
  std::atomic<size_t> next{0};
  std::atomic<int> errors{0};
  auto t0 = std::chrono::steady_clock::now();
  unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (unsigned i = 0; i < threads; ++i)
    pool.emplace_back([&] {
      for (size_t k; (k = next++) < list.size();) {
        const Want& w = list[k];
        try {
          compiler::CompileOptions o;
          o.arch = arch;
          o.dtype = w.t;
          o.op = w.o;
          o.lower.zero_copy = w.zc;
          // The runtime JIT-compiles each rank's own plan (its rank class);
          // ranks of one class share the cubins (cached by source).
          const ir::Schedule built = dsl::build(*dsl::find_schedule(w.schedule), w.n, 0);
          for (int r = 0; r < w.n; ++r) {
            o.rank = r;
            compiler::compile_plan(built, o);
          }
        } catch (const std::exception& e) {
          std::printf("prewarm %s n=%d: %s\n", w.schedule.c_str(), w.n, e.what());
          ++errors;
        }
      }
    });
  for (auto& t : pool) t.join();
  std::printf("prewarm: %zu plans for sm_%d in %.1f s on %u threads, %d error(s)\n", list.size(), arch,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), threads, errors.load());
  return errors ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string only, skip;
  bool list = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick") g_quick = true;
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
    else if (a == "--skip" && i + 1 < argc) skip = argv[++i];
    else if (a == "--list") list = true;
    else if (a == "--prewarm" && i + 1 < argc) return prewarm(std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: %s [--quick] [--only NAME|=NAME] [--skip NAME] [--list] [--prewarm ARCH]\n", argv[0]);
      return 2;
    }
  }
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  auto all = scenarios();
  if (list) {
    for (auto& s : all) std::printf("%s\n", s.name.c_str());
    return 0;
  }
  // Count GPUs in a child: the parent must not initialise CUDA before forking.
  int ngpu = 0;
  {
    int pipefd[2];
    if (::pipe(pipefd) != 0) return 1;
    pid_t p = ::fork();
    if (p == 0) {
      int n = gpu_count();
      ssize_t w = ::write(pipefd[1], &n, sizeof n);
      (void)w;
      _exit(0);
    }
    ::close(pipefd[1]);
    if (::read(pipefd[0], &ngpu, sizeof ngpu) != sizeof ngpu) ngpu = 0;
    ::close(pipefd[0]);
    ::waitpid(p, nullptr, 0);
  }
  if (ngpu == 0) {
    std::printf("SKIPPED: no GPU on this machine (the GPU suite runs on the device machine: tests/gpu/run.sh)\n");
    return 0;
  }
  std::printf("mk_gpu_tests: %d GPU(s)%s\n", ngpu, g_quick ? ", quick mode" : "");
  int passed = 0, failed = 0, skipped = 0;
  for (auto& sc : all) {
    // --only NAME: every scenario whose name contains NAME; --only =NAME: that one
    if (!only.empty() && (only[0] == '=' ? sc.name != only.substr(1) : sc.name.find(only) == std::string::npos))
      continue;
    if (!skip.empty() && sc.name.find(skip) != std::string::npos) continue;
    if (sc.min_gpus > ngpu && !(sc.shareable && ngpu == 1)) {
      std::printf("SKIP %-32s needs %d GPUs\n", sc.name.c_str(), sc.min_gpus);
      ++skipped;
      continue;
    }
    if (sc.min_gpus > ngpu) {  // one GPU: every rank on it (correctness, not speed)
      sc.devices_mode = 1;
      sc.name += "@gpu0";
    }
    std::fflush(stdout);
    auto t0 = std::chrono::steady_clock::now();
    mkUniqueId id{};
    int nproc = sc.multiprocess ? sc.nranks : 1;
    if (sc.multiprocess) {
      // The rendezvous lives in this (CUDA-free) parent process.
      if (mkGetUniqueId(&id) != mkSuccess) {
        std::printf("FAIL %-32s mkGetUniqueId: %s\n", sc.name.c_str(), mkGetLastError(nullptr));
        ++failed;
        continue;
      }
    }
    std::vector<pid_t> kids;
    for (int r = 0; r < nproc; ++r) {
      pid_t p = ::fork();
      if (p == 0) _exit(child_main(sc, ngpu, sc.multiprocess ? &id : nullptr, r));
      kids.push_back(p);
    }
    const int limit_s = std::getenv("MK_TEST_LIMIT_S") ? std::atoi(std::getenv("MK_TEST_LIMIT_S")) : 900;
    bool ok = true;
    std::string why;
    for (size_t r = 0; r < kids.size(); ++r) {
      int status = 0;
      for (;;) {
        pid_t got = ::waitpid(kids[r], &status, WNOHANG);
        if (got == kids[r]) break;
        if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(limit_s)) {
          for (pid_t k : kids) ::kill(k, SIGKILL);
          ::waitpid(kids[r], &status, 0);
          why = "timed out (hang)";
          ok = false;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      const bool expected_kill = sc.name.find("killed_peer_2proc") != std::string::npos && r == 1;
      if (WIFSIGNALED(status) && !expected_kill) {
        ok = false;
        why = "rank " + std::to_string(r) + " died of signal " + std::to_string(WTERMSIG(status));
      } else if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
        ok = false;
        if (why.empty()) why = "rank " + std::to_string(r) + " failed";
      }
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%s %-32s %7.1f s%s%s\n", ok ? "PASS" : "FAIL", sc.name.c_str(), secs, ok ? "" : "  ", why.c_str());
    std::fflush(stdout);
    ok ? ++passed : ++failed;
  }
  std::printf("mk_gpu_tests: %d passed, %d failed, %d skipped\n", passed, failed, skipped);
  return failed ? 1 : 0;
}
