// The selection table (runtime/plans/select.hpp): the built-in table's choices,
// the format's checks on hostile input, and its round trip.
#include <doctest/doctest.h>

#include "runtime/comm/comm.hpp"
#include "runtime/plans/select.hpp"
#include "runtime/api/status.hpp"
#include "support.hpp"

using namespace mk;
using mkt::contains;

namespace {

std::string parse_error(const std::string& text) {
  try {
    rt::parse_select(text, "t.json");
  } catch (const rt::RtError& e) {
    CHECK(e.code() == mkInvalidArgument);
    return e.what();
  }
  FAIL("no error for " << text);
  return "";
}

}  // namespace

TEST_CASE("select: the built-in table picks one-shot up to 256 KiB, a bandwidth schedule above, in place when registered") {
  const auto& t = rt::builtin_select();
  CHECK(!t.entries.empty());
  auto pick = [&](Collective c, int n, int64_t bytes, bool reg) {
    const rt::SelectEntry* e = reg ? rt::lookup(t, c, n, bytes, true) : nullptr;
    if (!e) e = rt::lookup(t, c, n, bytes, false);
    REQUIRE(e != nullptr);
    return e->schedule;
  };
  CHECK(pick(Collective::allreduce, 2, 8, false) == "allreduce.one_shot");
  CHECK(pick(Collective::allreduce, 2, 256 << 10, false) == "allreduce.one_shot");
  CHECK(pick(Collective::allreduce, 2, (256 << 10) + 1, false) == "allreduce.ring");
  CHECK(pick(Collective::allreduce, 8, int64_t(1) << 30, false) == "allreduce.two_shot");
  CHECK(pick(Collective::allreduce, 2, 64 << 20, true) == "allreduce.direct");
  CHECK(pick(Collective::reducescatter, 4, 64 << 20, true) == "reducescatter.pull");
  CHECK(pick(Collective::allgather, 4, 64 << 20, true) == "allgather.direct");  // no registered entry: the others
  for (Collective c : all_collectives())
    for (int n = 1; n <= 8; ++n) CHECK(rt::lookup(t, c, n, 12345, false) != nullptr);
  CHECK(rt::lookup(t, Collective::allreduce, 16, 1000, false) == nullptr);  // above 8 ranks: the cost model
  // and the runtime follows it
  CHECK(rt::choose_schedule(Collective::allreduce, 2, 1000).schedule == "allreduce.one_shot");
  CHECK(rt::choose_schedule(Collective::allreduce, 2, 64 << 20, true).schedule == "allreduce.direct");
  const rt::Choice c = rt::choose_schedule(Collective::allreduce, 2, (256 << 10) + 7);
  CHECK(c.schedule == "allreduce.ring");
  CHECK(c.lo == (256 << 10) + 1);
  CHECK(c.hi == -1);
}

TEST_CASE("select: what schedules_for lists covers every entry the tables can pick") {
  const auto v = rt::schedules_for(Collective::allreduce, 2);
  auto has = [&](const char* s) {
    return std::any_of(v.begin(), v.end(), [&](const rt::Choice& c) { return c.schedule == s; });
  };
  CHECK(has("allreduce.one_shot"));
  CHECK(has("allreduce.ring"));
}

TEST_CASE("select: a table round-trips through its JSON, and hostile tables are refused naming the field") {
  rt::SelectTable t;
  t.note = "measured here";
  rt::SelectEntry e;
  e.coll = Collective::allgather;
  e.min_ranks = 2;
  e.max_ranks = 4;
  e.min_bytes = 16;
  e.max_bytes = 4096;
  e.schedule = "allgather.ring";
  e.tune = "ll_instances=8";
  e.registered = true;
  t.entries.push_back(e);
  const rt::SelectTable back = rt::parse_select(rt::to_json(t), "t.json");
  REQUIRE(back.entries.size() == 1);
  CHECK(back.note == "measured here");
  CHECK(back.entries[0].coll == Collective::allgather);
  CHECK(back.entries[0].min_ranks == 2);
  CHECK(back.entries[0].max_ranks == 4);
  CHECK(back.entries[0].min_bytes == 16);
  CHECK(back.entries[0].max_bytes == 4096);
  CHECK(back.entries[0].schedule == "allgather.ring");
  CHECK(back.entries[0].tune == "ll_instances=8");
  CHECK(back.entries[0].registered);

  CHECK(contains(parse_error("not json"), "t.json: $: not valid JSON"));
  CHECK(contains(parse_error("[]"), "$: expected an object"));
  CHECK(contains(parse_error(R"({"entries": []})"), "$.mkernel_select: expected 1"));
  CHECK(contains(parse_error(R"({"mkernel_select": 2, "entries": []})"), "$.mkernel_select"));
  CHECK(contains(parse_error(R"({"mkernel_select": 1, "entries": [], "extra": 1})"), "$.extra: unknown key"));
  CHECK(contains(parse_error(R"({"mkernel_select": 1})"), "$.entries: expected an array"));
  const std::string head = R"({"mkernel_select": 1, "entries": [)";
  CHECK(contains(parse_error(head + R"({"schedule": "allreduce.ring"}]})"), "$.entries[0].collective"));
  CHECK(contains(parse_error(head + R"({"collective": "allsum", "schedule": "allreduce.ring"}]})"),
                 "'allsum' is not a collective"));
  CHECK(contains(parse_error(head + R"({"collective": "allreduce", "schedule": "nope"}]})"),
                 "$.entries[0].schedule: no schedule named 'nope'"));
  CHECK(contains(parse_error(head + R"({"collective": "allreduce", "schedule": "allgather.ring"}]})"),
                 "implements allgather, not allreduce"));
  CHECK(contains(parse_error(head + R"({"collective": "allreduce", "schedule": "allreduce.ring", "min_ranks": 0}]})"),
                 "$.entries[0].min_ranks: 0 is outside"));
  CHECK(contains(parse_error(head + R"({"collective": "allreduce", "schedule": "allreduce.ring", "min_ranks": 4, "max_ranks": 2}]})"),
                 "$.entries[0].max_ranks"));
  CHECK(contains(parse_error(head + R"({"collective": "allreduce", "schedule": "allreduce.ring", "min_bytes": 10, "max_bytes": 5}]})"),
                 "$.entries[0].max_bytes: 5 is below min_bytes 10"));
  CHECK(contains(parse_error(head + R"({"collective": "allreduce", "schedule": "allreduce.ring", "min_bytes": 1.5}]})"),
                 "$.entries[0].min_bytes: expected an integer"));
  CHECK(contains(parse_error(head + R"({"collective": "allreduce", "schedule": "allreduce.ring", "tune": "tile=16"}]})"),
                 "$.entries[0].tune"));
  CHECK(contains(parse_error(head + R"({"collective": "allreduce", "schedule": "allreduce.ring", "registered": 1}]})"),
                 "$.entries[0].registered: expected true or false"));
  CHECK(contains(parse_error(head + R"({"collective": "allreduce", "schedule": "allreduce.ring", "x": 1}]})"),
                 "$.entries[0].x: unknown key"));
  CHECK(contains(parse_error(std::string(100, '[') + std::string(100, ']')), "not valid JSON"));
  CHECK(contains(parse_error(std::string(17u << 20, ' ')), "larger than 16 MiB"));
}

TEST_CASE("select: the built-in table is runtime/plans/select_builtin.json, the file that is installed, byte for byte") {
  const std::string file = mkt::read_text(mkt::test_dir() + "/../runtime/plans/select_builtin.json");
  REQUIRE(!file.empty());
  // what the library holds parses to the same table as the file
  const auto from_file = rt::parse_select(file, "select_builtin.json");
  CHECK(rt::to_json(from_file) == rt::to_json(rt::builtin_select()));
  CHECK(from_file.entries.size() == rt::builtin_select().entries.size());
  CHECK(from_file.note == rt::builtin_select().note);
}

TEST_CASE("select: entries are keyed by the machine too, nodes x GPUs per node and the link inside a node") {
  const std::string head = R"({"mkernel_select": 1, "entries": [)";
  const rt::SelectTable t = rt::parse_select(
      head + R"({"collective": "allreduce", "min_ranks": 8, "max_ranks": 8, "min_nodes": 2, "max_nodes": 4,
                 "gpus_per_node": 4, "schedule": "allreduce.hier"},
                {"collective": "allreduce", "min_ranks": 4, "max_ranks": 4, "intra": "pcie", "schedule": "allreduce.ring"},
                {"collective": "allreduce", "min_ranks": 4, "max_ranks": 8, "schedule": "allreduce.one_shot"}]})",
      "t.json");
  auto pick = [&](const std::string& topo) {
    const rt::SelectEntry* e = rt::lookup(t, Collective::allreduce, topology::parse(topo, 0), 1000, false);
    return e ? e->schedule : std::string("none");
  };
  CHECK(pick("2x4") == "allreduce.hier");
  CHECK(pick("2x4:pcie") == "allreduce.hier");  // no "intra": any link
  CHECK(pick("4x2") == "none");                 // 8 ranks, but 2 per node
  CHECK(pick("nvlink:8") == "allreduce.one_shot");  // no node fields: one node only
  CHECK(pick("pcie:4") == "allreduce.ring");
  CHECK(pick("nvlink:4") == "allreduce.one_shot");
  CHECK(rt::lookup(t, Collective::allreduce, 4, 1000, false)->schedule == "allreduce.one_shot");  // a rank count: one NVLink node
  // the built-in table is for one node: across nodes the cost model picks among the schedules that lower there
  CHECK(rt::lookup(rt::builtin_select(), Collective::allreduce, topology::parse("2x4", 0), 1000, false) == nullptr);
  // round trip of the machine fields
  const rt::SelectTable back = rt::parse_select(rt::to_json(t), "t.json");
  CHECK(rt::to_json(back) == rt::to_json(t));
  CHECK(back.entries[0].min_nodes == 2);
  CHECK(back.entries[0].max_nodes == 4);
  CHECK(back.entries[0].gpus_per_node == 4);
  CHECK(back.entries[1].intra == "pcie");
  CHECK(back.entries[2].min_nodes == 1);
  CHECK(contains(parse_error(head + R"({"collective": "allreduce", "schedule": "allreduce.ring", "intra": "ib"}]})"),
                 "$.entries[0].intra: expected \"nvlink\" or \"pcie\""));
  CHECK(contains(parse_error(head + R"({"collective": "allreduce", "schedule": "allreduce.ring", "min_nodes": 3, "max_nodes": 2}]})"),
                 "$.entries[0].max_nodes"));
  CHECK(contains(parse_error(head + R"({"collective": "allreduce", "schedule": "allreduce.ring", "gpus_per_node": 0}]})"),
                 "$.entries[0].gpus_per_node: 0 is outside"));
}

TEST_CASE("select: across nodes with no entry the cost model picks among the schedules that lower for the machine") {
  const auto t = topology::parse("8x8", 64);
  const rt::Choice small = rt::choose_schedule(Collective::allreduce, t, 64 << 10);
  CHECK(small.schedule == "allreduce.hier_tree");  // log2 steps across nodes
  CHECK(small.lo <= (64 << 10));
  CHECK(small.hi >= (64 << 10));
  CHECK(rt::choose_schedule(Collective::allreduce, t, int64_t(256) << 20).schedule == "allreduce.hier");  // the ring's bandwidth
  CHECK(rt::choose_schedule(Collective::allgather, t, int64_t(16) << 20).schedule == "allgather.hier");
}
