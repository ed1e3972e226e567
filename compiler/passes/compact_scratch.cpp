// compact_scratch: renumbers scratch slots densely.
//
// A schedule may name scratch slots sparsely (sc[0] and sc[1000000]); the
// plan's scratch, the verifier's tables and the kernel's layout are sized by
// the largest slot number, so sparse numbers cost memory for nothing.
//
// Needs: bounds hold for non-scratch refs (scratch refs have index >= 0 and
// count >= 1; others are left alone for the verifier to report).
// Guarantees: the same program with slot numbers 0..n-1, where n is the number
// of slots used; s.scratch = n. Slots keep their order, a run sc[i:i+c] stays
// a run, and every rank uses the same renumbering (ranks equal up to rotation
// still share code).
#include <algorithm>
#include <map>

#include "compiler/passes/passes.hpp"

namespace mk::passes {

ir::Schedule compact_scratch(ir::Schedule s) {
  // Used slots as merged runs [first, end) over all ranks.
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (const auto& op : s.ops)
    for (const auto* list : {&op.srcs, &op.dsts})
      for (const auto& r : *list)
        if (r.buf == ir::Buf::scratch && r.index >= 0 && r.count >= 1)
          runs.emplace_back(r.index, int64_t(r.index) + r.count);
  std::sort(runs.begin(), runs.end());
  std::map<int64_t, std::pair<int64_t, int64_t>> base;  // run start -> (run end, new start)
  int64_t next = 0;
  for (size_t i = 0; i < runs.size();) {
    int64_t first = runs[i].first, end = runs[i].second;
    for (++i; i < runs.size() && runs[i].first <= end; ++i) end = std::max(end, runs[i].second);
    base[first] = {end, next};
    next += end - first;
  }
  if (next == s.scratch) return s;  // already dense
  for (auto& op : s.ops)
    for (auto* list : {&op.srcs, &op.dsts})
      for (auto& r : *list) {
        if (r.buf != ir::Buf::scratch || r.index < 0 || r.count < 1) continue;
        auto it = std::prev(base.upper_bound(r.index));
        r.index = int32_t(it->second.second + (r.index - it->first));
      }
  s.scratch = int32_t(next);
  return s;
}

}  // namespace mk::passes
