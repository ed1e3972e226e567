// fuse: merge "op A writes X ... copy X -> Y" into one op that writes X and Y.
//
// The copy reads back what A wrote, on the same GPU; fused, the data is read
// once and written to every destination (a ring's forwarding hop becomes
// "receive, store locally, send on" in one pass over the tile).
//
// Needs: nothing. Merges copy B into the last earlier writer A of B's source
// when: A wrote exactly B's source, both run on the same rank with the same
// thread-block choice, and no op between A and B touches B's destinations
// (so writing them early, at A, changes nothing anyone observes; X itself is
// not rewritten in between, since A is its last writer). Guarantees: same
// meaning; fewer ops.
#include <algorithm>
#include <map>

#include "compiler/passes/passes.hpp"

namespace mk::passes {

using ir::Op;
using ir::OpKind;
using ir::Ref;

namespace {

using Key = std::tuple<int32_t, int32_t, int32_t>;  // rank, buf, chunk
Key key(const Ref& r, int32_t k) { return {r.rank, int32_t(r.buf), r.index + k}; }

}  // namespace

ir::Schedule fuse(ir::Schedule s) {
  const size_t n = s.ops.size();
  std::vector<bool> gone(n, false);
  std::map<Key, size_t> last_writer;   // chunk -> op index (into s.ops) that wrote it last
  std::map<Key, size_t> last_access;   // chunk -> last op index that read or wrote it
  for (size_t b = 0; b < n; ++b) {
    Op& op = s.ops[b];
    if (!op.is_data()) continue;
    bool merged = false;
    if (op.kind == OpKind::copy) {
      auto w = last_writer.find(key(op.srcs[0], 0));
      if (w != last_writer.end()) {
        Op& a = s.ops[w->second];
        bool ok = a.rank == op.rank && a.tb == op.tb &&
                  std::find(a.dsts.begin(), a.dsts.end(), op.srcs[0]) != a.dsts.end();
        for (int32_t k = 0; ok && k < op.srcs[0].count; ++k) {
          auto lw = last_writer.find(key(op.srcs[0], k));
          ok = lw != last_writer.end() && lw->second == w->second;
        }
        for (const Ref& d : op.dsts)
          for (int32_t k = 0; ok && k < d.count; ++k) {
            auto la = last_access.find(key(d, k));
            ok = la == last_access.end() || la->second < w->second;
          }
        for (const Ref& d : op.dsts)
          for (const Ref& src : a.srcs)
            for (int32_t k = 0; ok && k < d.count; ++k)
              for (int32_t m = 0; ok && m < src.count; ++m) ok = key(d, k) != key(src, m);
        if (ok) {
          for (const Ref& d : op.dsts)
            if (std::find(a.dsts.begin(), a.dsts.end(), d) == a.dsts.end()) a.dsts.push_back(d);
          for (const Ref& d : op.dsts)
            for (int32_t k = 0; k < d.count; ++k) {
              last_writer[key(d, k)] = w->second;
              last_access[key(d, k)] = b;
            }
          for (int32_t k = 0; k < op.srcs[0].count; ++k) last_access[key(op.srcs[0], k)] = b;
          gone[b] = true;
          merged = true;
        }
      }
    }
    if (merged) continue;
    for (const Ref& r : op.srcs)
      for (int32_t k = 0; k < r.count; ++k) last_access[key(r, k)] = b;
    for (const Ref& r : op.dsts)
      for (int32_t k = 0; k < r.count; ++k) {
        last_access[key(r, k)] = b;
        last_writer[key(r, k)] = b;
      }
  }
  std::vector<Op> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i)
    if (!gone[i]) out.push_back(std::move(s.ops[i]));
  s.ops = std::move(out);
  return s;
}

}  // namespace mk::passes
