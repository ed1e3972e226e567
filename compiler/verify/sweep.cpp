// access_needs: the orderings chunk accesses require, by ranges (hb.hpp).
//
// Per buffer line (rank x {input, output, scratch}) an interval map of
// segments; each segment's chunks share one history so far (the last writer,
// the reads since, and for scratch its first writer, what came before it and
// how often it was written). An op's refs become disjoint ranges (a write
// wins over a read of the same chunk; in-place, an input range aliasing the
// output lands in the output line; a copy onto its own source writes
// nothing), applied in program order: split the segments at the range's
// ends, emit each covered segment's pairs, update, and merge neighbours whose
// histories became equal again.
#include <algorithm>
#include <map>

#include "compiler/verify/hb.hpp"

namespace mk::verify {

using ir::Buf;
using ir::Op;
using ir::OpKind;
using ir::Ref;
using ir::Schedule;

namespace {

struct Seg {
  int32_t hi = 0;
  int64_t last_write = -1;
  std::vector<uint32_t> reads;  // since last_write
  // scratch only
  int64_t first_write = -1;
  std::vector<uint32_t> early;  // accesses before first_write
  int32_t writes = 0;           // 0, 1, 2 (2: two or more)
  bool same(const Seg& o) const {
    return last_write == o.last_write && reads == o.reads && first_write == o.first_write && early == o.early &&
           writes == o.writes;
  }
};
using Line = std::map<int32_t, Seg>;  // segment start -> segment

// One range of one op on a line.
struct Piece {
  size_t line;
  int32_t lo, hi;
  bool write;
};

class Sweep {
 public:
  Sweep(const Schedule& s, bool inplace, bool ll)
      : s_(s), inplace_(inplace), ll_(ll), cout_(ir::buf_chunks(s, Buf::output)), lines_(size_t(s.nranks) * 3) {}

  AccessNeeds run() {
    std::vector<Piece> raw, mine;
    // Lines nothing writes (inputs, out-of-place) need no history: their
    // reads never meet a write.
    written_.assign(lines_.size(), false);
    for (const Op& op : s_.ops)
      if (op.is_data())
        for (const Ref& d : op.dsts) pieces(d, 0, d.count, [&](size_t line, int32_t, int32_t, int32_t) { written_[line] = true; });
    for (size_t oi = 0; oi < s_.ops.size(); ++oi) {
      const Op& op = s_.ops[oi];
      if (!op.is_data()) continue;
      raw.clear();
      for (const Ref& r : op.srcs) add(r, 0, r.count, false, raw);
      for (const Ref& d : op.dsts) {
        if (op.is_copy() && !op.srcs.empty()) {
          add_copy_dst(op.srcs[0], d, raw);
        } else {
          add(d, 0, d.count, true, raw);
        }
      }
      disjoint(raw, mine);
      for (const Piece& p : mine)
        if (written_[p.line]) apply(uint32_t(oi), p);
      // this op's pairs once each (a wide op meets the same writer in many segments)
      dedup_tail(out_.within, within_at_);
      dedup_tail(out_.reuse, reuse_at_);
      dedup_tail(out_.gates, gates_at_);
    }
    for (auto* v : {&out_.within, &out_.reuse, &out_.gates}) sort_needs(*v);
    return std::move(out_);
  }

 private:
  // Chunks [k0, k1) of ref r, in line coordinates (in-place: split where the
  // input aliases the output).
  template <class F>
  void pieces(const Ref& r, int32_t k0, int32_t k1, F&& f) const {
    const size_t base = size_t(r.rank) * 3;
    if (r.buf == Buf::output) return f(base + 1, r.index + k0, r.index + k1, k0);
    if (r.buf == Buf::scratch) return f(base + 2, r.index + k0, r.index + k1, k0);
    const auto shift = inplace_ ? ir::inplace_shift(s_, r.rank) : std::nullopt;
    if (!shift) return f(base, r.index + k0, r.index + k1, k0);
    // input chunk i aliases output chunk i + shift while 0 <= i + shift < cout
    const int32_t a0 = std::clamp(-*shift - r.index, k0, k1), a1 = std::clamp(cout_ - *shift - r.index, k0, k1);
    if (k0 < a0) f(base, r.index + k0, r.index + a0, k0);
    if (a0 < a1) f(base + 1, r.index + a0 + *shift, r.index + a1 + *shift, a0);
    if (a1 < k1) f(base, r.index + a1, r.index + k1, a1);
  }
  void add(const Ref& r, int32_t k0, int32_t k1, bool write, std::vector<Piece>& out) const {
    pieces(r, k0, k1, [&](size_t line, int32_t lo, int32_t hi, int32_t) { out.push_back({line, lo, hi, write}); });
  }
  // A copy's destination writes nothing where it is its source's own chunk
  // (in-place: the kernel skips it, same address).
  void add_copy_dst(const Ref& src, const Ref& dst, std::vector<Piece>& out) const {
    struct P {
      size_t line;
      int32_t lo, hi, k;
    };
    std::vector<P> sp;
    pieces(src, 0, src.count, [&](size_t l, int32_t lo, int32_t hi, int32_t k) { sp.push_back({l, lo, hi, k}); });
    pieces(dst, 0, dst.count, [&](size_t l, int32_t lo, int32_t hi, int32_t k) {
      // chunks k .. k + (hi - lo) of dst; skip those where src sits at the same place
      int32_t at = k;
      const int32_t end = k + (hi - lo);
      for (const P& q : sp) {
        const int32_t b0 = std::max(at, q.k), b1 = std::min(end, q.k + (q.hi - q.lo));
        if (b0 >= b1 || q.line != l || q.lo - q.k != lo - k) continue;
        if (at < b0) out.push_back({l, lo + (at - k), lo + (b0 - k), true});
        at = b1;
      }
      if (at < end) out.push_back({l, lo + (at - k), hi, true});
    });
  }
  // Disjoint ranges, a write winning over a read.
  static void disjoint(std::vector<Piece>& raw, std::vector<Piece>& out) {
    out.clear();
    std::sort(raw.begin(), raw.end(),
              [](const Piece& x, const Piece& y) { return std::tie(x.line, x.lo) < std::tie(y.line, y.lo); });
    for (size_t i = 0; i < raw.size();) {
      size_t j = i;
      while (j < raw.size() && raw[j].line == raw[i].line) ++j;
      std::vector<int32_t> cuts;
      for (size_t k = i; k < j; ++k) cuts.insert(cuts.end(), {raw[k].lo, raw[k].hi});
      std::sort(cuts.begin(), cuts.end());
      cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
      for (size_t c = 0; c + 1 < cuts.size(); ++c) {
        bool any = false, w = false;
        for (size_t k = i; k < j; ++k)
          if (raw[k].lo <= cuts[c] && cuts[c + 1] <= raw[k].hi) any = true, w = w || raw[k].write;
        if (!any) continue;
        if (!out.empty() && out.back().line == raw[i].line && out.back().hi == cuts[c] && out.back().write == w)
          out.back().hi = cuts[c + 1];
        else
          out.push_back({raw[i].line, cuts[c], cuts[c + 1], w});
      }
      i = j;
    }
  }
  Line::iterator split(Line& m, int32_t x) {
    auto it = m.upper_bound(x);
    if (it == m.begin()) return it;
    auto prev = std::prev(it);
    if (prev->first == x) return prev;
    if (prev->second.hi <= x) return it;
    Seg tail = prev->second;
    prev->second.hi = x;
    return m.emplace_hint(it, x, std::move(tail));
  }
  void apply(uint32_t op, const Piece& p) {
    Line& m = lines_[p.line];
    split(m, p.lo);
    split(m, p.hi);
    const int32_t space = int32_t(p.line % 3), rank = int32_t(p.line / 3);
    auto it = m.lower_bound(p.lo);
    for (int32_t at = p.lo; at < p.hi;) {
      if (it == m.end() || it->first > at) {  // untouched so far
        Seg fresh;
        fresh.hi = it == m.end() ? p.hi : std::min(p.hi, it->first);
        it = m.emplace_hint(it, at, std::move(fresh));
      }
      visit(op, p.write, LocKey{rank, space, it->first}, space == 2, it->second);
      at = it->second.hi;
      ++it;
    }
    // merge what became equal, from the segment before lo to the one at hi
    auto from = m.lower_bound(p.lo);
    if (from != m.begin()) --from;
    while (from != m.end() && from->first <= p.hi) {
      auto next = std::next(from);
      if (next != m.end() && from->second.hi == next->first && from->second.same(next->second)) {
        from->second.hi = next->second.hi;
        m.erase(next);
      } else {
        from = next;
      }
    }
  }
  void visit(uint32_t op, bool write, const LocKey& at, bool scratch, Seg& g) {
    if (write) {
      if (g.last_write >= 0) out_.within.push_back({uint32_t(g.last_write), op, at});
      for (uint32_t r : g.reads) out_.within.push_back({r, op, at});
      g.last_write = op;
      g.reads.clear();
    } else {
      if (g.last_write >= 0 && !(ll_ && scratch)) out_.within.push_back({uint32_t(g.last_write), op, at});
      g.reads.push_back(op);
    }
    if (!scratch) return;
    if (g.first_write < 0) {
      if (!write) {
        g.early.push_back(op);
        return;
      }
      g.first_write = op;
      g.writes = 1;
      for (uint32_t x : g.early) {
        if (!inplace_) out_.reuse.push_back({x, op, at});
        if (gates_) out_.gates.push_back({x, op, at});
      }
      g.early.clear();
      if (!inplace_) out_.reuse.push_back({op, op, at});
      return;
    }
    const uint32_t fw = uint32_t(g.first_write);
    if (!inplace_) out_.reuse.push_back({op, fw, at});
    if (write) {
      if (g.writes == 1 && (!out_.double_write || at < out_.double_write->at)) out_.double_write = Need{fw, op, at};
      g.writes = 2;
    } else if (gates_) {
      out_.gates.push_back({op, fw, at});
    }
  }
  // The pairs appended since `from` (this op's) once each; `from` moves to the end.
  static void dedup_tail(std::vector<Need>& v, size_t& from) {
    sort_needs(v, from);
    from = v.size();
  }

 private:
  const Schedule& s_;
  bool inplace_, ll_;
  bool gates_ = ll_ && !inplace_;  // only LL out-of-place gates (hb.hpp)
  int32_t cout_;
  std::vector<Line> lines_;
  std::vector<bool> written_;
  size_t within_at_ = 0, reuse_at_ = 0, gates_at_ = 0;
  AccessNeeds out_;
};

}  // namespace

void sort_needs(std::vector<Need>& v, size_t from) {
  const auto first = v.begin() + std::ptrdiff_t(from);
  std::sort(first, v.end(), [](const Need& x, const Need& y) { return std::tie(x.b, x.a, x.at) < std::tie(y.b, y.a, y.at); });
  v.erase(std::unique(first, v.end(), [](const Need& x, const Need& y) { return x.a == y.a && x.b == y.b; }), v.end());
}

AccessNeeds access_needs_by_ranges(const Schedule& s, bool inplace, bool ll) { return Sweep(s, inplace, ll).run(); }

AccessNeeds access_needs_by_chunks(const Schedule& s, bool inplace, bool ll) {
  AccessNeeds n;
  for (const auto& [key, acc] : accesses(s, inplace)) {
    int64_t last_write = -1, first_write = -1, second_write = -1;
    std::vector<uint32_t> reads;
    for (const Access& x : acc) {
      if (x.write) {
        if (last_write >= 0) n.within.push_back({uint32_t(last_write), x.op, key});
        for (uint32_t r : reads) n.within.push_back({r, x.op, key});
        reads.clear();
        last_write = x.op;
        if (first_write < 0)
          first_write = x.op;
        else if (second_write < 0)
          second_write = x.op;
      } else {
        if (last_write >= 0 && !(ll && key.space == 2)) n.within.push_back({uint32_t(last_write), x.op, key});
        reads.push_back(x.op);
      }
    }
    if (key.space != 2 || first_write < 0) continue;
    const uint32_t fw = uint32_t(first_write);
    for (const Access& x : acc) {
      if (!inplace) n.reuse.push_back({x.op, fw, key});
      if (ll && !inplace && !x.write && x.op != fw) n.gates.push_back({x.op, fw, key});
    }
    if (second_write >= 0 && !n.double_write) n.double_write = Need{fw, uint32_t(second_write), key};  // keys ascend
  }
  return n;  // unsorted, a pair once per location needing it: sorting tens of millions costs seconds
}

AccessNeeds access_needs(const Schedule& s, bool inplace, bool ll) {
  // Ranges win where ops span many chunks (halving-doubling at 1024 ranks: up
  // to 512 a ref, 40 M chunk entries); where ops touch a chunk or a few, or
  // wide ops meet histories that differ chunk by chunk, the flat table's
  // smaller constant wins.
  int64_t refs = 0, chunks = 0;
  for (const Op& op : s.ops)
    for (const auto* list : {&op.srcs, &op.dsts})
      for (const Ref& r : *list) ++refs, chunks += r.count;
  AccessNeeds n = chunks >= 16 * std::max<int64_t>(refs, 1) ? access_needs_by_ranges(s, inplace, ll)
                                                            : access_needs_by_chunks(s, inplace, ll);
  // Kept through a bucket's sync and proof (hb.hpp DataNeeds): not the
  // doubling growth's slack, up to half of it.
  for (auto* v : {&n.within, &n.reuse, &n.gates}) v->shrink_to_fit();
  return n;
}

}  // namespace mk::verify
