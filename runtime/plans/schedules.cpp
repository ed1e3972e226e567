#include "runtime/plans/schedules.hpp"

#include <fmt/format.h>

#include <map>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "compiler/ir/ir.hpp"
#include "compiler/jit/jit.hpp"
#include "compiler/pipeline.hpp"
#include "compiler/sources.hpp"
#include "mk/dsl.hpp"
#include "runtime/comm/env.hpp"
#include "runtime/plans/plans.hpp"
#include "runtime/plans/select.hpp"
#include "runtime/api/status.hpp"

namespace mk::rt {

namespace {

// Loads a list; mk::Error (the loader's, with its id and file) becomes an
// RtError naming where the list came from.
std::vector<sources::Source> load_list(const std::string& list, const std::string& where) {
  try {
    return sources::load(list);
  } catch (const std::exception& e) {  // mk::Error's text carries its id and the file's line
    fail(mkInvalidArgument, fmt::format("{}: {}", where, e.what()));
  }
}

std::vector<std::string> names_of(const std::vector<sources::Source>& s) {
  std::vector<std::string> out;
  for (const auto& src : s) out.insert(out.end(), src.schedules.begin(), src.schedules.end());
  return out;
}

const std::vector<sources::Source>& env_sources() {
  // A throwing initialiser leaves the static unset: the next call tries again.
  static const std::vector<sources::Source> s = [] {
    const auto list = env::raw("MK_SCHEDULES");
    return list ? load_list(*list, "MK_SCHEDULES='" + *list + "'") : std::vector<sources::Source>{};
  }();
  return s;
}

std::mutex& proof_mutex() {
  static std::mutex m;
  return m;
}

struct Proof {
  bool built = false;
  std::string why_not;  // built: "" when proved, else the verifier's error; not built: the builder's
  std::string ir_hash;  // built: a hash of the IR it builds for nranks (what ranks compare)
};
// (schedule, nranks) -> what building and proving it gave (deterministic: kept)
std::map<std::pair<std::string, int>, Proof>& proofs() {
  static std::map<std::pair<std::string, int>, Proof> m;
  return m;
}

const Proof& prove(const dsl::ScheduleInfo& info, int nranks) {
  const auto key = std::make_pair(info.name, nranks);
  {
    std::lock_guard<std::mutex> lock(proof_mutex());
    if (auto it = proofs().find(key); it != proofs().end()) return it->second;
  }
  Proof p;
  ir::Schedule raw;
  try {
    raw = dsl::build(info, nranks, 0);
    p.built = true;
  } catch (const std::exception& e) {
    // Not for this rank count (an imported file's other rank count, or a
    // builder that refuses it): not a candidate here. Naming it in MK_ALGO
    // or MK_SELECT_FILE for this rank count is the error (below).
    p.why_not = e.what();
    debug_log(fmt::format("user schedule {} does not build for {} ranks: {}", info.name, nranks, e.what()));
  }
  if (p.built) {
    p.ir_hash = jit::hash_hex(ir::print(raw));
    try {
      compiler::LowerOptions o;
      env::apply_tune(&o.proto);
      (void)compiler::lower(std::move(raw), o);
      debug_log(fmt::format("user schedule {} proved for {} ranks", info.name, nranks));
    } catch (const std::exception& e) {
      p.why_not = fmt::format("user schedule '{}' ({}) is not proved for {} ranks: {}", info.name, info.file, nranks,
                              e.what());
    }
  }
  std::lock_guard<std::mutex> lock(proof_mutex());
  return proofs().emplace(key, std::move(p)).first->second;  // std::map: references stay valid
}

}  // namespace

std::string env_schedules() { return sources::describe(env_sources()); }

std::string config_schedules(const std::string& config_list) {
  if (config_list.empty()) return "";
  return sources::describe(load_list(config_list, "config schedules='" + config_list + "'"));
}

std::string prove_user_schedules(const std::string& config_list, int nranks) {
  std::vector<std::string> listed = names_of(env_sources());
  if (!config_list.empty()) {
    const auto more = names_of(load_list(config_list, "config schedules='" + config_list + "'"));
    listed.insert(listed.end(), more.begin(), more.end());
  }
  // What the settings select for this rank count.
  std::vector<std::pair<std::string, std::string>> named;  // schedule, where
  for (const auto& [coll, schedule] : env::algo()) named.emplace_back(schedule, "MK_ALGO");
  for (const SelectEntry& e : file_select().entries)
    if (nranks >= e.min_ranks && nranks <= e.max_ranks) named.emplace_back(e.schedule, "MK_SELECT_FILE");
  // User schedules this communicator can run: listed for it, or selected
  // (also ones another communicator of this process loaded).
  std::set<std::string> selectable(listed.begin(), listed.end());
  for (const auto& [schedule, where] : named) {
    const dsl::ScheduleInfo* info = dsl::find_schedule(schedule);
    if (!info) {
      // known from MK_PLAN_DIR's plans alone: they must include this rank count
      const auto d = plan_dir_schedule(schedule);
      if (!d) fail(mkInvalidArgument, fmt::format("{} names schedule '{}', which is not loaded", where, schedule));
      if (!d->nranks.count(nranks)) {
        std::string have;
        for (int32_t n : d->nranks) have += (have.empty() ? "" : ", ") + std::to_string(n);
        fail(mkInvalidArgument,
             fmt::format("{} selects schedule '{}' for {} ranks, but it is known only from MK_PLAN_DIR, whose plans of "
                         "it are for {} ranks; compile one with `mkc compile --ranks {}` or load its source with "
                         "MK_SCHEDULES",
                         where, schedule, nranks, have, nranks));
      }
      continue;
    }
    std::string why_not;  // "" when it builds for nranks
    if (sources::is_user_schedule(schedule)) {
      selectable.insert(schedule);
      const Proof& p = prove(*info, nranks);
      if (!p.built) why_not = p.why_not;
    } else {
      // a built-in: building it is enough (built-ins are proved by the test suite)
      try {
        (void)dsl::build(*info, nranks, 0);
      } catch (const std::exception& e) {
        why_not = e.what();
      }
    }
    if (!why_not.empty())
      fail(mkInvalidArgument, fmt::format("{} selects schedule '{}' for {} ranks, but it does not build for {} ranks: {}",
                                          where, schedule, nranks, nranks, why_not));
  }
  // Prove each; what ranks compare is the IR each builds, so that files that
  // differ anywhere (an included header, a builder reading the environment)
  // cannot run as one schedule.
  std::string agreed;
  for (const std::string& n : selectable) {
    const dsl::ScheduleInfo* info = dsl::find_schedule(n);
    if (!info) fail(mkInternalError, "user schedule " + n + " vanished from the registry");
    const Proof& p = prove(*info, nranks);
    if (p.built && !p.why_not.empty()) fail(mkInvalidArgument, p.why_not);
    agreed += fmt::format("{}{}@{}", agreed.empty() ? "" : ",", n, p.built ? p.ir_hash : "-");
  }
  return agreed;
}

}  // namespace mk::rt
