// The passes' indexes (made for 1024-rank schedules) against brute-force
// references on random small schedules: each pass must give exactly what the
// straightforward quadratic formulation gives.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>

#include "compiler/passes/passes.hpp"
#include "compiler/verify/flat_map.hpp"
#include "compiler/verify/hb.hpp"
#include "compiler/verify/verify.hpp"
#include "mk/error.hpp"

using namespace mk;

namespace {

// Random IR: data ops with refs of any count on any rank and buffer (often
// the executing rank, so local-only ops are common), some non-data ops, some
// thread blocks pinned as the DSL may do. Not meant to verify.
ir::Schedule random_schedule(std::mt19937& rng) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  ir::Schedule s;
  s.nranks = pick(1, 4);
  s.chunks = pick(1, 3);
  s.scratch = pick(1, 6);
  const int nops = pick(1, 40);
  for (int i = 0; i < nops; ++i) {
    ir::Op op;
    op.id = i;
    op.rank = pick(0, s.nranks - 1);
    const int kind = pick(0, 9);
    op.kind = kind < 5 ? ir::OpKind::copy : kind < 8 ? ir::OpKind::reduce : ir::OpKind::nop;
    if (pick(0, 7) == 0) op.tb = pick(0, 3);
    if (op.is_data()) {
      const int32_t count = pick(1, 2);
      auto ref = [&]() {
        ir::Ref r;
        r.rank = pick(0, 2) ? op.rank : pick(0, s.nranks - 1);
        r.buf = ir::Buf(pick(0, 2));
        r.index = pick(0, 5);
        r.count = count;
        return r;
      };
      for (int k = 0, n = op.kind == ir::OpKind::reduce ? pick(2, 3) : 1; k < n; ++k) op.srcs.push_back(ref());
      for (int k = 0, n = pick(1, 2); k < n; ++k) op.dsts.push_back(ref());
    }
    s.ops.push_back(op);
  }
  return s;
}

bool overlaps(const ir::Ref& a, const ir::Ref& b) {
  return a.rank == b.rank && a.buf == b.buf && a.index < b.index + b.count && b.index < a.index + a.count;
}

bool conflicts(const ir::Op& a, const ir::Op& b) {
  for (const ir::Ref& w : a.dsts) {
    for (const ir::Ref& r : b.srcs)
      if (overlaps(w, r)) return true;
    for (const ir::Ref& r : b.dsts)
      if (overlaps(w, r)) return true;
  }
  for (const ir::Ref& w : b.dsts)
    for (const ir::Ref& r : a.srcs)
      if (overlaps(w, r)) return true;
  return false;
}

// assign_tbs's heuristic as its header states it, scanning every earlier op
// on the rank for the latest one a local-only op depends on.
std::vector<int32_t> assign_tbs_reference(ir::Schedule s, int32_t max_tbs) {
  std::vector<std::map<std::vector<int32_t>, int32_t>> key_tb(size_t(s.nranks));
  std::vector<int32_t> ntbs(size_t(s.nranks), 0);
  std::vector<std::vector<size_t>> on_rank(size_t(s.nranks));
  for (size_t i = 0; i < s.ops.size(); ++i) {
    ir::Op& op = s.ops[i];
    if (op.tb >= 0) {
      ntbs[size_t(op.rank)] = std::max(ntbs[size_t(op.rank)], op.tb + 1);
    } else {
      std::set<int32_t> remote;
      for (const auto* list : {&op.srcs, &op.dsts})
        for (const ir::Ref& r : *list)
          if (r.rank != op.rank) remote.insert(r.rank);
      if (remote.empty())
        for (auto it = on_rank[size_t(op.rank)].rbegin(); it != on_rank[size_t(op.rank)].rend(); ++it)
          if (conflicts(s.ops[*it], op)) {
            op.tb = s.ops[*it].tb;
            break;
          }
      if (op.tb < 0) {
        std::vector<int32_t> key(remote.begin(), remote.end());
        auto it = key_tb[size_t(op.rank)].find(key);
        if (it == key_tb[size_t(op.rank)].end()) it = key_tb[size_t(op.rank)].emplace(key, ntbs[size_t(op.rank)]++).first;
        op.tb = it->second;
      }
    }
    if (op.is_data()) on_rank[size_t(op.rank)].push_back(i);
  }
  std::vector<int32_t> tbs;
  for (const ir::Op& op : s.ops) tbs.push_back(op.tb % max_tbs);
  return tbs;
}

}  // namespace

TEST_CASE("pass assign_tbs: the latest-access index picks the blocks a scan of every earlier op picks") {
  std::mt19937 rng(20261201);
  for (int trial = 0; trial < 3000; ++trial) {
    CAPTURE(trial);
    const ir::Schedule s = random_schedule(rng);
    const int32_t max_tbs = std::uniform_int_distribution<int32_t>(1, 4)(rng);
    const ir::Schedule a = passes::assign_tbs(s, max_tbs);
    std::vector<int32_t> got;
    int32_t most = 0;
    for (const ir::Op& op : a.ops) {
      got.push_back(op.tb);
      most = std::max(most, op.tb + 1);
    }
    REQUIRE(got == assign_tbs_reference(s, max_tbs));
    CHECK(a.tbs == most);
  }
}

TEST_CASE("verify FlatMap: the same answers as std::map on random keys") {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    verify::FlatMap f;
    std::map<uint64_t, uint32_t> ref;
    const uint64_t range = trial % 2 ? 64 : ~0ull;  // dense collisions, or anything (0 and ~0 included)
    for (int i = 0; i < 5000; ++i) {
      uint64_t key = rng() % range;
      if (i % 97 == 0) key = i % 2 ? 0 : ~0ull;
      const uint32_t value = uint32_t(rng());
      auto [it, fresh] = ref.try_emplace(key, value);
      const auto got = f.try_emplace(key, value);
      REQUIRE(got.first == it->second);
      REQUIRE(got.second == fresh);
      const uint64_t probe = rng() % range;
      const uint32_t* found = f.find(probe);
      auto want = ref.find(probe);
      REQUIRE((found != nullptr) == (want != ref.end()));
      if (found) REQUIRE(*found == want->second);
    }
    CHECK(f.size() == ref.size());
  }
}

// check_overlaps (in verify_bounds) skips its sort when no two refs can name
// one location: against every pair of chunks of random ops, in both aliasings.
TEST_CASE("verify_bounds: E004 exactly when two chunks of one op collide (brute force, both aliasings)") {
  std::mt19937 rng(99);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int trial = 0; trial < 4000; ++trial) {
    CAPTURE(trial);
    ir::Schedule s;
    s.coll = trial % 3 == 0 ? Collective::allreduce : trial % 3 == 1 ? Collective::allgather : Collective::reducescatter;
    s.nranks = pick(1, 3);
    s.chunks = pick(2, 3);  // every buffer holds a 2-chunk ref
    s.scratch = 6;
    ir::Op op;
    op.id = 0;
    op.rank = 0;
    op.kind = pick(0, 1) ? ir::OpKind::copy : ir::OpKind::reduce;
    const int32_t count = pick(1, 2);
    auto ref = [&]() {
      ir::Ref r;
      r.rank = pick(0, s.nranks - 1);
      r.buf = ir::Buf(pick(0, 2));
      r.index = pick(0, ir::buf_chunks(s, r.buf) - count);
      r.count = count;
      return r;
    };
    for (int k = 0, n = op.kind == ir::OpKind::reduce ? pick(2, 3) : 1; k < n; ++k) op.srcs.push_back(ref());
    for (int k = 0, n = pick(1, 3); k < n; ++k) op.dsts.push_back(ref());
    s.ops.push_back(op);
    bool collide = false;
    for (bool inplace : {false, true}) {
      std::vector<std::tuple<verify::LocKey, bool, int32_t>> t;  // location, destination, chunk
      for (const auto* list : {&op.srcs, &op.dsts})
        for (const ir::Ref& r : *list)
          for (int32_t k = 0; k < r.count; ++k) t.emplace_back(verify::loc_key(s, r.at(k), inplace), list == &op.dsts, k);
      for (size_t i = 0; i < t.size(); ++i)
        for (size_t j = 0; j < t.size(); ++j)
          if (i != j && std::get<0>(t[i]) == std::get<0>(t[j]) && std::get<1>(t[j]) &&
              (std::get<1>(t[i]) || std::get<2>(t[i]) != std::get<2>(t[j])))
            collide = true;
    }
    std::optional<ErrId> id;
    std::string what;
    try {
      verify::verify_bounds(s);
    } catch (const Error& e) {
      id = e.id();
      what = e.what();
    }
    CAPTURE(what);
    CHECK(collide == (id == ErrId::verify_E004));
    CHECK((collide || !id));
  }
}
