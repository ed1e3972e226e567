// The IR (compiler/ir): refs and their text form, the printer (golden files in
// tests/golden/), and the JSON round trip with its errors (ir.E001 naming the
// JSON path of the problem, ir.E002 for an unsupported version).
#include <doctest/doctest.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "compiler/ir/ir.hpp"
#include "compiler/pipeline.hpp"
#include "compiler/verify/verify.hpp"
#include "mk/dsl.hpp"
#include "support.hpp"

using namespace mk;
using mkt::catch_error;
using mkt::contains;
using nlohmann::json;

namespace {

ir::Schedule build_builtin(const std::string& name, int n, int root = 0) {
  const auto* info = dsl::find_schedule(name);
  REQUIRE(info != nullptr);
  return dsl::build(*info, n, root);
}

// Every schedule the pipeline produces, after each pass (and each bucket).
std::vector<std::pair<std::string, ir::Schedule>> all_stages(const std::string& name, int n) {
  std::vector<std::pair<std::string, ir::Schedule>> out;
  compiler::LowerOptions o;
  o.on_pass = [&](std::string_view pass, const ir::Schedule& s, const compiler::PassInfo&) {
    out.push_back({std::string(pass), s});
  };
  compiler::lower(build_builtin(name, n), o);
  return out;
}

}  // namespace

TEST_CASE("ir: refs print and parse") {
  CHECK(ir::to_string(ir::Ref{1, ir::Buf::scratch, 3, 1}) == "r1.sc[3]");
  CHECK(ir::to_string(ir::Ref{0, ir::Buf::output, 2, 2}) == "r0.out[2:4]");
  CHECK(ir::to_string(ir::Ref{12, ir::Buf::input, 0, 1}) == "r12.in[0]");
  for (const ir::Ref& r : {ir::Ref{0, ir::Buf::input, 0, 1}, ir::Ref{7, ir::Buf::output, 15, 3},
                           ir::Ref{1023, ir::Buf::scratch, 65535, 1}, ir::Ref{3, ir::Buf::scratch, 2, 9}}) {
    CAPTURE(ir::to_string(r));
    auto back = ir::parse_ref(ir::to_string(r));
    REQUIRE(back.has_value());
    CHECK(*back == r);
  }
  auto a = ir::parse_ref("r4.out[3:6]");
  REQUIRE(a);
  CHECK(a->rank == 4);
  CHECK(a->buf == ir::Buf::output);
  CHECK(a->index == 3);
  CHECK(a->count == 3);
  for (const char* bad : {"", "r0", "x0.in[1]", "r0.in[1", "r0.inp[1]", "r.in[1]", "r0.in[a]", "r0in[1]",
                          "r0.in[1:]", "r0.in[:2]", " r0.in[1]", "r0.in[1] ", "r0.in[]", "r1x.in[0]",
                          "r0.in[1:2:3]", "r99999999999.in[0]"}) {
    CAPTURE(bad);
    CHECK_FALSE(ir::parse_ref(bad).has_value());
  }
}

TEST_CASE("ir: op kinds, buffers and protocols have stable names") {
  std::vector<std::string> names;
  for (auto k : ir::all_opkinds()) {
    names.push_back(std::string(ir::name(k)));
    CHECK(ir::parse_opkind(ir::name(k)) == k);
    CHECK(!ir::meaning(k).empty());
  }
  CHECK(names == std::vector<std::string>{"copy", "reduce", "signal", "wait", "nop", "put", "flush"});
  CHECK(ir::min_srcs(ir::OpKind::copy) == 1);
  CHECK(ir::min_srcs(ir::OpKind::reduce) == 2);
  CHECK(ir::min_dsts(ir::OpKind::reduce) == 1);
  CHECK(ir::min_srcs(ir::OpKind::wait) == 0);
  CHECK_FALSE(ir::parse_opkind("move").has_value());
  CHECK(ir::name(ir::Buf::input) == "in");
  CHECK(ir::name(ir::Buf::output) == "out");
  CHECK(ir::name(ir::Buf::scratch) == "sc");
  CHECK(ir::parse_buf("sc") == ir::Buf::scratch);
  CHECK_FALSE(ir::parse_buf("input").has_value());
  CHECK(ir::parse_proto("ll") == ir::Proto::ll);
  CHECK(ir::parse_proto("simple") == ir::Proto::simple);
  CHECK_FALSE(ir::parse_proto("LL128").has_value());
}

TEST_CASE("ir: print_op of each op kind") {
  ir::Op op;
  op.id = 7;
  op.kind = ir::OpKind::reduce;
  op.srcs = {ir::Ref{0, ir::Buf::input, 1, 1}, ir::Ref{0, ir::Buf::scratch, 2, 1}};
  op.dsts = {ir::Ref{0, ir::Buf::output, 1, 1}, ir::Ref{1, ir::Buf::scratch, 0, 1}};
  op.final = true;
  CHECK(ir::print_op(op) == "%7 reduce r0.in[1], r0.sc[2] -> r0.out[1], r1.sc[0] final");
  ir::Op sig;
  sig.id = 8;
  sig.kind = ir::OpKind::signal;
  sig.peer = 3;
  sig.slot = 1;
  CHECK(ir::print_op(sig) == "%8 signal r3 slot 1");
  ir::Op w;
  w.id = 9;
  w.kind = ir::OpKind::wait;
  w.slot = 4;
  CHECK(ir::print_op(w) == "%9 wait slot 4");
  w.iter = -2;
  CHECK(ir::print_op(w) == "%9 wait slot 4 iter -2");
  ir::Op nop;
  nop.id = 0;
  nop.kind = ir::OpKind::nop;
  CHECK(ir::print_op(nop) == "%0 nop");
  ir::Op put;
  put.id = 10;
  put.kind = ir::OpKind::put;
  put.srcs = {ir::Ref{0, ir::Buf::output, 1, 2}};
  put.dsts = {ir::Ref{4, ir::Buf::scratch, 6, 2}};
  CHECK(put.is_data());
  CHECK(put.is_copy());
  CHECK(ir::print_op(put) == "%10 put r0.out[1:3] -> r4.sc[6:8]");
  ir::Op flush;
  flush.id = 11;
  flush.kind = ir::OpKind::flush;
  CHECK_FALSE(flush.is_data());
  CHECK(ir::print_op(flush) == "%11 flush");
}

TEST_CASE("ir json: puts and flushes of a schedule lowered across nodes round-trip") {
  const auto* info = dsl::find_schedule("allreduce.hier");
  REQUIRE(info != nullptr);
  compiler::LowerOptions o;
  o.topology = topology::parse("2x2", 4);
  const auto l = compiler::lower(dsl::build(*info, *o.topology), o);
  for (const auto& s : l.variants) {
    size_t puts = 0, flushes = 0;
    for (const auto& op : s.ops) {
      puts += op.kind == ir::OpKind::put;
      flushes += op.kind == ir::OpKind::flush;
    }
    CHECK(puts > 0);
    CHECK(flushes > 0);
    const std::string j1 = ir::to_json(s);
    CHECK(j1.find("\"kind\": \"put\"") != std::string::npos);
    CHECK(j1.find("\"kind\": \"flush\"") != std::string::npos);
    const ir::Schedule back = ir::from_json(j1);
    CHECK(ir::to_json(back) == j1);
    CHECK(ir::print(back) == ir::print(s));
    verify::verify_sync(back);  // what a file holds is proved again when it is read
  }
}

TEST_CASE("ir: buffer geometry helpers") {
  ir::Schedule s;
  s.nranks = 4;
  s.chunks = 2;
  s.scratch = 5;
  s.coll = Collective::reducescatter;
  CHECK(ir::buf_chunks(s, ir::Buf::input) == 8);
  CHECK(ir::buf_chunks(s, ir::Buf::output) == 2);
  CHECK(ir::buf_chunks(s, ir::Buf::scratch) == 5);
  // reduce-scatter in-place: rank r's output is block r of its input
  CHECK(ir::inplace_output_of_input(s, 2, 4) == 0);
  CHECK(ir::inplace_output_of_input(s, 2, 5) == 1);
  CHECK_FALSE(ir::inplace_output_of_input(s, 2, 3).has_value());
  s.coll = Collective::allgather;
  CHECK(ir::inplace_output_of_input(s, 3, 1) == 7);
  s.coll = Collective::alltoall;
  CHECK_FALSE(ir::inplace_output_of_input(s, 0, 0).has_value());
  s.coll = Collective::broadcast;
  s.root = 1;
  CHECK(ir::has_input(s, 1));
  CHECK_FALSE(ir::has_input(s, 0));
  CHECK(ir::has_output(s, 0));
  CHECK(ir::inplace_output_of_input(s, 1, 1) == 1);
  CHECK_FALSE(ir::inplace_output_of_input(s, 0, 1).has_value());
  s.coll = Collective::reduce;
  CHECK(ir::has_input(s, 0));
  CHECK_FALSE(ir::has_output(s, 0));
  CHECK(ir::has_output(s, 1));
}

// ---- printer goldens ---------------------------------------------------------

TEST_CASE("ir golden: print of allreduce.ring, 4 ranks, as built") {
  mkt::check_golden("allreduce_ring_n4.raw.txt", ir::print(build_builtin("allreduce.ring", 4)));
}

TEST_CASE("ir golden: print of reduce.direct, 3 ranks, as built") {
  mkt::check_golden("reduce_direct_n3.raw.txt", ir::print(build_builtin("reduce.direct", 3)));
}

TEST_CASE("ir golden: print of allgather.ring, 3 ranks, after the full pipeline") {
  compiler::LowerOptions o;
  auto l = compiler::lower(build_builtin("allgather.ring", 3), o);
  std::string text;
  for (size_t b = 0; b < l.variants.size(); ++b)
    text += "=== bucket " + std::to_string(b) + " ===\n" + ir::print(l.variants[b]);
  mkt::check_golden("allgather_ring_n3.lowered.txt", text);
}

TEST_CASE("ir golden: print of allreduce.two_shot, 2 ranks, after each pass") {
  std::string text;
  for (auto& [pass, s] : all_stages("allreduce.two_shot", 2)) text += "=== after " + pass + " ===\n" + ir::print(s);
  mkt::check_golden("allreduce_two_shot_n2.passes.txt", text);
}

TEST_CASE("ir: print is stable: building twice prints the same text") {
  for (const auto& info : dsl::registered_schedules()) {
    CAPTURE(info.name);
    auto a = dsl::build(info, 5), b = dsl::build(info, 5);
    CHECK(ir::print(a) == ir::print(b));
  }
}

// ---- JSON ---------------------------------------------------------------------

TEST_CASE("ir json: to_json -> from_json -> to_json is the identity for every built-in, raw and lowered") {
  int checked = 0;
  for (const auto& info : dsl::registered_schedules()) {
    for (int n : {1, 2, 3, 4, 7}) {
      for (auto& [pass, s] : all_stages(info.name, n)) {
        CAPTURE(info.name);
        CAPTURE(n);
        CAPTURE(pass);
        const std::string j1 = ir::to_json(s);
        ir::Schedule back = ir::from_json(j1);
        const std::string j2 = ir::to_json(back);
        CHECK(j1 == j2);
        CHECK(ir::print(back) == ir::print(s));
        // every field the IR carries, compared directly (not through JSON)
        CHECK(back.ops.size() == s.ops.size());
        CHECK(back.nranks == s.nranks);
        CHECK(back.tile_bytes == s.tile_bytes);
        CHECK(back.synced == s.synced);
        bool same_ops = back.ops.size() == s.ops.size();
        for (size_t i = 0; same_ops && i < s.ops.size(); ++i) {
          const auto &x = s.ops[i], &y = back.ops[i];
          same_ops = x.id == y.id && x.kind == y.kind && x.rank == y.rank && x.tb == y.tb && x.srcs == y.srcs &&
                     x.dsts == y.dsts && x.peer == y.peer && x.slot == y.slot && x.iter == y.iter &&
                     x.final == y.final && x.pos == y.pos && x.loc->file == y.loc->file && x.loc->line == y.loc->line;
        }
        CHECK(same_ops);
        ++checked;
      }
    }
  }
  CHECK(checked > 300);
}

TEST_CASE("ir: fingerprint is equal where the JSON is, and changes with every field the JSON writes") {
  int checked = 0;
  for (const char* name : {"allreduce.ring", "allgather.hier", "broadcast.direct", "reducescatter.hier"}) {
    for (auto& [pass, s] : all_stages(name, 4)) {
      CAPTURE(name);
      CAPTURE(pass);
      // from_json keeps file and line of a position, not its function: a
      // different interned Loc, the same JSON, the same fingerprint
      const ir::Schedule back = ir::from_json(ir::to_json(s));
      CHECK(ir::fingerprint(back) == ir::fingerprint(s));
      ++checked;
    }
  }
  CHECK(checked > 20);
  ir::Schedule base;
  for (auto& [pass, s] : all_stages("allreduce.two_shot", 3))
    if (pass == "sync") base = s;
  REQUIRE(base.synced);
  size_t sig = 0, data = 0;
  for (size_t i = 0; i < base.ops.size(); ++i) {
    if (base.ops[i].kind == ir::OpKind::signal) sig = i;
    if (base.ops[i].is_data() && !base.ops[i].pos.empty()) data = i;
  }
  REQUIRE(base.ops[sig].kind == ir::OpKind::signal);
  const std::string f0 = ir::fingerprint(base);
  const std::vector<std::pair<const char*, std::function<void(ir::Schedule&)>>> edits = {
      {"name", [](auto& x) { x.name += "x"; }},
      {"chunks", [](auto& x) { ++x.chunks; }},
      {"tile_bytes", [](auto& x) { x.tile_bytes += 16; }},
      {"id", [&](auto& x) { x.ops[data].id += 1000; }},
      {"kind", [&](auto& x) { x.ops[data].kind = x.ops[data].kind == ir::OpKind::copy ? ir::OpKind::reduce : ir::OpKind::copy; }},
      {"rank", [&](auto& x) { x.ops[data].rank ^= 1; }},
      {"tb", [&](auto& x) { x.ops[data].tb += 1; }},
      {"src index", [&](auto& x) { x.ops[data].srcs[0].index += 1; }},
      {"dst buf", [&](auto& x) { x.ops[data].dsts[0].buf = ir::Buf::scratch; }},
      {"dst count", [&](auto& x) { x.ops[data].dsts[0].count += 1; }},
      {"a src more", [&](auto& x) { x.ops[data].srcs.push_back(x.ops[data].srcs[0]); }},
      {"a src moved to dsts", [&](auto& x) {
         x.ops[data].dsts.insert(x.ops[data].dsts.begin(), x.ops[data].srcs.back());
         x.ops[data].srcs.pop_back();
       }},
      {"peer", [&](auto& x) { x.ops[sig].peer ^= 1; }},
      {"slot", [&](auto& x) { x.ops[sig].slot += 1; }},
      {"final", [&](auto& x) { x.ops[data].final = !x.ops[data].final; }},
      {"pos", [&](auto& x) { x.ops[data].pos[0] += 1; }},
      {"loc line", [&](auto& x) {
         SrcLoc l = x.ops[data].loc;
         l.line += 1;
         x.ops[data].loc = l;
       }},
      {"loc file", [&](auto& x) {
         SrcLoc l = x.ops[data].loc;
         l.file += ".other";
         x.ops[data].loc = l;
       }},
      {"an op less", [&](auto& x) { x.ops.pop_back(); }},
  };
  for (const auto& [what, edit] : edits) {
    CAPTURE(what);
    ir::Schedule t = base;
    edit(t);
    CHECK(ir::to_json(t) != ir::to_json(base));  // the JSON tells them apart
    CHECK(ir::fingerprint(t) != f0);             // so must the fingerprint
  }
}

TEST_CASE("ir: source positions are interned: equal positions share one Loc, copies are pointer copies") {
  const SrcLoc a{"dir/a.cpp", 12, "f"}, a2{"dir/a.cpp", 12, "f"}, b{"dir/a.cpp", 13, "f"};
  const ir::Loc la(a), la2(a2), lb(b), none;
  CHECK(la == la2);
  CHECK(&la.get() == &la2.get());
  CHECK(!(la == lb));
  CHECK(la->line == 12);
  CHECK(la.str() == "a.cpp:12");
  CHECK(la->func == "f");
  CHECK(!none.valid());
  CHECK(none.str().empty());
  CHECK(ir::Loc(SrcLoc{}) == none);
  ir::Op op;
  op.loc = a;
  const ir::Op copy = op;
  CHECK(&copy.loc.get() == &la.get());
  const SrcLoc& back = copy.loc;  // passes where a SrcLoc is taken
  CHECK(back.file == "dir/a.cpp");
}

TEST_CASE("ir json: the output is indented JSON with the schema version") {
  auto s = build_builtin("broadcast.direct", 2);
  json j = json::parse(ir::to_json(s));
  CHECK(j["mk_ir_version"] == ir::Schedule::kVersion);
  CHECK(j["collective"] == "broadcast");
  CHECK(j["ops"].size() == 2);
  CHECK(j["ops"][0]["srcs"][0] == "r0.in[0]");
  CHECK(j["ops"][0]["loc"]["line"].get<int>() > 0);
  CHECK(contains(ir::to_json(s, 1), "\n "));
}

namespace {

// A valid, lowered schedule as JSON, to break in one place at a time.
json valid_json() {
  compiler::LowerOptions o;
  auto l = compiler::lower(build_builtin("allreduce.ring", 2), o);
  return json::parse(ir::to_json(l.variants.back()));
}

struct Breakage {
  std::string what;
  std::function<void(json&)> mutate;
  std::string path;  // the JSON path the error must name
};

}  // namespace

TEST_CASE("ir json: malformed input raises mk.ir.E001 naming the JSON path") {
  const json base = valid_json();
  // indices of a copy and of a wait in the op list
  size_t d = 0, w = 0;
  while (d < base["ops"].size() && base["ops"][d]["kind"] != "copy") ++d;
  while (w < base["ops"].size() && base["ops"][w]["kind"] != "wait") ++w;
  REQUIRE(d < base["ops"].size());
  REQUIRE(w < base["ops"].size());
  REQUIRE(base["ops"][d].contains("loc"));
  CHECK_FALSE(catch_error([&] { ir::from_json(base.dump()); }));  // the control: the unbroken text loads
  const std::string D = "$.ops[" + std::to_string(d) + "]", W = "$.ops[" + std::to_string(w) + "]";

  const std::vector<Breakage> cases = {
      {"top level not an object", [](json& j) { j = json::array(); }, "$"},
      {"version missing", [](json& j) { j.erase("mk_ir_version"); }, "$.mk_ir_version"},
      {"version a string", [](json& j) { j["mk_ir_version"] = "1"; }, "$.mk_ir_version"},
      {"name missing", [](json& j) { j.erase("name"); }, "$.name"},
      {"name a number", [](json& j) { j["name"] = 5; }, "$.name"},
      {"unknown collective", [](json& j) { j["collective"] = "allsum"; }, "$.collective"},
      {"ranks missing", [](json& j) { j.erase("ranks"); }, "$.ranks"},
      {"ranks a string", [](json& j) { j["ranks"] = "2"; }, "$.ranks"},
      {"ranks zero", [](json& j) { j["ranks"] = 0; }, "$.ranks"},
      {"chunks zero", [](json& j) { j["chunks"] = 0; }, "$.chunks"},
      {"instances zero", [](json& j) { j["instances"] = 0; }, "$.instances"},
      {"tile_bytes a float", [](json& j) { j["tile_bytes"] = 1.5; }, "$.tile_bytes"},
      {"negative scratch", [](json& j) { j["scratch"] = -1; }, "$"},
      {"depth zero", [](json& j) { j["depth"] = 0; }, "$"},
      {"unknown proto", [](json& j) { j["proto"] = "ll128"; }, "$.proto"},
      {"staged not a bool", [](json& j) { j["staged"] = "yes"; }, "$.staged"},
      {"synced a number", [](json& j) { j["synced"] = 1; }, "$.synced"},
      {"topology a number", [](json& j) { j["topology"] = 3; }, "$.topology"},
      {"ops missing", [](json& j) { j.erase("ops"); }, "$.ops"},
      {"ops an object", [](json& j) { j["ops"] = json::object(); }, "$.ops"},
      {"op not an object", [](json& j) { j["ops"][3] = 42; }, "$.ops[3]"},
      {"op id missing", [](json& j) { j["ops"][1].erase("id"); }, "$.ops[1].id"},
      {"op kind unknown", [](json& j) { j["ops"][2]["kind"] = "move"; }, "$.ops[2].kind"},
      {"op kind missing", [](json& j) { j["ops"][2].erase("kind"); }, "$.ops[2].kind"},
      {"op rank a string", [](json& j) { j["ops"][4]["rank"] = "0"; }, "$.ops[4].rank"},
      {"op tb a bool", [](json& j) { j["ops"][4]["tb"] = true; }, "$.ops[4].tb"},
      {"srcs not an array", [&](json& j) { j["ops"][d]["srcs"] = "r0.in[0]"; }, D + ".srcs"},
      {"src not a string", [&](json& j) { j["ops"][d]["srcs"][0] = 5; }, D + ".srcs[0]"},
      {"src unparsable", [&](json& j) { j["ops"][d]["srcs"][0] = "r0.foo[1]"; }, D + ".srcs[0]"},
      {"dst unparsable", [&](json& j) { j["ops"][d]["dsts"][0] = "out[1]"; }, D + ".dsts[0]"},
      {"copy without sources", [&](json& j) { j["ops"][d]["srcs"] = json::array(); }, D},
      {"copy without destinations", [&](json& j) { j["ops"][d].erase("dsts"); }, D},
      {"final not a bool", [&](json& j) { j["ops"][d]["final"] = 1; }, D + ".final"},
      {"pos not an array", [&](json& j) { j["ops"][d]["pos"] = 0; }, D + ".pos"},
      {"pos with a string", [&](json& j) { j["ops"][d]["pos"] = json::array({"0"}); }, D + ".pos"},
      {"loc line a string", [&](json& j) { j["ops"][d]["loc"]["line"] = "12"; }, D + ".loc.line"},
      {"loc file missing", [&](json& j) { j["ops"][d]["loc"].erase("file"); }, D + ".loc.file"},
      {"wait slot a float", [&](json& j) { j["ops"][w]["slot"] = 0.5; }, W + ".slot"},
      {"wait iter a string", [&](json& j) { j["ops"][w]["iter"] = "-2"; }, W + ".iter"},
  };
  for (const auto& k : cases) {
    CAPTURE(k.what);
    json j = base;
    k.mutate(j);
    auto c = catch_error([&] { ir::from_json(j.dump()); });
    CHECK(c.id == "mk.ir.E001");
    CHECK(contains(c.message, "at " + k.path + ":"));
    CHECK(contains(c.what, "hint:"));
  }
}

TEST_CASE("ir json: text that is not JSON raises mk.ir.E001 at $") {
  const std::string text = ir::to_json(build_builtin("allgather.direct", 2));
  for (const std::string& bad : {std::string(""), std::string("not json"), text.substr(0, text.size() / 2),
                                 text + "}", std::string("{\"mk_ir_version\": 1,}")}) {
    CAPTURE(bad.substr(0, 40));
    auto c = catch_error([&] { ir::from_json(bad); });
    CHECK(c.id == "mk.ir.E001");
    CHECK(contains(c.message, "at $: not JSON"));
  }
}

TEST_CASE("ir json: an unsupported version raises mk.ir.E002") {
  json j = json::parse(ir::to_json(build_builtin("allgather.direct", 2)));
  for (int v : {0, 2, 99}) {
    CAPTURE(v);
    j["mk_ir_version"] = v;
    auto c = catch_error([&] { ir::from_json(j.dump()); });
    CHECK(c.id == "mk.ir.E002");
    CHECK(contains(c.message, "version " + std::to_string(v)));
  }
}

// Regression: out-of-range integers used to wrap ("ranks": 4294967298 -> 2).
TEST_CASE("ir json: integers outside their field's range raise mk.ir.E001") {
  json j = json::parse(ir::to_json(build_builtin("allgather.direct", 2)));
  j["ranks"] = 4294967298ll;  // wraps to 2
  auto c = catch_error([&] { ir::from_json(j.dump()); });
  CHECK(c.id == "mk.ir.E001");
  CHECK(contains(c.message, "$.ranks"));
}
