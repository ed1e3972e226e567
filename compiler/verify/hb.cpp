#include "compiler/verify/hb.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <queue>
#include <set>

#include "compiler/common/key_order.hpp"
#include "compiler/verify/clocks.hpp"
#include "compiler/verify/verify.hpp"

namespace mk::verify {

using ir::Buf;
using ir::Op;
using ir::OpKind;
using ir::Ref;
using ir::Schedule;

LocKey loc_key(const Schedule& s, const Ref& c, bool inplace) {
  switch (c.buf) {
    case Buf::input:
      if (inplace)
        if (auto o = ir::inplace_output_of_input(s, c.rank, c.index)) return {c.rank, 1, *o};
      return {c.rank, 0, c.index};
    case Buf::output: return {c.rank, 1, c.index};
    case Buf::scratch: return {c.rank, 2, c.index};
  }
  return {};
}

AccessMap accesses(const Schedule& s, bool inplace) {
  // Dense location index: rank-major, then input, output, scratch (the order
  // of LocKey).
  const int32_t cin = ir::buf_chunks(s, Buf::input), cout = ir::buf_chunks(s, Buf::output);
  const int64_t per_rank = int64_t(cin) + cout + s.scratch;
  auto dense = [&](const LocKey& k) {
    int64_t off = k.space == 0 ? 0 : k.space == 1 ? cin : int64_t(cin) + cout;
    return size_t(int64_t(k.rank) * per_rank + off + k.index);
  };
  MK_CHECK(s.ops.size() < (size_t(1) << 32), "too many ops for the access table");
  // Each op's locations once (a write wins over a read), in op order.
  struct Touch {
    size_t loc;
    Access a;
  };
  std::vector<Touch> touches;
  std::vector<std::pair<size_t, bool>> mine;
  for (size_t oi = 0; oi < s.ops.size(); ++oi) {
    const Op& op = s.ops[oi];
    if (!op.is_data()) continue;
    mine.clear();
    for (const Ref& r : op.srcs)
      for (int32_t k = 0; k < r.count; ++k) mine.push_back({dense(loc_key(s, r.at(k), inplace)), false});
    for (const Ref& r : op.dsts)
      for (int32_t k = 0; k < r.count; ++k) {
        LocKey key = loc_key(s, r.at(k), inplace);
        if (op.is_copy() && key == loc_key(s, op.srcs[0].at(k), inplace)) continue;
        mine.push_back({dense(key), true});
      }
    std::sort(mine.begin(), mine.end(), [](const auto& a, const auto& b) {
      return a.first < b.first || (a.first == b.first && a.second > b.second);
    });
    for (size_t i = 0; i < mine.size(); ++i) {
      if (i && mine[i].first == mine[i - 1].first) continue;  // writes sort first
      touches.push_back({mine[i].first, {uint32_t(oi), mine[i].second}});
    }
  }
  // Counting sort by location (stable: program order within each).
  const size_t nlocs = size_t(per_rank) * size_t(s.nranks);
  std::vector<size_t> count(nlocs + 1, 0);
  for (const Touch& t : touches) ++count[t.loc + 1];
  AccessMap m;
  for (size_t l = 0; l < nlocs; ++l) {
    if (count[l + 1] == 0) continue;
    const int32_t rank = int32_t(l / size_t(per_rank));
    const int64_t off = int64_t(l % size_t(per_rank));
    const int32_t space = off < cin ? 0 : off < int64_t(cin) + cout ? 1 : 2;
    const int32_t index = int32_t(space == 0 ? off : space == 1 ? off - cin : off - cin - cout);
    m.keys_.push_back({rank, space, index});
  }
  for (size_t l = 0; l < nlocs; ++l) count[l + 1] += count[l];  // count[l]: where location l starts
  m.begin_.reserve(m.keys_.size() + 1);
  for (const LocKey& k : m.keys_) m.begin_.push_back(count[dense(k)]);
  m.begin_.push_back(touches.size());
  m.all_.resize(touches.size());
  for (const Touch& t : touches) m.all_[count[t.loc]++] = t.a;
  return m;
}

namespace {

std::string tb_name(const Op& op) { return fmt::format("rank {} tb {}", op.rank, op.tb); }

}  // namespace

Chains number_chains(const Schedule& s, bool data_only) {
  const size_t n = s.ops.size();
  Chains c;
  c.chain.assign(n, -1);
  c.pos.assign(n, 0);
  // (rank, tb) -> chain, dense (a map costs a second at 3 M ops)
  int32_t max_tb = 0;
  for (const Op& op : s.ops) max_tb = std::max(max_tb, op.tb + 1);
  const size_t width = size_t(std::max(max_tb, 0)) + 1;  // tb -1 (unassigned) at column 0
  std::vector<int32_t> chain_of(size_t(std::max(s.nranks, 1)) * width, -1);
  std::vector<int32_t> length;
  for (size_t i = 0; i < n; ++i) {
    const Op& op = s.ops[i];
    if (data_only && !op.is_data()) continue;
    MK_CHECK(op.rank >= 0 && op.rank < s.nranks && op.tb >= -1, "number_chains: an op outside the ranks");
    int32_t& ch = chain_of[size_t(op.rank) * width + size_t(op.tb + 1)];
    if (ch < 0) {
      ch = int32_t(length.size());
      length.push_back(0);
    }
    c.chain[i] = ch;
    c.pos[i] = ++length[size_t(ch)];
  }
  c.count = length.size();
  for (int32_t l : length) c.longest = std::max(c.longest, size_t(l));
  return c;
}

SyncGraph build_sync_graph(const Schedule& s) { return build_sync_graph(s, nullptr); }

SyncGraph build_sync_graph(const Schedule& s, const AccessNeeds* out_of_place) {
  const size_t n = s.ops.size();
  SyncGraph g;

  // Each wait's signal: the one signal of its (rank, slot). Errors name the
  // least (rank, slot) that fails, and its first ops.
  const auto no_signal = [&](int32_t rank, int32_t slot, size_t w0) {
    throw Error(ErrId::verify_E011,
                fmt::format("{}: {} waits on slot {} of rank {}, which nothing signals", s.name, describe_op(s, w0),
                            slot, rank),
                s.ops[w0].loc, "the wait would spin forever");
  };
  const auto two_signals = [&](int32_t rank, int32_t slot, size_t count, size_t a, size_t b) {
    throw Error(ErrId::verify_E011,
                fmt::format("{}: slot {} of rank {} is signalled by {} ops ({} and {}); each "
                            "slot needs exactly one signaller",
                            s.name, slot, rank, count, describe_op(s, a), describe_op(s, b)),
                s.ops[b].loc);
  };
  const auto no_wait = [&](int32_t rank, int32_t slot, size_t sig) {
    throw Error(ErrId::verify_E011,
                fmt::format("{}: {} signals slot {} of rank {}, but nothing waits on it", s.name, describe_op(s, sig),
                            slot, rank),
                s.ops[sig].loc);
  };
  g.signal.assign(n, -1);
  // Dense by (rank, slot) where the slots are few (insert_sync's output:
  // millions of signals, whose sort was a tenth of the proof), else sorted.
  int64_t max_slot = -1;
  bool dense = n < (size_t(1) << 32);
  for (size_t i = 0; i < n && dense; ++i) {
    const Op& op = s.ops[i];
    if (op.kind != OpKind::signal && op.kind != OpKind::wait) continue;
    const int32_t r = op.kind == OpKind::signal ? op.peer : op.rank;
    dense = r >= 0 && r < s.nranks && op.slot >= 0;
    max_slot = std::max<int64_t>(max_slot, op.slot);
  }
  const size_t width = size_t(max_slot + 1);
  dense = dense && width * size_t(s.nranks) <= 4 * n + 4096;
  if (dense) {
    constexpr uint32_t kNone = UINT32_MAX;
    const size_t keys = width * size_t(s.nranks);
    std::vector<uint32_t> first(keys, kNone), second(keys, kNone), first_wait(keys, kNone), count(keys, 0);
    for (size_t i = 0; i < n; ++i) {
      const Op& op = s.ops[i];
      if (op.kind == OpKind::signal) {
        const size_t k = size_t(op.peer) * width + size_t(op.slot);
        if (first[k] == kNone) first[k] = uint32_t(i);
        else if (second[k] == kNone) second[k] = uint32_t(i);
        ++count[k];
      } else if (op.kind == OpKind::wait) {
        const size_t k = size_t(op.rank) * width + size_t(op.slot);
        if (first_wait[k] == kNone) first_wait[k] = uint32_t(i);
      }
    }
    for (size_t k = 0; k < keys; ++k) {
      if (first_wait[k] == kNone) continue;
      const int32_t rank = int32_t(k / width), slot = int32_t(k % width);
      if (first[k] == kNone) no_signal(rank, slot, first_wait[k]);
      if (count[k] != 1) two_signals(rank, slot, count[k], first[k], second[k]);
    }
    for (size_t k = 0; k < keys; ++k)
      if (first[k] != kNone && first_wait[k] == kNone) no_wait(int32_t(k / width), int32_t(k % width), first[k]);
    for (size_t i = 0; i < n; ++i) {
      const Op& op = s.ops[i];
      if (op.kind == OpKind::wait) g.signal[i] = int64_t(first[size_t(op.rank) * width + size_t(op.slot)]);
    }
  } else {
    using Keyed = std::pair<std::pair<int32_t, int32_t>, size_t>;
    std::vector<Keyed> signals, waits;
    for (size_t i = 0; i < n; ++i) {
      const Op& op = s.ops[i];
      if (op.kind == OpKind::signal) signals.push_back({{op.peer, op.slot}, i});
      if (op.kind == OpKind::wait) waits.push_back({{op.rank, op.slot}, i});
    }
    std::sort(signals.begin(), signals.end());
    std::sort(waits.begin(), waits.end());
    auto range = [](const std::vector<Keyed>& v, std::pair<int32_t, int32_t> key) {
      auto lo = std::lower_bound(v.begin(), v.end(), Keyed{key, 0});
      auto hi = lo;
      while (hi != v.end() && hi->first == key) ++hi;
      return std::make_pair(lo, hi);
    };
    for (size_t k = 0; k < waits.size();) {
      const auto key = waits[k].first;
      auto [lo, hi] = range(signals, key);
      if (lo == hi) no_signal(key.first, key.second, waits[k].second);
      if (hi - lo != 1) two_signals(key.first, key.second, size_t(hi - lo), lo->second, (lo + 1)->second);
      for (; k < waits.size() && waits[k].first == key; ++k) g.signal[waits[k].second] = int64_t(lo->second);
    }
    for (const auto& [key, sig] : signals) {
      auto [lo, hi] = range(waits, key);
      if (lo == hi) no_wait(key.first, key.second, sig);
    }
  }

  {
    Chains c = number_chains(s, false);
    g.chain = std::move(c.chain);
    g.pos = std::move(c.pos);
    g.nchains = c.count;
    g.longest = c.longest;
  }

  // Edges: program order and signal -> wait (iter 0) carry ordering; in LL
  // the unique writer of a scratch slot in a step also gates its readers
  // (which only blocks: deadlock, no ordering).
  std::vector<int64_t> prev(n, -1);
  {
    std::vector<int64_t> last(g.nchains, -1);
    for (size_t i = 0; i < n; ++i) {
      int64_t& l = last[size_t(g.chain[i])];
      prev[i] = l;
      l = int64_t(i);
    }
  }
  std::vector<std::pair<size_t, size_t>> gate;  // (reader, writer), by reader
  if (s.proto == ir::Proto::ll) {
    const AccessNeeds own = out_of_place ? AccessNeeds{} : access_needs(s, false, true);
    const AccessNeeds& acc = out_of_place ? *out_of_place : own;
    if (const auto& d = acc.double_write)
      throw Error(ErrId::verify_E014,
                  fmt::format("{}: LL scratch slot r{}.sc[{}] is written by {} and {} in one step", s.name,
                              d->at.rank, d->at.index, describe_op(s, d->a), describe_op(s, d->b)),
                  s.ops[d->b].loc, "use the simple protocol, or one slot per write");
    for (const Need& x : acc.gates) gate.push_back({x.a, x.b});
    std::sort(gate.begin(), gate.end());
  }
  std::vector<size_t> gate_at(gate.empty() ? 0 : n + 1, 0);  // CSR offsets into gate
  if (!gate.empty()) {
    for (const auto& e : gate) ++gate_at[e.first + 1];
    for (size_t v = 0; v < n; ++v) gate_at[v + 1] += gate_at[v];
  }
  auto for_preds = [&](size_t v, auto&& f) {
    if (prev[v] >= 0) f(size_t(prev[v]));
    if (g.signal[v] >= 0 && s.ops[v].iter == 0) f(size_t(g.signal[v]));
    if (!gate.empty())
      for (size_t k = gate_at[v]; k < gate_at[v + 1]; ++k) f(gate[k].second);
  };

  // Topological order over all edges (deadlock check): program order when
  // every edge points back in it (insert_sync's output), else lowest index
  // first (clocks then live briefly).
  bool backwards = true;
  for (size_t v = 0; v < n && backwards; ++v) for_preds(v, [&](size_t p) { backwards = backwards && p < v; });
  std::vector<size_t> indeg;  // in-degrees, where the order is not program order
  g.topo.reserve(n);
  if (backwards) {
    for (size_t v = 0; v < n; ++v) g.topo.push_back(v);
  } else {
    indeg.assign(n, 0);
    std::vector<std::vector<size_t>> succ(n);
    for (size_t v = 0; v < n; ++v)
      for_preds(v, [&](size_t p) {
        succ[p].push_back(v);
        ++indeg[v];
      });
    std::priority_queue<size_t, std::vector<size_t>, std::greater<>> ready;
    for (size_t v = 0; v < n; ++v)
      if (indeg[v] == 0) ready.push(v);
    while (!ready.empty()) {
      size_t v = ready.top();
      ready.pop();
      g.topo.push_back(v);
      for (size_t w : succ[v])
        if (--indeg[w] == 0) ready.push(w);
    }
  }
  if (g.topo.size() != n) {
    // Find a cycle among the ops that never became ready.
    std::vector<int> state(n, 0);  // 0 unseen, 1 on stack, 2 done
    std::vector<size_t> stack;
    std::vector<size_t> cycle;
    std::function<bool(size_t)> dfs = [&](size_t v) -> bool {
      state[v] = 1;
      stack.push_back(v);
      bool found = false;
      for_preds(v, [&](size_t p) {
        if (found || (indeg[p] == 0 && state[p] == 0)) return;
        if (state[p] == 1) {
          auto it = std::find(stack.begin(), stack.end(), p);
          cycle.assign(it, stack.end());
          found = true;
        } else if (state[p] == 0 && dfs(p)) {
          found = true;
        }
      });
      if (found) return true;
      stack.pop_back();
      state[v] = 2;
      return false;
    };
    for (size_t v = 0; v < n && cycle.empty(); ++v)
      if (indeg[v] != 0 && state[v] == 0) dfs(v);
    std::string chain;
    for (size_t k = 0; k < cycle.size(); ++k)
      chain += fmt::format("\n    {} [{}] waits for the op before it in this list", describe_op(s, cycle[k]),
                           tb_name(s.ops[cycle[k]]));
    size_t at = cycle.empty() ? 0 : cycle.front();
    throw Error(ErrId::verify_E005,
                fmt::format("{}: deadlock: a cycle of {} waits:{}", s.name, cycle.size(), chain),
                n ? s.ops[at].loc.get() : SrcLoc{},
                "a thread block waits for something that itself waits for that thread block");
  }
  for (const Op& op : s.ops)
    if (op.kind == OpKind::wait && op.iter < 0 && op.iter != -1 && op.iter != -s.depth)
      throw Error(ErrId::verify_E011,
                  fmt::format("{}: a wait reaches back {} steps; only 1 or the depth ({}) are allowed", s.name,
                              -op.iter, s.depth),
                  op.loc);
  return g;
}

namespace {

// How many reads each signal's clocks get: at step g (by every wait; iter 0
// ones in step g, the others in step g + depth) and at step g + depth (iter 0).
struct SignalUses {
  std::vector<int32_t> at_step, at_later;
};
SignalUses signal_uses(const Schedule& s, const SyncGraph& g) {
  SignalUses u;
  u.at_step.assign(s.ops.size(), 0);
  u.at_later.assign(s.ops.size(), 0);
  for (size_t w = 0; w < s.ops.size(); ++w) {
    if (g.signal[w] < 0) continue;
    ++u.at_step[size_t(g.signal[w])];
    if (s.ops[w].iter == 0) ++u.at_later[size_t(g.signal[w])];
  }
  return u;
}

// The walk over one chain block: step g (clocks of step-g positions, each op's
// own included), then step g + depth (clocks that still hold step-g
// positions: "which ops of step g happen before this op, depth steps later").
// A chain's running clock carries over: step g's whole chain precedes the
// chain at g + depth. `at(step, op, clock)` sees every data op's clock.
template <class T, class At>
void walk(const Schedule& s, const SyncGraph& g, const SignalUses& u, ClockPool<T>& pool, At&& at) {
  const size_t n = s.ops.size();
  std::vector<int32_t> now(n, -1), later(n, -1);  // signal -> snapshot slot
  for (size_t v : g.topo) {
    const Op& op = s.ops[v];
    const size_t ch = size_t(g.chain[v]);
    T* run = pool.running(ch);
    if (op.kind == OpKind::wait && op.iter == 0) pool.join_from(run, now[size_t(g.signal[v])]);
    pool.set_own(run, ch, T(g.pos[v]));
    if (op.is_data())
      at(0, v, static_cast<const T*>(run));
    else if (op.kind == OpKind::signal && u.at_step[v] > 0)
      now[v] = pool.snapshot(run, u.at_step[v]);
  }
  for (size_t v : g.topo) {
    const Op& op = s.ops[v];
    T* run = pool.running(size_t(g.chain[v]));
    if (op.kind == OpKind::wait) {
      const size_t sig = size_t(g.signal[v]);
      pool.join_from(run, op.iter == 0 ? later[sig] : now[sig]);
    }
    if (op.is_data())
      at(1, v, static_cast<const T*>(run));
    else if (op.kind == OpKind::signal && u.at_later[v] > 0)
      later[v] = pool.snapshot(run, u.at_later[v]);
  }
}

// Within one step, along program order and iter-0 waits: does `from` reach `to`?
// (Only for messages: a plain search.)
bool reaches(const Schedule& s, const SyncGraph& g, size_t from, size_t to) {
  const size_t n = s.ops.size();
  std::vector<std::vector<size_t>> succ(n);
  std::vector<int64_t> last(g.nchains, -1);
  for (size_t i = 0; i < n; ++i) {
    int64_t& l = last[size_t(g.chain[i])];
    if (l >= 0) succ[size_t(l)].push_back(i);
    l = int64_t(i);
    if (g.signal[i] >= 0 && s.ops[i].iter == 0) succ[size_t(g.signal[i])].push_back(i);
  }
  std::vector<bool> seen(n, false);
  std::vector<size_t> todo{from};
  seen[from] = true;
  while (!todo.empty()) {
    size_t v = todo.back();
    todo.pop_back();
    if (v == to) return true;
    for (size_t w : succ[v])
      if (!seen[w]) {
        seen[w] = true;
        todo.push_back(w);
      }
  }
  return false;
}

// One ordering verify_sync needs: op a before op b (the op the query sits at).
struct Query {
  uint32_t a;
  uint32_t chain;  // a's
  LocKey loc;      // the least location needing it
  uint8_t kind;    // 0 within a step, 1 within a step in-place, 2 scratch reuse
};

// The queries by the op they are asked at and the step they are asked in
// (within: step g, reuse: g + depth), each op's sorted by a's chain so that a
// chain block finds its own with a binary search.
class Queries {
 public:
  explicit Queries(size_t n) : n_(n) {}
  // Room for exactly k queries (millions at 1024 ranks: growth by doubling
  // left up to half of it unused, and twice it live while moving).
  void reserve(size_t k) { raw_.reserve(k); }
  void add(size_t b, Query q) { raw_.push_back({uint32_t(b), q}); }
  void finish() {
    KeyOrder o = order_by_key(2 * n_, raw_.size(), [&](size_t i) { return slot(raw_[i].first, raw_[i].second); });
    q_.resize(raw_.size());
    for (size_t i = 0; i < raw_.size(); ++i) q_[i] = raw_[o.order[i]].second;
    at_ = std::move(o.at);
    raw_.clear();
    raw_.shrink_to_fit();
    for (size_t k = 0; k < 2 * n_; ++k)
      std::sort(q_.begin() + std::ptrdiff_t(at_[k]), q_.begin() + std::ptrdiff_t(at_[k + 1]),
                [](const Query& x, const Query& y) { return x.chain < y.chain; });
  }
  // Those at op b in `step` whose chain is in [lo, hi).
  std::span<const Query> at(size_t b, int step, size_t lo, size_t hi) const {
    const Query* first = q_.data() + at_[size_t(step) * n_ + b];
    const Query* last = q_.data() + at_[size_t(step) * n_ + b + 1];
    auto by_chain = [](const Query& x, size_t c) { return x.chain < c; };
    const Query* from = std::lower_bound(first, last, lo, by_chain);
    const Query* to = std::lower_bound(from, last, hi, by_chain);
    return {from, size_t(to - from)};
  }

 private:
  size_t slot(uint32_t b, const Query& q) const { return (q.kind == 2 ? n_ : 0) + b; }
  size_t n_;
  std::vector<std::pair<uint32_t, Query>> raw_;
  std::vector<size_t> at_;
  std::vector<Query> q_;
};

struct Failure {
  std::tuple<int, LocKey, int, size_t, size_t> order;  // as the old all-pairs scan met them
  Query q;
  size_t b;
};

template <class T>
std::optional<Failure> find_race(const Schedule& s, const SyncGraph& g, const Queries& at, size_t budget) {
  const SignalUses u = signal_uses(s, g);
  std::optional<Failure> first;
  for_each_chain_block<T>(g.nchains, budget, [&](ClockPool<T>& pool) {
    if (pool.width() == 0) return walk(s, g, u, pool, [](int, size_t, const T*) {});  // counting
    walk(s, g, u, pool, [&](int step, size_t b, const T* clock) {
      for (const Query& q : at.at(b, step, pool.lo(), pool.lo() + pool.width())) {
        if (pool.has(clock, q.chain, T(g.pos[q.a]))) continue;
        Failure f{{q.kind == 1, q.loc, q.kind == 2, q.a, b}, q, b};
        if (!first || f.order < first->order) first = f;
      }
    });
  });
  return first;
}

// find_race by symmetry (symmetry.hpp): the walk runs over the ops of one
// representative rank per class, and each query reads the representative's
// clock through the permutation. nullopt when the symmetry is trivial, the
// quotient has no order (the plain walk then reports the cycle) or its
// clocks do not fit the budget.
template <class T>
std::optional<std::optional<Failure>> find_race_sym(const Schedule& s, const SyncGraph& g, const Queries& at,
                                                    size_t budget) {
  const ChainIndex ci(s, g.chain, g.pos, g.nchains);
  auto same = [&](size_t u, size_t v) { return s.ops[u].kind == s.ops[v].kind && s.ops[u].iter == s.ops[v].iter; };
  auto edges = [&](size_t v, std::vector<std::pair<int64_t, int32_t>>& out) {
    if (g.signal[v] >= 0) out.push_back({g.signal[v], 0});
  };
  const RankSymmetry sym = SymmetryFinder::find(s, ci, same, edges);
  if (sym.trivial()) return std::nullopt;
  const size_t n = s.ops.size();
  const Representatives reps(s, ci, sym);
  // Slots: a running clock per representative chain, two snapshots (step g,
  // step g + depth) per representative signal. Data ops' queries are
  // answered while the walk is at their representative.
  std::vector<int64_t> snap_slot(n, -1);
  size_t slots = reps.runs();
  for (uint32_t v : reps.ops())
    if (s.ops[v].kind == OpKind::signal) {
      snap_slot[v] = int64_t(slots);
      slots += 2;
    }
  const size_t w = (g.nchains + 15) / 16 * 16;
  if (slots * w * sizeof(T) > budget) return std::nullopt;
  // Along program order and, for a wait within the step, its signal's representative.
  const std::vector<uint32_t> order = reps.order([&](size_t v, auto&& edge) {
    if (g.signal[v] >= 0 && s.ops[v].iter == 0) edge(reps.rho(size_t(g.signal[v])));
  });
  if (order.empty()) return std::nullopt;
  std::vector<T> store(slots * w, T(0));
  auto slot = [&](int64_t k) { return store.data() + size_t(k) * w; };
  std::optional<Failure> first;
  for (int step = 0; step < 2; ++step)
    for (uint32_t v : order) {
      const Op& op = s.ops[v];
      T* run = slot(reps.run_slot(size_t(g.chain[v])));
      if (op.kind == OpKind::wait && (step == 1 || op.iter == 0)) {
        const size_t sig = size_t(g.signal[v]);
        // iter 0: the signal in the same step; iter < 0 (in the later step):
        // its clock at step g
        const int use = step == 1 && op.iter == 0 ? 1 : 0;
        join_permuted(run, slot(snap_slot[reps.rho(sig)] + use), ci, sym, s.ops[sig].rank);
      }
      if (step == 0) run[size_t(g.chain[v])] = T(g.pos[v]);
      if (snap_slot[v] >= 0) std::copy_n(run, w, slot(snap_slot[v] + step));
      if (!op.is_data()) continue;
      // run is v's clock; b = g_r(v) sees chain c where v sees g_r^-1(c)
      for (int32_t r : sym.members(op.rank)) {
        const size_t b = r == op.rank ? v : size_t(ci.image(v, sym.to(r)));
        for (const Query& q : at.at(b, step, 0, g.nchains)) {
          if (run[permuted_entry(ci, sym, r, q.chain)] >= T(g.pos[q.a])) continue;
          Failure f{{q.kind == 1, q.loc, q.kind == 2, q.a, b}, q, b};
          if (!first || f.order < first->order) first = f;
        }
      }
    }
  return first;
}

}  // namespace

void verify_sync(const Schedule& s) { verify_sync_budget(s, kClockBudget); }

DataNeeds data_needs(const Schedule& s, bool ll) {
  DataNeeds d;
  d.ll = ll;
  d.ops = s.ops.size();
  d.out_of_place = access_needs(s, false, ll);
  d.in_place = access_needs(s, true, ll);
  return d;
}

namespace {

// pre.before's op index -> the synced schedule's, after checking that the
// needs computed for `before` are the synced schedule's (hb.hpp Presynced).
std::vector<uint32_t> presynced_index(const Schedule& s, const Presynced& pre) {
  const Schedule& b = *pre.before;
  const auto mismatch = [&](const char* what) {
    throw InternalError(fmt::format("verify_sync: the access needs handed over are not the schedule's ({})", what));
  };
  if (pre.needs->ll != (s.proto == ir::Proto::ll)) mismatch("protocol");
  if (pre.needs->ops != b.ops.size()) mismatch("computed for another schedule");
  if (b.root != s.root || !ir::same_data_ops(b, s)) mismatch("data ops");
  std::vector<uint32_t> at(b.ops.size(), UINT32_MAX);
  size_t j = 0;
  for (size_t i = 0; i < b.ops.size(); ++i) {
    const OpKind k = b.ops[i].kind;
    if (k == OpKind::signal || k == OpKind::wait) mismatch("sync ops before insert_sync");
    if (!b.ops[i].is_data()) continue;
    while (!s.ops[j].is_data()) ++j;  // same_data_ops: there is one
    at[i] = uint32_t(j++);
  }
  return at;
}

// A need's op index in the synced schedule; a need outside the data ops of
// the schedule they came from is a compiler bug.
uint32_t mapped(const std::vector<uint32_t>& at, uint32_t i) {
  if (i >= at.size() || at[i] == UINT32_MAX)
    throw InternalError("verify_sync: an access need names an op that is not a data op of its schedule");
  return at[i];
}

AccessNeeds remapped(const AccessNeeds& a, const std::vector<uint32_t>& at) {
  auto map = [&](std::vector<Need> v) {
    for (Need& x : v) x = {mapped(at, x.a), mapped(at, x.b), x.at};
    return v;
  };
  AccessNeeds out{map(a.within), map(a.reuse), map(a.gates), a.double_write};
  if (out.double_write)
    out.double_write = Need{mapped(at, a.double_write->a), mapped(at, a.double_write->b), a.double_write->at};
  return out;
}

}  // namespace

void verify_sync_budget(const Schedule& s, size_t clock_budget, SymMode mode, const Presynced& pre) {
  // Puts and flushes: proved in the network model (verify/network.cpp), whose
  // data ops differ from the schedule's (no presynced needs then), on a copy
  // (the pipeline, which owns its schedule, proves it in place).
  if (has_network_ops(s)) {
    ir::Schedule copy = s;
    return verify_sync_network(copy, clock_budget, mode);
  }
  verify_bounds(s);
  verify_links(s);
  const bool ll = s.proto == ir::Proto::ll;
  const bool given = pre.before && pre.needs;
  const std::vector<uint32_t> at_synced = given ? presynced_index(s, pre) : std::vector<uint32_t>{};
  AccessNeeds out_of_place = given ? remapped(pre.needs->out_of_place, at_synced) : access_needs(s, false, ll);
  const SyncGraph g = build_sync_graph(s, &out_of_place);
  // The orderings to check (access_needs): per location in program order,
  // every two accesses with a write among them must be ordered; by
  // transitivity it is enough that each write follows the previous write and
  // the reads since it, and each read follows the previous write (LL scratch
  // reads are gated in-band). For reuse, every access of step g must precede
  // the first write of step g + depth (the later writes follow that one
  // within the step).
  Queries at(s.ops.size());
  auto ask = [&](const Need& x, uint8_t kind) { at.add(x.b, {x.a, uint32_t(g.chain[x.a]), x.at, kind}); };
  at.reserve(out_of_place.within.size() + out_of_place.reuse.size() + (given ? pre.needs->in_place.within.size() : 0));
  for (const Need& x : out_of_place.within) ask(x, 0);
  for (const Need& x : out_of_place.reuse) ask(x, 2);
  out_of_place = AccessNeeds{};  // one at a time
  if (given) {
    for (const Need& x : pre.needs->in_place.within) ask({mapped(at_synced, x.a), mapped(at_synced, x.b), x.at}, 1);
  } else {
    for (const Need& x : access_needs(s, true, ll).within) ask(x, 1);
  }
  at.finish();
  std::optional<Failure> race;
  with_entry_type(g.longest, [&](auto entry) {
    using T = decltype(entry);
    std::optional<std::optional<Failure>> by_symmetry;
    if (mode != SymMode::off) by_symmetry = find_race_sym<T>(s, g, at, clock_budget);
    MK_CHECK(mode != SymMode::required || by_symmetry, "verify_sync: the walk by symmetry does not apply here");
    race = by_symmetry ? *by_symmetry : find_race<T>(s, g, at, clock_budget);
  });
  if (!race) return;
  static const char* spaces[] = {"in", "out", "sc"};
  static const char* what[] = {"within a step", "within a step (in-place)", "between steps (scratch reuse)"};
  const LocKey& key = race->q.loc;
  const size_t a = race->q.a, b = race->b;
  throw Error(ErrId::verify_E004,
              fmt::format("{}: race on r{}.{}[{}] {}: {} and {} are not ordered by signal/wait{}", s.name, key.rank,
                          spaces[key.space], key.index, what[race->q.kind], describe_op(s, a), describe_op(s, b),
                          reaches(s, g, b, a) ? " (they are ordered, but against program order)" : ""),
              s.ops[b].loc,
              "insert_sync orders every conflict; a hand-written or imported schedule needs a dependency here");
}

HB build_hb(const Schedule& s) {
  HB hb;
  hb.g_ = build_sync_graph(s);
  hb.topo = hb.g_.topo;
  const size_t n = s.ops.size();
  hb.width_ = (hb.g_.nchains + 15) / 16 * 16;
  hb.within_.assign(n * hb.width_, 0);
  hb.cross_.assign(n * hb.width_, 0);
  hb.data_.resize(n);
  for (size_t i = 0; i < n; ++i) hb.data_[i] = s.ops[i].is_data();
  ClockPool<int32_t> pool(0, hb.width_, hb.g_.nchains);
  walk(s, hb.g_, signal_uses(s, hb.g_), pool, [&](int step, size_t v, const int32_t* clock) {
    std::copy_n(clock, hb.width_, (step == 0 ? hb.within_ : hb.cross_).begin() + std::ptrdiff_t(v * hb.width_));
  });
  return hb;
}

bool HB::before(size_t a, size_t b) const {
  return a != b && data_[a] && data_[b] && within_[b * width_ + size_t(g_.chain[a])] >= g_.pos[a];
}

bool HB::before_reuse(size_t a, size_t b) const {
  return data_[a] && data_[b] && cross_[b * width_ + size_t(g_.chain[a])] >= g_.pos[a];
}

}  // namespace mk::verify
