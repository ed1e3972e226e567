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
  // Slots the author never wrote: stage_remote gives every read or write of a
  // peer's input or output a slot on the peer (only owners touch user buffers).
  const int32_t added = s.author_scratch >= 0 ? s.scratch - s.author_scratch : 0;
  const std::string slots =
      added > 0 ? fmt::format("{} slot(s): the schedule's {} and {} that staging added, one for each op's read or "
                              "write of a peer's input or output (only a buffer's owner touches it)",
                              s.scratch, s.author_scratch, added)
                : fmt::format("{} slot(s)", s.scratch);
  throw Error(ErrId::verify_E016,
              fmt::format("{}: the plan needs {} bytes of scratch per rank ({} x {}-byte tiles{} x depth {} x {} "
                          "instance(s)), more than the communicator's default scratch of {} bytes (MK_SCRATCH_BYTES)",
                          s.name.empty() ? std::string(name(s.coll)) : s.name, need, slots, s.tile_bytes,
                          s.proto == ir::Proto::ll && !s.lamport ? " x 2 (LL)" : "", s.depth, s.instances,
                          kDefaultScratchBytes),
              s.loc,
              added > 0 ? "read and write peers' buffers through scratch slots of your own and reuse them once read "
                          "(staging adds a slot per remote access), or use fewer --instances or a smaller --tile"
                        : "use fewer scratch slots at once (reuse a slot once its data was read), fewer --instances or "
                          "a smaller --tile");
}

}  // namespace mk::verify
