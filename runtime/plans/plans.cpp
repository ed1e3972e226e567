// Plans for the runtime: from MK_PLAN_DIR (written by `mkc compile`) or
// compiled on first use (JIT, with the on-disk cache), shared by every
// communicator of the process. MK_TUNE (runtime/comm/env.hpp) shapes compiled
// plans and is part of their key.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <condition_variable>
#include <iterator>
#include <memory>
#include <set>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>

#include "compiler/common/trusted_fs.hpp"
#include "compiler/compile.hpp"
#include "compiler/jit/jit.hpp"
#include "mk/dsl.hpp"
#include "runtime/comm/comm.hpp"
#include "runtime/comm/env.hpp"
#include "runtime/plans/select.hpp"
#include "runtime/plans/plans.hpp"
#include "runtime/api/status.hpp"

namespace mk::rt {
namespace fs = std::filesystem;

namespace {

std::mutex& mutex() {
  static std::mutex m;
  return m;
}

// Plans by what they were made from: the schedule, the rank count and every
// compile option but the rank serialised (compiler::options_json), MK_TUNE
// included; under one key, the plans of the classes this process has asked
// for (each serves the ranks of its class, or every rank).
std::map<std::string, std::vector<std::shared_ptr<const plan::Plan>>>& cache() {
  static std::map<std::string, std::vector<std::shared_ptr<const plan::Plan>>> c;
  return c;
}

// What MK_PLAN_DIR held when it was last read. A failure is kept and thrown
// again by every later call, so that no call after the first quietly runs
// without the plans the user asked for.
struct PlanDir {
  std::optional<std::string> dir;  // the MK_PLAN_DIR it was read for (nullopt: unset)
  bool read = false;
  std::vector<std::shared_ptr<const plan::Plan>> plans;
  std::string digest = "none";
  std::optional<RtError> error;
};

[[noreturn]] void untrusted(const std::string& what) {
  fail(mkInvalidArgument, Error(ErrId::plan_E007, what, {},
                                "plans are code: keep them in a directory tree only you (or root) can write, "
                                "without symbolic links")
                              .what());
}

PlanDir load_plan_dir(const std::string& dir) {
  PlanDir d;
  d.dir = dir;
  d.read = true;
  try {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) fail(mkInvalidArgument, "MK_PLAN_DIR='" + dir + "' is not a directory");
    // Plans are code: the directory, every directory above it and every
    // directory and file read below it pass one policy (trusted_fs.hpp).
    if (std::string why = tfs::tree_problem(dir); !why.empty())
      untrusted("MK_PLAN_DIR='" + dir + "' is not used: " + why);
    std::vector<fs::path> files;
    for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec)) {
      const fs::file_status ls = it->symlink_status(ec);
      if (ec) break;
      if (fs::is_symlink(ls)) {  // not followed: a tree never leaves itself
        debug_log("MK_PLAN_DIR: " + it->path().string() + " is a symbolic link, not followed (plans behind it are "
                  "not used; copy them into the directory)");
        continue;
      }
      if (fs::is_directory(ls)) {
        if (std::string why = tfs::entry_problem(it->path()); !why.empty())
          untrusted("MK_PLAN_DIR: " + it->path().string() + " is not used: it is " + why);
      }
      if (it->path().filename() == "plan.json") files.push_back(it->path());
    }
    if (ec) fail(mkInvalidArgument, "MK_PLAN_DIR='" + dir + "' cannot be listed: " + ec.message());
    std::sort(files.begin(), files.end());
    std::string all;
    for (const auto& f : files) {
      std::shared_ptr<const plan::Plan> p;
      try {
        auto read = std::make_shared<const plan::Plan>(plan::read_dir(f.parent_path().string()));
        plan::check_version(*read, f.string());
        p = std::move(read);
      } catch (const Error& e) {
        fail(mkInvalidArgument, std::string("MK_PLAN_DIR: ") + e.what());
      }
      all += "\n//plan " + fs::relative(f, dir, ec).string() + "\n" + plan::to_json(*p);
      for (const auto& k : p->kernels)
        all += "\n//cubin " + k.cubin_file + "\n" + std::string(k.cubin.begin(), k.cubin.end());
      d.plans.push_back(std::move(p));
    }
    d.digest = jit::hash_hex(all);
  } catch (const RtError& e) {
    d.error = e;
  }
  return d;
}

// Bumped (under mutex()) each time the cache is cleared for a new MK_PLAN_DIR:
// a plan compiled while the lock was released is then not kept.
uint64_t& generation() {
  static uint64_t g = 0;
  return g;
}

// Plans being compiled right now, by key (under mutex()): a second caller
// waits for the first instead of compiling the same plan again (ranks of one
// process, prewarm threads), unless the first's plan will not serve it: each
// compile tells, from its code generation (before NVRTC), the ranks its plan
// will serve at most, so that ranks of one process whose code differs (a
// one-pass kernel: a code path per rank) compile at once, not one after
// another. `compiled` is notified when one finishes or tells.
struct Compiling {
  bool every_rank = true;       // no bucket has narrowed its ranks (yet)
  std::vector<int32_t> serves;  // else: the ranks it will serve at most, ascending
  bool excludes(int32_t rank) const {
    return !every_rank && !std::binary_search(serves.begin(), serves.end(), rank);
  }
};
std::map<std::string, std::vector<std::shared_ptr<Compiling>>>& in_flight() {
  static std::map<std::string, std::vector<std::shared_ptr<Compiling>>> m;
  return m;
}
PlanCompiles& compiles() {  // under mutex()
  static PlanCompiles c;
  return c;
}
int& compiling_now() {  // under mutex()
  static int n = 0;
  return n;
}
std::condition_variable& compiled() {
  static std::condition_variable cv;
  return cv;
}

// Every plan.json under MK_PLAN_DIR, read again when the variable changes.
// Called with mutex() held.
const std::vector<std::shared_ptr<const plan::Plan>>& dir_plans(std::string* digest = nullptr) {
  static PlanDir state;
  const std::optional<std::string> dir = env::raw("MK_PLAN_DIR");
  if (!state.read || state.dir != dir) {
    state = dir ? load_plan_dir(*dir) : PlanDir{dir, true, {}, "none", std::nullopt};
    cache().clear();  // what came from the previous directory no longer holds
    ++generation();
  }
  if (state.error) throw *state.error;
  if (digest) *digest = state.digest;
  return state.plans;
}

}  // namespace

std::string plan_dir_digest() {
  std::lock_guard<std::mutex> lock(mutex());
  std::string digest;
  dir_plans(&digest);
  return digest;
}

std::optional<DirSchedule> plan_dir_schedule(const std::string& schedule) {
  std::lock_guard<std::mutex> lock(mutex());
  std::optional<DirSchedule> out;
  for (const auto& p : dir_plans()) {
    if (p->schedule != schedule) continue;
    if (!out) out = DirSchedule{p->coll, {}};
    out->nranks.insert(p->nranks);
  }
  return out;
}

std::optional<Collective> schedule_collective(const std::string& schedule) {
  if (const dsl::ScheduleInfo* info = dsl::find_schedule(schedule)) return info->coll;
  if (const auto d = plan_dir_schedule(schedule)) return d->coll;
  return std::nullopt;
}

PlanCompiles plan_compiles(bool reset) {
  std::lock_guard<std::mutex> lock(mutex());
  const PlanCompiles c = compiles();
  if (reset) compiles() = {};
  return c;
}

DType kernel_dtype(Collective coll, DType dtype) {
  if (collective_reduces(coll)) return dtype;
  switch (dtype_size(dtype)) {
    case 1: return DType::uint8;
    case 2: return DType::fp16;  // (no 16-bit integer type: a copy moves the bits either way)
    case 4: return DType::uint32;
    default: return DType::uint64;
  }
}

bool plain_topology(const topology::Topology& t) { return t.nodes == 1 && !t.direct && t.rails.empty(); }

compiler::CompileOptions plan_options(Collective coll, DType dtype, RedOp op, int arch, bool zero_copy,
                                      int32_t max_grid, int32_t rank, const std::string& tune,
                                      const std::string& fusion) {
  compiler::CompileOptions o;
  o.arch = arch;
  o.dtype = kernel_dtype(coll, dtype);
  o.op = collective_reduces(coll) ? op : RedOp::sum;
  o.lower.zero_copy = zero_copy;
  env::apply_tune(&o.lower.proto);
  if (!tune.empty()) env::apply_tune(tune, &o.lower.proto);
  o.lower.proto.max_grid = max_grid;
  o.rank = rank;
  o.fusion = fusion;
  // MK_FUSION_CHECK=1: fused plans with checked epilogue accessors (debugging)
  o.fusion_check = !fusion.empty() && env::get_bool("MK_FUSION_CHECK", false);
  return o;
}

std::vector<Choice> schedules_for(Collective coll, const topology::Topology& topo, bool copy_engine) {
  // every size range choose_schedule distinguishes: where each table entry
  // starts and ends (an entry may sit inside a later, wider one), and powers
  // of two up to 2^44 (the cost model's ranges)
  std::set<int64_t> at{0};
  for (int64_t b = 1024; b <= (int64_t(1) << 44); b *= 2) at.insert(b);
  for (const SelectTable* t : {&file_select(), &builtin_select()})
    for (const SelectEntry& e : t->entries)
      if (e.coll == coll && !e.registered && e.fits(topo)) {
        at.insert(e.min_bytes);
        if (e.max_bytes >= 0) at.insert(e.max_bytes + 1);
      }
  std::vector<Choice> out;
  for (int64_t bytes : at) {
    const Choice c = choose_schedule(coll, topo, bytes);
    const dsl::ScheduleInfo* info = dsl::find_schedule(c.schedule);
    if ((info && info->copy_engine) != copy_engine) continue;
    if (std::none_of(out.begin(), out.end(), [&](const Choice& x) { return x.schedule == c.schedule && x.tune == c.tune; }))
      out.push_back(c);
  }
  return out;
}

std::shared_ptr<const plan::Plan> get_plan(const std::string& schedule, Collective coll,
                                           const topology::Topology& topo, DType dtype, RedOp op, int arch,
                                           bool zero_copy, int32_t max_grid, int32_t rank, const std::string& tune,
                                           const std::string& fusion) {
  const int nranks = topo.nranks();
  const bool plain = plain_topology(topo);  // one node: built without a topology, as always
  compiler::CompileOptions o = plan_options(coll, dtype, op, arch, zero_copy, max_grid, -1, tune, fusion);
  const std::string fusion_id = compiler::fusion_identity(fusion);  // what a matching plan.json holds
  const std::string key = fmt::format("{}|{}|{}", schedule, plain ? std::to_string(nranks) : topology::to_json(topo).dump(),
                                      compiler::options_json(o));
  o.rank = rank;
  // A collective that only moves data: its size's plan (kernel_dtype), or,
  // from MK_PLAN_DIR, one compiled for the call's own type.
  auto of_type = [&](const plan::Plan& p) { return p.dtype == o.dtype || p.dtype == dtype; };
  std::unique_lock<std::mutex> lock(mutex());
  for (;;) {
    const auto& from_dir = dir_plans();
    {
      auto& known = cache()[key];
      for (const auto& p : known)  // (a plan from MK_PLAN_DIR may be of another call's type: not that one)
        if ((rank < 0 ? p->serves.empty() : plan::serves(*p, rank)) && of_type(*p)) return p;
    }
    // Reduction ops do not exist for collectives that do not reduce: they share
    // the sum plan. For registered buffers a zero-copy plan is preferred; the
    // ordinary plan serves them too (through scratch).
    std::vector<std::shared_ptr<const plan::Plan>> candidates;
    for (const auto& p : from_dir)
      if (p->zero_copy) candidates.push_back(p);
    for (const auto& p : from_dir)
      if (!p->zero_copy) candidates.push_back(p);
    // A plan compiled for other ranks (mkc compile --rank) is skipped while
    // another one serves this rank; if none does, that is the error.
    std::shared_ptr<const plan::Plan> elsewhere;
    for (const auto& p : candidates) {
      if (p->schedule != schedule || !of_type(*p) ||
          (collective_reduces(coll) && p->op != op) ||
          p->fusion != fusion_id || p->fusion_check != o.fusion_check)
        continue;
      if (p->zero_copy && !zero_copy) continue;
      if (p->nranks == nranks && p->arch == arch &&
          (p->topology && !plain_topology(*p->topology) ? *p->topology : topology::single(nranks)) !=
              (plain ? topology::single(nranks) : topo))
        fail(mkInvalidUsage, fmt::format("MK_PLAN_DIR holds plan {} ({} {}) compiled for topology {}, but this "
                                         "communicator's machine is {}; recompile it with `mkc compile --topology {}` "
                                         "(or --topology-file from `mkc topo`)",
                                         p->schedule, name(p->dtype), name(p->op),
                                         p->topology.value_or(topology::single(nranks)).name(), topo.name(),
                                         topo.name()));
      if (p->nranks != nranks || p->arch != arch)
        fail(mkInvalidUsage, fmt::format("MK_PLAN_DIR holds plan {} ({} {}) compiled for {} ranks on sm_{}, but this "
                                         "communicator has {} ranks on sm_{}; recompile it with `mkc compile --ranks "
                                         "{} --arch sm_{}`",
                                         p->schedule, name(p->dtype), name(p->op), p->nranks, p->arch, nranks, arch,
                                         nranks, arch));
      if (!plan::serves(*p, rank < 0 ? 0 : rank) || (rank < 0 && !p->serves.empty())) {
        if (!elsewhere) elsewhere = p;
        continue;
      }
      cache()[key].push_back(p);
      return p;
    }
    if (elsewhere && rank >= 0) {
      try {
        plan::check_serves(*elsewhere, rank, "MK_PLAN_DIR");  // throws: it does not serve `rank`
      } catch (const Error& e) {
        fail(mkInvalidUsage, e.what());
      }
    }
    if (elsewhere)
      fail(mkInvalidUsage, fmt::format("MK_PLAN_DIR holds plan {} compiled for ranks {} only, but a plan for every "
                                       "rank is needed; recompile it without --rank",
                                       elsewhere->schedule, plan::served_ranks(*elsewhere)));
    const dsl::ScheduleInfo* info = dsl::find_schedule(schedule);
    if (!info) {
      // selected because MK_PLAN_DIR has plans of it (its source is not loaded)
      bool known = false;
      for (const auto& p : from_dir) known = known || p->schedule == schedule;
      if (known)
        fail(mkInvalidUsage,
             fmt::format("schedule {} is known only from MK_PLAN_DIR's plans, and none of them is for {} {}{}, {} "
                         "ranks, sm_{}; compile one with `mkc compile` (--dtype {} --op {} --ranks {} --arch sm_{}{}) "
                         "or load its source with MK_SCHEDULES",
                         schedule, name(dtype), name(op), zero_copy ? " zero-copy" : "", nranks, arch, name(dtype),
                         name(op), nranks, arch, zero_copy ? " --zero-copy" : ""));
      fail(mkInternalError, "no schedule named " + schedule);
    }
    // Another thread compiles this key: wait for it, then look again (its
    // plan may serve this rank too), unless its plan will not serve this rank.
    if (auto it = in_flight().find(key);
        it != in_flight().end() && std::any_of(it->second.begin(), it->second.end(), [&](const auto& c) {
          return rank < 0 || !c->excludes(rank);
        })) {
      compiled().wait(lock);
      continue;
    }
    // Compiled without the lock, so that communicators (and mkCommPrewarm's
    // threads) compile different plans at once.
    const uint64_t gen = generation();
    auto mine = std::make_shared<Compiling>();
    in_flight()[key].push_back(mine);
    ++compiles().started;
    compiles().peak_at_once = std::max(compiles().peak_at_once, ++compiling_now());
    lock.unlock();
    auto on_serves = [mine](const std::vector<int32_t>& ranks) {
      if (ranks.empty()) return;  // this bucket serves every rank
      std::lock_guard<std::mutex> g(mutex());
      if (mine->every_rank) {
        mine->serves = ranks;
        mine->every_rank = false;
      } else {
        std::vector<int32_t> both;
        std::set_intersection(mine->serves.begin(), mine->serves.end(), ranks.begin(), ranks.end(),
                              std::back_inserter(both));
        mine->serves = std::move(both);
      }
      compiled().notify_all();
    };
    std::shared_ptr<const plan::Plan> p;
    compiler::CompileStats st;
    std::exception_ptr error;
    try {
      p = std::make_shared<const plan::Plan>(compiler::compile_plan(
          plain ? dsl::build(*info, nranks, 0) : dsl::build(*info, topo, 0), o, &st, on_serves));
    } catch (const Error& e) {
      const std::string why = std::string("compiling plan ") + schedule + ": " + e.what();
      error = e.id() == ErrId::verify_E018 || e.id() == ErrId::verify_E019 ? std::make_exception_ptr(ScheduleRefused(why))
                                           : std::make_exception_ptr(RtError(mkInternalError, why));
    } catch (const std::exception& e) {
      error = std::make_exception_ptr(RtError(mkInternalError, std::string("compiling plan ") + schedule + ": " + e.what()));
    } catch (...) {  // the in-flight entry must go whatever was thrown: its waiters would wait forever
      error = std::make_exception_ptr(RtError(mkInternalError, std::string("compiling plan ") + schedule + ": an exception"));
    }
    lock.lock();
    --compiling_now();
    {
      auto& now = in_flight()[key];
      now.erase(std::find(now.begin(), now.end(), mine));
      if (now.empty()) in_flight().erase(key);
    }
    compiled().notify_all();
    if (error) std::rethrow_exception(error);
    if (gen != generation()) continue;  // MK_PLAN_DIR changed meanwhile: look there first
    debug_log(fmt::format("{} plan {}{} for {} ranks ({}; serving ranks {}), {} {}, sm_{}",
                          st.from_cache ? "loaded (shipped or cached)" : "compiled", schedule,
                          p->zero_copy ? " (zero-copy)" : "", nranks, topo.name(), plan::served_ranks(*p), name(dtype),
                          name(op), arch));
    cache()[key].push_back(p);
    return p;
  }
}

}  // namespace mk::rt
