// PreMulSum's prologue: the verifier's proof (verify_prologue), the CPU
// executor and reference with per-rank scalars, and the compiled kernels.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "compiler/compile.hpp"
#include "compiler/pipeline.hpp"
#include "compiler/verify/executor.hpp"
#include "compiler/verify/reference.hpp"
#include "compiler/verify/verify.hpp"
#include "mk/dsl.hpp"
#include "support.hpp"

using namespace mk;
using mkt::catch_error;
using mkt::contains;

namespace {

compiler::Lowered lower_named(const std::string& name, int n, bool zero_copy = false, int64_t max_tile = 4096) {
  const auto* info = dsl::find_schedule(name);
  REQUIRE(info != nullptr);
  compiler::LowerOptions o;
  o.zero_copy = zero_copy;
  o.proto.max_tile_bytes = max_tile;
  return compiler::lower(dsl::build(*info, n), o);
}

// The staged (scratch) schedules of the reducing collectives: what the
// runtime runs PreMulSum with (copy-engine schedules never are).
std::vector<std::string> staged_reducing() {
  std::vector<std::string> v;
  for (const auto& s : dsl::registered_schedules())
    if (collective_reduces(s.coll) && !s.copy_engine && !contains(s.name, ".hier")) v.push_back(s.name);
  return v;
}

}  // namespace

TEST_CASE("verify_prologue: every staged built-in reducing schedule scales every input once, 1..9 ranks") {
  const auto names = staged_reducing();
  REQUIRE(names.size() >= 8);
  for (const auto& name : names)
    for (int n = 1; n <= 9; ++n) {
      CAPTURE(name);
      CAPTURE(n);
      const auto l = lower_named(name, n);
      for (const auto& v : l.variants) {
        const auto c = catch_error([&] { verify::verify_prologue(v); });
        CHECK_MESSAGE(!c, c.what);
      }
    }
}

TEST_CASE("verify_prologue: a zero-copy plan reads peers' inputs, whose scalars it lacks: mk.verify.E018") {
  for (const char* name : {"allreduce.direct", "reducescatter.pull"}) {
    CAPTURE(name);
    const auto l = lower_named(name, 4, true);
    const auto c = catch_error([&] { verify::verify_prologue(l.variants.front()); });
    CHECK(c.id == "mk.verify.E018");
    CHECK(contains(c.message, "input"));
    CHECK(contains(c.message, "only rank"));
    CHECK(c.loc.valid());  // the DSL line of the op
    // and the executor refuses to simulate what the kernel could not run
    verify::SimOptions so;
    so.op = RedOp::premulsum;
    so.count = 100;
    CHECK(catch_error([&] { verify::simulate(l.variants.front(), so); }).id == "mk.verify.E018");
  }
}

TEST_CASE("verify_prologue: an input read after its in-place output was written, an unscaled read through the "
          "in-place alias, an output never scaled, a collective that does not reduce") {
  SUBCASE("input read after the in-place output overwrote it") {
    dsl::Program p(Collective::allreduce, 1, 0, "test.reread");
    p.copy(p.scratch(0, 0), p.input(0, 0));
    p.copy(p.output(0, 0), p.scratch(0, 0));
    p.copy(p.scratch(0, 1), p.input(0, 0));
    const auto c = catch_error([&] { verify::verify_prologue(p.ir()); });
    CHECK(c.id == "mk.verify.E018");
    CHECK(contains(c.message, "in-place"));
    CHECK(contains(c.message, "after it was overwritten"));
    CHECK(c.loc.line > 0);
  }
  SUBCASE("the in-place output still holds the input: read unscaled") {
    dsl::Program p(Collective::allreduce, 1, 0, "test.alias");
    p.copy(p.scratch(0, 0), p.output(0, 0));
    p.copy(p.output(0, 0), p.scratch(0, 0));
    const auto c = catch_error([&] { verify::verify_prologue(p.ir()); });
    CHECK(c.id == "mk.verify.E018");
    CHECK(contains(c.message, "unscaled"));
  }
  SUBCASE("in place, a copy of an input onto itself that another op also reads") {
    // For a sum the self-copy writes nothing, so nothing orders it with the
    // send; a PreMulSum kernel writes the scaled value there (the review's
    // race: simulated in place it scaled the input twice).
    dsl::Program p(Collective::allreduce, 2, 0, "test.self_copy");
    for (int r = 0; r < 2; ++r) p.copy(p.scratch(1 - r, 0), p.input(r, 0), dsl::on(r, 1));
    for (int r = 0; r < 2; ++r) p.copy(p.output(r, 0), p.input(r, 0), dsl::on(r, 0));
    for (int r = 0; r < 2; ++r) p.reduce(p.output(r, 0), {p.output(r, 0), p.scratch(r, 0)}, dsl::on(r, 0));
    CHECK(!catch_error([&] { verify::verify_semantics(p.ir()); }));  // a proved schedule for a sum
    const auto c = catch_error([&] { verify::verify_prologue(p.ir()); });
    CHECK(c.id == "mk.verify.E018");
    CHECK(contains(c.message, "onto itself"));
    CHECK(contains(c.message, "also reads"));
    // and compile_plan refuses it for PreMulSum (it compiled, and simulated wrong, before)
    compiler::LowerOptions lo;
    const auto l = compiler::lower(p.ir(), lo);
    verify::SimOptions so;
    so.op = RedOp::premulsum;
    so.inplace = true;
    so.count = 1000;
    CHECK(catch_error([&] { verify::simulate(l.variants.front(), so); }).id == "mk.verify.E018");
  }
  SUBCASE("a peer's input, read on another rank") {
    dsl::Program p(Collective::allreduce, 2, 0, "test.peer");
    p.reduce(p.output(0, 0), {p.input(0, 0), p.input(1, 0)}, dsl::on(0));
    p.reduce(p.output(1, 0), {p.input(0, 0), p.input(1, 0)}, dsl::on(1));
    const auto c = catch_error([&] { verify::verify_prologue(p.ir()); });
    CHECK(c.id == "mk.verify.E018");
    CHECK(contains(c.message, "reads rank 1's input"));
  }
  SUBCASE("an output nothing wrote") {
    dsl::Program p(Collective::allreduce, 1, 0, "test.none");
    p.copy(p.scratch(0, 0), p.input(0, 0));
    const auto c = catch_error([&] { verify::verify_prologue(p.ir()); });
    CHECK(c.id == "mk.verify.E018");
    CHECK(contains(c.message, "output chunk 0"));
  }
  SUBCASE("the same program written soundly passes") {
    dsl::Program p(Collective::allreduce, 1, 0, "test.ok");
    p.copy(p.scratch(0, 0), p.input(0, 0));
    p.copy(p.output(0, 0), p.scratch(0, 0));
    CHECK(!catch_error([&] { verify::verify_prologue(p.ir()); }));
  }
  SUBCASE("all-gather does not reduce") {
    const auto l = lower_named("allgather.ring", 2);
    CHECK(catch_error([&] { verify::verify_prologue(l.variants.front()); }).id == "mk.verify.E018");
  }
}

TEST_CASE("reference: PreMulSum is the sum of each rank's input times its scalar, and rejects the plain sum") {
  const int n = 3;
  const int64_t count = 64;
  const verify::DataSpec d{DType::fp32, RedOp::premulsum, 5, 0, n};
  const verify::DataSpec plain{DType::fp32, RedOp::sum, 5, 0, n};
  std::vector<std::vector<float>> in(n, std::vector<float>(static_cast<size_t>(count)));
  for (int q = 0; q < n; ++q) verify::fill_input(plain, q, 0, count, in[size_t(q)].data());
  // The scalars are as documented: 1, 1.25, 1.5 (floats), q + 2 (integers).
  CHECK(verify::prescale_of(DType::fp32, 0) == 1.0);
  CHECK(verify::prescale_of(DType::fp32, 1) == 1.25);
  CHECK(verify::prescale_of(DType::bf16, 6) == 1.5);
  CHECK(verify::prescale_of(DType::int32, 3) == 5.0);
  std::vector<float> scaled(static_cast<size_t>(count)), summed(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    double s = 0, t = 0;
    for (int q = 0; q < n; ++q) {
      s += double(in[size_t(q)][size_t(i)]) * (1.0 + q / 4.0);
      t += double(in[size_t(q)][size_t(i)]);
    }
    scaled[size_t(i)] = float(s);
    summed[size_t(i)] = float(t);
  }
  // premulsum's data is the sum op's (the fill does not depend on the scale)
  std::vector<float> again(static_cast<size_t>(count));
  verify::fill_input(d, 1, 0, count, again.data());
  CHECK(std::memcmp(again.data(), in[1].data(), again.size() * sizeof(float)) == 0);
  CHECK(verify::check_output(Collective::allreduce, d, n, 0, count, 0, scaled.data(), count).mismatches == 0);
  CHECK(verify::check_output(Collective::allreduce, d, n, 0, count, 0, summed.data(), count).mismatches > count / 2);
  // integers: exact, with wrap-around
  const verify::DataSpec di{DType::int32, RedOp::premulsum, 5, 0, n};
  std::vector<std::vector<int32_t>> ii(n, std::vector<int32_t>(static_cast<size_t>(count)));
  for (int q = 0; q < n; ++q) verify::fill_input(di, q, 0, count, ii[size_t(q)].data());
  std::vector<int32_t> want(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    uint32_t acc = 0;
    for (int q = 0; q < n; ++q) acc += uint32_t(ii[size_t(q)][size_t(i)]) * uint32_t(q + 2);
    want[size_t(i)] = int32_t(acc);
  }
  CHECK(verify::check_output(Collective::allreduce, di, n, 0, count, 1, want.data(), count).mismatches == 0);
  want[7] ^= 1;
  CHECK(verify::check_output(Collective::allreduce, di, n, 0, count, 1, want.data(), count).mismatches == 1);
}

TEST_CASE("executor: PreMulSum on every staged reducing schedule, every dtype, odd counts, in-place and out-of-place") {
  int64_t runs = 0;
  for (const auto& name : staged_reducing()) {
    const auto l = lower_named(name, 3);
    for (DType t : all_dtypes())
      for (int64_t count : {int64_t(1), int64_t(7), int64_t(1001)})
        for (bool inplace : {false, true}) {
          CAPTURE(name);
          CAPTURE(mk::name(t));
          CAPTURE(count);
          CAPTURE(inplace);
          verify::SimOptions so;
          so.dtype = t;
          so.op = RedOp::premulsum;
          so.count = count;
          so.inplace = inplace;
          so.seed = uint64_t(count) + 11;
          const size_t b = l.variants.size() > 1 && count * int64_t(dtype_size(t)) > 1024 ? 1 : 0;
          const auto r = verify::simulate(l.variants[b], so);
          CHECK_MESSAGE(r.ok, r.first_bad);
          ++runs;
        }
  }
  CHECK(runs >= 8 * 12 * 6);
}

TEST_CASE("compile: PreMulSum kernels compile for LL, Lamport, simple and wide ops, and zero-copy is refused") {
  if (!mkt::have_nvrtc()) {
    MESSAGE("SKIPPED: NVRTC is not available");
    return;
  }
  struct Case {
    const char* schedule;
    int n;
    DType t;
  };
  // one-shot bf16: Lamport and simple buckets; int8 ring: LL; 9-source
  // reduce-scatter: wide ops; fp8 at 10 ranks: took NVRTC minutes when the
  // prologue's narrow conversions were inlined into every copy.
  for (const Case& c : {Case{"allreduce.one_shot", 2, DType::bf16}, Case{"allreduce.ring", 3, DType::int8},
                        Case{"reducescatter.direct", 9, DType::fp32}, Case{"allreduce.one_shot", 10, DType::fp8e4m3}}) {
    CAPTURE(c.schedule);
    CAPTURE(c.n);
    compiler::CompileOptions o;
    o.dtype = c.t;
    o.op = RedOp::premulsum;
    o.use_cache = false;
    const plan::Plan p = compiler::compile_plan(dsl::build(*dsl::find_schedule(c.schedule), c.n, 0), o);
    REQUIRE(!p.kernels.empty());
    for (const auto& k : p.kernels) {
      CHECK(contains(k.name, "premulsum"));
      CHECK(contains(k.source, "kRed = 5"));
    }
  }
  compiler::CompileOptions o;
  o.op = RedOp::premulsum;
  o.use_cache = false;
  o.lower.zero_copy = true;
  const auto c = catch_error(
      [&] { compiler::compile_plan(dsl::build(*dsl::find_schedule("allreduce.direct"), 2, 0), o); });
  CHECK(c.id == "mk.verify.E018");
}

TEST_CASE("compile: PreMulSum kernels round each scaled input by itself (no fused multiply-add), so ranks add equal terms") {
  // A rank scales its own input in registers; its peers add the product it
  // stored in their scratch. NVVM contracts `acc + x * f` into one fma,
  // which rounds once: on the GPU the ranks then differed bit-wise (fp32,
  // fp64). The CPU executor cannot see that, so look at the PTX.
  const std::string nvcc = "/usr/local/cuda/bin/nvcc";
  if (!mkt::have_nvrtc() || !std::filesystem::exists(nvcc)) {
    MESSAGE("SKIPPED: needs NVRTC and " << nvcc);
    return;
  }
  const std::filesystem::path repo = std::filesystem::path(mkt::test_dir()).parent_path();
  mkt::TempDir d;
  for (DType t : {DType::fp32, DType::fp64}) {
    CAPTURE(mk::name(t));
    compiler::CompileOptions o;
    o.dtype = t;
    o.op = RedOp::premulsum;
    o.use_cache = false;
    o.lower.max_bytes = 65536;  // the small-message kernel only (one-shot, every rank adds its own input in registers)
    const plan::Plan p = compiler::compile_plan(dsl::build(*dsl::find_schedule("allreduce.one_shot"), 4, 0), o);
    REQUIRE(p.kernels.size() == 1);
    const auto cu = d / (std::string(mk::name(t)) + ".cu"), ptx = d / (std::string(mk::name(t)) + ".ptx");
    mkt::write_text(cu, p.kernels[0].source);
    const std::string cmd = fmt::format("{} -ptx -arch=sm_90 -std=c++17 -I{} -I{} -o {} {} 2>&1", nvcc,
                                        (repo / "templates").string(), repo.string(), ptx.string(), cu.string());
    REQUIRE_MESSAGE(std::system(cmd.c_str()) == 0, cmd);
    const std::string text = mkt::read_text(ptx);
    const std::string w = t == DType::fp32 ? "f32" : "f64";
    auto count = [&](const std::string& what) {
      size_t n = 0;
      for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
      return n;
    };
    CHECK(count("fma.rn." + w) == 0);
    CHECK(count("mul.rn." + w) > 0);
  }
}
