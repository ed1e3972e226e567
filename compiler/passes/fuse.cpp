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
// not rewritten in between, since A is its last writer; in-place, a read of
// the input chunk a destination aliases counts as touching it, except A's
// own: A then writes, element for element, what it reads). Guarantees:
// same meaning in both aliasings; fewer ops.
#include <algorithm>
#include <optional>

#include "compiler/passes/passes.hpp"

namespace mk::passes {

using ir::Op;
using ir::OpKind;
using ir::Ref;

namespace {

// Dense chunk indices (rank-major: input, output, scratch): maps with tuple
// keys cost seconds at 1024 ranks.
struct Chunks {
  const ir::Schedule& s;
  int32_t cin = ir::buf_chunks(s, ir::Buf::input), cout = ir::buf_chunks(s, ir::Buf::output);
  int64_t per_rank = int64_t(cin) + cout + s.scratch;
  size_t size() const { return size_t(per_rank * s.nranks); }
  size_t key(const Ref& r, int32_t k) const {
    int64_t off = r.buf == ir::Buf::input ? 0 : r.buf == ir::Buf::output ? cin : int64_t(cin) + cout;
    return size_t(int64_t(r.rank) * per_rank + off + r.index + k);
  }
  // The output chunk an input chunk aliases in-place, if any.
  std::optional<size_t> alias(const Ref& r, int32_t k) const {
    if (r.buf != ir::Buf::input) return std::nullopt;
    auto o = ir::inplace_output_of_input(s, r.rank, r.index + k);
    if (!o) return std::nullopt;
    return key(Ref{r.rank, ir::Buf::output, *o, 1}, 0);
  }
};

}  // namespace

ir::Schedule fuse(ir::Schedule s) {
  const size_t n = s.ops.size();
  const Chunks ch{s};
  std::vector<bool> gone(n, false);
  constexpr int64_t kNone = -1;
  std::vector<int64_t> last_writer(ch.size(), kNone);  // chunk -> op index (into s.ops) that wrote it last
  // chunk -> last op index that read or wrote it; an input chunk's access also
  // counts for the output chunk it aliases in-place (one plan serves both
  // modes: moving a write of that output chunk before it would change what
  // the in-place read sees)
  std::vector<int64_t> last_access(ch.size(), kNone);
  auto accessed = [&](const Ref& r, int32_t k, size_t b) {
    last_access[ch.key(r, k)] = int64_t(b);
    if (auto a = ch.alias(r, k)) last_access[*a] = int64_t(b);
  };
  for (size_t b = 0; b < n; ++b) {
    Op& op = s.ops[b];
    if (!op.is_data()) continue;
    bool merged = false;
    if (op.kind == OpKind::copy) {
      const int64_t w = last_writer[ch.key(op.srcs[0], 0)];
      if (w != kNone) {
        Op& a = s.ops[size_t(w)];
        bool ok = a.rank == op.rank && a.tb == op.tb &&
                  std::find(a.dsts.begin(), a.dsts.end(), op.srcs[0]) != a.dsts.end();
        for (int32_t k = 0; ok && k < op.srcs[0].count; ++k) ok = last_writer[ch.key(op.srcs[0], k)] == w;
        // No op after A touched a destination; A itself may have read the
        // input chunk a destination aliases in place (an all-reduce owner
        // reading a peer's input and writing its output): then the merged op
        // reads and writes the same bytes, element for element, as an
        // in-place reduce does.
        for (const Ref& d : op.dsts)
          for (int32_t k = 0; ok && k < d.count; ++k) ok = last_access[ch.key(d, k)] <= w;
        for (const Ref& d : op.dsts)
          for (const Ref& src : a.srcs)
            for (int32_t k = 0; ok && k < d.count; ++k)
              for (int32_t m = 0; ok && m < src.count; ++m) ok = ch.key(d, k) != ch.key(src, m);
        if (ok) {
          for (const Ref& d : op.dsts)
            if (std::find(a.dsts.begin(), a.dsts.end(), d) == a.dsts.end()) a.dsts.push_back(d);
          for (const Ref& d : op.dsts)
            for (int32_t k = 0; k < d.count; ++k) {
              last_writer[ch.key(d, k)] = w;
              accessed(d, k, b);
            }
          for (int32_t k = 0; k < op.srcs[0].count; ++k) accessed(op.srcs[0], k, b);
          gone[b] = true;
          merged = true;
        }
      }
    }
    if (merged) continue;
    for (const Ref& r : op.srcs)
      for (int32_t k = 0; k < r.count; ++k) accessed(r, k, b);
    for (const Ref& r : op.dsts)
      for (int32_t k = 0; k < r.count; ++k) {
        accessed(r, k, b);
        last_writer[ch.key(r, k)] = int64_t(b);
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
