// insert_sync and verify_sync (vector clocks over thread blocks, in chain
// blocks under a memory budget: compiler/verify/clocks.hpp) against the dense
// bit-matrix closures they replaced (tests/unit/ref_sync.cpp): the same edges,
// the same verdicts, with one chain block and with many.
#include <doctest/doctest.h>

#include <random>

#include "compiler/passes/passes.hpp"
#include "compiler/pipeline.hpp"
#include "compiler/verify/clocks.hpp"
#include "compiler/verify/hb.hpp"
#include "compiler/verify/verify.hpp"
#include "mk/dsl.hpp"
#include "support.hpp"
#include "tests/unit/ref_sync.hpp"
#include "tests/unit/sync_util.hpp"

using namespace mk;

namespace {

using test_sync::before_sync;
using test_sync::verdict;

}  // namespace

TEST_CASE("insert_sync: the same edges as the dense closure, for every built-in, one chain block or many") {
  for (const auto& info : dsl::registered_schedules()) {
    for (int n : {2, 3, 5, 8, 12}) {
      CAPTURE(info.name);
      CAPTURE(n);
      for (const ir::Schedule& s : before_sync(info.name, n)) {
        const passes::SyncNeeds needs = passes::sync_needs(s);
        const auto want = test_ref::ref_sync_edges(s, needs);
        REQUIRE(!want.empty());
        for (size_t budget : {verify::kClockBudget, size_t(1)}) {  // one block; blocks of 16 chains
          const auto got = passes::sync_edges(s, needs, budget);
          CHECK(got.size() == want.size());
          for (size_t k = 0; k < std::min(got.size(), want.size()); ++k)
            if (got[k].from != want[k].from || got[k].to != want[k].to || got[k].iter != want[k].iter) {
              FAIL_CHECK("edge " << k << ": " << got[k].from << "->" << got[k].to << " iter " << got[k].iter
                                 << ", the dense closure has " << want[k].from << "->" << want[k].to << " iter "
                                 << want[k].iter);
              break;
            }
        }
        // And what insert_sync makes of them passes the dense verifier.
        CHECK_NOTHROW(test_ref::ref_verify_sync(passes::insert_sync(s, 1)));
      }
    }
  }
}

TEST_CASE("verify_sync: the same verdict as the dense closure on synced schedules with one wait changed") {
  // Removing a wait (with its signal, so pairing still holds), turning a
  // wait's step around or moving it leaves a race, a deadlock or
  // nothing wrong, depending on what else orders the ops.
  std::mt19937 rng(7);
  int races = 0, fine = 0;
  for (const char* name : {"allreduce.ring", "allgather.ring", "reducescatter.direct", "allreduce.two_shot",
                           "allreduce.halving_doubling", "alltoall.direct", "broadcast.direct"}) {
    for (int n : {3, 4, 8}) {
      for (const ir::Schedule& pre : before_sync(name, n)) {
        ir::Schedule s = passes::insert_sync(pre);
        CAPTURE(name);
        CAPTURE(n);
        CHECK(verdict([&] { verify::verify_sync(s); }) == "");
        CHECK(verdict([&] { verify::verify_sync_budget(s, 1); }) == "");
        std::vector<size_t> waits;
        for (size_t i = 0; i < s.ops.size(); ++i)
          if (s.ops[i].kind == ir::OpKind::wait) waits.push_back(i);
        for (int trial = 0; trial < 12 && !waits.empty(); ++trial) {
          ir::Schedule t = s;
          const size_t wi = waits[rng() % waits.size()];
          const ir::Op w = t.ops[wi];
          switch (trial % 4) {
            case 0: {  // drop every wait on one (rank, slot) and its signal
              std::vector<ir::Op> kept;
              for (const ir::Op& op : t.ops) {
                if (op.kind == ir::OpKind::wait && op.rank == w.rank && op.slot == w.slot) continue;
                if (op.kind == ir::OpKind::signal && op.peer == w.rank && op.slot == w.slot) continue;
                kept.push_back(op);
              }
              t.ops = std::move(kept);
              break;
            }
            case 1:  // a wait reaching across steps instead of within one, or the other way
              t.ops[wi].iter = w.iter == 0 ? -t.depth : 0;
              break;
            case 3: {  // move the wait earlier in its thread block, before the data op before it
              size_t k = wi;
              while (k > 0 && !(t.ops[k - 1].rank == w.rank && t.ops[k - 1].tb == w.tb && t.ops[k - 1].is_data())) --k;
              if (k == 0) continue;
              t.ops.erase(t.ops.begin() + std::ptrdiff_t(wi));
              t.ops.insert(t.ops.begin() + std::ptrdiff_t(k - 1), w);
              break;
            }
            case 2: {  // move the wait later in its thread block, past the next data op
              size_t k = wi + 1;
              while (k < t.ops.size() && !(t.ops[k].rank == w.rank && t.ops[k].tb == w.tb && t.ops[k].is_data())) ++k;
              if (k == t.ops.size()) continue;
              t.ops.insert(t.ops.begin() + std::ptrdiff_t(k + 1), w);
              t.ops.erase(t.ops.begin() + std::ptrdiff_t(wi));
              break;
            }
          }
          const std::string want = verdict([&] { test_ref::ref_verify_sync(t); });
          CAPTURE(trial);
          CAPTURE(want);
          CHECK(verdict([&] { verify::verify_sync(t); }) == want);
          CHECK(verdict([&] { verify::verify_sync_budget(t, 1); }) == want);
          (want.empty() ? fine : races)++;
        }
      }
    }
  }
  // Both outcomes occur, so the comparison means something.
  CHECK(races > 10);
  CHECK(fine > 0);
}

TEST_CASE("happens-before: every pair of data ops as the dense closure has it") {
  for (const char* name : {"allreduce.ring", "allreduce.two_shot", "allgather.direct"}) {
    for (const ir::Schedule& pre : before_sync(name, 4)) {
      ir::Schedule s = passes::insert_sync(pre);
      auto hb = verify::build_hb(s);
      auto ref = test_ref::ref_build_hb(s);
      CAPTURE(name);
      for (size_t a = 0; a < s.ops.size(); ++a)
        for (size_t b = 0; b < s.ops.size(); ++b) {
          if (hb.before(a, b) != ref.before(a, b)) FAIL_CHECK("before(" << a << ", " << b << ") differs");
          if (hb.before_reuse(a, b) != ref.before_reuse(a, b))
            FAIL_CHECK("before_reuse(" << a << ", " << b << ") differs");
        }
    }
  }
}

TEST_CASE("clock blocks: a tiny budget splits the chains into blocks of 16 and covers each once") {
  std::vector<size_t> seen;
  verify::for_each_chain_block<int16_t>(40, 1, [&](verify::ClockPool<int16_t>& pool) {
    if (pool.width() == 0) return;  // the counting pass
    CHECK(pool.width() == 16);
    for (size_t c = 0; c < 40; ++c)
      if (pool.covers(c)) seen.push_back(c);
  });
  REQUIRE(seen.size() == 40);
  for (size_t c = 0; c < 40; ++c) CHECK(seen[c] == c);
}
