// Which schedule serves a call. A default table now; `mkc tune` will fill it
// with measurements. MK_ALGO overrides per collective:
//   MK_ALGO="allreduce=allreduce.ring,allgather=allgather.ring"
// (every item a collective and a built-in schedule of it, runtime/env.hpp).
#include <fmt/format.h>

#include <map>

#include "runtime/comm.hpp"
#include "runtime/env.hpp"

namespace mk::rt {

namespace {

// MK_ALGO, parsed and checked once (runtime/env.hpp). A malformed value
// throws from every call: the static is only set once parsing succeeded.
const std::map<Collective, std::string>& overrides() {
  static const std::map<Collective, std::string> m = env::algo();
  return m;
}

}  // namespace

Choice choose_schedule(Collective coll, int nranks, int64_t bytes) {
  const auto& o = overrides();
  if (auto it = o.find(coll); it != o.end()) {
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
