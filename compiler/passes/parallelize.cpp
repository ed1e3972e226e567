// parallelize: set how many instances of the schedule run side by side.
//
// An instance is a full copy of the per-rank programs on its own thread blocks,
// flag slots and scratch; instance i processes tiles i, i+I, i+2I, ... of every
// chunk. The IR is unchanged; codegen multiplies the grid by `instances`.
//
// Needs: instances in 1..64 (0 keeps what the DSL asked for). Guarantees:
// s.instances set.
#include "compiler/passes/passes.hpp"

namespace mk::passes {

ir::Schedule parallelize(ir::Schedule s, int32_t instances) {
  if (instances < 0 || instances > 64)
    throw Error(ErrId::cli_E011, "instances must be in 1..64, got " + std::to_string(instances));
  if (instances > 0) s.instances = instances;
  return s;
}

}  // namespace mk::passes
