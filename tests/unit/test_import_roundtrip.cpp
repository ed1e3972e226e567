// Export to MSCCL XML and import back: for every built-in schedule at 2, 3, 4
// and 8 ranks, import(export(s)) is proved (both readings the XML declares)
// and simulates like s: same correctness, and for fp32 sums the same error
// (the reduction order is kept, so the results are the same bits). Also IR
// JSON and cross-format round trips.
#include <doctest/doctest.h>

#include "compiler/importers/importers.hpp"
#include "compiler/importers/xml.hpp"
#include "import_util.hpp"
#include "mk/dsl.hpp"

using namespace mk;
using mkt::catch_error;
using mkt::contains;

namespace {

compiler::Lowered lower_small(const ir::Schedule& s) {
  compiler::LowerOptions lo;
  lo.proto.max_tile_bytes = 16 << 10;
  return compiler::lower(s, lo);
}

// The variant a launch of `bytes` uses (what the runtime picks).
size_t pick(const compiler::Lowered& l, int64_t bytes) {
  for (size_t i = 0; i < l.buckets.size(); ++i)
    if (bytes >= l.buckets[i].min_bytes && (l.buckets[i].max_bytes < 0 || bytes <= l.buckets[i].max_bytes)) return i;
  return l.variants.size() - 1;
}

verify::SimResult sim(const compiler::Lowered& l, DType t, int64_t count, bool inplace) {
  verify::SimOptions o;
  o.dtype = t;
  o.count = count;
  o.inplace = inplace;
  o.launches = 1;
  o.seed = 7;
  return verify::simulate(l.variants[pick(l, count * int64_t(dtype_size(t)))], o);
}

}  // namespace

TEST_CASE("import: export round trip of every built-in schedule at 2, 3, 4 and 8 ranks") {
  for (const auto& info : dsl::registered_schedules()) {
    for (int n : {2, 3, 4, 8}) {
      CAPTURE(info.name);
      CAPTURE(n);
      ir::Schedule s = dsl::build(info, n);
      std::string xml;
      auto e = catch_error([&] { xml = importers::export_msccl_xml(s); });
      REQUIRE_MESSAGE(!e, e.what);
      // well-formed, and what it declares
      auto root = importers::xml::parse(xml, "rt.xml");
      CHECK(root.attr("ngpus")->value == std::to_string(n));
      CHECK(root.attr("outofplace")->value == "1");
      CHECK(root.attr("inplace")->value == (info.coll == Collective::alltoall ? "0" : "1"));
      importers::ImportInfo ii;
      ir::Schedule back;
      auto c = catch_error([&] { back = importers::import_msccl_xml(xml, "rt.xml", &ii); });
      REQUIRE_MESSAGE(!c, c.what);
      CHECK(back.coll == s.coll);
      CHECK(back.nranks == s.nranks);
      CHECK(back.chunks == s.chunks);
      CHECK(ii.staging_ops == 0);
      auto v = catch_error([&] { verify::verify_semantics(back); });
      REQUIRE_MESSAGE(!v, v.what);
      auto la = lower_small(s), lb = lower_small(back);
      for (int64_t count : {1, 777, 9001})
        for (bool inplace : {false, true}) {
          if (inplace && s.coll == Collective::alltoall) continue;
          CAPTURE(count);
          CAPTURE(inplace);
          auto ra = sim(la, DType::fp32, count, inplace), rb = sim(lb, DType::fp32, count, inplace);
          CHECK_MESSAGE(ra.ok, ra.first_bad);
          CHECK_MESSAGE(rb.ok, rb.first_bad);
          CHECK(ra.max_err == rb.max_err);
          auto rh = sim(lb, DType::bf16, count, inplace);
          CHECK_MESSAGE(rh.ok, rh.first_bad);
        }
    }
  }
}

TEST_CASE("import: export round trip keeps one-rank schedules and re-exports imported files") {
  for (const auto& info : dsl::registered_schedules()) {
    CAPTURE(info.name);
    ir::Schedule s = dsl::build(info, 1);
    ir::Schedule back = importers::import_msccl_xml(importers::export_msccl_xml(s), "one.xml");
    verify::verify_semantics(back);
  }
  // MSCCL++ -> IR -> MSCCL XML -> IR: still proved and correct
  for (const char* f : {"mscclpp/allreduce_packet_send_4.json", "mscclpp/reducescatter_rre_4.json",
                        "mscclpp/allreduce_nvls_4.json", "msccl/allreduce_allpairs_8.xml", "msccl/allgather_copy_4.xml"}) {
    CAPTURE(f);
    ir::Schedule a = importers::import_file(mkt::fixture(f));
    ir::Schedule b = importers::import_msccl_xml(importers::export_msccl_xml(a), "re.xml");
    verify::verify_semantics(b);
    auto l = lower_small(b);
    auto r = sim(l, DType::fp32, 9999, false);
    CHECK_MESSAGE(r.ok, r.first_bad);
  }
}

TEST_CASE("import: IR JSON written by ir::to_json imports as itself") {
  ir::Schedule s = importers::import_file(mkt::fixture("msccl/allreduce_ring_8.xml"));
  std::string j = ir::to_json(s);
  importers::ImportInfo info;
  ir::Schedule back = importers::import_text(j, "s.json", &info);
  CHECK(info.format == "mk-ir-json");
  CHECK(ir::to_json(back) == j);
  CHECK(importers::detect_format(j, "noext") == importers::Format::mk_ir_json);
  CHECK(importers::detect_format("<algo/>", "noext") == importers::Format::msccl_xml);
  CHECK(importers::detect_format("{}", "plan.json") == importers::Format::mscclpp_json);
  auto c = catch_error([&] { importers::detect_format("garbage", "file.txt"); });
  CHECK(c.id == "mk.import.E013");
  // a lowered schedule is not a raw one
  auto l = compiler::lower(s, compiler::LowerOptions{});
  auto d = catch_error([&] { importers::import_text(ir::to_json(l.variants[0]), "low.json"); });
  CHECK(d.id == "mk.import.E010");
  // exporting a lowered schedule is refused too
  auto x = catch_error([&] { importers::export_msccl_xml(l.variants[0]); });
  CHECK(x.id == "mk.cli.E011");
  auto m = catch_error([&] { importers::import_file("/nonexistent/x.xml"); });
  CHECK(m.id == "mk.cli.E009");
}
