// Fused epilogues: the registry, the built-ins' code on the host against
// independent float64 references, the verifier's proof (verify_epilogue), and
// fused plans compiled by NVRTC.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <string>
#include <vector>

#include "compiler/codegen/codegen.hpp"
#include "compiler/compile.hpp"
#include "compiler/pipeline.hpp"
#include "compiler/plan/plan.hpp"
#include "compiler/verify/fused_ref.hpp"
#include "compiler/verify/verify.hpp"
#include "mk/dsl.hpp"
#include "mk/fusion.hpp"
#include "support.hpp"

using namespace mk;
using mkt::catch_error;
using mkt::contains;
namespace fr = mk::verify::fused;

namespace {

const dsl::FusionInfo& fusion(const std::string& name) {
  const dsl::FusionInfo* f = dsl::find_fusion(name);
  REQUIRE_MESSAGE(f != nullptr, name);
  return *f;
}

// What an all-reduce of `nranks` ranks' inputs holds, as the dtype stores it
// (the exact sum, rounded once), and the sum's magnitude.
void allreduce_of(int nranks, int64_t count, DType t, uint64_t seed, std::vector<double>* ar,
                  std::vector<double>* mag) {
  ar->assign(size_t(count), 0.0);
  mag->assign(size_t(count), 0.0);
  for (int r = 0; r < nranks; ++r)
    for (int64_t i = 0; i < count; ++i) {
      const double v = fr::value(seed, uint64_t(r), i, t);
      (*ar)[size_t(i)] += v;
      (*mag)[size_t(i)] += std::fabs(v);
    }
}

double round_to(double v, DType t) { return dsl::fusion_detail::host_round(v, t); }

}  // namespace

TEST_CASE("fusion registry: the built-ins are registered with their operands, scalars and dtypes") {
  const auto& n = fusion("allreduce.rmsnorm");
  REQUIRE(n.operands.size() == 3);
  CHECK(n.operands[0].name == "residual");
  CHECK(!n.operands[0].output);
  CHECK(n.operands[1].name == "residual_out");
  CHECK(n.operands[1].output);
  CHECK(n.operands[2].shape == dsl::Shape::col);
  CHECK(n.scalars == std::vector<std::string>{"eps"});
  CHECK(n.rows == dsl::RowMode::given);
  CHECK(n.max_row == 16384);
  CHECK(contains(n.source, "struct Epi"));
  CHECK(!contains(n.source, "__device__"));  // the code as written: MK_DEV stays a name for NVRTC's headers
  const auto& q = fusion("allreduce.fp8_rows");
  REQUIRE(q.operands.size() == 2);
  CHECK(q.operands[0].dtype == DType::fp8e4m3);
  CHECK(!q.operands[0].same_dtype);
  CHECK(q.operands[1].shape == dsl::Shape::row);
  CHECK(q.operands[1].dtype == DType::fp32);
  CHECK(dsl::find_fusion("no.such.fusion") == nullptr);
}

// A host build that touches nothing (registry tests fill FusionInfo by hand;
// the checker runs the host build before a fusion is handed out).
static void host_noop(dsl::fusion_detail::HostRowBase&) {}
static void set_noop(dsl::FusionInfo& f) {
  for (auto& h : f.host) h = &host_noop;
}

TEST_CASE("fusion registry: a malformed fusion is refused with mk.dsl.E009 when it is asked for, a fixed one replaces it") {
  dsl::FusionInfo f;
  f.name = "test.malformed";
  f.source = "struct Epi {};";
  set_noop(f);
  f.file = "here.cpp";
  f.line = 7;
  for (int k = 0; k < 7; ++k) f.operands.push_back({fmt::format("op{}", k), dsl::Shape::elem, false});
  CHECK(!dsl::register_fusion(f));
  auto c = catch_error([&] { (void)dsl::find_fusion("test.malformed"); });
  CHECK(c.id == "mk.dsl.E009");
  CHECK(contains(c.what, "7 operands"));
  CHECK(contains(c.what, "here.cpp:7"));
  // the other checks
  auto refused = [&](dsl::FusionInfo g, const char* why) {
    g.name = "test.malformed2";
    CHECK(!dsl::register_fusion(g));
    auto e = catch_error([&] { (void)dsl::find_fusion("test.malformed2"); });
    CHECK(e.id == "mk.dsl.E009");
    CHECK_MESSAGE(contains(e.what, why), e.what);
  };
  dsl::FusionInfo ok;
  ok.source = "struct Epi {};";
  set_noop(ok);
  dsl::FusionInfo g = ok;
  g.dtypes = {DType::int32};
  refused(g, "floating-point");
  g = ok;
  g.max_row = 0;
  refused(g, "max_row");
  g = ok;
  g.rows = dsl::RowMode::any;
  g.operands = {{"w", dsl::Shape::col, false}};
  refused(g, "runtime's choice");
  g = ok;
  g.source = "int x;";
  refused(g, "no struct Epi");
  g = ok;
  g.scalars = {"a", "b", "c", "d", "e"};
  refused(g, "5 scalars");
  g = ok;
  g.operands = {{"", dsl::Shape::elem, false}};
  refused(g, "no name");
  g = ok;
  g.operands = {{"w", dsl::Shape::col, true}};
  refused(g, "per-column output");
  g = ok;
  g.host[2] = nullptr;  // code the checker could not run
  refused(g, "no host build");
  // A valid registration of the name clears the refusal.
  f.operands.resize(2);
  CHECK(dsl::register_fusion(f));
  CHECK(dsl::find_fusion("test.malformed") != nullptr);
}

TEST_CASE("fusion registry: a replacement is a new entry, and what find_fusion returned before stays valid and unchanged") {
  dsl::FusionInfo f;
  f.name = "test.replaced";
  f.source = "struct Epi {};";
  set_noop(f);
  f.doc = "first";
  REQUIRE(dsl::register_fusion(f));
  const dsl::FusionInfo* a = dsl::find_fusion("test.replaced");
  REQUIRE(a != nullptr);
  const size_t n = dsl::registered_fusions().size();
  f.doc = "second";
  f.source = "struct Epi { /* v2 */ };";
  REQUIRE(dsl::register_fusion(f));
  CHECK(a->doc == "first");  // a thread still using the old entry sees it whole
  CHECK(a->source == "struct Epi {};");
  const dsl::FusionInfo* b = dsl::find_fusion("test.replaced");
  REQUIRE(b != nullptr);
  CHECK(b->doc == "second");
  CHECK(b->source == "struct Epi { /* v2 */ };");
  CHECK(dsl::registered_fusions().size() == n);  // listed once
}

TEST_CASE("allreduce.rmsnorm's code on the host matches the float64 reference: fp16, bf16, fp32, rows 1..16384, "
          "odd token counts, residual updated in place or not") {
  const auto& f = fusion("allreduce.rmsnorm");
  uint64_t seed = 11;
  for (DType t : {DType::fp16, DType::bf16, DType::fp32})
    for (int64_t row : {int64_t(1), int64_t(7), int64_t(1023), int64_t(1024), int64_t(4096), int64_t(16384)})
      for (int64_t tokens : {int64_t(1), int64_t(3), int64_t(17)})
        for (bool same : {false, true}) {
          CAPTURE(name(t));
          CAPTURE(row);
          CAPTURE(tokens);
          CAPTURE(same);
          const int64_t count = row * tokens;
          std::vector<double> ar, mag;
          allreduce_of(3, count, t, seed, &ar, &mag);
          std::vector<double> residual(static_cast<size_t>(count)), weight(static_cast<size_t>(row));
          for (int64_t i = 0; i < count; ++i) residual[size_t(i)] = fr::value(seed, 100, i, t);
          for (int64_t j = 0; j < row; ++j) weight[size_t(j)] = 0.5 + fr::value(seed, 101, j, t) * 0.25;
          // the all-reduce's output as the dtype holds it
          std::vector<double> out(ar.size());
          for (size_t i = 0; i < ar.size(); ++i) out[i] = round_to(ar[i], t);
          std::vector<double> res = residual, res_out(residual.size(), -7.0), w = weight;
          double* ops[3] = {res.data(), same ? res.data() : res_out.data(), w.data()};
          const double eps_v = 1e-6;
          dsl::run_fusion_host(f, t, count, row, out.data(), ops, &eps_v);
          const auto ref = fr::rmsnorm(ar, mag, residual, weight, eps_v, row, t);
          const std::vector<double>& got_ro = same ? res : res_out;
          const std::string bad = fr::first_bad(got_ro, ref.residual_out, ref.residual_out_tol, "residual_out") +
                                  fr::first_bad(out, ref.out, ref.out_tol, "out");
          CHECK_MESSAGE(bad.empty(), bad);
          ++seed;
        }
}

TEST_CASE("allreduce.fp8_rows's code on the host matches the float64 reference, an all-zero row gets scale 1") {
  const auto& f = fusion("allreduce.fp8_rows");
  uint64_t seed = 77;
  for (DType t : {DType::fp16, DType::bf16, DType::fp32})
    for (int64_t row : {int64_t(1), int64_t(5), int64_t(1024), int64_t(16384)})
      for (int64_t tokens : {int64_t(1), int64_t(3)}) {
        CAPTURE(name(t));
        CAPTURE(row);
        CAPTURE(tokens);
        const int64_t count = row * tokens;
        std::vector<double> ar, mag;
        allreduce_of(2, count, t, seed++, &ar, &mag);
        if (tokens == 3)
          for (int64_t j = 0; j < row; ++j) ar[size_t(row + j)] = mag[size_t(row + j)] = 0;  // row 1 all zero
        std::vector<double> out(ar.size());
        for (size_t i = 0; i < ar.size(); ++i) out[i] = round_to(ar[i], t);
        const std::vector<double> before = out;
        std::vector<double> q(ar.size(), -1.0), scales(size_t(tokens), -1.0);
        double* ops[2] = {q.data(), scales.data()};
        dsl::run_fusion_host(f, t, count, row, out.data(), ops, nullptr);
        const auto ref = fr::fp8_rows(ar, mag, row, t);
        std::string bad = fr::first_bad(scales, ref.scales, ref.scale_tol, "scales");
        bad += fr::first_bad(q, ref.q, ref.q_tol, "q");  // ref.q: of the reference's scale
        CHECK_MESSAGE(bad.empty(), bad);
        CHECK(out == before);  // the receive buffer keeps the all-reduce
        if (tokens == 3) CHECK(scales[1] == 1.0);
      }
  // A row of tiny values (amax / 448 below the smallest normal float): the
  // scale stays normal, so zeros stay zeros and nothing becomes NaN or inf.
  const int64_t row = 64;
  std::vector<double> ar(static_cast<size_t>(row)), mag(static_cast<size_t>(row));
  for (int64_t j = 0; j < row; ++j) {
    ar[size_t(j)] = j % 3 == 0 ? 0.0 : std::ldexp(double(j), -140);
    mag[size_t(j)] = std::fabs(ar[size_t(j)]);
  }
  for (DType t : {DType::fp32, DType::bf16}) {
    CAPTURE(name(t));
    std::vector<double> out(ar.size());
    for (size_t i = 0; i < ar.size(); ++i) out[i] = round_to(ar[i], t);
    std::vector<double> q(ar.size(), -1.0), scales(1, -1.0);
    double* ops[2] = {q.data(), scales.data()};
    dsl::run_fusion_host(f, t, row, row, out.data(), ops, nullptr);
    CHECK(std::isfinite(scales[0]));
    CHECK(scales[0] >= std::ldexp(1.0, -126));
    for (int64_t j = 0; j < row; ++j) {
      CHECK(std::isfinite(q[size_t(j)]));
      if (j % 3 == 0) CHECK(q[size_t(j)] == 0.0);
    }
  }
}

TEST_CASE("the references catch a wrong epilogue: RMSNorm without the residual, fp8 scales for e5m2's range") {
  // The checks above would pass anything if the references were lax: a
  // plausible bug must fail them.
  const int64_t row = 1024, count = 2 * row;
  std::vector<double> ar, mag;
  allreduce_of(3, count, DType::bf16, 5, &ar, &mag);
  std::vector<double> residual(static_cast<size_t>(count)), weight(static_cast<size_t>(row), 1.0);
  for (int64_t i = 0; i < count; ++i) residual[size_t(i)] = fr::value(5, 100, i, DType::bf16);
  const auto ref = fr::rmsnorm(ar, mag, residual, weight, 1e-6, row, DType::bf16);
  const auto no_residual = fr::rmsnorm(ar, mag, std::vector<double>(size_t(count), 0.0), weight, 1e-6, row,
                                       DType::bf16);
  CHECK(!fr::first_bad(no_residual.out, ref.out, ref.out_tol, "out").empty());
  const auto q = fr::fp8_rows(ar, mag, row, DType::bf16);
  std::vector<double> scales = q.scales;
  scales[0] *= 448.0 / 240;  // a plausible slip: another format's largest value
  CHECK(!fr::first_bad(scales, q.scales, q.scale_tol, "scales").empty());
}

TEST_CASE("verify_epilogue: every staged built-in all-reduce lets the epilogue see its output final, 1..9 ranks") {
  int checked = 0;
  for (const auto& s : dsl::registered_schedules()) {
    if (s.coll != Collective::allreduce || s.copy_engine || contains(s.name, ".hier")) continue;
    for (int n = 1; n <= 9; ++n) {
      CAPTURE(s.name);
      CAPTURE(n);
      compiler::LowerOptions o;
      o.proto.max_tile_bytes = 4096;
      const auto l = compiler::lower(dsl::build(s, n), o);
      for (const auto& v : l.variants) {
        const auto c = catch_error([&] { verify::verify_epilogue(v, "allreduce.rmsnorm"); });
        CHECK_MESSAGE(!c, c.what);
        ++checked;
      }
    }
  }
  CHECK(checked >= 40);
}

TEST_CASE("verify_epilogue refuses what would race with the tail: zero-copy plans, an op on a peer's output, "
          "collectives other than all-reduce (mk.verify.E019)") {
  compiler::LowerOptions zc;
  zc.zero_copy = true;
  const auto l = compiler::lower(dsl::build(*dsl::find_schedule("allreduce.direct"), 2), zc);
  auto c = catch_error([&] { verify::verify_epilogue(l.variants.front(), "allreduce.rmsnorm"); });
  CHECK(c.id == "mk.verify.E019");
  CHECK(contains(c.what, "zero-copy"));
  // at the op that touches a peer's buffer, not at the MK_SCHEDULE line
  CHECK(contains(c.what, "reads rank"));
  CHECK(contains(c.loc.file, "allreduce_direct.cpp"));
  CHECK(c.loc.line > 0);
  CHECK(c.loc.line != uint32_t(mkt::line_of(mkt::test_dir() + "/../schedules/allreduce_direct.cpp", "MK_SCHEDULE(")));
  // A staged plan whose op is edited to write the peer's output directly
  // (what an imported or hand-lowered program could do).
  auto staged = compiler::lower(dsl::build(*dsl::find_schedule("allreduce.ring"), 3), compiler::LowerOptions{});
  ir::Schedule v = staged.variants.front();
  bool edited = false;
  for (auto& op : v.ops)
    if (op.is_data() && !edited)
      for (auto& d : op.dsts)
        if (d.buf == ir::Buf::output && !edited) {
          d.rank = (op.rank + 1) % v.nranks;
          edited = true;
        }
  REQUIRE(edited);
  c = catch_error([&] { verify::verify_epilogue(v, "allreduce.rmsnorm"); });
  CHECK(c.id == "mk.verify.E019");
  CHECK_MESSAGE(contains(c.what, "writes rank"), c.what);
  CHECK_MESSAGE(contains(c.what, "allreduce_ring.cpp"), c.what);  // the DSL line of the op
  const auto rs = compiler::lower(dsl::build(*dsl::find_schedule("reducescatter.ring"), 2), compiler::LowerOptions{});
  c = catch_error([&] { verify::verify_epilogue(rs.variants.front(), "allreduce.rmsnorm"); });
  CHECK(c.id == "mk.verify.E019");
  CHECK(contains(c.what, "not an all-reduce"));
}

TEST_CASE("fused plans: NVRTC compiles the epilogue into every bucket's kernel tail, the plan names its fusion, which "
          "shapes the cache key; bad dtypes, names and collectives are refused") {
  for (const char* fname : {"allreduce.rmsnorm", "allreduce.fp8_rows"})
    for (const char* sched : {"allreduce.one_shot", "allreduce.ring"})
      for (DType t : {DType::bf16, DType::fp32}) {
        CAPTURE(fname);
        CAPTURE(sched);
        CAPTURE(name(t));
        compiler::CompileOptions o;
        o.dtype = t;
        o.fusion = fname;
        const ir::Schedule built = dsl::build(*dsl::find_schedule(sched), 3);
        plan::Plan p = compiler::compile_plan(built, o);
        CHECK(p.fusion == compiler::fusion_identity(fname));
        CHECK(p.fusion.rfind(std::string(fname) + "@", 0) == 0);  // name@hash of the code
        REQUIRE(!p.kernels.empty());
        for (const auto& k : p.kernels) {
          CHECK(contains(k.source, "mk::dev::epilogue_tail<"));
          CHECK(contains(k.source, "struct Epi"));
          CHECK(!k.cubin.empty());
          CHECK(contains(k.name, codegen::identifier(fname)));
        }
        compiler::CompileOptions plain = o;
        plain.fusion.clear();
        CHECK(compiler::plan_key(built, o) != compiler::plan_key(built, plain));
        // plan.json keeps the fusion
        mkt::TempDir dir("fused_plan");
        plan::write_dir(p, dir.path.string());
        CHECK(plan::read_dir(dir.path.string()).fusion == p.fusion);
      }
  compiler::CompileOptions o;
  o.fusion = "allreduce.rmsnorm";
  o.dtype = DType::int32;
  auto c = catch_error([&] { compiler::compile_plan(dsl::build(*dsl::find_schedule("allreduce.ring"), 2), o); });
  CHECK(c.id == "mk.cli.E013");
  CHECK(contains(c.what, "does not serve int32"));
  o.dtype = DType::bf16;
  o.fusion = "no.such";
  c = catch_error([&] { compiler::compile_plan(dsl::build(*dsl::find_schedule("allreduce.ring"), 2), o); });
  CHECK(c.id == "mk.cli.E011");
  CHECK(contains(c.what, "allreduce.rmsnorm"));
  o.fusion = "allreduce.rmsnorm";
  c = catch_error([&] { compiler::compile_plan(dsl::build(*dsl::find_schedule("allgather.ring"), 2), o); });
  CHECK(c.id == "mk.cli.E013");
  CHECK(contains(c.what, "all-reduce"));
}

TEST_CASE("fused plans with checked accessors (MK_FUSION_CHECK, --fusion-check): their source, key and plan.json say so") {
  if (!mkt::have_nvrtc()) {
    MESSAGE("SKIPPED: NVRTC not found");
    return;
  }
  compiler::CompileOptions o;
  o.dtype = DType::bf16;
  o.fusion = "allreduce.rmsnorm";
  const ir::Schedule built = dsl::build(*dsl::find_schedule("allreduce.ring"), 2);
  compiler::CompileOptions checked = o;
  checked.fusion_check = true;
  CHECK(compiler::plan_key(built, o) != compiler::plan_key(built, checked));
  const plan::Plan p = compiler::compile_plan(built, checked);
  CHECK(p.fusion_check);
  for (const auto& k : p.kernels) {
    CHECK(contains(k.source, "static constexpr bool kCheck = true;"));
    CHECK(contains(k.source, "return \"allreduce.rmsnorm\";"));
    CHECK(!k.cubin.empty());  // NVRTC compiles the checked accessors
  }
  CHECK(contains(plan::summary(p), "(checked accessors)"));
  mkt::TempDir dir("checked_plan");
  plan::write_dir(p, dir.path.string());
  CHECK(plan::read_dir(dir.path.string()).fusion_check);  // the runtime matches MK_PLAN_DIR plans on it
  const plan::Plan plain = compiler::compile_plan(built, o);
  CHECK(!plain.fusion_check);
  for (const auto& k : plain.kernels) CHECK(!contains(k.source, "kCheck"));  // unchecked plans keep their source
  std::string j = plan::to_json(plain);
  CHECK(!contains(j, "fusion_check"));
  j.insert(j.find('{') + 1, "\"fusion_check\": 3,");
  CHECK(catch_error([&] { plan::from_json(j, "test"); }).id == "mk.plan.E001");
}

TEST_CASE("plan.json: a fusion name that is not a name is refused (mk.plan.E001)") {
  compiler::CompileOptions o;
  o.dtype = DType::fp32;
  o.fusion = "allreduce.rmsnorm";
  plan::Plan p = compiler::compile_plan(dsl::build(*dsl::find_schedule("allreduce.one_shot"), 2), o);
  std::string j = plan::to_json(p);
  const std::string quoted = "\"" + p.fusion + "\"";
  const auto at = j.find(quoted);
  REQUIRE(at != std::string::npos);
  j.replace(at, quoted.size(), "\"../../etc/x y\"");
  auto c = catch_error([&] { plan::from_json(j, "test"); });
  CHECK(c.id == "mk.plan.E001");
  CHECK(contains(c.what, "fusion"));
}
