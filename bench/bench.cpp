// mk_bench: mKernel and NCCL side by side, in the same run, on the same
// buffers, timed with CUDA events.
//
//   mk_bench [--ranks N] [--colls allreduce,allgather,...] [--dtype bf16]
//            [--min-bytes B] [--max-bytes B] [--iters I] [--batches R]
//            [--graph] [--register] [--share-gpu] [--out results.md]
//
// --register: each size's buffers are one allocation registered with both
// libraries (mkCommRegister: zero-copy plans; ncclCommRegister: NCCL's
// user-buffer registration), as an application that registers would run.
//
// --share-gpu: every rank on GPU 0, mKernel only (NCCL refuses a GPU twice).
// The ranks stay processes, and processes sharing a GPU without MPS are
// time-sliced: a rank's kernel waits for its peer's time slice, so calls take
// ~2 ms whatever their size. It checks results with ranks in separate
// contexts on one GPU; it does not measure kernel speed (bench/NOTES.md).
//
// One process per GPU (forked, like torchrun). For every size: both libraries
// run `iters` back-to-back calls per batch, `batches` batches after a warm-up;
// the time per call is the median over batches of (batch time / iters), read
// from CUDA events on rank 0. With --graph, each batch is one CUDA graph of
// `iters` calls (the launch cost disappears for both). Results are checked
// against the float64 reference once per size before timing. NCCL is opened
// with dlopen (libnccl.so.2); NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "compiler/verify/reference.hpp"
#include "mk.h"
#include "mk/types.hpp"

using namespace mk;

namespace {

#define CK(x)                                                                                        \
  do {                                                                                               \
    cudaError_t e_ = (x);                                                                            \
    if (e_ != cudaSuccess) {                                                                         \
      std::fprintf(stderr, "%s failed: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__);       \
      std::exit(1);                                                                                  \
    }                                                                                                \
  } while (0)

struct Nccl {
  decltype(&ncclGetUniqueId) getUniqueId;
  decltype(&ncclCommInitRank) commInitRank;
  decltype(&ncclCommDestroy) commDestroy;
  decltype(&ncclAllReduce) allReduce;
  decltype(&ncclAllGather) allGather;
  decltype(&ncclReduceScatter) reduceScatter;
  decltype(&ncclBroadcast) broadcast;
  decltype(&ncclReduce) reduce;
  decltype(&ncclAlltoAll) alltoAll;
  decltype(&ncclGetErrorString) errorString;
  decltype(&ncclGetVersion) getVersion;
  decltype(&ncclCommRegister) commRegister;
  decltype(&ncclCommDeregister) commDeregister;
};

bool load_nccl(Nccl* n, std::string* why) {
  void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
  if (!h) h = dlopen("/usr/local/cuda/lib64/libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
  if (!h) {
    *why = dlerror();
    return false;
  }
#define LD(f, s) n->f = reinterpret_cast<decltype(n->f)>(dlsym(h, s))
  LD(getUniqueId, "ncclGetUniqueId");
  LD(commInitRank, "ncclCommInitRank");
  LD(commDestroy, "ncclCommDestroy");
  LD(allReduce, "ncclAllReduce");
  LD(allGather, "ncclAllGather");
  LD(reduceScatter, "ncclReduceScatter");
  LD(broadcast, "ncclBroadcast");
  LD(reduce, "ncclReduce");
  LD(alltoAll, "ncclAlltoAll");
  LD(errorString, "ncclGetErrorString");
  LD(getVersion, "ncclGetVersion");
  LD(commRegister, "ncclCommRegister");
  LD(commDeregister, "ncclCommDeregister");
#undef LD
  return n->commInitRank && n->allReduce;
}

struct Options {
  int ranks = 2;
  std::vector<Collective> colls = {Collective::allreduce, Collective::allgather, Collective::reducescatter};
  DType dtype = DType::bf16;
  int64_t min_bytes = 1024, max_bytes = 1ll << 30;
  int iters = 20, batches = 15;
  bool graph = false;
  bool reg = false;
  // every rank on GPU 0 (a one-GPU proxy of kernel efficiency: peers' memory
  // is local HBM); NCCL refuses a GPU twice, so only mKernel runs
  bool share = false;
  int64_t check_max_bytes = 64ll << 20;  // reference-check results up to this size
  std::string out;
};

// nccl-tests' bus bandwidth convention (a choice of that suite, not a property
// of the collective's buffers); exhaustive so that a new collective gets one.
double busbw_factor(Collective c, int n) {
  switch (c) {
    case Collective::allreduce: return 2.0 * (n - 1) / n;
    case Collective::allgather:
    case Collective::reducescatter:
    case Collective::alltoall: return double(n - 1) / n;
    case Collective::broadcast:
    case Collective::reduce: return 1.0;
  }
  return 1.0;
}

// Per-rank element count such that the collective moves `bytes` (nccl-tests'
// convention: the size of the larger buffer).
int64_t count_for(Collective c, int n, int64_t bytes, size_t es) {
  int64_t total = bytes / int64_t(es);
  total /= std::max(input_blocks(c, n), output_blocks(c, n));
  return std::max<int64_t>(total, 1);
}

struct Row {
  Collective coll;
  int64_t bytes;
  double nccl_us, mk_us;
  bool mk_ok, nccl_ok;
};

void rank_main(const Options& o, int rank, const ncclUniqueId& nid, const mkUniqueId& mid, int pipe_w) {
  CK(cudaSetDevice(o.share ? 0 : rank));
  Nccl nc{};
  std::string why;
  if (!load_nccl(&nc, &why)) {
    std::fprintf(stderr, "cannot load NCCL: %s\n", why.c_str());
    std::exit(1);
  }
  ncclComm_t ncomm = nullptr;
  if (!o.share && nc.commInitRank(&ncomm, o.ranks, nid, rank) != ncclSuccess) {
    std::fprintf(stderr, "ncclCommInitRank failed\n");
    std::exit(1);
  }
  mkComm_t mcomm;
  if (mkCommInitRank(&mcomm, o.ranks, mid, rank) != mkSuccess) {
    std::fprintf(stderr, "mkCommInitRank failed: %s\n", mkGetLastError(nullptr));
    std::exit(1);
  }
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const size_t es = dtype_size(o.dtype);
  const auto ndt = ncclDataType_t(int(o.dtype));
  const auto mdt = mkDataType_t(int(o.dtype));
  std::vector<Row> rows;
  for (Collective c : o.colls) {
    for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 4) {
      const int64_t count = count_for(c, o.ranks, bytes, es);
      const int64_t ie = verify::input_elems(c, o.ranks, count), oe = verify::output_elems(c, o.ranks, count);
      void *in = nullptr, *out = nullptr, *arena = nullptr, *mk_handle = nullptr, *nccl_handle = nullptr;
      const size_t in_span = (size_t(ie) * es + 4095) / 4096 * 4096, arena_bytes = in_span + size_t(oe) * es;
      if (o.reg) {
        CK(cudaMalloc(&arena, arena_bytes));
        in = arena;
        out = static_cast<char*>(arena) + in_span;
        if (mkCommRegister(mcomm, arena, arena_bytes, &mk_handle) != mkSuccess) {
          std::fprintf(stderr, "mkCommRegister failed: %s\n", mkGetLastError(mcomm));
          std::exit(1);
        }
        if (!o.share && (!nc.commRegister || nc.commRegister(ncomm, arena, arena_bytes, &nccl_handle) != ncclSuccess)) {
          std::fprintf(stderr, "ncclCommRegister failed\n");
          std::exit(1);
        }
      } else {
        CK(cudaMalloc(&in, size_t(ie) * es));
        CK(cudaMalloc(&out, size_t(oe) * es));
      }
      verify::DataSpec d{o.dtype, RedOp::sum, 7, 0, o.ranks};
      std::vector<char> host(size_t(std::max(ie, oe)) * es);
      // inputs for GiB-sized buffers: generate on (up to 16) cores
      verify::fill_input_parallel(d, rank, ie, host.data(), std::min(16u, std::thread::hardware_concurrency()));
      CK(cudaMemcpy(in, host.data(), size_t(ie) * es, cudaMemcpyHostToDevice));
      // A pageable upload returns once staged; its DMA may still run on the
      // legacy stream, which the bench's non-blocking stream does not wait for
      // (tests/gpu/gpu_tests.cpp syncs the same way before each call).
      CK(cudaDeviceSynchronize());
      auto call = [&](bool mk) {
        const size_t n = size_t(count);
        if (mk) {
          mkResult_t r = mkSuccess;
          switch (c) {
            case Collective::allreduce: r = mkAllReduce(in, out, n, mdt, mkSum, mcomm, stream); break;
            case Collective::allgather: r = mkAllGather(in, out, n, mdt, mcomm, stream); break;
            case Collective::reducescatter: r = mkReduceScatter(in, out, n, mdt, mkSum, mcomm, stream); break;
            case Collective::broadcast: r = mkBroadcast(in, out, n, mdt, 0, mcomm, stream); break;
            case Collective::reduce: r = mkReduce(in, out, n, mdt, mkSum, 0, mcomm, stream); break;
            case Collective::alltoall: r = mkAllToAll(in, out, n, mdt, mcomm, stream); break;
          }
          if (r != mkSuccess) {
            std::fprintf(stderr, "mKernel %s failed: %s\n", std::string(name(c)).c_str(), mkGetLastError(mcomm));
            std::exit(1);
          }
        } else {
          ncclResult_t r = ncclSuccess;
          switch (c) {
            case Collective::allreduce: r = nc.allReduce(in, out, n, ndt, ncclSum, ncomm, stream); break;
            case Collective::allgather: r = nc.allGather(in, out, n, ndt, ncomm, stream); break;
            case Collective::reducescatter: r = nc.reduceScatter(in, out, n, ndt, ncclSum, ncomm, stream); break;
            case Collective::broadcast: r = nc.broadcast(in, out, n, ndt, 0, ncomm, stream); break;
            case Collective::reduce: r = nc.reduce(in, out, n, ndt, ncclSum, 0, ncomm, stream); break;
            case Collective::alltoall: r = nc.alltoAll(in, out, n, ndt, ncomm, stream); break;
          }
          if (r != ncclSuccess) {
            std::fprintf(stderr, "NCCL %s failed: %s\n", std::string(name(c)).c_str(), nc.errorString(r));
            std::exit(1);
          }
        }
      };
      auto verify_out = [&]() {
        CK(cudaStreamSynchronize(stream));
        const bool has_out = has_output(c, rank, 0);
        if (!has_out || bytes > o.check_max_bytes) return true;
        CK(cudaMemcpy(host.data(), out, size_t(oe) * es, cudaMemcpyDeviceToHost));
        auto res = verify::check_output(c, d, o.ranks, 0, count, rank, host.data(), oe);
        if (res.mismatches) std::fprintf(stderr, "rank %d %s %lld B: %s\n", rank, std::string(name(c)).c_str(),
                                         (long long)bytes, res.first_bad.c_str());
        return res.mismatches == 0;
      };
      Row row{c, bytes, o.share ? std::nan("") : 0.0, 0, false, o.share};
      const bool checked = bytes <= o.check_max_bytes;
      for (int lib = o.share ? 1 : 0; lib < 2; ++lib) {
        const bool mk = lib == 1;
        // on the bench's (non-blocking) stream: a legacy-stream memset is not ordered with it
        CK(cudaMemsetAsync(out, 0, size_t(oe) * es, stream));
        call(mk);
        (mk ? row.mk_ok : row.nccl_ok) = verify_out();
        for (int i = 0; i < 5; ++i) call(mk);
        cudaGraphExec_t exec = nullptr;
        if (o.graph) {
          cudaGraph_t g;
          CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
          for (int i = 0; i < o.iters; ++i) call(mk);
          CK(cudaStreamEndCapture(stream, &g));
          CK(cudaGraphInstantiate(&exec, g, 0));
          CK(cudaGraphDestroy(g));
          CK(cudaGraphLaunch(exec, stream));
        }
        CK(cudaStreamSynchronize(stream));
        std::vector<double> per;
        for (int b = 0; b < o.batches; ++b) {
          CK(cudaEventRecord(e0, stream));
          if (exec) {
            CK(cudaGraphLaunch(exec, stream));
          } else {
            for (int i = 0; i < o.iters; ++i) call(mk);
          }
          CK(cudaEventRecord(e1, stream));
          CK(cudaEventSynchronize(e1));
          float ms = 0;
          CK(cudaEventElapsedTime(&ms, e0, e1));
          per.push_back(double(ms) * 1000.0 / o.iters);
        }
        if (exec) CK(cudaGraphExecDestroy(exec));
        std::sort(per.begin(), per.end());
        (mk ? row.mk_us : row.nccl_us) = per[per.size() / 2];
      }
      rows.push_back(row);
      if (rank == 0) {
        const double f = busbw_factor(c, o.ranks);
        std::printf("  %-13s %9lld B  NCCL %9.1f us %7.1f GB/s  mKernel %9.1f us %7.1f GB/s  %.2fx  %s\n",
                    std::string(name(c)).c_str(), (long long)bytes, row.nccl_us, double(bytes) / row.nccl_us / 1e3 * f,
                    row.mk_us, double(bytes) / row.mk_us / 1e3 * f, row.nccl_us / row.mk_us,
                    !checked ? "unchecked" : (row.mk_ok && row.nccl_ok ? "ok" : "WRONG"));
        std::fflush(stdout);
      }
      if (o.reg) {
        CK(cudaStreamSynchronize(stream));
        if (mkCommDeregister(mcomm, mk_handle) != mkSuccess ||
            (!o.share && nc.commDeregister(ncomm, nccl_handle) != ncclSuccess)) {
          std::fprintf(stderr, "deregistration failed: %s\n", mkGetLastError(mcomm));
          std::exit(1);
        }
        CK(cudaFree(arena));
      } else {
        CK(cudaFree(in));
        CK(cudaFree(out));
      }
    }
  }
  if (rank == 0) {
    size_t n = rows.size();
    ssize_t w = ::write(pipe_w, &n, sizeof n);
    w = ::write(pipe_w, rows.data(), sizeof(Row) * n);
    (void)w;
  }
  mkCommDestroy(mcomm);
  if (ncomm) nc.commDestroy(ncomm);
}

std::vector<Collective> parse_colls(const std::string& s) {
  std::vector<Collective> v;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) {
      auto c = parse_collective(item);
      if (!c) {
        std::fprintf(stderr, "unknown collective %s\n", item.c_str());
        std::exit(2);
      }
      v.push_back(*c);
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return v;
}

std::string human(int64_t b) {
  char buf[32];
  if (b >= (1ll << 30)) std::snprintf(buf, sizeof buf, "%lld GiB", (long long)(b >> 30));
  else if (b >= (1ll << 20)) std::snprintf(buf, sizeof buf, "%lld MiB", (long long)(b >> 20));
  else if (b >= 1024) std::snprintf(buf, sizeof buf, "%lld KiB", (long long)(b >> 10));
  else std::snprintf(buf, sizeof buf, "%lld B", (long long)b);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--ranks") o.ranks = std::atoi(next().c_str());
    else if (a == "--colls") o.colls = parse_colls(next());
    else if (a == "--dtype") {
      auto t = parse_dtype(next());
      if (!t) return 2;
      o.dtype = *t;
    } else if (a == "--min-bytes") o.min_bytes = std::atoll(next().c_str());
    else if (a == "--max-bytes") o.max_bytes = std::atoll(next().c_str());
    else if (a == "--iters") o.iters = std::atoi(next().c_str());
    else if (a == "--batches") o.batches = std::atoi(next().c_str());
    else if (a == "--graph") o.graph = true;
    else if (a == "--register") o.reg = true;
    else if (a == "--share-gpu") o.share = true;
    else if (a == "--check-max-bytes") o.check_max_bytes = std::atoll(next().c_str());
    else if (a == "--out") o.out = next();
    else {
      std::fprintf(stderr, "usage: mk_bench [--ranks N] [--colls a,b] [--dtype T] [--min-bytes B] [--max-bytes B] "
                           "[--iters I] [--batches R] [--graph] [--register] [--share-gpu] [--check-max-bytes B] [--out FILE]\n");
      return 2;
    }
  }
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  setenv("NVSHMEM_DISABLE_NVLS", "1", 1);
  setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1", 1);
  // Unique ids are made here, before any CUDA use, then the ranks fork.
  Nccl nc{};
  std::string why;
  if (!load_nccl(&nc, &why)) {
    std::fprintf(stderr, "mk_bench: cannot load NCCL (%s)\n", why.c_str());
    return 1;
  }
  ncclUniqueId nid;
  mkUniqueId mid;
  if (nc.getUniqueId(&nid) != ncclSuccess || mkGetUniqueId(&mid) != mkSuccess) {
    std::fprintf(stderr, "mk_bench: cannot create unique ids\n");
    return 1;
  }
  int nccl_version = 0;
  if (nc.getVersion) nc.getVersion(&nccl_version);
  int fds[2];
  if (::pipe(fds) != 0) return 1;
  std::vector<pid_t> kids;
  for (int r = 0; r < o.ranks; ++r) {
    pid_t p = ::fork();
    if (p == 0) {
      ::close(fds[0]);
      rank_main(o, r, nid, mid, fds[1]);
      std::fflush(stdout);
      _exit(0);
    }
    kids.push_back(p);
  }
  ::close(fds[1]);
  size_t n = 0;
  std::vector<Row> rows;
  if (::read(fds[0], &n, sizeof n) == sizeof n) {
    rows.resize(n);
    size_t got = 0;
    while (got < sizeof(Row) * n) {
      ssize_t k = ::read(fds[0], reinterpret_cast<char*>(rows.data()) + got, sizeof(Row) * n - got);
      if (k <= 0) break;
      got += size_t(k);
    }
  }
  int bad = 0;
  for (pid_t p : kids) {
    int st = 0;
    ::waitpid(p, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ++bad;
  }
  if (bad || rows.empty()) {
    std::fprintf(stderr, "mk_bench: %d rank(s) failed\n", bad);
    return 1;
  }
  std::string table;
  char line[512];
  std::snprintf(line, sizeof line,
                "mKernel vs NCCL %d.%d.%d, %d ranks, %s, %s%s, median of %d batches of %d calls (CUDA events, rank 0)\n\n",
                nccl_version / 10000, (nccl_version / 100) % 100, nccl_version % 100, o.ranks,
                std::string(name(o.dtype)).c_str(), o.graph ? "CUDA graphs" : "eager launches",
                o.reg ? ", buffers registered with both libraries" : "", o.batches, o.iters);
  table += line;
  if (o.share)
    table += "1 GPU, ranks sharing it as processes (--share-gpu): mKernel only, time-sliced between the ranks' "
             "contexts, so times are not kernel speed; NCCL columns empty\n\n";
  table += "| collective | size | NCCL us | mKernel us | NCCL busbw GB/s | mKernel busbw GB/s | speedup | checked |\n";
  table += "|---|---:|---:|---:|---:|---:|---:|---|\n";
  for (const Row& r : rows) {
    const double f = busbw_factor(r.coll, o.ranks);
    std::snprintf(line, sizeof line, "| %s | %s | %.1f | %.1f | %.1f | %.1f | %.2fx | %s |\n",
                  std::string(name(r.coll)).c_str(), human(r.bytes).c_str(), r.nccl_us, r.mk_us,
                  double(r.bytes) / r.nccl_us / 1e3 * f, double(r.bytes) / r.mk_us / 1e3 * f, r.nccl_us / r.mk_us,
                  r.bytes > o.check_max_bytes ? "not checked" : r.mk_ok && r.nccl_ok ? "ok" : (r.mk_ok ? "NCCL WRONG" : "MKERNEL WRONG"));
    table += line;
  }
  std::fputs(table.c_str(), stdout);
  if (!o.out.empty()) {
    FILE* f = std::fopen(o.out.c_str(), "w");
    if (f) {
      std::fputs(table.c_str(), f);
      std::fclose(f);
    }
  }
  return 0;
}
