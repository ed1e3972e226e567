// Rank symmetry in the sync analyses (compiler/verify/symmetry.hpp): which
// symmetries are found, and that deciding and checking once per rank class
// gives the same edges and verdicts as the walk over every op.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <limits>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "compiler/passes/passes.hpp"
#include "compiler/pipeline.hpp"
#include "compiler/topology/topology.hpp"
#include "compiler/verify/clocks.hpp"
#include "compiler/verify/hb.hpp"
#include "compiler/verify/symmetry.hpp"
#include "compiler/verify/verify.hpp"
#include "mk/dsl.hpp"
#include "support.hpp"
#include "tests/unit/ref_sync.hpp"
#include "tests/unit/sync_util.hpp"

using namespace mk;

namespace {

using verify::SymMode;

using test_sync::before_sync;
using test_sync::verdict;

// The symmetry of a synced schedule's signal -> wait graph, as verify_sync sees it.
verify::RankSymmetry sync_symmetry(const ir::Schedule& s) {
  const verify::SyncGraph g = verify::build_sync_graph(s);
  const verify::ChainIndex ci(s, g.chain, g.pos, g.nchains);
  return verify::SymmetryFinder::find(
      s, ci, [&](size_t u, size_t v) { return s.ops[u].kind == s.ops[v].kind && s.ops[u].iter == s.ops[v].iter; },
      [&](size_t v, std::vector<std::pair<int64_t, int32_t>>& out) {
        if (g.signal[v] >= 0) out.push_back({g.signal[v], 0});
      });
}

struct Case {
  std::string name;
  int n;
  const char* topo;
};

// The synced built-ins the mutation tests change.
std::vector<Case> mutated_cases() {
  return {{"allreduce.ring", 4, ""},          {"allgather.ring", 5, ""},
          {"allreduce.two_shot", 4, ""},      {"allreduce.halving_doubling", 8, ""},
          {"alltoall.direct", 4, ""},         {"allreduce.hier", 8, "2x4:direct"},
          {"allgather.hier", 8, "4x2:direct"}, {"reducescatter.hier", 8, "4x2:direct"}};
}

}  // namespace

TEST_CASE("symmetry: candidates from the rank count and topology") {
  ir::Schedule s;
  s.nranks = 8;
  auto names = [&] {
    std::vector<std::string> v;
    for (auto& [name, pi] : verify::candidate_generators(s)) v.push_back(name);
    return v;
  };
  CHECK(names() == std::vector<std::string>{"rotation", "xor 1", "xor 2", "xor 4"});
  s.topology = topology::parse("2x4:direct", 8);
  // on 2 nodes, xor 4 is the node rotation: listed once
  CHECK(names() == std::vector<std::string>{"rotation", "node rotation", "rotation in a node", "xor 1", "xor 2"});
  s.nranks = 6;
  s.topology = topology::parse("3x2:direct", 6);
  // a rotation in a node of 2 is xor 1, which 6 ranks do not offer: listed once
  CHECK(names() == std::vector<std::string>{"rotation", "node rotation", "rotation in a node"});
  auto gens = verify::candidate_generators(s);
  CHECK(gens[1].second == std::vector<int32_t>{2, 3, 4, 5, 0, 1});
  CHECK(gens[2].second == std::vector<int32_t>{1, 0, 3, 2, 5, 4});
}

TEST_CASE("symmetry: the classes found for built-ins after sync") {
  struct Want {
    Case c;
    size_t orbits;
  };
  for (const Want& w : std::vector<Want>{{{"allgather.ring", 6, ""}, 1},
                                         {{"allreduce.ring", 5, ""}, 1},
                                         {{"allreduce.halving_doubling", 8, ""}, 1},
                                         {{"alltoall.direct", 4, ""}, 1},
                                         {{"allreduce.hier", 8, "2x4:direct"}, 1},
                                         {{"allgather.hier", 12, "3x4:direct"}, 1},
                                         {{"broadcast.direct", 4, ""}, 4}}) {
    CAPTURE(w.c.name);
    CAPTURE(w.c.n);
    for (const ir::Schedule& pre : before_sync(w.c.name, w.c.n, w.c.topo)) {
      const ir::Schedule s = passes::insert_sync(pre);
      const verify::RankSymmetry sym = sync_symmetry(s);
      CAPTURE(sym.describe());
      CHECK(sym.orbits() == w.orbits);
      // every rank's element takes its representative to it, and undoes itself
      for (int32_t r = 0; r < s.nranks; ++r) {
        if (sym.trivial()) break;
        CHECK(sym.to(r)[sym.rep(r)] == r);
        for (int32_t x = 0; x < s.nranks; ++x) CHECK(sym.from(r)[sym.to(r)[x]] == x);
      }
    }
  }
}

TEST_CASE("insert_sync by symmetry: the same edges as the walk over every op") {
  int symmetric = 0;
  std::vector<Case> cases;
  for (const auto& info : dsl::registered_schedules())
    for (int n : {2, 3, 4, 6, 8, 16}) cases.push_back({info.name, n, ""});
  for (const char* name : {"allreduce.hier", "allgather.hier", "reducescatter.hier"})
    for (const char* topo : {"2x2:direct", "2x4:direct", "4x2:direct", "3x4:direct", "4x4:direct"})
      cases.push_back({name, 0, topo});
  for (const Case& c : cases) {
    const int n = c.n ? c.n : topology::parse(c.topo, 0).nranks();
    CAPTURE(c.name);
    CAPTURE(n);
    CAPTURE(c.topo);
    for (const ir::Schedule& s : before_sync(c.name, n, c.topo)) {
      const passes::SyncNeeds needs = passes::sync_needs(s);
      const auto want = passes::sync_edges(s, needs, verify::kClockBudget, SymMode::off);
      bool used = true;
      try {
        (void)passes::sync_edges(s, needs, verify::kClockBudget, SymMode::required);
      } catch (const InternalError&) {
        used = false;
      }
      symmetric += used;
      const auto got = passes::sync_edges(s, needs, verify::kClockBudget, SymMode::automatic);
      REQUIRE(got.size() == want.size());
      for (size_t k = 0; k < got.size(); ++k)
        if (got[k].from != want[k].from || got[k].to != want[k].to || got[k].iter != want[k].iter) {
          FAIL_CHECK("edge " << k << ": " << got[k].from << "->" << got[k].to << " iter " << got[k].iter
                             << ", the plain walk has " << want[k].from << "->" << want[k].to << " iter "
                             << want[k].iter);
          break;
        }
    }
  }
  // Most built-ins are symmetric, so the comparison exercised the symmetric path.
  CHECK(symmetric > 100);
}

TEST_CASE("verify_sync by symmetry: the same verdict as the dense closure, with waits broken on one rank") {
  // A wait dropped, turned around or moved on one rank breaks that rank's
  // symmetry: the check must see it (and fall back to the plain walk) or, if
  // the broken rank still maps onto the others, give the same verdict anyway.
  std::mt19937 rng(11);
  int races = 0, fine = 0, used = 0;
  for (const Case& c : mutated_cases()) {
    for (const ir::Schedule& pre : before_sync(c.name, c.n, c.topo)) {
      ir::Schedule s = passes::insert_sync(pre);
      CAPTURE(c.name);
      CHECK_NOTHROW(verify::verify_sync_budget(s, verify::kClockBudget, SymMode::required));
      std::vector<size_t> waits;
      for (size_t i = 0; i < s.ops.size(); ++i)
        if (s.ops[i].kind == ir::OpKind::wait) waits.push_back(i);
      for (int trial = 0; trial < 16 && !waits.empty(); ++trial) {
        ir::Schedule t = s;
        const size_t wi = waits[rng() % waits.size()];
        const ir::Op w = t.ops[wi];
        switch (trial % 4) {
          case 0:  // this wait's slot names another signaller's slot on the same rank
          {
            int32_t other = -1;
            for (size_t k : waits)
              if (t.ops[k].rank == w.rank && t.ops[k].slot != w.slot) other = t.ops[k].slot;
            if (other < 0) continue;
            t.ops[wi].slot = other;
            break;
          }
          case 1: t.ops[wi].iter = w.iter == 0 ? -t.depth : 0; break;
          case 2: {  // swap the wait with the data op after it
            size_t k = wi + 1;
            while (k < t.ops.size() && !(t.ops[k].rank == w.rank && t.ops[k].tb == w.tb && t.ops[k].is_data())) ++k;
            if (k == t.ops.size()) continue;
            std::swap(t.ops[wi], t.ops[k]);
            break;
          }
          case 3: {  // swap the wait with the data op before it
            size_t k = wi;
            while (k > 0 && !(t.ops[k - 1].rank == w.rank && t.ops[k - 1].tb == w.tb && t.ops[k - 1].is_data())) --k;
            if (k == 0) continue;
            std::swap(t.ops[wi], t.ops[k - 1]);
            break;
          }
        }
        const std::string want = verdict([&] { test_ref::ref_verify_sync(t); });
        CAPTURE(trial);
        CAPTURE(want);
        CHECK(verdict([&] { verify::verify_sync_budget(t, verify::kClockBudget, SymMode::automatic); }) == want);
        CHECK(verdict([&] { verify::verify_sync_budget(t, verify::kClockBudget, SymMode::off); }) == want);
        try {
          verify::verify_sync_budget(t, verify::kClockBudget, SymMode::required);
          ++used;  // still symmetric (the change was on every rank's image, or harmless)
        } catch (const InternalError&) {
        } catch (const Error&) {
          ++used;
        }
        (want.empty() ? fine : races)++;
      }
    }
  }
  CHECK(races > 10);
  CHECK(fine > 0);
  MESSAGE("mutated schedules still symmetric: " << used);
}

TEST_CASE("verify_sync by symmetry: a race on one rank only is found") {
  // allgather.ring at 4 ranks, synced; on rank 2 alone a wait is moved after
  // the data op it guards, so rank 2 no longer maps onto the others: the
  // symmetric walk must not apply, and the race is reported.
  ir::Schedule s = passes::insert_sync(before_sync("allgather.ring", 4).back());
  size_t wi = s.ops.size();
  for (size_t i = 0; i < s.ops.size() && wi == s.ops.size(); ++i)
    if (s.ops[i].kind == ir::OpKind::wait && s.ops[i].rank == 2 && s.ops[i].iter == 0) wi = i;
  REQUIRE(wi < s.ops.size());
  size_t k = wi + 1;
  while (!(s.ops[k].rank == 2 && s.ops[k].tb == s.ops[wi].tb && s.ops[k].is_data())) ++k;
  std::swap(s.ops[wi], s.ops[k]);
  CHECK(verdict([&] { verify::verify_sync(s); }) == "mk.verify.E004");
  CHECK_THROWS_AS(verify::verify_sync_budget(s, verify::kClockBudget, SymMode::required), InternalError);
  CHECK(sync_symmetry(s).orbits() > 1);
}

namespace {

std::string show(const std::vector<verify::Need>& v, size_t k) {
  if (k >= v.size()) return "nothing";
  return fmt::format("{} -> {} at r{} space {} [{}]", v[k].a, v[k].b, v[k].at.rank, v[k].at.space, v[k].at.index);
}

// Sorted by (b, a), once each with its least location (written here, not
// taken from the code under test).
verify::AccessNeeds normal(verify::AccessNeeds n) {
  for (auto* v : {&n.within, &n.reuse, &n.gates}) {
    std::sort(v->begin(), v->end(), [](const verify::Need& x, const verify::Need& y) {
      return std::tie(x.b, x.a, x.at) < std::tie(y.b, y.a, y.at);
    });
    v->erase(std::unique(v->begin(), v->end(),
                         [](const verify::Need& x, const verify::Need& y) { return x.a == y.a && x.b == y.b; }),
             v->end());
  }
  return n;
}

void same_needs(const verify::AccessNeeds& got_raw, const verify::AccessNeeds& want_raw) {
  const verify::AccessNeeds got = normal(got_raw), want = normal(want_raw);
  for (auto [g, w, what] : {std::tuple{&got.within, &want.within, "within"}, std::tuple{&got.reuse, &want.reuse, "reuse"},
                            std::tuple{&got.gates, &want.gates, "gates"}}) {
    CAPTURE(what);
    CHECK(g->size() == w->size());
    for (size_t k = 0; k < std::max(g->size(), w->size()); ++k)
      if (k >= g->size() || k >= w->size() || (*g)[k].a != (*w)[k].a || (*g)[k].b != (*w)[k].b ||
          !((*g)[k].at == (*w)[k].at)) {
        FAIL_CHECK("pair " << k << ": " << show(*g, k) << ", by chunk " << show(*w, k));
        break;
      }
  }
  CHECK(got.double_write.has_value() == want.double_write.has_value());
  if (got.double_write && want.double_write) {
    CHECK(got.double_write->a == want.double_write->a);
    CHECK(got.double_write->b == want.double_write->b);
    CHECK(got.double_write->at == want.double_write->at);
  }
}

}  // namespace

TEST_CASE("access_needs: by ranges the same pairs as the chunk-level table, for every built-in and both aliasings") {
  std::vector<Case> cases;
  for (const auto& info : dsl::registered_schedules())
    for (int n : {2, 3, 4, 5, 8, 16}) cases.push_back({info.name, n, ""});
  for (const char* name : {"allreduce.hier", "allgather.hier", "reducescatter.hier"})
    for (const char* topo : {"2x2:direct", "2x4:direct", "3x4:direct"}) cases.push_back({name, 0, topo});
  cases.push_back({"allreduce.halving_doubling", 64, ""});
  int pairs = 0;
  for (const Case& c : cases) {
    const int n = c.n ? c.n : topology::parse(c.topo, 0).nranks();
    CAPTURE(c.name);
    CAPTURE(n);
    CAPTURE(c.topo);
    for (const ir::Schedule& s : before_sync(c.name, n, c.topo))
      for (bool inplace : {false, true})
        for (bool ll : {false, true}) {
          CAPTURE(inplace);
          CAPTURE(ll);
          const verify::AccessNeeds want = verify::access_needs_by_chunks(s, inplace, ll);
          same_needs(verify::access_needs_by_ranges(s, inplace, ll), want);
          pairs += int(want.within.size());
        }
  }
  CHECK(pairs > 10000);
}

TEST_CASE("access_needs: overlapping refs, copies onto themselves and partial in-place aliasing") {
  // Hand-made ops over ranges that overlap in every way: one op reading and
  // writing the same chunks, a copy whose destination is partly its own
  // source in-place, a reduce-scatter input range straddling the aliased part.
  ir::Schedule s;
  s.name = "ranges";
  s.coll = Collective::reducescatter;
  s.nranks = 2;
  s.chunks = 4;
  s.scratch = 8;
  auto op = [&](ir::OpKind k, int32_t rank, std::vector<ir::Ref> srcs, std::vector<ir::Ref> dsts) {
    ir::Op o;
    o.id = int32_t(s.ops.size());
    o.kind = k;
    o.rank = rank;
    o.tb = 0;
    o.srcs = std::move(srcs);
    o.dsts = std::move(dsts);
    s.ops.push_back(std::move(o));
  };
  using ir::Buf;
  auto R = [](Buf b, int32_t rank, int32_t index, int32_t count) { return ir::Ref{rank, b, index, count}; };
  op(ir::OpKind::copy, 0, {R(Buf::input, 0, 0, 6)}, {R(Buf::scratch, 0, 1, 6)});
  op(ir::OpKind::reduce, 0, {R(Buf::scratch, 0, 0, 4), R(Buf::scratch, 0, 2, 4)}, {R(Buf::scratch, 0, 2, 4)});
  op(ir::OpKind::copy, 1, {R(Buf::input, 1, 2, 4)}, {R(Buf::output, 1, 0, 4)});  // in-place: half onto itself
  op(ir::OpKind::copy, 1, {R(Buf::input, 1, 4, 4)}, {R(Buf::output, 1, 0, 4)});  // in-place: onto itself
  op(ir::OpKind::copy, 0, {R(Buf::scratch, 0, 3, 3)}, {R(Buf::scratch, 0, 0, 3), R(Buf::scratch, 0, 5, 3)});
  op(ir::OpKind::reduce, 1, {R(Buf::input, 1, 0, 8), R(Buf::output, 1, 0, 4)}, {R(Buf::output, 1, 0, 4)});
  op(ir::OpKind::copy, 0, {R(Buf::scratch, 0, 0, 8)}, {R(Buf::output, 0, 0, 4), R(Buf::scratch, 0, 4, 4)});
  for (bool inplace : {false, true})
    for (bool ll : {false, true}) {
      CAPTURE(inplace);
      CAPTURE(ll);
      const verify::AccessNeeds want = verify::access_needs_by_chunks(s, inplace, ll);
      CHECK(!want.within.empty());
      CHECK(want.double_write.has_value());
      same_needs(verify::access_needs_by_ranges(s, inplace, ll), want);
    }
}

TEST_CASE("verify_sync by symmetry: ops without a thread block (tb -1) are a chain of their own") {
  // A synced schedule read from JSON may leave tb at -1: number_chains gives
  // those ops a chain per rank, and the symmetry must index it like any other
  // (it read and wrote before its table, or aliased the previous rank's last
  // thread block).
  for (int32_t moved : {0, 1}) {
    ir::Schedule s = passes::insert_sync(before_sync("allgather.ring", 4).back());
    for (ir::Op& op : s.ops)
      if (op.tb == moved) op.tb = -1;
    CAPTURE(moved);
    const std::string want = verdict([&] { test_ref::ref_verify_sync(s); });
    CHECK(verdict([&] { verify::verify_sync_budget(s, verify::kClockBudget, SymMode::off); }) == want);
    CHECK(verdict([&] { verify::verify_sync_budget(s, verify::kClockBudget, SymMode::required); }) == want);
    CHECK(sync_symmetry(s).orbits() == 1);
  }
}

namespace {

// The same change at the same place (thread block, position) of every rank:
// a sync op of rank 0 is picked; a wait's iter is flipped (0 <-> -depth), or
// a wait is swapped with the op after it, a signal with the op before it.
// false when nothing changed.
bool change_everywhere(const ir::Schedule& s, std::mt19937& rng, int trial, ir::Schedule& t) {
  const verify::Chains ch = verify::number_chains(s, false);
  std::map<std::tuple<int32_t, int32_t, int32_t>, size_t> at;  // (rank, tb, place) -> op
  for (size_t i = 0; i < s.ops.size(); ++i) at[{s.ops[i].rank, s.ops[i].tb, ch.pos[i]}] = i;
  std::vector<size_t> rank0;
  for (size_t i = 0; i < s.ops.size(); ++i)
    if (s.ops[i].rank == 0 && !s.ops[i].is_data()) rank0.push_back(i);
  if (rank0.empty()) return false;
  const size_t pick = rank0[rng() % rank0.size()];
  const int32_t tb = s.ops[pick].tb, pos = ch.pos[pick];
  t = s;
  bool changed = false;
  for (int32_t r = 0; r < s.nranks; ++r) {
    auto it = at.find({r, tb, pos});
    if (it == at.end() || t.ops[it->second].kind != s.ops[pick].kind) continue;
    const size_t i = it->second;
    if (trial % 3 == 0 && t.ops[i].kind == ir::OpKind::wait) {
      t.ops[i].iter = t.ops[i].iter == 0 ? -t.depth : 0;
      changed = true;
      continue;
    }
    auto other = at.find({r, tb, t.ops[i].kind == ir::OpKind::wait ? pos + 1 : pos - 1});
    if (other == at.end()) continue;
    std::swap(t.ops[i], t.ops[other->second]);
    changed = true;
  }
  return changed;
}

}  // namespace

TEST_CASE("verify_sync by symmetry: races on every rank alike are found as by the dense closure") {
  // The symmetric walk must not prove what is racy: the same change at the
  // same place of every rank's thread block keeps the schedule symmetric, so
  // the walk by symmetry applies and its verdict must be the dense closure's.
  std::mt19937 rng(5);
  int races = 0, fine = 0;
  for (const Case& c : mutated_cases()) {
    for (const ir::Schedule& pre : before_sync(c.name, c.n, c.topo)) {
      const ir::Schedule s = passes::insert_sync(pre);
      CAPTURE(c.name);
      for (int trial = 0; trial < 12; ++trial) {
        ir::Schedule t;
        if (!change_everywhere(s, rng, trial, t)) continue;
        const std::string want = verdict([&] { test_ref::ref_verify_sync(t); });
        CAPTURE(trial);
        CAPTURE(want);
        CHECK(verdict([&] { verify::verify_sync_budget(t, verify::kClockBudget, SymMode::required); }) == want);
        CHECK(verdict([&] { verify::verify_sync_budget(t, verify::kClockBudget, SymMode::off); }) == want);
        (want.empty() ? fine : races)++;
      }
    }
  }
  MESSAGE("symmetric mutations: " << races << " racy, " << fine << " fine");
  CHECK(races > 10);
  CHECK(fine > 0);
}

namespace {

// A random schedule before sync that every rank runs alike: a template of
// data ops, each emitted for every rank in turn, its refs on ranks relative to
// the executing one by rotation (mode 0), xor (1) or node and in-node rotation
// (2). `break_one`: one op of rank 1 reads another chunk, so rank 1 no longer
// maps onto the others.
ir::Schedule symmetric_random(std::mt19937& rng, int mode, bool break_one) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  ir::Schedule s;
  s.name = "random";
  int nodes = 1, g = 1;
  if (mode == 0) s.nranks = pick(3, 6);
  if (mode == 1) s.nranks = pick(0, 1) ? 4 : 8;
  if (mode == 2) {
    nodes = pick(2, 3), g = pick(2, 3);
    s.nranks = nodes * g;
    s.topology = topology::parse(fmt::format("{}x{}:direct", nodes, g), s.nranks);
  }
  const int32_t n = s.nranks;
  s.chunks = pick(1, 2);
  s.scratch = pick(1, 4);
  s.depth = pick(1, 2);
  s.tbs = pick(1, 3);
  auto peer = [&](int32_t r, int32_t d) {
    if (mode == 0) return (r + d) % n;
    if (mode == 1) return r ^ d;
    return ((r / g + d / g) % nodes) * g + (r % g + d % g) % g;
  };
  struct Tmpl {
    ir::OpKind kind;
    int32_t tb;
    std::vector<std::pair<int32_t, ir::Ref>> srcs, dsts;  // (relative rank, ref)
  };
  std::vector<Tmpl> program;
  for (int k = 0, nops = pick(2, 10); k < nops; ++k) {
    Tmpl t{pick(0, 2) ? ir::OpKind::copy : ir::OpKind::reduce, int32_t(pick(0, s.tbs - 1)), {}, {}};
    auto ref = [&](bool dst) {
      ir::Ref r;
      r.buf = dst ? ir::Buf(pick(1, 2)) : ir::Buf(pick(0, 2));
      r.index = pick(0, ir::buf_chunks(s, r.buf) - 1);
      return std::make_pair(int32_t(pick(0, 2) ? 0 : pick(1, n - 1)), r);
    };
    for (int i = 0, m = t.kind == ir::OpKind::reduce ? 2 : 1; i < m; ++i) t.srcs.push_back(ref(false));
    t.dsts.push_back(ref(true));
    program.push_back(std::move(t));
  }
  const int broken = break_one ? pick(0, int(program.size()) - 1) : -1;
  for (size_t k = 0; k < program.size(); ++k)
    for (int32_t r = 0; r < n; ++r) {
      ir::Op op;
      op.id = int32_t(s.ops.size());
      op.kind = program[k].kind;
      op.rank = r;
      op.tb = program[k].tb;
      for (auto [d, ref] : program[k].srcs) op.srcs.push_back({peer(r, d), ref.buf, ref.index, 1});
      for (auto [d, ref] : program[k].dsts) op.dsts.push_back({peer(r, d), ref.buf, ref.index, 1});
      if (int(k) == broken && r == 1) {
        ir::Ref& x = op.srcs[0];
        x.index = (x.index + 1) % ir::buf_chunks(s, x.buf);
        x.buf = x.index == 0 ? ir::Buf((int(x.buf) + 1) % 3) : x.buf;
        x.index = std::min(x.index, ir::buf_chunks(s, x.buf) - 1);
      }
      s.ops.push_back(std::move(op));
    }
  return s;
}

bool same_edges(const std::vector<passes::SyncEdge>& a, const std::vector<passes::SyncEdge>& b) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k)
    if (a[k].from != b[k].from || a[k].to != b[k].to || a[k].iter != b[k].iter) return false;
  return true;
}

}  // namespace

TEST_CASE("sync by symmetry: random schedules every rank runs alike, and with one rank changed") {
  // The same edges as the plain walk and the dense closure, and the synced
  // schedule proved by both walks.
  std::mt19937 rng(23);
  int symmetric = 0, proved_by_symmetry = 0, broken = 0, changed_racy = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const int mode = trial % 3;
    const bool break_one = trial % 5 == 4;
    const ir::Schedule s = symmetric_random(rng, mode, break_one);
    CAPTURE(trial);
    CAPTURE(ir::print(s));
    const passes::SyncNeeds needs = passes::sync_needs(s);
    const auto plain = passes::sync_edges(s, needs, verify::kClockBudget, SymMode::off);
    CHECK(same_edges(passes::sync_edges(s, needs, verify::kClockBudget, SymMode::automatic), plain));
    std::vector<passes::SyncEdge> ref = test_ref::ref_sync_edges(s, needs);
    std::sort(ref.begin(), ref.end(), [](const passes::SyncEdge& x, const passes::SyncEdge& y) {
      return std::tie(x.to, x.iter, x.from) < std::tie(y.to, y.iter, y.from);
    });
    CHECK(same_edges(ref, plain));
    // (copies of one template op on different ranks that conflict are
    // ordered by rank, which most symmetries do not keep: those fall back)
    bool sym = true;
    std::vector<passes::SyncEdge> by_symmetry;
    try {
      by_symmetry = passes::sync_edges(s, needs, verify::kClockBudget, SymMode::required);
    } catch (const InternalError&) {
      sym = false;
    }
    if (sym) CHECK(same_edges(by_symmetry, plain));
    symmetric += sym;
    broken += break_one && !sym;
    const ir::Schedule t = passes::insert_sync(s);
    CHECK(ir::print(passes::insert_sync(s)) == ir::print(t));  // deterministic
    {  // slots dense per receiving rank, s.slots their most
      std::vector<std::set<int32_t>> slots(size_t(t.nranks));
      for (const ir::Op& op : t.ops)
        if (op.kind == ir::OpKind::wait) slots[size_t(op.rank)].insert(op.slot);
      size_t most = 0;
      for (const auto& v : slots) {
        CHECK((v.empty() || (*v.begin() == 0 && size_t(*v.rbegin()) == v.size() - 1)));
        most = std::max(most, v.size());
      }
      CHECK(size_t(t.slots) == most);
    }
    CHECK(verdict([&] { test_ref::ref_verify_sync(t); }) == "");
    CHECK(verdict([&] { verify::verify_sync(t); }) == "");
    try {
      verify::verify_sync_budget(t, verify::kClockBudget, SymMode::required);
      ++proved_by_symmetry;
    } catch (const InternalError&) {
    }
    // and changed alike on every rank: the verdict of the dense closure
    ir::Schedule u;
    if (!change_everywhere(t, rng, trial, u)) continue;
    const std::string want = verdict([&] { test_ref::ref_verify_sync(u); });
    CAPTURE(want);
    CHECK(verdict([&] { verify::verify_sync(u); }) == want);
    CHECK(verdict([&] { verify::verify_sync_budget(u, verify::kClockBudget, SymMode::off); }) == want);
    changed_racy += !want.empty();
  }
  MESSAGE("random: " << symmetric << " symmetric, " << broken << " broken ones seen as such, " << proved_by_symmetry
                     << " proved by symmetry, " << changed_racy << " changed ones racy");
  CHECK(symmetric > 150);
  CHECK(broken > 30);
  CHECK(proved_by_symmetry > 150);
  CHECK(changed_racy > 50);
}

TEST_CASE("verify_sync: a thread block outside -1..tbs-1 is verify E006, before any table is sized by it") {
  // Chains are numbered through a (rank, tb) table: a tb read from JSON must
  // be bounded first (tb -2 was an internal error, tb 2^31-1 overflowed the
  // table's width).
  const ir::Schedule synced = passes::insert_sync(before_sync("allgather.ring", 4).back());
  for (int32_t tb : {-2, synced.tbs, 1 << 20, std::numeric_limits<int32_t>::max()}) {
    CAPTURE(tb);
    ir::Schedule s = synced;
    s.ops[s.ops.size() / 2].tb = tb;
    CHECK(verdict([&] { verify::verify_sync(s); }) == "mk.verify.E006");
    CHECK(verdict([&] { verify::verify_all(s); }) == "mk.verify.E006");
    s.tbs = 0;  // synced, yet no thread blocks: only tb -1 is in range
    CHECK(verdict([&] { verify::verify_sync(s); }) == "mk.verify.E006");
  }
}
