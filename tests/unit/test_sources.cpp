// Schedules from files (compiler/sources.hpp): what MK_SCHEDULES and a
// communicator's config load into the registry, and the errors of bad lists.
// The runtime's use of it (selection, agreement between ranks, proofs at
// init) is tested across processes in tests/runtime/test_multiprocess.cpp.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "compiler/ir/ir.hpp"
#include "compiler/pipeline.hpp"
#include "compiler/sources.hpp"
#include "mk/dsl.hpp"
#include "support.hpp"

using namespace mk;
using mkt::catch_error;
using mkt::contains;

namespace {

std::string fixture(const std::string& rel) { return mkt::test_dir() + "/fixtures/" + rel; }

}  // namespace

TEST_CASE("sources: an MSCCL file registers one schedule for its rank count, named by the file or by NAME=") {
  const auto got = sources::load(fixture("msccl/reducescatter_ring_4.xml"));
  REQUIRE(got.size() == 1);
  CHECK(got[0].kind == "msccl-xml");
  REQUIRE(got[0].schedules.size() == 1);
  const dsl::ScheduleInfo* info = dsl::find_schedule(got[0].schedules[0]);
  REQUIRE(info != nullptr);
  CHECK(info->coll == Collective::reducescatter);
  REQUIRE(info->imported != nullptr);
  // it builds for its own rank count and proves there ...
  const ir::Schedule s = dsl::build(*info, 4);
  CHECK(s.nranks == 4);
  CHECK(s.name == info->name);
  CHECK_NOTHROW(compiler::lower(s, {}));
  // ... and for no other, with an error naming the file
  auto c = catch_error([&] { dsl::build(*info, 8); });
  CHECK(c.id == "mk.dsl.E008");
  CHECK(contains(c.message, "reducescatter_ring_4.xml for 4 ranks"));
  c = catch_error([&] { dsl::build(*info, 4, 1); });
  CHECK(c.id == "mk.dsl.E008");
  // loading it again gives what it loaded, without registering twice
  const auto again = sources::load(fixture("msccl/reducescatter_ring_4.xml"));
  REQUIRE(again.size() == 1);
  CHECK(again[0].schedules == got[0].schedules);
  CHECK(again[0].digest == got[0].digest);
  // the same file under a name of the user's
  const auto named = sources::load("t.src.rs4=" + fixture("msccl/reducescatter_ring_4.xml") + "::");
  REQUIRE(named.size() == 1);
  CHECK(named[0].schedules == std::vector<std::string>{"t.src.rs4"});
  CHECK(dsl::find_schedule("t.src.rs4") != nullptr);
  CHECK(sources::describe(named) == "t.src.rs4@" + named[0].digest);
}

TEST_CASE("sources: a name that is taken is refused and the built-in stays (also from a DSL file)") {
  auto c = catch_error([&] { sources::load("allreduce.ring=" + fixture("msccl/allreduce_ring_8.xml")); });
  CHECK(c.id == "mk.cli.E014");
  CHECK(contains(c.message, "'allreduce.ring'"));
  CHECK(contains(c.message, "already a schedule"));
  const dsl::ScheduleInfo* ring = dsl::find_schedule("allreduce.ring");
  REQUIRE(ring != nullptr);
  CHECK(ring->imported == nullptr);
  CHECK(contains(ring->file, "schedules/allreduce_ring.cpp"));

  // A DSL file that registers a built-in's name: refused, the built-in kept.
  mkt::TempDir d;
  mkt::write_text(d / "shadow.cpp", R"(#include <mk/dsl.hpp>
using namespace mk::dsl;
static void shadow(Program& p) { p.copy(p.output(0, 0), p.input(0, 0)); }
MK_SCHEDULE("allreduce.ring", allreduce, shadow, "tries to replace the built-in ring");
)");
  mkt::ScopedEnv env("MK_CACHE_DIR", mkt::process_cache_dir());
  c = catch_error([&] { sources::load((d / "shadow.cpp").string()); });
  CHECK(c.id == "mk.cli.E014");
  CHECK(contains(c.message, "shadow.cpp"));
  ring = dsl::find_schedule("allreduce.ring");
  REQUIRE(ring != nullptr);
  CHECK(contains(ring->file, "schedules/allreduce_ring.cpp"));
  CHECK(ring->doc != "tries to replace the built-in ring");
  // asked again (the runtime asks at every init): the same error, not "defines no schedule"
  c = catch_error([&] { sources::load((d / "shadow.cpp").string()); });
  CHECK(c.id == "mk.cli.E014");
}

TEST_CASE("sources: a DSL file's schedules load by their own names, and NAME= is refused for it") {
  mkt::ScopedEnv env("MK_CACHE_DIR", mkt::process_cache_dir());
  const auto got = sources::load(fixture("dsl/two_schedules.cpp"));
  REQUIRE(got.size() == 1);
  CHECK(got[0].kind == "dsl-source");
  CHECK(got[0].schedules.size() == 2);
  for (const auto& n : got[0].schedules) CHECK(dsl::find_schedule(n) != nullptr);
  auto c = catch_error([&] { sources::load("mine=" + fixture("dsl/hand_allreduce.cpp")); });
  CHECK(c.id == "mk.cli.E014");
  CHECK(contains(c.message, "names its schedules itself"));
}

TEST_CASE("sources: bad lists fail with the file named: missing, a directory, too large, bad names, bad content") {
  auto c = catch_error([&] { sources::load("/nonexistent/a.xml"); });
  CHECK(c.id == "mk.cli.E009");
  CHECK(contains(c.message, "/nonexistent/a.xml"));
  mkt::TempDir d;
  c = catch_error([&] { sources::load(d.str()); });
  CHECK(c.id == "mk.cli.E009");
  {  // sparse: 65 MiB of nothing costs no disk
    std::ofstream f(d / "huge.xml", std::ios::binary);
    f.seekp((int64_t(65) << 20) - 1);
    f.put('\0');
  }
  c = catch_error([&] { sources::load((d / "huge.xml").string()); });
  CHECK(c.id == "mk.cli.E009");
  CHECK(contains(c.message, "at most 67108864"));
  c = catch_error([&] { sources::load("9lives=" + fixture("msccl/allgather_copy_4.xml")); });
  CHECK(c.id == "mk.cli.E014");
  c = catch_error([&] { sources::load("a$b=" + fixture("msccl/allgather_copy_4.xml")); });
  CHECK(c.id == "mk.cli.E014");
  mkt::write_text(d / "garbage.xml", "<algo name='x' proto='Simple' nchunksperloop='1' ngpus='2'");
  c = catch_error([&] { sources::load((d / "garbage.xml").string()); });
  CHECK(c.id == "mk.import.E001");
  // An MSCCL algorithm of another root is relabelled to root 0 on import
  // (the runtime renumbers ranks for every root) ...
  const auto b = sources::load("t.src.b2=" + fixture("msccl/broadcast_root2_4.xml"));
  CHECK(b.size() == 1);
  REQUIRE(dsl::find_schedule("t.src.b2") != nullptr);
  CHECK(dsl::build(*dsl::find_schedule("t.src.b2"), 4).root == 0);
  // ... an IR file of another root is refused
  mkt::write_text(d / "root1.json", R"({"mk_ir_version": 1, "name": "b", "collective": "broadcast", "ranks": 2,
  "root": 1, "chunks": 1, "instances": 1, "scratch": 0, "depth": 1, "proto": "simple", "slots": 0, "tbs": 0,
  "tile_bytes": 0, "staged": false, "synced": false, "ops": [
  {"id": 0, "kind": "copy", "rank": 1, "tb": -1, "dsts": ["r0.out[0]"], "srcs": ["r1.in[0]"]},
  {"id": 1, "kind": "copy", "rank": 1, "tb": -1, "dsts": ["r1.out[0]"], "srcs": ["r1.in[0]"]}]})");
  c = catch_error([&] { sources::load("t.src.r1=" + (d / "root1.json").string()); });
  CHECK(c.id == "mk.dsl.E008");
  CHECK(dsl::find_schedule("t.src.r1") == nullptr);
}

TEST_CASE("sources: valid names") {
  CHECK(sources::valid_name("my.allreduce-v2_x"));
  CHECK_FALSE(sources::valid_name(""));
  CHECK_FALSE(sources::valid_name("2ring"));
  CHECK_FALSE(sources::valid_name(".ring"));
  CHECK_FALSE(sources::valid_name("a b"));
  CHECK_FALSE(sources::valid_name(std::string(97, 'a')));
  CHECK(sources::valid_name(std::string(96, 'a')));
}
