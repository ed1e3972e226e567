// passes/one_pass.cpp: which LL buckets run in one pass (no flags, no
// barriers), that those plans still compute their collective when the
// simulation drops their waits and signals as the kernels do, and that the
// conditions matter: a schedule that fails them, forced through anyway,
// goes wrong in the simulation.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <algorithm>

#include "compiler/codegen/codegen.hpp"
#include "compiler/compile.hpp"
#include "compiler/jit/jit.hpp"
#include "compiler/pipeline.hpp"
#include "compiler/plan/plan.hpp"
#include "compiler/verify/executor.hpp"
#include "compiler/verify/verify.hpp"
#include "mk/dsl.hpp"
#include "support.hpp"

using namespace mk;

namespace {

// Five launches of `count` elements of `t` (sum), in place or not.
verify::SimResult simulate_five(const ir::Schedule& v, DType t, int64_t count, bool inplace, uint64_t seed) {
  verify::SimOptions so;
  so.dtype = t;
  so.op = RedOp::sum;
  so.count = count;
  so.inplace = inplace;
  so.launches = 5;
  so.seed = seed;
  return verify::simulate(v, so);
}

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
            const auto r = simulate_five(v, DType::fp32, count, inplace, seed);
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

// ---- Lamport packets (one_pass.cpp mark_lamport) ------------------------------

namespace {

ir::Schedule lamport_variant(const std::string& name, int n, DType t = DType::fp32) {
  ir::Schedule v = ll_variant(lower_small(name, n));
  REQUIRE(v.one_pass);
  return passes::mark_lamport(std::move(v), t, true);
}

}  // namespace

TEST_CASE("lamport: one-pass buckets of floats of at most 4 bytes carry Lamport packets, integers, fp64, LL buckets "
          "with flags and the knob off do not") {
  for (const char* name : {"allreduce.one_shot", "allgather.direct", "reducescatter.direct", "alltoall.direct",
                           "reducescatter.pull"})
    for (int n : {2, 3, 8}) {
      CAPTURE(name);
      CAPTURE(n);
      for (DType t : all_dtypes()) {
        CAPTURE(mk::name(t));
        CHECK(lamport_variant(name, n, t).lamport == (dtype_is_float(t) && dtype_size(t) <= 4));
      }
      std::string why;
      CHECK_MESSAGE(passes::lamport_possible(lamport_variant(name, n), &why), why);
      CHECK_FALSE(passes::mark_lamport(ll_variant(lower_small(name, n)), DType::bf16, false).lamport);
      // half the scratch of LL packets
      ir::Schedule v = lamport_variant(name, n);
      const int64_t lamport_bytes = verify::scratch_bytes(v);
      v.lamport = false;
      CHECK(verify::scratch_bytes(v) == 2 * lamport_bytes);
    }
  // fp64: an all-ones 32-bit word is the low half of numbers such as DBL_MAX
  // and 1 - 2^-53, which the writer's substitution would change (regression)
  CHECK_FALSE(passes::lamport_dtype(DType::fp64));
  CHECK_FALSE(lamport_variant("allreduce.one_shot", 2, DType::fp64).lamport);
  for (DType t : {DType::fp32, DType::fp16, DType::bf16, DType::fp8e4m3, DType::fp8e5m2})
    CHECK(passes::lamport_dtype(t));
  // not one pass: the ring's LL bucket keeps its flags
  ir::Schedule ring = ll_variant(lower_small("allreduce.ring", 4));
  std::string why;
  CHECK_FALSE(passes::mark_lamport(ring, DType::fp32, true).lamport);
  CHECK_FALSE(passes::lamport_possible(ring, &why));
  CHECK(mkt::contains(why, "not a one-pass"));
  // the printed IR and its JSON say so, and a JSON file cannot ask for it without one pass
  const ir::Schedule v = lamport_variant("allreduce.one_shot", 2);
  CHECK(mkt::contains(ir::print(v), " one_pass lamport"));
  CHECK(ir::from_json(ir::to_json(v)).lamport);
  nlohmann::json j = nlohmann::json::parse(ir::to_json(v));
  j.erase("one_pass");
  auto c = mkt::catch_error([&] { ir::from_json(j.dump()); });
  CHECK(c.id == "mk.ir.E001");
  CHECK(mkt::contains(c.message, "only one-pass schedules use Lamport packets"));
}

TEST_CASE("lamport: refused where a slot has no single reader") {
  ir::Schedule v = lamport_variant("allreduce.one_shot", 3);
  REQUIRE(v.lamport);
  // a second op reading a slot the reduce reads: two readers, one reset
  size_t reader = v.ops.size();
  for (size_t i = 0; i < v.ops.size(); ++i)
    if (v.ops[i].is_data())
      for (const ir::Ref& r : v.ops[i].srcs)
        if (r.buf == ir::Buf::scratch) reader = i;
  REQUIRE(reader < v.ops.size());
  ir::Schedule two = v;
  ir::Op extra = v.ops[reader];
  extra.kind = ir::OpKind::copy;
  extra.final = false;
  for (const ir::Ref& r : v.ops[reader].srcs)
    if (r.buf == ir::Buf::scratch) extra.srcs = {r};
  extra.id = two.next_id();
  two.ops.push_back(extra);
  std::string why;
  CHECK_FALSE(passes::lamport_possible(two, &why));
  CHECK(mkt::contains(why, "read by two ops"));
  CHECK_FALSE(passes::mark_lamport(two, DType::fp32, true).lamport);
  // forced through: the second reader finds the sentinel the first put back
  two.lamport = true;
  auto c = mkt::catch_error([&] { (void)simulate_launches(two, 1); });
  CHECK(c.id == "mk.verify.E005");
  // a slot written but never read would never go back to rest
  ir::Schedule unread = v;
  auto& srcs = unread.ops[reader].srcs;
  srcs.erase(std::remove_if(srcs.begin(), srcs.end(), [](const ir::Ref& r) { return r.buf == ir::Buf::scratch; }),
             srcs.end());
  CHECK_FALSE(passes::lamport_possible(unread, &why));
  CHECK(mkt::contains(why, "never read"));
}

TEST_CASE("lamport: plans compute their collective with the readers' resets, launch after launch, every dtype they "
          "serve") {
  for (const char* name : {"allreduce.one_shot", "allgather.direct", "reducescatter.direct", "alltoall.direct",
                           "reducescatter.pull"})
    for (int n : {2, 3, 5}) {
      const ir::Schedule v = lamport_variant(name, n);
      REQUIRE(v.lamport);
      for (DType t : {DType::fp32, DType::bf16, DType::fp16, DType::fp8e4m3})
        for (bool inplace : {false, true}) {
          if (inplace && std::string(name) == "alltoall.direct") continue;
          for (int64_t count : {int64_t(1), int64_t(7), int64_t(1000), int64_t(65536 / 8 / n)})
            for (uint64_t seed : {1u, 2u}) {
              CAPTURE(name);
              CAPTURE(n);
              CAPTURE(mk::name(t));
              CAPTURE(inplace);
              CAPTURE(count);
              CAPTURE(seed);
              const auto r = simulate_five(v, t, count, inplace, seed);
              CHECK_MESSAGE(r.ok, r.first_bad);
            }
        }
    }
}

TEST_CASE("lamport: one copy of scratch is not enough (the next launch writes before the reader took the last)") {
  // depth 1: launch k + 1's writer may fill a slot whose launch-k packets its
  // reader has not taken yet; the simulation sees the overwrite (E014) or a
  // result that mixes the two launches
  ir::Schedule v = lamport_variant("allreduce.one_shot", 3);
  v.depth = 1;
  int bad = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    try {
      bad += !simulate_launches(v, seed).ok;
    } catch (const Error& e) {
      CHECK(e.id() == ErrId::verify_E014);
      ++bad;
    }
  }
  MESSAGE("depth 1 went wrong in " << bad << " of 60 seeds");
  CHECK(bad > 0);
}

TEST_CASE("lamport: compile_plan marks the kernel per dtype, halves its scratch, and the plan file round-trips" *
          doctest::skip(!mkt::have_nvrtc())) {
  mkt::ScopedEnv cache("MK_CACHE_DIR", mkt::process_cache_dir());
  auto plan_for = [](DType t, int lamport) {
    compiler::CompileOptions o;
    o.dtype = t;
    o.lower.proto.lamport = lamport;
    return compiler::compile_plan(dsl::build(*dsl::find_schedule("allreduce.one_shot"), 2, 0), o);
  };
  const plan::Plan bf = plan_for(DType::bf16, 1), in = plan_for(DType::int32, 1), off = plan_for(DType::bf16, 0);
  REQUIRE(bf.kernels.size() == 2);
  CHECK(bf.kernels[0].lamport);
  CHECK(bf.kernels[0].one_pass);
  CHECK_FALSE(bf.kernels[1].lamport);  // the simple bucket
  CHECK(mkt::contains(bf.kernels[0].source, "kLamport = true"));
  CHECK(mkt::contains(plan::summary(bf), "proto=ll (one pass, Lamport)"));
  CHECK_FALSE(in.kernels[0].lamport);
  CHECK(mkt::contains(in.kernels[0].source, "kLamport = false"));
  CHECK_FALSE(off.kernels[0].lamport);
  CHECK(in.kernels[0].scratch_bytes == 2 * bf.kernels[0].scratch_bytes);
  // Lamport and LL kernels never share scratch (the resource key differs)
  CHECK(plan::resource_key(bf, bf.kernels[0]) != plan::resource_key(off, off.kernels[0]));
  // the file says it, and a hand-edited one cannot put it where it does not belong
  const std::string text = plan::to_json(bf);
  CHECK(plan::from_json(text, "t").kernels[0].lamport);
  nlohmann::json j = nlohmann::json::parse(text);
  j["kernels"][1]["lamport"] = true;  // a simple kernel
  auto c = mkt::catch_error([&] { plan::from_json(j.dump(), "t"); });
  CHECK(c.id == "mk.plan.E001");
  CHECK(mkt::contains(c.message, "only one-pass kernels carry Lamport packets"));
  j = nlohmann::json::parse(plan::to_json(in));
  j["kernels"][0]["lamport"] = true;  // an int32 plan
  c = mkt::catch_error([&] { plan::from_json(j.dump(), "t"); });
  CHECK(c.id == "mk.plan.E001");
  CHECK(mkt::contains(c.message, "int32 has no spare 32-bit pattern"));
  j["dtype"] = "fp64";
  j["kernels"][0]["lamport"] = true;  // an fp64 plan
  c = mkt::catch_error([&] { plan::from_json(j.dump(), "t"); });
  CHECK(c.id == "mk.plan.E001");
  CHECK(mkt::contains(c.message, "fp64 has no spare 32-bit pattern"));
  j["kernels"][0]["lamport"] = "yes";
  c = mkt::catch_error([&] { plan::from_json(j.dump(), "t"); });
  CHECK(mkt::contains(c.message, "expected true or false"));
}
