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
// Needs: a verified schedule. Guarantees: same meaning (program order is kept:
// staging copies sit right before / after the op they serve); every data op
// touches user buffers of its executing rank only; each staging slot is new
// (no reuse, so staging adds no ordering between unrelated transfers).
#include <algorithm>

#include "compiler/passes/passes.hpp"

namespace mk::passes {

using ir::Buf;
using ir::Op;
using ir::OpKind;
using ir::Ref;

ir::Schedule stage_remote(ir::Schedule s) {
  std::vector<Op> out;
  out.reserve(s.ops.size() * 2);
  int32_t next_id = s.next_id();
  // Slots are numbered per rank, in that rank's order of need, so symmetric
  // schedules stay symmetric (codegen shares one code path across ranks).
  std::vector<int32_t> next_slot(s.nranks, s.scratch);
  for (Op& op : s.ops) {
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
    for (auto& a : after) out.push_back(std::move(a));
  }
  s.ops = std::move(out);
  for (int32_t n : next_slot) s.scratch = std::max(s.scratch, n);
  s.staged = true;
  return s;
}

}  // namespace mk::passes
