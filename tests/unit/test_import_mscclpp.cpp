// MSCCL++ execution-plan import: the JSON line locator, every op family in
// the fixtures (put/get/copy, reduce variants, packets, barriers,
// semaphores, pipelines, thread-block groups, NVLS), 8-rank plans proved and
// simulated, and one test per malformed-plan error, each checking the error
// id, the JSON path in the message and the line it points at.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "compiler/importers/importers.hpp"
#include "compiler/importers/json_lines.hpp"
#include "import_util.hpp"

using namespace mk;
using mkt::catch_error;
using mkt::contains;
using mkt::edit;

namespace {

// Two ranks, in place: put the peer's chunk into its scratch, signal/wait,
// reduce, put the result back into the peer's input, signal/wait.
const char* kPlan = R"({
  "name": "ar2",
  "collective": "allreduce",
  "protocol": "Simple",
  "inplace": true,
  "gpus": [
    {
      "id": 0, "input_chunks": 2, "output_chunks": 2, "scratch_chunks": 1,
      "channels": [{"channel_type": "memory", "connected_to": [1]}],
      "remote_buffers": [{"rank": 1, "type": "s", "access_channel_types": ["memory"]},
                         {"rank": 1, "type": "i", "access_channel_types": ["memory"]}],
      "threadblocks": [
        {
          "id": 0,
          "channels": [{"channel_type": "memory", "channel_ids": [0]}],
          "remote_buffer_refs": [{"access_channel_type": "memory", "remote_buffer_ids": [0, 1]}],
          "ops": [
            {"name": "put", "src_buff": [{"type": "i", "index": 1, "size": 1}], "dst_buff": [{"buffer_id": 0, "index": 0, "size": 1}], "channel_type": "memory"},
            {"name": "signal", "channel_ids": [0], "channel_type": "memory"},
            {"name": "wait", "channel_ids": [0], "channel_type": "memory"},
            {"name": "re", "src_buff": [{"type": "i", "index": 0, "size": 1}, {"type": "s", "index": 0, "size": 1}], "dst_buff": [{"type": "i", "index": 0, "size": 1}], "reduce_op": "sum"},
            {"name": "put", "src_buff": [{"type": "i", "index": 0, "size": 1}], "dst_buff": [{"buffer_id": 1, "index": 0, "size": 1}], "channel_type": "memory"},
            {"name": "signal", "channel_ids": [0], "channel_type": "memory"},
            {"name": "wait", "channel_ids": [0], "channel_type": "memory"}
          ]
        }
      ]
    },
    {
      "id": 1, "input_chunks": 2, "output_chunks": 2, "scratch_chunks": 1,
      "channels": [{"channel_type": "memory", "connected_to": [0]}],
      "remote_buffers": [{"rank": 0, "type": "s", "access_channel_types": ["memory"]},
                         {"rank": 0, "type": "i", "access_channel_types": ["memory"]}],
      "threadblocks": [
        {
          "id": 0,
          "channels": [{"channel_type": "memory", "channel_ids": [0]}],
          "remote_buffer_refs": [{"access_channel_type": "memory", "remote_buffer_ids": [0, 1]}],
          "ops": [
            {"name": "put", "src_buff": [{"type": "i", "index": 0, "size": 1}], "dst_buff": [{"buffer_id": 0, "index": 0, "size": 1}], "channel_type": "memory"},
            {"name": "signal", "channel_ids": [0], "channel_type": "memory"},
            {"name": "wait", "channel_ids": [0], "channel_type": "memory"},
            {"name": "re", "src_buff": [{"type": "i", "index": 1, "size": 1}, {"type": "s", "index": 0, "size": 1}], "dst_buff": [{"type": "i", "index": 1, "size": 1}], "reduce_op": "sum"},
            {"name": "put", "src_buff": [{"type": "i", "index": 1, "size": 1}], "dst_buff": [{"buffer_id": 1, "index": 1, "size": 1}], "channel_type": "memory"},
            {"name": "signal", "channel_ids": [0], "channel_type": "memory"},
            {"name": "wait", "channel_ids": [0], "channel_type": "memory"}
          ]
        }
      ]
    }
  ]
}
)";

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

// Replaces the nth occurrence (1-based).
std::string edit_nth(std::string text, const std::string& from, const std::string& to, int nth) {
  size_t at = std::string::npos;
  for (int i = 0; i < nth; ++i) {
    at = text.find(from, at == std::string::npos ? 0 : at + 1);
    REQUIRE(at != std::string::npos);
  }
  return text.replace(at, from.size(), to);
}

ir::Schedule imp(const std::string& text, importers::ImportInfo* info = nullptr) {
  return importers::import_mscclpp_json(text, "p.json", info);
}

void expect_error(const std::string& text, const char* id, const std::string& path, int line, const std::string& needle) {
  auto c = catch_error([&] { imp(text); });
  INFO(c.what);
  CHECK(c.id == id);
  CHECK(c.loc.file == "p.json");
  if (!path.empty()) CHECK(contains(c.message, path));
  if (line > 0) CHECK(c.loc.line == uint32_t(line));
  if (!needle.empty()) CHECK(contains(c.message, needle));
}

const std::string kSignal = R"({"name": "signal", "channel_ids": [0], "channel_type": "memory"},)";
const std::string kWait = R"({"name": "wait", "channel_ids": [0], "channel_type": "memory"},)";

}  // namespace

TEST_CASE("import: JSON line locator") {
  const std::string t = "{\n \"a\": [\n  {\"b\": 1},\n  {\"c\": [1, {\"d\": \"x]}\"}]}\n ],\n \"weird key\": {}\n}";
  importers::JsonLines l(t);
  CHECK(l.line("$") == 1);
  CHECK(l.line("$.a") == 2);
  CHECK(l.line("$.a[0]") == 3);
  CHECK(l.line("$.a[1]") == 4);
  CHECK(l.line("$.a[1].c") == 4);
  CHECK(l.line("$.a[1].c[1]") == 4);
  CHECK(l.line("$[\"weird key\"]") == 6);
  CHECK(l.line("$.nope") == 0);
  CHECK(l.max_depth() == 5);
  CHECK(l.duplicate_key().empty());
  importers::JsonLines d("{\"a\": 1,\n \"a\": 2}");
  CHECK(d.duplicate_key() == "$.a");
  CHECK(d.duplicate_line() == 2);
  // anything goes: unbalanced, unterminated
  importers::JsonLines x("]]]}}{\"\\");
  CHECK(x.max_depth() == 1);
}

TEST_CASE("import: a two-rank MSCCL++ plan becomes IR ops pointing at the JSON") {
  importers::ImportInfo info;
  ir::Schedule s = imp(kPlan, &info);
  CHECK(s.nranks == 2);
  CHECK(s.chunks == 2);
  CHECK(info.format == "mscclpp-json");
  CHECK(info.reading == "in-place");
  CHECK(info.sync_edges == 4);
  CHECK(s.ops.size() == 6);
  for (const auto& op : s.ops) {
    CHECK(op.loc->file == "p.json");
    CHECK(contains(op.loc->func, "$.gpus["));
  }
  // the reduce of gpu 1 points at its op's line
  const ir::Op* red = nullptr;
  for (const auto& op : s.ops)
    if (op.kind == ir::OpKind::reduce && op.rank == 1) red = &op;
  REQUIRE(red);
  CHECK(red->loc->func == "$.gpus[1].threadblocks[0].ops[3]");
  CHECK(red->loc->line == uint32_t(line_with(kPlan, "\"name\": \"re\"", 2)));
  verify::verify_semantics(s);
  mkt::simulate_all(s);
}

TEST_CASE("import: MSCCL++ 8-rank plans (all-pairs, packets, port channels) verify and simulate") {
  for (const char* f : {"mscclpp/allreduce_allpairs_8.json", "mscclpp/allreduce_packet_8.json",
                        "mscclpp/allgather_port_8.json"}) {
    CAPTURE(f);
    ir::Schedule s = importers::import_file(mkt::fixture(f));
    CHECK(s.nranks == 8);
    verify::verify_semantics(s);
    mkt::simulate_all(s, {DType::fp32, DType::fp16, DType::uint8});
  }
}

TEST_CASE("import: MSCCL++ op families in the fixtures") {
  struct F {
    const char* file;
    std::vector<const char*> ops;
  };
  const F files[] = {
      {"mscclpp/allreduce_packet_send_4.json", {"ppkt", "respkt", "repkt", "cpkt", "rppkt", "upkt"}},
      {"mscclpp/reducescatter_rre_4.json", {"rre", "rlxsignal", "rlxwait", "barrier", "tbg_info"}},
      {"mscclpp/alltoall_putget_4.json", {"put", "get", "copy"}},
      {"mscclpp/allreduce_pipeline_sem_2.json", {"pipeline", "sem_acquire", "sem_release", "re"}},
      {"mscclpp/allreduce_nvls_4.json", {"glres", "switch"}},
      {"mscclpp/allreduce_packet_8.json", {"recpkt"}},
      {"mscclpp/allgather_port_8.json", {"pws", "flush"}},
  };
  for (const F& f : files) {
    CAPTURE(f.file);
    std::string text = mkt::fixture_text(f.file);
    for (const char* op : f.ops) CHECK_MESSAGE(contains(text, std::string("\"") + op + "\""), op);
    importers::ImportInfo info;
    ir::Schedule s = importers::import_text(text, f.file, &info);
    verify::verify_semantics(s);
    mkt::simulate_all(s, {DType::fp32, DType::bf16});
    if (contains(f.file, "rre")) CHECK(info.refine == 2);
  }
  // NVLS: one glres is one reduce into every rank of the group
  ir::Schedule nv = importers::import_file(mkt::fixture("mscclpp/allreduce_nvls_4.json"));
  REQUIRE(nv.ops.size() == 4);
  CHECK(nv.ops[0].srcs.size() == 4);
  CHECK(nv.ops[0].dsts.size() == 4);
}

TEST_CASE("import: MSCCL++ truncated plan -> mk.import.E001 with the line") {
  const std::string full = kPlan;
  std::string t = full.substr(0, full.find("\"name\": \"re\"", full.find("\"name\": \"re\"") + 1));
  auto c = catch_error([&] { imp(t); });
  INFO(c.what);
  CHECK(c.id == "mk.import.E001");
  CHECK(c.loc.line == uint32_t(line_with(kPlan, "\"name\": \"re\"", 2)));
  expect_error(edit(kPlan, "\"name\": \"ar2\",", "\"name\": \"ar2\",\n  \"name\": \"again\","), "mk.import.E001",
               "$.name", 3, "twice");
}

TEST_CASE("import: MSCCL++ wrong types -> mk.import.E002 naming the JSON path") {
  expect_error(edit(kPlan, "\"gpus\": [", "\"gpus\": 5, \"x\": ["), "mk.import.E002", "$.gpus", 0, "expected an array");
  expect_error(edit(kPlan, "\"input_chunks\": 2", "\"input_chunks\": \"2\""), "mk.import.E002", "$.gpus[0].input_chunks",
               line_with(kPlan, "\"input_chunks\"") - 1, "expected an integer");
  expect_error(edit(kPlan, "\"inplace\": true", "\"inplace\": \"yes\""), "mk.import.E002", "$.inplace", 0, "");
  expect_error(edit(kPlan, "{\"type\": \"i\", \"index\": 1, \"size\": 1}], \"dst_buff\": [{\"buffer_id\": 0",
                    "{\"type\": \"i\", \"index\": 1.5, \"size\": 1}], \"dst_buff\": [{\"buffer_id\": 0"),
               "mk.import.E002", "$.gpus[0].threadblocks[0].ops[0].src_buff[0].index", line_with(kPlan, "\"name\": \"put\""),
               "integer");
  expect_error(edit(kPlan, "\"collective\": \"allreduce\"", "\"collective\": \"allreduce_v\""), "mk.import.E010",
               "$.collective", 0, "allreduce_v");
}

TEST_CASE("import: MSCCL++ unknown op -> mk.import.E003 naming it, its path and line") {
  expect_error(edit_nth(kPlan, "\"name\": \"re\"", "\"name\": \"frobnicate\"", 2), "mk.import.E003",
               "$.gpus[1].threadblocks[0].ops[3]", line_with(kPlan, "\"name\": \"re\"", 2), "unknown op \"frobnicate\"");
}

TEST_CASE("import: MSCCL++ rank, channel and buffer references out of range -> mk.import.E004") {
  expect_error(edit(kPlan, "{\"rank\": 1, \"type\": \"s\"", "{\"rank\": 9, \"type\": \"s\""), "mk.import.E004",
               "$.gpus[0].remote_buffers[0].rank", line_with(kPlan, "\"remote_buffers\""), "rank 9");
  expect_error(edit(kPlan, "\"connected_to\": [1]", "\"connected_to\": [2]"), "mk.import.E004",
               "$.gpus[0].channels[0].connected_to[0]", 0, "not a gpu");
  expect_error(edit(kPlan, "\"channel_ids\": [0]}]", "\"channel_ids\": [3]}]"), "mk.import.E004",
               "$.gpus[0].threadblocks[0].channels[0].channel_ids[0]", 0, "memory channel 3");
  expect_error(edit(kPlan, "{\"buffer_id\": 1, \"index\": 0", "{\"buffer_id\": 4, \"index\": 0"), "mk.import.E004",
               "$.gpus[0].threadblocks[0].ops[4].dst_buff[0].buffer_id", line_with(kPlan, "{\"buffer_id\": 1, \"index\": 0"),
               "buffer_id 4");
  expect_error(edit(kPlan, "\"id\": 1, \"input_chunks\"", "\"id\": 2, \"input_chunks\""), "mk.import.E004",
               "$.gpus[1].id", 0, "gpu id 2");
}

TEST_CASE("import: MSCCL++ chunk out of bounds -> mk.import.E005 with the path") {
  expect_error(edit(kPlan, "\"src_buff\": [{\"type\": \"i\", \"index\": 1, \"size\": 1}], \"dst_buff\": [{\"buffer_id\": 0",
                    "\"src_buff\": [{\"type\": \"i\", \"index\": 1, \"size\": 2}], \"dst_buff\": [{\"buffer_id\": 0"),
               "mk.import.E002", "$.gpus[0].threadblocks[0].ops[0]", 0, "size");
  expect_error(edit(kPlan, "\"src_buff\": [{\"type\": \"i\", \"index\": 1, \"size\": 1}], \"dst_buff\": [{\"buffer_id\": 0, \"index\": 0, \"size\": 1}]",
                    "\"src_buff\": [{\"type\": \"i\", \"index\": 7, \"size\": 1}], \"dst_buff\": [{\"buffer_id\": 0, \"index\": 0, \"size\": 1}]"),
               "mk.import.E005", "$.gpus[0].threadblocks[0].ops[0].src_buff[0]", line_with(kPlan, "\"name\": \"put\""),
               "i[7]");
  expect_error(edit(kPlan, "{\"buffer_id\": 0, \"index\": 0, \"size\": 1}", "{\"buffer_id\": 0, \"index\": 1, \"size\": 1}"),
               "mk.import.E005", "$.gpus[0].threadblocks[0].ops[0].dst_buff[0]", 0, "gpu 1 s[1]");
}

TEST_CASE("import: MSCCL++ unmatched signal/wait -> mk.import.E008") {
  // gpu 1 never waits the second time
  std::string t = edit_nth(kPlan, kWait.substr(0, kWait.size() - 1), R"({"name": "nop"})", 4);
  expect_error(t, "mk.import.E008", "", line_with(kPlan, "\"name\": \"signal\"", 2), "the 2 signal");
  // a wait nothing signals
  std::string u = edit_nth(kPlan, kSignal, "", 3);
  expect_error(u, "mk.import.E008", "", 0, "waits forever");
}

TEST_CASE("import: MSCCL++ missing synchronisation -> mk.import.E009 race naming both ops") {
  // gpu 0 does not signal after its put, gpu 1 does not wait for it: gpu 1's
  // reduce reads the scratch chunk gpu 0 writes
  std::string t = edit_nth(kPlan, kSignal, "", 1);
  t = edit_nth(t, kWait, "", 2);
  auto c = catch_error([&] { imp(t); });
  INFO(c.what);
  CHECK(c.id == "mk.import.E009");
  CHECK(contains(c.message, "race on gpu "));
  CHECK(contains(c.message, "(put)"));
  CHECK(contains(c.message, "$.gpus[0].threadblocks[0].ops[0]"));
  CHECK(c.loc.line > 0);
}

TEST_CASE("import: MSCCL++ waits before signals on both sides -> mk.import.E007 deadlock") {
  std::string both = kSignal + "\n            " + kWait;
  std::string swapped = kWait + "\n            " + kSignal;
  std::string t = kPlan;
  for (int i = 0; i < 2; ++i) {
    auto at = t.find(both);
    REQUIRE(at != std::string::npos);
    t.replace(at, both.size(), swapped);
  }
  auto c = catch_error([&] { imp(t); });
  INFO(c.what);
  CHECK(c.id == "mk.import.E007");
  CHECK(contains(c.message, "(wait)"));
}

TEST_CASE("import: MSCCL++ barriers, semaphores and packets that cannot complete -> mk.import.E008") {
  std::string rs = mkt::fixture_text("mscclpp/reducescatter_rre_4.json");
  auto c = catch_error([&] {
    importers::import_text(edit(rs, "\"num_threadblocks\": 2", "\"num_threadblocks\": 3"), "b.json");
  });
  CHECK(c.id == "mk.import.E008");
  std::string ps = mkt::fixture_text("mscclpp/allreduce_pipeline_sem_2.json");
  c = catch_error([&] { importers::import_text(edit(ps, "\"name\": \"sem_release\"", "\"name\": \"nop\""), "s.json"); });
  CHECK(c.id == "mk.import.E008");
  CHECK(contains(c.message, "waits forever"));
  std::string pk = mkt::fixture_text("mscclpp/allreduce_packet_8.json");
  c = catch_error([&] { importers::import_text(edit(pk, "\"name\": \"ppkt\"", "\"name\": \"nop\""), "k.json"); });
  CHECK(c.id == "mk.import.E008");
  CHECK(contains(c.message, "nothing writes"));
}

TEST_CASE("import: MSCCL++ formats and features it does not read -> mk.import.E010, and limits -> E012") {
  // plans from before v0.6
  expect_error(edit(kPlan, "\"channel_type\": \"memory\", \"connected_to\": [1]",
                    "\"channel_type\": \"memory\", \"srcbuff\": \"i\", \"connected_to\": [1]"),
               "mk.import.E010", "$.gpus[0].channels[0]", 0, "before v0.6");
  expect_error(edit(kPlan, "{\"name\": \"wait\", \"channel_ids\": [0]", "{\"name\": \"wait\", \"i_cids\": [], \"channel_ids\": [0]"),
               "mk.import.E010", "$.gpus[0].threadblocks[0].ops[2]", 0, "i_cids");
  std::string deep = "{\"a\": ";
  for (int i = 0; i < 100; ++i) deep += "[";
  expect_error(deep, "mk.import.E012", "", 1, "nested");
}

TEST_CASE("import: numbers too large for JSON -> mk.import.E001 / mk.ir.E001, not an escaping exception") {
  // found by fuzz_mscclpp_json: nlohmann reports these as out_of_range, not parse_error
  expect_error(edit(kPlan, "\"scratch_chunks\": 1,\n      \"channels\"", "\"scratch_chunks\": 1e99999,\n      \"channels\""),
               "mk.import.E001", "", line_with(kPlan, "\"id\": 0, \"input_chunks\""), "number overflow");
  auto c = catch_error([&] { importers::import_text("{\"mk_ir_version\": 1, \"x\": 1e99999}", "ir.json"); });
  CHECK(c.id == "mk.ir.E001");
  mkt::import_is_clean(mkt::read_text(mkt::test_dir() + "/../fuzz/corpus/mscclpp_json/regress-number-overflow"), "r.json");
}

TEST_CASE("import: damaged MSCCL++ plans fail cleanly (truncation, byte damage)") {
  mkt::damage_is_clean(kPlan, "d.json", 400);
  mkt::damage_is_clean(mkt::fixture_text("mscclpp/allreduce_pipeline_sem_2.json"), "d.json", 100);
}

// ---- plans as mscclpp.language writes them today ---------------------------

namespace {

using nlohmann::json;

json fixture_json(const char *rel) {
  return json::parse(mkt::fixture_text(rel));
}

mkt::Caught import_error(const json &plan) {
  return catch_error([&] { importers::import_text(plan.dump(2), "p.json"); });
}

} // namespace

TEST_CASE("import: MSCCL++ pipelined NVLS plan in today's format (switch "
          "channel \"buff\", no \"buffer_type\")") {
  // the shape of MSCCL++'s allreduce_pipeline.json: every thread block one
  // pipeline, a semaphore ring between them, channels spelt "type"/"buff"
  importers::ImportInfo info;
  std::string text =
      mkt::fixture_text("mscclpp/allreduce_pipeline_nvls_4.json");
  CHECK(!contains(text, "buffer_type"));
  ir::Schedule s = importers::import_text(text, "pn.json", &info);
  CHECK(s.nranks == 4);
  verify::verify_semantics(s);
  mkt::simulate_all(s, {DType::fp32, DType::bf16});
  // the older spelling still reads (allreduce_nvls_4.json uses "buffer_type"),
  // and a switch channel with neither names both
  json p = fixture_json("mscclpp/allreduce_pipeline_nvls_4.json");
  p["gpus"][2]["channels"][0].erase("buff");
  auto c = import_error(p);
  INFO(c.what);
  CHECK(c.id == "mk.import.E002");
  CHECK(contains(c.message, "$.gpus[2].channels[0]"));
  CHECK(contains(c.message, "\"buff\""));
}

TEST_CASE("import: MSCCL++ thread-block groups: member k takes part k of its "
          "op's whole range") {
  // race-free: gpu 1 stages each chunk with its own grouped copy, so member k
  // of gpu 1 stages half k of chunk 0, which member k of gpu 0 reads after
  // member k's signal
  ir::Schedule s =
      importers::import_file(mkt::fixture("mscclpp/allreduce_tbg_2.json"));
  verify::verify_semantics(s);
  mkt::simulate_all(s, {DType::fp32, DType::uint8});
  // reduce_tbg.json's shape: one grouped copy of s[0:2] on gpu 1, so member
  // 0 stages all of chunk 0 while gpu 0's member 1 (ordered only after gpu
  // 1's member 1) reads its second half: a real race, shown as an interleaving
  auto c = catch_error([&] {
    importers::import_file(mkt::fixture("mscclpp/allreduce_tbg_race_2.json"));
  });
  INFO(c.what);
  CHECK(c.id == "mk.import.E009");
  CHECK(contains(c.message, "race on gpu 1 s[0] bytes [C/2, C)"));
  CHECK(contains(
      c.message,
      "gpu 1 tb 0 ops[0] (copy, member 0 of a thread-block group of 2)"));
  CHECK(contains(
      c.message,
      "gpu 0 tb 1 ops[6] (rres, member 1 of a thread-block group of 2)"));
  CHECK(contains(c.message,
                 "no step of gpu 1 tb 0 is ordered before the gpu 0 tb 1 one"));
  CHECK(contains(
      c.message,
      "gpu 0 tb 1 ops[4] (wait) waits for gpu 1 tb 1 ops[2] (signal)"));
  CHECK(
      contains(c.message,
               "gpu 1 tb 0 ops[2] (signal) releases gpu 0 tb 0 ops[4] (wait)"));
  CHECK(contains(c.what, "nop orders the steps of its own thread block only"));
}

TEST_CASE("import: MSCCL++ pipelines whose iterations do not line up -> "
          "mk.import.E010") {
  json p;
  mkt::Caught c;
  // a range shorter than num_chunks: MSCCL++ would run past its end
  p = fixture_json("mscclpp/allreduce_pipeline_sem_2.json");
  p["gpus"][0]["threadblocks"][0]["ops"][0]["iter_context"]["num_chunks"] = 2;
  c = import_error(p);
  CHECK_MESSAGE(c.id == "mk.import.E010", c.what);
  CHECK(contains(c.message,
                 "$.gpus[0].threadblocks[0].ops[0].ops[0].src_buff[0]"));
  CHECK(contains(c.message, "overrun past its end"));

  // a semaphore released once (outside) and acquired once per iteration
  p = fixture_json("mscclpp/allreduce_pipeline_sem_2.json");
  for (auto &g : p["gpus"]) {
    json &ops = g["threadblocks"][1]["ops"];
    json inner = json::array({ops[0], ops[1]});
    ops.erase(0);
    ops[0] = {{"name", "pipeline"},
              {"iter_context", {{"unit_size", 1 << 20}, {"num_chunks", 1}}},
              {"ops", inner}};
  }
  c = import_error(p);
  CHECK_MESSAGE(c.id == "mk.import.E010", c.what);
  CHECK(contains(c.message, "semaphore 0 of gpu 0"));
  CHECK(contains(c.message, "outside any pipeline"));

  // signal/wait between pipelines of different unit sizes (different iteration
  // counts)
  p = fixture_json("mscclpp/allreduce_pipeline_nvls_4.json");
  p["gpus"][0]["threadblocks"][0]["ops"][0]["iter_context"]["unit_size"] =
      1 << 19;
  c = import_error(p);
  CHECK_MESSAGE(c.id == "mk.import.E010", c.what);
  CHECK(contains(c.message, "unit_size 524288"));
  CHECK(contains(c.message, "the number of times they run differs"));

  // packets inside a pipeline: the executor repeats them in every iteration
  p = fixture_json("mscclpp/allreduce_pipeline_nvls_4.json");
  p["gpus"][1]["threadblocks"][0]["ops"][0]["ops"][2]["name"] = "cpkt";
  c = import_error(p);
  CHECK_MESSAGE(c.id == "mk.import.E010", c.what);
  CHECK(contains(c.message, "$.gpus[1].threadblocks[0].ops[0].ops[2]"));
  CHECK(contains(c.message, "cpkt inside a pipeline"));

  // two ranges that overlap without being equal meet at different iterations
  p = fixture_json("mscclpp/allreduce_pipeline_nvls_4.json");
  json &pipe = p["gpus"][0]["threadblocks"][0]["ops"][0];
  pipe["iter_context"]["num_chunks"] = 2;
  json &in = pipe["ops"];
  in.erase(in.begin() + 2, in.begin() + 6);
  in.insert(
      in.begin() + 2,
      json::parse(
          R"({"name": "copy", "src_buff": [{"type": "i", "index": 1, "size": 2}],
                                            "dst_buff": [{"type": "s", "index": 1, "size": 2}]})"));
  in.insert(
      in.begin() + 2,
      json::parse(
          R"({"name": "copy", "src_buff": [{"type": "i", "index": 0, "size": 2}],
                                            "dst_buff": [{"type": "s", "index": 0, "size": 2}]})"));
  c = import_error(p);
  CHECK_MESSAGE(c.id == "mk.import.E010", c.what);
  CHECK(contains(c.message, "overlap without being equal"));
}
