// mk_group_bench: a group of collectives as one kernel against one launch per
// collective and against NCCL's grouped calls, same process, same buffers.
//
//   mk_group_bench [--ranks N] [--share-gpu] [--iters I] [--batches B] [--graph]
//
// Three groups, what data-parallel training issues each step:
//   fsdp: 16 bf16 all-gathers of 1..4 MiB (output) each
//   ddp:  8 fp32 sum all-reduces of 1..8 MiB each (gradient buckets)
//   zero: a bf16 reduce-scatter of 16 MiB of gradients and an all-gather of
//         16 MiB of parameters, as the built-in composite composite.zero_step
//         (mkCompositeRun, docs/composites.md)
// Modes: mKernel with MK_GROUP_FUSE=1 (one group kernel; for zero, the
// composite), MK_GROUP_FUSE=0 (one launch per call), and NCCL
// (ncclGroupStart/End; one rank per GPU only, so not with --share-gpu). Each batch is I groups; the table has the median
// over B batches of the time per group. Before timing, every mKernel output
// of the fused group is compared bit-wise with the unfused one's (same
// kernels, same order of sums: they must be equal).
//
// With one GPU: --ranks 1 measures launch and scheduling overhead only (a
// one-rank collective is a copy); --share-gpu --ranks 2 runs both ranks'
// kernels on one GPU side by side (SMs split), without NCCL. Neither is a
// bandwidth measurement.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/batch_timer.hpp"
#include "bench/nccl_loader.hpp"
#include "mk.h"

namespace {

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "mk_group_bench: %s\n", why.c_str());
  std::exit(1);
}
#define CKC(x)                                                                              \
  do {                                                                                      \
    cudaError_t e_ = (x);                                                                   \
    if (e_ != cudaSuccess) die(std::string(#x) + ": " + cudaGetErrorString(e_));            \
  } while (0)
#define CKM(x)                                                                              \
  do {                                                                                      \
    mkResult_t e_ = (x);                                                                    \
    if (e_ != mkSuccess) die(std::string(#x) + ": " + mkGetLastError(nullptr));            \
  } while (0)

using mkbench::Nccl;

bool load_nccl(Nccl* n) {
  std::string why;
  return mkbench::load_nccl(n, &why);
}

enum Kind { kGather, kReduce, kScatter };
struct Call {
  Kind kind;     // all-gather (bf16), all-reduce (fp32 sum) or reduce-scatter (bf16 sum)
  size_t count;  // the call's count (all-gather: the input, reduce-scatter: the output)
};

struct Rank {
  int device = 0;
  cudaStream_t stream = nullptr;
  mkComm_t mk = nullptr;
  ncclComm_t nccl = nullptr;
  std::vector<void*> in, out;
};

size_t out_bytes(const Call& c, int n) {
  return c.kind == kGather ? c.count * 2 * size_t(n) : c.kind == kReduce ? c.count * 4 : c.count * 2;
}
size_t in_bytes(const Call& c, int n) {
  return c.kind == kGather ? c.count * 2 : c.kind == kReduce ? c.count * 4 : c.count * 2 * size_t(n);
}

// lib 0: mKernel, 1: NCCL, 2: mKernel's composite.zero_step (the zero group:
// a reduce-scatter, then an all-gather, of one count)
void issue(std::vector<Rank>& ranks, const std::vector<Call>& g, int lib, const Nccl& nc) {
  if (lib == 1) nc.groupStart();
  else CKM(mkGroupStart());
  for (Rank& r : ranks) {
    CKC(cudaSetDevice(r.device));
    if (lib == 2) {
      void* bufs[4] = {r.in[0], r.out[0], r.in[1], r.out[1]};
      CKM(mkCompositeRun("composite.zero_step", bufs, 4, g[0].count, mkBfloat16, mkSum, r.mk, r.stream));
      continue;
    }
    for (size_t i = 0; i < g.size(); ++i) {
      const Call& c = g[i];
      if (lib == 0) {
        if (c.kind == kGather) CKM(mkAllGather(r.in[i], r.out[i], c.count, mkBfloat16, r.mk, r.stream));
        else if (c.kind == kReduce) CKM(mkAllReduce(r.in[i], r.out[i], c.count, mkFloat32, mkSum, r.mk, r.stream));
        else CKM(mkReduceScatter(r.in[i], r.out[i], c.count, mkBfloat16, mkSum, r.mk, r.stream));
      } else {
        if (c.kind == kGather) nc.allGather(r.in[i], r.out[i], c.count, ncclBfloat16, r.nccl, r.stream);
        else if (c.kind == kReduce) nc.allReduce(r.in[i], r.out[i], c.count, ncclFloat32, ncclSum, r.nccl, r.stream);
        else nc.reduceScatter(r.in[i], r.out[i], c.count, ncclBfloat16, ncclSum, r.nccl, r.stream);
      }
    }
  }
  if (lib == 1) {
    if (nc.groupEnd() != ncclSuccess) die("ncclGroupEnd failed");
  } else {
    CKM(mkGroupEnd());
  }
}

void sync(std::vector<Rank>& ranks) {
  for (Rank& r : ranks) {
    CKC(cudaSetDevice(r.device));
    CKC(cudaStreamSynchronize(r.stream));
  }
}

// Median over `batches` of the microseconds per group (`iters` groups a batch).
double time_group(std::vector<Rank>& ranks, const std::vector<Call>& g, int lib, const Nccl& nc, int iters,
                  int batches, bool graph) {
  std::vector<mkbench::Lane> lanes;
  for (const Rank& r : ranks) lanes.push_back({r.device, r.stream});
  return mkbench::median_us_per_iter(
      lanes, [&] { issue(ranks, g, lib, nc); }, iters, batches, graph, [](const std::string& m) { die(m); });
}

}  // namespace

int main(int argc, char** argv) {
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  setenv("NVSHMEM_DISABLE_NVLS", "1", 1);
  setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1", 1);
  int nranks = 1, iters = 20, batches = 20;
  bool share = false, graph = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto num = [&] {
      if (i + 1 >= argc) die(a + " needs a value");
      return std::atoi(argv[++i]);
    };
    if (a == "--ranks") nranks = std::max(1, num());
    else if (a == "--share-gpu") share = true;
    else if (a == "--iters") iters = std::max(1, num());
    else if (a == "--batches") batches = std::max(1, num());
    else if (a == "--graph") graph = true;
    else die("unknown option " + a + " (see the comment at the top of bench/group_bench.cpp)");
  }
  int ngpu = 0;
  CKC(cudaGetDeviceCount(&ngpu));
  if (!share && ngpu < nranks) die("fewer GPUs than ranks: use --share-gpu (mKernel only)");
  std::vector<int> devs(static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; ++r) devs[size_t(r)] = share ? 0 : r;
  std::vector<Rank> ranks(static_cast<size_t>(nranks));
  std::vector<mkComm_t> mk(static_cast<size_t>(nranks));
  CKM(mkCommInitAll(mk.data(), nranks, devs.data()));
  Nccl nc;
  const bool with_nccl = !share && load_nccl(&nc);
  std::vector<ncclComm_t> ncc(static_cast<size_t>(nranks));
  if (with_nccl && nc.commInitAll(ncc.data(), nranks, devs.data()) != ncclSuccess) die("ncclCommInitAll failed");
  std::vector<Call> fsdp, ddp, zero;
  for (int i = 0; i < 16; ++i) fsdp.push_back({kGather, size_t((1 << 20) + (i % 4) * (1 << 20)) / 2 / size_t(nranks)});
  for (int i = 0; i < 8; ++i) ddp.push_back({kReduce, size_t((1 << 20) + i * (1 << 20)) / 4});
  zero.push_back({kScatter, size_t(8 << 20) / size_t(nranks)});  // 16 MiB of bf16 gradients
  zero.push_back({kGather, size_t(8 << 20) / size_t(nranks)});   // 16 MiB of bf16 parameters
  std::printf("| group | ranks | mKernel fused (us) | mKernel one launch per call (us) | NCCL grouped (us) | fused vs "
              "per call | fused vs NCCL |\n| --- | --- | --- | --- | --- | --- | --- |\n");
  for (int which = 0; which < 3; ++which) {
    const std::vector<Call>& g = which == 0 ? fsdp : which == 1 ? ddp : zero;
    const int fused_lib = which == 2 ? 2 : 0;  // the zero group: mkCompositeRun
    for (int r = 0; r < nranks; ++r) {
      Rank& x = ranks[size_t(r)];
      x.device = devs[size_t(r)];
      x.mk = mk[size_t(r)];
      x.nccl = with_nccl ? ncc[size_t(r)] : nullptr;
      CKC(cudaSetDevice(x.device));
      if (!x.stream) CKC(cudaStreamCreateWithFlags(&x.stream, cudaStreamNonBlocking));
      for (void* p : x.in) cudaFree(p);
      for (void* p : x.out) cudaFree(p);
      x.in.assign(g.size(), nullptr);
      x.out.assign(g.size(), nullptr);
      for (size_t i = 0; i < g.size(); ++i) {
        CKC(cudaMalloc(&x.in[i], in_bytes(g[i], nranks)));
        CKC(cudaMalloc(&x.out[i], out_bytes(g[i], nranks)));
        // inputs that differ per rank, call and element (bytes 1..251)
        std::vector<unsigned char> h(in_bytes(g[i], nranks));
        for (size_t k = 0; k < h.size(); ++k) h[k] = (unsigned char)(1 + (k * 7 + i * 13 + size_t(r) * 29) % 251);
        if (g[i].kind == kReduce)  // fp32 sums exact: small integers
          for (size_t k = 0; k < h.size() / 4; ++k) {
            const float v = float((k + i + size_t(r)) % 64);
            std::memcpy(&h[k * 4], &v, 4);
          }
        if (g[i].kind == kScatter)  // bf16 sums exact: small integers (0x3f80 = 1.0, ...)
          for (size_t k = 0; k < h.size() / 2; ++k) {
            const float v = float((k + size_t(r)) % 8);
            uint32_t b;
            std::memcpy(&b, &v, 4);
            const uint16_t top = uint16_t(b >> 16);
            std::memcpy(&h[k * 2], &top, 2);
          }
        CKC(cudaMemcpy(x.in[i], h.data(), h.size(), cudaMemcpyHostToDevice));
      }
    }
    // fused and unfused outputs agree bit-wise
    std::vector<std::vector<std::vector<unsigned char>>> got(2);
    for (int mode = 0; mode < 2; ++mode) {
      setenv("MK_GROUP_FUSE", mode == 0 ? "1" : "0", 1);
      for (Rank& x : ranks) {
        CKC(cudaSetDevice(x.device));
        for (size_t i = 0; i < g.size(); ++i) CKC(cudaMemset(x.out[i], 0xA5, out_bytes(g[i], nranks)));
      }
      issue(ranks, g, mode == 0 ? fused_lib : 0, nc);
      sync(ranks);
      for (Rank& x : ranks)
        for (size_t i = 0; i < g.size(); ++i) {
          std::vector<unsigned char> h(out_bytes(g[i], nranks));
          CKC(cudaSetDevice(x.device));
          CKC(cudaMemcpy(h.data(), x.out[i], h.size(), cudaMemcpyDeviceToHost));
          got[size_t(mode)].push_back(std::move(h));
        }
    }
    static const char* const kName[3] = {"fsdp", "ddp", "zero"};
    if (got[0] != got[1]) die(std::string(kName[which]) + ": fused and unfused outputs differ");
    setenv("MK_GROUP_FUSE", "1", 1);
    const double fused = time_group(ranks, g, fused_lib, nc, iters, batches, graph);
    setenv("MK_GROUP_FUSE", "0", 1);
    const double plain = time_group(ranks, g, 0, nc, iters, batches, graph);
    const double nccl = with_nccl ? time_group(ranks, g, 1, nc, iters, batches, graph) : 0;
    char nccl_us[32] = "-", vs_nccl[32] = "-";
    if (with_nccl) {
      std::snprintf(nccl_us, sizeof nccl_us, "%.1f", nccl);
      std::snprintf(vs_nccl, sizeof vs_nccl, "%.2fx", nccl / fused);
    }
    static const char* const kTitle[3] = {"fsdp all-gathers", "ddp all-reduces", "zero step composite: RS + AG"};
    std::printf("| %s (%zu calls) | %d%s | %.1f | %.1f | %s | %.2fx | %s |\n", kTitle[which], g.size(), nranks,
                share ? " sharing GPU 0" : "",
                fused, plain, nccl_us, plain / fused, vs_nccl);
  }
  for (Rank& x : ranks) {
    CKC(cudaSetDevice(x.device));
    for (void* p : x.in) cudaFree(p);
    for (void* p : x.out) cudaFree(p);
  }
  for (mkComm_t c : mk) CKM(mkCommDestroy(c));
  if (with_nccl)
    for (ncclComm_t c : ncc) nc.commDestroy(c);
  return 0;
}
