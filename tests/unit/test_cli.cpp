// The mkc command line (run as a child process: exit codes, stdout, stderr),
// user-authored DSL files (tests/fixtures/dsl/, compiled into plugins), and
// bad input: one test per error id the CLI, the plugins, NVRTC and the plan
// reader raise. A user error exits with 1 and prints "mkc: error: [mk.x.Eyyy]";
// 2 is a bad command line, 3 an internal error (a crash: never expected here).
#include <chrono>
#include <fstream>
#include <iterator>
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "compiler/compile.hpp"
#include "compiler/ir/ir.hpp"
#include "compiler/jit/jit.hpp"
#include "compiler/pipeline.hpp"
#include "compiler/plan/plan.hpp"
#include "compiler/plugin.hpp"
#include "compiler/verify/verify.hpp"
#include "mk/composite.hpp"
#include "mk/dsl.hpp"
#include "plan_util.hpp"
#include "runtime/plans/select.hpp"
#include "support.hpp"

using namespace mk;
using mkt::catch_error;
using mkt::contains;
using mkt::mkc;
using mkt::RunResult;
namespace fs = std::filesystem;

namespace {

std::string fixture(const std::string& name) { return mkt::test_dir() + "/fixtures/dsl/" + name; }

int marked_line(const std::string& name) {
  int line = mkt::line_of(fixture(name), "MARK:");
  REQUIRE(line > 0);
  return line;
}

// A real driver (libcuda.so.1) on this machine, found without the fake's directory.
bool cuda_available_here() { return fs::exists("/usr/lib/x86_64-linux-gnu/libcuda.so.1") || fs::exists("/usr/lib64/libcuda.so.1"); }

nlohmann::json plan_json(const std::string& dir) { return nlohmann::json::parse(mkt::read_text(fs::path(dir) / "plan.json")); }

void put_json(const std::string& dir, const nlohmann::json& j) { mkt::write_text(fs::path(dir) / "plan.json", j.dump(2)); }

#define CHECK_OK(result)             \
  do {                               \
    const RunResult& r_ = (result);  \
    INFO(r_);                        \
    CHECK(r_.exit_code == 0);        \
    CHECK(r_.signal == 0);           \
  } while (0)

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

}  // namespace

// ---- smoke tests of every command ---------------------------------------------

TEST_CASE("mkc list: every registered schedule with its collective and description, composites, fusions") {
  auto r = mkc({"list"});
  CHECK_OK(r);
  auto ls = lines(r.out);
  REQUIRE(!ls.empty());
  CHECK(contains(ls[0], "schedule"));
  CHECK(contains(ls[0], "collective"));
  for (const auto& info : dsl::registered_schedules()) {
    CAPTURE(info.name);
    bool found = false;
    for (const auto& l : ls)
      found = found || (l.rfind(info.name + " ", 0) == 0 && contains(l, " " + std::string(name(info.coll)) + " ") &&
                        contains(l, info.doc));
    CHECK(found);
  }
  // then the composites, under a header of their own
  const auto composites = dsl::registered_composites();
  REQUIRE(!composites.empty());
  for (const auto& c : composites) {
    CAPTURE(c.name);
    bool found = false;
    for (const auto& l : ls) found = found || (l.rfind(c.name + " ", 0) == 0 && contains(l, c.doc));
    CHECK(found);
  }
  // then the built-in fusions with what they run (mkc registers no test fusions)
  const std::pair<const char*, const char*> fusions[] = {
      {"allreduce.rmsnorm", "epilogue"}, {"allreduce.fp8_rows", "epilogue"}, {"allreduce.premulsum", "prologue"}};
  for (const auto& [fname, runs] : fusions) {
    CAPTURE(fname);
    bool found = false;
    for (const auto& l : ls)
      found = found || (l.rfind(std::string(fname) + " ", 0) == 0 && contains(l, std::string(" ") + runs + " "));
    CHECK(found);
  }
  // a blank line and a header before the composites and before the fusions
  CHECK(ls.size() == dsl::registered_schedules().size() + 1 + 2 + composites.size() + 2 + 3);
}

TEST_CASE("mkc info and --version") {
  mkt::TempDir d;
  auto r = mkc({"info"}, {{"MK_CACHE_DIR", d.str()}});
  CHECK_OK(r);
  CHECK(contains(r.out, "mkernel 0.1.0"));
  CHECK(contains(r.out, "NVRTC: "));
  CHECK(contains(r.out, "architectures:"));
  CHECK(contains(r.out, "cache: " + d.str() + "\n"));
  CHECK(contains(r.out, "DSL headers: "));
  if (mkt::have_nvrtc()) CHECK(contains(r.out, " sm_90"));
  auto v = mkc({"--version"});
  CHECK_OK(v);
  CHECK(contains(v.out, "mkc 0.1.0"));
}

TEST_CASE("mkc verify: every built-in at 2 and 5 ranks") {
  for (const auto& info : dsl::registered_schedules())
    for (int n : {2, 5}) {
      CAPTURE(info.name);
      CAPTURE(n);
      auto r = mkc({"verify", "--schedule", info.name, "--ranks", std::to_string(n)});
      CHECK_OK(r);
      CHECK(contains(r.out, "proved: " + info.name + " (" + std::string(name(info.coll)) + ") for " +
                                std::to_string(n) + " ranks"));
      CHECK(contains(r.out, "no race, no deadlock"));
      CHECK(r.err.empty());
    }
}

TEST_CASE("mkc show: estimate_us for a few sizes, and with --pick the lowest estimate per size") {
  auto r = mkc({"show", "-s", "allgather.direct", "--topology", "pcie:2", "--pick"});
  CHECK_OK(r);
  CHECK(contains(r.out, "estimate_us on pcie:2"));
  for (const char* size : {"1024 B/rank", "1048576 B/rank", "268435456 B/rank"}) CHECK(contains(r.out, size));
  CHECK(contains(r.out, "lowest estimate: allgather."));
  r = mkc({"show", "-s", "allgather.direct", "-n", "2"});
  CHECK_OK(r);
  CHECK(contains(r.out, "estimate_us on nvlink:2"));
  CHECK_FALSE(contains(r.out, "lowest estimate"));
}

TEST_CASE("mkc --topology NxG: the rank count from the shape, across nodes with puts, :direct proved") {
  auto r = mkc({"verify", "-s", "allreduce.hier", "--topology", "2x2:direct"});
  CHECK_OK(r);
  CHECK(contains(r.out, "for 4 ranks"));
  // across the network: proved with network operations, run on the CPU, and
  // compiled: puts become the kernel's staged puts for the proxy (templates/net.cuh)
  r = mkc({"verify", "-s", "allreduce.hier", "--topology", "2x4"});
  CHECK_OK(r);
  CHECK(contains(r.out, "proved: allreduce.hier (allreduce) for 8 ranks"));
  r = mkc({"simulate", "-s", "reducescatter.hier", "--topology", "2x2", "--dtype", "bf16", "--count", "1001"});
  CHECK_OK(r);
  r = mkc({"lower", "-s", "allgather.hier", "--topology", "2x2", "--dump-after", "sync"});
  CHECK_OK(r);
  CHECK(contains(r.out, " put r"));
  CHECK(contains(r.out, " flush"));
  mkt::TempDir out;
  r = mkc({"compile", "-s", "allreduce.hier", "--topology", "2x2", "-o", (out / "plan").string()});
  CHECK_OK(r);
  {
    std::ifstream pj(out / "plan" / "plan.json");
    const std::string plan((std::istreambuf_iterator<char>(pj)), std::istreambuf_iterator<char>());
    CHECK(contains(plan, "\"net\""));  // its connections: [rank, tb, peer, puts]
    CHECK(contains(plan, "\"topology\""));
  }
  r = mkc({"compile", "-s", "allreduce.hier", "--topology", "2x2", "--proto", "ll", "-o", (out / "ll").string()});
  MKT_CHECK_USER_ERROR(r, "mk.cli.E013");  // puts travel the simple protocol only
  // zero-copy plans reach peers' user buffers: not across nodes
  r = mkc({"verify", "-s", "allreduce.direct", "--topology", "2x1", "--zero-copy"});
  MKT_CHECK_USER_ERROR(r, "mk.verify.E017");
  CHECK(contains(r.err, "which have no direct link"));
  r = mkc({"lower", "-s", "allgather.hier", "--topology", "2x2:direct", "--dump-after", "build"});
  CHECK_OK(r);
  CHECK(contains(r.out, "topology=2x2:direct"));
}

TEST_CASE("mkc show: text timeline, --ir, and an SVG picture") {
  mkt::TempDir d;
  const std::string svg = (d / "ring.svg").string();
  auto r = mkc({"show", "-s", "allreduce.ring", "-n", "3", "--svg", svg, "--ir"});
  CHECK_OK(r);
  CHECK(contains(r.out, "schedule allreduce.ring collective=allreduce ranks=3"));  // --ir
  CHECK(contains(r.out, "allreduce.ring: one step of one instance"));
  for (int rank = 0; rank < 3; ++rank) CHECK(contains(r.out, "rank " + std::to_string(rank) + " tb 0:"));
  CHECK(contains(r.out, "wrote " + svg));
  const std::string text = mkt::read_text(svg);
  REQUIRE(!text.empty());
  CHECK(text.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) == 0);
  CHECK(contains(text, "</svg>"));
  CHECK(text.find("</svg>") > text.size() - 10);
  CHECK(contains(text, "<rect"));
  CHECK(contains(text, "rank 2 tb 0"));
  CHECK(contains(text, "estimated</text>"));
  CHECK(contains(text, ">0 us</text>"));                          // the time axis
  CHECK(contains(text, "critical path: "));
  CHECK(contains(text, "stroke=\"#000\" stroke-width=\"2\""));  // ... outlined
  CHECK(contains(text, "<title>data: %"));                        // arrows between ranks
  CHECK(contains(text, "<title>flag: %"));
  CHECK(contains(text, "allreduce_ring.cpp:"));                   // hover: the DSL line
  CHECK(contains(text, "-&gt; r"));                               // op text escaped for XML
  // every element that is opened is closed
  size_t open = 0, close = 0;
  for (size_t at = 0; (at = text.find("<text", at)) != std::string::npos; ++at) ++open;
  for (size_t at = 0; (at = text.find("</text>", at)) != std::string::npos; ++at) ++close;
  CHECK(open == close);
  // without --svg: text only
  auto t = mkc({"show", "-s", "broadcast.direct", "-n", "2"});
  CHECK_OK(t);
  CHECK(contains(t.out, "broadcast.direct: one step"));
  CHECK_FALSE(contains(t.out, "wrote "));
}

TEST_CASE("mkc lower: --dump-after prints the IR after exactly that pass") {
  for (std::string pass : {"build", "verify", "stage", "fuse", "analyze", "parallelize", "assign", "protocol", "sync"}) {
    CAPTURE(pass);
    auto r = mkc({"lower", "-s", "allreduce.two_shot", "-n", "3", std::string("--dump-after=") + pass});
    CHECK_OK(r);
    CHECK(r.out.rfind(std::string("=== after ") + pass, 0) == 0);
    size_t headers = 0;
    for (const auto& l : lines(r.out)) headers += l.rfind("=== after ", 0) == 0;
    const bool per_bucket = std::string(pass) == "protocol" || std::string(pass) == "sync";
    CHECK(headers == (per_bucket ? 2u : 1u));
    if (per_bucket) CHECK(contains(r.out, std::string("=== after ") + pass + " (bucket 0) ==="));
    if (pass == "sync") CHECK(contains(r.out, "=== after sync (bucket 1) ==="));
    CHECK(contains(r.out, "schedule allreduce.two_shot collective=allreduce ranks=3"));
  }
  auto all = mkc({"lower", "-s", "allgather.ring", "-n", "2", "--dump-after=all"});
  CHECK_OK(all);
  for (const auto& pass : compiler::pass_names())
    CHECK(contains(all.out, "=== after " + pass));
}

// Regression: buckets used to be counted only when a "sync" dump was printed.
TEST_CASE("mkc lower: --dump-after=protocol numbers the buckets") {
  auto r = mkc({"lower", "-s", "allreduce.two_shot", "-n", "3", "--dump-after=protocol"});
  CHECK_OK(r);
  CHECK(contains(r.out, "=== after protocol (bucket 0) ==="));
  CHECK(contains(r.out, "=== after protocol (bucket 1) ==="));
}

TEST_CASE("mkc lower --emit=json writes IR that reads back and verifies") {
  auto r = mkc({"lower", "-s", "reducescatter.ring", "-n", "4", "--dump-after=sync", "--emit=json", "--max-bytes=4096"});
  CHECK_OK(r);
  ir::Schedule s;
  auto c = catch_error([&] { s = ir::from_json(r.out); });
  REQUIRE_MESSAGE(!c, c.what);
  CHECK(s.name == "reducescatter.ring");
  CHECK(s.nranks == 4);
  CHECK(s.synced);
  CHECK(s.proto == ir::Proto::ll);
  CHECK_FALSE(catch_error([&] { verify::verify_all(s); }));
}

TEST_CASE("mkc compile: writes a plan that plan::read_dir loads" * doctest::skip(!mkt::have_nvrtc())) {
  mkt::TempDir d;
  const std::string out = (d / "plan").string();
  auto r = mkc({"compile", "-s", "allreduce.ring", "-n", "4", "--dtype", "bf16", "--op", "max", "-o", out});
  CHECK_OK(r);
  CHECK(contains(r.out, "plan allreduce.ring (allreduce) for 4 ranks, bf16 max, sm_90; 2 kernel(s)"));
  CHECK(contains(r.out, "wrote " + out + "/plan.json and 2 cubin(s)"));
  plan::Plan p;
  auto c = catch_error([&] { p = plan::read_dir(out); });
  REQUIRE_MESSAGE(!c, c.what);
  CHECK(p.schedule == "allreduce.ring");
  CHECK(p.coll == Collective::allreduce);
  CHECK(p.nranks == 4);
  CHECK(p.dtype == DType::bf16);
  CHECK(p.op == RedOp::max);
  CHECK(p.arch == 90);
  CHECK(p.nvrtc_version == jit::nvrtc_version());
  REQUIRE(p.kernels.size() == 2);
  for (const auto& k : p.kernels) {
    CHECK(k.cubin.size() > 64);
    CHECK(std::string(k.cubin.data(), 4) == "\x7f" "ELF");
    CHECK(fs::exists(fs::path(out) / k.source_file));
    CHECK(contains(k.source, k.name));
  }
  // the same plan through the cache, and the summary says so
  auto again = mkc({"compile", "-s", "allreduce.ring", "-n", "4", "--dtype", "bf16", "--op", "max", "-o", out});
  CHECK_OK(again);
  CHECK(contains(again.out, ", from cache)"));
}

TEST_CASE("mkc compile: the plan cache key covers every option (the topology too)" *
          doctest::skip(!mkt::have_nvrtc())) {
  mkt::TempDir d;
  mkt::ScopedEnv cache("MK_CACHE_DIR", (d / "cache").string());
  const std::string a = (d / "a").string(), b = (d / "b").string();
  auto r = mkc({"compile", "-s", "allgather.direct", "-n", "2", "--topology", "nvlink:2", "-o", a});
  CHECK_OK(r);
  CHECK_FALSE(contains(r.out, "from cache"));
  r = mkc({"compile", "-s", "allgather.direct", "-n", "2", "--topology", "pcie:2", "-o", b});
  CHECK_OK(r);
  CHECK_FALSE(contains(r.out, "from cache"));
  CHECK(plan_json(a)["topology"]["intra"] == "nvlink");
  CHECK(plan_json(b)["topology"]["intra"] == "pcie");
  // the same command again is served by the cache
  r = mkc({"compile", "-s", "allgather.direct", "-n", "2", "--topology", "pcie:2", "-o", b});
  CHECK_OK(r);
  CHECK(contains(r.out, "from cache"));
  CHECK(plan_json(b)["topology"]["intra"] == "pcie");
  // the node structure is part of the key: 2x1:direct is not nvlink:2
  r = mkc({"compile", "-s", "allgather.direct", "--topology", "2x1:direct", "-o", b});
  CHECK_OK(r);
  CHECK_FALSE(contains(r.out, "from cache"));
  CHECK(plan_json(b)["topology"]["nodes"] == 2);
  CHECK(plan_json(b)["topology"]["direct"] == true);
}

TEST_CASE("compile: options_json serialises every option that shapes a plan") {
  const compiler::CompileOptions base;
  const std::string j0 = compiler::options_json(base);
  // each field changed alone changes the serialisation (and so the key)
  const std::vector<std::function<void(compiler::CompileOptions&)>> edits = {
      [](auto& o) { o.arch = 80; },
      [](auto& o) { o.dtype = DType::bf16; },
      [](auto& o) { o.op = RedOp::max; },
      [](auto& o) { o.lower.instances = 3; },
      [](auto& o) { o.lower.max_tbs = 7; },
      [](auto& o) { o.lower.min_bytes = 5; },
      [](auto& o) { o.lower.max_bytes = 9; },
      [](auto& o) { o.lower.topology = topology::parse("pcie:2", 2); },
      [](auto& o) { o.lower.topology = topology::parse("2x2", 4); },
      [](auto& o) { o.lower.topology = topology::parse("2x2:direct", 4); },
      [](auto& o) {
        o.lower.topology = topology::parse("2x2", 4);
        o.lower.topology->rails = {1, 0};
      },
      [](auto& o) { o.lower.zero_copy = true; },
      [](auto& o) { o.lower.proto.scratch_budget = 1; },
      [](auto& o) { o.lower.proto.ll_max_bytes = 1; },
      [](auto& o) { o.lower.proto.max_tile_bytes = 16; },
      [](auto& o) { o.lower.proto.forced_proto = 1; },
      [](auto& o) { o.lower.proto.forced_tile = 32; },
      [](auto& o) { o.lower.proto.forced_instances = 2; },
      [](auto& o) { o.lower.proto.simple_instances = 1; },
      [](auto& o) { o.lower.proto.ll_instances = 1; },
  };
  std::set<std::string> seen{j0};
  for (size_t i = 0; i < edits.size(); ++i) {
    CAPTURE(i);
    compiler::CompileOptions o;
    edits[i](o);
    CHECK(seen.insert(compiler::options_json(o)).second);
  }
  // what does not shape a plan does not change it
  compiler::CompileOptions o;
  o.use_cache = false;
  o.lower.on_pass = [](std::string_view, const ir::Schedule&, const compiler::PassInfo&) {};
  CHECK(compiler::options_json(o) == j0);
}

TEST_CASE("mkc simulate: prints the result and ok") {
  auto r = mkc({"simulate", "-s", "allreduce.ring", "-n", "3", "--dtype", "bf16", "--op", "avg", "--count", "1001",
                "--inplace", "--launches", "3", "--seed", "7"});
  CHECK_OK(r);
  CHECK(contains(r.out, "allreduce.ring (3 ranks, bf16 avg, count 1001, in-place"));
  CHECK(contains(r.out, "3 launch(es)"));
  CHECK(contains(r.out, "0 mismatch(es)"));
  CHECK(lines(r.out).back() == "ok");
  auto rooted = mkc({"simulate", "-s", "reduce.direct", "-n", "4", "--root", "3", "--dtype", "int8", "--op", "prod",
                     "--count", "33"});
  CHECK_OK(rooted);
  CHECK(contains(rooted.out, ", root 3"));
  CHECK(lines(rooted.out).back() == "ok");
  auto forced = mkc({"simulate", "-s", "allgather.ring", "-n", "3", "--count", "5000", "--tile", "64", "--proto",
                     "simple", "--dtype", "fp8e4m3"});
  CHECK_OK(forced);
  CHECK(contains(forced.out, "proto simple, tile 64 B"));
  CHECK(lines(forced.out).back() == "ok");
}

TEST_CASE("mkc: copy-engine schedules verify and simulate, and compile refuses them with the reason") {
  for (const char* sched : {"allgather.ce", "alltoall.ce", "broadcast.ce"}) {
    INFO(sched);
    CHECK_OK(mkc({"verify", "-s", sched, "-n", "3"}));
    auto sim = mkc({"simulate", "-s", sched, "-n", "3", "--dtype", "bf16", "--count", "777"});
    CHECK_OK(sim);
    CHECK(lines(sim.out).back() == "ok");
    auto c = mkc({"compile", "-s", sched, "-n", "2", "-o", "/tmp/mkt-ce-plan-should-not-exist"});
    MKT_CHECK_USER_ERROR(c, "mk.cli.E011");
    CHECK(contains(c.err, "runs on copy engines: there is no kernel to compile"));
  }
  auto l = mkc({"list"});
  CHECK(contains(l.out, "allgather.ce"));
}

// ---- user-authored schedules ----------------------------------------------------

TEST_CASE("user DSL file: verify, simulate and compile a hand-written all-reduce") {
  const std::string f = fixture("hand_allreduce.cpp");
  auto v = mkc({"verify", f, "--ranks", "4"});
  CHECK_OK(v);
  CHECK(contains(v.out, "proved: test.hand_allreduce (allreduce) for 4 ranks"));
  auto s = mkc({"simulate", f, "--ranks", "4", "--dtype", "fp16", "--op", "sum", "--count", "999"});
  CHECK_OK(s);
  CHECK(lines(s.out).back() == "ok");
  auto s2 = mkc({"simulate", f, "--ranks", "3", "--dtype", "int64", "--op", "avg", "--inplace"});
  CHECK_OK(s2);
  CHECK(lines(s2.out).back() == "ok");
  if (mkt::have_nvrtc()) {
    mkt::TempDir d;
    const std::string out = (d / "plan").string();
    auto c = mkc({"compile", f, "--ranks", "4", "-o", out});
    CHECK_OK(c);
    plan::Plan p;
    auto e = catch_error([&] { p = plan::read_dir(out); });
    REQUIRE_MESSAGE(!e, e.what);
    CHECK(p.schedule == "test.hand_allreduce");
    CHECK(p.nranks == 4);
    CHECK(!p.kernels.empty());
  } else {
    MESSAGE("NVRTC unavailable: `mkc compile FILE.cpp` not tested");
  }
}

TEST_CASE("user DSL file: a wrong schedule is rejected with the verifier's id and the file's line") {
  auto r = mkc({"verify", fixture("broken_allreduce.cpp"), "--ranks", "4"});
  MKT_CHECK_USER_ERROR(r, "mk.verify.E001");
  CHECK(contains(r.err, "test.broken_allreduce (4 ranks"));
  CHECK(contains(r.err, "misses the contribution of rank 3 input chunk 0"));
  CHECK(contains(r.err, "broken_allreduce.cpp:" + std::to_string(marked_line("broken_allreduce.cpp"))));
  // simulate and compile refuse it the same way (the proof comes first)
  MKT_CHECK_USER_ERROR(mkc({"simulate", fixture("broken_allreduce.cpp"), "--ranks", "4"}), "mk.verify.E001");
}

TEST_CASE("user DSL file: a DSL error names the file's line") {
  auto r = mkc({"verify", fixture("dsl_error.cpp"), "--ranks", "3"});
  MKT_CHECK_USER_ERROR(r, "mk.dsl.E001");
  CHECK(contains(r.err, "chunk refers to rank 3 but the program has 3 ranks"));
  CHECK(contains(r.err, "dsl_error.cpp:" + std::to_string(marked_line("dsl_error.cpp"))));
}

TEST_CASE("mk.cli.E006: a user .cpp that does not compile, with the compiler's file:line") {
  auto r = mkc({"verify", fixture("does_not_compile.cpp"), "--ranks", "2"});
  MKT_CHECK_USER_ERROR(r, "mk.cli.E006");
  CHECK(contains(r.err, "does_not_compile.cpp does not compile"));
  CHECK(contains(r.err, "does_not_compile.cpp:" + std::to_string(marked_line("does_not_compile.cpp")) + ":"));
  CHECK(contains(r.err, "not_a_declared_name"));
  // the same through the library
  mkt::ScopedEnv env("MK_CACHE_DIR", mkt::process_cache_dir());
  auto c = catch_error([&] { plugin::load_source(fixture("does_not_compile.cpp")); });
  CHECK(c.id == "mk.cli.E006");
  CHECK(contains(c.message, "does_not_compile.cpp:" + std::to_string(marked_line("does_not_compile.cpp")) + ":"));
}

TEST_CASE("mk.cli.E006: a schedule file whose compile runs past MK_PLUGIN_TIMEOUT_S is stopped with a clear error") {
  mkt::TempDir d;
  mkt::ScopedEnv cache("MK_CACHE_DIR", (d / "cache").string());
  // A "compiler" that hangs (and starts a child that would hang too): the
  // whole process group is killed at the limit.
  mkt::ScopedEnv cxx("MK_CXX", "sleep 60 & sleep 60 #");
  mkt::ScopedEnv limit("MK_PLUGIN_TIMEOUT_S", "1");
  const auto t0 = std::chrono::steady_clock::now();
  auto c = catch_error([&] { plugin::load_source(fixture("hand_allreduce.cpp")); });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(c.id == "mk.cli.E006");
  CHECK(contains(c.message, "took longer than 1 s"));
  CHECK(contains(c.what, "MK_PLUGIN_TIMEOUT_S"));
  CHECK(s < 30);  // not the sleeps' 60 s
  // a malformed limit is an error, not a hang or a default
  mkt::ScopedEnv bad("MK_PLUGIN_TIMEOUT_S", "soon");
  CHECK(contains(catch_error([&] { plugin::load_source(fixture("hand_allreduce.cpp")); }).message,
                 "MK_PLUGIN_TIMEOUT_S='soon'"));
}

TEST_CASE("mk.cli.E006: MK_PLUGIN_TIMEOUT_S is whole seconds in 1..86400, parsed strictly") {
  mkt::TempDir d;
  mkt::ScopedEnv cache("MK_CACHE_DIR", (d / "cache").string());
  mkt::ScopedEnv cxx("MK_CXX", "false #");  // a "compiler" that fails at once: nothing is cached
  auto load = [&] { return catch_error([&] { plugin::load_source(fixture("hand_allreduce.cpp")); }); };
  for (const char* good : {"8", "1", "86400", ""}) {
    CAPTURE(good);
    mkt::ScopedEnv limit("MK_PLUGIN_TIMEOUT_S", good);
    const auto c = load();
    CHECK(c.id == "mk.cli.E006");
    CHECK(contains(c.message, "does not compile"));  // the limit was taken; the compile ran
  }
  // strtod read " 0x8" and "0x1p3" as 8 s and 0.0001 as 0 ms ("0 s")
  for (const char* bad : {" 0x8", "0x8", "0x1p3", "0.0001", "0.5", "1.5", "8 ", "+8", "1e3", "inf", "nan", "0", "-1",
                          "86401", "99999999999999999999"}) {
    CAPTURE(bad);
    mkt::ScopedEnv limit("MK_PLUGIN_TIMEOUT_S", bad);
    const auto c = load();
    CHECK(c.id == "mk.cli.E006");
    CHECK(contains(c.message, std::string("MK_PLUGIN_TIMEOUT_S='") + bad +
                                  "': expected whole seconds, an integer in 1..86400 (unset: 300)"));
  }
}

TEST_CASE("mk.jit.E001: MK_NVRTC_PATH is used exactly, or the error says why it did not load") {
  mkt::TempDir d;
  // a fresh cache: nothing compiled before can stand in for NVRTC
  const std::vector<std::string> compile = {"compile", "-s", "allreduce.ring", "-n", "2", "--dtype", "fp32",
                                            "--op",    "sum", "-o", (d / "plan").string()};
  auto r = mkc(compile, {{"MK_CACHE_DIR", (d / "cache").string()}, {"MK_NVRTC_PATH", "/nonexistent/libnvrtc.so"}});
  MKT_CHECK_USER_ERROR(r, "mk.jit.E001");
  CHECK(contains(r.err, "MK_NVRTC_PATH='/nonexistent/libnvrtc.so' could not be loaded: "));
  CHECK(contains(r.err, "No such file or directory"));  // dlopen's reason
  CHECK(contains(r.err, "unset it"));
  auto info = mkc({"info"}, {{"MK_CACHE_DIR", (d / "cache").string()}, {"MK_NVRTC_PATH", "/nonexistent/libnvrtc.so"}});
  CHECK_OK(info);
  CHECK(contains(info.out, "NVRTC: MK_NVRTC_PATH='/nonexistent/libnvrtc.so' could not be loaded"));
  // a library that loads but is no NVRTC
  const std::string libc = "libc.so.6";
  auto other = mkc(compile, {{"MK_CACHE_DIR", (d / "cache").string()}, {"MK_NVRTC_PATH", libc}});
  MKT_CHECK_USER_ERROR(other, "mk.jit.E001");
  CHECK(contains(other.err, "MK_NVRTC_PATH='libc.so.6' is not a usable NVRTC"));
  if (mkt::have_nvrtc()) {  // the library found without it, named: used
    const std::string status = jit::nvrtc_status();
    const std::string path = status.substr(0, status.find(' '));
    if (!path.empty() && path[0] == '/') {
      auto ok = mkc({"info"}, {{"MK_NVRTC_PATH", path}});
      CHECK_OK(ok);
      CHECK(contains(ok.out, "NVRTC: " + path + " (NVRTC "));
    }
  }
}

TEST_CASE("mk.jit.E004: a user schedule needs a writable cache for its plugin") {
  mkt::TempDir d;
  mkt::write_text(d / "file", "not a directory");
  mkt::ScopedEnv env("MK_CACHE_DIR", (d / "file" / "cache").string());
  auto c = catch_error([&] { plugin::load_source(fixture("hand_allreduce.cpp")); });
  CHECK(c.id == "mk.jit.E004");
  CHECK(contains(c.what, "MK_CACHE_DIR"));
}

TEST_CASE("mk.cli.E007: a user .cpp that defines no schedule") {
  auto r = mkc({"verify", fixture("no_schedule.cpp"), "--ranks", "2"});
  MKT_CHECK_USER_ERROR(r, "mk.cli.E007");
  CHECK(contains(r.err, "no_schedule.cpp defines no schedule"));
  CHECK(contains(r.err, "MK_SCHEDULE"));  // the hint
  mkt::ScopedEnv env("MK_CACHE_DIR", mkt::process_cache_dir());
  auto c = catch_error([&] { plugin::load_source(fixture("no_schedule.cpp")); });
  CHECK(c.id == "mk.cli.E007");
}

TEST_CASE("mk.cli.E009: a file that does not exist") {
  auto r = mkc({"verify", "/nonexistent/dir/sched.cpp", "--ranks", "2"});
  MKT_CHECK_USER_ERROR(r, "mk.cli.E009");
  CHECK(contains(r.err, "/nonexistent/dir/sched.cpp"));
  auto c = catch_error([&] { plugin::load_source("/nonexistent/dir/sched.cpp"); });
  CHECK(c.id == "mk.cli.E009");
  c = catch_error([&] { plugin::load_library("/nonexistent/libsched.so"); });
  CHECK(c.id == "mk.cli.E009");
  auto p = mkc({"verify", "-s", "allreduce.ring", "-n", "2", "--plugin", "/nonexistent/libsched.so"});
  MKT_CHECK_USER_ERROR(p, "mk.cli.E009");
}

// ---- bad input: one test per id ---------------------------------------------------

TEST_CASE("mk.cli.E001: unknown schedule") {
  auto r = mkc({"verify", "-s", "allreduce.nope", "-n", "2"});
  MKT_CHECK_USER_ERROR(r, "mk.cli.E001");
  CHECK(contains(r.err, "unknown schedule 'allreduce.nope'"));
  CHECK(contains(r.err, "allreduce.ring"));  // the hint lists the known ones
  MKT_CHECK_USER_ERROR(mkc({"compile", "-s", "", "-n", "2", "-o", "/tmp/x"}), "mk.cli.E001");
}

TEST_CASE("mk.cli.E002: unknown dtype") {
  auto r = mkc({"simulate", "-s", "allreduce.ring", "-n", "2", "--dtype", "fp7"});
  MKT_CHECK_USER_ERROR(r, "mk.cli.E002");
  CHECK(contains(r.err, "unknown dtype 'fp7'"));
  MKT_CHECK_USER_ERROR(mkc({"compile", "-s", "allreduce.ring", "-n", "2", "--dtype", "float128", "-o", "/tmp/x"}),
                       "mk.cli.E002");
  // NCCL spellings are accepted
  CHECK_OK(mkc({"simulate", "-s", "allreduce.ring", "-n", "2", "--dtype", "bfloat16", "--count", "10"}));
}

TEST_CASE("mk.cli.E003: unknown reduction op") {
  auto r = mkc({"simulate", "-s", "allreduce.ring", "-n", "2", "--op", "median"});
  MKT_CHECK_USER_ERROR(r, "mk.cli.E003");
  CHECK(contains(r.err, "unknown reduction op 'median'"));
  MKT_CHECK_USER_ERROR(mkc({"compile", "-s", "allreduce.ring", "-n", "2", "--op", "xor", "-o", "/tmp/x"}),
                       "mk.cli.E003");
}

TEST_CASE("mk.cli.E004: rank count or root out of range") {
  for (const char* n : {"0", "1025", "-3"}) {
    CAPTURE(n);
    auto r = mkc({"verify", "-s", "allreduce.ring", "-n", n});
    MKT_CHECK_USER_ERROR(r, "mk.cli.E004");
  }
  auto r = mkc({"simulate", "-s", "reduce.direct", "-n", "3", "--root", "3"});
  MKT_CHECK_USER_ERROR(r, "mk.cli.E004");
  CHECK(contains(r.err, "--root 3 is not a rank of 3"));
}

TEST_CASE("mk.cli.E005: min bytes greater than max bytes") {
  auto r = mkc({"lower", "-s", "allreduce.ring", "-n", "2", "--min-bytes", "1000", "--max-bytes", "10"});
  MKT_CHECK_USER_ERROR(r, "mk.cli.E005");
  CHECK(contains(r.err, "--min-bytes 1000 is greater than --max-bytes 10"));
  MKT_CHECK_USER_ERROR(
      mkc({"compile", "-s", "allreduce.ring", "-n", "2", "--min-bytes", "5", "--max-bytes", "4", "-o", "/tmp/x"}),
      "mk.cli.E005");
}

TEST_CASE("mk.cli.E008: unknown pass for --dump-after") {
  auto r = mkc({"lower", "-s", "allreduce.ring", "-n", "2", "--dump-after=optimize"});
  MKT_CHECK_USER_ERROR(r, "mk.cli.E008");
  CHECK(contains(r.err, "unknown pass 'optimize'"));
  for (const auto& p : compiler::pass_names()) CHECK(contains(r.err, " " + p));  // the hint lists them
}

TEST_CASE("mk.cli.E010: bad architecture") {
  for (const char* a : {"sm_x", "hopper", "sm_1000"}) {
    CAPTURE(a);
    auto r = mkc({"compile", "-s", "allreduce.ring", "-n", "2", "--arch", a, "-o", "/tmp/mkt-never-written"});
    MKT_CHECK_USER_ERROR(r, "mk.cli.E010");
    CHECK(contains(r.err, std::string("'") + a + "' is not a GPU architecture"));
  }
}

TEST_CASE("mk.cli.E011: bad argument values") {
  struct Case {
    std::vector<std::string> args;
    const char* says;
  };
  const std::vector<Case> cases = {
      {{"simulate", "-s", "allreduce.ring", "-n", "2", "--tile", "17"}, "--tile must be a positive multiple of 16"},
      {{"simulate", "-s", "allreduce.ring", "-n", "2", "--tile", "-16"}, "--tile"},
      {{"verify", "-s", "allreduce.ring", "-n", "2", "--instances", "65"}, "--instances must be in 1..64"},
      {{"verify", "-s", "allreduce.ring", "-n", "2", "--max-tbs", "0"}, "--max-tbs must be in 1..1024"},
      {{"verify", "-s", "allreduce.ring", "-n", "2", "--proto", "fast"}, "--proto must be simple or ll"},
      {{"verify", "-s", "allreduce.ring", "-n", "2", "--topology", "ring:2"}, "unknown topology 'ring:2'"},
      {{"verify", "-s", "allreduce.ring", "-n", "2", "--topology", "nvlink:4"}, "has 4 ranks but the schedule has 2"},
      {{"verify", "-s", "allreduce.ring", "-n", "4", "--topology", "2x4"}, "'2x4' has 8 ranks but the schedule has 4"},
      {{"verify", "-s", "allreduce.ring", "--topology", "2x"}, "NxG needs two positive numbers"},
      {{"verify", "-s", "allreduce.ring", "--topology", "0x4"}, "NxG needs two positive numbers"},
      {{"verify", "-s", "allreduce.ring", "--topology", "2x2:fast"}, "'fast' is not a known suffix"},
      {{"verify", "-s", "allreduce.ring", "-n", "2", "--topology", "nvlink:two"}, "'two' is not a positive rank count"},
      {{"lower", "-s", "allreduce.ring", "-n", "2", "--min-bytes", "-1"}, "--min-bytes must be >= 0"},
      {{"lower", "-s", "allreduce.ring", "-n", "2", "--emit", "yaml"}, "--emit must be text or json"},
      {{"simulate", "-s", "allreduce.ring", "-n", "2", "--count", "-1"}, "--count must be >= 0"},
      {{"simulate", "-s", "allreduce.ring", "-n", "2", "--launches", "0"}, "--launches must be in 1..1000"},
      {{"simulate", "-s", "allreduce.ring", "-n", "2", "--bucket", "7"}, "--bucket 7"},
      {{"simulate", "-s", "allreduce.ring", "-n", "3", "--root", "1"}, "--root applies to broadcast and reduce only"},
      {{"verify", mkt::test_dir() + "/fixtures/msccl/allreduce_ring_8.xml", "-s", "allreduce.ring"}, "not both"},
  };
  for (const auto& k : cases) {
    std::string cmd;
    for (const auto& a : k.args) cmd += a + " ";
    CAPTURE(cmd);
    auto r = mkc(k.args);
    MKT_CHECK_USER_ERROR(r, "mk.cli.E011");
    CHECK(contains(r.err, k.says));
  }
}

// Regression: a huge count used to overflow the byte size (internal error).
TEST_CASE("mk.cli.E011: a --count too large to simulate is a user error") {
  auto r = mkc({"simulate", "-s", "allreduce.ring", "-n", "2", "--count", "4611686018427387904"});
  MKT_CHECK_USER_ERROR(r, "mk.cli.E011");
}

TEST_CASE("mk.cli.E012: output that cannot be written") {
  mkt::TempDir d;
  mkt::write_text(d / "file", "a regular file, not a directory");
  const std::string bad = (d / "file" / "plan").string();
  if (mkt::have_nvrtc()) {
    auto r = mkc({"compile", "-s", "allgather.direct", "-n", "2", "--max-bytes", "4096", "-o", bad});
    MKT_CHECK_USER_ERROR(r, "mk.cli.E012");
    CHECK(contains(r.err, bad));
  }
  auto s = mkc({"show", "-s", "allgather.direct", "-n", "2", "--svg", (d / "file" / "x.svg").string()});
  MKT_CHECK_USER_ERROR(s, "mk.cli.E012");
  // the library call behind `mkc compile -o`
  plan::Plan p;
  p.kernels.push_back({});
  p.kernels[0].cubin_file = "k.cubin";
  auto c = catch_error([&] { plan::write_dir(p, bad); });
  CHECK(c.id == "mk.cli.E012");
}

TEST_CASE("mk.cli.E013: an operation the collective or protocol does not support") {
  auto r = mkc({"compile", "-s", "allgather.ring", "-n", "2", "--op", "prod", "-o", "/tmp/mkt-never-written"});
  MKT_CHECK_USER_ERROR(r, "mk.cli.E013");
  CHECK(contains(r.err, "allgather does not reduce"));
  CHECK_FALSE(fs::exists("/tmp/mkt-never-written"));
  MKT_CHECK_USER_ERROR(mkc({"simulate", "-s", "broadcast.direct", "-n", "2", "--op", "max"}), "mk.cli.E013");
  MKT_CHECK_USER_ERROR(mkc({"simulate", "-s", "alltoall.direct", "-n", "2", "--inplace"}), "mk.cli.E013");
  // LL needs every scratch slot written once per step
  auto ll = mkc({"verify", fixture("ll_unsafe.cpp"), "-n", "3", "--proto", "ll"});
  MKT_CHECK_USER_ERROR(ll, "mk.cli.E013");
  CHECK(contains(ll.err, "test.ll_unsafe"));
  CHECK(contains(ll.err, "--proto simple"));
  CHECK_OK(mkc({"verify", fixture("ll_unsafe.cpp"), "-n", "3", "--proto", "simple"}));
  CHECK_OK(mkc({"simulate", fixture("ll_unsafe.cpp"), "-n", "3", "--op", "avg", "--dtype", "fp64"}));
}

TEST_CASE("mk.jit.E003: an architecture this NVRTC cannot target" * doctest::skip(!mkt::have_nvrtc())) {
  for (const char* a : {"sm_20", "sm_999"}) {
    CAPTURE(a);
    auto r = mkc({"compile", "-s", "allreduce.ring", "-n", "2", "--arch", a, "--no-cache", "-o",
                  "/tmp/mkt-never-written"});
    MKT_CHECK_USER_ERROR(r, "mk.jit.E003");
    CHECK(contains(r.err, std::string(a) + " is not supported by this NVRTC"));
  }
}

TEST_CASE("mkc: a bad command line exits with 2") {
  for (std::vector<std::string> args : {std::vector<std::string>{}, {"frobnicate"}, {"verify", "--bogus-flag"},
                                        {"verify", "-s", "allreduce.ring", "-n", "two"}}) {
    auto r = mkc(args);
    INFO(r);
    CHECK(r.exit_code == 2);
    CHECK(r.signal == 0);
  }
}

// ---- plans on disk (read by the runtime; no mkc command reads them) --------------

namespace {

using mkt::fake_plan;



}  // namespace

TEST_CASE("plan: write_dir / read_dir round trip and select") {
  mkt::TempDir d;
  auto p = fake_plan();
  plan::write_dir(p, d.str());
  auto q = plan::read_dir(d.str());
  CHECK(plan::to_json(q) == plan::to_json(p));
  REQUIRE(q.kernels.size() == 2);
  CHECK(q.kernels[1].cubin == p.kernels[1].cubin);
  CHECK(q.kernels[0].source == p.kernels[0].source);
  CHECK(plan::read_dir((d / "plan.json").string()).kernels.size() == 2);  // the file itself works too
  CHECK(plan::select(q, 0) == &q.kernels[0]);
  CHECK(plan::select(q, 65536) == &q.kernels[0]);
  CHECK(plan::select(q, 65537) == &q.kernels[1]);
  CHECK(contains(plan::summary(q), "plan allreduce.ring (allreduce) for 2 ranks, fp16 avg, sm_90; 2 kernel(s)"));
}

TEST_CASE("mk.plan.E001: malformed plan.json, each naming the problem") {
  mkt::TempDir d;
  plan::write_dir(fake_plan(), d.str());
  const auto good = plan_json(d.str());
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> f;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"version a string", [](auto& j) { j["mk_plan_version"] = "1"; }, "$.mk_plan_version: expected an integer"},
      {"ranks a string", [](auto& j) { j["ranks"] = "2"; }, "$.ranks: expected an integer"},
      {"ranks zero", [](auto& j) { j["ranks"] = 0; }, "$.ranks: 0 is outside 1..1024"},
      {"collective unknown", [](auto& j) { j["collective"] = "allsum"; }, "$.collective"},
      {"dtype unknown", [](auto& j) { j["dtype"] = "fp7"; }, "$.dtype"},
      {"op unknown", [](auto& j) { j["op"] = "xor"; }, "$.op"},
      {"arch malformed", [](auto& j) { j["arch"] = "90"; }, "$.arch"},
      {"arch not a number", [](auto& j) { j["arch"] = "sm_xx"; }, "$.arch"},
      {"no kernels", [](auto& j) { j["kernels"] = nlohmann::json::array(); }, "$.kernels"},
      {"kernel not an object", [](auto& j) { j["kernels"][1] = 3; }, "$.kernels[1]"},
      {"kernel name missing", [](auto& j) { j["kernels"][0].erase("name"); }, "$.kernels[0].name: missing"},
      {"kernel grid a string", [](auto& j) { j["kernels"][0]["grid"] = "6"; }, "$.kernels[0].grid"},
      {"proto unknown", [](auto& j) { j["kernels"][1]["proto"] = "ll128"; }, "$.kernels[1].proto"},
      {"cubin outside the directory", [](auto& j) { j["kernels"][0]["cubin"] = "../x.cubin"; }, "plain file name"},
      {"grid != tbs * instances", [](auto& j) { j["kernels"][0]["grid"] = 5; },
       "$.kernels[0].grid: 5 != tbs x instances = 6"},
      {"tile not a multiple of 16", [](auto& j) { j["kernels"][1]["max_tile_bytes"] = 4100; },
       "$.kernels[1].max_tile_bytes: must be a multiple of 16"},
      {"max below min", [](auto& j) { j["kernels"][1]["max_bytes"] = 3; },
       "$.kernels[1].max_bytes: 3 is below min_bytes 65537"},
      {"too many threads", [](auto& j) { j["kernels"][1]["threads"] = 2048; },
       "$.kernels[1].threads: 2048 is outside 32..1024"},
  };
  for (const auto& k : cases) {
    CAPTURE(k.what);
    auto j = good;
    k.f(j);
    put_json(d.str(), j);
    auto c = catch_error([&] { plan::read_dir(d.str()); });
    CHECK(c.id == "mk.plan.E001");
    CHECK(contains(c.message, k.says));
    CHECK(contains(c.message, "plan.json"));  // names the file
  }
  // truncated text
  put_json(d.str(), good);
  std::string text = mkt::read_text(d / "plan.json");
  mkt::write_text(d / "plan.json", text.substr(0, text.size() / 2));
  auto c = catch_error([&] { plan::read_dir(d.str()); });
  CHECK(c.id == "mk.plan.E001");
  CHECK(contains(c.message, "not JSON"));
  // a cubin that is not ELF
  put_json(d.str(), good);
  mkt::write_text(d / "mk_test_b1.sm_90.cubin", std::string(100, 'x'));
  c = catch_error([&] { plan::read_dir(d.str()); });
  CHECK(c.id == "mk.plan.E005");
  CHECK(contains(c.message, "mk_test_b1.sm_90.cubin is not a complete cubin for sm_90: not an ELF file"));
}

TEST_CASE("mk.plan.E002: a plan version this mKernel does not read") {
  mkt::TempDir d;
  plan::write_dir(fake_plan(), d.str());
  auto j = plan_json(d.str());
  for (int v : {0, 2}) {
    j["mk_plan_version"] = v;
    put_json(d.str(), j);
    auto c = catch_error([&] { plan::read_dir(d.str()); });
    CHECK(c.id == "mk.plan.E002");
    CHECK(contains(c.message, "plan version " + std::to_string(v) + " is not supported"));
  }
}

TEST_CASE("mk.plan.E003: a plan or cubin file that is missing") {
  mkt::TempDir d;
  auto c = catch_error([&] { plan::read_dir(d.str()); });
  CHECK(c.id == "mk.plan.E003");
  CHECK(contains(c.message, "plan.json"));
  CHECK(contains(c.what, "mkc compile"));
  plan::write_dir(fake_plan(), d.str());
  fs::remove(d / "mk_test_b0.sm_90.cubin");
  c = catch_error([&] { plan::read_dir(d.str()); });
  CHECK(c.id == "mk.plan.E003");
  CHECK(contains(c.message, "names mk_test_b0.sm_90.cubin, which cannot be read"));
  // a missing source file is fine: it is only for reading
  plan::write_dir(fake_plan(), d.str());
  fs::remove(d / "mk_test_b0.cu");
  CHECK_FALSE(catch_error([&] { plan::read_dir(d.str()); }));
}

// ---- issue 9: several schedules in a file, --ranks 0, roots, determinism,
// the plugin cache ------------------------------------------------------------

TEST_CASE("mkc verify/simulate check every schedule of a file, --schedule picks one") {
  auto v = mkc({"verify", fixture("two_schedules.cpp"), "--ranks", "3"});
  MKT_CHECK_USER_ERROR(v, "mk.verify.E001");  // the second one, which only checking the first missed
  CHECK(contains(v.out, "proved: test.two.good (allreduce) for 3 ranks"));
  CHECK(contains(v.err, "test.two.bad (3 ranks"));
  CHECK(contains(v.err, "two_schedules.cpp:" + std::to_string(marked_line("two_schedules.cpp"))));
  MKT_CHECK_USER_ERROR(mkc({"simulate", fixture("two_schedules.cpp"), "--ranks", "3"}), "mk.verify.E001");
  CHECK_OK(mkc({"verify", fixture("two_schedules.cpp"), "--ranks", "3", "-s", "test.two.good"}));
  auto s = mkc({"simulate", fixture("two_schedules.cpp"), "--ranks", "3", "-s", "test.two.good", "--count", "77"});
  CHECK_OK(s);
  CHECK(contains(s.out, "test.two.good (3 ranks"));
  auto none = mkc({"verify", fixture("two_schedules.cpp"), "--ranks", "3", "-s", "test.two.other"});
  MKT_CHECK_USER_ERROR(none, "mk.cli.E001");
  CHECK(contains(none.err, "defines no schedule 'test.two.other'"));
  CHECK(contains(none.err, "it defines: test.two.good, test.two.bad"));
  auto several = mkc({"show", fixture("two_schedules.cpp"), "--ranks", "3"});
  MKT_CHECK_USER_ERROR(several, "mk.cli.E011");
  CHECK(contains(several.err, "defines several schedules (test.two.good, test.two.bad)"));
  CHECK(contains(several.err, "--schedule NAME"));
}

TEST_CASE("mk.cli.E004: --ranks 0 must be >= 1") {
  for (const char* cmd : {"verify", "simulate", "show"}) {
    auto r = mkc({cmd, "-s", "allreduce.ring", "--ranks", "0"});
    MKT_CHECK_USER_ERROR(r, "mk.cli.E004");
    CHECK(contains(r.err, "--ranks 0 is out of range: it must be >= 1"));
    CHECK_FALSE(contains(r.err, "required"));
  }
  auto missing = mkc({"verify", "-s", "allreduce.ring"});
  MKT_CHECK_USER_ERROR(missing, "mk.cli.E004");
  CHECK(contains(missing.err, "--ranks is required"));
}

TEST_CASE("mkc verify says what was proved: roots, both aliasings, every count, determinism") {
  auto a = mkc({"verify", "-s", "allreduce.ring", "-n", "4"});
  CHECK_OK(a);
  CHECK(contains(a.out, "in-place and out-of-place for every count"));
  CHECK(contains(a.out, "every rank combines each reduction in the same order and rounds it at the same points "
                        "(bit-identical results, every dtype and op)"));
  CHECK_FALSE(contains(a.out, "root"));
  auto b = mkc({"verify", "-s", "broadcast.direct", "-n", "4"});
  CHECK_OK(b);
  CHECK(contains(b.out, "for root 0 and, by relabelling (rank r runs as (r - root) mod n), every root"));
  auto c = mkc({"verify", "-s", "reduce.direct", "-n", "4", "--root", "3"});
  CHECK_OK(c);
  CHECK(contains(c.out, "for root 0 and root 3 (relabelled as the kernel does"));
  auto d = mkc({"verify", "-s", "allreduce.ring", "-n", "4", "--root", "1"});
  MKT_CHECK_USER_ERROR(d, "mk.cli.E011");
  CHECK(contains(d.err, "--root applies to broadcast and reduce only"));
}

TEST_CASE("mkc verify warns about ranks that reduce in different orders, --strict refuses (mk.verify.E015)") {
  auto w = mkc({"verify", fixture("unordered_allreduce.cpp"), "--ranks", "3"});
  CHECK_OK(w);
  CHECK(contains(w.err, "mkc: warning: [mk.verify.E015]"));
  CHECK(contains(w.err, "in different orders"));
  CHECK(contains(w.out, "NOT deterministic across ranks"));
  auto s = mkc({"verify", fixture("unordered_allreduce.cpp"), "--ranks", "3", "--strict"});
  MKT_CHECK_USER_ERROR(s, "mk.verify.E015");
  CHECK_FALSE(contains(s.out, "proved"));
  // two ranks add in the same order either way (a + b == b + a)
  CHECK_OK(mkc({"verify", fixture("unordered_allreduce.cpp"), "--ranks", "2", "--strict"}));
}

TEST_CASE("mkc verify and simulate: ranks that round at different points (mk.verify.E015), the same verdict in both") {
  const std::string f = fixture("rounds_apart.cpp");
  auto w = mkc({"verify", f, "--ranks", "3"});
  CHECK_OK(w);
  CHECK(contains(w.err, "mkc: warning: [mk.verify.E015]"));
  CHECK(contains(w.err, "in the same order but round at different points"));
  CHECK(contains(w.err, fmt::format("rounds_apart.cpp:{}", mkt::line_of(f, "MARK:"))));
  CHECK(contains(w.out, "NOT bit-identical across ranks in fp16, bf16 and fp8"));
  MKT_CHECK_USER_ERROR(mkc({"verify", f, "--ranks", "3", "--strict"}), "mk.verify.E015");
  MKT_CHECK_USER_ERROR(mkc({"verify", f, "--ranks", "3", "--strict", "--dtype", "bf16"}), "mk.verify.E015");
  for (const char* t : {"fp32", "fp64", "int32"}) {
    auto ok = mkc({"verify", f, "--ranks", "3", "--strict", "--dtype", t});
    CHECK_OK(ok);
    CHECK(contains(ok.out, "bit-identical results"));
  }
  CHECK_OK(mkc({"verify", f, "--ranks", "3", "--strict", "--dtype", "bf16", "--op", "max"}));
  MKT_CHECK_USER_ERROR(mkc({"verify", f, "--ranks", "3", "--op", "max"}), "mk.cli.E011");  // --op needs --dtype
  // simulate: the same warning, the differing elements shown on data whose partial sums round
  auto s = mkc({"simulate", f, "--ranks", "3", "--dtype", "bf16", "--count", "1000"});
  CHECK_OK(s);
  CHECK(contains(s.err, "mkc: warning: [mk.verify.E015]"));
  CHECK(contains(s.out, "data whose partial sums are exact): max error 0 (tolerance 0), 0 mismatch(es)\n"));
  CHECK(contains(s.out, "element(s) differ bit-wise between ranks"));
  CHECK(contains(s.out, "ranks are NOT bit-identical"));
  MKT_CHECK_USER_ERROR(mkc({"simulate", f, "--ranks", "3", "--dtype", "bf16", "--strict"}), "mk.verify.E015");
  auto only_exact = mkc({"simulate", f, "--ranks", "3", "--dtype", "bf16", "--data", "exact"});
  CHECK_OK(only_exact);
  CHECK(contains(only_exact.out, "the data did not show it here"));
  CHECK_OK(mkc({"simulate", f, "--ranks", "3", "--dtype", "fp32", "--strict"}));  // one order: fp32 agrees
  MKT_CHECK_USER_ERROR(mkc({"simulate", f, "--ranks", "3", "--data", "some"}), "mk.cli.E011");
}

TEST_CASE("mkc simulate refuses what the runtime never runs: PreMulSum on copy engines") {
  auto r = mkc({"simulate", "-s", "allreduce.ce", "-n", "2", "--op", "premulsum"});
  MKT_CHECK_USER_ERROR(r, "mk.cli.E013");
  CHECK(contains(r.err, "copy engines"));
  CHECK_OK(mkc({"simulate", "-s", "allreduce.ring", "-n", "2", "--op", "premulsum", "--count", "300"}));
}

TEST_CASE("mkc verify --fusion and simulate --fusion: the checker, and a fused all-reduce on the CPU") {
  auto v = mkc({"verify", "--fusion", "allreduce.rmsnorm", "--dtype", "bf16"});
  CHECK_OK(v);
  CHECK(contains(v.out, "checked: fusion allreduce.rmsnorm"));
  CHECK(contains(v.out, "within its float64 reference"));
  auto both = mkc({"verify", "-s", "allreduce.ring", "-n", "3", "--fusion", "allreduce.premulsum"});
  CHECK_OK(both);
  CHECK(contains(both.out, "with fusion allreduce.premulsum, every bucket's kernel runs the prologue once"));
  auto zc = mkc({"verify", "-s", "allreduce.direct", "-n", "2", "--zero-copy", "--fusion", "allreduce.rmsnorm"});
  MKT_CHECK_USER_ERROR(zc, "mk.verify.E019");
  // a user's fusion file that races: refused as it loads, naming its line
  const std::string bad = fixture("bad_fusion.cpp");
  auto b = mkc({"verify", bad, "--fusion", "user.smooth"});
  MKT_CHECK_USER_ERROR(b, "mk.verify.E021");
  CHECK(contains(b.err, "fusion user.smooth"));
  CHECK(contains(b.err, fmt::format("bad_fusion.cpp:{}", mkt::line_of(bad, "MK_EPILOGUE("))));
  auto s = mkc({"simulate", "-s", "allreduce.ring", "-n", "3", "--dtype", "bf16", "--count", "512", "--fusion",
                "allreduce.rmsnorm", "--row", "128", "--scalars", "1e-6"});
  CHECK_OK(s);
  CHECK(contains(s.out, "with fusion allreduce.rmsnorm (rows of 128)"));
  CHECK(contains(s.out, "the epilogue against its float64 reference"));
  CHECK(contains(s.out, "ok"));
  MKT_CHECK_USER_ERROR(mkc({"simulate", "-s", "allreduce.ring", "-n", "3", "--fusion", "allreduce.rmsnorm"}),
                       "mk.cli.E011");  // a given-row fusion needs --row
}

TEST_CASE("mkc verify --strict passes every built-in") {
  for (const auto& info : dsl::registered_schedules()) {
    CAPTURE(info.name);
    auto r = mkc({"verify", "-s", info.name, "-n", "5", "--strict"});
    CHECK_OK(r);
    CHECK_FALSE(contains(r.err, "warning"));
  }
}

TEST_CASE("plugins: a changed local header invalidates the cached plugin") {
  mkt::TempDir d, cache;
  const fs::path src = d.path / "with_header.cpp", hdr = d.path / "local_name.hpp";
  mkt::write_text(src, R"(#include <mk/dsl.hpp>
#include "local_name.hpp"
using namespace mk::dsl;
static void build(Program& p) {
  for (int r = 0; r < p.ranks(); ++r) p.copy(p.output(r, 0), p.input(0, 0));
}
MK_SCHEDULE(LOCAL_NAME, broadcast, build, "a broadcast named by a header");
)");
  auto run = [&] { return mkc({"verify", src.string(), "--ranks", "2"}, {{"MK_CACHE_DIR", cache.str()}}); };
  mkt::write_text(hdr, "#define LOCAL_NAME \"test.header_a\"\n");
  auto a = run();
  CHECK_OK(a);
  CHECK(contains(a.out, "proved: test.header_a"));
  CHECK_OK(run());  // from the cache
  mkt::write_text(hdr, "#define LOCAL_NAME \"test.header_b\"\n");  // only the header changes
  auto b = run();
  CHECK_OK(b);
  CHECK(contains(b.out, "proved: test.header_b"));
  mkt::write_text(hdr, "#define LOCAL_NAME \"test.header_a\"\n");  // back: the first plugin again
  auto c = run();
  CHECK(contains(c.out, "proved: test.header_a"));
  size_t sos = 0;
  for (const auto& e : fs::directory_iterator(cache.path / "plugins")) sos += e.path().extension() == ".so";
  CHECK(sos == 2);
}

// mkc tune end to end against the fake driver (tests/fake_cuda): every
// candidate runs in its own process through the real runtime, and the table
// it writes is one the runtime accepts, covering every size of every
// collective asked for. (The fake runs no kernels: the times are the launch
// path's and results cannot be checked here; tests/gpu runs it on a GPU.)
TEST_CASE("mkc tune: runs every candidate and writes a selection table the runtime accepts") {
  mkt::TempDir d;
  const std::string out = (d.path / "select.json").string();
  const auto r = mkc({"tune", "-n", "2", "--share-gpu", "--colls", "allreduce,broadcast,allgather", "--min-bytes", "1024",
                      "--max-bytes", "65536", "--no-check", "--batches", "1", "-o", out},
                     {{"LD_LIBRARY_PATH", MKT_FAKE_CUDA_DIR}, {"MK_SCRATCH_BYTES", "67108864"}});
  INFO(r);
  REQUIRE(r.exit_code == 0);
  CHECK(contains(r.err, "allreduce.one_shot"));
  CHECK(contains(r.err, "broadcast.direct"));
  const auto t = rt::parse_select(mkt::read_text(out), out);
  CHECK(contains(t.note, "sharing GPU 0"));
  CHECK(contains(t.note, "do not ship"));
  for (Collective c : {Collective::allreduce, Collective::broadcast, Collective::allgather}) {
    CAPTURE(name(c));
    int64_t next = 0;  // the entries of a collective cover 0.. without gaps, the last unbounded
    for (const auto& e : t.entries) {
      if (e.coll != c) continue;
      CHECK(e.min_ranks == 2);
      CHECK(e.max_ranks == 2);
      CHECK(e.min_bytes == next);
      // sizes in the runtime's unit (count x element size): all-gather's
      // 64 KiB output is 32 KiB a rank, so a bounded range ends by 16 KiB
      if (c == Collective::allgather && e.max_bytes >= 0) CHECK(e.max_bytes <= 16384);
      next = e.max_bytes < 0 ? -1 : e.max_bytes + 1;
    }
    CHECK(next == -1);
  }
  // without a driver: a clear error, no table
  const auto none = mkc({"tune", "-n", "2", "--colls", "allreduce", "--max-bytes", "4096", "-o", out + ".2"},
                        {{"LD_LIBRARY_PATH", "/nonexistent"}});
  if (!cuda_available_here()) {
    MKT_CHECK_USER_ERROR(none, "mk.cli.E011");
    CHECK(contains(none.err, "no NVIDIA driver"));
    CHECK_FALSE(fs::exists(out + ".2"));
  }
}

// The summary used to give one bucket's NVRTC time as "the" NVRTC time (2 s
// of a 15 s compile whose other bucket took 13 s): every bucket's own times
// now, and the header's split is the bucket that finished last.
// A plan of every rank whose one-pass kernel holds a code path per rank
// says how to compile less (a rank's own plan); a rank's plan does not.
TEST_CASE("mkc compile: a plan of every rank with a code path per rank says --rank compiles a fraction" *
          doctest::skip(!mkt::have_nvrtc())) {
  mkt::TempDir d, cache;
  const auto all = mkc({"compile", "-s", "allreduce.one_shot", "-n", "4", "--max-bytes", "4096", "--dtype", "fp32", "-o",
                        (d / "all").string()},
                       {{"MK_CACHE_DIR", cache.str()}});
  REQUIRE(all.exit_code == 0);
  CHECK(contains(all.out, "note: a kernel of this plan holds 4 code paths"));
  CHECK(contains(all.out, "`--rank R`"));
  const auto mine = mkc({"compile", "-s", "allreduce.one_shot", "-n", "4", "--max-bytes", "4096", "--dtype", "fp32",
                         "--rank", "1", "-o", (d / "one").string()},
                        {{"MK_CACHE_DIR", cache.str()}});
  REQUIRE(mine.exit_code == 0);
  CHECK_FALSE(contains(mine.out, "note:"));
  // one code path: no note
  const auto ring = mkc({"compile", "-s", "allreduce.ring", "-n", "4", "--max-bytes", "4096", "--dtype", "fp32", "-o",
                         (d / "ring").string()},
                        {{"MK_CACHE_DIR", cache.str()}});
  REQUIRE(ring.exit_code == 0);
  CHECK_FALSE(contains(ring.out, "note:"));
}

TEST_CASE("mkc compile: the summary gives every bucket's times and names the critical path" *
          doctest::skip(!mkt::have_nvrtc())) {
  mkt::TempDir d, cache;
  const auto r = mkc({"compile", "-s", "allreduce.one_shot", "-n", "2", "--dtype", "fp32", "-o", (d / "p").string()},
                     {{"MK_CACHE_DIR", cache.str()}});
  REQUIRE(r.exit_code == 0);
  std::smatch m;
  const std::regex head(R"(; (\d+) ms \(lower (\d+), codegen (\d+), NVRTC (\d+); bucket (\d) is the critical path\))");
  REQUIRE(std::regex_search(r.out, m, head));
  const int wall = std::stoi(m[1]), nvrtc = std::stoi(m[4]), critical = std::stoi(m[5]);
  const std::regex line(R"(bucket (\d): proved at (\d+) ms, codegen (\d+), NVRTC (\d+)( \(the critical path\))?)");
  std::vector<int> done(2, -1), own(2, -1);
  int marked = 0;
  for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), line); it != std::sregex_iterator(); ++it) {
    const int b = std::stoi((*it)[1]);
    REQUIRE(b < 2);
    done[size_t(b)] = std::stoi((*it)[2]) + std::stoi((*it)[3]) + std::stoi((*it)[4]);
    own[size_t(b)] = std::stoi((*it)[4]);
    if ((*it)[5].matched) {
      ++marked;
      CHECK(b == critical);
    }
  }
  CHECK(marked == 1);
  REQUIRE(done[0] >= 0);
  REQUIRE(done[1] >= 0);
  CHECK(done[size_t(critical)] + 2 >= done[size_t(1 - critical)]);  // it finished last (rounding: 1 ms each)
  CHECK(own[size_t(critical)] == nvrtc);
  CHECK(wall + 2 >= done[size_t(critical)]);
}

TEST_CASE("MK_INCLUDE_DIR: set, it is the only place for the DSL headers, and a wrong one is mk.cli.E006") {
  mkt::TempDir d, cache;
  const fs::path src = d / "s.cpp";
  mkt::write_text(src, "#include <mk/dsl.hpp>\n");
  const auto r = mkc({"verify", src.string(), "--ranks", "2"},
                     {{"MK_CACHE_DIR", cache.str()}, {"MK_INCLUDE_DIR", (d / "nowhere").string()}});
  CHECK(r.exit_code != 0);
  CHECK(contains(r.err, "[mk.cli.E006] MK_INCLUDE_DIR='" + (d / "nowhere").string() + "' does not hold mk/dsl.hpp"));
  const auto info = mkc({"info"}, {{"MK_INCLUDE_DIR", (d / "nowhere").string()}});
  CHECK(info.exit_code == 0);
  CHECK(contains(info.out, "DSL headers: (MK_INCLUDE_DIR="));
}
