// The network model the verifier proves puts and flushes in: a schedule with
// network operations is rewritten into one of plain copies, signals and waits
// on extra thread blocks, whose every interleaving is a behaviour the network
// allows, and proved (verify_sync) and simulated (the executor) as such.
//
// A connection is (rank A, thread block t, peer B): the puts and signals t
// sends B arrive in order (GIN's put + signal on one context, MSCCL++'s port
// channel put then signal); nothing orders two connections. Each connection
// becomes two thread blocks of A, after A's own: one reads sources (the NIC's
// reads), one delivers (the data's arrival at B). A put P = put A.x -> B.sc[s]
// on A.t becomes
//
//   A.t:      signal A slot i                      issue
//   reader:   [wait f iter -depth]                 the wire slot is free again
//             wait i; copy A.x -> A.w              the source read (w: a wire
//             signal A slot r                      slot of A's scratch, P's own)
//             [signal A slot c]                    for the flush that completes P
//   deliver:  wait r; copy A.w -> B.sc[s]          delivery, in order
//             signal A slot f                      (the wire credit)
//
// A signal S from A.t to B on another node becomes `signal A slot v` on A.t,
// then `wait v; signal B (S's slot)` on the deliver block: it arrives after
// the data of every earlier put on that connection, and B's wait pairs with
// it. A flush F on A.t becomes a wait, on A.t, for the read of every put it
// completes: it says nothing about their delivery. Nothing else orders a read
// or a delivery (program order after a put on A.t does not), so a source
// written again before its flush, or a slot read before its put's signal, is
// a race (mk.verify.E004); a dropped signal leaves a wait unpaired (E011);
// credits are the reuse waits insert_sync adds (a slot's reader signals back
// before the sender puts into it again). A put with no flush after it on its
// thread block is refused outright (E004): the kernel could return while the
// network still reads the caller's buffer.
#include <fmt/format.h>

#include <map>
#include <mutex>

#include "compiler/verify/hb.hpp"
#include "compiler/verify/verify.hpp"

namespace mk::verify {

using ir::Buf;
using ir::Op;
using ir::OpKind;
using ir::Ref;

bool has_network_ops(const ir::Schedule& s) {
  for (const Op& op : s.ops)
    if (op.kind == OpKind::put || op.kind == OpKind::flush) return true;
  return false;
}

ir::Schedule network_model(const ir::Schedule& s) { return network_model(ir::Schedule(s), nullptr); }

ir::Schedule network_model(ir::Schedule&& s, NetworkRestore* restore) {
  const topology::Topology t = ir::topology_of(s);
  const int32_t tbs = std::max<int32_t>(1, s.tbs);
  // The flush that completes each put: the next one on its thread block.
  std::vector<int64_t> completes(s.ops.size(), -1);
  {
    std::map<std::pair<int32_t, int32_t>, std::vector<size_t>> open;  // (rank, tb) -> puts since the last flush
    for (size_t i = 0; i < s.ops.size(); ++i) {
      const Op& op = s.ops[i];
      auto& v = open[{op.rank, op.tb}];
      if (op.kind == OpKind::put) v.push_back(i);
      if (op.kind == OpKind::flush) {
        for (size_t p : v) completes[p] = int64_t(i);
        v.clear();
      }
    }
    for (const auto& [lane, puts] : open)
      if (!puts.empty())
        throw Error(ErrId::verify_E004,
                    fmt::format("{} ({} ranks): {} has no flush after it on its thread block: the kernel could "
                                "return while the network still reads its source {}",
                                s.name.empty() ? std::string(name(s.coll)) : s.name, s.nranks,
                                describe_op(s, puts.front()), ir::to_string(s.ops[puts.front()].srcs[0])),
                    s.ops[puts.front()].loc, "every put needs a later flush on its thread block (insert_flush adds them)");
  }
  // The model's ops, counted first (at 1024 ranks a copy of the schedule's
  // ops, or a reserve of twice as many, was a few hundred MB on the peak).
  size_t nops = 0;
  for (size_t i = 0; i < s.ops.size(); ++i) {
    const Op& op = s.ops[i];
    if (op.kind == OpKind::put)
      nops += 8 + (completes[i] >= 0 ? 2 : 0);  // its issue, read, delivery, their sync; the flush's wait
    else if (op.kind == OpKind::signal && op.peer != op.rank && t.link(op.rank, op.peer) == topology::Link::net)
      nops += 3;
    else if (op.kind != OpKind::flush)
      nops += 1;
  }
  int32_t next_id = s.next_id();
  std::vector<Op> ops;  // the schedule's, moved into the model one by one
  ops.swap(s.ops);
  ir::Schedule m = s;  // every other field
  m.ops.reserve(nops);
  std::vector<int32_t> next_slot(size_t(s.nranks), s.slots), next_wire(size_t(s.nranks), s.scratch),
      next_tb(size_t(s.nranks), tbs);
  struct Conn {
    int32_t reader = 0, deliver = 0;
  };
  std::map<std::tuple<int32_t, int32_t, int32_t>, Conn> conns;  // (rank, tb, peer) -> its thread blocks
  std::map<size_t, std::vector<int32_t>> reads_done;             // flush index -> slots of its puts' reads
  auto conn = [&](int32_t rank, int32_t tb, int32_t peer) {
    auto [it, fresh] = conns.try_emplace({rank, tb, peer});
    if (fresh) {
      it->second.reader = next_tb[size_t(rank)]++;
      it->second.deliver = next_tb[size_t(rank)]++;
    }
    return it->second;
  };
  auto slot = [&](int32_t rank) { return next_slot[size_t(rank)]++; };
  auto emit = [&](OpKind k, int32_t rank, int32_t tb, const ir::Loc& loc) -> Op& {
    Op o;
    o.id = next_id++;
    o.kind = k;
    o.rank = rank;
    o.tb = tb;
    o.loc = loc;
    m.ops.push_back(std::move(o));
    return m.ops.back();
  };
  auto signal = [&](int32_t rank, int32_t tb, int32_t peer, int32_t sl, const ir::Loc& loc) {
    Op& o = emit(OpKind::signal, rank, tb, loc);
    o.peer = peer;
    o.slot = sl;
  };
  auto wait = [&](int32_t rank, int32_t tb, int32_t sl, int32_t iter, const ir::Loc& loc) {
    Op& o = emit(OpKind::wait, rank, tb, loc);
    o.slot = sl;
    o.iter = iter;
  };
  if (restore) {
    restore->first_new = next_id;
    restore->scratch = s.scratch;
    restore->slots = s.slots;
    restore->tbs = s.tbs;
    restore->topology = s.topology;
    restore->ops.clear();
  }
  // An op the model replaces, kept for restore_from_model with the place its
  // expansion starts at.
  auto replaced = [&](size_t i, size_t at) {
    if (restore) restore->ops.emplace_back(at, std::move(ops[i]));
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    const size_t at = m.ops.size();
    if (op.kind == OpKind::put) {
      const int32_t a = op.rank;
      const Conn c = conn(a, op.tb, op.dsts[0].rank);
      const int32_t issue = slot(a), read = slot(a), freed = slot(a);
      signal(a, op.tb, a, issue, op.loc);
      const Ref wire{a, Buf::scratch, next_wire[size_t(a)], op.srcs[0].count};
      next_wire[size_t(a)] += wire.count;
      wait(a, c.reader, freed, -s.depth, op.loc);  // the delivery `depth` steps back has read the wire slot
      wait(a, c.reader, issue, 0, op.loc);
      Op& r = emit(OpKind::copy, a, c.reader, op.loc);
      r.srcs = op.srcs;
      r.dsts = {wire};
      r.pos = op.pos;
      signal(a, c.reader, a, read, op.loc);
      if (completes[i] >= 0) {
        const int32_t done = slot(a);
        signal(a, c.reader, a, done, op.loc);
        reads_done[size_t(completes[i])].push_back(done);
      }
      wait(a, c.deliver, read, 0, op.loc);
      Op& d = emit(OpKind::copy, a, c.deliver, op.loc);
      d.srcs = {wire};
      d.dsts = op.dsts;
      d.pos = op.pos;
      signal(a, c.deliver, a, freed, op.loc);
      replaced(i, at);
      continue;
    }
    if (op.kind == OpKind::flush) {
      for (int32_t sl : reads_done[i]) wait(op.rank, op.tb, sl, 0, op.loc);
      replaced(i, at);
      continue;
    }
    if (op.kind == OpKind::signal && op.peer != op.rank && t.link(op.rank, op.peer) == topology::Link::net) {
      const Conn c = conn(op.rank, op.tb, op.peer);
      const int32_t issue = slot(op.rank);
      signal(op.rank, op.tb, op.rank, issue, op.loc);
      wait(op.rank, c.deliver, issue, 0, op.loc);
      signal(op.rank, c.deliver, op.peer, op.slot, op.loc);
      replaced(i, at);
      continue;
    }
    m.ops.push_back(std::move(ops[i]));
  }
  std::vector<Op>().swap(ops);
  for (int32_t n : next_slot) m.slots = std::max(m.slots, n);
  for (int32_t n : next_wire) m.scratch = std::max(m.scratch, n);
  for (int32_t n : next_tb) m.tbs = std::max(m.tbs, n);
  // Its deliveries are stores across nodes that stand for the network:
  // verify_links checked the schedule itself; the model is the same shape
  // with every pair linked (so rank symmetry still finds its candidates:
  // rotation by a node and within one).
  if (m.topology) m.topology->direct = true;
  return m;
}


ir::Schedule restore_from_model(ir::Schedule&& m, NetworkRestore&& r) {
  std::vector<Op> ops;
  size_t n = r.ops.size();
  for (const Op& op : m.ops) n += op.id < r.first_new;
  ops.reserve(n);
  size_t k = 0;
  for (size_t i = 0; i < m.ops.size(); ++i) {
    for (; k < r.ops.size() && r.ops[k].first == i; ++k) ops.push_back(std::move(r.ops[k].second));
    if (m.ops[i].id < r.first_new) ops.push_back(std::move(m.ops[i]));
  }
  for (; k < r.ops.size(); ++k) ops.push_back(std::move(r.ops[k].second));
  m.ops = std::move(ops);
  m.scratch = r.scratch;
  m.slots = r.slots;
  m.tbs = r.tbs;
  m.topology = std::move(r.topology);
  return std::move(m);
}

void verify_sync_network(ir::Schedule& s, size_t clock_budget, SymMode mode) {
  verify_bounds(s);
  verify_links(s);  // what crosses nodes (the model takes it as given)
  // Large models one at a time (the buckets are proved side by side): at
  // 1024 ranks two at once passed 2 GB.
  static std::mutex big;
  std::unique_lock<std::mutex> one(big, std::defer_lock);
  if (s.ops.size() > 100000) one.lock();
  NetworkRestore r;
  ir::Schedule m = network_model(std::move(s), &r);
  try {
    verify_sync_budget(m, clock_budget, mode, {});
  } catch (...) {
    s = restore_from_model(std::move(m), std::move(r));
    throw;
  }
  s = restore_from_model(std::move(m), std::move(r));
}

}  // namespace mk::verify
