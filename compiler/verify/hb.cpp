#include "compiler/verify/hb.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <set>

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
  // Dense location index: rank-major, then input, output, scratch.
  const int32_t cin = ir::buf_chunks(s, Buf::input), cout = ir::buf_chunks(s, Buf::output);
  const int64_t per_rank = int64_t(cin) + cout + s.scratch;
  auto dense = [&](const LocKey& k) {
    int64_t off = k.space == 0 ? 0 : k.space == 1 ? cin : int64_t(cin) + cout;
    return size_t(int64_t(k.rank) * per_rank + off + k.index);
  };
  std::vector<std::vector<Access>> by_loc(size_t(per_rank * s.nranks));
  std::vector<std::pair<LocKey, bool>> mine;
  for (size_t oi = 0; oi < s.ops.size(); ++oi) {
    const Op& op = s.ops[oi];
    if (!op.is_data()) continue;
    // One access per location per op; a write wins over a read.
    mine.clear();
    for (const Ref& r : op.srcs)
      for (int32_t k = 0; k < r.count; ++k) mine.push_back({loc_key(s, r.at(k), inplace), false});
    for (const Ref& r : op.dsts)
      for (int32_t k = 0; k < r.count; ++k) {
        LocKey key = loc_key(s, r.at(k), inplace);
        if (op.kind == OpKind::copy && key == loc_key(s, op.srcs[0].at(k), inplace)) continue;
        mine.push_back({key, true});
      }
    std::sort(mine.begin(), mine.end(), [](const auto& a, const auto& b) {
      return a.first < b.first || (a.first == b.first && a.second > b.second);
    });
    for (size_t i = 0; i < mine.size(); ++i) {
      if (i && mine[i].first == mine[i - 1].first) continue;  // writes sort first
      by_loc[dense(mine[i].first)].push_back({oi, mine[i].second});
    }
  }
  AccessMap out;
  for (int32_t r = 0; r < s.nranks; ++r)
    for (int32_t space = 0; space < 3; ++space) {
      int32_t size = space == 0 ? cin : space == 1 ? cout : s.scratch;
      for (int32_t i = 0; i < size; ++i) {
        LocKey k{r, space, i};
        auto& v = by_loc[dense(k)];
        if (!v.empty()) out.emplace_back(k, std::move(v));
      }
    }
  return out;
}

bool HB::before(size_t a, size_t b) const {
  int32_t da = data_index[a], db = data_index[b];
  return da >= 0 && db >= 0 && a != b && within.test(size_t(db), size_t(da));
}

bool HB::before_reuse(size_t a, size_t b) const {
  int32_t da = data_index[a], db = data_index[b];
  return da >= 0 && db >= 0 && cross.test(size_t(db), size_t(da));
}

namespace {

std::string tb_name(const Op& op) { return fmt::format("rank {} tb {}", op.rank, op.tb); }

}  // namespace

HB build_hb(const Schedule& s) {
  const size_t n = s.ops.size();
  HB hb;
  hb.data_index.assign(n, -1);
  size_t ndata = 0;
  for (size_t i = 0; i < n; ++i)
    if (s.ops[i].is_data()) hb.data_index[i] = int32_t(ndata++);

  // Signals and waits by (rank, slot).
  std::map<std::pair<int32_t, int32_t>, std::vector<size_t>> signals, waits;
  for (size_t i = 0; i < n; ++i) {
    const Op& op = s.ops[i];
    if (op.kind == OpKind::signal) signals[{op.peer, op.slot}].push_back(i);
    if (op.kind == OpKind::wait) waits[{op.rank, op.slot}].push_back(i);
  }
  for (auto& [key, ws] : waits) {
    auto it = signals.find(key);
    if (it == signals.end())
      throw Error(ErrId::verify_E011,
                  fmt::format("{}: {} waits on slot {} of rank {}, which nothing signals", s.name,
                              describe_op(s, ws[0]), key.second, key.first),
                  s.ops[ws[0]].loc, "the wait would spin forever");
    if (it->second.size() != 1)
      throw Error(ErrId::verify_E011,
                  fmt::format("{}: slot {} of rank {} is signalled by {} ops ({} and {}); each "
                              "slot needs exactly one signaller",
                              s.name, key.second, key.first, it->second.size(),
                              describe_op(s, it->second[0]), describe_op(s, it->second[1])),
                  s.ops[it->second[1]].loc);
  }
  for (auto& [key, ss] : signals)
    if (!waits.count(key))
      throw Error(ErrId::verify_E011,
                  fmt::format("{}: {} signals slot {} of rank {}, but nothing waits on it", s.name,
                              describe_op(s, ss[0]), key.second, key.first),
                  s.ops[ss[0]].loc);

  // Edges. `hb_preds` carry ordering; `gate_preds` (LL) only block.
  std::vector<std::vector<size_t>> hb_preds(n), gate_preds(n);
  {
    std::map<std::pair<int32_t, int32_t>, std::vector<size_t>> by_tb;
    for (size_t i = 0; i < n; ++i) by_tb[{s.ops[i].rank, s.ops[i].tb}].push_back(i);
    for (auto& [key, list] : by_tb) {
      for (size_t k = 1; k < list.size(); ++k) hb_preds[list[k]].push_back(list[k - 1]);
    }
  }
  for (auto& [key, ws] : waits) {
    size_t sig = signals[key][0];
    for (size_t w : ws)
      if (s.ops[w].iter == 0) hb_preds[w].push_back(sig);
  }
  if (s.proto == ir::Proto::ll) {
    // LL: the unique writer of a scratch slot in a step gates its readers.
    for (auto& [key, acc] : accesses(s, false)) {
      if (key.space != 2) continue;
      std::vector<size_t> writers;
      for (auto& a : acc)
        if (a.write) writers.push_back(a.op);
      if (writers.size() > 1)
        throw Error(ErrId::verify_E014,
                    fmt::format("{}: LL scratch slot r{}.sc[{}] is written by {} and {} in one step",
                                s.name, key.rank, key.index, describe_op(s, writers[0]),
                                describe_op(s, writers[1])),
                    s.ops[writers[1]].loc, "use the simple protocol, or one slot per write");
      for (auto& a : acc)
        if (!a.write && !writers.empty() && a.op != writers[0]) gate_preds[a.op].push_back(writers[0]);
    }
  }

  // Topological order over all edges (deadlock check).
  std::vector<std::vector<size_t>> succ(n);
  std::vector<size_t> indeg(n, 0);
  for (size_t v = 0; v < n; ++v)
    for (const auto* preds : {&hb_preds[v], &gate_preds[v]})
      for (size_t p : *preds) {
        succ[p].push_back(v);
        ++indeg[v];
      }
  std::vector<size_t> ready;
  for (size_t v = 0; v < n; ++v)
    if (indeg[v] == 0) ready.push_back(v);
  std::reverse(ready.begin(), ready.end());
  while (!ready.empty()) {
    size_t v = ready.back();
    ready.pop_back();
    hb.topo.push_back(v);
    for (size_t w : succ[v])
      if (--indeg[w] == 0) ready.push_back(w);
  }
  if (hb.topo.size() != n) {
    // Find a cycle among the ops that never became ready.
    std::vector<int> state(n, 0);  // 0 unseen, 1 on stack, 2 done
    std::vector<size_t> stack;
    std::vector<size_t> cycle;
    std::function<bool(size_t)> dfs = [&](size_t v) -> bool {
      state[v] = 1;
      stack.push_back(v);
      for (const auto* preds : {&hb_preds[v], &gate_preds[v]})
        for (size_t p : *preds) {
          if (indeg[p] == 0 && state[p] == 0) continue;
          if (state[p] == 1) {
            auto it = std::find(stack.begin(), stack.end(), p);
            cycle.assign(it, stack.end());
            return true;
          }
          if (state[p] == 0 && dfs(p)) return true;
        }
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
                n ? s.ops[at].loc : SrcLoc{},
                "a thread block waits for something that itself waits for that thread block");
  }

  // Closures, in topological order, stored for data ops only. Each thread
  // block keeps a running row ("everything that happened before here"); a data
  // op snapshots it; a signal shares the snapshot of the data op before it
  // unless waits came in between (then it gets a row of its own).
  std::map<std::pair<int32_t, int32_t>, size_t> chain_of;
  for (size_t i = 0; i < n; ++i) chain_of.emplace(std::make_pair(s.ops[i].rank, s.ops[i].tb), chain_of.size());
  const size_t nchains = chain_of.size();
  std::vector<size_t> chain(n);
  for (size_t i = 0; i < n; ++i) chain[i] = chain_of[{s.ops[i].rank, s.ops[i].tb}];

  // Pass 1: within a step.
  hb.within.assign(ndata, ndata);
  BitRows run(nchains, ndata), extra(0, ndata);
  std::vector<int64_t> last_data(nchains, -1);  // row (dense index) of the chain's last data op
  std::vector<bool> dirty(nchains, false);      // waits since that data op
  // signal -> (is_extra, row)
  std::vector<std::pair<bool, size_t>> sig_row(n, {false, 0});
  auto row_of = [&](size_t sig) -> std::pair<const BitRows*, size_t> {
    auto [ex, r] = sig_row[sig];
    return {ex ? &extra : &hb.within, r};
  };
  std::map<std::pair<int32_t, int32_t>, size_t> signal_at;
  for (auto& [key, ss] : signals) signal_at[key] = ss[0];
  auto snapshot_signal = [&](size_t v, size_t ch, BitRows& rows, std::vector<std::pair<bool, size_t>>& where,
                             BitRows& extras, const std::vector<int64_t>& last, const std::vector<bool>& dirt,
                             BitRows& running) {
    if (!dirt[ch] && last[ch] >= 0) {
      where[v] = {false, size_t(last[ch])};
    } else {
      size_t r = extras.add_row();
      extras.copy_row(r, running, ch);
      where[v] = {true, r};
    }
    (void)rows;
  };
  for (size_t v : hb.topo) {
    const Op& op = s.ops[v];
    const size_t ch = chain[v];
    if (op.kind == OpKind::wait && op.iter == 0) {
      auto [rows, r] = row_of(signal_at[{op.rank, op.slot}]);
      run.or_from(ch, *rows, r);
      dirty[ch] = true;
    } else if (op.is_data()) {
      const size_t d = size_t(hb.data_index[v]);
      run.set(ch, d);
      hb.within.copy_row(d, run, ch);
      last_data[ch] = int64_t(d);
      dirty[ch] = false;
    } else if (op.kind == OpKind::signal) {
      snapshot_signal(v, ch, hb.within, sig_row, extra, last_data, dirty, run);
    }
  }
  // Gate (LL) edges give no ordering, so nothing to add for them.

  // Pass 2: across steps. cross row = data ops of step g that happen before
  // this op at step g + depth: the whole chain of step g (program order runs on
  // into the next steps), plus what waits bring: iter 0 waits the signaller's
  // cross row, iter < 0 waits the signaller's within row.
  hb.cross.assign(ndata, ndata);
  BitRows xrun(nchains, ndata), xextra(0, ndata);
  for (size_t ch = 0; ch < nchains; ++ch) xrun.copy_row(ch, run, ch);  // run holds each chain's final clock
  std::vector<int64_t> xlast(nchains, -1);
  std::vector<bool> xdirty(nchains, true);
  std::vector<std::pair<bool, size_t>> xsig_row(n, {false, 0});
  for (size_t v : hb.topo) {
    const Op& op = s.ops[v];
    const size_t ch = chain[v];
    if (op.kind == OpKind::wait) {
      size_t sig = signal_at[{op.rank, op.slot}];
      if (op.iter == 0) {
        auto [ex, r] = xsig_row[sig];
        xrun.or_from(ch, ex ? xextra : hb.cross, r);
      } else {
        auto [rows, r] = row_of(sig);
        xrun.or_from(ch, *rows, r);
      }
      xdirty[ch] = true;
    } else if (op.is_data()) {
      const size_t d = size_t(hb.data_index[v]);
      hb.cross.copy_row(d, xrun, ch);
      xlast[ch] = int64_t(d);
      xdirty[ch] = false;
    } else if (op.kind == OpKind::signal) {
      snapshot_signal(v, ch, hb.cross, xsig_row, xextra, xlast, xdirty, xrun);
    }
  }
  for (const Op& op : s.ops)
    if (op.kind == OpKind::wait && op.iter < 0 && op.iter != -1 && op.iter != -s.depth)
      throw Error(ErrId::verify_E011,
                  fmt::format("{}: a wait reaches back {} steps; only 1 or the depth ({}) are allowed", s.name,
                              -op.iter, s.depth),
                  op.loc);
  return hb;
}

void verify_sync(const Schedule& s) {
  verify_bounds(s);
  HB hb = build_hb(s);
  const bool ll = s.proto == ir::Proto::ll;
  auto race = [&](size_t a, size_t b, const LocKey& key, const char* what) {
    static const char* spaces[] = {"in", "out", "sc"};
    throw Error(ErrId::verify_E004,
                fmt::format("{}: race on r{}.{}[{}] {}: {} and {} are not ordered by "
                            "signal/wait{}",
                            s.name, key.rank, spaces[key.space], key.index, what,
                            describe_op(s, a), describe_op(s, b),
                            hb.before(b, a) ? " (they are ordered, but against program order)" : ""),
                s.ops[b].loc, "insert_sync orders every conflict; a hand-written or imported "
                              "schedule needs a dependency here");
  };
  for (bool inplace : {false, true}) {
    for (auto& [key, acc] : accesses(s, inplace)) {
      for (size_t i = 0; i < acc.size(); ++i)
        for (size_t j = i + 1; j < acc.size(); ++j) {
          const Access &a = acc[i], &b = acc[j];
          if (!a.write && !b.write) continue;
          if (a.op == b.op) continue;
          if (ll && key.space == 2 && a.write && !b.write) continue;  // gated in-band
          if (!hb.before(a.op, b.op))
            race(a.op, b.op, key, inplace ? "within a step (in-place)" : "within a step");
        }
      if (key.space != 2 || inplace) continue;
      // Scratch is reused `depth` steps later: every access of step g must
      // happen before every write of step g + depth.
      for (const Access& w : acc) {
        if (!w.write) continue;
        for (const Access& a : acc)
          if (!hb.before_reuse(a.op, w.op)) race(a.op, w.op, key, "between steps (scratch reuse)");
      }
    }
  }
}

}  // namespace mk::verify
