// assign_tbs: give every op a thread block on its executing rank.
//
// Heuristic: ops that talk to the same set of remote ranks share a thread
// block (one block per peer link, so different links work in parallel); an
// op that touches only local memory joins the block of the latest earlier op
// on its rank it depends on (keeps a chain in one block, no flag needed),
// else a block of its own. Ops with a tb from the DSL keep it. When a rank
// would need more than `max_tbs` blocks, blocks are folded modulo max_tbs:
// safe, because a block runs its ops in program order and every dependency
// points backwards in program order.
//
// Needs: staged or not. Guarantees: every op has tb in 0..s.tbs-1; s.tbs is
// the largest count over ranks.
#include <algorithm>
#include <map>
#include <set>

#include "compiler/passes/passes.hpp"

namespace mk::passes {

using ir::Op;
using ir::Ref;

namespace {

// The latest earlier data op on each rank that wrote / read or wrote each
// chunk of that rank's buffers. Only refs on the executing rank are indexed:
// the ops that look here touch only their own rank's memory, so an earlier
// op's accesses to other ranks can never conflict with them. Replaces a scan
// over every earlier op on the rank (quadratic: 25 s for allgather.hier at
// 1024 ranks).
class LatestAccess {
 public:
  explicit LatestAccess(const ir::Schedule& s) {
    // Extents from the refs themselves, so an out-of-range ref (hand-built IR)
    // still has a cell.
    for (const Op& op : s.ops)
      for (const auto* list : {&op.srcs, &op.dsts})
        for (const Ref& r : *list) {
          MK_CHECK(r.index >= 0 && r.count >= 0, "assign_tbs needs refs with index >= 0 and count >= 0");
          auto& e = extent_[size_t(r.buf)];
          e = std::max(e, int64_t(r.index) + r.count);
        }
    offset_[1] = extent_[0];
    offset_[2] = extent_[0] + extent_[1];
    per_rank_ = offset_[2] + extent_[2];
    writer_.assign(size_t(per_rank_ * s.nranks), kNone);
    access_ = writer_;
  }

  // Index (into s.ops) of the latest recorded op that conflicts with `op`
  // (wrote a chunk it touches, or read a chunk it writes); -1 if none.
  int64_t latest_conflict(const Op& op) const {
    int64_t best = kNone;
    for (const Ref& r : op.srcs)
      for (int32_t k = 0; k < r.count; ++k) best = std::max(best, writer_[key(r, k)]);
    for (const Ref& r : op.dsts)
      for (int32_t k = 0; k < r.count; ++k) best = std::max(best, access_[key(r, k)]);
    return best;
  }

  void record(const Op& op, int64_t index) {
    for (const Ref& r : op.srcs)
      if (r.rank == op.rank)
        for (int32_t k = 0; k < r.count; ++k) access_[key(r, k)] = index;
    for (const Ref& r : op.dsts)
      if (r.rank == op.rank)
        for (int32_t k = 0; k < r.count; ++k) writer_[key(r, k)] = access_[key(r, k)] = index;
  }

 private:
  static constexpr int64_t kNone = -1;
  size_t key(const Ref& r, int32_t k) const {
    return size_t(int64_t(r.rank) * per_rank_ + offset_[size_t(r.buf)] + r.index + k);
  }
  int64_t extent_[3] = {0, 0, 0}, offset_[3] = {0, 0, 0}, per_rank_ = 0;
  std::vector<int64_t> writer_, access_;
};

}  // namespace

ir::Schedule assign_tbs(ir::Schedule s, int32_t max_tbs) {
  MK_CHECK(max_tbs >= 1, "max_tbs must be positive");
  for (const Op& op : s.ops) MK_CHECK(op.rank >= 0 && op.rank < s.nranks, "op on a bad rank");
  std::vector<std::map<std::vector<int32_t>, int32_t>> key_tb(s.nranks);
  std::vector<int32_t> ntbs(s.nranks, 0);
  LatestAccess latest(s);  // data ops so far
  for (size_t i = 0; i < s.ops.size(); ++i) {
    Op& op = s.ops[i];
    auto& keys = key_tb[op.rank];
    if (op.tb >= 0) {
      ntbs[op.rank] = std::max(ntbs[op.rank], op.tb + 1);
    } else {
      std::set<int32_t> remote;
      for (const auto* list : {&op.srcs, &op.dsts})
        for (const Ref& r : *list)
          if (r.rank != op.rank) remote.insert(r.rank);
      if (remote.empty())
        if (int64_t j = latest.latest_conflict(op); j >= 0) op.tb = s.ops[size_t(j)].tb;
      if (op.tb < 0) {
        std::vector<int32_t> key(remote.begin(), remote.end());
        auto it = keys.find(key);
        if (it == keys.end()) {
          // skip numbers the DSL pinned explicitly
          int32_t t = ntbs[op.rank];
          it = keys.emplace(key, t).first;
          ntbs[op.rank] = t + 1;
        }
        op.tb = it->second;
      }
    }
    if (op.is_data()) latest.record(op, int64_t(i));
  }
  int32_t tbs = 0;
  for (Op& op : s.ops) {
    op.tb %= max_tbs;
    tbs = std::max(tbs, op.tb + 1);
  }
  s.tbs = tbs;
  return s;
}

}  // namespace mk::passes
