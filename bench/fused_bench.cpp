// mk_fused_bench (also `mk_bench --fused ...`): the fused all-reduce +
// residual add + RMSNorm (mkAllReduceFused, allreduce.rmsnorm) against what a
// user runs without it, same process, same buffers:
//
//   fused     mkAllReduceFused: one kernel
//   mk+2      mkAllReduce, then a residual-add kernel and an RMSNorm kernel
//   nccl+2    ncclAllReduce, then the same two kernels (the usual baseline;
//             one rank per GPU only, so not with --share-gpu)
//
//   mk_fused_bench [--ranks N] [--share-gpu] [--tokens 1,16,128,1024,8192]
//                  [--hidden 4096,8192] [--iters I] [--batches B] [--graph]
//                  [--out FILE.md]
//
// bf16. The two baseline kernels are this file's own (compiled by NVRTC at
// start): the add moves 16 bytes per thread, the norm gives a row to a block
// of 512 threads with vector loads and a two-level sum, as PyTorch's eager
// `h = y + residual; rms_norm(h, weight)` runs two kernels. Each batch is I
// calls; the table has the median over B batches of the time per call (CUDA
// events on rank 0's stream, which waits for the other ranks' streams), and
// the ratios against fused. Before timing, every way (fused, mk+2 and, where
// it runs, nccl+2) runs once on outputs poisoned with NaN and out and
// residual_out of every rank are compared with a float64 reference (per row:
// max |difference| over max |value|, at most 0.02 as bf16 rounds); the worst
// figure is in the table.
//
// One GPU: --ranks 1 measures launches and passes over memory (a one-rank
// all-reduce is a copy); --share-gpu --ranks 2 runs both ranks' kernels on
// one GPU (SMs split), without NCCL. Neither is an NVLink measurement.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/batch_timer.hpp"
#include "bench/nccl_loader.hpp"
#include "compiler/jit/jit.hpp"
#include "mk.h"

namespace {

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "mk_fused_bench: %s\n", why.c_str());
  std::exit(1);
}
#define CKC(x)                                                                   \
  do {                                                                           \
    cudaError_t e_ = (x);                                                        \
    if (e_ != cudaSuccess) die(std::string(#x) + ": " + cudaGetErrorString(e_)); \
  } while (0)
#define CKM(x, c)                                                                \
  do {                                                                           \
    mkResult_t e_ = (x);                                                         \
    if (e_ != mkSuccess) die(std::string(#x) + ": " + mkGetLastError(c));        \
  } while (0)

// The baseline's kernels: bf16 as its bits, float math, round to nearest even.
const char* const kBaseline = R"(
typedef unsigned short bf16;
typedef unsigned int u32;
__device__ __forceinline__ float ld(bf16 b) { return __uint_as_float(u32(b) << 16); }
__device__ __forceinline__ bf16 st(float f) {
  u32 u = __float_as_uint(f);
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16(u >> 16);
}
// h = y + residual, 8 elements (16 bytes) per thread; n a multiple of 8
extern "C" __global__ void mkf_add(const uint4* y, const uint4* res, uint4* h, long long n8) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n8; i += (long long)gridDim.x * blockDim.x) {
    uint4 a = y[i], b = res[i], o;
    const bf16* pa = reinterpret_cast<const bf16*>(&a);
    const bf16* pb = reinterpret_cast<const bf16*>(&b);
    bf16* po = reinterpret_cast<bf16*>(&o);
#pragma unroll
    for (int k = 0; k < 8; ++k) po[k] = st(ld(pa[k]) + ld(pb[k]));
    h[i] = o;
  }
}
// out = h * rsqrt(mean(h^2) + eps) * w, one row per block of 512 threads;
// hidden a multiple of 8
extern "C" __global__ void mkf_rmsnorm(const uint4* h, const uint4* w, uint4* out, int hidden8, float eps) {
  const uint4* row = h + (long long)blockIdx.x * hidden8;
  uint4* orow = out + (long long)blockIdx.x * hidden8;
  float ss = 0.f;
  for (int i = threadIdx.x; i < hidden8; i += blockDim.x) {
    uint4 a = row[i];
    const bf16* p = reinterpret_cast<const bf16*>(&a);
#pragma unroll
    for (int k = 0; k < 8; ++k) ss += ld(p[k]) * ld(p[k]);
  }
  __shared__ float part[32];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) part[0] = v;
  }
  __syncthreads();
  const float inv = rsqrtf(part[0] / float(hidden8 * 8) + eps);
  for (int i = threadIdx.x; i < hidden8; i += blockDim.x) {
    uint4 a = row[i], b = w[i], o;
    const bf16* p = reinterpret_cast<const bf16*>(&a);
    const bf16* q = reinterpret_cast<const bf16*>(&b);
    bf16* r = reinterpret_cast<bf16*>(&o);
#pragma unroll
    for (int k = 0; k < 8; ++k) r[k] = st(ld(p[k]) * inv * ld(q[k]));
    orow[i] = o;
  }
}
)";

struct Kernels {
  cudaKernel_t add = nullptr, norm = nullptr;
};

Kernels load_kernels(int device) {
  cudaDeviceProp prop;
  CKC(cudaGetDeviceProperties(&prop, device));
  mk::jit::CompileResult r;
  try {
    r = mk::jit::compile(kBaseline, "mk_fused_bench_baseline", prop.major * 10 + prop.minor);
  } catch (const std::exception& e) {
    die(std::string("compiling the baseline kernels: ") + e.what());
  }
  cudaLibrary_t lib;
  CKC(cudaLibraryLoadData(&lib, r.cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
  Kernels k;
  CKC(cudaLibraryGetKernel(&k.add, lib, "mkf_add"));
  CKC(cudaLibraryGetKernel(&k.norm, lib, "mkf_rmsnorm"));
  return k;
}

using mkbench::Nccl;

struct Rank {
  int device = 0;
  cudaStream_t stream = nullptr;
  mkComm_t mk = nullptr;
  ncclComm_t nccl = nullptr;
  Kernels k;
  // x: the all-reduce's input; y: its output (baselines); res, w: residual
  // and weight; out, res_out: the results (fused writes them, the baselines
  // too: h is res_out)
  void *x = nullptr, *y = nullptr, *res = nullptr, *w = nullptr, *out = nullptr, *res_out = nullptr;
};

enum Lib { kFused, kMk2, kNccl2 };
const char* const kLibName[] = {"fused", "mk+2 kernels", "nccl+2 kernels"};
constexpr float kEps = 1e-6f;

// The inputs, differing per rank and element, small enough that sums stay
// well inside bf16's range (exact in bf16: multiples of 1/64 below 2).
float in_x(size_t i, int r) { return float(int((i * 37 + size_t(r) * 101) % 199) - 99) / 64.0f; }
float in_res(size_t i) { return float(int((i * 13 + 7) % 101) - 50) / 32.0f; }
float in_w(size_t j) { return 0.5f + float(j % 17) / 32.0f; }

void issue(std::vector<Rank>& ranks, Lib lib, size_t tokens, size_t hidden, const Nccl& nc) {
  const size_t count = tokens * hidden;
  if (lib == kNccl2) {
    if (nc.groupStart() != ncclSuccess) die("ncclGroupStart failed");
  } else {
    CKM(mkGroupStart(), nullptr);
  }
  for (Rank& r : ranks) {
    CKC(cudaSetDevice(r.device));
    if (lib == kFused) {
      mkFusion_t f{};
      f.name = "allreduce.rmsnorm";
      f.operands[0] = r.res;
      f.operands[1] = r.res_out;
      f.operands[2] = r.w;
      f.scalars[0] = kEps;
      f.row = int64_t(hidden);
      CKM(mkAllReduceFused(r.x, r.out, count, mkBfloat16, mkSum, &f, r.mk, r.stream), r.mk);
    } else if (lib == kMk2) {
      CKM(mkAllReduce(r.x, r.y, count, mkBfloat16, mkSum, r.mk, r.stream), r.mk);
    } else {
      if (nc.allReduce(r.x, r.y, count, ncclBfloat16, ncclSum, r.nccl, r.stream) != ncclSuccess)
        die("ncclAllReduce failed");
    }
  }
  if (lib == kNccl2) {
    if (nc.groupEnd() != ncclSuccess) die("ncclGroupEnd failed");
  } else {
    CKM(mkGroupEnd(), nullptr);
  }
  if (lib == kFused) return;
  for (Rank& r : ranks) {  // the two kernels a user runs after the all-reduce
    CKC(cudaSetDevice(r.device));
    long long n8 = (long long)(count / 8);
    int h8 = int(hidden / 8);
    float eps = kEps;
    void* a1[] = {&r.y, &r.res, &r.res_out, &n8};
    const unsigned g1 = unsigned(std::min<long long>(4096, (n8 + 255) / 256));
    CKC(cudaLaunchKernel(reinterpret_cast<const void*>(r.k.add), dim3(g1), dim3(256), a1, 0, r.stream));
    void* a2[] = {&r.res_out, &r.w, &r.out, &h8, &eps};
    CKC(cudaLaunchKernel(reinterpret_cast<const void*>(r.k.norm), dim3(unsigned(tokens)), dim3(512), a2, 0, r.stream));
  }
}

void sync(std::vector<Rank>& ranks) {
  for (Rank& r : ranks) {
    CKC(cudaSetDevice(r.device));
    CKC(cudaStreamSynchronize(r.stream));
  }
}

// Median over `batches` of the microseconds per call (`iters` calls a batch).
double time_lib(std::vector<Rank>& ranks, Lib lib, size_t tokens, size_t hidden, const Nccl& nc, int iters,
                int batches, bool graph) {
  std::vector<mkbench::Lane> lanes;
  for (const Rank& r : ranks) lanes.push_back({r.device, r.stream});
  return mkbench::median_us_per_iter(
      lanes, [&] { issue(ranks, lib, tokens, hidden, nc); }, iters, batches, graph,
      [](const std::string& m) { die(m); });
}

float bf16_to_float(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

std::vector<uint16_t> fetch(const void* p, size_t n) {
  std::vector<uint16_t> h(n);
  CKC(cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost));
  return h;
}

// The largest, over rows of `hidden`, of max |got - ref| / max |ref| in the
// row (a row that is wrong anywhere shows; infinite for a non-finite value).
double rel_diff(const std::vector<uint16_t>& got, const std::vector<double>& ref, size_t hidden) {
  double worst = 0;
  for (size_t r0 = 0; r0 < ref.size(); r0 += hidden) {
    double d = 0, m = 0;
    for (size_t i = r0; i < r0 + hidden; ++i) {
      const double x = bf16_to_float(got[i]);
      if (!std::isfinite(x)) return INFINITY;
      d = std::max(d, std::fabs(x - ref[i]));
      m = std::max(m, std::fabs(ref[i]));
    }
    worst = std::max(worst, m > 0 ? d / m : d);
  }
  return worst;
}

std::vector<size_t> list(const std::string& s) {
  std::vector<size_t> v;
  size_t at = 0;
  while (at < s.size()) {
    size_t end = s.find(',', at);
    if (end == std::string::npos) end = s.size();
    const long long x = std::atoll(s.substr(at, end - at).c_str());
    if (x <= 0) die("bad list entry in '" + s + "'");
    v.push_back(size_t(x));
    at = end + 1;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  setenv("NVSHMEM_DISABLE_NVLS", "1", 1);
  setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1", 1);
  int nranks = 1, iters = 20, batches = 20;
  bool share = false, graph = false;
  std::vector<size_t> tokens_list = {1, 16, 128, 1024, 8192}, hidden_list = {4096, 8192};
  std::string out_md, command = "mk_fused_bench";
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--ranks") nranks = std::max(1, std::atoi(next().c_str()));
    else if (a == "--share-gpu") share = true;
    else if (a == "--iters") iters = std::max(1, std::atoi(next().c_str()));
    else if (a == "--batches") batches = std::max(1, std::atoi(next().c_str()));
    else if (a == "--graph") graph = true;
    else if (a == "--tokens") tokens_list = list(next());
    else if (a == "--hidden") hidden_list = list(next());
    else if (a == "--out") out_md = next();
    else die("unknown option " + a + " (see the comment at the top of bench/fused_bench.cpp)");
  }
  for (size_t h : hidden_list)
    if (h % 8 != 0 || h > 16384) die("--hidden " + std::to_string(h) + ": a multiple of 8 up to 16384");
  int ngpu = 0;
  CKC(cudaGetDeviceCount(&ngpu));
  if (!share && ngpu < nranks) die("fewer GPUs than ranks: use --share-gpu (mKernel only)");
  std::vector<int> devs(static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; ++r) devs[size_t(r)] = share ? 0 : r;
  std::vector<mkComm_t> mk(static_cast<size_t>(nranks));
  CKM(mkCommInitAll(mk.data(), nranks, devs.data()), nullptr);
  Nccl nc;
  std::string why;
  const bool with_nccl = !share && mkbench::load_nccl(&nc, &why);
  std::vector<ncclComm_t> ncc(static_cast<size_t>(nranks));
  if (with_nccl && nc.commInitAll(ncc.data(), nranks, devs.data()) != ncclSuccess) die("ncclCommInitAll failed");
  std::vector<Rank> ranks(static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; ++r) {
    Rank& x = ranks[size_t(r)];
    x.device = devs[size_t(r)];
    x.mk = mk[size_t(r)];
    x.nccl = with_nccl ? ncc[size_t(r)] : nullptr;
    CKC(cudaSetDevice(x.device));
    CKC(cudaStreamCreateWithFlags(&x.stream, cudaStreamNonBlocking));
    x.k = load_kernels(x.device);
  }
  std::string table = "| tokens x hidden | ranks | fused (us) | mk+2 kernels (us) | nccl+2 kernels (us) | fused vs "
                      "mk+2 | fused vs nccl+2 | max rel diff vs float64 (all ways) |\n| --- | --- | --- | --- | --- | --- | "
                      "--- | --- |\n";
  std::printf("%s", table.c_str());
  std::fflush(stdout);
  for (size_t hidden : hidden_list)
    for (size_t tokens : tokens_list) {
      const size_t count = tokens * hidden, bytes = count * 2;
      for (int r = 0; r < nranks; ++r) {
        Rank& x = ranks[size_t(r)];
        CKC(cudaSetDevice(x.device));
        for (void** p : {&x.x, &x.y, &x.res, &x.out, &x.res_out}) {
          if (*p) CKC(cudaFree(*p));
          CKC(cudaMalloc(p, bytes));
        }
        if (x.w) CKC(cudaFree(x.w));
        CKC(cudaMalloc(&x.w, hidden * 2));
        // data that differs per rank and element, small enough that sums stay well inside bf16's range
        std::vector<uint16_t> hx(count), hr(count), hw(hidden);
        for (size_t i = 0; i < count; ++i) {
          hx[i] = float_to_bf16(in_x(i, r));
          hr[i] = float_to_bf16(in_res(i));
        }
        for (size_t j = 0; j < hidden; ++j) hw[j] = float_to_bf16(in_w(j));
        CKC(cudaMemcpy(x.x, hx.data(), bytes, cudaMemcpyHostToDevice));
        CKC(cudaMemcpy(x.res, hr.data(), bytes, cudaMemcpyHostToDevice));
        CKC(cudaMemcpy(x.w, hw.data(), hidden * 2, cudaMemcpyHostToDevice));
      }
      CKC(cudaDeviceSynchronize());
      // float64 reference: res_out = sum of x + res, out = rmsnorm(res_out) * w
      std::vector<double> ref_h(count), ref_out(count);
      for (size_t t = 0; t < tokens; ++t) {
        double ss = 0;
        for (size_t j = 0; j < hidden; ++j) {
          const size_t i = t * hidden + j;
          double s = in_res(i);
          for (int r = 0; r < nranks; ++r) s += in_x(i, r);
          ref_h[i] = s;
          ss += s * s;
        }
        const double inv = 1.0 / std::sqrt(ss / double(hidden) + double(kEps));
        for (size_t j = 0; j < hidden; ++j) ref_out[t * hidden + j] = ref_h[t * hidden + j] * inv * in_w(j);
      }
      // every way on every rank, each against the reference, with the outputs
      // poisoned (bf16 NaN) first so that a way that writes nothing fails
      double diff = 0;
      for (Lib lib : {kFused, kMk2, kNccl2}) {
        if (lib == kNccl2 && !with_nccl) continue;
        for (Rank& x : ranks) {
          CKC(cudaSetDevice(x.device));
          for (void* p : {x.y, x.out, x.res_out}) CKC(cudaMemset(p, 0xff, bytes));
        }
        sync(ranks);
        issue(ranks, lib, tokens, hidden, nc);
        sync(ranks);
        for (Rank& x : ranks) {
          CKC(cudaSetDevice(x.device));
          const double d = std::max(rel_diff(fetch(x.out, count), ref_out, hidden),
                                    rel_diff(fetch(x.res_out, count), ref_h, hidden));
          if (!(d < 0.02))
            die("tokens " + std::to_string(tokens) + " hidden " + std::to_string(hidden) + ": " + kLibName[lib] +
                " differs from the float64 reference by " + std::to_string(d) + " of a row's magnitude");
          diff = std::max(diff, d);
        }
      }
      const double fused = time_lib(ranks, kFused, tokens, hidden, nc, iters, batches, graph);
      const double mk2 = time_lib(ranks, kMk2, tokens, hidden, nc, iters, batches, graph);
      const double nccl2 = with_nccl ? time_lib(ranks, kNccl2, tokens, hidden, nc, iters, batches, graph) : 0;
      char nccl_us[32] = "-", vs_nccl[32] = "-";
      if (with_nccl) {
        std::snprintf(nccl_us, sizeof nccl_us, "%.1f", nccl2);
        std::snprintf(vs_nccl, sizeof vs_nccl, "%.2fx", nccl2 / fused);
      }
      char line[256];
      std::snprintf(line, sizeof line, "| %zu x %zu | %d%s | %.1f | %.1f | %s | %.2fx | %s | %.1e |\n", tokens, hidden,
                    nranks, share ? " sharing GPU 0" : "", fused, mk2, nccl_us, mk2 / fused, vs_nccl, diff);
      std::printf("%s", line);
      std::fflush(stdout);
      table += line;
    }
  if (!out_md.empty()) {
    FILE* f = std::fopen(out_md.c_str(), "w");
    if (!f) die("cannot write " + out_md);
    std::fprintf(f, "# Fused all-reduce + residual + RMSNorm (bf16)\n\nCommand: `%s`%s\n\n%s", command.c_str(),
                 graph ? " (CUDA graph replay)" : " (eager launches)", table.c_str());
    std::fclose(f);
  }
  for (Rank& x : ranks) {
    CKC(cudaSetDevice(x.device));
    for (void* p : {x.x, x.y, x.res, x.out, x.res_out, x.w}) cudaFree(p);
    cudaStreamDestroy(x.stream);
  }
  for (mkComm_t c : mk) CKM(mkCommDestroy(c), c);
  if (with_nccl)
    for (ncclComm_t c : ncc) nc.commDestroy(c);
  return 0;
}
