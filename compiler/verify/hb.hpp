// Happens-before over a synced schedule, shared by verify_sync and the tests.
//
// Within one step, op a happens before op b when a path leads from a to b
// along (1) program order inside a thread block and (2) signal -> wait(iter 0)
// on the same rank and slot. LL scratch writes also gate their readers, but
// carry no ordering for other memory, so they count for deadlock only.
#pragma once

#include <map>
#include <tuple>
#include <vector>

#include "compiler/ir/ir.hpp"
#include "compiler/verify/bitset.hpp"

namespace mk::verify {

// A memory location at chunk granularity. In-place, an input chunk that
// aliases an output chunk shares its key; a plan must be right in both modes,
// so analyses run once per mode.
struct LocKey {
  int32_t rank;
  int32_t space;  // 0 input-only, 1 output (or aliased input), 2 scratch
  int32_t index;
  auto operator<=>(const LocKey&) const = default;
};
LocKey loc_key(const ir::Schedule& s, const ir::Ref& chunk, bool inplace);

struct Access {
  size_t op;
  bool write;
};
// Every chunk-level access of every data op, by location, in program order.
// In-place, a copy onto its own source (e.g. all-gather's "own block" copy)
// does nothing (the kernel skips it: same address), so it counts as a read.
using AccessMap = std::vector<std::pair<LocKey, std::vector<Access>>>;  // sorted by key
AccessMap accesses(const ir::Schedule& s, bool inplace);

struct HB {
  std::vector<size_t> topo;            // a topological order of all ops (deadlock-free)
  std::vector<int32_t> data_index;     // op -> dense data-op index, -1 for sync ops
  // Rows per data op (dense index), columns data ops:
  BitRows within;  // data ops that happen before it in the same step, and itself
  // data ops a with a@g happening before it@(g+depth), for every g
  // (conservative: found through program order across steps and iter<0 waits)
  BitRows cross;
  bool before(size_t a, size_t b) const;        // op a before op b in a step (both data ops, a != b)
  bool before_reuse(size_t a, size_t b) const;  // a@g before b@(g+depth)
};

// Builds happens-before; throws mk.verify.E011 (unpaired sync) or E005 (cycle).
HB build_hb(const ir::Schedule& s);

}  // namespace mk::verify
