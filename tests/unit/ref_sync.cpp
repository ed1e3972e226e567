// Test-only reference: the happens-before closures of insert_sync and
// verify_sync as they were before the vector-clock rewrite (dense bit
// matrices over data ops: exact, but n x n bits), and the all-pairs race
// check. What they share with the compiler is the input: what must be ordered
// (passes::sync_needs) and the graph (verify::build_sync_graph).
#include "tests/unit/ref_sync.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>

#include "compiler/verify/hb.hpp"
#include "compiler/verify/verify.hpp"

namespace mk::test_ref {

using ir::OpKind;
using ir::Schedule;

std::vector<passes::SyncEdge> ref_sync_edges(const Schedule& s, const passes::SyncNeeds& needs) {
  const size_t n = s.ops.size();
  std::vector<int32_t> di(n, -1);
  size_t nd = 0;
  for (size_t i = 0; i < n; ++i)
    if (s.ops[i].is_data()) di[i] = int32_t(nd++);
  std::vector<int64_t> prev(n, -1), last_if_first(n, -1);
  {
    std::map<std::pair<int32_t, int32_t>, std::vector<size_t>> by_tb;
    for (size_t i = 0; i < n; ++i)
      if (di[i] >= 0) by_tb[{s.ops[i].rank, s.ops[i].tb}].push_back(i);
    for (auto& [k, list] : by_tb) {
      for (size_t t = 1; t < list.size(); ++t) prev[list[t]] = int64_t(list[t - 1]);
      last_if_first[list.front()] = int64_t(list.back());
    }
  }
  std::vector<passes::SyncEdge> edges;
  std::vector<std::vector<size_t>> within_in(n);
  // C: strict within-step ancestors; R: step-g ops before this op at g + depth.
  BitRows C(n, nd), R(n, nd);
  auto absorb = [&](BitRows& rows, size_t v, size_t src) {
    rows.or_from(v, C, src);
    rows.set(v, size_t(di[src]));
  };
  for (size_t j = 0; j < n; ++j) {
    if (di[j] < 0) continue;
    if (prev[j] >= 0) absorb(C, j, size_t(prev[j]));
    for (size_t i : needs.within[j]) {
      if (C.test(j, size_t(di[i]))) continue;
      edges.push_back({i, j, 0});
      within_in[j].push_back(i);
      absorb(C, j, i);
    }
  }
  for (size_t j = 0; j < n; ++j) {
    if (di[j] < 0) continue;
    if (prev[j] >= 0) R.or_into(j, size_t(prev[j]));
    for (size_t i : within_in[j]) R.or_into(j, i);
    if (last_if_first[j] >= 0) absorb(R, j, size_t(last_if_first[j]));
    for (size_t a : needs.reuse[j]) {
      if (R.test(j, size_t(di[a]))) continue;
      edges.push_back({a, j, -s.depth});
      absorb(R, j, a);
    }
  }
  std::sort(edges.begin(), edges.end(), [](const passes::SyncEdge& x, const passes::SyncEdge& y) {
    return std::tie(x.to, x.iter, x.from) < std::tie(y.to, y.iter, y.from);
  });
  return edges;
}

bool RefHB::before(size_t a, size_t b) const {
  int32_t da = data_index[a], db = data_index[b];
  return da >= 0 && db >= 0 && a != b && within.test(size_t(db), size_t(da));
}

bool RefHB::before_reuse(size_t a, size_t b) const {
  int32_t da = data_index[a], db = data_index[b];
  return da >= 0 && db >= 0 && cross.test(size_t(db), size_t(da));
}

RefHB ref_build_hb(const Schedule& s) {
  const verify::SyncGraph g = verify::build_sync_graph(s);
  const size_t n = s.ops.size();
  RefHB hb;
  hb.data_index.assign(n, -1);
  size_t nd = 0;
  for (size_t i = 0; i < n; ++i)
    if (s.ops[i].is_data()) hb.data_index[i] = int32_t(nd++);
  // Rows per op (all ops here, not only data ops: simpler, small schedules).
  // Within: running row per chain; a wait (iter 0) takes its signal's row.
  BitRows within_all(n, nd), run(g.nchains, nd);
  for (size_t v : g.topo) {
    const size_t ch = size_t(g.chain[v]);
    if (s.ops[v].kind == OpKind::wait && s.ops[v].iter == 0) run.or_from(ch, within_all, size_t(g.signal[v]));
    if (hb.data_index[v] >= 0) run.set(ch, size_t(hb.data_index[v]));
    within_all.copy_row(v, run, ch);
  }
  // Cross: the chain's whole step g, then waits bring the signaller's cross
  // row (iter 0) or its within row (iter < 0).
  BitRows cross_all(n, nd), xrun(g.nchains, nd);
  for (size_t ch = 0; ch < g.nchains; ++ch) xrun.copy_row(ch, run, ch);
  for (size_t v : g.topo) {
    const size_t ch = size_t(g.chain[v]);
    if (s.ops[v].kind == OpKind::wait) {
      const size_t sig = size_t(g.signal[v]);
      xrun.or_from(ch, s.ops[v].iter == 0 ? cross_all : within_all, sig);
    }
    cross_all.copy_row(v, xrun, ch);
  }
  hb.within.assign(nd, nd);
  hb.cross.assign(nd, nd);
  for (size_t v = 0; v < n; ++v)
    if (hb.data_index[v] >= 0) {
      hb.within.copy_row(size_t(hb.data_index[v]), within_all, v);
      hb.cross.copy_row(size_t(hb.data_index[v]), cross_all, v);
    }
  hb.topo = g.topo;
  return hb;
}

void ref_verify_sync(const Schedule& s) {
  verify::verify_bounds(s);
  const RefHB hb = ref_build_hb(s);
  const bool ll = s.proto == ir::Proto::ll;
  auto race = [&](size_t a, size_t b) {
    throw Error(ErrId::verify_E004, fmt::format("{}: {} and {} race", s.name, verify::describe_op(s, a),
                                                verify::describe_op(s, b)));
  };
  // Every pair of accesses with a write among them, in both modes.
  for (bool inplace : {false, true}) {
    for (const auto& [key, acc] : verify::accesses(s, inplace)) {
      for (size_t i = 0; i < acc.size(); ++i)
        for (size_t j = i + 1; j < acc.size(); ++j) {
          const verify::Access &a = acc[i], &b = acc[j];
          if (!a.write && !b.write) continue;
          if (ll && key.space == 2 && a.write && !b.write) continue;  // gated in-band
          if (!hb.before(a.op, b.op)) race(a.op, b.op);
        }
      if (key.space != 2 || inplace) continue;
      for (const verify::Access& w : acc) {
        if (!w.write) continue;
        for (const verify::Access& a : acc)
          if (!hb.before_reuse(a.op, w.op)) race(a.op, w.op);
      }
    }
  }
}

}  // namespace mk::test_ref
