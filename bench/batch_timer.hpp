// Timing for the one-process benchmarks (mk_group_bench, mk_fused_bench):
// the median over batches of the microseconds per iteration, an iteration
// being whatever `issue` launches on every rank's stream. CUDA events on the
// first rank's stream, which waits for the other ranks' streams at the end of
// each batch; with `graph`, one capture of `iters` iterations replayed per
// batch (one rank only: one thread cannot capture several ranks' streams).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

namespace mkbench {

struct Lane {
  int device = 0;
  cudaStream_t stream = nullptr;
};

// `issue()` launches one iteration; `fail(message)` does not return.
template <class Issue, class Fail>
double median_us_per_iter(const std::vector<Lane>& lanes, Issue issue, int iters, int batches, bool graph,
                          Fail fail) {
  auto ck = [&](cudaError_t e, const char* what) {
    if (e != cudaSuccess) fail(std::string(what) + ": " + cudaGetErrorString(e));
  };
  auto sync = [&] {
    for (const Lane& l : lanes) {
      ck(cudaSetDevice(l.device), "cudaSetDevice");
      ck(cudaStreamSynchronize(l.stream), "cudaStreamSynchronize");
    }
  };
  for (int i = 0; i < 5; ++i) issue();  // warm-up (and first builds of plans)
  sync();
  const Lane& first = lanes.front();
  cudaGraphExec_t exec = nullptr;
  if (graph) {
    if (lanes.size() != 1) fail("--graph needs --ranks 1");
    cudaGraph_t gr;
    ck(cudaSetDevice(first.device), "cudaSetDevice");
    ck(cudaStreamBeginCapture(first.stream, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture");
    for (int i = 0; i < iters; ++i) issue();
    ck(cudaStreamEndCapture(first.stream, &gr), "cudaStreamEndCapture");
    ck(cudaGraphInstantiate(&exec, gr, 0), "cudaGraphInstantiate");
    ck(cudaGraphDestroy(gr), "cudaGraphDestroy");
    ck(cudaGraphLaunch(exec, first.stream), "cudaGraphLaunch");
    sync();
  }
  std::vector<double> per;
  cudaEvent_t a, b;
  ck(cudaSetDevice(first.device), "cudaSetDevice");
  ck(cudaEventCreate(&a), "cudaEventCreate");
  ck(cudaEventCreate(&b), "cudaEventCreate");
  for (int k = 0; k < batches; ++k) {
    ck(cudaSetDevice(first.device), "cudaSetDevice");
    ck(cudaEventRecord(a, first.stream), "cudaEventRecord");
    if (graph)
      ck(cudaGraphLaunch(exec, first.stream), "cudaGraphLaunch");
    else
      for (int i = 0; i < iters; ++i) issue();
    for (size_t q = 1; q < lanes.size(); ++q) {  // the first stream waits for the others
      cudaEvent_t e;
      ck(cudaSetDevice(lanes[q].device), "cudaSetDevice");
      ck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
      ck(cudaEventRecord(e, lanes[q].stream), "cudaEventRecord");
      ck(cudaSetDevice(first.device), "cudaSetDevice");
      ck(cudaStreamWaitEvent(first.stream, e, 0), "cudaStreamWaitEvent");
      ck(cudaEventDestroy(e), "cudaEventDestroy");
    }
    ck(cudaSetDevice(first.device), "cudaSetDevice");
    ck(cudaEventRecord(b, first.stream), "cudaEventRecord");
    ck(cudaEventSynchronize(b), "cudaEventSynchronize");
    float ms = 0;
    ck(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    per.push_back(double(ms) * 1000.0 / iters);
  }
  sync();
  if (exec) cudaGraphExecDestroy(exec);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(per.begin(), per.end());
  return per[per.size() / 2];
}

}  // namespace mkbench
