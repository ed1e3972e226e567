#include "tools/mkc/tune.hpp"

#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <set>

#include "compiler/pipeline.hpp"
#include "compiler/verify/reference.hpp"
#include "mk.h"
#include "mk/dsl.hpp"
#include "mk/error.hpp"
#include "runtime/driver/cuda_driver.hpp"
#include "runtime/comm/env.hpp"
#include "runtime/plans/select.hpp"
#include "runtime/api/status.hpp"

namespace mk::tune {

namespace {

std::vector<int64_t> sizes(const Options& o) {
  std::vector<int64_t> v;
  for (int64_t b = o.min_bytes; b <= o.max_bytes; b *= 2) v.push_back(b);
  return v;
}

// Per-rank element count such that the larger buffer is `bytes` (nccl-tests' size).
int64_t count_for(Collective c, int n, int64_t bytes, size_t es) {
  return std::max<int64_t>(1, bytes / int64_t(es) / std::max(input_blocks(c, n), output_blocks(c, n)));
}

void say(int fd, const std::string& line) {
  const std::string l = line + "\n";
  if (::write(fd, l.data(), l.size()) != ssize_t(l.size())) _exit(3);
}

// The schedules of `coll` that lower for `n` ranks (the others are not candidates).
std::vector<std::string> schedules(Collective coll, int n) {
  std::vector<std::string> out;
  for (const auto& info : dsl::registered_schedules()) {
    if (info.coll != coll) continue;
    try {
      compiler::lower(dsl::build(info, n, 0), compiler::LowerOptions{});
      out.push_back(info.name);
    } catch (const std::exception&) {
      // e.g. hierarchical schedules on one node, or a schedule for other rank counts
    }
  }
  return out;
}

// MK_TUNE's value for a candidate: the user's settings, the candidate's on top.
std::string merged_tune(const std::string& candidate) {
  std::map<std::string, std::string> kv;
  std::vector<std::string> order;
  const std::string* sources[2] = {nullptr, &candidate};
  for (const std::string* s : sources) {
    const auto v = s ? std::optional<std::string>(*s) : rt::env::raw("MK_TUNE");
    if (!v || v->empty()) continue;
    for (const auto& [k, x] : rt::env::parse_list("MK_TUNE", *v)) {
      if (!kv.count(k)) order.push_back(k);
      kv[k] = x;
    }
  }
  std::string out;
  for (const auto& k : order) out += (out.empty() ? "" : ",") + k + "=" + kv[k];
  return out;
}

struct Result {
  std::map<int64_t, double> us;        // per size
  std::map<int64_t, std::string> bad;  // wrong results, per size
  std::string failed;                  // the candidate could not run at all
};

void progress(size_t done, size_t total, const std::string& what) {
  if (!::isatty(2)) {  // a log: one line per candidate
    std::fprintf(stderr, "mkc tune: %zu/%zu %s\n", done, total, what.c_str());
    return;
  }
  const int width = 30;
  const int fill = total ? int(double(done) / double(total) * width) : width;
  std::fprintf(stderr, "\r[%s%s] %zu/%zu %-60.60s", std::string(size_t(fill), '#').c_str(),
               std::string(size_t(width - fill), '.').c_str(), done, total, what.c_str());
  std::fflush(stderr);
}

}  // namespace

std::vector<std::string> knob_variants(const std::string& level) {
  if (level == "quick") return {""};
  if (level == "full")
    return {"",
            "simple_instances=16",
            "simple_instances=24",
            "simple_loads=8",
            "ll_instances=8",
            "ll_max=65536",
            "ll_max=1048576",  // one pass (Lamport packets) further up
            "ll_max=1048576,ll_instances=32,lamport_units=2",
            "ll_max=4194304,ll_instances=32",
            "lamport=0",
            "lamport_units=2",
            "max_tile=131072"};
  throw Error(ErrId::cli_E011, "--knobs must be quick or full");
}

int child(const Options& o, Collective coll, int fd) {
  using rt::cu;
  const int n = o.ranks;
  try {
    int ngpu = 0;
    if (cu().cuDeviceGetCount(&ngpu) != CUDA_SUCCESS || ngpu < (o.share ? 1 : n)) {
      say(fd, fmt::format("E {} rank(s) need {} GPU(s), this machine has {} (--share-gpu puts every rank on GPU 0)", n,
                          o.share ? 1 : n, ngpu));
      return 2;
    }
    char dev_name[256] = {0};
    CUdevice d0 = 0;
    cu().cuDeviceGet(&d0, 0);
    cu().cuDeviceGetName(dev_name, sizeof dev_name, d0);
    say(fd, std::string("N ") + dev_name);
    std::vector<int> devs(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) devs[size_t(r)] = o.share ? 0 : r;
    std::vector<mkComm_t> comms(static_cast<size_t>(n));
    if (mkCommInitAll(comms.data(), n, devs.data()) != mkSuccess) {
      say(fd, std::string("E mkCommInitAll: ") + mkGetLastError(nullptr));
      return 2;
    }
    const size_t es = dtype_size(o.dtype);
    const int64_t max_count = count_for(coll, n, o.max_bytes, es);
    const size_t in_bytes = size_t(verify::input_elems(coll, n, max_count)) * es;
    const size_t out_bytes = size_t(verify::output_elems(coll, n, max_count)) * es;
    struct R {
      CUcontext ctx = nullptr;
      CUstream stream = nullptr;
      CUdeviceptr in = 0, out = 0;
    };
    std::vector<R> rs(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      R& x = rs[size_t(r)];
      CUdevice dev = 0;
      cu().cuDeviceGet(&dev, devs[size_t(r)]);
      if (cu().cuDevicePrimaryCtxRetain(&x.ctx, dev) != CUDA_SUCCESS || cu().cuCtxSetCurrent(x.ctx) != CUDA_SUCCESS ||
          cu().cuStreamCreate(&x.stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
          cu().cuMemAlloc(&x.in, std::max<size_t>(in_bytes, 16)) != CUDA_SUCCESS ||
          cu().cuMemAlloc(&x.out, std::max<size_t>(out_bytes, 16)) != CUDA_SUCCESS) {
        say(fd, "E cannot allocate the buffers");
        return 2;
      }
    }
    const auto dt = mkDataType_t(int(o.dtype));
    auto call_all = [&](int64_t count) {
      mkGroupStart();
      for (int r = 0; r < n; ++r) {
        const R& x = rs[size_t(r)];
        void* in = reinterpret_cast<void*>(uintptr_t(x.in));
        void* out = reinterpret_cast<void*>(uintptr_t(x.out));
        auto s = reinterpret_cast<cudaStream_t>(x.stream);
        const size_t c = size_t(count);
        switch (coll) {
          case Collective::allreduce: mkAllReduce(in, out, c, dt, mkSum, comms[size_t(r)], s); break;
          case Collective::allgather: mkAllGather(in, out, c, dt, comms[size_t(r)], s); break;
          case Collective::reducescatter: mkReduceScatter(in, out, c, dt, mkSum, comms[size_t(r)], s); break;
          case Collective::broadcast: mkBroadcast(in, out, c, dt, 0, comms[size_t(r)], s); break;
          case Collective::reduce: mkReduce(in, out, c, dt, mkSum, 0, comms[size_t(r)], s); break;
          case Collective::alltoall: mkAllToAll(in, out, c, dt, comms[size_t(r)], s); break;
        }
      }
      if (mkGroupEnd() != mkSuccess) throw rt::RtError(mkInternalError, mkGetLastError(nullptr));
    };
    auto sync = [&] {
      for (const R& x : rs)
        if (cu().cuStreamSynchronize(x.stream) != CUDA_SUCCESS) throw rt::RtError(mkUnhandledCudaError, "stream sync failed");
      for (mkComm_t c : comms) {
        mkResult_t e = mkSuccess;
        mkCommGetAsyncError(c, &e);
        if (e != mkSuccess) throw rt::RtError(e, mkGetLastError(c));
      }
    };
    for (int64_t bytes : sizes(o)) {
      const int64_t count = count_for(coll, n, bytes, es);
      const int64_t ie = verify::input_elems(coll, n, count), oe = verify::output_elems(coll, n, count);
      if (o.check && bytes <= (int64_t(16) << 20)) {
        verify::DataSpec d{o.dtype, RedOp::sum, 11, 0, n};
        std::vector<char> host(size_t(std::max(ie, oe)) * es);
        for (int r = 0; r < n; ++r) {
          verify::fill_input(d, r, 0, ie, host.data());
          cu().cuMemcpyHtoD(rs[size_t(r)].in, host.data(), size_t(ie) * es);
          cu().cuMemsetD8(rs[size_t(r)].out, 0xA5, size_t(oe) * es);
        }
        call_all(count);
        sync();
        std::string bad;
        for (int r = 0; r < n && bad.empty(); ++r) {
          if (!has_output(coll, r, 0)) continue;
          cu().cuMemcpyDtoH(host.data(), rs[size_t(r)].out, size_t(oe) * es);
          const auto c = verify::check_output(coll, d, n, 0, count, r, host.data(), oe);
          if (c.mismatches) bad = fmt::format("rank {}: {}", r, c.first_bad);
        }
        if (!bad.empty()) {
          say(fd, fmt::format("W {} {}", bytes, bad));
          continue;
        }
      }
      call_all(count);
      call_all(count);
      sync();
      const int iters = bytes <= (int64_t(1) << 20) ? 20 : bytes <= (int64_t(16) << 20) ? 10 : 3;
      std::vector<double> per;
      for (int b = 0; b < o.batches; ++b) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) call_all(count);
        sync();
        per.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters);
      }
      std::sort(per.begin(), per.end());
      say(fd, fmt::format("R {} {:.3f}", bytes, per[per.size() / 2]));
    }
    for (mkComm_t c : comms) mkCommDestroy(c);
    return 0;
  } catch (const std::exception& e) {
    say(fd, std::string("E ") + e.what());
    return 2;
  }
}

int run(const Options& o) {
  if (o.ranks < 1 || o.ranks > 64) throw Error(ErrId::cli_E004, "--ranks must be in 1..64");
  if (o.min_bytes < 1 || o.min_bytes > o.max_bytes || o.max_bytes > (int64_t(1) << 40))
    throw Error(ErrId::cli_E011, "need 1 <= --min-bytes <= --max-bytes <= 2^40");
  if (o.batches < 1) throw Error(ErrId::cli_E011, "--batches must be at least 1");
  const auto knobs = knob_variants(o.knobs);
  struct Candidate {
    Collective coll;
    std::string schedule, tune;
    Result res;
  };
  std::vector<Candidate> cands;
  for (Collective c : o.colls)
    for (const auto& s : schedules(c, o.ranks))
      for (const auto& k : knobs) cands.push_back({c, s, k, {}});
  if (cands.empty()) throw Error(ErrId::cli_E001, "no schedule lowers for these collectives and ranks");
  std::string device = "?";
  for (size_t i = 0; i < cands.size(); ++i) {
    Candidate& cand = cands[i];
    progress(i, cands.size(), fmt::format("{} {}", cand.schedule, cand.tune));
    int fds[2];
    if (::pipe(fds) != 0) throw Error(ErrId::cli_E012, "pipe failed");
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      setenv("MK_ALGO", fmt::format("{}={}", name(cand.coll), cand.schedule).c_str(), 1);
      const std::string t = merged_tune(cand.tune);
      if (t.empty())
        unsetenv("MK_TUNE");
      else
        setenv("MK_TUNE", t.c_str(), 1);
      setenv("NCCL_NVLS_ENABLE", "0", 1);
      _exit(child(o, cand.coll, fds[1]));
    }
    ::close(fds[1]);
    std::string text;
    char buf[4096];
    for (ssize_t k; (k = ::read(fds[0], buf, sizeof buf)) > 0;) text.append(buf, size_t(k));
    ::close(fds[0]);
    int st = 0;
    ::waitpid(pid, &st, 0);
    size_t at = 0;
    while (at < text.size()) {
      const size_t end = std::min(text.find('\n', at), text.size());
      const std::string line = text.substr(at, end - at);
      at = end + 1;
      if (line.size() < 2) continue;
      if (line[0] == 'N') device = line.substr(2);
      if (line[0] == 'E') cand.res.failed = line.substr(2);
      if (line[0] == 'R' || line[0] == 'W') {
        const size_t sp = line.find(' ', 2);
        try {
          if (sp == std::string::npos) throw std::invalid_argument("no value");
          const int64_t bytes = std::stoll(line.substr(2, sp - 2));
          if (line[0] == 'R')
            cand.res.us[bytes] = std::stod(line.substr(sp + 1));
          else
            cand.res.bad[bytes] = line.substr(sp + 1);
        } catch (const std::exception&) {
          cand.res.failed = "unreadable output from the candidate's process: " + line;
        }
      }
    }
    if (cand.res.failed.empty() && (!WIFEXITED(st) || WEXITSTATUS(st) != 0))
      cand.res.failed = fmt::format("exited with status {}", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    if (!cand.res.failed.empty() && cand.res.failed.find("GPU(s)") != std::string::npos) {
      std::fprintf(stderr, "\n");
      throw Error(ErrId::cli_E011, "mkc tune: " + cand.res.failed);
    }
  }
  progress(cands.size(), cands.size(), "done");
  if (::isatty(2)) std::fprintf(stderr, "\n");
  if (std::none_of(cands.begin(), cands.end(), [](const Candidate& c) { return !c.res.us.empty(); })) {
    std::string why = "no candidate ran";
    for (const Candidate& c : cands)
      if (!c.res.failed.empty()) {
        why += ": " + c.schedule + ": " + c.res.failed;
        break;
      }
    throw Error(ErrId::cli_E011, "mkc tune: " + why);
  }
  rt::SelectTable t;
  t.note = fmt::format("mkc tune: {} ranks {}, {}, {} sum, {} .. {} bytes in x2 steps, knobs {}; {}", o.ranks,
                       o.share ? "sharing GPU 0 (a one-GPU proxy: ranks share one GPU's memory, no link between "
                                 "them; do not ship this table)"
                               : "on GPUs 0.." + std::to_string(o.ranks - 1),
                       device, name(o.dtype), o.min_bytes, o.max_bytes, o.knobs, o.command);
  int excluded = 0;
  for (Collective c : o.colls) {
    // a candidate that computed a wrong result anywhere is a bug: never chosen
    std::vector<const Candidate*> ok;
    for (const Candidate& cand : cands) {
      if (cand.coll != c) continue;
      if (!cand.res.bad.empty()) {
        ++excluded;
        std::fprintf(stderr, "mkc tune: %s %s gave WRONG results at %lld bytes (%s): excluded\n",
                     cand.schedule.c_str(), cand.tune.c_str(), (long long)cand.res.bad.begin()->first,
                     cand.res.bad.begin()->second.c_str());
        continue;
      }
      if (!cand.res.failed.empty()) {
        std::fprintf(stderr, "mkc tune: %s %s did not run: %s\n", cand.schedule.c_str(), cand.tune.c_str(),
                     cand.res.failed.c_str());
        continue;
      }
      ok.push_back(&cand);
    }
    const auto sz = sizes(o);
    // measured at the larger buffer's size (nccl-tests' convention); the
    // table's sizes are the runtime's: count x element size
    auto unit = [&](int64_t bytes) { return count_for(c, o.ranks, bytes, dtype_size(o.dtype)) * int64_t(dtype_size(o.dtype)); };
    int64_t prev = -1;
    const Candidate* last = nullptr;
    for (size_t k = 0; k < sz.size(); ++k) {
      const Candidate* best = nullptr;
      double best_us = 0;
      for (const Candidate* cand : ok) {
        auto it = cand->res.us.find(sz[k]);
        if (it != cand->res.us.end() && (!best || it->second < best_us)) best = cand, best_us = it->second;
      }
      if (!best) continue;
      if (unit(sz[k]) <= prev && k + 1 != sz.size()) continue;  // tiny sizes: one element per rank already
      // Within kKeep of the best, the previous size's choice stays: fewer
      // ranges, and no flip-flop on measurement noise.
      constexpr double kKeep = 1.03;
      if (last && last != best) {
        auto it = last->res.us.find(sz[k]);
        if (it != last->res.us.end() && it->second <= best_us * kKeep) best = last, best_us = it->second;
      }
      last = best;
      const int64_t lo = prev + 1, hi = k + 1 == sz.size() ? -1 : unit(sz[k]);
      prev = unit(sz[k]);
      std::fprintf(stderr, "  %-13s %12lld B  %-24s %-22s %10.2f us\n", std::string(name(c)).c_str(),
                   (long long)sz[k], best->schedule.c_str(), best->tune.c_str(), best_us);
      if (!t.entries.empty() && t.entries.back().coll == c && t.entries.back().schedule == best->schedule &&
          t.entries.back().tune == best->tune) {
        t.entries.back().max_bytes = hi;
        continue;
      }
      rt::SelectEntry e;
      e.coll = c;
      e.min_ranks = e.max_ranks = o.ranks;
      e.min_bytes = lo;
      e.max_bytes = hi;
      e.schedule = best->schedule;
      e.tune = best->tune;
      t.entries.push_back(e);
    }
  }
  const std::string json = rt::to_json(t);
  rt::parse_select(json, "the table mkc tune wrote");  // what the runtime will read
  if (o.out.empty()) {
    std::cout << json;
  } else {
    std::ofstream f(o.out);
    f << json;
    if (!f) throw Error(ErrId::cli_E012, "cannot write " + o.out);
    std::fprintf(stderr, "wrote %s (%zu entries); use it with MK_SELECT_FILE=%s\n", o.out.c_str(), t.entries.size(),
                 o.out.c_str());
  }
  return excluded ? 1 : 0;
}

}  // namespace mk::tune
