// insert_sync: derive every cross-thread-block and cross-rank dependency and
// realise it as a signal/wait pair. Authors never write synchronisation.
//
// Within a step, op j must follow op i when both touch the same chunk and one
// writes it (RAW, WAR, WAW; an input chunk and the output chunk it aliases
// in-place count as one chunk, so one plan serves both modes). Program order
// inside a thread block already orders ops of one block. For the rest, a
// signal after i and a wait before j, unless i already happens before j
// through edges added so far (checked with a bitset closure, taking the
// latest dependency first so the nearest edge implies the older ones).
//
// Across steps, scratch is reused `depth` steps later: every access of a
// scratch slot at step g must happen before each write of it at g + depth.
// Where program order and existing edges do not already give that, a wait
// with iter = -depth ("the signal of depth steps ago") is added.
//
// LL: a RAW through an LL scratch slot is carried by the data's own flags; it
// gets no edge (and gives no ordering to anything else).
//
// Flag slots are numbered per receiving rank in that rank's program order (so
// symmetric schedules stay symmetric); one signal serves every waiter on the
// receiving rank. Values are step numbers: monotonic across steps and launches
// (the kernel keeps a per-block step counter in device memory), which makes
// repeated launches and CUDA graph replays safe without resetting flags.
//
// Needs: thread blocks assigned, protocol chosen, no sync ops yet.
// Guarantees: verify_sync holds; s.slots set; s.synced.
#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "compiler/passes/passes.hpp"
#include "compiler/verify/bitset.hpp"
#include "compiler/verify/hb.hpp"

namespace mk::passes {

using ir::Op;
using ir::OpKind;

ir::Schedule insert_sync(ir::Schedule s) {
  MK_CHECK(!s.synced, "insert_sync ran twice");
  const size_t n = s.ops.size();
  for (const Op& op : s.ops) MK_CHECK(op.tb >= 0, "insert_sync needs thread blocks assigned");
  for (const Op& op : s.ops)
    MK_CHECK(op.kind != OpKind::signal && op.kind != OpKind::wait, "schedule already has sync ops");

  std::vector<int32_t> di(n, -1);  // dense data index
  size_t nd = 0;
  for (size_t i = 0; i < n; ++i)
    if (s.ops[i].is_data()) di[i] = int32_t(nd++);

  // Thread-block neighbours in program order.
  std::vector<int64_t> prev_in_tb(n, -1), last_of_tb_if_first(n, -1);
  std::vector<int32_t> local_index(n, 0);  // index in its thread block's program
  {
    std::map<std::pair<int32_t, int32_t>, std::vector<size_t>> by_tb;
    for (size_t i = 0; i < n; ++i) {
      if (!s.ops[i].is_data()) continue;
      auto& list = by_tb[{s.ops[i].rank, s.ops[i].tb}];
      local_index[i] = int32_t(list.size());
      list.push_back(i);
    }
    for (auto& [k, list] : by_tb) {
      for (size_t t = 1; t < list.size(); ++t) prev_in_tb[list[t]] = int64_t(list[t - 1]);
      last_of_tb_if_first[list.front()] = int64_t(list.back());
    }
  }

  // Required dependencies (within a step), from chunk accesses, in both
  // aliasing modes (one plan serves in-place and out-of-place calls).
  const bool ll = s.proto == ir::Proto::ll;
  std::vector<std::set<size_t>> deps(n);
  for (bool inplace : {false, true}) {
    for (const auto& [key, list] : verify::accesses(s, inplace)) {
      int64_t last_write = -1;
      std::vector<size_t> reads;
      for (const auto& a : list) {
        if (a.write) {
          if (last_write >= 0) deps[a.op].insert(size_t(last_write));
          for (size_t r : reads)
            if (r != a.op) deps[a.op].insert(r);
          last_write = int64_t(a.op);
          reads.clear();
        } else {
          bool in_band = ll && key.space == 2;
          if (last_write >= 0 && size_t(last_write) != a.op && !in_band)
            deps[a.op].insert(size_t(last_write));
          reads.push_back(a.op);
        }
      }
    }
  }
  const auto acc = verify::accesses(s, false);  // scratch is the same in both modes

  // Edges: (from, to, iter).
  struct Edge {
    size_t from, to;
    int32_t iter;
  };
  std::vector<Edge> edges;
  std::vector<std::vector<size_t>> within_in(n);
  verify::BitRows C(n, nd);
  auto absorb = [&](verify::BitRows& rows, size_t v, size_t src) {
    rows.or_from(v, C, src);
    rows.set(v, size_t(di[src]));
  };
  for (size_t j = 0; j < n; ++j) {
    if (di[j] < 0) continue;
    if (prev_in_tb[j] >= 0) absorb(C, j, size_t(prev_in_tb[j]));
    std::vector<size_t> need(deps[j].begin(), deps[j].end());
    std::sort(need.rbegin(), need.rend());
    for (size_t i : need) {
      if (C.test(j, size_t(di[i]))) continue;
      MK_CHECK(!(s.ops[i].rank == s.ops[j].rank && s.ops[i].tb == s.ops[j].tb),
               "program order should imply same-block dependencies");
      edges.push_back({i, j, 0});
      within_in[j].push_back(i);
      absorb(C, j, i);
    }
  }

  // Scratch reuse across steps.
  std::map<size_t, std::vector<size_t>> scratch_accesses_by_writer;  // writer -> accesses of its slots
  for (const auto& [key, list] : acc) {
    if (key.space != 2) continue;
    for (const auto& w : list) {
      if (!w.write) continue;
      auto& v = scratch_accesses_by_writer[w.op];
      for (const auto& a : list) v.push_back(a.op);
    }
  }
  verify::BitRows R(n, nd);
  for (size_t j = 0; j < n; ++j) {
    if (di[j] < 0) continue;
    if (prev_in_tb[j] >= 0) R.or_into(j, size_t(prev_in_tb[j]));
    for (size_t i : within_in[j]) R.or_into(j, i);
    if (last_of_tb_if_first[j] >= 0) absorb(R, j, size_t(last_of_tb_if_first[j]));
    auto it = scratch_accesses_by_writer.find(j);
    if (it == scratch_accesses_by_writer.end()) continue;
    std::vector<size_t> need = it->second;
    std::sort(need.begin(), need.end());
    need.erase(std::unique(need.begin(), need.end()), need.end());
    std::sort(need.rbegin(), need.rend());
    for (size_t a : need) {
      if (R.test(j, size_t(di[a]))) continue;
      edges.push_back({a, j, -s.depth});
      absorb(R, j, a);
    }
  }

  // Slots: per receiving rank, ordered by where the first waiting op sits
  // (its thread block, its place there), then the signaller's relative rank,
  // thread block and place. Keys are thread-block-local and rank-relative, so
  // symmetric schedules get the same numbering on every rank.
  std::map<std::pair<size_t, int32_t>, int32_t> slot_of;  // (signaller, receiving rank) -> slot
  {
    using Key = std::tuple<int32_t, int32_t, int32_t, int32_t, int32_t>;
    std::map<std::pair<size_t, int32_t>, Key> wants;
    for (const Edge& e : edges) {
      int32_t rr = s.ops[e.to].rank;
      auto key = std::make_pair(e.from, rr);
      Key k{s.ops[e.to].tb, local_index[e.to], (s.ops[e.from].rank - rr + s.nranks) % s.nranks, s.ops[e.from].tb,
            local_index[e.from]};
      auto it = wants.find(key);
      if (it == wants.end())
        wants.emplace(key, k);
      else
        it->second = std::min(it->second, k);
    }
    std::vector<std::vector<std::pair<Key, std::pair<size_t, int32_t>>>> per_rank(s.nranks);
    for (auto& [key, k] : wants) per_rank[key.second].push_back({k, key});
    s.slots = 0;
    for (auto& list : per_rank) {
      std::sort(list.begin(), list.end());
      for (size_t k = 0; k < list.size(); ++k) slot_of[list[k].second] = int32_t(k);
      s.slots = std::max<int32_t>(s.slots, int32_t(list.size()));
    }
  }

  // Emit: waits before their op (one per slot, the strictest iter), the op,
  // then one signal per receiving rank.
  std::vector<std::map<int32_t, int32_t>> waits_of(n);  // op -> slot -> iter
  std::vector<std::set<int32_t>> signal_ranks(n);
  for (const Edge& e : edges) {
    int32_t rr = s.ops[e.to].rank;
    int32_t slot = slot_of.at({e.from, rr});
    auto [it, fresh] = waits_of[e.to].emplace(slot, e.iter);
    if (!fresh) it->second = std::max(it->second, e.iter);
    signal_ranks[e.from].insert(rr);
  }
  int32_t next_id = s.next_id();
  std::vector<Op> out;
  out.reserve(n + 2 * edges.size());
  for (size_t j = 0; j < n; ++j) {
    const Op& op = s.ops[j];
    for (auto [slot, iter] : waits_of[j]) {
      Op w;
      w.id = next_id++;
      w.kind = OpKind::wait;
      w.rank = op.rank;
      w.tb = op.tb;
      w.slot = slot;
      w.iter = iter;
      w.loc = op.loc;
      out.push_back(std::move(w));
    }
    out.push_back(op);
    // signal ranks ordered relative to the signaller, for symmetry
    std::vector<int32_t> targets(signal_ranks[j].begin(), signal_ranks[j].end());
    std::sort(targets.begin(), targets.end(), [&](int32_t a, int32_t b) {
      return (a - op.rank + s.nranks) % s.nranks < (b - op.rank + s.nranks) % s.nranks;
    });
    for (int32_t rr : targets) {
      Op g;
      g.id = next_id++;
      g.kind = OpKind::signal;
      g.rank = op.rank;
      g.tb = op.tb;
      g.peer = rr;
      g.slot = slot_of.at({j, rr});
      g.loc = op.loc;
      out.push_back(std::move(g));
    }
  }
  s.ops = std::move(out);
  s.synced = true;
  return s;
}

}  // namespace mk::passes
