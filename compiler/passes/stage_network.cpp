// stage_network: turn every transfer between nodes into puts.
//
// Between nodes there are no loads and stores, only the network. After
// stage_remote, an op touches another rank's memory only through scratch;
// here every such access across nodes (topology link `net`) becomes a put
// (ir/ops.def), issued by the rank whose memory is read:
//
//   push   op on E writes R.sc[s] (R on another node)
//            copy with one destination:  the copy becomes `put E.x -> R.sc[s]`
//            otherwise:                  the op writes E.sc[new] instead, and
//                                        `put E.sc[new] -> R.sc[s]` follows it
//   pull   op on E reads R.sc[s] (R on another node)
//            `put R.sc[s] -> E.sc[new]` (issued by R) comes right before it,
//            and the op reads E.sc[new]
//
// Needs: staged (or zero-copy) schedule with a topology. Guarantees: same
// meaning (a put is a copy); every data op that is not a put touches memory of
// its executing rank's node only, except a zero-copy plan's peers' user
// buffers (verify_links refuses those across nodes, mk.verify.E017); each new
// slot is new. New slots are numbered per rank in that rank's order of need,
// so symmetric schedules stay symmetric. insert_sync orders puts like copies;
// insert_flush adds the local completions sources need.
#include <algorithm>

#include "compiler/passes/passes.hpp"

namespace mk::passes {

using ir::Buf;
using ir::Op;
using ir::OpKind;
using ir::Ref;

ir::Schedule stage_network(ir::Schedule s) {
  if (!s.topology) return s;
  const topology::Topology t = *s.topology;
  // A reference of `op` this pass turns into a put: a peer's scratch on another node.
  auto crosses = [&](const Op& op, const Ref& r) {
    return r.buf == Buf::scratch && r.rank != op.rank && t.link(op.rank, r.rank) == topology::Link::net;
  };
  // A copy to one such place becomes the put itself.
  auto becomes_put = [&](const Op& op) {
    return op.kind == OpKind::copy && op.dsts.size() == 1 && crosses(op, op.dsts[0]);
  };
  // The puts this adds, exactly as the loop below makes them (so that the
  // new op list is allocated once: at 1024 ranks the schedule is hundreds of
  // MB, and a growing or shrinking copy beside the input was the peak).
  size_t added = 0;
  bool any = false;
  for (const Op& op : s.ops) {
    if (!op.is_data() || op.kind == OpKind::put) continue;
    for (const Ref& r : op.srcs) added += crosses(op, r);
    if (becomes_put(op)) {
      any = true;
      continue;
    }
    for (const Ref& r : op.dsts) added += crosses(op, r);
  }
  if (added == 0 && !any) return s;
  std::vector<Op> out;
  out.reserve(s.ops.size() + added);
  int32_t next_id = s.next_id();
  std::vector<int32_t> next_slot(size_t(s.nranks), s.scratch);
  auto slot_on = [&](int32_t rank, int32_t count) {
    Ref r{rank, Buf::scratch, next_slot[size_t(rank)], count};
    next_slot[size_t(rank)] += count;
    return r;
  };
  auto put = [&](const Ref& src, const Ref& dst, const ir::Loc& loc) {
    Op p;
    p.id = next_id++;
    p.kind = OpKind::put;
    p.rank = src.rank;
    p.srcs = {src};
    p.dsts = {dst};
    p.loc = loc;
    return p;
  };
  for (Op& op : s.ops) {
    if (!op.is_data() || op.kind == OpKind::put) {  // an IR file's own puts stay (verify_links checks them)
      out.push_back(std::move(op));
      continue;
    }
    for (Ref& r : op.srcs)
      if (crosses(op, r)) {
        const Ref local = slot_on(op.rank, r.count);
        out.push_back(put(r, local, op.loc));
        r = local;
      }
    if (becomes_put(op)) {
      op.kind = OpKind::put;
      out.push_back(std::move(op));
      continue;
    }
    std::vector<Op> after;
    for (Ref& r : op.dsts)
      if (crosses(op, r)) {
        const Ref local = slot_on(op.rank, r.count);
        after.push_back(put(local, r, op.loc));
        r = local;
      }
    out.push_back(std::move(op));
    for (Op& a : after) out.push_back(std::move(a));
  }
  s.ops = std::move(out);  // (the input's ops go now)
  for (int32_t n : next_slot) s.scratch = std::max(s.scratch, n);
  return s;
}

}  // namespace mk::passes
