// MSCCL XML import (compiler/importers): the XML reader, every step type and
// the dialects in use, the fixtures (ring and all-pairs for 8 ranks) proved
// and simulated, and one test per malformed-file error, each checking the
// error id and that it points at the offending line.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>

#include "compiler/importers/importers.hpp"
#include "compiler/importers/xml.hpp"
#include "import_util.hpp"

using namespace mk;
using mkt::catch_error;
using mkt::contains;
using mkt::edit;

namespace {

// A two-rank in-place all-reduce, written like an MSCCL writer would: each
// gpu sends the peer's chunk, receives its own partner chunk into scratch,
// reduces (re, after a dependency), and sends its result back.
const char* kAr2 = R"(<?xml version="1.0" encoding="utf-8"?>
<!-- two-rank all-reduce -->
<algo name="ar2" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" coll="allreduce" inplace="1">
  <gpu id="0" i_chunks="2" o_chunks="0" s_chunks="1">
    <tb id="0" send="1" recv="1" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="1" dstbuf="s" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="r" srcbuf="i" srcoff="0" dstbuf="s" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="1"/>
      <step s="2" type="s" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="1" depid="1" deps="0" hasdep="0"/>
      <step s="3" type="r" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="1" send="-1" recv="-1" chan="0">
      <step s="0" type="re" srcbuf="s" srcoff="0" dstbuf="i" dstoff="0" cnt="1" depid="0" deps="1" hasdep="1"/>
    </tb>
  </gpu>
  <gpu id="1" i_chunks="2" o_chunks="0" s_chunks="1">
    <tb id="0" send="0" recv="0" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="s" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="r" srcbuf="i" srcoff="1" dstbuf="s" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="1"/>
      <step s="2" type="s" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="1" deps="0" hasdep="0"/>
      <step s="3" type="r" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="1" send="-1" recv="-1" chan="0">
      <step s="0" type="re" srcbuf="s" srcoff="0" dstbuf="i" dstoff="1" cnt="1" depid="0" deps="1" hasdep="1"/>
    </tb>
  </gpu>
</algo>
)";

// 1-based line of the first line containing `marker` after `after` lines.
int line_with(const std::string& text, const std::string& marker, int nth = 1) {
  int line = 1, seen = 0;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (text.substr(start, end - start).find(marker) != std::string::npos && ++seen == nth) return line;
    start = end + 1;
    ++line;
  }
  return 0;
}

ir::Schedule imp(const std::string& text, importers::ImportInfo* info = nullptr) {
  return importers::import_msccl_xml(text, "t.xml", info);
}

// The error an import throws: id, and the line it points at.
void expect_error(const std::string& text, const char* id, int line, const std::string& needle) {
  auto c = catch_error([&] { imp(text); });
  INFO(c.what);
  CHECK(c.id == id);
  CHECK(c.loc.file == "t.xml");
  if (line > 0) CHECK(c.loc.line == uint32_t(line));
  if (!needle.empty()) CHECK(contains(c.message, needle));
  CHECK(contains(c.what, "t.xml:"));
}

}  // namespace

TEST_CASE("import: xml reader handles the subset algorithm files use") {
  const std::string doc =
      "\xEF\xBB\xBF<?xml version='1.0'?>\n<!DOCTYPE algo>\n<!-- a comment\n over lines -->\n"
      "<algo a='1' b = \"x &lt;&gt;&amp;&quot;&apos;&#65;&#x42;\">\n"
      "  <gpu id='0'/>\n  <gpu\n    id=\"1\"></gpu><!-- c --></algo>\n<!-- trailing -->\n";
  auto e = importers::xml::parse(doc, "d.xml");
  CHECK(e.name == "algo");
  CHECK(e.line == 5);
  REQUIRE(e.attr("b") != nullptr);
  CHECK(e.attr("b")->value == "x <>&\"'AB");
  REQUIRE(e.children.size() == 2);
  CHECK(e.children[0].line == 6);
  CHECK(e.children[1].line == 7);
  CHECK(e.children[1].attr("id")->line == 8);
}

TEST_CASE("import: xml reader rejects malformed documents with the line at fault") {
  struct Case {
    std::string text;
    const char* id;
    int line;
    const char* needle;
  };
  std::string deep;
  for (int i = 0; i < 70; ++i) deep += "<a>";
  const Case cases[] = {
      {"", "mk.import.E001", 1, "no element"},
      {"<algo>\n<gpu>\n</algo>", "mk.import.E001", 3, "does not match <gpu>"},
      {"<algo>\n  <gpu id='1'", "mk.import.E001", 2, "not closed"},
      {"<algo x='1\n\n", "mk.import.E001", 1, "not closed"},
      {"<algo x=1/>", "mk.import.E001", 1, "quoted"},
      {"<algo x='&bogus;'/>", "mk.import.E001", 1, "unknown entity"},
      {"<algo x='a' x='b'/>", "mk.import.E001", 1, "twice"},
      {"<algo/>\n<algo/>", "mk.import.E001", 2, "second root"},
      {"<algo>\n text\n</algo>", "mk.import.E001", 2, "unexpected text"},
      {"<algo x='<'/>", "mk.import.E001", 1, "'<' inside"},
      {"<algo>\n<!-- open", "mk.import.E001", 2, "comment"},
      {"</algo>", "mk.import.E001", 1, "without an opening"},
      {"<algo x='&#0;'/>", "mk.import.E001", 1, "not a valid character"},
      {deep, "mk.import.E012", 1, "nested"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.text.substr(0, 60));
    auto e = catch_error([&] { importers::xml::parse(c.text, "d.xml"); });
    INFO(e.what);
    CHECK(e.id == c.id);
    CHECK(e.loc.line == uint32_t(c.line));
    CHECK(contains(e.message, c.needle));
  }
}

TEST_CASE("import: a two-rank MSCCL all-reduce becomes one-sided IR ops") {
  importers::ImportInfo info;
  ir::Schedule s = imp(kAr2, &info);
  CHECK(s.coll == Collective::allreduce);
  CHECK(s.nranks == 2);
  CHECK(s.chunks == 2);
  CHECK(info.transfers == 4);
  CHECK(info.sync_edges == 4);
  CHECK(info.reading == "in-place");
  // s + r -> one copy executed by the sender (push), re -> reduce
  int copies = 0, reduces = 0;
  for (const auto& op : s.ops) {
    CHECK(op.tb == -1);
    CHECK(op.loc->file == "t.xml");
    CHECK(op.loc->line > 0);
    if (op.kind == ir::OpKind::copy) {
      ++copies;
      CHECK(op.rank == op.srcs[0].rank);
    } else {
      ++reduces;
    }
  }
  CHECK(copies == 4);
  CHECK(reduces == 2);
  verify::verify_semantics(s);
  mkt::simulate_all(s);
}

TEST_CASE("import: every MSCCL step type and dialect in the fixtures") {
  // which step types each fixture exercises; together all nine
  std::set<std::string> seen;
  const std::vector<std::string> files = {"allreduce_ring_8.xml",   "allreduce_allpairs_8.xml", "allgather_ring_8.xml",
                                          "reducescatter_ring_4.xml", "alltoall_allpairs_4.xml", "broadcast_chain_4.xml",
                                          "broadcast_root2_4.xml",  "reduce_chain_4.xml",       "allgather_copy_4.xml"};
  for (const auto& f : files) {
    CAPTURE(f);
    std::string text = mkt::fixture_text("msccl/" + f);
    for (const char* t : {"s", "r", "rcs", "rrs", "rrc", "rrcs", "cpy", "re", "nop"})
      if (contains(text, std::string("type=\"") + t + "\"")) seen.insert(t);
    importers::ImportInfo info;
    ir::Schedule s;
    auto c = catch_error([&] { s = importers::import_file(mkt::fixture("msccl/" + f), &info); });
    REQUIRE_MESSAGE(!c, c.what);
    CHECK(info.format == "msccl-xml");
    auto v = catch_error([&] { verify::verify_semantics(s); });
    CHECK_MESSAGE(!v, v.what);
  }
  CHECK(seen.size() == 9);
}

TEST_CASE("import: MSCCL ring and all-pairs all-reduce for 8 ranks verify and simulate") {
  for (const char* f : {"msccl/allreduce_ring_8.xml", "msccl/allreduce_allpairs_8.xml", "msccl/allgather_ring_8.xml"}) {
    CAPTURE(f);
    ir::Schedule s = importers::import_file(mkt::fixture(f));
    CHECK(s.nranks == 8);
    verify::verify_semantics(s);
    mkt::simulate_all(s, {DType::fp32, DType::bf16, DType::int8, DType::fp64, DType::fp8e4m3});
  }
}

TEST_CASE("import: MSCCL fixtures of every collective simulate") {
  for (const char* f : {"msccl/reducescatter_ring_4.xml", "msccl/alltoall_allpairs_4.xml", "msccl/broadcast_chain_4.xml",
                        "msccl/reduce_chain_4.xml", "msccl/allgather_copy_4.xml"}) {
    CAPTURE(f);
    mkt::simulate_all(importers::import_file(mkt::fixture(f)));
  }
}

TEST_CASE("import: MSCCL root attribute relabels ranks so the root is rank 0") {
  ir::Schedule a = importers::import_file(mkt::fixture("msccl/broadcast_chain_4.xml"));
  importers::ImportInfo info;
  ir::Schedule b = importers::import_file(mkt::fixture("msccl/broadcast_root2_4.xml"), &info);
  CHECK(b.root == 0);
  CHECK(contains(info.notes.back(), "root=\"2\""));
  // the same chain, relabelled: the same IR ops (in another order)
  auto ops = [](const ir::Schedule& s) {
    std::vector<std::string> v;
    for (const auto& op : s.ops) {
      std::string p = ir::print_op(op);
      v.push_back(p.substr(p.find(' ')));
    }
    std::sort(v.begin(), v.end());
    return v;
  };
  CHECK(ops(a) == ops(b));
  auto l = compiler::lower(b, compiler::LowerOptions{});
  for (int32_t root : {0, 2, 3}) {
    verify::SimOptions o;
    o.root = root;
    o.count = 1000;
    auto r = verify::simulate(l.variants.back(), o);
    CHECK_MESSAGE(r.ok, r.first_bad);
  }
}

TEST_CASE("import: MSCCL dialects (spellings, optional and extra attributes)") {
  SUBCASE("collective spellings") {
    for (const char* c : {"allreduce", "all_reduce", "AllReduce", "all-reduce", "ncclAllReduce"}) {
      CAPTURE(c);
      CHECK(imp(edit(kAr2, "coll=\"allreduce\"", std::string("coll=\"") + c + "\"")).coll == Collective::allreduce);
    }
    std::string rs = mkt::fixture_text("msccl/reducescatter_ring_4.xml");
    for (const char* c : {"reducescatter", "reduce_scatter", "ReduceScatter"})
      CHECK(importers::import_msccl_xml(edit(rs, "coll=\"reduce_scatter\"", std::string("coll=\"") + c + "\""), "x.xml")
                .coll == Collective::reducescatter);
  }
  SUBCASE("optional attributes: without nchunksperloop, nchannels, proto, name, cnt, s, hasdep") {
    std::string t = edit(kAr2, " nchunksperloop=\"2\"", "");
    t = edit(t, " nchannels=\"1\"", "");
    t = edit(t, " proto=\"Simple\"", "");
    t = edit(t, "name=\"ar2\" ", "");
    for (int i = 0; i < 10; ++i) {
      auto a = t.find(" cnt=\"1\"");
      if (a != std::string::npos) t.erase(a, 8);
      a = t.find(" hasdep=\"0\"");
      if (a != std::string::npos) t.erase(a, 11);
    }
    importers::ImportInfo info;
    ir::Schedule s = importers::import_msccl_xml(t, "dir/nameless.xml", &info);
    CHECK(s.name == "nameless.xml");
    CHECK(s.chunks == 2);
    verify::verify_semantics(s);
  }
  SUBCASE("extra attributes are reported as ignored, <op> elements are refused") {
    importers::ImportInfo info;
    imp(edit(kAr2, "<step s=\"0\" type=\"s\"", "<step mscclflowid=\"3\" rate=\"1.5\" s=\"0\" type=\"s\""), &info);
    bool noted = false;
    for (const auto& n : info.notes) noted = noted || contains(n, "<step mscclflowid>");
    CHECK(noted);
    expect_error(edit(kAr2, "<step s=\"0\" type=\"s\"", "<op step=\"0\" type=\"s\"/><step s=\"0\" type=\"s\""),
                 "mk.import.E010", line_with(kAr2, "<step s=\"0\" type=\"s\""), "<op>");
  }
  SUBCASE("in-place and out-of-place: a file declaring both is checked under both readings") {
    // correct out-of-place, wrong when input and output alias: rank 0 sends
    // its input after adding rank 1's into its output, which in place is the
    // input (rank 1 then counts its own data twice). (A swap of chunks 0 and
    // 1 was used here before; it moves data to another chunk position, which
    // is wrong at every count whose chunks differ in length: mk.verify.E008.)
    const char* both = R"(<algo name="late_send" nchunksperloop="1" ngpus="2" coll="allreduce" inplace="1" outofplace="1">
  <gpu id="0" i_chunks="1" o_chunks="1" s_chunks="1">
    <tb id="0" send="1" recv="1" chan="0">
      <step s="0" type="r" srcbuf="i" srcoff="0" dstbuf="s" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="1"/>
      <step s="1" type="s" srcbuf="i" srcoff="0" dstbuf="s" dstoff="0" cnt="1" depid="1" deps="1" hasdep="0"/>
    </tb>
    <tb id="1" send="-1" recv="-1" chan="0">
      <step s="0" type="cpy" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="re" srcbuf="s" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="0" deps="0" hasdep="1"/>
    </tb>
  </gpu>
  <gpu id="1" i_chunks="1" o_chunks="1" s_chunks="1">
    <tb id="0" send="0" recv="0" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="s" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="1"/>
      <step s="1" type="r" srcbuf="i" srcoff="0" dstbuf="s" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="1"/>
    </tb>
    <tb id="1" send="-1" recv="-1" chan="0">
      <step s="0" type="cpy" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="0" deps="0" hasdep="0"/>
      <step s="1" type="re" srcbuf="s" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="0" deps="1" hasdep="1"/>
    </tb>
  </gpu>
</algo>)";
    auto c = catch_error([&] { importers::import_msccl_xml(both, "t.xml"); });
    INFO(c.what);
    CHECK(c.id == "mk.verify.E002");  // rank 1 counts its own data twice
    CHECK(contains(c.id, "mk.verify."));
    CHECK(contains(c.message, "in-place"));
    CHECK(c.loc.file == "t.xml");
    // declared out-of-place only, the same file is right
    std::string oop = edit(both, "inplace=\"1\"", "inplace=\"0\"");
    verify::verify_semantics(importers::import_msccl_xml(oop, "t.xml"));
    // and without the check, the out-of-place reading is returned
    importers::ImportOptions opt;
    opt.check_both_readings = false;
    verify::verify_semantics(importers::import_msccl_xml(both, "t.xml", nullptr, opt));
  }
}

TEST_CASE("import: MSCCL truncated file -> mk.import.E001 with the line") {
  std::string t = kAr2;
  t = t.substr(0, t.find("<tb id=\"1\"", t.find("<gpu id=\"1\"")) + 20);
  auto c = catch_error([&] { imp(t); });
  INFO(c.what);
  CHECK(c.id == "mk.import.E001");
  CHECK(c.loc.line == uint32_t(line_with(kAr2, "<tb id=\"1\"", 2)));
  CHECK(contains(c.message, "not closed"));
}

TEST_CASE("import: MSCCL wrong attribute types -> mk.import.E002 at the attribute's line") {
  int l = line_with(kAr2, "type=\"re\" srcbuf=\"s\" srcoff=\"0\" dstbuf=\"i\" dstoff=\"0\"");
  expect_error(edit(kAr2, "type=\"re\" srcbuf=\"s\" srcoff=\"0\" dstbuf=\"i\" dstoff=\"0\" cnt=\"1\"",
                    "type=\"re\" srcbuf=\"s\" srcoff=\"0\" dstbuf=\"i\" dstoff=\"0\" cnt=\"one\""),
               "mk.import.E002", l, "cnt");
  expect_error(edit(kAr2, "ngpus=\"2\"", "ngpus=\"2.5\""), "mk.import.E002", 3, "ngpus");
  expect_error(edit(kAr2, "srcbuf=\"s\" srcoff=\"0\" dstbuf=\"i\" dstoff=\"0\"", "srcbuf=\"x\" srcoff=\"0\" dstbuf=\"i\" dstoff=\"0\""),
               "mk.import.E002", l, "i, o or s");
  expect_error(edit(kAr2, "coll=\"allreduce\"", "coll=\"frobnicate\""), "mk.import.E002", 3, "frobnicate");
  expect_error(edit(kAr2, "coll=\"allreduce\"", "coll=\"custom\""), "mk.import.E010", 3, "custom");
  expect_error(edit(kAr2, " ngpus=\"2\"", ""), "mk.import.E002", 3, "ngpus");
  expect_error(edit(kAr2, "proto=\"Simple\"", "proto=\"Fast\""), "mk.import.E002", 3, "proto");
}

TEST_CASE("import: MSCCL unknown step type -> mk.import.E003 at its line") {
  int l = line_with(kAr2, "type=\"r\"", 2);
  std::string t = kAr2;
  size_t at = 0;
  for (int i = 0; i < 2; ++i) at = t.find("type=\"r\"", at + 1);
  t.replace(at, 8, "type=\"rx\"");
  expect_error(t, "mk.import.E003", l, "unknown step type 'rx'");
}

TEST_CASE("import: MSCCL dangling dependency -> mk.import.E006 at the step") {
  int l = line_with(kAr2, "depid=\"1\" deps=\"0\"");
  expect_error(edit(kAr2, "depid=\"1\" deps=\"0\"", "depid=\"7\" deps=\"0\""), "mk.import.E006", l,
               "thread block 7 of gpu 0, which does not exist");
  expect_error(edit(kAr2, "depid=\"1\" deps=\"0\"", "depid=\"1\" deps=\"9\""), "mk.import.E006", l,
               "step 9 of gpu 0 tb 1");
  expect_error(edit(kAr2, "depid=\"1\" deps=\"0\"", "depid=\"1\" deps=\"-1\""), "mk.import.E006", l, "deps");
}

TEST_CASE("import: MSCCL peer out of range -> mk.import.E004 at the thread block") {
  int l = line_with(kAr2, "<tb id=\"0\" send=\"1\" recv=\"1\"");
  expect_error(edit(kAr2, "<tb id=\"0\" send=\"1\" recv=\"1\"", "<tb id=\"0\" send=\"5\" recv=\"1\""), "mk.import.E004", l,
               "peer 5");
  expect_error(edit(kAr2, "<tb id=\"0\" send=\"1\" recv=\"1\"", "<tb id=\"0\" send=\"0\" recv=\"1\""), "mk.import.E004", l,
               "the gpu itself");
  expect_error(edit(kAr2, "<tb id=\"0\" send=\"1\" recv=\"1\"", "<tb id=\"0\" send=\"-1\" recv=\"1\""), "mk.import.E004",
               line_with(kAr2, "<step s=\"0\" type=\"s\""), "send=\"-1\"");
  expect_error(edit(kAr2, "<gpu id=\"1\"", "<gpu id=\"4\""), "mk.import.E004", line_with(kAr2, "<gpu id=\"1\""),
               "ngpus");
}

TEST_CASE("import: MSCCL chunk out of bounds -> mk.import.E005 at the step") {
  int l = line_with(kAr2, "<step s=\"0\" type=\"s\" srcbuf=\"i\" srcoff=\"1\"");
  expect_error(edit(kAr2, "<step s=\"0\" type=\"s\" srcbuf=\"i\" srcoff=\"1\"", "<step s=\"0\" type=\"s\" srcbuf=\"i\" srcoff=\"2\""),
               "mk.import.E005", l, "i[2]");
  // scratch beyond s_chunks, and a count running past the end
  expect_error(edit(kAr2, "type=\"r\" srcbuf=\"i\" srcoff=\"0\" dstbuf=\"s\" dstoff=\"0\"",
                    "type=\"r\" srcbuf=\"i\" srcoff=\"0\" dstbuf=\"s\" dstoff=\"1\""),
               "mk.import.E005", line_with(kAr2, "type=\"r\" srcbuf=\"i\" srcoff=\"0\" dstbuf=\"s\""), "s_chunks=1");
  // the output is declared empty (o_chunks=0) in this in-place file
  expect_error(edit(kAr2, "type=\"re\" srcbuf=\"s\" srcoff=\"0\" dstbuf=\"i\" dstoff=\"0\"",
                    "type=\"re\" srcbuf=\"s\" srcoff=\"0\" dstbuf=\"o\" dstoff=\"0\""),
               "mk.import.E005", line_with(kAr2, "type=\"re\" srcbuf=\"s\" srcoff=\"0\" dstbuf=\"i\" dstoff=\"0\""), "o[0]");
}

TEST_CASE("import: MSCCL cyclic dependencies -> mk.import.E007 naming the steps") {
  // gpu 0: tb 1's re waits for tb 0 step 2, which waits for tb 1's re
  std::string t = edit(kAr2, "type=\"re\" srcbuf=\"s\" srcoff=\"0\" dstbuf=\"i\" dstoff=\"0\" cnt=\"1\" depid=\"0\" deps=\"1\"",
                       "type=\"re\" srcbuf=\"s\" srcoff=\"0\" dstbuf=\"i\" dstoff=\"0\" cnt=\"1\" depid=\"0\" deps=\"2\"");
  auto c = catch_error([&] { imp(t); });
  INFO(c.what);
  CHECK(c.id == "mk.import.E007");
  CHECK(contains(c.message, "gpu 0 tb 1 step 0 (re)"));
  CHECK(contains(c.message, "gpu 0 tb 0 step 2 (s)"));
  CHECK(contains(c.message, "t.xml:"));
  CHECK(c.loc.line > 0);
}

TEST_CASE("import: MSCCL unmatched send/receive -> mk.import.E008") {
  // gpu 1 receives one chunk fewer than gpu 0 sends
  std::string t = kAr2;
  std::string last = "      <step s=\"3\" type=\"r\" srcbuf=\"i\" srcoff=\"0\" dstbuf=\"i\" dstoff=\"0\" cnt=\"1\" depid=\"-1\" deps=\"-1\" hasdep=\"0\"/>\n";
  t = edit(t, last, "");
  expect_error(t, "mk.import.E008", line_with(kAr2, "<step s=\"2\" type=\"s\" srcbuf=\"i\" srcoff=\"0\""),
               "only 1 time(s)");
  // and counts that differ: gpu 0 sends two chunks, gpu 1 receives one
  expect_error(edit(kAr2, "<step s=\"0\" type=\"s\" srcbuf=\"i\" srcoff=\"1\" dstbuf=\"s\" dstoff=\"0\" cnt=\"1\"",
                    "<step s=\"0\" type=\"s\" srcbuf=\"i\" srcoff=\"0\" dstbuf=\"s\" dstoff=\"0\" cnt=\"2\""),
               "mk.import.E008", line_with(kAr2, "type=\"r\" srcbuf=\"i\" srcoff=\"1\" dstbuf=\"s\""),
               "receives 1 chunk(s), but the matching send");
  // two thread blocks sending to the same peer on the same channel
  expect_error(edit(kAr2, "<tb id=\"1\" send=\"-1\" recv=\"-1\" chan=\"0\">", "<tb id=\"1\" send=\"1\" recv=\"-1\" chan=\"0\">"),
               "mk.import.E008", line_with(kAr2, "<tb id=\"1\" send=\"-1\""), "both send to gpu 1");
}

TEST_CASE("import: MSCCL missing dependency -> mk.import.E009 race naming both steps") {
  std::string t = edit(kAr2, "type=\"re\" srcbuf=\"s\" srcoff=\"0\" dstbuf=\"i\" dstoff=\"0\" cnt=\"1\" depid=\"0\" deps=\"1\"",
                       "type=\"re\" srcbuf=\"s\" srcoff=\"0\" dstbuf=\"i\" dstoff=\"0\" cnt=\"1\" depid=\"-1\" deps=\"-1\"");
  // ... and the send of the reduced chunk must not depend on it either
  t = edit(t, "depid=\"1\" deps=\"0\"", "depid=\"-1\" deps=\"-1\"");
  auto c = catch_error([&] { imp(t); });
  INFO(c.what);
  CHECK(c.id == "mk.import.E009");
  CHECK(contains(c.message, "race on gpu 0"));
  CHECK(contains(c.message, "gpu 0 tb 1 step 0 (re)"));
  CHECK(c.loc.line > 0);
}

TEST_CASE("import: MSCCL geometry errors -> mk.import.E011") {
  expect_error(edit(kAr2, "<gpu id=\"1\"", "<gpu id=\"0\""), "mk.import.E011", line_with(kAr2, "<gpu id=\"1\""), "twice");
  expect_error(edit(kAr2, "ngpus=\"2\"", "ngpus=\"3\""), "mk.import.E011", 3, "no <gpu id=\"2\">");
  expect_error(edit(kAr2, "i_chunks=\"2\"", "i_chunks=\"4\""), "mk.import.E011", line_with(kAr2, "i_chunks"), "i_chunks=4");
  std::string ag = mkt::fixture_text("msccl/allgather_ring_8.xml");
  auto c = catch_error([&] { importers::import_msccl_xml(edit(ag, "nchunksperloop=\"8\"", "nchunksperloop=\"12\""), "t.xml"); });
  CHECK(c.id == "mk.import.E011");
  CHECK(contains(c.message, "not a multiple of 8"));
}

TEST_CASE("import: a wrong but well-formed MSCCL algorithm is rejected by the verifier at a step of the file") {
  ir::Schedule s = importers::import_file(mkt::fixture("msccl/allreduce_ring_8_wrong.xml"));
  auto c = catch_error([&] { verify::verify_semantics(s); });
  INFO(c.what);
  CHECK(c.id == "mk.verify.E001");
  CHECK(contains(c.message, "misses the contribution of rank 5"));
  CHECK(contains(c.loc.file, "allreduce_ring_8_wrong.xml"));
  CHECK(c.loc.line > 0);
  // and so does the compiler pipeline
  auto l = catch_error([&] { compiler::lower(s, compiler::LowerOptions{}); });
  CHECK(l.id == "mk.verify.E001");
}

TEST_CASE("import: damaged MSCCL files fail cleanly (truncation, byte damage)") {
  mkt::damage_is_clean(kAr2, "d.xml", 400);
  mkt::damage_is_clean(mkt::fixture_text("msccl/allgather_copy_4.xml"), "d.xml", 100);
}

TEST_CASE("import: MSCCL step whose source and destination overlap at different positions -> mk.import.E009") {
  const std::string t = R"(<algo name="skew" nchunksperloop="2" ngpus="1" coll="allreduce" inplace="0">
  <gpu id="0" i_chunks="2" o_chunks="2" s_chunks="3">
    <tb id="0" send="-1" recv="-1" chan="0">
      <step s="0" type="cpy" srcbuf="i" srcoff="0" dstbuf="s" dstoff="0" cnt="2"/>
      <step s="1" type="cpy" srcbuf="s" srcoff="0" dstbuf="s" dstoff="1" cnt="2"/>
      <step s="2" type="cpy" srcbuf="s" srcoff="1" dstbuf="o" dstoff="0" cnt="2"/>
    </tb>
  </gpu>
</algo>)";
  expect_error(t, "mk.import.E009", 5, "two different positions");
  // identical ranges (in place) are fine
  verify::verify_semantics(imp(edit(edit(t, "dstbuf=\"s\" dstoff=\"1\"", "dstbuf=\"s\" dstoff=\"0\""),
                                    "srcbuf=\"s\" srcoff=\"1\" dstbuf=\"o\"", "srcbuf=\"s\" srcoff=\"0\" dstbuf=\"o\"")));
}
