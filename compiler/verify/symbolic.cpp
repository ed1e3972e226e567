// Symbolic execution of a schedule over contribution sets.
//
// Every input chunk (rank q, chunk j) is a distinct symbol. Running the ops in
// program order, a copy moves a set, a reduce takes the multiset union of its
// sources. At the end, each output chunk must hold exactly the symbols the
// collective defines (e.g. all-reduce: {(q, i) for every rank q}). Aliasing
// (in-place) is modelled by giving an input chunk and the output chunk it
// aliases one storage cell.
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <tuple>
#include <unordered_map>

#include "compiler/common/side_by_side.hpp"
#include "compiler/verify/flat_map.hpp"
#include "compiler/verify/hb.hpp"
#include "compiler/verify/verify.hpp"

namespace mk::verify {
namespace {

using ir::Buf;
using ir::Op;
using ir::OpKind;
using ir::Ref;
using ir::Schedule;

std::string coll_context(const Schedule& s, const char* mode) {
  return fmt::format("{} ({} ranks{}{})", s.name.empty() ? std::string(name(s.coll)) : s.name,
                     s.nranks, mode ? ", " : "", mode ? mode : "");
}

// Contribution sets are shared, not copied: a copy moves a pointer, only a
// reduce makes a new set (at 1024 ranks an all-reduce's final sets hold 1024
// symbols in each of a million output chunks).
using Syms = std::shared_ptr<const std::vector<uint32_t>>;

struct Value {
  bool init = false;
  int32_t pos = -1;
  Syms syms;                   // sorted multiset of contributions (null: empty)
  uint32_t tree = 0;           // how they were combined (Machine::combine), when init
  int32_t writer = -1;         // op index of the last write
};

class Machine {
 public:
  Machine(const Schedule& s, bool inplace) : s_(s), inplace_(inplace) {
    cin_ = ir::buf_chunks(s, Buf::input);
    cout_ = ir::buf_chunks(s, Buf::output);
    // Scratch cells for the slots in use only: slot numbers may be sparse
    // (compact_scratch renumbers them after this proof, which keeps the
    // author's numbers in its messages).
    collect_slots();
    per_rank_ = cin_ + cout_ + csc_;
    // Per-rank and per-input-chunk facts the inner loop asks for every chunk,
    // asked once.
    for (int32_t r = 0; r < s.nranks; ++r) {
      has_in_.push_back(ir::has_input(s, r));
      has_out_.push_back(ir::has_output(s, r));
    }
    if (inplace_) {
      in_cell_.resize(size_t(s.nranks) * cin_);
      for (int32_t r = 0; r < s.nranks; ++r)
        for (int32_t j = 0; j < cin_; ++j) {
          auto o = ir::inplace_output_of_input(s_, r, j);
          in_cell_[size_t(r) * cin_ + j] = o ? cin_ + *o : j;
        }
    }
    cells_.resize(size_t(per_rank_) * s.nranks);
    // The initial one-symbol sets live in one block that every cell shares
    // ownership of (a million separate allocations at 1024 ranks).
    auto singles = std::make_shared<std::vector<std::vector<uint32_t>>>(size_t(s.nranks) * cin_);
    for (int32_t r = 0; r < s.nranks; ++r) {
      if (!has_in_[size_t(r)]) continue;
      for (int32_t j = 0; j < cin_; ++j) {
        Value& v = cells_[cell(Ref{r, Buf::input, j, 1})];
        std::vector<uint32_t>& one = (*singles)[size_t(sym(r, j))];
        one.assign(1, sym(r, j));
        v.init = true;
        v.pos = j % s.chunks;
        v.syms = Syms(singles, &one);
        v.tree = sym(r, j);
      }
    }
  }

  // slots_ (and slot_cell_ where the numbers are not too sparse for a
  // table): marked in a table when they are dense enough, else sorted.
  void collect_slots() {
    int64_t top = -1, chunks = 0;
    bool negative = false;
    for (const Op& op : s_.ops)
      for (const auto* list : {&op.srcs, &op.dsts})
        for (const Ref& r : *list)
          if (r.buf == Buf::scratch) {
            top = std::max(top, int64_t(r.index) + r.count - 1);
            chunks += r.count;
            negative |= r.index < 0;
          }
    if (!negative && top < 8 * chunks + 4096) {
      std::vector<uint8_t> used(size_t(top + 1), 0);
      for (const Op& op : s_.ops)
        for (const auto* list : {&op.srcs, &op.dsts})
          for (const Ref& r : *list)
            if (r.buf == Buf::scratch)
              for (int32_t k = 0; k < r.count; ++k) used[size_t(r.index + k)] = 1;
      slot_cell_.assign(size_t(top + 1), -1);
      for (int64_t i = 0; i <= top; ++i)
        if (used[size_t(i)]) {
          slot_cell_[size_t(i)] = int32_t(slots_.size());
          slots_.push_back(int32_t(i));
        }
    } else {
      for (const Op& op : s_.ops)
        for (const auto* list : {&op.srcs, &op.dsts})
          for (const Ref& r : *list)
            if (r.buf == Buf::scratch)
              for (int32_t k = 0; k < r.count; ++k) slots_.push_back(r.index + k);
      std::sort(slots_.begin(), slots_.end());
      slots_.erase(std::unique(slots_.begin(), slots_.end()), slots_.end());
    }
    csc_ = int32_t(slots_.size());
  }

  uint32_t sym(int32_t rank, int32_t in_chunk) const { return uint32_t(rank) * cin_ + in_chunk; }
  std::string sym_str(uint32_t sym) const {
    return fmt::format("rank {} input chunk {}", sym / cin_, sym % cin_);
  }

  // The reduction tree of `a op b`, interned: equal ids mean the same
  // combination order. Leaves are symbols. Every reduction op is commutative
  // (a op b == b op a bit for bit), but floating-point sum and product are not
  // associative, so the tree is kept up to the order of two operands only.
  // `op`: the op that made the node first (messages).
  uint32_t combine(uint32_t a, uint32_t b, int32_t op) {
    const uint64_t key = (uint64_t(std::min(a, b)) << 32) | std::max(a, b);
    auto [id, added] = nodes_.try_emplace(key, leaves() + uint32_t(info_.size()));
    if (added) info_.push_back({std::min(a, b), std::max(a, b), op});
    return id;
  }
  // A value the kernel computed in the compute type and stored in the dtype:
  // a rounding point (fp16, bf16 and fp8 compute in float). Inputs are values
  // of the dtype already, and a rounded value rounds to itself.
  uint32_t round(uint32_t t, int32_t op) {
    if (t < leaves() || rounded(t)) return t;
    const uint64_t key = (uint64_t(t) << 32) | kRoundTag;
    auto [id, added] = nodes_.try_emplace(key, leaves() + uint32_t(info_.size()));
    if (added) info_.push_back({t, kRoundTag, op});
    return id;
  }
  uint32_t leaves() const { return uint32_t(s_.nranks) * uint32_t(cin_); }
  struct Node {
    uint32_t a, b;  // operands; b == kRoundTag: round(a)
    int32_t op;     // the op that made it first
  };
  static constexpr uint32_t kRoundTag = 0xffffffffu;
  const Node& node(uint32_t t) const { return info_[t - leaves()]; }
  bool rounded(uint32_t t) const { return t >= leaves() && node(t).b == kRoundTag; }
  // The tree without its rounding points (interned like the others).
  uint32_t strip(uint32_t t) {
    if (t < leaves()) return t;
    if (const uint32_t* m = stripped_.find(t)) return *m;
    const Node n = node(t);
    const uint32_t r = n.b == kRoundTag ? strip(n.a) : combine(strip(n.a), strip(n.b), n.op);
    stripped_.try_emplace(t, r);
    return r;
  }
  // Contributions in a tree.
  uint32_t leaf_count(uint32_t t) {
    if (t < leaves()) return 1;
    if (const uint32_t* m = counts_.find(t)) return *m;
    const Node n = node(t);
    const uint32_t c = n.b == kRoundTag ? leaf_count(n.a) : leaf_count(n.a) + leaf_count(n.b);
    counts_.try_emplace(t, c);
    return c;
  }
  // Where two trees that agree up to rounding (strip(x) == strip(y), x != y)
  // first differ: a rounding node on one side (`node`, `x_side`: it is x's)
  // where the other keeps the value in the compute type inside the value
  // that op `other_op` stores (the nearest rounding above on that side).
  struct RoundDiff {
    uint32_t node;
    bool x_side;
    int32_t other_op;
  };
  std::optional<RoundDiff> round_diff(uint32_t x, uint32_t y, int32_t xop, int32_t yop) {
    if (x == y) return std::nullopt;
    const bool rx = rounded(x), ry = rounded(y);
    if (rx && ry) return round_diff(node(x).a, node(y).a, node(x).op, node(y).op);
    if (rx) return RoundDiff{x, true, yop};
    if (ry) return RoundDiff{y, false, xop};
    if (x < leaves() || y < leaves()) return std::nullopt;  // not equal up to rounding
    const Node nx = node(x), ny = node(y);
    // operands are unordered: pair them by what they hold
    uint32_t ya = ny.a, yb = ny.b;
    if (!(strip(nx.a) == strip(ya) && strip(nx.b) == strip(yb))) std::swap(ya, yb);
    if (auto d = round_diff(nx.a, ya, xop, yop)) return d;
    return round_diff(nx.b, yb, xop, yop);
  }
  size_t cell(const Ref& r) const {
    const size_t base = size_t(r.rank) * per_rank_;
    switch (r.buf) {
      case Buf::input: return base + (inplace_ ? in_cell_[size_t(r.rank) * cin_ + r.index] : r.index);
      case Buf::output: return base + cin_ + r.index;
      case Buf::scratch:
        return base + cin_ + cout_ +
               (size_t(r.index) < slot_cell_.size()
                    ? slot_cell_[size_t(r.index)]
                    : std::lower_bound(slots_.begin(), slots_.end(), r.index) - slots_.begin());
    }
    return 0;
  }

  Value& at(const Ref& r) { return cells_[cell(r)]; }

  // What output chunk i of rank r must hold: one rank's input chunk, or that
  // chunk of every rank (a reduction).
  BlockSource source(int32_t r, int32_t i) const {
    BlockSource src = output_source(s_.coll, s_.root, r, i / s_.chunks);
    src.in_block = src.in_block * s_.chunks + i % s_.chunks;  // now an input chunk
    return src;
  }

  // Expected contributions of output chunk i of rank r.
  std::vector<uint32_t> expected(int32_t r, int32_t i) const {
    const BlockSource src = source(r, i);
    std::vector<uint32_t> e;
    if (src.from != BlockSource::kAllRanks) {
      e.push_back(sym(src.from, src.in_block));
    } else {
      for (int32_t q = 0; q < s_.nranks; ++q) e.push_back(sym(q, src.in_block));
    }
    std::sort(e.begin(), e.end());
    return e;
  }

  // Whether `v` holds exactly expected(r, i), without building it (a million
  // output chunks at 1024 ranks); a set already matched for the same input
  // chunk is not compared again.
  bool holds_expected(int32_t r, int32_t i, const Value& v) {
    const BlockSource src = source(r, i);
    const std::vector<uint32_t>& got = set_of(v);
    if (src.from != BlockSource::kAllRanks) return got.size() == 1 && got[0] == sym(src.from, src.in_block);
    const uint64_t key = uint64_t(reinterpret_cast<uintptr_t>(&got));
    if (const uint32_t* m = matched_.find(key)) return int32_t(*m) == src.in_block;
    bool ok = int32_t(got.size()) == s_.nranks;
    for (int32_t q = 0; ok && q < s_.nranks; ++q) ok = got[size_t(q)] == sym(q, src.in_block);
    if (ok) matched_.try_emplace(key, uint32_t(src.in_block));
    return ok;
  }

  static const std::vector<uint32_t>& set_of(const Value& v) {
    static const std::vector<uint32_t> empty;
    return v.syms ? *v.syms : empty;
  }

  const Schedule& s_;
  bool inplace_;
  int32_t cin_, cout_, csc_, per_rank_;
  std::vector<Value> cells_;
  std::vector<int32_t> slots_;  // scratch slots in use, sorted
  std::vector<int32_t> slot_cell_;  // slot -> index in slots_ (empty when the numbers are sparse)
  std::vector<bool> has_in_, has_out_;  // per rank
  std::vector<int32_t> in_cell_;    // in-place: input chunk (rank-major) -> its cell within the rank
  FlatMap nodes_;    // (tree, tree) -> tree combining them; (tree, kRoundTag) -> tree rounded
  std::vector<Node> info_;       // per non-leaf tree id
  FlatMap stripped_, counts_;    // memos of strip() and leaf_count()
  FlatMap matched_;  // set (its address) -> input chunk it matched
};

struct OpFacts {
  std::vector<int32_t> pos;
  bool complete = false;
};

struct Outcome {
  std::vector<OpFacts> facts;
  Orders orders;  // why ranks' results may differ bit-wise (with `orders`)
};

// Sees every chunk a data op reads (write = false, the value read) and
// writes (write = true, the value written), in program order.
using Watch = std::function<void(size_t op, const Ref& chunk, const Value& v, bool write)>;

std::string trail(const Schedule& s, bool inplace, int32_t rank, int32_t chunk, uint32_t missing);

// Runs the schedule symbolically; throws on the first problem. With `watch`
// it only runs (no final check), for trail().
// With `orders`, it also follows how each reduction is combined and rounded
// and fills Outcome::orders (interning every reduction step's tree is a
// large part of a run's time at scale, and only verify_deterministic asks).
Outcome run(const Schedule& s, bool inplace, const Watch& watch = {}, bool orders = false) {
  const char* mode = inplace ? "in-place" : "out-of-place";
  Machine m(s, inplace);
  Outcome out;
  std::vector<OpFacts>& facts = out.facts;
  facts.resize(s.ops.size());
  const bool reducing = collective_reduces(s.coll);
  std::vector<Value> result;    // one op's values, per chunk
  std::vector<uint32_t> merged, spare;  // a reduction's union so far, and the next one
  for (size_t oi = 0; oi < s.ops.size(); ++oi) {
    const Op& op = s.ops[oi];
    if (!op.is_data()) continue;
    const int32_t n = op.count();
    auto where = [&](const Ref& r, int32_t k) {
      return fmt::format("{}: {} reads/writes {}", coll_context(s, mode), describe_op(s, oi),
                         ir::to_string(r.at(k)));
    };
    // Whether a buffer exists does not depend on the chunk: checked once per
    // ref, reported at its first chunk.
    for (const Ref& r : op.srcs)
      if (n > 0 && r.buf != Buf::scratch && !(r.buf == Buf::input ? m.has_in_[size_t(r.rank)]
                                                                  : m.has_out_[size_t(r.rank)]))
          throw Error(ErrId::verify_E010,
                      where(r, 0) + fmt::format(": rank {} has no {} buffer in a {} rooted at {}",
                                                r.rank, r.buf == Buf::input ? "send" : "receive",
                                                name(s.coll), s.root),
                      op.loc);
    for (const Ref& r : op.dsts)
      if (n > 0) {
        if (r.buf == Buf::input)
          throw Error(ErrId::verify_E009,
                      where(r, 0) + ": input buffers are read-only (the caller's send buffer)",
                      op.loc, "write into output or scratch instead");
        if (r.buf == Buf::output && !m.has_out_[size_t(r.rank)])
          throw Error(ErrId::verify_E009,
                      where(r, 0) + fmt::format(": rank {} has no receive buffer in a {} rooted at {}",
                                                r.rank, name(s.coll), s.root),
                      op.loc);
      }
    OpFacts& f = facts[oi];
    f.pos.assign(n, -1);
    result.assign(size_t(n), Value{});
    for (int32_t k = 0; k < n; ++k) {
      Value acc;
      for (size_t si = 0; si < op.srcs.size(); ++si) {
        const Ref c = op.srcs[si].at(k);
        const Value& v = m.at(c);
        if (!v.init)
          throw Error(ErrId::verify_E007,
                      fmt::format("{}: {} reads {} (chunk {}) before anything wrote it",
                                  coll_context(s, mode), describe_op(s, oi), ir::to_string(c), k),
                      op.loc,
                      c.buf == Buf::output && !inplace
                          ? "out-of-place, the output starts empty: read the input instead"
                          : "make sure an earlier operation fills this chunk");
        if (acc.init && acc.pos != v.pos)
          throw Error(ErrId::verify_E008,
                      fmt::format("{}: {} combines data of chunk position {} with position {} ({})",
                                  coll_context(s, mode), describe_op(s, oi), acc.pos, v.pos,
                                  ir::to_string(c)),
                      op.loc, "a reduction combines the same chunk of different ranks");
        if (watch) watch(oi, c, v, false);
        if (!acc.init) {
          acc.syms = v.syms;  // shared until a second source comes
        } else {
          // The union so far is built in `merged`; one shared set per chunk
          // once every source is in.
          const auto& a = si == 1 ? Machine::set_of(acc) : merged;
          const auto& b = Machine::set_of(v);
          spare.clear();
          spare.reserve(a.size() + b.size());
          std::merge(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(spare));
          std::swap(merged, spare);
          if (si + 1 == op.srcs.size())
            acc.syms = std::make_shared<const std::vector<uint32_t>>(merged.begin(), merged.end());
        }
        if (orders) acc.tree = acc.init ? m.combine(acc.tree, v.tree, int32_t(oi)) : v.tree;
        acc.init = true;
        acc.pos = v.pos;
      }
      const std::vector<uint32_t>& syms = Machine::set_of(acc);
      // One source's set was checked when it was made (every set is a
      // singleton or the result of a merge below): only a union can repeat.
      auto dup = op.srcs.size() > 1 ? std::adjacent_find(syms.begin(), syms.end()) : syms.end();
      if (dup != syms.end())
        throw Error(ErrId::verify_E002,
                    fmt::format("{}: {} counts the contribution of {} twice (chunk {})",
                                coll_context(s, mode), describe_op(s, oi), m.sym_str(*dup), k),
                    op.loc, "each rank's data may enter a reduction once");
      // The kernel addresses a user-buffer chunk by its index and sizes every
      // chunk of the op by the data's position (the last chunks of a block are
      // short at most counts), so data stays at its position in the block:
      // moved elsewhere it would be cut short or run past the buffer's end.
      for (const Ref& d : op.dsts)
        if (d.buf != Buf::scratch && (d.index + k) % s.chunks != acc.pos)
          throw Error(ErrId::verify_E008,
                      fmt::format("{}: {} writes data of chunk position {} into {}, which is at position {} of "
                                  "its block",
                                  coll_context(s, mode), describe_op(s, oi), acc.pos, ir::to_string(d.at(k)),
                                  (d.index + k) % s.chunks),
                      op.loc,
                      "chunk j of a block only moves to chunk j of a block (index % chunks); the last chunks of a "
                      "block are shorter than the others at most counts");
      f.pos[k] = acc.pos;
      if (op.kind == OpKind::reduce && reducing && int32_t(syms.size()) == s.nranks)
        f.complete = true;
      // the kernel folds a reduce's sources in the compute type and stores
      // the result in the dtype: a rounding point
      if (orders && op.kind == OpKind::reduce) acc.tree = m.round(acc.tree, int32_t(oi));
      result[k] = std::move(acc);
    }
    for (const Ref& d : op.dsts)
      for (int32_t k = 0; k < n; ++k) {
        Value& v = m.at(d.at(k));
        v = result[k];
        v.writer = int32_t(oi);
        if (watch) watch(oi, d.at(k), v, true);
      }
  }
  if (watch) return out;
  // Final state of every output chunk.
  // input chunk -> (first rank whose output reduces it, its tree, the op
  // that wrote it); rank -1: none yet
  struct Seen {
    int32_t rank = -1;
    uint32_t tree = 0;
    int32_t writer = -1;
  };
  std::vector<Seen> tree_of(size_t(orders ? m.cin_ : 0));
  auto op_at = [&](int32_t oi) {
    const SrcLoc l = s.ops[size_t(oi)].loc.get();
    return describe_op(s, size_t(oi)) + (l.valid() ? " at " + l.str() : "");
  };
  for (int32_t r = 0; r < s.nranks; ++r) {
    if (!ir::has_output(s, r)) continue;
    for (int32_t i = 0; i < m.cout_; ++i) {
      const Ref c{r, Buf::output, i, 1};
      const Value& v = m.at(c);
      if (m.holds_expected(r, i, v)) {
        const BlockSource src = m.source(r, i);
        if (!orders || src.from != BlockSource::kAllRanks || !out.orders.order.empty()) continue;
        Seen& seen = tree_of[size_t(src.in_block)];
        if (seen.rank < 0) {
          seen = {r, v.tree, v.writer};
          continue;
        }
        if (seen.tree == v.tree) continue;
        if (m.strip(seen.tree) != m.strip(v.tree)) {
          out.orders.order = fmt::format(
              "{}: ranks {} and {} combine the contributions to input chunk {} in different orders (rank {}'s "
              "output chunk {}, last written by {}): floating-point sums and products then differ bit-wise "
              "between ranks",
              coll_context(s, mode), seen.rank, r, src.in_block, r, i, op_at(v.writer));
          out.orders.order_loc = s.ops[size_t(v.writer)].loc.get();
          continue;
        }
        if (!out.orders.rounding.empty()) continue;
        const auto d = m.round_diff(seen.tree, v.tree, seen.writer, v.writer);
        MK_CHECK(d, "trees equal up to rounding differ nowhere");
        const int32_t rounds = m.node(d->node).op;  // stores the partial result in the dtype
        const int32_t rank_rounds = d->x_side ? seen.rank : r, rank_keeps = d->x_side ? r : seen.rank;
        out.orders.rounding = fmt::format(
            "{}: ranks {} and {} combine the contributions to input chunk {} in the same order but round at "
            "different points (rank {}'s output chunk {}): on rank {}'s path, {} stores a partial result of {} of "
            "the {} contributions in the dtype (rounding it); on rank {}'s path, {} combines it with the rest in the "
            "compute type and rounds only the result: fp16, bf16 and fp8 results then differ bit-wise between ranks (fp32, "
            "fp64 and integer results agree)",
            coll_context(s, mode), seen.rank, r, src.in_block, r, i, rank_rounds, op_at(rounds),
            m.leaf_count(d->node), s.nranks, rank_keeps, op_at(d->other_op));
        out.orders.rounding_loc = s.ops[size_t(rounds)].loc.get();
        continue;
      }
      const auto exp = m.expected(r, i);
      const std::vector<uint32_t>& syms = Machine::set_of(v);
      // No writer: point at the schedule's declaration.
      const bool written = v.writer >= 0;
      std::string who = written ? "; last written by " + describe_op(s, size_t(v.writer)) : "; nothing wrote it";
      SrcLoc loc = written ? s.ops[size_t(v.writer)].loc.get() : s.loc;
      for (uint32_t e : exp)
        if (!std::binary_search(syms.begin(), syms.end(), e)) {
          const std::string t = written ? trail(s, inplace, r, i, e) : "";
          const bool overwritten = t.find("overwrote before anything read it") != std::string::npos;
          throw Error(ErrId::verify_E001,
                      fmt::format("{}: rank {} output chunk {} misses the contribution of {}{}{}",
                                  coll_context(s, mode), r, i, m.sym_str(e), who, t),
                      loc,
                      !written ? fmt::format("write rank {}'s output chunk {} (it is declared with the {})", r, i,
                                             name(s.coll))
                      : overwritten ? "in place, read each input chunk (or copy it into scratch) before anything "
                                      "writes the output chunk it shares memory with"
                                    : "");
        }
      for (uint32_t g : syms)
        if (!std::binary_search(exp.begin(), exp.end(), g))
          throw Error(ErrId::verify_E003,
                      fmt::format("{}: rank {} output chunk {} holds the contribution of {}, which "
                                  "does not belong there{}",
                                  coll_context(s, mode), r, i, m.sym_str(g), who),
                      loc);
      MK_CHECK(false, "output differs from the expectation but no difference was found");
    }
  }
  return out;
}

// Where contribution `missing` of output chunk `chunk` of `rank` was lost:
// the most complete partial result of that chunk that held it (the last write
// of the most contributions that all belong there), and what became of it.
std::string trail(const Schedule& s, bool inplace, int32_t rank, int32_t chunk, uint32_t missing) {
  Machine m(s, inplace);
  const auto exp = m.expected(rank, chunk);
  struct Best {
    size_t op = 0, size = 0;
    Ref at;
    std::vector<size_t> readers;
    int64_t overwritten_by = -1;
  };
  // First the partial, then what became of it.
  std::optional<Best> found;
  run(s, inplace, [&](size_t oi, const Ref& c, const Value& v, bool write) {
    const std::vector<uint32_t>& syms = Machine::set_of(v);
    if (!write || !std::binary_search(syms.begin(), syms.end(), missing)) return;
    if (!std::includes(exp.begin(), exp.end(), syms.begin(), syms.end())) return;
    if (!found || syms.size() >= found->size) found = Best{oi, syms.size(), c, {}, -1};
  });
  if (!found) {
    // In place, an input chunk is its rank's output chunk: written before
    // anything read it, the contribution was gone before it could be carried.
    const Ref in{int32_t(missing / uint32_t(m.cin_)), Buf::input, int32_t(missing % uint32_t(m.cin_)), 1};
    if (inplace && ir::inplace_output_of_input(s, in.rank, in.index)) {
      const size_t target = m.cell(in);
      int64_t first_write = -1;
      bool read_before = false;
      run(s, inplace, [&](size_t oi, const Ref& c, const Value&, bool write) {
        if (first_write >= 0 || m.cell(c) != target) return;
        if (write)
          first_write = int64_t(oi);
        else
          read_before = true;
      });
      if (first_write >= 0 && !read_before)
        return fmt::format("; in place, {} is rank {}'s output chunk {}, which {} overwrote before anything read it",
                           m.sym_str(missing), in.rank, *ir::inplace_output_of_input(s, in.rank, in.index),
                           describe_op(s, size_t(first_write)));
    }
    return fmt::format("; no partial result of this chunk ever held {}", m.sym_str(missing));
  }
  std::optional<Best> best = found;
  run(s, inplace, [&](size_t oi, const Ref& c, const Value&, bool write) {
    if (oi <= best->op || c != best->at) return;
    if (!write) {
      if (best->overwritten_by < 0 && (best->readers.empty() || best->readers.back() != oi))
        best->readers.push_back(oi);
    } else if (best->overwritten_by < 0) {
      best->overwritten_by = int64_t(oi);
    }
  });
  std::string fate;
  if (!best->readers.empty()) {
    fate = "; it was read by " + describe_op(s, best->readers[0]);
    if (best->readers.size() > 1) fate += fmt::format(" (and {} more)", best->readers.size() - 1);
    fate += ", but no result of that reached this chunk";
  } else if (best->overwritten_by >= 0) {
    fate = "; it was overwritten by " + describe_op(s, size_t(best->overwritten_by)) + " before anything read it";
  } else {
    fate = "; nothing read it afterwards";
  }
  return fmt::format("; trail: {} was last carried by {}, which wrote {} ({} of {} contributions){}",
                     m.sym_str(missing), describe_op(s, best->op), ir::to_string(best->at), best->size, exp.size(),
                     fate);
}

// Chunk k of every ref is processed together (element by element, in parallel
// on the GPU), so within one op two destinations must never name the same
// chunk (two writes in no defined order), and a destination chunk that is
// *another* position's source chunk would be read and written in no defined
// order. Checked for both aliasings; sorting keeps it O(n log n) per op.
// Whether two refs of an op, one of them a destination, can name one
// location in either aliasing: a ref's own chunks never do (aliasing maps
// distinct chunks to distinct locations), refs of different ranks or spaces
// never do, and refs of one buffer do when their ranges overlap; input and
// output of one rank may alias in place.
bool may_collide(const Op& op) {
  auto meet = [](const Ref& a, const Ref& b) {
    if (a.rank != b.rank) return false;
    if (a.buf == b.buf) return a.index < b.index + b.count && b.index < a.index + a.count;
    return a.buf != Buf::scratch && b.buf != Buf::scratch;
  };
  for (size_t i = 0; i < op.dsts.size(); ++i) {
    for (size_t j = i + 1; j < op.dsts.size(); ++j)
      if (meet(op.dsts[i], op.dsts[j])) return true;
    for (const Ref& src : op.srcs)
      if (meet(op.dsts[i], src)) return true;
  }
  return false;
}

void check_overlaps(const Schedule& s, size_t oi, const std::string& ctx) {
  const Op& op = s.ops[oi];
  if (!may_collide(op)) return;  // the common case at scale, without sorting every chunk
  struct Touch {
    std::tuple<int32_t, int32_t, int32_t> key;  // rank, space, index (aliasing applied)
    bool dst;
    int32_t k;         // chunk of the op
    const Ref* ref;
  };
  std::vector<Touch> t;
  for (bool inplace : {false, true}) {
    t.clear();
    for (const auto* list : {&op.srcs, &op.dsts})
      for (const Ref& r : *list)
        for (int32_t k = 0; k < r.count; ++k) {
          LocKey l = loc_key(s, r.at(k), inplace);
          t.push_back({{l.rank, l.space, l.index}, list == &op.dsts, k, &r});
        }
    std::sort(t.begin(), t.end(), [](const Touch& a, const Touch& b) {
      return std::tie(a.key, a.dst, a.k) < std::tie(b.key, b.dst, b.k);
    });
    const char* mode = inplace ? " in-place" : "";
    for (size_t i = 0; i < t.size(); ++i)
      for (size_t j = i + 1; j < t.size() && t[j].key == t[i].key; ++j) {
        const Touch &a = t[i], &b = t[j];  // a.dst implies b.dst (sources sort first)
        if (a.dst && b.dst && a.k == b.k)  // the same position: the same value, written twice
          throw Error(ErrId::verify_E004,
                      fmt::format("{}: {} names {} twice as a destination ({}{}): both writes carry the same data, "
                                  "but an op writes each destination chunk once (its threads would store to one "
                                  "address twice, unordered; the LL protocol's flags would arrive twice)",
                                  ctx, describe_op(s, oi), ir::to_string(b.ref->at(b.k)),
                                  *a.ref == *b.ref ? fmt::format("the destination {} is listed twice",
                                                                 ir::to_string(*a.ref))
                                                   : fmt::format("in {} and in {}", ir::to_string(*a.ref),
                                                                 ir::to_string(*b.ref)),
                                  mode),
                      op.loc, "list each destination once");
        if (a.dst && b.dst)
          throw Error(ErrId::verify_E004,
                      fmt::format("{}: {} writes {} twice, as chunk {} of {} and as chunk {} of {}{}: the result "
                                  "would depend on execution order",
                                  ctx, describe_op(s, oi), ir::to_string(b.ref->at(b.k)), a.k, ir::to_string(*a.ref),
                                  b.k, ir::to_string(*b.ref), mode),
                      op.loc, "give every destination its own chunks");
        if (!a.dst && b.dst && a.k != b.k)
          throw Error(ErrId::verify_E004,
                      fmt::format("{}: {} writes {} and reads it as chunk {} of {} (position {} vs {}){}: the "
                                  "result would depend on execution order",
                                  ctx, describe_op(s, oi), ir::to_string(b.ref->at(b.k)), a.k,
                                  ir::to_string(*a.ref), b.k, a.k, mode),
                      op.loc, "split the op, or stage through scratch");
      }
  }
}

}  // namespace

std::string describe_op(const Schedule& s, size_t oi) {
  const Op& op = s.ops.at(oi);
  int32_t step = 0;
  for (size_t i = 0; i < oi; ++i)
    if (s.ops[i].rank == op.rank) ++step;
  std::string tb = op.tb >= 0 ? fmt::format(", tb {}", op.tb) : "";
  return fmt::format("%{} ({} on rank {}{}, step {})", op.id, name(op.kind), op.rank, tb, step);
}

void verify_bounds(const Schedule& s) {
  auto ctx = coll_context(s, nullptr);
  for (size_t oi = 0; oi < s.ops.size(); ++oi) {
    const Op& op = s.ops[oi];
    if (op.rank < 0 || op.rank >= s.nranks)
      throw Error(ErrId::verify_E006,
                  fmt::format("{}: op %{} executes on rank {}, outside 0..{}", ctx, op.id, op.rank,
                              s.nranks - 1),
                  op.loc);
    // -1: not assigned yet; once assigned (tbs set, or synced) below s.tbs.
    // Bounded before the sync analyses size their (rank, thread block)
    // tables by it.
    if (op.tb < -1 || ((s.tbs > 0 || s.synced) && op.tb >= s.tbs))
      throw Error(ErrId::verify_E006,
                  fmt::format("{}: {} runs on thread block {}, outside -1..{} (the schedule has tbs = {})", ctx,
                              describe_op(s, oi), op.tb, s.tbs - 1, s.tbs),
                  op.loc, "tb is -1 (the compiler chooses) or below the schedule's tbs");
    if (int(op.srcs.size()) < ir::min_srcs(op.kind) || int(op.dsts.size()) < ir::min_dsts(op.kind))
      throw Error(ErrId::verify_E006,
                  fmt::format("{}: {} has too few sources or destinations", ctx, describe_op(s, oi)),
                  op.loc);
    const int32_t n = op.count();
    for (const auto* list : {&op.srcs, &op.dsts})
      for (const Ref& r : *list) {
        int32_t size = ir::buf_chunks(s, r.buf);
        if (r.rank < 0 || r.rank >= s.nranks || r.index < 0 || r.count < 1 ||
            r.index + r.count > size)
          throw Error(ErrId::verify_E006,
                      fmt::format("{}: {} touches {}, but rank {}'s {} buffer has {} chunk(s)", ctx,
                                  describe_op(s, oi), ir::to_string(r), r.rank, name(r.buf), size),
                      op.loc,
                      r.buf == Buf::scratch ? "scratch slots are 0..scratch-1"
                                            : "chunk indices are 0..chunks*blocks-1");
        if (r.count != n)
          throw Error(ErrId::verify_E006,
                      fmt::format("{}: {} mixes chunk counts ({} vs {})", ctx, describe_op(s, oi),
                                  r.count, n),
                      op.loc);
      }
    if (op.is_data()) check_overlaps(s, oi, ctx);
    if (op.kind == OpKind::signal && (op.peer < 0 || op.peer >= s.nranks))
      throw Error(ErrId::verify_E006,
                  fmt::format("{}: {} signals rank {}, outside 0..{}", ctx, describe_op(s, oi),
                              op.peer, s.nranks - 1),
                  op.loc);
    if ((op.kind == OpKind::signal || op.kind == OpKind::wait) && (op.slot < 0 || op.slot >= s.slots))
      throw Error(ErrId::verify_E006,
                  fmt::format("{}: {} uses flag slot {}, outside 0..{}", ctx, describe_op(s, oi),
                              op.slot, s.slots - 1),
                  op.loc);
    if (op.kind == OpKind::wait && (op.iter > 0 || op.iter < -s.depth))
      throw Error(ErrId::verify_E011,
                  fmt::format("{}: {} waits {} steps back; must be 0 or -{} (the scratch depth)",
                              ctx, describe_op(s, oi), -op.iter, s.depth),
                  op.loc);
  }
}

void verify_semantics(const Schedule& s, Orders* orders) {
  bool any = std::any_of(s.ops.begin(), s.ops.end(), [](const Op& o) { return o.is_data(); });
  if (!any)
    throw Error(ErrId::verify_E012,
                fmt::format("{}: the schedule has no copy or reduce operations",
                            coll_context(s, nullptr)),
                {}, "every collective must write its output; did the builder run for this rank count?");
  verify_bounds(s);
  verify_links(s);
  // The two aliasings are independent runs: side by side (at 1024 ranks each
  // is about a second for a reducing schedule). An out-of-place failure is
  // reported first, as when they ran one after the other.
  // With `orders`, the out-of-place run also answers verify_deterministic.
  side_by_side(2, [&](size_t k) {
    Outcome o = run(s, k == 1, {}, orders && k == 0);
    if (orders && k == 0) *orders = std::move(o.orders);
  });
}

void analyze(Schedule& s, Orders* orders) {
  verify_bounds(s);
  std::vector<OpFacts> a, b;
  side_by_side(2, [&](size_t k) {
    Outcome o = run(s, k == 1, {}, orders && k == 0);
    if (orders && k == 0) *orders = std::move(o.orders);
    (k == 0 ? a : b) = std::move(o.facts);
  });
  for (size_t i = 0; i < s.ops.size(); ++i) {
    MK_CHECK(a[i].pos == b[i].pos && a[i].complete == b[i].complete,
             "positions differ between in-place and out-of-place");
    s.ops[i].pos = a[i].pos;
    s.ops[i].final = a[i].complete;
  }
}

void verify_all(const Schedule& s) {
  verify_semantics(s);
  if (s.synced) verify_sync(s);
}

}  // namespace mk::verify

namespace mk::verify {

namespace {
bool narrow_float(DType t) {
  return t == DType::fp16 || t == DType::bf16 || t == DType::fp8e4m3 || t == DType::fp8e5m2;
}
// Whether the order of a reduction's steps shows in its bits: floating-point
// sum and product (avg and premulsum are sums). Integers wrap around (exact,
// associative); min and max pick one of their operands, the same one in
// either order (templates/reduce.cuh).
bool order_matters(std::optional<DType> t, RedOp op) {
  if (t && !dtype_is_float(*t)) return false;
  return op != RedOp::min && op != RedOp::max;
}
const std::string kNone;
}  // namespace

const std::string& Orders::for_call(std::optional<DType> t, RedOp op) const {
  if (!order_matters(t, op)) return kNone;
  if (!order.empty()) return order;
  if (!t || narrow_float(*t)) return rounding;
  return kNone;
}

SrcLoc Orders::loc_for(std::optional<DType> t, RedOp op) const {
  const std::string& why = for_call(t, op);
  if (why.empty()) return {};
  return &why == &order ? order_loc : rounding_loc;
}

Orders nondeterminism(const Schedule& s) {
  // One aliasing suffices: in-place and out-of-place run the same ops.
  return run(s, false, {}, true).orders;
}

Error nondeterministic_error(const Orders& why, std::optional<DType> t, RedOp op) {
  const std::string& w = why.for_call(t, op);
  MK_CHECK(!w.empty(), "nondeterministic_error without a reason");
  const bool rounding = &w == &why.rounding;
  return Error(ErrId::verify_E015, w, why.loc_for(t, op),
               rounding ? "reduce in one op what the other ranks reduce in one op (or store the same partial results "
                          "on every rank), or reduce each chunk once and copy the result to the other ranks"
                        : "reduce each chunk once and copy the result to the other ranks, or list every rank's sources "
                          "in one order (e.g. by rank) on every rank");
}

void verify_deterministic(const Schedule& s, std::optional<DType> t, RedOp op) {
  const Orders why = nondeterminism(s);
  if (!why.for_call(t, op).empty()) throw nondeterministic_error(why, t, op);
}

Schedule rotate_root(Schedule s, int32_t root) {
  if (!collective_rooted(s.coll)) {
    s.root = 0;  // meaningless there; plans and keys say 0
    return s;
  }
  const int32_t by = ((root - s.root) % s.nranks + s.nranks) % s.nranks;
  if (by == 0) return s;
  auto rot = [&](int32_t r) { return (r + by) % s.nranks; };
  for (Op& op : s.ops) {
    op.rank = rot(op.rank);
    if (op.kind == OpKind::signal) op.peer = rot(op.peer);
    for (auto* list : {&op.srcs, &op.dsts})
      for (Ref& r : *list) r.rank = rot(r.rank);
  }
  s.root = root;
  return s;
}

void verify_root(const Schedule& s, int32_t root) {
  if (root < 0 || root >= s.nranks)
    throw Error(ErrId::verify_E006, fmt::format("{}: root {} is not a rank of {}", coll_context(s, nullptr), root,
                                                s.nranks));
  verify_semantics(rotate_root(s, root));
}

}  // namespace mk::verify
