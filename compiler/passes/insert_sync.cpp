// insert_sync: derive every cross-thread-block and cross-rank dependency and
// realise it as a signal/wait pair. Authors never write synchronisation.
//
// Within a step, op j must follow op i when both touch the same chunk and one
// writes it (RAW, WAR, WAW; an input chunk and the output chunk it aliases
// in-place count as one chunk, so one plan serves both modes). Program order
// inside a thread block already orders ops of one block. For the rest, a
// signal after i and a wait before j, unless i already happens before j
// through edges added so far (taking the latest dependency first so the
// nearest edge implies the older ones; vector clocks over thread blocks in
// bounded memory answer "already happens before", see sync_edges).
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
#include <functional>
#include <map>
#include <set>
#include <tuple>

#include "compiler/common/key_order.hpp"
#include "compiler/passes/passes.hpp"
#include "compiler/verify/clocks.hpp"
#include "compiler/verify/hb.hpp"

namespace mk::passes {

using ir::Op;
using ir::OpKind;

namespace {

// The edges, from clocks over the data ops' chains (thread blocks): step g
// first (clocks of step-g positions, own included; dependencies decided
// against them), then step g + depth (clocks that hold step-g positions: what
// of step g happens before this op depth steps later; scratch reuse decided
// against them). The chain's running clock carries over between the two: step
// g's whole chain precedes the chain at g + depth.
template <class T>
void decide(const ir::Schedule& s, const std::vector<int32_t>& chain, const std::vector<int32_t>& pos,
            size_t nchains, const OpLists& dep, const OpLists& need,
            size_t budget, std::vector<SyncEdge>& edges) {
  const size_t n = s.ops.size();
  // Reads of each op's step-g clock (as a dependency, and as a reuse
  // candidate) and of its step-(g + depth) clock (as a dependency).
  std::vector<int32_t> uses_now(n, 0), uses_later(n, 0);
  for (size_t j = 0; j < n; ++j) {
    for (size_t i : dep[j]) ++uses_now[i], ++uses_later[i];
    for (size_t a : need[j]) ++uses_now[a];
  }
  verify::for_each_chain_block<T>(nchains, budget, [&](verify::ClockPool<T>& pool) {
    std::vector<int32_t> now(n, -1), later(n, -1);
    for (size_t j = 0; j < n; ++j) {
      if (chain[j] < 0) continue;
      T* clock = pool.running(size_t(chain[j]));
      for (size_t i : dep[j]) {
        const size_t c = size_t(chain[i]);
        if (pool.covers(c) && pool.has(clock, c, T(pos[i]))) {
          pool.drop(now[i]);  // already before j: its clock adds nothing
          continue;
        }
        if (pool.covers(c)) edges.push_back({i, j, 0});
        pool.join_from(clock, now[i]);
      }
      pool.set_own(clock, size_t(chain[j]), T(pos[j]));
      if (uses_now[j] > 0) now[j] = pool.snapshot(clock, uses_now[j]);
    }
    for (size_t j = 0; j < n; ++j) {
      if (chain[j] < 0) continue;
      T* clock = pool.running(size_t(chain[j]));
      for (size_t i : dep[j]) pool.join_from(clock, later[i]);
      for (size_t a : need[j]) {
        const size_t c = size_t(chain[a]);
        if (pool.covers(c) && pool.has(clock, c, T(pos[a]))) {
          pool.drop(now[a]);
          continue;
        }
        if (pool.covers(c)) edges.push_back({a, j, -s.depth});
        pool.join_from(clock, now[a]);
      }
      if (uses_later[j] > 0) later[j] = pool.snapshot(clock, uses_later[j]);
    }
  });
}

// decide, by symmetry (verify/symmetry.hpp): when the dependency graph maps
// onto itself under a group of rank permutations, the decisions are made for
// the ops of one representative rank per class, against clocks read through
// the permutation, and each edge is copied to every rank of its class. The
// edges are the same: "already before" does not depend on the order in which
// one op's dependencies are taken, as long as it is latest first along
// happens-before, which every symmetry preserves. false when it does not apply
// (trivial symmetry, clocks over the budget); `edges` is then untouched.
template <class T>
bool decide_sym(const ir::Schedule& s, const verify::Chains& c, const OpLists& dep, const OpLists& need,
                size_t budget, std::vector<SyncEdge>& edges,
                verify::RankSymmetry* found) {
  const size_t n = s.ops.size();
  const verify::ChainIndex ci(s, c.chain, c.pos, c.count);
  auto same = [&](size_t u, size_t v) { return s.ops[u].kind == s.ops[v].kind; };
  auto edge_list = [&](size_t v, std::vector<std::pair<int64_t, int32_t>>& out) {
    for (size_t i : dep[v]) out.push_back({int64_t(i), 0});
    for (size_t a : need[v]) out.push_back({int64_t(a), 1});
  };
  verify::RankSymmetry local;
  verify::RankSymmetry& sym = found ? *found : local;
  sym = verify::SymmetryFinder::find(s, ci, same, edge_list);
  if (sym.trivial()) return false;
  const verify::Representatives reps(s, ci, sym);
  std::vector<int64_t> snap_slot(n, -1);
  size_t slots = reps.runs();
  for (uint32_t v : reps.ops()) {
    snap_slot[v] = int64_t(slots);
    slots += 2;  // clocks at step g and at step g + depth
  }
  const size_t w = (c.count + 15) / 16 * 16;
  if (slots * w * sizeof(T) > budget) return false;
  // Along program order and the dependencies' representatives.
  const std::vector<uint32_t> order = reps.order([&](size_t v, auto&& edge) {
    for (size_t i : dep[v]) edge(reps.rho(i));
  });
  MK_CHECK(!order.empty() || reps.ops().empty(), "insert_sync: the dependencies have a cycle");
  std::vector<T> store(slots * w, T(0));
  auto slot = [&](int64_t k) { return store.data() + size_t(k) * w; };
  // A representative's own clock is in the schedule's coordinates.
  auto sees = [&](const T* clock, size_t i) { return clock[size_t(c.chain[i])] >= T(c.pos[i]); };
  std::vector<SyncEdge> mine;  // for the representatives
  for (uint32_t j : order) {
    T* run = slot(reps.run_slot(size_t(c.chain[j])));
    for (size_t i : dep[j]) {
      if (sees(run, i)) continue;
      mine.push_back({i, j, 0});
      verify::join_permuted(run, slot(snap_slot[reps.rho(i)]), ci, sym, s.ops[i].rank);
    }
    run[size_t(c.chain[j])] = T(c.pos[j]);
    std::copy_n(run, w, slot(snap_slot[j]));
  }
  for (uint32_t j : order) {
    T* run = slot(reps.run_slot(size_t(c.chain[j])));
    for (size_t i : dep[j]) verify::join_permuted(run, slot(snap_slot[reps.rho(i)] + 1), ci, sym, s.ops[i].rank);
    for (size_t a : need[j]) {
      if (sees(run, a)) continue;
      mine.push_back({a, j, -s.depth});
      verify::join_permuted(run, slot(snap_slot[reps.rho(a)]), ci, sym, s.ops[a].rank);
    }
    std::copy_n(run, w, slot(snap_slot[j] + 1));
  }
  // Every rank's edges: g_r of its representative's.
  for (const SyncEdge& e : mine) {
    for (int32_t r : sym.members(s.ops[e.to].rank)) {
      const int32_t* g = sym.to(r);
      const int64_t from = ci.image(e.from, g), to = ci.image(e.to, g);
      MK_CHECK(from >= 0 && to >= 0, "insert_sync: an edge's image is missing");
      edges.push_back({size_t(from), size_t(to), e.iter});
    }
  }
  return true;
}

// Op j needs an edge from i unless i already happens before j through
// program order and the dependencies taken so far, the latest first (so the
// nearest edge implies the older ones). A dependency left out is implied by
// the others, so what happens before j is the same with all of them: the
// decision for each is a question about the closure of the full dependency
// graph, answered with vector clocks in bounded memory (verify/clocks.hpp).
std::vector<SyncEdge> sync_edges(const ir::Schedule& s, const SyncNeeds& needs, const verify::Chains& c,
                                 size_t budget, verify::SymMode mode, verify::RankSymmetry* found) {
  const auto& need = needs.reuse;
  const size_t n = s.ops.size();
  const auto& chain = c.chain;
  MK_CHECK(needs.within.size() == n && need.size() == n, "insert_sync: needs for another schedule");
  // Program order already gives a dependency within the thread block.
  OpLists dep;
  dep.at.reserve(n + 1);
  dep.items.reserve(needs.within.items.size());
  for (size_t j = 0; j < n; ++j) {
    for (size_t i : needs.within[j]) {
      MK_CHECK(chain[i] != chain[j] || i < j, "a dependency points forward in its thread block");
      if (chain[i] != chain[j]) dep.items.push_back(uint32_t(i));
    }
    dep.at.push_back(uint32_t(dep.items.size()));
  }
  std::vector<SyncEdge> edges;
  verify::with_entry_type(c.longest, [&](auto entry) {
    using T = decltype(entry);
    const bool by_symmetry = mode != verify::SymMode::off && decide_sym<T>(s, c, dep, need, budget, edges, found);
    MK_CHECK(mode != verify::SymMode::required || by_symmetry, "insert_sync: the symmetric decision does not apply");
    if (!by_symmetry) decide<T>(s, chain, c.pos, c.count, dep, need, budget, edges);
  });
  // The blocks found them chain block by chain block; emit in a fixed order:
  // by `to` (counting sort: millions of edges at 1024 ranks), then (iter,
  // from) within each op's few.
  const KeyOrder by_to = order_by_key(n, edges.size(), [&](size_t k) { return edges[k].to; });
  std::vector<SyncEdge> sorted(edges.size());
  for (size_t k = 0; k < edges.size(); ++k) sorted[k] = edges[by_to.order[k]];
  const auto& at = by_to.at;
  for (size_t v = 0; v < n; ++v)
    if (at[v + 1] - at[v] > 1)
      std::sort(sorted.begin() + std::ptrdiff_t(at[v]), sorted.begin() + std::ptrdiff_t(at[v + 1]),
                [](const SyncEdge& x, const SyncEdge& y) { return std::tie(x.iter, x.from) < std::tie(y.iter, y.from); });
  return sorted;
}

}  // namespace

std::vector<SyncEdge> sync_edges(const ir::Schedule& s, const SyncNeeds& needs, size_t budget,
                                 verify::SymMode mode) {
  return sync_edges(s, needs, verify::number_chains(s, true), budget, mode, nullptr);
}

SyncNeeds sync_needs(const ir::Schedule& s, const verify::DataNeeds* given) {
  const size_t n = s.ops.size();
  // Required dependencies (within a step), from chunk accesses, in both
  // aliasing modes (one plan serves in-place and out-of-place calls); scratch
  // reuse (the same in both): the accessors of each slot j writes first in a
  // step (a later write of it follows that one within the step, so the
  // accessors precede it too).
  const bool ll = s.proto == ir::Proto::ll;
  MK_CHECK(!given || given->ll == ll, "insert_sync: access needs for another protocol");
  MK_CHECK(!given || given->ops == n, "insert_sync: access needs for another schedule");
  MK_CHECK(n < (size_t(1) << 32), "insert_sync: too many ops");
  verify::AccessNeeds own[2];
  const verify::AccessNeeds* acc[2];
  for (bool inplace : {false, true}) {
    if (!given) own[inplace] = verify::access_needs(s, inplace, ll);
    acc[inplace] = !given ? &own[inplace] : inplace ? &given->in_place : &given->out_of_place;
  }
  // Per op b, the a of every (a, b) in both modes, latest first, once each:
  // ordered by b (counting sort), then each op's few sorted.
  auto lists = [&](std::vector<verify::Need> verify::AccessNeeds::*which) {
    const std::vector<verify::Need>&v0 = acc[0]->*which, &v1 = acc[1]->*which;
    auto need = [&](size_t i) -> const verify::Need& { return i < v0.size() ? v0[i] : v1[i - v0.size()]; };
    const size_t count = v0.size() + v1.size();
    for (size_t i = 0; i < count; ++i)
      MK_CHECK(need(i).a < n && need(i).b < n, "insert_sync: an access need outside the schedule");
    const KeyOrder by_b = order_by_key(n, count, [&](size_t i) { return need(i).b; });
    OpLists l;
    l.at.reserve(n + 1);
    l.items.reserve(count);
    for (size_t j = 0; j < n; ++j) {
      const size_t first = l.items.size();
      for (size_t k = by_b.at[j]; k < by_b.at[j + 1]; ++k) l.items.push_back(need(by_b.order[k]).a);
      const auto lo = l.items.begin() + std::ptrdiff_t(first);
      std::sort(lo, l.items.end(), std::greater<>());
      l.items.erase(std::unique(lo, l.items.end()), l.items.end());
      l.at.push_back(uint32_t(l.items.size()));
    }
    l.items.shrink_to_fit();
    return l;
  };
  return {lists(&verify::AccessNeeds::within), lists(&verify::AccessNeeds::reuse)};
}

ir::Schedule insert_sync(ir::Schedule s) { return insert_sync(std::move(s), verify::kClockBudget); }

ir::Schedule insert_sync(ir::Schedule s, size_t clock_budget, const verify::DataNeeds* given) {
  MK_CHECK(!s.synced, "insert_sync ran twice");
  const size_t n = s.ops.size();
  for (const Op& op : s.ops) MK_CHECK(op.tb >= 0, "insert_sync needs thread blocks assigned");
  for (const Op& op : s.ops)
    MK_CHECK(op.kind != OpKind::signal && op.kind != OpKind::wait, "schedule already has sync ops");

  const verify::Chains chains = verify::number_chains(s, true);
  verify::RankSymmetry sym;  // trivial unless the dependencies have one
  std::vector<SyncEdge> edges = sync_edges(s, sync_needs(s, given), chains, clock_budget, verify::SymMode::automatic, &sym);
  // A rank's position relative to a rank of class representative `q0`, seen
  // from the representative: (g^-1(r) - q0) mod n for the element g taking q0
  // to the class member. Without a symmetry, plain (r - q) mod n. Keys and
  // orders built from it map onto each other under the symmetry, so the ops
  // insert_sync adds keep it (verify_sync then walks one rank per class).
  auto relative = [&](int32_t q, int32_t r) {
    if (sym.trivial()) return (r - q + s.nranks) % s.nranks;
    return (sym.from(q)[r] - sym.rep(q) + s.nranks) % s.nranks;
  };
  // Each data op's index in its thread block's program.
  auto local_index = [&](size_t i) { return chains.pos[i] - 1; };
  // Slots: per receiving rank, ordered by where the first waiting op sits
  // (its thread block, its place there), then the signaller's relative rank,
  // thread block and place. Keys are thread-block-local and rank-relative, so
  // symmetric schedules get the same numbering on every rank.
  // Flat arrays throughout (1024 ranks: millions of edges).
  using Key = std::tuple<int32_t, int32_t, int32_t, int32_t, int32_t>;
  struct Want {
    size_t from;     // signaller
    int32_t rr;      // receiving rank
    Key key;         // the least over its edges
    int32_t slot = -1;
  };
  // Linear bucketing and small sorts (one sort over millions of edges was a
  // fifth of the proof at 1024 ranks): edges by signaller, wants by receiving
  // rank, waits by the op they precede (edges come sorted by it).
  std::vector<Want> wants;  // one per (signaller, receiving rank), sorted by it
  std::vector<size_t> want_at(n + 1, 0);  // CSR: the signaller's wants
  {
    const KeyOrder by_from = order_by_key(n, edges.size(), [&](size_t k) { return edges[k].from; });
    wants.reserve(edges.size());
    for (size_t from = 0; from < n; ++from) {
      const size_t first = wants.size();
      for (size_t k = by_from.at[from]; k < by_from.at[from + 1]; ++k) {
        const SyncEdge& e = edges[by_from.order[k]];
        const int32_t rr = s.ops[e.to].rank;
        wants.push_back({e.from, rr,
                         Key{s.ops[e.to].tb, local_index(e.to), relative(rr, s.ops[e.from].rank), s.ops[e.from].tb,
                             local_index(e.from)}});
      }
      const auto group = wants.begin() + std::ptrdiff_t(first);
      std::sort(group, wants.end(), [](const Want& a, const Want& b) { return std::tie(a.rr, a.key) < std::tie(b.rr, b.key); });
      wants.erase(std::unique(group, wants.end(), [](const Want& a, const Want& b) { return a.rr == b.rr; }), wants.end());
      want_at[from + 1] = wants.size();
    }
    // per receiving rank, slots in key order
    KeyOrder by_rank = order_by_key(size_t(s.nranks), wants.size(), [&](size_t k) { return wants[k].rr; });
    s.slots = 0;
    for (int32_t r = 0; r < s.nranks; ++r) {
      const auto lo = by_rank.order.begin() + std::ptrdiff_t(by_rank.at[size_t(r)]),
                 hi = by_rank.order.begin() + std::ptrdiff_t(by_rank.at[size_t(r) + 1]);
      std::sort(lo, hi, [&](uint32_t a, uint32_t b) { return std::tie(wants[a].key, a) < std::tie(wants[b].key, b); });
      int32_t slot = 0;
      for (auto it = lo; it != hi; ++it) wants[*it].slot = slot++;
      s.slots = std::max(s.slots, slot);
    }
  }
  auto slot_of = [&](size_t from, int32_t rr) {  // the signaller's wants are sorted by rr
    const auto lo = wants.begin() + std::ptrdiff_t(want_at[from]), hi = wants.begin() + std::ptrdiff_t(want_at[from + 1]);
    const auto it = std::lower_bound(lo, hi, rr, [](const Want& w, int32_t r) { return w.rr < r; });
    MK_CHECK(it != hi && it->rr == rr, "insert_sync: an edge without a slot");
    return it->slot;
  };

  // Emit: waits before their op (one per slot, the strictest iter), the op,
  // then one signal per receiving rank.
  struct Wait {
    size_t to;
    int32_t slot, iter;
  };
  std::vector<Wait> waits;
  waits.reserve(edges.size());
  for (size_t k = 0; k < edges.size();) {  // edges are sorted by `to`
    const size_t to = edges[k].to, first = waits.size();
    for (; k < edges.size() && edges[k].to == to; ++k)
      waits.push_back({to, slot_of(edges[k].from, s.ops[to].rank), edges[k].iter});
    // by slot, the strictest (largest) iter first
    const auto group = waits.begin() + std::ptrdiff_t(first);
    std::sort(group, waits.end(), [](const Wait& a, const Wait& b) { return a.slot != b.slot ? a.slot < b.slot : a.iter > b.iter; });
    waits.erase(std::unique(group, waits.end(), [](const Wait& a, const Wait& b) { return a.slot == b.slot; }), waits.end());
  }
  std::vector<SyncEdge>().swap(edges);  // waits and wants hold what is left of them; the new ops need the room
  int32_t next_id = s.next_id();
  std::vector<Op> out;
  out.reserve(n + waits.size() + wants.size());
  size_t wk = 0, sk = 0;
  std::vector<const Want*> targets;
  for (size_t j = 0; j < n; ++j) {
    const int32_t rank = s.ops[j].rank, tb = s.ops[j].tb;
    for (; wk < waits.size() && waits[wk].to == j; ++wk) {
      Op w;
      w.id = next_id++;
      w.kind = OpKind::wait;
      w.rank = rank;
      w.tb = tb;
      w.slot = waits[wk].slot;
      w.iter = waits[wk].iter;
      w.loc = s.ops[j].loc;
      out.push_back(std::move(w));
    }
    out.push_back(std::move(s.ops[j]));
    const ir::Loc loc = out.back().loc;
    // signal ranks ordered relative to the signaller, for symmetry
    targets.clear();
    for (; sk < wants.size() && wants[sk].from == j; ++sk) targets.push_back(&wants[sk]);
    std::sort(targets.begin(), targets.end(),
              [&](const Want* a, const Want* b) { return relative(rank, a->rr) < relative(rank, b->rr); });
    for (const Want* x : targets) {
      Op g;
      g.id = next_id++;
      g.kind = OpKind::signal;
      g.rank = rank;
      g.tb = tb;
      g.peer = x->rr;
      g.slot = x->slot;
      g.loc = loc;
      out.push_back(std::move(g));
    }
  }
  s.ops = std::move(out);
  s.synced = true;
  return s;
}

}  // namespace mk::passes
