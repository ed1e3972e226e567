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
#include <tuple>

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

struct Value {
  bool init = false;
  int32_t pos = -1;
  std::vector<uint32_t> syms;  // sorted multiset of contributions
  int32_t writer = -1;         // op index of the last write
};

class Machine {
 public:
  Machine(const Schedule& s, bool inplace) : s_(s), inplace_(inplace) {
    cin_ = ir::buf_chunks(s, Buf::input);
    cout_ = ir::buf_chunks(s, Buf::output);
    csc_ = s.scratch;
    per_rank_ = cin_ + cout_ + csc_;
    cells_.resize(size_t(per_rank_) * s.nranks);
    for (int32_t r = 0; r < s.nranks; ++r) {
      if (!ir::has_input(s, r)) continue;
      for (int32_t j = 0; j < cin_; ++j) {
        Value& v = cells_[cell(Ref{r, Buf::input, j, 1})];
        v.init = true;
        v.pos = j % s.chunks;
        v.syms = {sym(r, j)};
      }
    }
  }

  uint32_t sym(int32_t rank, int32_t in_chunk) const { return uint32_t(rank) * cin_ + in_chunk; }
  std::string sym_str(uint32_t sym) const {
    return fmt::format("rank {} input chunk {}", sym / cin_, sym % cin_);
  }

  size_t cell(const Ref& r) const {
    int32_t base = r.rank * per_rank_;
    switch (r.buf) {
      case Buf::input:
        if (inplace_) {
          if (auto o = ir::inplace_output_of_input(s_, r.rank, r.index)) return base + cin_ + *o;
        }
        return base + r.index;
      case Buf::output: return base + cin_ + r.index;
      case Buf::scratch: return base + cin_ + cout_ + r.index;
    }
    return 0;
  }

  Value& at(const Ref& r) { return cells_[cell(r)]; }

  // Expected contributions of output chunk i of rank r.
  std::vector<uint32_t> expected(int32_t r, int32_t i) const {
    const int32_t K = s_.chunks, N = s_.nranks;
    const BlockSource src = output_source(s_.coll, s_.root, r, i / K);
    const int32_t in_chunk = src.in_block * K + i % K;
    std::vector<uint32_t> e;
    if (src.from != BlockSource::kAllRanks) {
      e.push_back(sym(src.from, in_chunk));
    } else {
      for (int32_t q = 0; q < N; ++q) e.push_back(sym(q, in_chunk));
    }
    std::sort(e.begin(), e.end());
    return e;
  }

  const Schedule& s_;
  bool inplace_;
  int32_t cin_, cout_, csc_, per_rank_;
  std::vector<Value> cells_;
};

struct OpFacts {
  std::vector<int32_t> pos;
  bool complete = false;
};

// Runs the schedule symbolically; throws on the first problem.
std::vector<OpFacts> run(const Schedule& s, bool inplace) {
  const char* mode = inplace ? "in-place" : "out-of-place";
  Machine m(s, inplace);
  std::vector<OpFacts> facts(s.ops.size());
  const bool reducing = collective_reduces(s.coll);
  for (size_t oi = 0; oi < s.ops.size(); ++oi) {
    const Op& op = s.ops[oi];
    if (!op.is_data()) continue;
    const int32_t n = op.count();
    auto where = [&](const Ref& r, int32_t k) {
      return fmt::format("{}: {} reads/writes {}", coll_context(s, mode), describe_op(s, oi),
                         ir::to_string(r.at(k)));
    };
    for (const Ref& r : op.srcs)
      for (int32_t k = 0; k < n; ++k)
        if (r.buf != Buf::scratch && !(r.buf == Buf::input ? ir::has_input(s, r.rank)
                                                           : ir::has_output(s, r.rank)))
          throw Error(ErrId::verify_E010,
                      where(r, k) + fmt::format(": rank {} has no {} buffer in a {} rooted at {}",
                                                r.rank, r.buf == Buf::input ? "send" : "receive",
                                                name(s.coll), s.root),
                      op.loc);
    for (const Ref& r : op.dsts)
      for (int32_t k = 0; k < n; ++k) {
        bool aliased_output = inplace && r.buf == Buf::input &&
                              ir::inplace_output_of_input(s, r.rank, r.index + k).has_value();
        (void)aliased_output;
        if (r.buf == Buf::input)
          throw Error(ErrId::verify_E009,
                      where(r, k) + ": input buffers are read-only (the caller's send buffer)",
                      op.loc, "write into output or scratch instead");
        if (r.buf == Buf::output && !ir::has_output(s, r.rank))
          throw Error(ErrId::verify_E009,
                      where(r, k) + fmt::format(": rank {} has no receive buffer in a {} rooted at {}",
                                                r.rank, name(s.coll), s.root),
                      op.loc);
      }
    OpFacts& f = facts[oi];
    f.pos.assign(n, -1);
    std::vector<Value> result(n);
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
        acc.init = true;
        acc.pos = v.pos;
        acc.syms.insert(acc.syms.end(), v.syms.begin(), v.syms.end());
      }
      std::sort(acc.syms.begin(), acc.syms.end());
      auto dup = std::adjacent_find(acc.syms.begin(), acc.syms.end());
      if (dup != acc.syms.end())
        throw Error(ErrId::verify_E002,
                    fmt::format("{}: {} counts the contribution of {} twice (chunk {})",
                                coll_context(s, mode), describe_op(s, oi), m.sym_str(*dup), k),
                    op.loc, "each rank's data may enter a reduction once");
      f.pos[k] = acc.pos;
      if (op.kind == OpKind::reduce && reducing && int32_t(acc.syms.size()) == s.nranks)
        f.complete = true;
      result[k] = std::move(acc);
    }
    for (const Ref& d : op.dsts)
      for (int32_t k = 0; k < n; ++k) {
        Value& v = m.at(d.at(k));
        v = result[k];
        v.writer = int32_t(oi);
      }
  }
  // Final state of every output chunk.
  for (int32_t r = 0; r < s.nranks; ++r) {
    if (!ir::has_output(s, r)) continue;
    for (int32_t i = 0; i < m.cout_; ++i) {
      const Ref c{r, Buf::output, i, 1};
      const Value& v = m.at(c);
      auto exp = m.expected(r, i);
      if (exp == v.syms) continue;
      std::string who = v.writer >= 0 ? "; last written by " + describe_op(s, size_t(v.writer))
                                      : "; nothing wrote it";
      SrcLoc loc = v.writer >= 0 ? s.ops[size_t(v.writer)].loc : SrcLoc{};
      for (uint32_t e : exp)
        if (!std::binary_search(v.syms.begin(), v.syms.end(), e))
          throw Error(ErrId::verify_E001,
                      fmt::format("{}: rank {} output chunk {} misses the contribution of {}{}",
                                  coll_context(s, mode), r, i, m.sym_str(e), who),
                      loc);
      for (uint32_t g : v.syms)
        if (!std::binary_search(exp.begin(), exp.end(), g))
          throw Error(ErrId::verify_E003,
                      fmt::format("{}: rank {} output chunk {} holds the contribution of {}, which "
                                  "does not belong there{}",
                                  coll_context(s, mode), r, i, m.sym_str(g), who),
                      loc);
      MK_CHECK(false, "output differs from the expectation but no difference was found");
    }
  }
  return facts;
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
    // Chunk k of every ref is processed together (element by element, in
    // parallel on the GPU). A destination chunk that is *another* position's
    // source chunk would be read and written in no defined order.
    if (op.is_data())
      for (bool inplace : {false, true})
        for (const Ref& d : op.dsts)
          for (const Ref& src : op.srcs)
            for (int32_t k = 0; k < n; ++k)
              for (int32_t m = 0; m < n; ++m) {
                if (k == m) continue;
                auto key = [&](const Ref& r, int32_t i) {
                  Ref c = r.at(i);
                  if (inplace && c.buf == Buf::input)
                    if (auto o = ir::inplace_output_of_input(s, c.rank, c.index)) c = Ref{c.rank, Buf::output, *o, 1};
                  return std::make_tuple(c.rank, int(c.buf), c.index);
                };
                if (key(d, k) == key(src, m))
                  throw Error(ErrId::verify_E004,
                              fmt::format("{}: {} writes {} and reads it as chunk {} of {} (position {} vs {}){}: the "
                                          "result would depend on execution order",
                                          ctx, describe_op(s, oi), ir::to_string(d.at(k)), m, ir::to_string(src), k, m,
                                          inplace ? " in-place" : ""),
                              op.loc, "split the op, or stage through scratch");
              }
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

void verify_semantics(const Schedule& s) {
  bool any = std::any_of(s.ops.begin(), s.ops.end(), [](const Op& o) { return o.is_data(); });
  if (!any)
    throw Error(ErrId::verify_E012,
                fmt::format("{}: the schedule has no copy or reduce operations",
                            coll_context(s, nullptr)),
                {}, "every collective must write its output; did the builder run for this rank count?");
  verify_bounds(s);
  verify_links(s);
  run(s, false);
  run(s, true);
}

void analyze(Schedule& s) {
  verify_bounds(s);
  auto a = run(s, false);
  auto b = run(s, true);
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
