// Happens-before over a synced schedule, shared by verify_sync and the tests.
//
// Within one step, op a happens before op b when a path leads from a to b
// along (1) program order inside a thread block and (2) signal -> wait(iter 0)
// on the same rank and slot. LL scratch writes also gate their readers, but
// carry no ordering for other memory, so they count for deadlock only.
// Computed with vector clocks over chains (clocks.hpp).
#pragma once

#include <map>
#include <optional>
#include <span>
#include <tuple>
#include <vector>

#include "compiler/ir/ir.hpp"
#include "compiler/verify/symmetry.hpp"

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
  uint32_t op;
  bool write;
};
// Every chunk-level access of every data op, by location, in program order;
// locations sorted by key, only those something touches. In-place, a copy
// onto its own source (e.g. all-gather's "own block" copy) does nothing (the
// kernel skips it: same address), so it counts as a read. One flat array
// (1024 ranks: tens of millions of accesses).
class AccessMap {
 public:
  struct Loc {
    LocKey key;
    std::span<const Access> acc;
  };
  size_t size() const { return keys_.size(); }
  Loc operator[](size_t i) const {
    return {keys_[i], std::span<const Access>(all_.data() + begin_[i], begin_[i + 1] - begin_[i])};
  }
  class iterator {
   public:
    iterator(const AccessMap* m, size_t i) : m_(m), i_(i) {}
    Loc operator*() const { return (*m_)[i_]; }
    iterator& operator++() {
      ++i_;
      return *this;
    }
    bool operator!=(const iterator& o) const { return i_ != o.i_; }

   private:
    const AccessMap* m_;
    size_t i_;
  };
  iterator begin() const { return {this, 0}; }
  iterator end() const { return {this, size()}; }

 private:
  friend AccessMap accesses(const ir::Schedule& s, bool inplace);
  std::vector<LocKey> keys_;
  std::vector<size_t> begin_;  // size() + 1 offsets into all_
  std::vector<Access> all_;
};
AccessMap accesses(const ir::Schedule& s, bool inplace);

// The orderings chunk accesses require (compiler/verify/sweep.cpp). Where
// ops span many chunks, from one sweep over ranges: each op's refs are
// ranges, kept per buffer in an interval map whose segments merge while
// their histories agree, so an op moving 512 chunks is one update, not 512
// table entries; otherwise from the chunk-level table (accesses()). Both
// give the same pairs, each with the least location that needs it (tested
// against each other).
struct Need {
  uint32_t a, b;  // a must happen before b
  LocKey at;      // the least location needing it
};
struct AccessNeeds {
  // Within a step, per location in program order: each write after the
  // previous write and the reads since it, each read after the previous
  // write (LL scratch reads excepted: their data carries its own flags).
  // In no particular order; a pair may repeat, each time with another
  // location needing it (consumers sort per op anyway).
  std::vector<Need> within;
  // Scratch, out-of-place only: every access a of a slot at step g before
  // the slot's first write b at step g + depth.
  std::vector<Need> reuse;
  // Scratch: reader a of a slot written by b, its first writer (LL gating);
  // only for LL out-of-place, the one use (scratch is the same in-place, and
  // only LL gates reads in-band): otherwise empty.
  std::vector<Need> gates;
  // The least scratch location written twice: its first two writers (a, b).
  std::optional<Need> double_write;
};
// `ll`: the schedule's protocol is LL (scratch reads take no within pair).
AccessNeeds access_needs(const ir::Schedule& s, bool inplace, bool ll);
// The two ways it is computed (it picks by the schedule's mean ref span):
// the interval sweep, and the chunk-level table (accesses()).
AccessNeeds access_needs_by_ranges(const ir::Schedule& s, bool inplace, bool ll);
AccessNeeds access_needs_by_chunks(const ir::Schedule& s, bool inplace, bool ll);
// v[from..]: sorted by (b, a), each pair once with its least location.
void sort_needs(std::vector<Need>& v, size_t from = 0);

// The access needs of a schedule in both aliasing modes: what insert_sync
// orders and verify_sync checks. Sync ops access nothing, so the needs of a
// schedule before insert_sync are those after it, up to op indices: the
// pipeline computes them once per protocol for every bucket's sync and proof
// (at 1024 ranks four runs of access_needs per bucket were a second each).
struct DataNeeds {
  AccessNeeds out_of_place, in_place;
  bool ll = false;
  size_t ops = 0;  // of the schedule they were computed for
};
DataNeeds data_needs(const ir::Schedule& s, bool ll);  // op indices of `s`

// What verify_sync may take instead of computing the needs itself: the
// schedule insert_sync started from and its data_needs. verify_sync checks
// that `before` has no sync op and the same data ops, geometry and root as
// the synced schedule (needs are a function of those), and that the needs
// are for its protocol, then maps them to the synced schedule's indices.
struct Presynced {
  const ir::Schedule* before = nullptr;
  const DataNeeds* needs = nullptr;
};

// Ops of one (rank, thread block) in program order: each op's chain (dense,
// in order of first appearance) and 1-based position in it. With `data_only`,
// other ops get chain -1 and position 0 and are not counted.
struct Chains {
  std::vector<int32_t> chain, pos;
  size_t count = 0;
  size_t longest = 0;
};
Chains number_chains(const ir::Schedule& s, bool data_only);

// The within-step happens-before graph of a synced schedule: chains (one per
// rank and thread block, in program order) and the signal each wait pairs with.
struct SyncGraph {
  std::vector<size_t> topo;     // a topological order of all ops (deadlock-free)
  std::vector<int32_t> chain;   // op -> its chain
  std::vector<int32_t> pos;     // op -> 1-based position in its chain
  std::vector<int64_t> signal;  // wait op -> the signal it pairs with, -1 otherwise
  size_t nchains = 0;
  size_t longest = 0;  // the longest chain
};
// Builds it; throws mk.verify.E011 (unpaired sync, a wait reaching back other
// than 1 or depth steps), E014 (an LL slot written twice) or E005 (cycle).
SyncGraph build_sync_graph(const ir::Schedule& s);
// ... reusing the schedule's out-of-place access needs (LL gating reads them).
SyncGraph build_sync_graph(const ir::Schedule& s, const AccessNeeds* out_of_place);

// Happens-before with every data op's clocks kept: for tests and small
// schedules (memory n x chains). verify_sync answers the same questions in
// bounded memory (clocks.hpp).
class HB {
 public:
  std::vector<size_t> topo;
  bool before(size_t a, size_t b) const;        // op a before op b in a step (both data ops, a != b)
  bool before_reuse(size_t a, size_t b) const;  // a@g before b@(g+depth)
  // Within one step, op a happens before op b when a path leads from a to b
  // along program order inside a thread block and signal -> wait(iter 0).
  // Across steps (a@g before b@(g+depth)): the whole chain of step g, plus
  // what waits bring in the later step (iter 0: the signaller's clock there;
  // iter < 0: its clock at step g). Conservative: a wait reaching back 1 step
  // counts as reaching back `depth`, which orders less.
  friend HB build_hb(const ir::Schedule& s);

 private:
  SyncGraph g_;
  size_t width_ = 0;
  std::vector<int32_t> within_, cross_;  // op x chains (data ops only)
  std::vector<bool> data_;
};
HB build_hb(const ir::Schedule& s);

// verify_sync with an explicit clock budget in bytes (tests force several
// chain blocks with a small one) and use of rank symmetry (symmetry.hpp).
void verify_sync_budget(const ir::Schedule& s, size_t clock_budget, SymMode mode = SymMode::automatic,
                        const Presynced& pre = {});

}  // namespace mk::verify
