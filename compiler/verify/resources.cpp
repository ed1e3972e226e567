// What a lowered schedule needs from the communicator, checked at compile
// time so that a plan the runtime could never load is refused where it is made.
#include <fmt/format.h>

#include "compiler/verify/verify.hpp"

namespace mk::verify {

int64_t scratch_bytes(const ir::Schedule& s) {
  if (s.scratch == 0) return 0;
  // LL packets carry 8 data bytes in 16; Lamport packets 16 in 16
  return s.tile_bytes * (s.proto == ir::Proto::ll && !s.lamport ? 2 : 1) * int64_t(s.scratch) * s.depth * s.instances;
}

void verify_resources(const ir::Schedule& s) {
  const int64_t need = scratch_bytes(s);
  if (need <= kDefaultScratchBytes) return;
  throw Error(ErrId::verify_E016,
              fmt::format("{}: the plan needs {} bytes of scratch per rank ({} slot(s) x {}-byte tiles{} x depth {} x "
                          "{} instance(s)), more than the communicator's default scratch of {} bytes "
                          "(MK_SCRATCH_BYTES)",
                          s.name.empty() ? std::string(name(s.coll)) : s.name, need, s.scratch, s.tile_bytes,
                          s.proto == ir::Proto::ll && !s.lamport ? " x 2 (LL)" : "", s.depth, s.instances,
                          kDefaultScratchBytes),
              s.loc, "use fewer scratch slots at once (reuse a slot once its data was read), fewer --instances or a "
                     "smaller --tile");
}

}  // namespace mk::verify
