// Zero-copy lowering (registered buffers): which schedules get it, that the
// lowered programs compute every collective when ranks enter and leave
// together (the kernel's entry and exit barriers), that they do not without
// those barriers, codegen and NVRTC, and the plan flag.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include "compiler/codegen/codegen.hpp"
#include "compiler/compile.hpp"
#include "compiler/ir/ir.hpp"
#include "compiler/jit/jit.hpp"
#include "compiler/pipeline.hpp"
#include "compiler/plan/plan.hpp"
#include "compiler/verify/executor.hpp"
#include "mk/dsl.hpp"
#include "support.hpp"

using namespace mk;

namespace {

compiler::Lowered lower_zc(const std::string& name, int n, int64_t max_tile = 4096) {
  const auto* info = dsl::find_schedule(name);
  REQUIRE(info != nullptr);
  compiler::LowerOptions o;
  o.zero_copy = true;
  o.proto.max_tile_bytes = max_tile;
  return compiler::lower(dsl::build(*info, n), o);
}

bool touches_peer_user_buffer(const ir::Schedule& s) {
  for (const auto& op : s.ops)
    for (const auto* list : {&op.srcs, &op.dsts})
      for (const auto& r : *list)
        if (r.buf != ir::Buf::scratch && r.rank != op.rank) return true;
  return false;
}

}  // namespace

TEST_CASE("zero-copy: schedules that address peers' user buffers keep them, the others are staged as usual") {
  // Written with pushes into peers' outputs (or reads of their inputs): zero-copy.
  for (const char* s : {"allgather.direct", "alltoall.direct", "broadcast.direct", "allreduce.two_shot",
                        "allreduce.ring"}) {
    auto l = lower_zc(s, 4);
    for (const auto& v : l.variants) {
      CAPTURE(s);
      CHECK(v.zero_copy);
      CHECK_FALSE(v.staged);
      CHECK(touches_peer_user_buffer(v));
      CHECK(mkt::contains(ir::print(v), " zero_copy"));
    }
  }
  // Written through scratch only (one-shot pushes into peer scratch): nothing
  // to gain, so lowered exactly as without the option.
  for (const char* s : {"allreduce.one_shot", "reducescatter.direct", "reduce.direct"}) {
    auto l = lower_zc(s, 4);
    const auto* info = dsl::find_schedule(s);
    compiler::LowerOptions plain;
    plain.proto.max_tile_bytes = 4096;
    auto p = compiler::lower(dsl::build(*info, 4), plain);
    REQUIRE(l.variants.size() == p.variants.size());
    for (size_t i = 0; i < l.variants.size(); ++i) {
      CAPTURE(s);
      CHECK_FALSE(l.variants[i].zero_copy);
      CHECK(ir::print(l.variants[i]) == ir::print(p.variants[i]));
    }
  }
}

TEST_CASE("zero-copy: lowered built-ins compute every collective (simulated, several launches, both modes)") {
  int runs = 0;
  for (const auto& info : dsl::registered_schedules())
    for (int n : {2, 3, 4}) {
      auto l = lower_zc(info.name, n);
      for (size_t b = 0; b < l.variants.size(); ++b) {
        const auto& v = l.variants[b];
        if (!v.zero_copy) continue;
        for (DType t : {DType::fp32, DType::bf16, DType::int8})
          for (int64_t count : {int64_t(1), int64_t(7), int64_t(1001), int64_t(5000)})
            for (bool inplace : {false, true}) {
              if (inplace && info.coll == Collective::alltoall) continue;
              verify::SimOptions o;
              o.dtype = t;
              o.op = collective_reduces(info.coll) ? RedOp::sum : RedOp::sum;
              o.count = count;
              o.inplace = inplace;
              o.launches = 3;
              o.root = (info.coll == Collective::broadcast || info.coll == Collective::reduce) ? n - 1 : 0;
              o.seed = uint64_t(count + n * 17 + int(t));
              auto r = verify::simulate(v, o);
              if (!r.ok) {
                CAPTURE(info.name);
                CAPTURE(n);
                CAPTURE(b);
                CAPTURE(name(t));
                CAPTURE(count);
                CAPTURE(inplace);
                FAIL_CHECK(r.first_bad);
              }
              ++runs;
            }
      }
    }
  CHECK(runs > 100);
}

TEST_CASE("zero-copy: without the entry/exit barriers the same programs give wrong results") {
  // A rank that starts its next launch (fresh input, poisoned output) while a
  // peer still writes into its output, or checks its output before the peer
  // wrote it: the reason every zero-copy kernel enters and leaves together.
  auto l = lower_zc("allgather.direct", 3, 1 << 18);
  bool wrong = false;
  for (uint64_t seed = 1; seed <= 8 && !wrong; ++seed) {
    verify::SimOptions o;
    o.count = 100001;
    o.launches = 3;
    o.seed = seed;
    o.zc_barriers = false;
    wrong = !verify::simulate(l.variants.back(), o).ok;
  }
  CHECK(wrong);
  verify::SimOptions o;
  o.count = 100001;
  o.launches = 3;
  CHECK(verify::simulate(l.variants.back(), o).ok);
}

TEST_CASE("zero-copy: codegen addresses peers' buffers and brackets the kernel with entry and exit") {
  auto l = lower_zc("allgather.direct", 4);
  auto units = codegen::generate(l.variants, DType::fp32, RedOp::sum, "t");
  REQUIRE(!units.empty());
  for (const auto& u : units) {
    CHECK(mkt::contains(u.source, "kZeroCopy = true"));
    CHECK(mkt::contains(u.source, "mk::dev::peer_data_ref("));
    CHECK(mkt::contains(u.source, "c.zc_enter()"));
    CHECK(mkt::contains(u.source, "c.zc_exit()"));
  }
  // Ordinary plans have none of it.
  const auto* info = dsl::find_schedule("allgather.direct");
  auto plain = compiler::lower(dsl::build(*info, 4), {});
  for (const auto& u : codegen::generate(plain.variants, DType::fp32, RedOp::sum, "t")) {
    CHECK(mkt::contains(u.source, "kZeroCopy = false"));
    CHECK_FALSE(mkt::contains(u.source, "zc_enter"));
  }
}

TEST_CASE("zero-copy: plans compile with NVRTC, say so in plan.json, and need no scratch when they use none" *
          doctest::skip(jit::nvrtc_version() <= 0)) {
  compiler::CompileOptions o;
  o.use_cache = false;
  o.lower.zero_copy = true;
  o.dtype = DType::bf16;
  auto p = compiler::compile_plan(dsl::build(*dsl::find_schedule("allgather.direct"), 2), o);
  CHECK(p.zero_copy);
  for (const auto& k : p.kernels) {
    CHECK(k.scratch_bytes == 0);  // pure pushes into peers' outputs
    CHECK_FALSE(k.cubin.empty());
  }
  auto back = plan::from_json(plan::to_json(p), "plan.json");
  CHECK(back.zero_copy);
  CHECK(mkt::contains(plan::summary(p), "zero-copy"));
  // Its cache key differs from the ordinary plan's.
  o.use_cache = true;
  auto a = compiler::compile_plan(dsl::build(*dsl::find_schedule("allgather.direct"), 2), o);
  o.lower.zero_copy = false;
  auto b = compiler::compile_plan(dsl::build(*dsl::find_schedule("allgather.direct"), 2), o);
  CHECK(a.zero_copy);
  CHECK_FALSE(b.zero_copy);
  CHECK(b.kernels[0].scratch_bytes > 0);
  // A zero-copy plan whose flag region cannot hold the mailboxes is refused
  // (the kernel would write past it into the next plan's flags).
  plan::Plan small = p;
  small.kernels[0].flag_bytes -= 8;
  auto e = mkt::catch_error([&] { plan::from_json(plan::to_json(small), "plan.json"); });
  CHECK(e.id == "mk.plan.E001");
  CHECK(mkt::contains(e.message, "flag_bytes"));
  // A malformed flag is an error, not a silent default.
  std::string j = plan::to_json(p);
  auto at = j.find("\"zero_copy\": true");
  REQUIRE(at != std::string::npos);
  j.replace(at, std::string("\"zero_copy\": true").size(), "\"zero_copy\": \"yes\"");
  CHECK(mkt::catch_error([&] { plan::from_json(j, "plan.json"); }).id == "mk.plan.E001");
}

TEST_CASE("zero-copy: mkc lower and simulate take --zero-copy") {
  auto l = mkt::mkc({"lower", "-s", "allgather.direct", "-n", "3", "--zero-copy", "--dump-after", "sync"});
  CHECK(l.exit_code == 0);
  CHECK(mkt::contains(l.out, " zero_copy"));
  CHECK(mkt::contains(l.out, "r0.in[0] -> r1.out[0]"));  // a push straight into a peer's output
  auto plain = mkt::mkc({"lower", "-s", "allgather.direct", "-n", "3", "--dump-after", "sync"});
  CHECK(plain.exit_code == 0);
  CHECK_FALSE(mkt::contains(plain.out, " zero_copy"));
  auto sim = mkt::mkc({"simulate", "-s", "alltoall.direct", "-n", "3", "--zero-copy", "--count", "777", "--launches",
                       "3"});
  CHECK(sim.exit_code == 0);
  CHECK(mkt::contains(sim.out, "0 mismatch"));
}
