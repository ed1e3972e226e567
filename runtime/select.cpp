// Which schedule serves a call. Up to 8 ranks a default table (from the
// measurements on 2 x H200; `mkc tune` will fill it); above, where nothing has
// been measured, the cost model (compiler/cost estimate_us) picks among the
// built-in schedules of the collective. MK_ALGO overrides per collective:
//   MK_ALGO="allreduce=allreduce.ring,allgather=allgather.ring"
// (every item a collective and a built-in schedule of it, runtime/env.hpp).
#include <fmt/format.h>

#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "compiler/cost/cost.hpp"
#include "compiler/pipeline.hpp"
#include "mk/dsl.hpp"
#include "runtime/comm.hpp"
#include "runtime/env.hpp"
#include "runtime/status.hpp"

namespace mk::rt {

namespace {

// MK_ALGO, parsed and checked once (runtime/env.hpp). A malformed value
// throws from every call: the static is only set once parsing succeeded.
const std::map<Collective, std::string>& overrides() {
  static const std::map<Collective, std::string> m = env::algo();
  return m;
}

// The built-in schedules of `coll`, lowered for `nranks` ranks on one node,
// once per process (those that do not lower at this rank count are left out).
const std::vector<std::pair<std::string, compiler::Lowered>>& candidates(Collective coll, int nranks) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, std::vector<std::pair<std::string, compiler::Lowered>>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto [it, fresh] = cache.try_emplace({int(coll), nranks});
  if (!fresh) return it->second;
  compiler::LowerOptions o;
  env::apply_tune(&o.proto);
  for (const auto& info : dsl::registered_schedules()) {
    if (info.coll != coll) continue;
    try {
      it->second.emplace_back(info.name, compiler::lower(dsl::build(info, nranks, 0), o));
    } catch (const Error&) {
      // e.g. a schedule for other rank counts
    }
  }
  return it->second;
}

// Sizes are judged per power-of-two range [2^k, 2^(k+1)) (below 1 KiB: one
// range), at its upper end; the same on every rank.
Choice estimated(Collective coll, int nranks, int64_t bytes) {
  int64_t lo = 0, hi = 1023;
  if (bytes >= 1024) {
    lo = 1024;
    while (lo <= bytes / 2) lo *= 2;
    hi = lo * 2 - 1;
  }
  const auto& all = candidates(coll, nranks);
  if (all.empty()) fail(mkInternalError, fmt::format("no built-in {} schedule lowers for {} ranks", name(coll), nranks));
  const topology::Topology topo = topology::parse("", nranks);
  const std::string* best = nullptr;
  double best_us = 0;
  for (const auto& [schedule, lowered] : all) {
    const double us = cost::estimate_us(compiler::variant_for(lowered, hi), topo, hi);
    if (!best || us < best_us) best = &schedule, best_us = us;
  }
  return {*best, lo, hi};
}

}  // namespace

Choice choose_schedule(Collective coll, int nranks, int64_t bytes, bool zero_copy) {
  const auto& o = overrides();
  if (auto it = o.find(coll); it != o.end()) {
    return {it->second, 0, -1};
  }
  // Registered buffers: the schedules that read and write peers' buffers in
  // place (no scratch, no flag inside the kernel); the runtime only goes
  // zero-copy from MK_ZERO_COPY_MIN_BYTES on.
  if (zero_copy && nranks <= 8) {
    if (coll == Collective::allreduce) return {"allreduce.direct", 0, -1};
    if (coll == Collective::reducescatter) return {"reducescatter.pull", 0, -1};
  }
  if (nranks > 8) return estimated(coll, nranks, bytes);
  // Below `small`: one-shot (one hop, LL); above: a bandwidth schedule.
  const int64_t small = 256 << 10;
  auto split = [&](const char* below, const char* above) -> Choice {
    return bytes <= small ? Choice{below, 0, small} : Choice{above, small + 1, -1};
  };
  switch (coll) {
    case Collective::allreduce:
      if (nranks <= 2) return split("allreduce.one_shot", "allreduce.ring");
      return split("allreduce.one_shot", "allreduce.two_shot");
    case Collective::allgather: return {"allgather.direct", 0, -1};
    case Collective::reducescatter: return {"reducescatter.direct", 0, -1};
    case Collective::broadcast: return {"broadcast.direct", 0, -1};
    case Collective::reduce: return {"reduce.direct", 0, -1};
    case Collective::alltoall: return {"alltoall.direct", 0, -1};
  }
  return {"allreduce.ring", 0, -1};
}

}  // namespace mk::rt
