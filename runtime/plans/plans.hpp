// The process-wide plan store behind get_plan (runtime/comm/comm.hpp): plans from
// MK_PLAN_DIR and plans compiled on first use.
#pragma once

#include <optional>
#include <set>
#include <string>

#include "mk/types.hpp"

namespace mk::rt {

// A hash of what MK_PLAN_DIR holds: every plan.json under it (in path order)
// with the cubins it names; "none" when MK_PLAN_DIR is unset. A bad
// MK_PLAN_DIR throws the same RtError as every get_plan call does.
std::string plan_dir_digest();

// A schedule MK_PLAN_DIR has plans of (mkc compile), by name: its collective
// and the rank counts of its plans; nullopt when it has none. Such a name can
// be selected (MK_ALGO, MK_SELECT_FILE) without its source being loaded: the
// plans serve the calls they were compiled for. Throws like plan_dir_digest.
struct DirSchedule {
  Collective coll = Collective::allreduce;
  std::set<int32_t> nranks;
};
std::optional<DirSchedule> plan_dir_schedule(const std::string& schedule);

// The collective `schedule` implements: a registered schedule's, else that of
// MK_PLAN_DIR's plans of it; nullopt when neither knows the name.
std::optional<Collective> schedule_collective(const std::string& schedule);

}  // namespace mk::rt
