// The mkc commands around imports: `mkc import`, `mkc export`, and the other
// commands taking an .xml / .json file directly (run as a child process).
#include <doctest/doctest.h>

#include "compiler/importers/importers.hpp"
#include "compiler/ir/ir.hpp"
#include "compiler/jit/jit.hpp"
#include "import_util.hpp"

using namespace mk;
using mkt::contains;
using mkt::fixture;

TEST_CASE("import: mkc import writes a proved IR JSON that every command reads back") {
  mkt::TempDir dir("mkt-import");
  const std::string out = (dir / "ring.json").string();
  auto r = mkt::mkc({"import", fixture("msccl/allreduce_ring_8.xml"), "-o", out});
  INFO(r);
  REQUIRE(r.exit_code == 0);
  CHECK(contains(r.out, "MSCCL XML"));
  CHECK(contains(r.out, "'allreduce_ring' allreduce, 8 ranks"));
  CHECK(contains(r.out, "112 send/receive pair(s)"));
  CHECK(contains(r.out, "proved: computes allreduce"));
  CHECK(contains(r.out, "wrote " + out));
  ir::Schedule s = ir::from_json(mkt::read_text(out));
  CHECK(s.nranks == 8);
  CHECK(s.ops.size() == 112);
  // the IR JSON, like the XML, works for every command without --ranks
  for (const std::string& f : {out, fixture("msccl/allreduce_ring_8.xml")}) {
    auto v = mkt::mkc({"verify", f});
    INFO(v);
    CHECK(v.exit_code == 0);
    CHECK(contains(v.out, "proved: allreduce_ring (allreduce) for 8 ranks"));
    auto sim = mkt::mkc({"simulate", f, "--count", "4099", "--dtype", "bf16", "--inplace"});
    INFO(sim);
    CHECK(sim.exit_code == 0);
    CHECK(contains(sim.out, "ok"));
  }
  auto show = mkt::mkc({"show", fixture("mscclpp/allreduce_pipeline_sem_2.json")});
  INFO(show);
  CHECK(show.exit_code == 0);
  CHECK(contains(show.out, "rank 0 tb 0"));
  auto low = mkt::mkc({"lower", fixture("msccl/reduce_chain_4.xml"), "--dump-after", "build"});
  INFO(low);
  CHECK(low.exit_code == 0);
  CHECK(contains(low.out, "reduce_chain_4.xml:"));  // ops point at the file's lines
}

TEST_CASE("import: mkc import of an MSCCL++ plan prints notes and the summary") {
  auto r = mkt::mkc({"import", fixture("mscclpp/reducescatter_rre_4.json")});
  INFO(r);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.out, "MSCCL++ execution plan"));
  CHECK(contains(r.out, "note: thread-block groups"));
  CHECK(contains(r.out, "proved: computes reducescatter"));
}

TEST_CASE("import: mkc --ranks is optional for files and must match them") {
  auto ok = mkt::mkc({"verify", fixture("msccl/allgather_ring_8.xml"), "--ranks", "8"});
  INFO(ok);
  CHECK(ok.exit_code == 0);
  auto bad = mkt::mkc({"verify", fixture("msccl/allgather_ring_8.xml"), "--ranks", "4"});
  MKT_CHECK_USER_ERROR(bad, "mk.cli.E004");
  CHECK(contains(bad.err, "written for 8 ranks"));
  auto dsl = mkt::mkc({"verify", "--schedule", "allreduce.ring"});
  MKT_CHECK_USER_ERROR(dsl, "mk.cli.E004");
  CHECK(contains(dsl.err, "--ranks is required"));
  auto both = mkt::mkc({"verify", fixture("msccl/allgather_ring_8.xml"), "--schedule", "allreduce.ring"});
  MKT_CHECK_USER_ERROR(both, "mk.cli.E011");
}

TEST_CASE("import: mkc reports import and verifier errors with the file's line") {
  auto wrong = mkt::mkc({"import", fixture("msccl/allreduce_ring_8_wrong.xml"), "-o", "/nonexistent/never.json"});
  MKT_CHECK_USER_ERROR(wrong, "mk.verify.E001");
  CHECK(contains(wrong.err, "allreduce_ring_8_wrong.xml:"));
  auto sim = mkt::mkc({"simulate", fixture("msccl/allreduce_ring_8_wrong.xml")});
  MKT_CHECK_USER_ERROR(sim, "mk.verify.E001");
  mkt::TempDir dir("mkt-import");
  const std::string bad = (dir / "bad.xml").string();
  mkt::write_text(bad, "<algo ngpus=\"2\" coll=\"allreduce\" nchunksperloop=\"2\">\n  <gpu id=\"0\">\n    <tb id=\"0\">\n"
                       "      <step s=\"0\" type=\"warp\"/>\n    </tb>\n  </gpu>\n  <gpu id=\"1\"/>\n</algo>\n");
  auto r = mkt::mkc({"verify", bad});
  MKT_CHECK_USER_ERROR(r, "mk.import.E003");
  CHECK(contains(r.err, "bad.xml:4"));
  const std::string trunc = (dir / "t.json").string();
  mkt::write_text(trunc, mkt::read_text(fixture("mscclpp/allreduce_nvls_4.json")).substr(0, 700));
  auto t = mkt::mkc({"import", trunc});
  MKT_CHECK_USER_ERROR(t, "mk.import.E001");
  auto missing = mkt::mkc({"import", (dir / "nope.xml").string()});
  MKT_CHECK_USER_ERROR(missing, "mk.cli.E009");
  // --no-verify writes the IR of a wrong algorithm and says so
  const std::string out = (dir / "wrong.json").string();
  auto nv = mkt::mkc({"import", fixture("msccl/allreduce_ring_8_wrong.xml"), "--no-verify", "-o", out});
  INFO(nv);
  CHECK(nv.exit_code == 0);
  CHECK(contains(nv.out, "not verified (--no-verify)"));
  auto again = mkt::mkc({"verify", out});
  MKT_CHECK_USER_ERROR(again, "mk.verify.E001");
}

TEST_CASE("import: mkc export --format msccl-xml, and the export verifies and simulates") {
  mkt::TempDir dir("mkt-export");
  const std::string x = (dir / "ring.xml").string();
  auto e = mkt::mkc({"export", "--schedule", "allreduce.ring", "--ranks", "4", "--format", "msccl-xml", "-o", x});
  INFO(e);
  REQUIRE(e.exit_code == 0);
  CHECK(contains(e.out, "wrote " + x));
  CHECK(contains(mkt::read_text(x), "<algo name=\"allreduce.ring\""));
  auto v = mkt::mkc({"verify", x});
  INFO(v);
  CHECK(v.exit_code == 0);
  auto s = mkt::mkc({"simulate", x, "--count", "1000", "--op", "max", "--dtype", "int32"});
  INFO(s);
  CHECK(s.exit_code == 0);
  // to standard output by default; imported files re-export
  auto so = mkt::mkc({"export", fixture("mscclpp/allreduce_nvls_4.json")});
  INFO(so);
  CHECK(so.exit_code == 0);
  CHECK(contains(so.out, "<algo name=\"allreduce_nvls\""));
  auto f = mkt::mkc({"export", "--schedule", "allreduce.ring", "--ranks", "4", "--format", "nccl"});
  MKT_CHECK_USER_ERROR(f, "mk.cli.E011");
  // the existing DSL path still works
  auto d = mkt::mkc({"verify", "--schedule", "allgather.ring", "--ranks", "3"});
  INFO(d);
  CHECK(d.exit_code == 0);
}

TEST_CASE("import: mkc compile takes an imported file and writes a plan" * doctest::skip(jit::nvrtc_version() <= 0)) {
  mkt::TempDir dir("mkt-import-plan");
  const std::string out = (dir / "plan").string();
  auto c = mkt::mkc({"compile", fixture("msccl/reduce_chain_4.xml"), "--dtype", "bf16", "--op", "max", "-o", out});
  INFO(c);
  CHECK(c.exit_code == 0);
  CHECK(contains(c.out, "plan reduce_chain (reduce) for 4 ranks, bf16 max"));
  CHECK(mkt::fs::exists(mkt::fs::path(out) / "plan.json"));
}
