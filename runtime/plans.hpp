// The process-wide plan store behind get_plan (runtime/comm.hpp): plans from
// MK_PLAN_DIR and plans compiled on first use.
#pragma once

#include <string>

namespace mk::rt {

// A hash of what MK_PLAN_DIR holds: every plan.json under it (in path order)
// with the cubins it names; "none" when MK_PLAN_DIR is unset. A bad
// MK_PLAN_DIR throws the same RtError as every get_plan call does.
std::string plan_dir_digest();

}  // namespace mk::rt
