#include "runtime/schedules.hpp"

#include <fmt/format.h>

#include <map>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "compiler/pipeline.hpp"
#include "compiler/sources.hpp"
#include "mk/dsl.hpp"
#include "runtime/env.hpp"
#include "runtime/plans.hpp"
#include "runtime/select.hpp"
#include "runtime/status.hpp"

namespace mk::rt {

namespace {

// Loads a list; mk::Error (the loader's, with its id and file) becomes an
// RtError naming where the list came from.
std::vector<sources::Source> load_list(const std::string& list, const std::string& where) {
  try {
    return sources::load(list);
  } catch (const Error& e) {
    fail(mkInvalidArgument, fmt::format("{}: {}", where, e.what()));
  } catch (const std::exception& e) {
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
// (schedule, nranks) -> "" when it proved (or does not build for nranks), else the error.
std::map<std::pair<std::string, int>, std::string>& proofs() {
  static std::map<std::pair<std::string, int>, std::string> m;
  return m;
}
// (schedule, nranks) -> "" when it builds, else why not.
std::map<std::pair<std::string, int>, std::string>& builds() {
  static std::map<std::pair<std::string, int>, std::string> m;
  return m;
}

std::string try_build(const dsl::ScheduleInfo& info, int nranks) {
  const auto key = std::make_pair(info.name, nranks);
  {
    std::lock_guard<std::mutex> lock(proof_mutex());
    if (auto it = builds().find(key); it != builds().end()) return it->second;
  }
  std::string why;
  try {
    (void)dsl::build(info, nranks, 0);
  } catch (const std::exception& e) {
    why = e.what();
  }
  std::lock_guard<std::mutex> lock(proof_mutex());
  builds()[key] = why;
  return why;
}

void prove(const dsl::ScheduleInfo& info, int nranks) {
  const auto key = std::make_pair(info.name, nranks);
  {
    std::lock_guard<std::mutex> lock(proof_mutex());
    if (auto it = proofs().find(key); it != proofs().end()) {
      if (!it->second.empty()) fail(mkInvalidArgument, it->second);
      return;
    }
  }
  std::string error;
  ir::Schedule raw;
  bool built = false;
  try {
    raw = dsl::build(info, nranks, 0);
    built = true;
  } catch (const std::exception& e) {
    // Not for this rank count (an imported file's other rank count, or a
    // builder that refuses it): not a candidate here. Naming it in MK_ALGO
    // or MK_SELECT_FILE for this rank count is the error (below).
    debug_log(fmt::format("user schedule {} does not build for {} ranks: {}", info.name, nranks, e.what()));
  }
  if (built) {
    try {
      compiler::LowerOptions o;
      env::apply_tune(&o.proto);
      (void)compiler::lower(std::move(raw), o);
      debug_log(fmt::format("user schedule {} proved for {} ranks", info.name, nranks));
    } catch (const std::exception& e) {
      error = fmt::format("user schedule '{}' ({}) is not proved for {} ranks: {}", info.name, info.file, nranks,
                          e.what());
    }
  }
  std::lock_guard<std::mutex> lock(proof_mutex());
  proofs()[key] = error;
  if (!error.empty()) fail(mkInvalidArgument, error);
}

}  // namespace

std::string env_schedules() { return sources::describe(env_sources()); }

std::string config_schedules(const std::string& config_list) {
  if (config_list.empty()) return "";
  return sources::describe(load_list(config_list, "config schedules='" + config_list + "'"));
}

void prove_user_schedules(const std::string& config_list, int nranks) {
  std::vector<std::string> mine = names_of(env_sources());
  if (!config_list.empty()) {
    const auto more = names_of(load_list(config_list, "config schedules='" + config_list + "'"));
    mine.insert(mine.end(), more.begin(), more.end());
  }
  std::set<std::string> done;
  for (const std::string& n : mine) {
    if (!done.insert(n).second) continue;
    const dsl::ScheduleInfo* info = dsl::find_schedule(n);
    if (!info) fail(mkInternalError, "user schedule " + n + " vanished from the registry");
    prove(*info, nranks);
  }
  // What the settings name for this rank count must build for it.
  std::vector<std::pair<std::string, std::string>> named;  // schedule, where
  for (const auto& [coll, schedule] : env::algo()) named.emplace_back(schedule, "MK_ALGO");
  for (const SelectEntry& e : file_select().entries)
    if (nranks >= e.min_ranks && nranks <= e.max_ranks) named.emplace_back(e.schedule, "MK_SELECT_FILE");
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
    const std::string why = try_build(*info, nranks);
    if (!why.empty())
      fail(mkInvalidArgument, fmt::format("{} selects schedule '{}' for {} ranks, but it does not build for {} "
                                          "ranks: {}",
                                          where, schedule, nranks, nranks, why));
  }
}

}  // namespace mk::rt
