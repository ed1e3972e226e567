// Composites (include/mk/composite.hpp): the DSL's checks with their ids and
// lines, the order stages must keep, the built-ins, and `mkc composite`.
#include <doctest/doctest.h>

#include <functional>
#include <string>

#include "compiler/pipeline.hpp"
#include "compiler/verify/composite.hpp"
#include "compiler/verify/reference.hpp"
#include "mk/composite.hpp"
#include "mk/dsl.hpp"
#include "support.hpp"

using namespace mk;
using mkt::mkc;

namespace {

using mkt::error_id;

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

void no_stage(dsl::Composite& c) { c.buffer("a"); }
void throws(dsl::Composite&) { throw std::runtime_error("boom"); }
void unknown_schedule(dsl::Composite& c) {
  const int a = c.buffer("a"), b = c.buffer("b");
  c.all_gather(a, b, "allgather.nonesuch");
}
void wrong_collective(dsl::Composite& c) {
  const int a = c.buffer("a"), b = c.buffer("b");
  c.reduce_scatter(a, b, "allgather.ring");
}
void copy_engine(dsl::Composite& c) {
  const int a = c.buffer("a"), b = c.buffer("b");
  c.all_gather(a, b, "allgather.ce");
}

}  // namespace

TEST_CASE("composite DSL: bad buffers, in-place forms, roots and stage counts are refused at the user's line") {
  dsl::Composite c(4, "t");
  const int a = c.buffer("a"), b = c.buffer("b");
  std::string what;
  CHECK(error_id([&] { c.buffer("a"); }, &what) == ErrId::dsl_E010);
  CHECK(has(what, "declared twice"));
  CHECK(error_id([&] { c.buffer("has space"); }) == ErrId::dsl_E010);
  CHECK(error_id([&] { c.buffer(""); }) == ErrId::dsl_E010);
  const int line = __LINE__ + 1;
  CHECK(error_id([&] { c.all_reduce(a, 7); }, &what) == ErrId::dsl_E010);
  CHECK_MESSAGE((has(what, "buffer 7 is not declared") && has(what, "test_composite.cpp:" + std::to_string(line))), what);
  CHECK(error_id([&] { c.all_gather(-1, b); }) == ErrId::dsl_E010);
  // in place: the same pointer for all-reduce, broadcast and reduce only
  CHECK_NOTHROW(c.all_reduce(a, a));
  CHECK_NOTHROW(c.broadcast(a, a, 3));
  CHECK_NOTHROW(c.reduce(b, b, 0));
  CHECK(error_id([&] { c.all_gather(a, a); }, &what) == ErrId::dsl_E010);
  CHECK(has(what, "in-place"));
  CHECK(error_id([&] { c.reduce_scatter(b, b); }) == ErrId::dsl_E010);
  CHECK(error_id([&] { c.all_to_all(a, a); }) == ErrId::dsl_E010);
  // roots
  CHECK(error_id([&] { c.broadcast(a, b, 4); }) == ErrId::dsl_E001);
  CHECK(error_id([&] { c.reduce(a, b, -1); }) == ErrId::dsl_E001);
  CHECK(error_id([&] { c.stage(Collective::allreduce, a, b, 1, ""); }) == ErrId::dsl_E010);
  // at most kMaxStages
  while (c.stages().size() < size_t(dsl::kMaxStages)) c.all_reduce(a, b);
  CHECK(error_id([&] { c.all_reduce(a, b); }, &what) == ErrId::dsl_E010);
  CHECK(has(what, "more than 32 stages"));
  CHECK(error_id([] { dsl::Composite(0); }) == ErrId::dsl_E004);
}

TEST_CASE("composite DSL: buffer sizes follow each collective's blocks, a stage depends on one that writes what it "
          "touches or overwrites what it reads") {
  dsl::Composite c(4);
  const int grads = c.buffer("grads"), shard = c.buffer("shard"), full = c.buffer("full"), x = c.buffer("x"),
            unused = c.buffer("unused");
  const int rs = c.reduce_scatter(grads, shard);
  const int ag = c.all_gather(shard, full);      // reads what rs writes
  const int ar = c.all_reduce(x, x);             // independent
  const int ow = c.all_gather(x, grads);         // overwrites what rs reads; reads what ar writes
  CHECK(c.buffer_elems(grads, 10) == 40);
  CHECK(c.buffer_elems(shard, 10) == 10);
  CHECK(c.buffer_elems(full, 10) == 40);
  CHECK(c.buffer_elems(x, 10) == 10);
  CHECK(c.buffer_elems(unused, 10) == 0);
  CHECK(c.depends(rs, ag));
  CHECK_FALSE(c.depends(rs, ar));
  CHECK_FALSE(c.depends(ag, ar));
  CHECK(c.depends(rs, ow));   // write after read
  CHECK(c.depends(ar, ow));   // read after write
  CHECK_FALSE(c.depends(ag, ow));
}

TEST_CASE("composite DSL: build_composite checks the schedules stages name, and the built-ins build for 1..8 ranks") {
  std::string what;
  auto build = [](const char* name, dsl::CompositeFn f) {
    return dsl::build_composite(dsl::CompositeInfo{name, f, "", "user.cpp", 9}, 4);
  };
  CHECK(error_id([&] { build("t.none", no_stage); }, &what) == ErrId::dsl_E010);
  CHECK_MESSAGE((has(what, "has no stage") && has(what, "user.cpp:9")), what);
  CHECK(error_id([&] { build("t.throws", throws); }, &what) == ErrId::dsl_E007);
  CHECK(has(what, "boom"));
  CHECK(error_id([&] { build("t.unknown", unknown_schedule); }, &what) == ErrId::dsl_E010);
  CHECK_MESSAGE((has(what, "'allgather.nonesuch', which is not registered") && has(what, "test_composite.cpp:")), what);
  CHECK(error_id([&] { build("t.wrong", wrong_collective); }, &what) == ErrId::dsl_E010);
  CHECK(has(what, "which computes allgather"));
  CHECK(error_id([&] { build("t.ce", copy_engine); }, &what) == ErrId::dsl_E010);
  CHECK(has(what, "copy engines"));
  for (const char* name : {"composite.zero_step", "composite.reduce_scatter_all_gather"}) {
    const dsl::CompositeInfo* info = dsl::find_composite(name);
    REQUIRE_MESSAGE(info != nullptr, name);
    for (int n = 1; n <= 8; ++n) {
      const dsl::Composite c = dsl::build_composite(*info, n);
      CHECK(c.stages().size() == 2);
    }
  }
  const dsl::Composite z = dsl::build_composite(*dsl::find_composite("composite.zero_step"), 4);
  CHECK_FALSE(z.depends(0, 1));
  const dsl::Composite r = dsl::build_composite(*dsl::find_composite("composite.reduce_scatter_all_gather"), 4);
  CHECK(r.depends(0, 1));
}

TEST_CASE("mkc composite: buffers, stages and their order, the proof of each named schedule, mkc list names "
          "composites, a user file's composite and its errors") {
  auto r = mkc({"composite", "composite.reduce_scatter_all_gather", "-n", "4"});
  INFO(r);
  REQUIRE(r.exit_code == 0);
  CHECK(has(r.out, "in                   4 x c"));
  CHECK(has(r.out, "shard                c"));
  CHECK(has(r.out, "after stage(s) 0"));
  CHECK(has(r.out, "proved: reducescatter.ring"));
  CHECK(has(r.out, "proved: allgather.ring"));
  auto z = mkc({"composite", "composite.zero_step", "-n", "8"});
  CHECK(z.exit_code == 0);
  CHECK(has(z.out, "the runtime's selection"));
  CHECK(has(z.out, "independent of the stages before"));
  auto l = mkc({"list"});
  CHECK(has(l.out, "composite.zero_step"));
  auto u = mkc({"composite", "no.such", "-n", "2"});
  CHECK(u.exit_code == 1);
  CHECK(has(u.err, "mk.cli.E001"));
  CHECK(mkc({"composite", "composite.zero_step"}).exit_code == 1);  // no --ranks

  mkt::TempDir d("mkt-composite");
  mkt::write_text(d / "mine.cpp", R"(#include <mk/composite.hpp>
using namespace mk::dsl;
static void ar_then_bcast(Composite& c) {
  const int x = c.buffer("x"), y = c.buffer("y");
  c.all_reduce(x, y, "allreduce.ring");
  c.broadcast(y, y, 0);
}
MK_COMPOSITE("mine.ar_then_bcast", ar_then_bcast, "all-reduce, then broadcast the result in place");
static void broken(Composite& c) {
  const int x = c.buffer("x"), y = c.buffer("y");
  c.all_gather(x, y, "allreduce.ring");
}
MK_COMPOSITE("mine.broken", broken, "names an all-reduce schedule for an all-gather");
)");
  auto f = mkc({"composite", (d / "mine.cpp").string(), "-n", "2"});
  INFO(f);
  CHECK(has(f.out, "composite mine.ar_then_bcast for 2 ranks"));
  CHECK(has(f.out, "proved: allreduce.ring"));
  CHECK(f.exit_code == 1);  // mine.broken
  CHECK(has(f.err, "mk.dsl.E010"));
  CHECK(has(f.err, "mine.cpp:11"));
}

namespace {

ir::Schedule lowered_for(const std::string& schedule, int n, int64_t bytes) {
  const compiler::Lowered l = compiler::lower(dsl::build(*dsl::find_schedule(schedule), n), compiler::LowerOptions{});
  return compiler::variant_for(l, bytes);
}

}  // namespace

TEST_CASE("composite simulation: a reduce-scatter chained into an all-gather leaves the all-reduce of the input in "
          "`out` (checked against the reference alone), and a broken stage is caught") {
  const int n = 4;
  const int64_t count = 777;
  const dsl::Composite c = dsl::build_composite(*dsl::find_composite("composite.reduce_scatter_all_gather"), n);
  for (DType t : {DType::bf16, DType::fp32}) {
    CAPTURE(name(t));
    const int64_t bytes = count * int64_t(dtype_size(t));
    const ir::Schedule rs = lowered_for("reducescatter.ring", n, bytes), ag = lowered_for("allgather.ring", n, bytes);
    const auto r = verify::simulate_composite(c, {&rs, &ag}, t, RedOp::sum, count, 5);
    CHECK_MESSAGE(r.ok, r.first_bad);
    CHECK(r.checked == int64_t(n) * (4 * count + count + 4 * count));
    // independently of simulate_composite's own reference: `out` (buffer 2)
    // is the all-reduce of `in` (buffer 0), `shard` (1) its reduce-scatter
    const verify::DataSpec in{t, RedOp::sum, 5 * 1000 + 0, 0, n};
    for (int q = 0; q < n; ++q) {
      const auto all = verify::check_output(Collective::allreduce, in, n, 0, n * count, q, r.buffers[2][size_t(q)].data(),
                                            n * count);
      CHECK_MESSAGE(all.mismatches == 0, all.first_bad);
      const auto part = verify::check_output(Collective::reducescatter, in, n, 0, count, q,
                                             r.buffers[1][size_t(q)].data(), count);
      CHECK_MESSAGE(part.mismatches == 0, part.first_bad);
    }
    // a stage that reads another rank's chunk where it should read its own
    ir::Schedule broken = ag;
    bool changed = false;
    for (auto& op : broken.ops)
      if (!changed && op.kind == ir::OpKind::copy && !op.srcs.empty() && op.srcs[0].buf == ir::Buf::input) {
        op.srcs[0].rank = (op.srcs[0].rank + 1) % n;
        changed = true;
      }
    REQUIRE(changed);
    const auto b = verify::simulate_composite(c, {&rs, &broken}, t, RedOp::sum, count, 5);
    CHECK_FALSE(b.ok);
    CHECK(b.mismatches > 0);
    CHECK(has(b.first_bad, "buffer out"));
  }
  // refused: dtypes and ops it cannot bound
  const ir::Schedule rs = lowered_for("reducescatter.ring", n, 4000), ag = lowered_for("allgather.ring", n, 4000);
  CHECK(error_id([&] { verify::simulate_composite(c, {&rs, &ag}, DType::int32, RedOp::sum, 10, 1); }) == ErrId::cli_E011);
  CHECK(error_id([&] { verify::simulate_composite(c, {&rs, &ag}, DType::fp32, RedOp::prod, 10, 1); }) == ErrId::cli_E011);
}

TEST_CASE("mkc composite --simulate: every stage's schedule (named or the runtime's) in program order, against the "
          "float64 reference") {
  auto r = mkc({"composite", "composite.zero_step", "-n", "3", "--simulate", "--dtype", "fp32", "--count", "1001"});
  INFO(r);
  CHECK(r.exit_code == 0);
  CHECK(has(r.out, "simulated: 2 stage(s)"));
  CHECK(has(r.out, "0 mismatch(es)"));
  auto b = mkc({"composite", "composite.zero_step", "-n", "3", "--simulate", "--dtype", "int32"});
  CHECK(b.exit_code == 1);
  CHECK(has(b.err, "mk.cli.E011"));
}
