// Fusion prologues (include/mk/fusion.hpp MK_PROLOGUE): the registry, the
// host code against float64, the verifier's proof for a fusion's prologue
// (verify_prologue), the CPU executor running it on every staged all-reduce
// (bit for bit what the PreMulSum op computes, for the built-in
// allreduce.premulsum), and fused plans compiled by NVRTC, a prologue and an
// epilogue in one kernel included.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <string>
#include <vector>

#include "compiler/codegen/codegen.hpp"
#include "compiler/jit/jit.hpp"
#include "compiler/compile.hpp"
#include "compiler/pipeline.hpp"
#include "compiler/verify/executor.hpp"
#include "compiler/verify/fused_ref.hpp"
#include "compiler/verify/reference.hpp"
#include "compiler/verify/verify.hpp"
#include "mk/dsl.hpp"
#include "mk/fusion.hpp"
#include "support.hpp"

using namespace mk;
using mkt::catch_error;
using mkt::contains;
namespace fr = mk::verify::fused;

// A fusion of both kinds, as a user's schedule file writes it: every input
// clipped to [-c, c] (c: scalar 0, each rank its own) before the sum, then
// the sum times scalar 1.
MK_PROLOGUE(test_clip,
  struct Pro {
    template <class Q>
    MK_DEV static typename Q::C in(const Q& q, typename Q::C x) {
      const typename Q::C c = q.scalar(0);
      return x < -c ? -c : (x > c ? c : x);
    }
  };
)
MK_EPILOGUE(test_times,
  struct Epi {
    template <class R>
    MK_DEV static void row(R& r) {
      for (int i = r.first(); i < r.n; i += r.step()) r.set_out(i, r.out(i) * r.scalar(1));
    }
  };
)
MK_FUSION_PRE(test_clip, test_times, "test.clip_sum_times", "clip each input to [-c, c], sum, times s", ({}),
              ({"c", "s"}), mk::dsl::RowMode::any);

namespace {

const dsl::FusionInfo& fusion(const std::string& name) {
  const dsl::FusionInfo* f = dsl::find_fusion(name);
  REQUIRE_MESSAGE(f != nullptr, name);
  return *f;
}

compiler::Lowered lower_named(const std::string& name, int n, bool zero_copy = false) {
  const auto* info = dsl::find_schedule(name);
  REQUIRE(info != nullptr);
  compiler::LowerOptions o;
  o.zero_copy = zero_copy;
  o.proto.max_tile_bytes = 4096;
  return compiler::lower(dsl::build(*info, n), o);
}

// The staged all-reduce schedules (what fused calls run on).
std::vector<std::string> staged_allreduces() {
  std::vector<std::string> v;
  for (const auto& s : dsl::registered_schedules())
    if (s.coll == Collective::allreduce && !s.copy_engine && !contains(s.name, ".hier")) v.push_back(s.name);
  return v;
}

// One simulated launch of `lowered` on inputs fr::value(seed, rank, i) of
// every rank; the outputs (as doubles of the dtype) of every rank.
std::vector<std::vector<double>> run(const ir::Schedule& lowered, DType t, RedOp op, int64_t count, bool inplace,
                                     uint64_t seed, const dsl::FusionInfo* pro,
                                     const std::vector<std::vector<double>>& scalars) {
  const int n = lowered.nranks;
  verify::SimIO io;
  io.in.resize(size_t(n));
  for (int r = 0; r < n; ++r) {
    std::vector<double> x(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) x[size_t(i)] = fr::value(seed, uint64_t(r), i, t);
    const auto b = fr::encode(x, t);
    io.in[size_t(r)].assign(b.begin(), b.end());
  }
  verify::SimOptions so;
  so.dtype = t;
  so.op = op;
  so.count = count;
  so.inplace = inplace;
  so.launches = 1;
  so.seed = seed;
  so.io = &io;
  so.prologue = pro;
  so.pre_scalars = scalars;
  const auto res = verify::simulate(lowered, so);
  REQUIRE_MESSAGE(res.ok, res.first_bad);
  std::vector<std::vector<double>> out;
  for (int r = 0; r < n; ++r)
    out.push_back(fr::decode(std::vector<char>(io.out[size_t(r)].begin(), io.out[size_t(r)].end()), t));
  return out;
}

}  // namespace

TEST_CASE("fusion registry: allreduce.premulsum is a prologue only, and malformed prologue fusions are mk.dsl.E009") {
  const auto& f = fusion("allreduce.premulsum");
  CHECK(f.source.empty());  // no epilogue
  CHECK(contains(f.pre_source, "struct Pro"));
  CHECK(f.operands.empty());
  CHECK(f.scalars == std::vector<std::string>{"scale"});
  CHECK(f.rows == dsl::RowMode::any);
  const auto& both = fusion("test.clip_sum_times");
  CHECK(contains(both.source, "struct Epi"));
  CHECK(contains(both.pre_source, "struct Pro"));
  auto refused = [&](dsl::FusionInfo g, const char* why) {
    g.name = "test.malformed_pro";
    g.file = "mine.cpp";
    g.line = 3;
    CHECK(!dsl::register_fusion(g));
    const auto e = catch_error([&] { (void)dsl::find_fusion("test.malformed_pro"); });
    CHECK(e.id == "mk.dsl.E009");
    CHECK_MESSAGE(contains(e.what, why), e.what);
    CHECK(contains(e.what, "mine.cpp:3"));
  };
  dsl::FusionInfo g;
  g.rows = dsl::RowMode::any;
  refused(g, "neither an epilogue");
  g.pre_source = "int x;";
  refused(g, "no struct Pro");
  g.pre_source = f.pre_source;
  g.operands = {{"bias", dsl::Shape::elem, false}};
  refused(g, "without an epilogue has no operands");
  g.operands.clear();
  g.rows = dsl::RowMode::given;
  refused(g, "without an epilogue has no operands and no rows");
  g.rows = dsl::RowMode::any;
  refused(g, "no host build");  // code the checker could not run
  for (int k = 0; k < 4; ++k) g.pre_host[k] = f.pre_host[k];
  g.scalars = f.scalars;
  g.name = "test.malformed_pro";
  CHECK(dsl::register_fusion(g));  // fixed: the name is served again
  CHECK(dsl::find_fusion("test.malformed_pro") != nullptr);
}

TEST_CASE("run_prologue_host: the prologue's host code, rounded to the dtype or exact, and mk.cli.E013 without a prologue") {
  const auto& f = fusion("allreduce.premulsum");
  const double s[4] = {1.1, 0, 0, 0};
  CHECK(dsl::run_prologue_host(f, DType::fp64, 0.3, s) == 0.3 * 1.1);
  CHECK(dsl::run_prologue_host(f, DType::fp32, 0.3, s, true) == 0.3 * 1.1);  // exact: in double
  // fp32: the float product; bf16: that, rounded to bf16 (8 significant bits)
  CHECK(dsl::run_prologue_host(f, DType::fp32, 0.3, s) == double(float(0.3) * float(1.1)));
  const double b = dsl::run_prologue_host(f, DType::bf16, 0.75, s);
  CHECK(b == std::ldexp(std::round(std::ldexp(double(0.75f * 1.1f), 8)), -8));
  const auto& c = fusion("test.clip_sum_times");
  const double cs[4] = {0.5, 2, 0, 0};
  CHECK(dsl::run_prologue_host(c, DType::fp32, 0.75, cs) == 0.5);
  CHECK(dsl::run_prologue_host(c, DType::fp32, -0.75, cs) == -0.5);
  CHECK(dsl::run_prologue_host(c, DType::fp32, 0.25, cs) == 0.25);
  CHECK(catch_error([&] { dsl::run_prologue_host(fusion("allreduce.rmsnorm"), DType::fp32, 1, s); }).id ==
        "mk.cli.E013");
  CHECK(catch_error([&] { dsl::run_prologue_host(f, DType::int32, 1, s); }).id == "mk.cli.E013");
}

TEST_CASE("executor: allreduce.premulsum's prologue on every staged all-reduce equals the PreMulSum op bit for bit "
          "and the float64 reference: fp16, bf16, fp32, odd counts, in-place and out-of-place, 2-5 ranks") {
  const auto& f = fusion("allreduce.premulsum");
  int64_t runs = 0;
  for (const auto& name : staged_allreduces())
    for (int n : {2, 3, 5}) {
      const auto l = lower_named(name, n);
      for (DType t : {DType::fp16, DType::bf16, DType::fp32})
        for (int64_t count : {int64_t(1), int64_t(7), int64_t(1001)})
          for (bool inplace : {false, true}) {
            CAPTURE(name);
            CAPTURE(n);
            CAPTURE(mk::name(t));
            CAPTURE(count);
            CAPTURE(inplace);
            // the scalars the PreMulSum op's simulation gives each rank
            std::vector<std::vector<double>> sc;
            for (int r = 0; r < n; ++r) sc.push_back({verify::prescale_of(t, r), 0, 0, 0});
            const uint64_t seed = uint64_t(count * 3 + n);
            const size_t b = l.variants.size() > 1 && count * int64_t(dtype_size(t)) > 1024 ? 1 : 0;
            const auto got = run(l.variants[b], t, RedOp::sum, count, inplace, seed, &f, sc);
            const auto op = run(l.variants[b], t, RedOp::premulsum, count, inplace, seed, nullptr, {});
            for (int r = 0; r < n; ++r) {
              CAPTURE(r);
              CHECK(got[size_t(r)] == op[size_t(r)]);  // the same bits (doubles of the dtype's values)
              CHECK(got[size_t(r)] == got[0]);         // on every rank
            }
            // and the float64 reference: sum of x_r * s_r, within n + 1 roundings
            std::vector<double> want(static_cast<size_t>(count)), tol(static_cast<size_t>(count));
            for (int64_t i = 0; i < count; ++i) {
              double sum = 0, mag = 0;
              for (int r = 0; r < n; ++r) {
                const double v = fr::value(seed, uint64_t(r), i, t) * sc[size_t(r)][0];
                sum += v;
                mag += std::fabs(v);
              }
              want[size_t(i)] = sum;
              tol[size_t(i)] = double(n + 1) * fr::eps(t) * mag + 1e-30;
            }
            const std::string bad = fr::first_bad(got[0], want, tol, "out");
            CHECK_MESSAGE(bad.empty(), bad);
            ++runs;
          }
    }
  CHECK(runs >= 5 * 3 * 3 * 3 * 2);
}

TEST_CASE("executor: a user prologue (clip) with each rank's own scalar, against float64, and refused without SimIO, with "
          "PreMulSum, or without every rank's scalars it is refused") {
  const auto& f = fusion("test.clip_sum_times");
  const auto l = lower_named("allreduce.ring", 4);
  const DType t = DType::fp32;
  const int64_t count = 333;
  std::vector<std::vector<double>> sc;
  for (int r = 0; r < 4; ++r) sc.push_back({0.2 + 0.2 * r, 3.0, 0, 0});  // rank r clips to 0.2 (r + 1)
  const uint64_t seed = 5;
  const auto got = run(l.variants[0], t, RedOp::sum, count, false, seed, &f, sc);
  int64_t clipped = 0;
  for (int64_t i = 0; i < count; ++i) {
    double want = 0;
    for (int r = 0; r < 4; ++r) {
      const double x = fr::value(seed, uint64_t(r), i, t), c = double(float(sc[size_t(r)][0]));
      clipped += std::fabs(x) > c;
      want += std::min(std::max(x, -c), c);
    }
    CHECK(std::fabs(got[0][size_t(i)] - want) <= 4 * fr::eps(t) * 4);
  }
  CHECK(clipped > count / 2);  // the data exercises the clip
  verify::SimOptions so;
  so.count = 10;
  so.prologue = &f;
  so.pre_scalars = sc;
  CHECK(catch_error([&] { verify::simulate(l.variants[0], so); }).id == "mk.cli.E011");  // no SimIO
  verify::SimIO io;
  so.io = &io;
  so.launches = 1;
  io.in.assign(4, std::vector<uint8_t>(40));
  so.op = RedOp::premulsum;
  CHECK(catch_error([&] { verify::simulate(l.variants[0], so); }).id == "mk.cli.E013");
  so.op = RedOp::sum;
  so.pre_scalars.pop_back();
  CHECK(catch_error([&] { verify::simulate(l.variants[0], so); }).id == "mk.cli.E011");
}

TEST_CASE("verify_prologue for a fusion: a zero-copy plan and an input re-read after its in-place output was "
          "written are mk.verify.E018 naming the fusion and the DSL line; compile_plan refuses them") {
  {
    const auto l = lower_named("allreduce.direct", 4, true);
    const auto c = catch_error([&] { verify::verify_prologue(l.variants.front(), "prologue of fusion my.fusion"); });
    CHECK(c.id == "mk.verify.E018");
    CHECK(contains(c.message, "prologue of fusion my.fusion"));
    CHECK(contains(c.message, "only rank"));
    CHECK(c.loc.valid());
  }
  // the broken variant through the compiler, as the runtime's plan build sees it
  dsl::Program p(Collective::allreduce, 1, 0, "test.reread_fused");
  p.copy(p.scratch(0, 0), p.input(0, 0));
  p.copy(p.output(0, 0), p.scratch(0, 0));
  p.copy(p.scratch(0, 1), p.input(0, 0));
  compiler::CompileOptions o;
  o.dtype = DType::fp32;
  o.fusion = "allreduce.premulsum";
  o.use_cache = false;
  const auto c = catch_error([&] { (void)compiler::compile_plan(p.ir(), o); });
  CHECK(c.id == "mk.verify.E018");
  CHECK_MESSAGE(contains(c.message, "prologue of fusion allreduce.premulsum"), c.message);
  CHECK(c.loc.line > 0);  // the user's line
  // PreMulSum kernels have their own prologue
  o.op = RedOp::premulsum;
  const auto e = catch_error([&] {
    (void)compiler::compile_plan(dsl::build(*dsl::find_schedule("allreduce.ring"), 2, 0), o);
  });
  CHECK(e.id == "mk.cli.E013");
  CHECK(contains(e.message, "has a prologue"));
}

TEST_CASE("compile: fusion prologues compile for LL, Lamport, simple and wide ops, with an epilogue too") {
  if (!mkt::have_nvrtc()) {
    MESSAGE("SKIPPED: NVRTC is not available");
    return;
  }
  struct Case {
    const char* schedule;
    int n;
    DType t;
    const char* fusion;
  };
  for (const Case& c : {Case{"allreduce.one_shot", 2, DType::bf16, "allreduce.premulsum"},
                        Case{"allreduce.ring", 3, DType::fp16, "allreduce.premulsum"},
                        Case{"allreduce.direct", 9, DType::fp32, "allreduce.premulsum"},
                        Case{"allreduce.ring", 4, DType::fp32, "test.clip_sum_times"}}) {
    CAPTURE(c.schedule);
    CAPTURE(c.n);
    CAPTURE(c.fusion);
    compiler::CompileOptions o;
    o.dtype = c.t;
    o.fusion = c.fusion;
    o.use_cache = false;
    const plan::Plan p = compiler::compile_plan(dsl::build(*dsl::find_schedule(c.schedule), c.n, 0), o);
    REQUIRE(!p.kernels.empty());
    CHECK(contains(p.fusion, std::string(c.fusion) + "@"));
    for (const auto& k : p.kernels) CHECK(!k.cubin.empty());
  }
  // the generated source: the prologue's code and the plan traits naming it
  compiler::CompileOptions o;
  o.dtype = DType::fp32;
  o.fusion = "test.clip_sum_times";
  o.use_cache = false;
  const auto l = lower_named("allreduce.ring", 2);
  codegen::Limits lim;
  lim.prologue.name = "test.clip_sum_times";
  lim.prologue.source = fusion("test.clip_sum_times").pre_source;
  const auto u = codegen::generate_one(l.variants[0], 0, 1, DType::fp32, RedOp::sum, "t", lim, -1);
  CHECK(contains(u.source, "using Pre = ::mk::dev::UserPre<mk_pro_b0::Pro>"));
  CHECK(contains(u.source, "namespace mk_pro_b0"));
  const auto plain = codegen::generate_one(l.variants[0], 0, 1, DType::fp32, RedOp::sum, "t", {}, -1);
  CHECK(contains(plain.source, "using Pre = ::mk::dev::NoPre"));
  // plan traits from before prologues (no P::Pre: a plan in MK_PLAN_DIR whose
  // source a group kernel recompiles) still compile, as no prologue
  std::string old = plain.source;
  const size_t at = old.find("using Pre = ::mk::dev::NoPre;");
  REQUIRE(at != std::string::npos);
  old.erase(at, std::string("using Pre = ::mk::dev::NoPre;").size());
  CHECK(!contains(old, "using Pre"));
  CHECK_NOTHROW((void)jit::compile(old, plain.kernel.name, 90, false));
}
