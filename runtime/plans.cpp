// Plans for the runtime: from MK_PLAN_DIR (written by `mkc compile`) or
// compiled on first use (JIT, with the on-disk cache), shared by every
// communicator of the process.
#include <fmt/format.h>

#include <filesystem>
#include <map>
#include <mutex>

#include "compiler/compile.hpp"
#include "mk/dsl.hpp"
#include "runtime/comm.hpp"
#include "runtime/status.hpp"

namespace mk::rt {
namespace fs = std::filesystem;

namespace {

struct Key {
  std::string schedule;
  int nranks;
  DType dtype;
  RedOp op;
  int arch;
  bool zero_copy;
  auto operator<=>(const Key&) const = default;
};

std::mutex& mutex() {
  static std::mutex m;
  return m;
}

std::map<Key, std::shared_ptr<const plan::Plan>>& cache() {
  static std::map<Key, std::shared_ptr<const plan::Plan>> c;
  return c;
}

// Every plan.json under MK_PLAN_DIR, read once.
const std::vector<std::shared_ptr<const plan::Plan>>& dir_plans() {
  static std::vector<std::shared_ptr<const plan::Plan>> plans;
  static bool loaded = false;
  if (loaded) return plans;
  loaded = true;
  const char* dir = std::getenv("MK_PLAN_DIR");
  if (!dir || !*dir) return plans;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail(mkInvalidArgument, std::string("MK_PLAN_DIR='") + dir + "' is not a directory");
  for (auto it = fs::recursive_directory_iterator(dir, ec); it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    if (it->path().filename() != "plan.json") continue;
    try {
      plans.push_back(std::make_shared<const plan::Plan>(plan::read_dir(it->path().parent_path().string())));
    } catch (const Error& e) {
      fail(mkInvalidArgument, std::string("MK_PLAN_DIR: ") + e.what());
    }
  }
  return plans;
}

// MK_TUNE="simple_instances=16,ll_instances=4,max_tile=262144,ll_max=65536":
// knobs for experiments and for `mkc tune`-style sweeps (plans compiled with
// other knobs get other cache keys).
void apply_tuning_env(passes::ProtocolOptions* p) {
  const char* e = std::getenv("MK_TUNE");
  if (!e || !*e) return;
  std::string s(e);
  size_t start = 0;
  while (start < s.size()) {
    size_t comma = s.find(',', start);
    std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    start = comma == std::string::npos ? s.size() : comma + 1;
    auto eq = item.find('=');
    if (eq == std::string::npos) fail(mkInvalidArgument, "MK_TUNE: '" + item + "' is not key=value");
    std::string key = item.substr(0, eq);
    int64_t v = std::atoll(item.c_str() + eq + 1);
    if (key == "simple_instances") p->simple_instances = int32_t(v);
    else if (key == "ll_instances") p->ll_instances = int32_t(v);
    else if (key == "max_tile") p->max_tile_bytes = v;
    else if (key == "ll_max") p->ll_max_bytes = v;
    else if (key == "scratch_budget") p->scratch_budget = v;
    else fail(mkInvalidArgument, "MK_TUNE: unknown key '" + key + "'");
  }
}

}  // namespace

std::shared_ptr<const plan::Plan> get_plan(const std::string& schedule, Collective coll, int nranks, DType dtype,
                                           RedOp op, int arch, bool zero_copy) {
  std::lock_guard<std::mutex> lock(mutex());
  Key key{schedule, nranks, dtype, op, arch, zero_copy};
  if (auto it = cache().find(key); it != cache().end()) return it->second;
  // Reduction ops do not exist for collectives that do not reduce: they share
  // the sum plan. For registered buffers a zero-copy plan is preferred; the
  // ordinary plan serves them too (through scratch).
  std::vector<std::shared_ptr<const plan::Plan>> candidates;
  for (const auto& p : dir_plans())
    if (p->zero_copy) candidates.push_back(p);
  for (const auto& p : dir_plans())
    if (!p->zero_copy) candidates.push_back(p);
  for (const auto& p : candidates) {
    if (p->schedule != schedule || p->dtype != dtype || (collective_reduces(coll) && p->op != op)) continue;
    if (p->zero_copy && !zero_copy) continue;
    if (p->nranks != nranks || p->arch != arch)
      fail(mkInvalidUsage, fmt::format("MK_PLAN_DIR holds plan {} ({} {}) compiled for {} ranks on sm_{}, but this "
                                       "communicator has {} ranks on sm_{}; recompile it with `mkc compile --ranks "
                                       "{} --arch sm_{}`",
                                       p->schedule, name(p->dtype), name(p->op), p->nranks, p->arch, nranks, arch,
                                       nranks, arch));
    cache()[key] = p;
    return p;
  }
  const dsl::ScheduleInfo* info = dsl::find_schedule(schedule);
  if (!info) fail(mkInternalError, "no schedule named " + schedule);
  compiler::CompileOptions o;
  o.arch = arch;
  o.dtype = dtype;
  o.op = collective_reduces(coll) ? op : RedOp::sum;
  o.lower.zero_copy = zero_copy;
  apply_tuning_env(&o.lower.proto);
  try {
    auto p = std::make_shared<const plan::Plan>(compiler::compile_plan(dsl::build(*info, nranks, 0), o));
    debug_log(fmt::format("compiled plan {}{} for {} ranks, {} {}, sm_{}", schedule, p->zero_copy ? " (zero-copy)" : "",
                          nranks, name(dtype), name(op), arch));
    cache()[key] = p;
    return p;
  } catch (const Error& e) {
    fail(mkInternalError, std::string("compiling plan ") + schedule + ": " + e.what());
  }
}

}  // namespace mk::rt
