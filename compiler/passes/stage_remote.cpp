// stage_remote: route every access to another rank's *user* buffer through
// scratch, so that only a buffer's owner ever touches it.
//
// Why: the runtime maps each rank's scratch into its peers once, at
// communicator creation; user buffers change every call and are not mapped.
// It also means a rank's buffers are never touched after its kernel returns.
//
//   remote source      op on E reads r.in[i]   ->  r: copy r.in[i] -> r.sc[new]
//                                                   E: op reads r.sc[new]
//   remote destination op on E writes r.out[i] ->  E: op writes r.sc[new]
//                                                   r: copy r.sc[new] -> r.out[i]
//
// Placement: a staging read sits right before the op it serves. A staging
// write (scratch -> user buffer) is deferred to just before the first later
// op that touches that user chunk (or the end): nothing in between can see
// the difference, and a rank's own sends are not queued behind its receives
// (a ring's "receive, store, forward" then fuses into one op).
//
// Needs: a verified schedule. Guarantees: same meaning; every data op touches
// user buffers of its executing rank only; each staging slot is new (no
// reuse, so staging adds no ordering between unrelated transfers).
#include <algorithm>

#include "compiler/passes/passes.hpp"

namespace mk::passes {

using ir::Buf;
using ir::Op;
using ir::OpKind;
using ir::Ref;

namespace {

// Whether `r` (a user-buffer ref) may touch chunk `index` of `rank`'s output,
// in either aliasing mode.
bool touches_output(const ir::Schedule& s, const Ref& r, int32_t rank, int32_t index) {
  if (r.rank != rank || r.buf == Buf::scratch) return false;
  for (int32_t k = 0; k < r.count; ++k) {
    if (r.buf == Buf::output && r.index + k == index) return true;
    if (r.buf == Buf::input) {
      auto o = ir::inplace_output_of_input(s, rank, r.index + k);
      if (o && *o == index) return true;
    }
  }
  return false;
}

bool touches_any(const ir::Schedule& s, const Op& op, const Ref& dst) {
  for (int32_t k = 0; k < dst.count; ++k)
    for (const auto* list : {&op.srcs, &op.dsts})
      for (const Ref& r : *list)
        if (dst.buf == Buf::output ? touches_output(s, r, dst.rank, dst.index + k)
                                   : (r.rank == dst.rank && r.buf == dst.buf && r.index <= dst.index + k &&
                                      dst.index + k < r.index + r.count))
          return true;
  return false;
}

}  // namespace

ir::Schedule stage_remote(ir::Schedule s) {
  std::vector<Op> out;
  out.reserve(s.ops.size() * 2);
  int32_t next_id = s.next_id();
  // Slots are numbered per rank, in that rank's order of need, so symmetric
  // schedules stay symmetric (codegen shares one code path across ranks).
  std::vector<int32_t> next_slot(s.nranks, s.scratch);
  std::vector<Op> pending;  // deferred staging writes
  auto flush_for = [&](const Op& op) {
    for (size_t i = 0; i < pending.size();) {
      if (touches_any(s, op, pending[i].dsts[0])) {
        out.push_back(std::move(pending[i]));
        pending.erase(pending.begin() + std::ptrdiff_t(i));
      } else {
        ++i;
      }
    }
  };
  for (Op& op : s.ops) {
    flush_for(op);
    if (!op.is_data()) {
      out.push_back(std::move(op));
      continue;
    }
    // A new scratch slot on the buffer's owner, and the owner's copy between
    // it and the user buffer.
    auto stage = [&](Ref& r, bool into_scratch) {
      Ref slot{r.rank, Buf::scratch, next_slot[r.rank], r.count};
      next_slot[r.rank] += r.count;
      Op c;
      c.id = next_id++;
      c.kind = OpKind::copy;
      c.rank = r.rank;
      c.srcs = {into_scratch ? r : slot};
      c.dsts = {into_scratch ? slot : r};
      c.loc = op.loc;
      r = slot;
      return c;
    };
    std::vector<Op> after;
    for (Ref& r : op.srcs)
      if (r.buf != Buf::scratch && r.rank != op.rank) out.push_back(stage(r, true));
    for (Ref& r : op.dsts)
      if (r.buf != Buf::scratch && r.rank != op.rank) after.push_back(stage(r, false));
    out.push_back(std::move(op));
    for (auto& a : after) pending.push_back(std::move(a));
  }
  for (auto& a : pending) out.push_back(std::move(a));
  s.ops = std::move(out);
  for (int32_t n : next_slot) s.scratch = std::max(s.scratch, n);
  s.staged = true;
  return s;
}

}  // namespace mk::passes
