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

bool overlaps(const Ref& a, const Ref& b) {
  return a.rank == b.rank && a.buf == b.buf && a.index < b.index + b.count &&
         b.index < a.index + a.count;
}

bool conflicts(const Op& a, const Op& b) {
  for (const Ref& w : a.dsts) {
    for (const Ref& r : b.srcs)
      if (overlaps(w, r)) return true;
    for (const Ref& r : b.dsts)
      if (overlaps(w, r)) return true;
  }
  for (const Ref& w : b.dsts)
    for (const Ref& r : a.srcs)
      if (overlaps(w, r)) return true;
  return false;
}

}  // namespace

ir::Schedule assign_tbs(ir::Schedule s, int32_t max_tbs) {
  MK_CHECK(max_tbs >= 1, "max_tbs must be positive");
  std::vector<std::map<std::vector<int32_t>, int32_t>> key_tb(s.nranks);
  std::vector<int32_t> ntbs(s.nranks, 0);
  std::vector<std::vector<size_t>> on_rank(s.nranks);  // data ops so far, per rank
  for (size_t i = 0; i < s.ops.size(); ++i) {
    Op& op = s.ops[i];
    MK_CHECK(op.rank >= 0 && op.rank < s.nranks, "op on a bad rank");
    auto& keys = key_tb[op.rank];
    if (op.tb >= 0) {
      ntbs[op.rank] = std::max(ntbs[op.rank], op.tb + 1);
    } else {
      std::set<int32_t> remote;
      for (const auto* list : {&op.srcs, &op.dsts})
        for (const Ref& r : *list)
          if (r.rank != op.rank) remote.insert(r.rank);
      if (remote.empty()) {
        for (auto it = on_rank[op.rank].rbegin(); it != on_rank[op.rank].rend(); ++it)
          if (conflicts(s.ops[*it], op)) {
            op.tb = s.ops[*it].tb;
            break;
          }
      }
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
    if (op.is_data()) on_rank[op.rank].push_back(i);
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
