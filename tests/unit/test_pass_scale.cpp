// The passes' indexes (made for 1024-rank schedules) against brute-force
// references on random small schedules: each pass must give exactly what the
// straightforward quadratic formulation gives.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "compiler/passes/passes.hpp"

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
