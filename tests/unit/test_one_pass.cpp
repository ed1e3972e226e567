// passes/one_pass.cpp: which LL buckets run in one pass (no flags, no
// barriers), that those plans still compute their collective when the
// simulation drops their waits and signals as the kernels do, and that the
// conditions matter: a schedule that fails them, forced through anyway,
// goes wrong in the simulation.
#include <doctest/doctest.h>

#include "compiler/codegen/codegen.hpp"
#include "compiler/pipeline.hpp"
#include "compiler/verify/executor.hpp"
#include "mk/dsl.hpp"
#include "support.hpp"

using namespace mk;

namespace {

verify::SimResult simulate_launches(const ir::Schedule& v, uint64_t seed) {
  verify::SimOptions so;
  so.dtype = DType::fp32;
  so.count = 4096;
  so.launches = 6;
  so.seed = seed;
  return verify::simulate(v, so);
}

compiler::Lowered lower_small(const std::string& name, int n, int one_pass = 1, int32_t max_tbs = 32,
                              int64_t max_bytes = 65536) {
  const auto* info = dsl::find_schedule(name);
  REQUIRE(info != nullptr);
  compiler::LowerOptions o;
  o.max_bytes = max_bytes;
  o.max_tbs = max_tbs;
  o.proto.one_pass = one_pass;
  return compiler::lower(dsl::build(*info, n, 0), o);
}

const ir::Schedule& ll_variant(const compiler::Lowered& l) {
  for (const auto& v : l.variants)
    if (v.proto == ir::Proto::ll) return v;
  FAIL("no LL variant");
  return l.variants.front();
}

}  // namespace

TEST_CASE("one pass: the symmetric schedules' LL buckets run in one pass, in one thread block, with only reuse waits") {
  for (const char* name : {"allreduce.one_shot", "allgather.direct", "reducescatter.direct", "alltoall.direct"})
    for (int n : {2, 3, 4, 8}) {
      CAPTURE(name);
      CAPTURE(n);
      const auto l = lower_small(name, n);
      const ir::Schedule& v = ll_variant(l);
      CHECK(v.one_pass);
      CHECK(v.tbs == 1);
      for (const auto& op : v.ops) CHECK((op.kind != ir::OpKind::wait || op.iter == -v.depth));
      CHECK(mkt::contains(ir::print(v), " one_pass"));
      // and the generated kernel has no flag wait, signal or barrier op
      const auto units = codegen::generate({v}, DType::bf16, RedOp::sum, "t");
      CHECK(mkt::contains(units[0].source, "_pass<"));
      CHECK_FALSE(mkt::contains(units[0].source, "wait_all"));
      CHECK_FALSE(mkt::contains(units[0].source, "signal_all"));
      for (const char* barriered : {"c.copy(", "c.reduce(", "c.reduce_final(", "c.template copy<", "c.template reduce<",
                                    "c.template reduce_final<", "op_wide"})
        CHECK_FALSE(mkt::contains(units[0].source, barriered));
    }
}

TEST_CASE("one pass: refused where it would be wrong or cannot apply") {
  std::string why;
  // a root that sends and receives nothing back could run two launches ahead
  for (const char* name : {"broadcast.direct", "reduce.direct"}) {
    CAPTURE(name);
    const auto l = lower_small(name, 4);
    CHECK_FALSE(ll_variant(l).one_pass);
    CHECK_FALSE(passes::one_pass_possible(ll_variant(l), 65536, &why));
    CHECK(mkt::contains(why, "reads nothing from it"));
  }
  // the ring: ops of one rank at different chunk positions
  CHECK_FALSE(ll_variant(lower_small("allreduce.ring", 4)).one_pass);
  // the simple protocol never
  for (const auto& v : lower_small("allreduce.one_shot", 2, 1, 32, -1).variants)
    if (v.proto == ir::Proto::simple) CHECK_FALSE(v.one_pass);
  // off when asked
  CHECK_FALSE(ll_variant(lower_small("allreduce.one_shot", 2, 0)).one_pass);
  // more than one step per launch: a tile that cannot cover the bucket
  ir::Schedule v = ll_variant(lower_small("allreduce.one_shot", 2));
  CHECK(passes::one_pass_possible(v, 65536, &why));
  CHECK_FALSE(passes::one_pass_possible(v, 65536 * 2, &why));
  CHECK(mkt::contains(why, "more than one step"));
  CHECK_FALSE(passes::one_pass_possible(v, -1, &why));
  // a true dependency between ranks (an iter-0 wait) keeps the flags
  ir::Schedule w = v;
  w.one_pass = false;
  ir::Op extra;
  extra.kind = ir::OpKind::wait;
  extra.rank = 0;
  extra.tb = 0;
  extra.slot = 0;
  extra.iter = 0;
  extra.id = w.next_id();
  w.ops.insert(w.ops.begin(), extra);
  CHECK_FALSE(passes::mark_one_pass(w, 65536).one_pass);
  // an IR file cannot ask for it
  ir::Schedule raw = dsl::build(*dsl::find_schedule("allreduce.ring"), 4, 0);
  raw.one_pass = true;
  compiler::LowerOptions o;
  o.max_bytes = 65536;
  for (const auto& x : compiler::lower(raw, o).variants) CHECK_FALSE(x.one_pass);
}

// A broadcast written as a pull (each rank copies the root's input): staged,
// the root writes its own scratch and every rank reads it remotely; the root
// hears nothing back (regression: only pushes were counted, and this passed).
TEST_CASE("one pass: refused for a pull whose writer hears nothing back") {
  const int n = 3;
  dsl::Program p(Collective::broadcast, n, 0, "test.bcast_pull");
  for (int r = 0; r < n; ++r) p.copy(p.output(r, 0), p.input(0, 0), dsl::on(r));
  compiler::LowerOptions o;
  o.max_bytes = 262144;
  const auto l = compiler::lower(std::move(p.ir()), o);
  const ir::Schedule& v = ll_variant(l);
  CHECK_FALSE(v.one_pass);
  std::string why;
  CHECK_FALSE(passes::one_pass_possible(v, 262144, &why));
  CHECK(mkt::contains(why, "reads nothing from it"));
  // and a pull that is symmetric (each rank's part from every rank) passes
  CHECK(ll_variant(lower_small("reducescatter.pull", 3)).one_pass);
}

TEST_CASE("one pass: plans compute their collective when the waits and signals are dropped, launch after launch") {
  for (const char* name : {"allreduce.one_shot", "allgather.direct", "reducescatter.direct", "alltoall.direct",
                           "reducescatter.pull"})
    for (int n : {2, 3, 5}) {
      const auto l = lower_small(name, n);
      const ir::Schedule& v = ll_variant(l);
      REQUIRE(v.one_pass);
      for (bool inplace : {false, true}) {
        if (inplace && std::string(name) == "alltoall.direct") continue;
        for (int64_t count : {int64_t(1), int64_t(7), int64_t(1000), int64_t(65536 / 4 / n)})
          for (uint64_t seed : {1u, 2u, 3u}) {
            CAPTURE(name);
            CAPTURE(n);
            CAPTURE(inplace);
            CAPTURE(count);
            CAPTURE(seed);
            verify::SimOptions so;
            so.dtype = DType::fp32;
            so.count = count;
            so.inplace = inplace;
            so.launches = 5;
            so.seed = seed;
            const auto r = verify::simulate(v, so);
            CHECK_MESSAGE(r.ok, r.first_bad);
            CHECK(r.steps <= 1);
          }
      }
    }
}

TEST_CASE("one pass: forced on a schedule that fails its conditions, the simulation goes wrong") {
  // broadcast's root sends and hears nothing back: without the reuse waits it
  // may write launch k + 2 into the copy of scratch that a peer still reads
  // for launch k; the reader then never sees its step's flag (a deadlock) or
  // reads the wrong data
  const auto l = lower_small("broadcast.direct", 3, 1, 1);
  ir::Schedule v = ll_variant(l);
  REQUIRE_FALSE(v.one_pass);
  REQUIRE(v.tbs == 1);
  v.one_pass = true;
  int bad = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    try {
      bad += !simulate_launches(v, seed).ok;
    } catch (const Error& e) {
      CHECK(e.id() == ErrId::verify_E005);  // deadlock
      ++bad;
    }
  }
  MESSAGE("forced one pass went wrong in " << bad << " of 60 seeds");
  CHECK(bad > 0);
  // the same with its waits kept: always right
  v.one_pass = false;
  for (uint64_t seed = 1; seed <= 20; ++seed) CHECK(simulate_launches(v, seed).ok);
}
