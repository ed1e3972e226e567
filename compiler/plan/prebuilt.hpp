// Prebuilt plans: plans compiled ahead of time (`mkc prebuild`) and shipped
// with the library (the Python wheel), so that a job's first collective loads
// a plan instead of waiting for NVRTC.
//
// A prebuilt directory holds index.json ({"format": 1, "plans": {key: dir}})
// and one plan directory per distinct plan (plan.json and cubins, no sources);
// many keys (one per rank, for schedules whose ranks share code) name one
// plan. The key is compiler::plan_key without NVRTC's identity: a cubin runs
// wherever the driver accepts it, whichever NVRTC the user has.
//
// Where: MK_PREBUILT_DIR (directories separated by ':'; set but empty: none),
// else <directory of libmkernel.so>/../share/mkernel/prebuilt. They are read,
// never written, and trusted like the library beside them.
#pragma once

#include <map>
#include <mutex>
#include <memory>
#include <string>

#include "compiler/compile.hpp"
#include "compiler/plan/plan.hpp"

namespace mk::prebuilt {

std::string key(const ir::Schedule& built, const compiler::CompileOptions& o);

// The prebuilt plan for `key` that was compiled with these options (its
// schedule, ranks, dtype, op and arch checked again), or null. A damaged entry
// is skipped (MK_DEBUG says why). Thread-safe; each index is read once.
std::shared_ptr<const plan::Plan> find(const std::string& key, const ir::Schedule& built,
                                       const compiler::CompileOptions& o);

std::string search_path();  // the directories find() reads, ':'-separated (for `mkc info`)

// Writes a prebuilt directory. add() may be called from several threads.
class Writer {
 public:
  explicit Writer(std::string dir);
  void add(const std::string& key, const plan::Plan& p);  // throws mk.cli.E012
  // Writes index.json (merged with one already there); returns the number of
  // keys and of distinct plans.
  std::pair<size_t, size_t> finish();

 private:
  std::string dir_;
  std::map<std::string, std::string> keys_;  // key -> plan directory (relative)
  std::unique_ptr<std::mutex> mu_ = std::make_unique<std::mutex>();
};

}  // namespace mk::prebuilt
