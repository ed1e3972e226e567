// insert_flush: local completion of puts before their sources are reused.
//
// A put reads its source some time after it is issued, until the thread
// block's next flush (ir/ops.def). Program order after a put orders nothing
// about that read, so a thread block with puts not yet flushed gets a flush
//   - before an op of its own that writes a chunk one of them reads (either
//     aliasing: an input chunk and the output chunk it aliases in-place are
//     one chunk),
//   - before a signal, unless the signal goes to another node on the same
//     connection as every one of them (it then arrives after their data, so
//     after their reads: whoever it orders is ordered after those reads);
//     any other signal may tell another thread block or rank that it may now
//     write a source,
//   - at the end of its program (the next step, or launch, may write them).
// Needs: synced schedule (insert_sync ran). Guarantees: the data ops and their
// order are unchanged; verify_sync proves the result under the network model
// (verify/network.cpp), which also catches a flush this pass left out.
#include <algorithm>
#include <set>

#include "compiler/passes/passes.hpp"
#include "compiler/verify/hb.hpp"

namespace mk::passes {

using ir::Op;
using ir::OpKind;
using ir::Ref;

ir::Schedule insert_flush(ir::Schedule s) {
  size_t puts = 0;
  for (const Op& op : s.ops) puts += op.kind == OpKind::put;
  if (puts == 0) return s;
  const topology::Topology t = ir::topology_of(s);
  struct Lane {
    // chunks unflushed puts read, keyed in-place (an input chunk and the
    // output chunk it aliases are one key): conflicts of both aliasings
    std::set<verify::LocKey> sources;
    std::set<int32_t> peers;    // their destination ranks
    ir::Loc loc;                // the last unflushed put's
    bool open() const { return !peers.empty(); }
  };
  const int32_t tbs = std::max<int32_t>(1, s.tbs);
  std::vector<Lane> lanes(size_t(s.nranks) * size_t(tbs));
  std::vector<size_t> last(lanes.size(), SIZE_MAX);  // each lane's last op
  auto lane_of = [&](const Op& op) { return size_t(op.rank) * size_t(tbs) + size_t(std::max(0, op.tb)); };
  for (size_t i = 0; i < s.ops.size(); ++i) last[lane_of(s.ops[i])] = i;
  int32_t next_id = s.next_id();
  // A flush closes a lane that an earlier put opened: at most one per put,
  // so this is enough and never reallocates (at 1024 ranks the schedule is
  // hundreds of MB: a growing or shrinking copy beside the input was the
  // proof's peak memory).
  std::vector<Op> out;
  out.reserve(s.ops.size() + puts);
  auto flush = [&](int32_t rank, int32_t tb, Lane& l) {
    Op f;
    f.id = next_id++;
    f.kind = OpKind::flush;
    f.rank = rank;
    f.tb = tb;
    f.loc = l.loc;
    out.push_back(std::move(f));
    l = Lane{};
  };
  for (size_t i = 0; i < s.ops.size(); ++i) {
    Op& op = s.ops[i];
    Lane& l = lanes[lane_of(op)];
    if (l.open()) {
      bool need = false;
      if (op.is_data())
        for (const Ref& d : op.dsts)
          if (d.rank == op.rank)
            for (int32_t k = 0; k < d.count && !need; ++k) need = l.sources.count(verify::loc_key(s, d.at(k), true));
      if (op.kind == OpKind::signal) {
        const bool far = op.peer != op.rank && t.link(op.rank, op.peer) == topology::Link::net;
        need = !far || l.peers.size() != 1 || *l.peers.begin() != op.peer;
      }
      if (need) flush(op.rank, op.tb, l);
    }
    if (op.kind == OpKind::put) {
      const Ref& src = op.srcs[0];
      for (int32_t k = 0; k < src.count; ++k) l.sources.insert(verify::loc_key(s, src.at(k), true));
      l.peers.insert(op.dsts[0].rank);
      l.loc = op.loc;
    }
    const bool end = last[lane_of(op)] == i;
    const int32_t rank = op.rank, tb = op.tb;
    out.push_back(std::move(op));
    if (end && l.open()) flush(rank, tb, l);
  }
  s.ops = std::move(out);  // (the input's ops go now)
  return s;
}

}  // namespace mk::passes
