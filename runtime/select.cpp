// Which schedule serves a call. A default table now; `mkc tune` will fill it
// with measurements. MK_ALGO overrides per collective:
//   MK_ALGO="allreduce=allreduce.ring,allgather=allgather.ring"
#include <fmt/format.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>

#include "mk/dsl.hpp"
#include "runtime/comm.hpp"
#include "runtime/status.hpp"

namespace mk::rt {

namespace {

const std::map<Collective, std::string>& overrides() {
  static std::map<Collective, std::string> m;
  static std::once_flag once;
  std::call_once(once, [] {
    const char* e = std::getenv("MK_ALGO");
    if (!e || !*e) return;
    std::stringstream ss(e);
    std::string item;
    while (std::getline(ss, item, ',')) {
      auto eq = item.find('=');
      if (eq == std::string::npos) continue;
      auto coll = parse_collective(item.substr(0, eq));
      if (coll) m[*coll] = item.substr(eq + 1);
    }
  });
  return m;
}

}  // namespace

Choice choose_schedule(Collective coll, int nranks, int64_t bytes) {
  const auto& o = overrides();
  if (auto it = o.find(coll); it != o.end()) {
    const dsl::ScheduleInfo* info = dsl::find_schedule(it->second);
    if (!info) fail(mkInvalidArgument, "MK_ALGO names unknown schedule '" + it->second + "'");
    if (info->coll != coll)
      fail(mkInvalidArgument, fmt::format("MK_ALGO: schedule '{}' implements {}, not {}", it->second,
                                          name(info->coll), name(coll)));
    return {it->second, 0, -1};
  }
  // Below `small`: one-shot (one hop, LL); above: a bandwidth schedule.
  const int64_t small = 256 << 10;
  auto split = [&](const char* below, const char* above) -> Choice {
    return bytes <= small ? Choice{below, 0, small} : Choice{above, small + 1, -1};
  };
  switch (coll) {
    case Collective::allreduce:
      if (nranks <= 2) return split("allreduce.one_shot", "allreduce.ring");
      return split("allreduce.one_shot", nranks <= 8 ? "allreduce.two_shot" : "allreduce.ring");
    case Collective::allgather: return {nranks <= 8 ? "allgather.direct" : "allgather.ring", 0, -1};
    case Collective::reducescatter: return {nranks <= 8 ? "reducescatter.direct" : "reducescatter.ring", 0, -1};
    case Collective::broadcast: return {"broadcast.direct", 0, -1};
    case Collective::reduce: return {"reduce.direct", 0, -1};
    case Collective::alltoall: return {"alltoall.direct", 0, -1};
  }
  return {"allreduce.ring", 0, -1};
}

}  // namespace mk::rt
