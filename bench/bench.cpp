// mk_bench: mKernel and NCCL side by side, in the same run, on the same
// buffers, as strictly as nccl-tests (`mk_bench --help`; bench/NOTES.md says
// what the numbers can and cannot show).
//
// Two ways to place the ranks:
//  - one process per GPU (default; forked, like torchrun): both libraries;
//  - --share-gpu: every rank on GPU 0, all in this one process (one CUDA
//    context, mkCommInitAll, one thread issuing grouped calls), mKernel only
//    (NCCL refuses a GPU twice). The ranks' kernels run concurrently, with
//    peers' memory being local HBM: a proxy of the kernels' own efficiency,
//    never of NVLink. (Ranks as processes sharing a GPU are time-sliced and
//    measure nothing; that is why this mode uses one process.)
//
// Per size, per library, per placement (out-of-place, in-place): one checked
// call, warm-up, then `batches` timed batches of `iters` calls, the libraries
// alternating batch by batch. Before each batch every process meets at a
// barrier; a batch's time is the slowest rank's (CUDA events); the table gives
// p10/p50/p90 over batches. Correct while timing: out-of-place calls rotate
// over several input sets (the last call's set differs from the one before),
// the outputs are poisoned (NaN) before each batch, and the last timed output
// of every batch is checked on the GPU against the exact result computed
// there (bench/data.hpp). In-place batches overwrite their input, so each is
// followed by one untimed in-place call on fresh input, checked the same way.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "bench/data.hpp"
#include "bench/report.hpp"
#include "mk_git_commit.hpp"  // generated at build time (cmake/git_commit.cmake)
#include "compiler/jit/jit.hpp"
#include "compiler/verify/reference.hpp"
#include "bench/nccl_loader.hpp"
#include "mk.h"
#include "mk/types.hpp"

using namespace mk;

namespace {

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "mk_bench: %s\n", what.c_str());
  std::fflush(stderr);
  _exit(1);
}

#define CK(x)                                                                                                     \
  do {                                                                                                            \
    cudaError_t e_ = (x);                                                                                         \
    if (e_ != cudaSuccess) die(std::string(#x) + " failed: " + cudaGetErrorString(e_) + " (line " +               \
                               std::to_string(__LINE__) + ")");                                                   \
  } while (0)

using mkbench::Nccl;
using mkbench::load_nccl;

struct Options {
  int ranks = 2;
  std::vector<Collective> colls = {Collective::allreduce, Collective::allgather, Collective::reducescatter};
  DType dtype = DType::bf16;
  int64_t min_bytes = 8, max_bytes = int64_t(256) << 20;
  int factor = 2;
  int iters = 0;  // 0: by size (50 up to 4 MiB, 20 up to 64 MiB, 10 above)
  int batches = 20;
  int warmup_ms = 100;
  int sets = 3;
  bool graph = false, reg = false, share = false, l2cold = false, nccl = true;
  bool outofplace = true, inplace = true;
  bool prewarm = false;    // mkCommPrewarm before timing (compiles the plans on every core)
  bool premul = false;     // reducing collectives with a PreMulSum op of scalar 1 (both libraries)
  bool probe = true;       // ask NCCL which algorithm/protocol it ran (a separate run with NCCL_DEBUG)
  bool probe_only = false;  // internal: that run
  std::string md, json_out, csv_out, svg_out, label, command;
};

int iters_for(const Options& o, int64_t bytes) {
  if (o.iters > 0) return o.iters;
  return bytes <= (int64_t(4) << 20) ? 50 : bytes <= (int64_t(64) << 20) ? 20 : 10;
}

// Per-rank element count such that the collective's larger buffer is `bytes`.
int64_t count_for(Collective c, int n, int64_t bytes, size_t es) {
  const int64_t total = bytes / int64_t(es) / std::max(input_blocks(c, n), output_blocks(c, n));
  return std::max<int64_t>(total, 1);
}

// ---- shared memory between the rank processes ----------------------------------

constexpr int kMaxRanks = 64;
constexpr int kMaxBatches = 1000;
struct Shm {
  std::atomic<int> arrived, generation, abort;
  // per (library, placement, batch): each rank's batch time (us per call)
  double times[2][2][kMaxBatches][kMaxRanks];
  long long wrong[2][2][kMaxRanks], checked[2][2][kMaxRanks];
  char first_bad[2][2][kMaxRanks][160];
  char fatal[512];
};

Shm* g_shm = nullptr;
int g_processes = 1;

void barrier() {
  const int gen = g_shm->generation.load();
  if (g_shm->arrived.fetch_add(1) + 1 == g_processes) {
    g_shm->arrived.store(0);
    g_shm->generation.fetch_add(1);
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  while (g_shm->generation.load() == gen) {
    if (g_shm->abort.load()) die("another rank failed; stopping");
    if (std::chrono::steady_clock::now() - t0 > std::chrono::minutes(10)) die("a rank did not reach the barrier in 10 min");
    std::this_thread::yield();
  }
}

// ---- the bench's helper kernels (bench/data.hpp) --------------------------------

struct Helpers {
  cudaKernel_t fill = nullptr, check = nullptr;
};

Helpers load_helpers(int device) {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, device));
  const int arch = prop.major * 10 + prop.minor;
  jit::CompileResult r;
  try {
    r = jit::compile(mkb::kernel_source(), "mk_bench_data", arch);
  } catch (const std::exception& e) {
    die(std::string("compiling the bench's check kernels: ") + e.what());
  }
  cudaLibrary_t lib;
  CK(cudaLibraryLoadData(&lib, r.cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
  Helpers h;
  CK(cudaLibraryGetKernel(&h.fill, lib, "mkb_fill"));
  CK(cudaLibraryGetKernel(&h.check, lib, "mkb_check"));
  return h;
}

// ---- one process's ranks ------------------------------------------------------------

struct Buffers {
  char* arena = nullptr;
  size_t bytes = 0;
  void* mk_handle = nullptr;  // mkCommRegister
  ncclWindow_t win = nullptr;
  bool nccl_mem = false;      // from ncclMemAlloc
  std::vector<char*> in, out, io;  // input sets, outputs (out-of-place); in-place buffers
};

struct Local {
  int rank = 0, device = 0;
  mkComm_t mk = nullptr;
  ncclComm_t nccl = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  mkRedOp_t mk_op = mkSum;        // --premulsum: this rank's PreMulSum ops
  ncclRedOp_t nccl_op = ncclSum;
  Buffers buf[2];                  // [library]: the same buffers unless --register
  unsigned long long* res = nullptr;  // [lib][placement][2] device counters
  int* srcs = nullptr;                // device: output block sources
};

struct Process {
  const Options& o;
  Nccl nc;
  std::vector<Local> L;
  Helpers h;
  int nranks;
  size_t es;
  int kind;
  std::vector<mkb::Row> rows;  // filled on the process holding rank 0
  std::map<std::pair<int, int64_t>, std::string>* algo = nullptr;
};

// The call of collective `c` on local rank `l` with library `lib` (0 NCCL, 1 mKernel).
void call(Process& P, Local& l, int lib, Collective c, const void* in, void* out, int64_t count) {
  const size_t n = size_t(count);
  if (lib == 1) {
    const auto dt = mkDataType_t(int(P.o.dtype));
    mkResult_t r = mkSuccess;
    switch (c) {
      case Collective::allreduce: r = mkAllReduce(in, out, n, dt, l.mk_op, l.mk, l.stream); break;
      case Collective::allgather: r = mkAllGather(in, out, n, dt, l.mk, l.stream); break;
      case Collective::reducescatter: r = mkReduceScatter(in, out, n, dt, l.mk_op, l.mk, l.stream); break;
      case Collective::broadcast: r = mkBroadcast(in, out, n, dt, 0, l.mk, l.stream); break;
      case Collective::reduce: r = mkReduce(in, out, n, dt, l.mk_op, 0, l.mk, l.stream); break;
      case Collective::alltoall: r = mkAllToAll(in, out, n, dt, l.mk, l.stream); break;
    }
    if (r != mkSuccess) die(std::string("mKernel ") + std::string(name(c)) + " failed: " + mkGetLastError(l.mk));
  } else {
    const auto dt = ncclDataType_t(int(P.o.dtype));
    const Nccl& nc = P.nc;
    ncclResult_t r = ncclSuccess;
    switch (c) {
      case Collective::allreduce: r = nc.allReduce(in, out, n, dt, l.nccl_op, l.nccl, l.stream); break;
      case Collective::allgather: r = nc.allGather(in, out, n, dt, l.nccl, l.stream); break;
      case Collective::reducescatter: r = nc.reduceScatter(in, out, n, dt, l.nccl_op, l.nccl, l.stream); break;
      case Collective::broadcast: r = nc.broadcast(in, out, n, dt, 0, l.nccl, l.stream); break;
      case Collective::reduce: r = nc.reduce(in, out, n, dt, l.nccl_op, 0, l.nccl, l.stream); break;
      case Collective::alltoall: r = nc.alltoAll(in, out, n, dt, l.nccl, l.stream); break;
    }
    if (r != ncclSuccess) die(std::string("NCCL ") + std::string(name(c)) + " failed: " + nc.errorString(r));
  }
}


// ---- one size -------------------------------------------------------------------------

// Where call g (a counter over the size's calls) finds its buffers: input set
// g % sets, output g % outs, in-place buffer g % ios. Offsets in the arena.
struct Layout {
  Collective c;
  int64_t bytes, count, ie, oe, ioe;  // elements: input, output, in-place buffer
  size_t in_span, out_span, io_span;  // bytes, 256-aligned
  int sets, outs, ios;
  size_t in_at = 0, out_at = 0, io_at = 0, total = 0;
  int iters;
  bool inplace;  // the collective has an in-place form

  char* in(Buffers& b, int64_t g) const { return b.arena + in_at + size_t(g % sets) * in_span; }
  char* out(Buffers& b, int64_t g) const { return b.arena + out_at + size_t(g % outs) * out_span; }
  char* io(Buffers& b, int64_t g) const { return b.arena + io_at + size_t(g % ios) * io_span; }
  unsigned set_of(int64_t g) const { return unsigned(g % sets); }
};

size_t span(int64_t bytes) { return size_t((bytes + 255) / 256 * 256); }

Layout make_layout(const Options& o, Collective c, int64_t bytes, int nranks, size_t es) {
  Layout y;
  y.c = c;
  y.count = count_for(c, nranks, bytes, es);
  y.bytes = std::max(input_blocks(c, nranks), output_blocks(c, nranks)) * y.count * int64_t(es);
  y.ie = verify::input_elems(c, nranks, y.count);
  y.oe = verify::output_elems(c, nranks, y.count);
  y.ioe = std::max(y.ie, y.oe);
  y.in_span = span(y.ie * int64_t(es));
  y.out_span = span(y.oe * int64_t(es));
  y.io_span = span(y.ioe * int64_t(es));
  y.inplace = inplace_rule(c) != InPlace::unsupported;
  y.iters = iters_for(o, y.bytes);
  int pairs = 1;
  if (o.l2cold) {
    int dev = 0;
    CK(cudaGetDevice(&dev));
    int l2 = 0;
    CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    pairs = int(std::min<int64_t>(1 << 20, (2 * int64_t(l2) + int64_t(y.in_span + y.out_span) - 1) /
                                               int64_t(y.in_span + y.out_span)));
    pairs = std::max(pairs, 1);
  }
  y.sets = std::max(o.sets, pairs);
  y.outs = pairs;
  y.ios = o.inplace && y.inplace ? pairs : 0;
  y.in_at = 0;
  y.out_at = y.in_at + size_t(y.sets) * y.in_span;
  y.io_at = y.out_at + size_t(y.outs) * y.out_span;
  y.total = y.io_at + size_t(y.ios) * y.io_span;
  return y;
}

// Send and receive pointers of call g on rank `rank`.
void pointers(const Layout& y, Buffers& b, int pl, int64_t g, int rank, size_t es, const void** in, void** out) {
  if (pl == 0) {
    *in = y.in(b, g);
    *out = y.out(b, g);
    return;
  }
  char* base = y.io(b, g);
  *in = base + size_t(inplace_input_block(y.c, rank)) * size_t(y.count) * es;
  *out = base + size_t(inplace_output_block(y.c, rank)) * size_t(y.count) * es;
}

void alloc_buffers(Process& P, Local& l, const Layout& y) {
  const bool separate = P.o.reg;
  for (int lib = 0; lib < 2; ++lib) {
    Buffers& b = l.buf[lib];
    b = Buffers{};
    if (!separate && lib == 0) continue;  // aliases lib 1's below
    if (lib == 0 && !P.o.nccl) continue;
    b.bytes = std::max<size_t>(y.total, 256);
    if (lib == 0 && P.nc.memAlloc) {
      if (P.nc.memAlloc(reinterpret_cast<void**>(&b.arena), b.bytes) != ncclSuccess) die("ncclMemAlloc failed");
      b.nccl_mem = true;
      if (!P.nc.windowRegister ||
          P.nc.windowRegister(l.nccl, b.arena, b.bytes, &b.win, NCCL_WIN_COLL_SYMMETRIC) != ncclSuccess)
        die("ncclCommWindowRegister failed");
    } else {
      CK(cudaMalloc(reinterpret_cast<void**>(&b.arena), b.bytes));
      if (lib == 0) die("--register needs ncclMemAlloc (NCCL 2.19 or later)");
      // (the NCCL probe run has no mKernel communicator: nothing to register)
      if (separate && l.mk && mkCommRegister(l.mk, b.arena, b.bytes, &b.mk_handle) != mkSuccess)
        die(std::string("mkCommRegister failed: ") + mkGetLastError(l.mk));
    }
  }
  if (!separate) l.buf[0] = l.buf[1], l.buf[0].mk_handle = nullptr;
}

void free_buffers(Process& P, Local& l) {
  for (int lib = 1; lib >= 0; --lib) {
    Buffers& b = l.buf[lib];
    if (!b.arena) continue;
    if (!P.o.reg && lib == 0) {  // an alias of lib 1's
      b = Buffers{};
      continue;
    }
    if (b.mk_handle && mkCommDeregister(l.mk, b.mk_handle) != mkSuccess)
      die(std::string("mkCommDeregister failed: ") + mkGetLastError(l.mk));
    if (b.win && P.nc.windowDeregister(l.nccl, b.win) != ncclSuccess) die("ncclCommWindowDeregister failed");
    if (b.nccl_mem) {
      if (P.nc.memFree(b.arena) != ncclSuccess) die("ncclMemFree failed");
    } else {
      CK(cudaFree(b.arena));
    }
    b = Buffers{};
  }
}

void fill(Process& P, Local& l, void* dst, int64_t n, unsigned set) {
  if (n <= 0) return;
  long long nn = n;
  unsigned rank = unsigned(l.rank);
  int K = mkb::unit_range(P.nranks), kind = P.kind, bytes = int(P.es);
  void* args[] = {&dst, &nn, &rank, &set, &K, &kind, &bytes};
  const int grid = int(std::min<int64_t>(2048, (n + 255) / 256));
  CK(cudaLaunchKernel(reinterpret_cast<const void*>(P.h.fill), dim3(unsigned(grid)), dim3(256), args, 0, l.stream));
}

// Checks rank l's output of the call that used input set `set`.
void check(Process& P, Local& l, const Layout& y, const void* out, int lib, int pl, unsigned set) {
  if (!has_output(y.c, l.rank, 0)) return;
  long long count = y.count;
  int nblocks = output_blocks(y.c, P.nranks), nranks = P.nranks;
  int K = mkb::unit_range(P.nranks), kind = P.kind, bytes = int(P.es);
  const int* srcs = l.srcs;
  unsigned long long* res = l.res + (lib * 2 + pl) * 2;
  void* args[] = {&out, &count, &nblocks, &srcs, &nranks, &set, &K, &kind, &bytes, &res};
  const int grid = int(std::min<int64_t>(2048, (count * nblocks + 255) / 256));
  CK(cudaLaunchKernel(reinterpret_cast<const void*>(P.h.check), dim3(unsigned(grid)), dim3(256), args, 0, l.stream));
}

// Call g of every local rank (one group when this process holds several).
void call_all(Process& P, const Layout& y, int lib, int pl, int64_t g) {
  const bool group = P.L.size() > 1;
  if (group && lib == 0) die("NCCL with several ranks in one process is not supported by the bench");
  if (group && mkGroupStart() != mkSuccess) die("mkGroupStart failed");
  for (Local& l : P.L) {
    const void* in;
    void* out;
    pointers(y, l.buf[lib], pl, g, l.rank, P.es, &in, &out);
    call(P, l, lib, y.c, in, out, y.count);
  }
  if (group && mkGroupEnd() != mkSuccess) die(std::string("mkGroupEnd failed: ") + mkGetLastError(P.L[0].mk));
}

void sync_all(Process& P) {
  for (Local& l : P.L) CK(cudaStreamSynchronize(l.stream));
}

// Fresh input for an in-place call g: the buffer poisoned, the input part filled.
void prepare_inplace(Process& P, const Layout& y, int lib, int64_t g, uint8_t poison) {
  for (Local& l : P.L) {
    const void* in;
    void* out;
    pointers(y, l.buf[lib], 1, g, l.rank, P.es, &in, &out);
    CK(cudaMemsetAsync(y.io(l.buf[lib], g), poison, size_t(y.ioe) * P.es, l.stream));
    if (has_input(y.c, l.rank, 0)) fill(P, l, const_cast<void*>(in), y.ie, y.set_of(g));
  }
}

// One in-place call on fresh input, checked (untimed).
void checked_inplace(Process& P, const Layout& y, int lib, int64_t g, uint8_t poison) {
  prepare_inplace(P, y, lib, g, poison);
  call_all(P, y, lib, 1, g);
  for (Local& l : P.L) {
    const void* in;
    void* out;
    pointers(y, l.buf[lib], 1, g, l.rank, P.es, &in, &out);
    check(P, l, y, out, lib, 1, y.set_of(g));
  }
}

// One CUDA graph per local rank, each of `iters` calls on that rank's stream.
// Every stream captures at once (the calls of one group span them); each
// rank's graph is then launched on its own stream, as NCCL users do: one
// graph holding every rank's kernels as branches would leave it to the graph
// executor whether the branches (which wait for each other) run concurrently.
std::vector<cudaGraphExec_t> capture(Process& P, const Layout& y, int lib, int pl) {
  for (Local& l : P.L) CK(cudaStreamBeginCapture(l.stream, cudaStreamCaptureModeThreadLocal));
  for (int64_t i = 0; i < y.iters; ++i) call_all(P, y, lib, pl, i);
  std::vector<cudaGraph_t> g(P.L.size());
  for (size_t i = 0; i < P.L.size(); ++i) CK(cudaStreamEndCapture(P.L[i].stream, &g[i]));
  std::vector<cudaGraphExec_t> exec(P.L.size());
  for (size_t i = 0; i < P.L.size(); ++i) {
    CK(cudaGraphInstantiate(&exec[i], g[i], 0));
    CK(cudaGraphDestroy(g[i]));
  }
  return exec;
}

void launch_graphs(Process& P, const std::vector<cudaGraphExec_t>& exec) {
  for (size_t i = 0; i < P.L.size(); ++i) CK(cudaGraphLaunch(exec[i], P.L[i].stream));
}

void run_size(Process& P, Collective c, int64_t bytes, bool first_size) {
  const Options& o = P.o;
  const Layout y = make_layout(o, c, bytes, P.nranks, P.es);
  const uint8_t poison = P.kind == 0 ? 0xA5 : 0xFF;  // NaN in every float format
  const int libs[2] = {0, 1};
  const bool lib_on[2] = {o.nccl, !o.probe_only};
  const bool pl_on[2] = {o.outofplace, o.inplace && y.inplace && !o.probe_only};
  for (Local& l : P.L) {
    alloc_buffers(P, l, y);
    // the output's sources, and zeroed counters (first bad: all ones)
    std::vector<int> srcs;
    for (int b = 0; b < output_blocks(c, P.nranks); ++b) {
      const auto s = output_source(c, 0, l.rank, b);
      srcs.push_back(s.from == BlockSource::kAllRanks ? -1 : s.from);
      srcs.push_back(s.in_block);
    }
    CK(cudaMemcpy(l.srcs, srcs.data(), srcs.size() * sizeof(int), cudaMemcpyHostToDevice));
    unsigned long long init[8] = {0, ~0ull, 0, ~0ull, 0, ~0ull, 0, ~0ull};
    CK(cudaMemcpy(l.res, init, sizeof init, cudaMemcpyHostToDevice));
    for (int lib = 0; lib < 2; ++lib) {
      if (!lib_on[lib] || (lib == 0 && !o.reg)) continue;
      for (int s = 0; s < y.sets; ++s)
        if (has_input(c, l.rank, 0)) fill(P, l, y.in(l.buf[lib], s), y.ie, unsigned(s));
    }
  }
  sync_all(P);
  barrier();
  if (o.probe_only) {  // NCCL's algorithm choice: one call, logged by NCCL
    call_all(P, y, 0, 0, 0);
    sync_all(P);
    for (Local& l : P.L) free_buffers(P, l);
    barrier();
    return;
  }
  // A checked call, warm-up and (with -G) the graph per library and placement.
  std::vector<cudaGraphExec_t> graph[2][2];
  for (int lib : libs) {
    if (!lib_on[lib]) continue;
    for (int pl = 0; pl < 2; ++pl) {
      if (!pl_on[pl]) continue;
      if (pl == 0) {
        for (Local& l : P.L) CK(cudaMemsetAsync(y.out(l.buf[lib], 0), poison, size_t(y.oe) * P.es, l.stream));
        call_all(P, y, lib, 0, 0);
        for (Local& l : P.L) check(P, l, y, y.out(l.buf[lib], 0), lib, 0, 0);
      } else {
        checked_inplace(P, y, lib, 0, poison);
      }
      const auto t0 = std::chrono::steady_clock::now();
      int64_t g = 1;
      do {
        for (int i = 0; i < y.iters; ++i, ++g) call_all(P, y, lib, pl, g);
        sync_all(P);
      } while (first_size && std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(o.warmup_ms));
      if (o.graph) {
        graph[lib][pl] = capture(P, y, lib, pl);
        launch_graphs(P, graph[lib][pl]);
        sync_all(P);
      }
    }
  }
  sync_all(P);
  barrier();
  // Timed batches, libraries alternating which goes first.
  const int nb = std::min(o.batches, kMaxBatches);
  std::vector<int> on;
  for (int lib : libs)
    if (lib_on[lib]) on.push_back(lib);
  int64_t gcount[2][2] = {{1, 1}, {1, 1}};
  long long checks[2][2] = {};
  for (int b = 0; b < nb; ++b) {
    for (size_t k = 0; k < on.size(); ++k) {
      const int lib = on[(size_t(b) + k) % on.size()];
      for (int pl = 0; pl < 2; ++pl) {
        if (!pl_on[pl]) continue;
        if (pl == 0)  // the outputs this batch writes
          for (Local& l : P.L)
            for (int q = 0; q < y.outs && q < y.iters; ++q)
              CK(cudaMemsetAsync(y.out(l.buf[lib], (graph[lib][pl].empty() ? gcount[lib][pl] : 0) + q), poison,
                                 size_t(y.oe) * P.es, l.stream));
        sync_all(P);
        barrier();
        for (Local& l : P.L) CK(cudaEventRecord(l.e0, l.stream));
        int64_t last;
        if (!graph[lib][pl].empty()) {
          launch_graphs(P, graph[lib][pl]);
          last = y.iters - 1;
        } else {
          int64_t& g = gcount[lib][pl];
          for (int i = 0; i < y.iters; ++i, ++g) call_all(P, y, lib, pl, g);
          last = g - 1;
        }
        for (Local& l : P.L) CK(cudaEventRecord(l.e1, l.stream));
        if (pl == 0) {
          for (Local& l : P.L) check(P, l, y, y.out(l.buf[lib], last), lib, 0, y.set_of(last));
        } else {
          checked_inplace(P, y, lib, int64_t(b) + 1, poison);
        }
        ++checks[lib][pl];
        double worst = 0;
        for (Local& l : P.L) {
          CK(cudaEventSynchronize(l.e1));
          float ms = 0;
          CK(cudaEventElapsedTime(&ms, l.e0, l.e1));
          worst = std::max(worst, double(ms) * 1000.0 / y.iters);
        }
        for (Local& l : P.L) g_shm->times[lib][pl][b][l.rank] = worst;
      }
    }
  }
  sync_all(P);
  for (Local& l : P.L) {
    unsigned long long res[8];
    CK(cudaMemcpy(res, l.res, sizeof res, cudaMemcpyDeviceToHost));
    for (int lib = 0; lib < 2; ++lib)
      for (int pl = 0; pl < 2; ++pl) {
        const unsigned long long w = res[(lib * 2 + pl) * 2], first = res[(lib * 2 + pl) * 2 + 1];
        g_shm->wrong[lib][pl][l.rank] = (long long)w;
        g_shm->checked[lib][pl][l.rank] = has_output(c, l.rank, 0) ? checks[lib][pl] + 1 : 0;
        std::string fb;
        if (w) {
          const int64_t blk = int64_t(first) / y.count;
          fb = "rank " + std::to_string(l.rank) + " output element " + std::to_string(first) + " (block " +
               std::to_string(blk) + ", element " + std::to_string(int64_t(first) % y.count) + ")";
        }
        std::snprintf(g_shm->first_bad[lib][pl][l.rank], sizeof g_shm->first_bad[0][0][0], "%s", fb.c_str());
      }
  }
  for (int lib = 0; lib < 2; ++lib)
    for (int pl = 0; pl < 2; ++pl)
      for (auto e : graph[lib][pl]) CK(cudaGraphExecDestroy(e));
  for (Local& l : P.L) free_buffers(P, l);
  barrier();
  bool holds_rank0 = false;
  for (Local& l : P.L) holds_rank0 |= l.rank == 0;
  if (!holds_rank0) return;
  mkb::Row row;
  row.coll = c;
  row.bytes = y.bytes;
  row.count = y.count;
  row.dtype = o.dtype;
  row.op = o.premul ? RedOp::premulsum : RedOp::sum;
  row.root = collective_rooted(c) ? 0 : -1;
  for (int lib = 0; lib < 2; ++lib)
    for (int pl = 0; pl < 2; ++pl) {
      mkb::Timing& t = (lib == 0 ? row.nccl : row.mk)[pl];
      if (!lib_on[lib] || !pl_on[pl]) continue;
      t.ran = true;
      std::vector<double> per;
      for (int b = 0; b < nb; ++b) {
        double w = 0;
        for (int r = 0; r < P.nranks; ++r) w = std::max(w, g_shm->times[lib][pl][b][r]);
        per.push_back(w);
      }
      mkb::percentiles(per, &t.p10, &t.p50, &t.p90);
      for (int r = 0; r < P.nranks; ++r) {
        t.wrong += g_shm->wrong[lib][pl][r];
        t.checked += g_shm->checked[lib][pl][r];
        if (t.first_bad.empty() && g_shm->first_bad[lib][pl][r][0]) t.first_bad = g_shm->first_bad[lib][pl][r];
      }
    }
  P.rows.push_back(row);
  const double f = mkb::busbw_factor(c, P.nranks);
  auto cell = [&](const mkb::Timing& t) {
    char b[96];
    if (!t.ran) return std::string("         -");
    std::snprintf(b, sizeof b, "%9.2f us %7.1f GB/s %s", t.p50, double(y.bytes) / t.p50 / 1e3 * f,
                  t.wrong ? "WRONG" : "ok");
    return std::string(b);
  };
  std::printf("  %-13s %10s  NCCL %s | %s   mKernel %s | %s\n", std::string(name(c)).c_str(),
              mkb::human_bytes(y.bytes).c_str(), cell(row.nccl[0]).c_str(), cell(row.nccl[1]).c_str(),
              cell(row.mk[0]).c_str(), cell(row.mk[1]).c_str());
  std::fflush(stdout);
}

// ---- results ----------------------------------------------------------------------

std::map<std::pair<int, int64_t>, std::string> g_algos;  // (collective, NCCL's bytes) -> "ALGO/PROTO"
std::vector<std::string> g_notes;
int g_nccl_version = 0;

std::string gpu_clocks() {
  FILE* f = popen("nvidia-smi --query-gpu=index,name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw "
                  "--format=csv,noheader 2>/dev/null",
                  "r");
  if (!f) return "nvidia-smi: not run";
  std::string s;
  char line[512];
  while (std::fgets(line, sizeof line, f)) {
    std::string l = line;
    while (!l.empty() && (l.back() == '\n' || l.back() == '\r')) l.pop_back();
    s += (s.empty() ? "" : "; ") + l;
  }
  pclose(f);
  return s.empty() ? "nvidia-smi: no output" : s;
}

void write_file(const std::string& path, const std::string& text) {
  if (path.empty()) return;
  std::ofstream f(path);
  f << text;
  if (!f) die("cannot write " + path);
}

void write_reports(const Options& o, std::vector<mkb::Row>& rows) {
  for (auto& r : rows) {
    auto it = g_algos.find({int(r.coll), r.count * int64_t(dtype_size(r.dtype))});
    if (it != g_algos.end()) r.nccl_algo = it->second;
  }
  mkb::RunInfo info;
  const std::string where = std::to_string(o.ranks) +
                            (o.share ? " ranks sharing GPU 0 (one process)" : " ranks, one process per GPU");
  info.title = (o.nccl ? "mKernel vs NCCL " + std::to_string(g_nccl_version / 10000) + "." +
                             std::to_string(g_nccl_version / 100 % 100) + "." + std::to_string(g_nccl_version % 100)
                       : std::string("mKernel")) +
               ": " + where + ", " + std::string(name(o.dtype)) + " sum, " +
               (o.graph ? "CUDA graphs" : "eager launches") +
               (o.reg ? ", buffers registered (mkCommRegister; NCCL: ncclMemAlloc + symmetric window)" : "") +
               (o.l2cold ? ", L2-cold (buffers rotated over > 2x L2)" : "");
  info.command = o.command;
  info.label = o.label;
  int version = 0;
  mkGetVersion(&version);
  info.build = "mKernel " + std::to_string(version) + " (the library), mk_bench built from commit " + MK_GIT_COMMIT;
  info.nranks = o.ranks;
  info.nccl = o.nccl;
  if (o.share)
    info.proxy_note = "1 GPU, ranks sharing it (one process, concurrent kernels): peers' memory is local HBM, so "
                      "this is a proxy of the kernels' efficiency, not of NVLink; NCCL cannot run this way";
  info.notes = g_notes;
  info.notes.push_back("clocks at the end: " + gpu_clocks());
  const std::string md = mkb::markdown(info, rows);
  std::printf("\n%s", md.c_str());
  write_file(o.md, md);
  write_file(o.json_out, mkb::json(info, rows));
  write_file(o.csv_out, mkb::csv(info, rows));
  write_file(o.svg_out, mkb::svg(info, rows));
}

std::vector<int64_t> sizes(const Options& o) {
  std::vector<int64_t> v;
  for (int64_t b = o.min_bytes; b <= o.max_bytes; b *= o.factor) {
    v.push_back(b);
    if (o.factor <= 1) break;
  }
  return v;
}

// One process: ranks [first, first + n) on their GPUs. The process holding
// rank 0 writes the results.
void process_main(const Options& o, int first, int n, const ncclUniqueId& nid, const mkUniqueId& mid) {
  Process P{o, {}, {}, {}, o.ranks, dtype_size(o.dtype), mkb::dtype_kind(o.dtype), {}, nullptr};
  std::string why;
  if (o.nccl && !load_nccl(&P.nc, &why)) die("cannot load NCCL: " + why);
  P.L.resize(size_t(n));
  for (int i = 0; i < n; ++i) {
    P.L[size_t(i)].rank = first + i;
    P.L[size_t(i)].device = o.share ? 0 : first + i;
  }
  CK(cudaSetDevice(P.L[0].device));
  if (o.share) {
    std::vector<mkComm_t> comms(static_cast<size_t>(n));
    std::vector<int> devs(size_t(n), 0);
    if (mkCommInitAll(comms.data(), n, devs.data()) != mkSuccess)
      die(std::string("mkCommInitAll failed: ") + mkGetLastError(nullptr));
    for (int i = 0; i < n; ++i) P.L[size_t(i)].mk = comms[size_t(i)];
  } else {
    Local& l = P.L[0];
    if (o.nccl && P.nc.commInitRank(&l.nccl, o.ranks, nid, l.rank) != ncclSuccess) die("ncclCommInitRank failed");
    if (!o.probe_only && mkCommInitRank(&l.mk, o.ranks, mid, l.rank) != mkSuccess)
      die(std::string("mkCommInitRank failed: ") + mkGetLastError(nullptr));
  }
  P.h = load_helpers(P.L[0].device);
  if (o.premul) {
    // Scalar 1 in the dtype: the outputs stay the sum the checker expects,
    // and the kernels still scale every input (the time of the prologue).
    const int kind = mkb::dtype_kind(o.dtype);
    const unsigned long long one = mkb::to_bits(kind == 0 ? 1 : 4, kind, int(dtype_size(o.dtype)));
    for (Local& l : P.L) {
      unsigned long long v = one;
      if (l.mk && mkRedOpCreatePreMulSum(&l.mk_op, &v, mkDataType_t(int(o.dtype)), mkScalarHostImmediate, l.mk) !=
                      mkSuccess)
        die(std::string("mkRedOpCreatePreMulSum failed: ") + mkGetLastError(l.mk));
      if (l.nccl) {
        if (!P.nc.redOpCreatePreMulSum) die("this NCCL has no ncclRedOpCreatePreMulSum");
        if (P.nc.redOpCreatePreMulSum(&l.nccl_op, &v, ncclDataType_t(int(o.dtype)), ncclScalarHostImmediate,
                                      l.nccl) != ncclSuccess)
          die("ncclRedOpCreatePreMulSum failed");
      }
    }
  }
  if (o.prewarm && !o.probe_only) {
    const auto dt = mkDataType_t(int(o.dtype));
    const mkRedOp_t op = mkSum;
    for (Local& l : P.L)
      if (mkCommPrewarm(l.mk, &dt, 1, &op, 1, 0) != mkSuccess)
        die(std::string("mkCommPrewarm failed: ") + mkGetLastError(l.mk));
  }
  for (Local& l : P.L) {
    CK(cudaStreamCreateWithFlags(&l.stream, cudaStreamNonBlocking));
    CK(cudaEventCreate(&l.e0));
    CK(cudaEventCreate(&l.e1));
    CK(cudaMalloc(reinterpret_cast<void**>(&l.res), 8 * sizeof(unsigned long long)));
    CK(cudaMalloc(reinterpret_cast<void**>(&l.srcs), size_t(2 * o.ranks) * sizeof(int)));
  }
  bool first_size = true;
  for (Collective c : o.colls) {
    for (int64_t b : sizes(o)) {
      run_size(P, c, b, first_size);
      first_size = false;
    }
  }
  if (!P.rows.empty()) write_reports(o, P.rows);
  sync_all(P);
  for (Local& l : P.L) {
    if (l.mk) mkCommDestroy(l.mk);
    if (l.nccl) P.nc.commDestroy(l.nccl);
  }
}

const char* kUsage =
    "usage: mk_bench [options]\n"
    "  -g, --ranks N          ranks (default 2): one process per GPU, or with --share-gpu all on GPU 0\n"
    "  -c, --colls LIST       allreduce,allgather,reducescatter,broadcast,reduce,alltoall (default the first three)\n"
    "  -d, --dtype T          bf16 (default), fp16, fp32, fp64, int8, uint8, int32, uint32, int64, uint64\n"
    "  -b, --min-bytes B      smallest size (default 8; K/M/G suffixes); size = the larger buffer of a rank\n"
    "  -e, --max-bytes B      largest size (default 256M)\n"
    "  -f, --factor F         size step (default 2)\n"
    "  -n, --iters I          calls per batch (default: 50 up to 4 MiB, 20 up to 64 MiB, 10 above)\n"
    "      --batches R        timed batches (default 20; p10/p50/p90 over them)\n"
    "  -G, --graph            each batch is one CUDA graph of its calls\n"
    "      --register         register the buffers (mkCommRegister; NCCL: ncclMemAlloc + symmetric window)\n"
    "      --share-gpu        every rank on GPU 0 in this process (mKernel only): a one-GPU proxy\n"
    "      --premulsum        reducing collectives with a PreMulSum op of scalar 1 (the scaling's cost; same sums)\n"
    "      --l2-cold          rotate buffers over more than twice the L2 cache (eager mode)\n"
    "      --no-nccl          mKernel only\n"
    "      --no-inplace, --no-outofplace\n"
    "      --sets S           input sets rotated through (default 3)\n"
    "      --warmup-ms MS     warm-up before the first size (default 100)\n"
    "      --no-probe         do not ask NCCL which algorithm it ran\n"
    "      --prewarm          compile mKernel's plans on every core first (mkCommPrewarm)\n"
    "      --out FILE.md, --json FILE, --csv FILE, --plot FILE.svg, --label TEXT\n"
    "  mk_bench --fused [--ranks N] [--share-gpu] [--tokens 1,16,..] [--hidden 4096,8192] [--graph] [--out FILE.md]\n"
    "                         fused all-reduce + residual + RMSNorm against all-reduce + two kernels (mKernel,\n"
    "                         NCCL): bench/fused_bench.cpp\n";

Options parse(int argc, char** argv) {
  Options o;
  o.command = "mk_bench";
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) != "--probe-only") o.command += std::string(" ") + argv[i];
  }
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die(a + " needs a value\n" + kUsage);
      return argv[++i];
    };
    auto num = [&](int64_t lo, int64_t hi) {
      const std::string v = next();
      const int64_t x = mkb::parse_size(v);
      if (x < lo || x > hi) die(a + " " + v + ": expected a number in " + std::to_string(lo) + ".." + std::to_string(hi));
      return x;
    };
    if (a == "-g" || a == "--ranks") o.ranks = int(num(1, kMaxRanks));
    else if (a == "-c" || a == "--colls") {
      o.colls.clear();
      const std::string v = next();
      size_t start = 0;
      while (start <= v.size()) {
        const size_t comma = std::min(v.find(',', start), v.size());
        const std::string item = v.substr(start, comma - start);
        const auto c = parse_collective(item);
        if (!c) die("unknown collective '" + item + "'");
        o.colls.push_back(*c);
        start = comma + 1;
      }
    } else if (a == "-d" || a == "--dtype") {
      const std::string v = next();
      const auto t = parse_dtype(v);
      if (!t || mkb::dtype_kind(*t) < 0) die("dtype '" + v + "' is not supported by the bench");
      o.dtype = *t;
    } else if (a == "-b" || a == "--min-bytes") o.min_bytes = num(1, int64_t(1) << 40);
    else if (a == "-e" || a == "--max-bytes") o.max_bytes = num(1, int64_t(1) << 40);
    else if (a == "-f" || a == "--factor") o.factor = int(num(2, 1024));
    else if (a == "-n" || a == "--iters") o.iters = int(num(1, 100000));
    else if (a == "--batches") o.batches = int(num(1, kMaxBatches));
    else if (a == "-G" || a == "--graph") o.graph = true;
    else if (a == "--register") o.reg = true;
    else if (a == "--share-gpu") o.share = true;
    else if (a == "--l2-cold") o.l2cold = true;
    else if (a == "--no-nccl") o.nccl = false;
    else if (a == "--no-inplace") o.inplace = false;
    else if (a == "--no-outofplace") o.outofplace = false;
    else if (a == "--sets") o.sets = int(num(2, 64));
    else if (a == "--warmup-ms") o.warmup_ms = int(num(0, 600000));
    else if (a == "--no-probe") o.probe = false;
    else if (a == "--prewarm") o.prewarm = true;
    else if (a == "--premulsum") o.premul = true;
    else if (a == "--probe-only") o.probe_only = true;
    else if (a == "--out") o.md = next();
    else if (a == "--json") o.json_out = next();
    else if (a == "--csv") o.csv_out = next();
    else if (a == "--plot") o.svg_out = next();
    else if (a == "--label") o.label = next();
    else if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else {
      die("unknown option " + a + "\n" + kUsage);
    }
  }
  if (o.min_bytes > o.max_bytes) die("--min-bytes is larger than --max-bytes");
  if (o.colls.empty()) die("no collective given");
  if (!o.outofplace && !o.inplace) die("--no-inplace and --no-outofplace leave nothing to time");
  if (o.share) o.nccl = false;  // NCCL refuses a GPU twice
  if (o.probe_only) o.outofplace = true, o.inplace = false;
  return o;
}

// NCCL's algorithm and protocol per (collective, bytes), from a run of this
// program with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING (every call logs, so
// not the timed run).
void probe_nccl(int argc, char** argv) {
  char dir[] = "/tmp/mk_bench_probe.XXXXXX";
  if (!mkdtemp(dir)) return;
  const pid_t p = fork();
  if (p == 0) {
    setenv("NCCL_DEBUG", "INFO", 1);
    setenv("NCCL_DEBUG_SUBSYS", "TUNING", 1);
    setenv("NCCL_DEBUG_FILE", (std::string(dir) + "/nccl.%p.log").c_str(), 1);
    std::vector<char*> args(argv, argv + argc);
    std::string flag = "--probe-only";
    args.push_back(flag.data());
    args.push_back(nullptr);
    if (!freopen("/dev/null", "w", stdout)) _exit(1);
    execv("/proc/self/exe", args.data());
    _exit(127);
  }
  int st = 0;
  waitpid(p, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) g_notes.push_back("NCCL's algorithm probe failed; no algorithm column");
  const std::pair<const char*, Collective> funcs[] = {{"AllReduce", Collective::allreduce},
                                                      {"AllGather", Collective::allgather},
                                                      {"ReduceScatter", Collective::reducescatter},
                                                      {"Broadcast", Collective::broadcast},
                                                      {"Reduce", Collective::reduce}};
  FILE* ls = popen((std::string("cat ") + dir + "/nccl.*.log 2>/dev/null").c_str(), "r");
  char line[1024];
  while (ls && std::fgets(line, sizeof line, ls)) {
    const char* at = std::strstr(line, " Bytes -> Algo ");
    if (!at) continue;
    for (const auto& [fn, c] : funcs) {
      const std::string key = std::string("INFO ") + fn + ": ";
      const char* f = std::strstr(line, key.c_str());
      if (!f) continue;
      long long bytes = std::atoll(f + key.size());
      char algo[64] = {0}, proto[64] = {0};
      if (std::sscanf(at, " Bytes -> Algo %63s proto %63s", algo, proto) == 2)
        g_algos.emplace(std::make_pair(int(c), int64_t(bytes)), std::string(algo) + "/" + proto);
      break;
    }
  }
  if (ls) pclose(ls);
  std::system((std::string("rm -rf ") + dir).c_str());
}

}  // namespace

// `mk_bench --fused ...`: the fused all-reduce + residual + RMSNorm benchmark,
// a program of its own (bench/fused_bench.cpp) next to this one.
[[noreturn]] void run_fused(int argc, char** argv) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) die("--fused: cannot find this program's path");
  self[n] = 0;
  std::string path(self);
  path = path.substr(0, path.rfind('/') + 1) + "mk_fused_bench";
  std::vector<char*> args = {const_cast<char*>(path.c_str())};
  for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  execv(path.c_str(), args.data());
  die("--fused: cannot run " + path + ": " + std::strerror(errno));
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--fused") run_fused(argc, argv);
  const Options o = parse(argc, argv);
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  setenv("NVSHMEM_DISABLE_NVLS", "1", 1);
  setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1", 1);
  void* mem = mmap(nullptr, sizeof(Shm), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) die("mmap failed");
  g_shm = new (mem) Shm();
  if (!o.probe_only) {
    g_notes.push_back("clocks at the start: " + gpu_clocks());
    if (o.nccl && o.probe) probe_nccl(argc, argv);
  }
  // Unique ids before any CUDA use, then the ranks fork (CUDA does not survive fork).
  Nccl nc;
  std::string why;
  ncclUniqueId nid{};
  mkUniqueId mid{};
  if (o.nccl) {
    if (!load_nccl(&nc, &why)) die("cannot load NCCL (" + why + "); --no-nccl runs mKernel alone");
    if (nc.getVersion) nc.getVersion(&g_nccl_version);
    if (nc.getUniqueId(&nid) != ncclSuccess) die("ncclGetUniqueId failed");
  }
  if (o.share) {
    g_processes = 1;
    process_main(o, 0, o.ranks, nid, mid);
    return 0;
  }
  if (mkGetUniqueId(&mid) != mkSuccess) die("mkGetUniqueId failed");
  g_processes = o.ranks;
  std::vector<pid_t> kids;
  for (int r = 0; r < o.ranks; ++r) {
    const pid_t p = fork();
    if (p < 0) die("fork failed");
    if (p == 0) {
      int n = 0;
      if (cudaGetDeviceCount(&n) != cudaSuccess || n <= r)
        die("rank " + std::to_string(r) + " needs GPU " + std::to_string(r) + " but this machine has " +
            std::to_string(n) + " GPU(s); --share-gpu runs every rank on GPU 0 (mKernel only)");
      process_main(o, r, 1, nid, mid);
      std::fflush(stdout);
      _exit(0);
    }
    kids.push_back(p);
  }
  int bad = 0;
  for (size_t k = 0; k < kids.size(); ++k) {
    int st = 0;
    const pid_t p = waitpid(-1, &st, 0);
    if (p > 0 && (!WIFEXITED(st) || WEXITSTATUS(st) != 0)) {
      ++bad;
      g_shm->abort.store(1);  // the others stop at their next barrier
    }
  }
  if (bad) {
    std::fprintf(stderr, "mk_bench: %d rank process(es) failed\n", bad);
    return 1;
  }
  return 0;
}
