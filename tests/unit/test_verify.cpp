// The verifier (compiler/verify) rejecting broken schedules: one test per
// mk.verify id. Each test checks the id, that the message names the rank, the
// step and the chunk, and (for schedules written in the DSL here) that the
// error points at this file's line. Every broken schedule is a small edit of a
// correct one, and the correct one is shown to pass (so a test cannot pass
// because the verifier rejects everything).
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include <chrono>

#include "compiler/codegen/codegen.hpp"
#include "compiler/ir/ir.hpp"
#include "compiler/passes/passes.hpp"
#include "compiler/verify/executor.hpp"
#include "compiler/pipeline.hpp"
#include "compiler/verify/clocks.hpp"
#include "compiler/verify/hb.hpp"
#include "compiler/verify/verify.hpp"
#include "mk/dsl.hpp"
#include "support.hpp"

using namespace mk;
using mk::dsl::Program;
using mkt::catch_error;
using mkt::Caught;
using mkt::contains;
using nlohmann::json;

namespace {

bool here(const SrcLoc& l) { return contains(l.file, "test_verify.cpp"); }

compiler::Lowered lower(ir::Schedule s) {
  compiler::LowerOptions o;
  return compiler::lower(std::move(s), o);
}

Caught lower_error(Program& p) { return catch_error([&] { lower(std::move(p.ir())); }); }

// A correct two-rank all-reduce: each rank pushes its input into the peer's
// scratch, then reduces. The lines of its four calls are recorded.
struct Ar2 {
  int push0 = 0, push1 = 0, red0 = 0, red1 = 0;
  ir::Schedule build() {
    Program p(Collective::allreduce, 2, 0, "test.ar2");
    push0 = __LINE__ + 1;
    p.copy(p.scratch(1, 0), p.input(0, 0));
    push1 = __LINE__ + 1;
    p.copy(p.scratch(0, 0), p.input(1, 0));
    red0 = __LINE__ + 1;
    p.reduce(p.output(0, 0), {p.input(0, 0), p.scratch(0, 0)});
    red1 = __LINE__ + 1;
    p.reduce(p.output(1, 0), {p.input(1, 0), p.scratch(1, 0)});
    return std::move(p.ir());
  }
};

// The simple-protocol variant (the last bucket) of a lowered schedule.
ir::Schedule simple_variant(ir::Schedule s) {
  auto l = lower(std::move(s));
  REQUIRE(l.variants.back().proto == ir::Proto::simple);
  return l.variants.back();
}

// Removes the `which`-th wait (in op order) and, if no other wait listens on
// that slot, the signal that served it. Returns false if there is no such wait.
bool drop_wait(ir::Schedule& s, size_t which, ir::Op* removed = nullptr) {
  size_t seen = 0;
  for (size_t i = 0; i < s.ops.size(); ++i) {
    if (s.ops[i].kind != ir::OpKind::wait) continue;
    if (seen++ != which) continue;
    const ir::Op w = s.ops[i];
    if (removed) *removed = w;
    s.ops.erase(s.ops.begin() + std::ptrdiff_t(i));
    bool others = false;
    for (const auto& op : s.ops)
      others = others || (op.kind == ir::OpKind::wait && op.rank == w.rank && op.slot == w.slot);
    if (!others)
      for (size_t k = 0; k < s.ops.size(); ++k)
        if (s.ops[k].kind == ir::OpKind::signal && s.ops[k].peer == w.rank && s.ops[k].slot == w.slot) {
          s.ops.erase(s.ops.begin() + std::ptrdiff_t(k));
          break;
        }
    return true;
  }
  return false;
}

size_t count_kind(const ir::Schedule& s, ir::OpKind k) {
  size_t n = 0;
  for (const auto& op : s.ops) n += op.kind == k;
  return n;
}

// A synced schedule written by hand as JSON: ops are
// {rank, tb, kind, srcs/dsts or peer/slot/iter}.
ir::Schedule hand_synced(const char* coll, int ranks, int scratch, int slots, int depth, const std::string& proto,
                         const json& ops) {
  json j = {{"mk_ir_version", 1}, {"name", "hand"},     {"collective", coll}, {"ranks", ranks},
            {"chunks", 1},        {"scratch", scratch}, {"slots", slots},     {"depth", depth},
            {"proto", proto},     {"tile_bytes", 1024}, {"staged", true},     {"synced", true}};
  json list = json::array();
  int id = 0;
  int tbs = 0;
  for (json op : ops) {
    op["id"] = id++;
    if ((op["kind"] == "copy" || op["kind"] == "reduce") && !op.contains("pos")) op["pos"] = json::array({0});
    tbs = std::max(tbs, op["tb"].get<int>() + 1);
    list.push_back(op);
  }
  j["tbs"] = tbs;
  j["ops"] = list;
  return ir::from_json(j.dump());
}

json copy(int rank, int tb, const char* src, const char* dst) {
  return {{"kind", "copy"}, {"rank", rank}, {"tb", tb}, {"srcs", {src}}, {"dsts", {dst}}};
}
json signal(int rank, int tb, int peer, int slot) {
  return {{"kind", "signal"}, {"rank", rank}, {"tb", tb}, {"peer", peer}, {"slot", slot}};
}
json wait(int rank, int tb, int slot, int iter = 0) {
  return {{"kind", "wait"}, {"rank", rank}, {"tb", tb}, {"slot", slot}, {"iter", iter}};
}

}  // namespace

TEST_CASE("verify: the correct schedules used below pass") {
  Ar2 a;
  auto l = lower(a.build());
  REQUIRE(!l.variants.empty());
  for (const auto& v : l.variants) {
    CHECK(v.synced);
    CHECK_FALSE(catch_error([&] { verify::verify_all(v); }));
  }
  CHECK(count_kind(l.variants.back(), ir::OpKind::wait) > 0);
  // The hand-written synced schedules' correct forms: a one-rank all-reduce
  // through scratch, with and without a cross-thread-block hand-off.
  auto one_tb = hand_synced("allreduce", 1, 1, 0, 2, "simple",
                            {copy(0, 0, "r0.in[0]", "r0.sc[0]"), copy(0, 0, "r0.sc[0]", "r0.out[0]")});
  CHECK_FALSE(catch_error([&] { verify::verify_all(one_tb); }));
  auto two_tb = hand_synced("allreduce", 1, 1, 2, 2, "simple",
                            {wait(0, 0, 1, -2), copy(0, 0, "r0.in[0]", "r0.sc[0]"), signal(0, 0, 0, 0), wait(0, 1, 0),
                             copy(0, 1, "r0.sc[0]", "r0.out[0]"), signal(0, 1, 0, 1)});
  CHECK_FALSE(catch_error([&] { verify::verify_all(two_tb); }));
}

TEST_CASE("verify: mk.verify.E001 an output chunk misses a contribution") {
  Program p(Collective::allreduce, 2, 0, "test.e001");
  const int line = __LINE__ + 1;
  p.copy(p.output(0, 0), p.input(0, 0));  // should also add rank 1's input
  p.reduce(p.output(1, 0), {p.input(1, 0), p.input(0, 0)});
  auto c = lower_error(p);
  CHECK(c.id == "mk.verify.E001");
  CHECK(contains(c.message, "test.e001 (2 ranks"));
  CHECK(contains(c.message, "rank 0 output chunk 0 misses the contribution of rank 1 input chunk 0"));
  CHECK(contains(c.message, "last written by %0 (copy on rank 0, step 0)"));
  CHECK(here(c.loc));
  CHECK(c.loc.line == uint32_t(line));
  CHECK(contains(c.what, "test_verify.cpp:" + std::to_string(line)));
}

TEST_CASE("verify: mk.verify.E001 for an output nothing wrote") {
  Program p(Collective::allgather, 2, 0, "test.e001b");
  p.chunks(2);
  for (int r = 0; r < 2; ++r)
    for (int q = 0; q < 2; ++q)
      if (!(r == 1 && q == 0)) p.copy(p.output(r, 2 * q, 2), p.input(q, 0, 2));
  // rank 1's block 0 (chunks 0 and 1) is never written
  auto c = lower_error(p);
  CHECK(c.id == "mk.verify.E001");
  CHECK(contains(c.message, "rank 1 output chunk 0 misses the contribution of rank 0 input chunk 0"));
  CHECK(contains(c.message, "nothing wrote it"));
}

TEST_CASE("verify: mk.verify.E002 a contribution counted twice") {
  Program p(Collective::allreduce, 2, 0, "test.e002");
  p.reduce(p.scratch(0, 0), {p.input(0, 0), p.input(1, 0)});
  const int line = __LINE__ + 1;
  p.reduce(p.output(0, 0), {p.scratch(0, 0), p.input(1, 0)});  // rank 1's input again
  p.copy(p.output(1, 0), p.scratch(0, 0));
  auto c = lower_error(p);
  CHECK(c.id == "mk.verify.E002");
  CHECK(contains(c.message, "%1 (reduce on rank 0, step 1)"));
  CHECK(contains(c.message, "counts the contribution of rank 1 input chunk 0 twice (chunk 0)"));
  CHECK(here(c.loc));
  CHECK(c.loc.line == uint32_t(line));
}

TEST_CASE("verify: mk.verify.E003 an output chunk holds foreign data") {
  // reduce-scatter: rank 0's output is the sum of block 0 of every input;
  // adding block 1 of rank 0 is data that does not belong there.
  Program p(Collective::reducescatter, 2, 0, "test.e003");
  const int line = __LINE__ + 1;
  p.reduce(p.output(0, 0), {p.input(0, 0), p.input(1, 0), p.input(0, 1)});
  p.reduce(p.output(1, 0), {p.input(0, 1), p.input(1, 1)});
  auto c = lower_error(p);
  CHECK(c.id == "mk.verify.E003");
  CHECK(contains(c.message, "rank 0 output chunk 0 holds the contribution of rank 0 input chunk 1"));
  CHECK(contains(c.message, "last written by %0 (reduce on rank 0, step 0)"));
  CHECK(c.loc.line == uint32_t(line));
  CHECK(here(c.loc));

  // all-gather: a block that holds its rank's data plus another rank's
  Program q(Collective::allgather, 2, 0, "test.e003b");
  q.copy(q.output(0, 0), q.input(0, 0));
  q.copy(q.output(0, 1), q.input(1, 0));
  q.copy(q.output(1, 0), q.input(0, 0));
  q.reduce(q.output(1, 1), {q.input(1, 0), q.input(0, 0)});
  c = lower_error(q);
  CHECK(c.id == "mk.verify.E003");
  CHECK(contains(c.message, "rank 1 output chunk 1 holds the contribution of rank 0 input chunk 0"));
}

TEST_CASE("verify: mk.verify.E006 a chunk outside its buffer") {
  Program p(Collective::allreduce, 2, 0, "test.e006");
  p.copy(p.output(0, 0), p.input(0, 0));
  const int line = __LINE__ + 1;
  p.copy(p.output(1, 5), p.input(1, 0));
  auto c = lower_error(p);
  CHECK(c.id == "mk.verify.E006");
  CHECK(contains(c.message, "%1 (copy on rank 1, step 0) touches r1.out[5], but rank 1's out buffer has 1 chunk(s)"));
  CHECK(c.loc.line == uint32_t(line));
  CHECK(here(c.loc));

  // a run that starts inside and ends outside
  Program q(Collective::allreduce, 2, 0, "test.e006b");
  q.chunks(2);
  q.copy(q.output(0, 1, 2), q.input(0, 0, 2));
  c = lower_error(q);
  CHECK(c.id == "mk.verify.E006");
  CHECK(contains(c.message, "r0.out[1:3]"));

  // scratch outside the schedule's scratch count, in a hand-edited IR
  Ar2 a;
  ir::Schedule s = a.build();
  s.scratch = 0;
  c = catch_error([&] { verify::verify_semantics(s); });
  CHECK(c.id == "mk.verify.E006");
  CHECK(contains(c.message, "r1.sc[0]"));
  CHECK(c.loc.line == uint32_t(a.push0));

  // an op on a rank that does not exist
  s = a.build();
  s.ops[2].rank = 2;
  c = catch_error([&] { verify::verify_semantics(s); });
  CHECK(c.id == "mk.verify.E006");
  CHECK(contains(c.message, "executes on rank 2"));
}

TEST_CASE("verify: mk.verify.E007 a read of data nothing wrote") {
  Program p(Collective::allreduce, 2, 0, "test.e007");
  p.copy(p.scratch(1, 0), p.input(0, 0));
  const int line = __LINE__ + 1;
  p.reduce(p.output(1, 0), {p.input(1, 0), p.scratch(1, 3)});  // slot 3, not slot 0
  p.reduce(p.output(0, 0), {p.input(0, 0), p.input(1, 0)});
  auto c = lower_error(p);
  CHECK(c.id == "mk.verify.E007");
  CHECK(contains(c.message, "%1 (reduce on rank 1, step 0) reads r1.sc[3] (chunk 0) before anything wrote it"));
  CHECK(c.loc.line == uint32_t(line));
  CHECK(here(c.loc));
}

TEST_CASE("verify: mk.verify.E007 reading the output before writing it, out-of-place only") {
  // dst := dst + x on the output is right in place (output aliases input) and
  // wrong out of place (the output starts empty): the verifier checks both.
  Program p(Collective::allreduce, 2, 0, "test.e007b");
  const int line = __LINE__ + 1;
  p.reduce(p.output(0, 0), {p.output(0, 0), p.input(1, 0)});
  p.reduce(p.output(1, 0), {p.input(0, 0), p.input(1, 0)});
  auto c = lower_error(p);
  CHECK(c.id == "mk.verify.E007");
  CHECK(contains(c.message, "out-of-place"));
  CHECK(contains(c.message, "reads r0.out[0]"));
  CHECK(contains(c.what, "read the input instead"));
  CHECK(c.loc.line == uint32_t(line));
}

TEST_CASE("verify: mk.verify.E008 one operation mixes chunk positions") {
  Program p(Collective::allreduce, 2, 0, "test.e008");
  p.chunks(2);
  const int line = __LINE__ + 1;
  p.reduce(p.output(0, 0), {p.input(0, 0), p.input(1, 1)});
  auto c = lower_error(p);
  CHECK(c.id == "mk.verify.E008");
  CHECK(contains(c.message, "%0 (reduce on rank 0, step 0) combines data of chunk position 0 with position 1 (r1.in[1])"));
  CHECK(c.loc.line == uint32_t(line));
  CHECK(here(c.loc));
}

TEST_CASE("verify: mk.verify.E009 a write into a buffer the collective does not let the schedule write") {
  Program p(Collective::allreduce, 2, 0, "test.e009");
  const int line = __LINE__ + 1;
  p.copy(p.input(1, 0), p.input(0, 0));
  auto c = lower_error(p);
  CHECK(c.id == "mk.verify.E009");
  CHECK(contains(c.message, "%0 (copy on rank 0, step 0) reads/writes r1.in[0]"));
  CHECK(contains(c.message, "read-only"));
  CHECK(c.loc.line == uint32_t(line));
  CHECK(here(c.loc));

  // reduce: only the root has a receive buffer
  Program q(Collective::reduce, 3, 0, "test.e009b");
  q.copy(q.scratch(0, 1), q.input(1, 0));
  const int line2 = __LINE__ + 1;
  q.copy(q.output(2, 0), q.input(2, 0));
  c = lower_error(q);
  CHECK(c.id == "mk.verify.E009");
  CHECK(contains(c.message, "r2.out[0]"));
  CHECK(contains(c.message, "rank 2 has no receive buffer in a reduce rooted at 0"));
  CHECK(c.loc.line == uint32_t(line2));
}

TEST_CASE("verify: mk.verify.E010 a read of a buffer the collective does not provide") {
  // broadcast: only the root has a send buffer
  Program p(Collective::broadcast, 3, 0, "test.e010");
  p.copy(p.output(0, 0), p.input(0, 0));
  p.copy(p.output(1, 0), p.input(0, 0));
  const int line = __LINE__ + 1;
  p.copy(p.output(2, 0), p.input(2, 0));
  auto c = lower_error(p);
  CHECK(c.id == "mk.verify.E010");
  CHECK(contains(c.message, "%2 (copy on rank 2, step 0) reads/writes r2.in[0]"));
  CHECK(contains(c.message, "rank 2 has no send buffer in a broadcast rooted at 0"));
  CHECK(c.loc.line == uint32_t(line));
  CHECK(here(c.loc));

  // reduce: a non-root's output does not exist, so it cannot be read either
  Program q(Collective::reduce, 2, 0, "test.e010b");
  q.reduce(q.output(0, 0), {q.input(0, 0), q.output(1, 0)});
  c = lower_error(q);
  CHECK(c.id == "mk.verify.E010");
  CHECK(contains(c.message, "rank 1 has no receive buffer"));
}

TEST_CASE("verify: mk.verify.E012 a schedule without operations") {
  Program p(Collective::allreduce, 4, 0, "test.e012");
  auto c = lower_error(p);
  CHECK(c.id == "mk.verify.E012");
  CHECK(contains(c.message, "test.e012 (4 ranks)"));
  // sync ops alone are no operations either
  ir::Schedule s;
  s.name = "only.sync";
  s.nranks = 2;
  ir::Op n;
  n.kind = ir::OpKind::nop;
  n.rank = 0;
  s.ops.push_back(n);
  c = catch_error([&] { verify::verify_semantics(s); });
  CHECK(c.id == "mk.verify.E012");
}

// ---- synchronisation ---------------------------------------------------------

TEST_CASE("verify: mk.verify.E004 race after a wait is dropped from a lowered schedule") {
  Ar2 a;
  ir::Schedule s = simple_variant(a.build());
  const size_t waits = count_kind(s, ir::OpKind::wait);
  REQUIRE(waits > 0);
  // Each wait insert_sync placed is needed: without it, some pair of accesses
  // is unordered. (Also shows the pass adds no redundant waits here.)
  for (size_t k = 0; k < waits; ++k) {
    CAPTURE(k);
    ir::Schedule b = s;
    ir::Op w;
    REQUIRE(drop_wait(b, k, &w));
    CAPTURE(ir::print_op(w));
    auto c = catch_error([&] { verify::verify_sync(b); });
    CHECK(c.id == "mk.verify.E004");
    CHECK(contains(c.message, "test.ar2: race on r"));
    CHECK(contains(c.message, "are not ordered by signal/wait"));
    CHECK(contains(c.message, "on rank "));
    CHECK(contains(c.message, ", tb "));
    CHECK(contains(c.message, ", step "));
    CHECK(here(c.loc));
    CHECK((c.loc.line == uint32_t(a.push0) || c.loc.line == uint32_t(a.push1) || c.loc.line == uint32_t(a.red0) ||
           c.loc.line == uint32_t(a.red1)));
  }
}

TEST_CASE("verify: mk.verify.E004 for every dropped wait of built-in ring schedules") {
  for (const char* name : {"allreduce.ring", "allgather.ring", "reducescatter.ring"}) {
    for (size_t v = 0; v < 2; ++v) {
      auto l = lower(dsl::build(*dsl::find_schedule(name), 3));
      REQUIRE(l.variants.size() == 2);
      const ir::Schedule& s = l.variants[v];
      const size_t waits = count_kind(s, ir::OpKind::wait);
      CHECK(waits > 0);
      for (size_t k = 0; k < waits; ++k) {
        CAPTURE(name);
        CAPTURE(v);
        CAPTURE(k);
        ir::Schedule b = s;
        REQUIRE(drop_wait(b, k));
        auto c = catch_error([&] { verify::verify_sync(b); });
        CHECK(c.id == "mk.verify.E004");
      }
    }
  }
}

TEST_CASE("verify: mk.verify.E004 two thread blocks write one chunk without sync (hand-written)") {
  auto ok = hand_synced("allreduce", 1, 0, 1, 1, "simple",
                        {copy(0, 0, "r0.in[0]", "r0.out[0]"), signal(0, 0, 0, 0), wait(0, 1, 0),
                         copy(0, 1, "r0.in[0]", "r0.out[0]")});
  CHECK_FALSE(catch_error([&] { verify::verify_sync(ok); }));
  auto bad = hand_synced("allreduce", 1, 0, 0, 1, "simple",
                         {copy(0, 0, "r0.in[0]", "r0.out[0]"), copy(0, 1, "r0.in[0]", "r0.out[0]")});
  auto c = catch_error([&] { verify::verify_sync(bad); });
  CHECK(c.id == "mk.verify.E004");
  CHECK(contains(c.message, "race on r0.out[0] within a step"));
  CHECK(contains(c.message, "%0 (copy on rank 0, tb 0, step 0) and %1 (copy on rank 0, tb 1, step 1)"));
}

TEST_CASE("verify: mk.verify.E004 a race that exists only in place") {
  // tb 0 reads the input while tb 1 writes the output: separate buffers out of
  // place, the same memory in place.
  auto bad = hand_synced("allreduce", 1, 2, 0, 1, "simple",
                         {copy(0, 1, "r0.in[0]", "r0.sc[0]"), copy(0, 0, "r0.sc[1]", "r0.out[0]")});
  auto c = catch_error([&] { verify::verify_sync(bad); });
  CHECK(c.id == "mk.verify.E004");
  CHECK(contains(c.message, "race on r0.out[0] within a step (in-place)"));
}

TEST_CASE("verify: mk.verify.E004 scratch reused by the next step before it is read") {
  // tb 0 fills a scratch slot, tb 1 drains it. Without the iter -depth wait,
  // tb 0 may refill the slot `depth` steps later before tb 1 has read it.
  auto bad = hand_synced("allreduce", 1, 1, 1, 2, "simple",
                         {copy(0, 0, "r0.in[0]", "r0.sc[0]"), signal(0, 0, 0, 0), wait(0, 1, 0),
                          copy(0, 1, "r0.sc[0]", "r0.out[0]")});
  auto c = catch_error([&] { verify::verify_sync(bad); });
  CHECK(c.id == "mk.verify.E004");
  CHECK(contains(c.message, "race on r0.sc[0] between steps (scratch reuse)"));
  CHECK(contains(c.message, "%3 (copy on rank 0, tb 1, step 3)"));
}

TEST_CASE("verify: mk.verify.E005 waits that form a cycle") {
  // Hand-written: each rank waits for the other before signalling it.
  auto bad = hand_synced("allreduce", 2, 0, 1, 1, "simple",
                         {wait(0, 0, 0), copy(0, 0, "r0.in[0]", "r0.out[0]"), signal(0, 0, 1, 0), wait(1, 0, 0),
                          copy(1, 0, "r1.in[0]", "r1.out[0]"), signal(1, 0, 0, 0)});
  auto c = catch_error([&] { verify::verify_sync(bad); });
  CHECK(c.id == "mk.verify.E005");
  CHECK(contains(c.message, "deadlock: a cycle of"));
  CHECK(contains(c.message, "(wait on rank 0, tb 0, step 0) [rank 0 tb 0]"));
  CHECK(contains(c.message, "(wait on rank 1, tb 0, step 0) [rank 1 tb 0]"));

  // From the DSL: a lowered schedule with one extra wait/signal pair that
  // closes a cycle. tb X on rank A waits (slot s) for rank B's signal; make
  // rank B's signalling block first wait for a new signal that A sends after
  // its wait.
  Ar2 a;
  ir::Schedule s = simple_variant(a.build());
  size_t wi = 0;
  while (wi < s.ops.size() && !(s.ops[wi].kind == ir::OpKind::wait && s.ops[wi].iter == 0)) ++wi;
  REQUIRE(wi < s.ops.size());
  const ir::Op w = s.ops[wi];
  size_t si = 0;
  while (si < s.ops.size() &&
         !(s.ops[si].kind == ir::OpKind::signal && s.ops[si].peer == w.rank && s.ops[si].slot == w.slot))
    ++si;
  REQUIRE(si < s.ops.size());
  const ir::Op sig = s.ops[si];
  REQUIRE((sig.rank != w.rank || sig.tb != w.tb));
  ir::Op w2;
  w2.id = s.next_id();
  w2.kind = ir::OpKind::wait;
  w2.rank = sig.rank;
  w2.tb = sig.tb;
  w2.slot = s.slots;
  w2.loc = s.ops[si].loc;
  ir::Op s2;
  s2.id = w2.id + 1;
  s2.kind = ir::OpKind::signal;
  s2.rank = w.rank;
  s2.tb = w.tb;
  s2.peer = sig.rank;
  s2.slot = s.slots;
  s2.loc = w.loc;
  s.slots += 1;
  // the new signal right after A's wait; the new wait first in B's block
  s.ops.insert(s.ops.begin() + std::ptrdiff_t(wi + 1), s2);
  size_t first_of_b = 0;
  while (!(s.ops[first_of_b].rank == sig.rank && s.ops[first_of_b].tb == sig.tb)) ++first_of_b;
  s.ops.insert(s.ops.begin() + std::ptrdiff_t(first_of_b), w2);
  c = catch_error([&] { verify::verify_sync(s); });
  CHECK(c.id == "mk.verify.E005");
  CHECK(contains(c.message, "test.ar2: deadlock"));
  CHECK(contains(c.message, "rank " + std::to_string(w.rank) + " tb " + std::to_string(w.tb)));
  CHECK(contains(c.message, "rank " + std::to_string(sig.rank) + " tb " + std::to_string(sig.tb)));
  CHECK(here(c.loc));
}

TEST_CASE("verify: mk.verify.E011 unpaired signal or wait") {
  Ar2 a;
  ir::Schedule s = simple_variant(a.build());
  // Signals pair with waits through a dense (rank, slot) table where slots are
  // few, else by sorting: sparse slot numbers take the second way, which must
  // accept and refuse the same schedules with the same message.
  const auto sparse = [](ir::Schedule x) {
    for (auto& op : x.ops)
      if (op.kind == ir::OpKind::signal || op.kind == ir::OpKind::wait) op.slot = op.slot * 1000003 + 900001;
    x.slots = x.slots * 1000003 + 900001;
    return x;
  };
  const auto same_both_ways = [&](const ir::Schedule& x) {
    const auto d = catch_error([&] { verify::verify_sync(x); });
    const auto w = catch_error([&] { verify::verify_sync(sparse(x)); });
    CHECK(d.id == w.id);
    std::string back = w.message;
    for (int slot = 0; slot < 64; ++slot)
      for (size_t at; (at = back.find(std::to_string(slot * 1000003 + 900001))) != std::string::npos;)
        back.replace(at, std::to_string(slot * 1000003 + 900001).size(), std::to_string(slot));
    CHECK(back == d.message);
    return d;
  };
  CHECK_FALSE(catch_error([&] { verify::verify_sync(sparse(s)); }));
  // a wait whose signal is gone
  {
    ir::Schedule b = s;
    size_t i = 0;
    while (b.ops[i].kind != ir::OpKind::signal) ++i;
    const ir::Op sig = b.ops[i];
    b.ops.erase(b.ops.begin() + std::ptrdiff_t(i));
    auto c = same_both_ways(b);
    CHECK(c.id == "mk.verify.E011");
    CHECK(contains(c.message, "waits on slot " + std::to_string(sig.slot) + " of rank " + std::to_string(sig.peer) +
                                  ", which nothing signals"));
    CHECK(contains(c.message, "(wait on rank " + std::to_string(sig.peer)));
    CHECK(here(c.loc));
  }
  // a signal nobody waits for
  {
    ir::Schedule b = s;
    size_t i = 0;
    while (b.ops[i].kind != ir::OpKind::wait) ++i;
    b.ops.erase(b.ops.begin() + std::ptrdiff_t(i));
    auto c = same_both_ways(b);
    CHECK(c.id == "mk.verify.E011");
    CHECK(contains(c.message, "but nothing waits on it"));
    CHECK(contains(c.message, "(signal on rank "));
  }
  // two signallers for one slot
  {
    auto b = hand_synced("allreduce", 1, 0, 1, 1, "simple",
                         {copy(0, 0, "r0.in[0]", "r0.out[0]"), signal(0, 0, 0, 0), signal(0, 1, 0, 0), wait(0, 2, 0)});
    auto c = same_both_ways(b);
    CHECK(c.id == "mk.verify.E011");
    CHECK(contains(c.message, "slot 0 of rank 0 is signalled by 2 ops"));
  }
  // a wait reaching further back than the scratch depth
  {
    auto b = hand_synced("allreduce", 1, 0, 1, 2, "simple",
                         {copy(0, 0, "r0.in[0]", "r0.out[0]"), signal(0, 0, 0, 0), wait(0, 1, 0, -3)});
    auto c = catch_error([&] { verify::verify_sync(b); });
    CHECK(c.id == "mk.verify.E011");
    CHECK(contains(c.message, "waits 3 steps back"));
  }
}

TEST_CASE("verify: mk.verify.E014 an LL scratch slot written twice in one step") {
  // Rank 1 reuses its scratch slot 0 for a second value within the step: fine
  // with flags (simple), impossible with LL, whose flag lives in the data.
  Program p(Collective::allreduce, 2, 0, "test.e014");
  p.copy(p.scratch(1, 0), p.input(0, 0));
  p.reduce(p.output(1, 0), {p.input(1, 0), p.scratch(1, 0)});
  const int line = __LINE__ + 1;
  p.copy(p.scratch(1, 0), p.output(1, 0));
  p.copy(p.output(0, 0), p.scratch(1, 0));
  ir::Schedule built = std::move(p.ir());

  auto l = lower(built);
  REQUIRE(l.variants.size() == 1);  // LL is not offered for this schedule
  ir::Schedule s = l.variants[0];
  CHECK(s.proto == ir::Proto::simple);
  CHECK_FALSE(catch_error([&] { verify::verify_sync(s); }));
  s.proto = ir::Proto::ll;
  auto c = catch_error([&] { verify::verify_sync(s); });
  CHECK(c.id == "mk.verify.E014");
  CHECK(contains(c.message, "LL scratch slot r1.sc[0] is written by %0 (copy on rank 0"));
  CHECK(contains(c.message, "(copy on rank 1, tb "));
  CHECK(contains(c.message, "in one step"));
  CHECK(here(c.loc));
  CHECK(c.loc.line == uint32_t(line));

  // Asking for LL explicitly is a user error at the command-line level.
  compiler::LowerOptions o;
  o.proto.forced_proto = int(ir::Proto::ll);
  c = catch_error([&] { compiler::lower(built, o); });
  CHECK(c.id == "mk.cli.E013");
  CHECK(contains(c.message, "test.e014"));
}

TEST_CASE("verify: happens-before orders program order and signal/wait pairs") {
  auto s = hand_synced("allreduce", 1, 1, 2, 2, "simple",
                       {wait(0, 0, 1, -2), copy(0, 0, "r0.in[0]", "r0.sc[0]"), signal(0, 0, 0, 0), wait(0, 1, 0),
                        copy(0, 1, "r0.sc[0]", "r0.out[0]"), signal(0, 1, 0, 1)});
  auto hb = verify::build_hb(s);
  CHECK(hb.topo.size() == s.ops.size());
  CHECK(hb.before(1, 4));  // the fill before the drain in a step
  CHECK_FALSE(hb.before(4, 1));
  CHECK(hb.before_reuse(4, 1));  // the drain of step g before the fill of step g+2
  CHECK(hb.before_reuse(1, 1));
  // without the signal/wait pair the two copies are unordered
  auto t = hand_synced("allreduce", 1, 1, 0, 2, "simple",
                       {copy(0, 0, "r0.in[0]", "r0.sc[0]"), copy(0, 1, "r0.sc[0]", "r0.out[0]")});
  auto hb2 = verify::build_hb(t);
  CHECK_FALSE(hb2.before(0, 1));
  CHECK_FALSE(hb2.before(1, 0));
}

TEST_CASE("verify: mk.verify.E013 is raised by `mkc simulate` only") {
  // E013 ("simulated execution gave a wrong result") is not raised by the
  // library: verify::simulate() returns SimResult{ok=false} and `mkc simulate`
  // turns that into mk.verify.E013. A schedule that reaches simulation has
  // already been proved by verify_semantics/verify_sync, so through the CLI
  // E013 means a bug in lowering, codegen-equivalent arithmetic or the
  // executor, and no user input is known to produce it. test_executor.cpp
  // shows simulate() reporting ok=false for broken lowered schedules.
  ErrId id{};
  CHECK(err_parse("mk.verify.E013", &id));
  CHECK(err_name(id) == "mk.verify.E013");
  CHECK(err_summary(id) == "simulated execution gave a wrong result");
}

// An op's chunks are processed position by position, in parallel: a source
// chunk that is another position's destination has no defined order.
TEST_CASE("verify: mk.verify.E004 for an op whose source and destination overlap at different positions") {
  mk::dsl::Program p(mk::Collective::allreduce, 2);
  p.chunks(2);
  p.copy(p.scratch(0, 0, 2), p.input(0, 0, 2));
  p.copy(p.scratch(0, 1, 2), p.scratch(0, 0, 2));  // sc[1:3] := sc[0:2]
  auto& s = p.ir();
  try {
    mk::verify::verify_bounds(s);
    FAIL("not rejected");
  } catch (const mk::Error& e) {
    CHECK(e.id() == mk::ErrId::verify_E004);
    CHECK(std::string(e.what()).find("execution order") != std::string::npos);
  }
}

// ---- soundness holes (issue 9) ---------------------------------------------

// The kernel addresses a chunk by its index and sizes it by the data's
// position; a copy into another position of the block wrote past the end of
// the receive buffer at odd counts, and was proved because the final state
// looked right.
TEST_CASE("verify: mk.verify.E008 a copy that moves a chunk to another position of its block") {
  auto build = [](bool misplace, int& line) {
    Program p(Collective::allreduce, 2, 0, "test.moved");
    p.chunks(2);
    line = __LINE__ + 1;
    if (misplace) p.copy(p.output(0, 1), p.input(0, 0));  // position 0 into position 1
    for (int r = 0; r < 2; ++r)  // through scratch: in place, the outputs are the inputs
      for (int j = 0; j < 2; ++j) p.reduce(p.scratch(r, j), {p.input(0, j), p.input(1, j)});
    for (int r = 0; r < 2; ++r) p.copy(p.output(r, 0, 2), p.scratch(r, 0, 2));  // fixes it up
    return std::move(p.ir());
  };
  int line = 0;
  CHECK_FALSE(catch_error([&] { lower(build(false, line)); }));
  auto c = catch_error([&] { lower(build(true, line)); });
  CHECK(c.id == "mk.verify.E008");
  CHECK(contains(c.message, "%0 (copy on rank 0, step 0) writes data of chunk position 0 into r0.out[1], which is at "
                            "position 1 of its block"));
  CHECK(c.loc.line == uint32_t(line));
  CHECK(here(c.loc));
}

TEST_CASE("verify: every data op of a lowered schedule addresses the chunk position it sizes by") {
  // What codegen relies on (address from the ref's index, length from op.pos):
  // for every built-in at a few rank counts, every user-buffer ref agrees.
  for (const auto& info : dsl::registered_schedules())
    for (int n : {2, 3, 5}) {
      CAPTURE(info.name);
      CAPTURE(n);
      auto l = lower(dsl::build(info, n));
      for (const auto& v : l.variants)
        for (const auto& op : v.ops)
          for (const auto* list : {&op.srcs, &op.dsts})
            for (const auto& r : *list)
              if (r.buf != ir::Buf::scratch)
                for (int32_t k = 0; k < r.count; ++k) REQUIRE((r.index + k) % v.chunks == op.pos.at(size_t(k)));
    }
}

TEST_CASE("verify: codegen refuses an op whose position and chunk index disagree") {
  Program p(Collective::allreduce, 2, 0, "test.codegen_pos");
  p.chunks(2);
  for (int r = 0; r < 2; ++r)
    for (int j = 0; j < 2; ++j) p.reduce(p.scratch(r, j), {p.input(0, j), p.input(1, j)});
  for (int r = 0; r < 2; ++r) p.copy(p.output(r, 0, 2), p.scratch(r, 0, 2));
  auto l = lower(std::move(p.ir()));
  CHECK_NOTHROW(codegen::generate(l.variants, DType::fp32, RedOp::sum, "t"));
  for (auto& v : l.variants)
    for (auto& op : v.ops)
      if (op.is_data()) op.pos.assign(op.pos.size(), 0);  // as if sized by position 0
  CHECK_THROWS_AS(codegen::generate(l.variants, DType::fp32, RedOp::sum, "t"), InternalError);
}

TEST_CASE("verify: multi-chunk schedules simulate exactly at counts with short last chunks") {
  for (const char* name : {"allreduce.ring", "allreduce.two_shot"})
    for (int64_t count : {1, 7, 13, 33, 1001}) {
      CAPTURE(name);
      CAPTURE(count);
      auto l = lower(dsl::build(*dsl::find_schedule(name), 3));
      REQUIRE(l.variants.front().chunks > 1);
      for (const auto& v : l.variants)
        for (bool inplace : {false, true}) {
          verify::SimOptions o;
          o.count = count;
          o.inplace = inplace;
          o.dtype = DType::int32;
          auto r = verify::simulate(v, o);
          CHECK_MESSAGE(r.ok, r.first_bad);
        }
    }
}

TEST_CASE("verify: mk.verify.E004 one op writes a chunk twice through overlapping destinations") {
  auto build = [](int second) {
    Program p(Collective::allreduce, 1, 0, "test.dst_overlap");
    p.chunks(2);
    p.copy({p.scratch(0, 0, 2), p.scratch(0, second, 2)}, p.input(0, 0, 2));
    p.copy(p.output(0, 0, 2), p.scratch(0, 0, 2));
    return std::move(p.ir());
  };
  CHECK_FALSE(catch_error([&] { lower(build(2)); }));
  auto c = catch_error([&] { lower(build(1)); });  // {sc[0:2], sc[1:3]}: sc[1] twice
  INFO(c.message);
  CHECK(c.id == "mk.verify.E004");
  CHECK(contains(c.message, "%0 (copy on rank 0, step 0) writes r0.sc[1] twice, as chunk 0 of r0.sc[1:3] and as chunk "
                            "1 of r0.sc[0:2]"));
  // in-place, an input destination is rejected before (E009); two output
  // refs naming one chunk at one position are a double write too
  Program q(Collective::allreduce, 1, 0, "test.dst_twice");
  q.copy({q.output(0, 0), q.output(0, 0)}, q.input(0, 0));
  auto d = catch_error([&] { lower(std::move(q.ir())); });
  CHECK(d.id == "mk.verify.E004");
  CHECK(contains(d.message, "names r0.out[0] twice as a destination"));
}

TEST_CASE("verify: rooted collectives are invariant under the runtime's relabelling") {
  // The proof for root 0 covers every root because the kernel runs rank r as
  // (r - root) mod n and each rooted collective's meaning rotates with it.
  for (Collective c : {Collective::broadcast, Collective::reduce})
    for (int n = 1; n <= 6; ++n)
      for (int root = 0; root < n; ++root)
        for (int v = 0; v < n; ++v) {
          const int r = (v + root) % n;
          CAPTURE(name(c));
          CAPTURE(n);
          CAPTURE(root);
          CHECK(has_input(c, r, root) == has_input(c, v, 0));
          CHECK(has_output(c, r, root) == has_output(c, v, 0));
          for (ir::Buf b : {ir::Buf::input, ir::Buf::output}) CHECK(ir::buf_blocks(c, n, b) == 1);
          if (!has_output(c, v, 0)) continue;
          BlockSource at0 = output_source(c, 0, v, 0), atr = output_source(c, root, r, 0);
          CHECK(atr.in_block == at0.in_block);
          CHECK(atr.from == (at0.from == BlockSource::kAllRanks ? at0.from : (at0.from + root) % n));
        }
}

TEST_CASE("verify: a broadcast that ignores its root is right for every root by relabelling") {
  // Hard-codes rank 0 as the sender instead of p.root(): plans are built for
  // root 0, so this is correct; the simulation at other roots shows it.
  Program p(Collective::broadcast, 3, 0, "test.bcast_rank0");
  for (int r = 0; r < 3; ++r) p.copy(p.output(r, 0), p.input(0, 0));
  ir::Schedule s = std::move(p.ir());
  for (int root = 0; root < 3; ++root) CHECK_NOTHROW(verify::verify_root(s, root));
  auto l = lower(s);
  for (int root = 0; root < 3; ++root) {
    verify::SimOptions o;
    o.root = root;
    o.count = 1001;
    auto r = verify::simulate(l.variants.back(), o);
    CHECK_MESSAGE(r.ok, r.first_bad);
  }
}

TEST_CASE("verify: a schedule written for another root is lowered for root 0") {
  // An IR file may carry root 1; the kernel relabels for the caller's root as
  // if the plan were for root 0, so lower() must relabel it to root 0 first
  // (it used to keep root 1: proved, then relabelled twice at run time).
  Program q(Collective::broadcast, 3, 1, "test.bcast_root1");
  for (int r = 0; r < 3; ++r) q.copy(q.output(r, 0), q.input(1, 0));
  ir::Schedule s = std::move(q.ir());
  for (int root = 0; root < 3; ++root) CHECK_NOTHROW(verify::verify_root(s, root));
  auto l = lower(s);
  for (const auto& v : l.variants) CHECK(v.root == 0);
  for (int root = 0; root < 3; ++root) {
    verify::SimOptions o;
    o.root = root;
    o.count = 333;
    auto r = verify::simulate(l.variants.back(), o);
    CHECK_MESSAGE(r.ok, r.first_bad);
  }
}

TEST_CASE("verify: mk.verify.E001 for an output nothing wrote points at the declaration") {
  const int line = __LINE__ + 1;
  Program p(Collective::allreduce, 2, 0, "test.unwritten");
  p.reduce(p.output(0, 0), {p.input(0, 0), p.input(1, 0)});
  auto c = lower_error(p);
  CHECK(c.id == "mk.verify.E001");
  CHECK(contains(c.message, "rank 1 output chunk 0 misses the contribution of rank 0 input chunk 0; nothing wrote it"));
  CHECK(c.loc.line == uint32_t(line));
  CHECK(here(c.loc));
  CHECK(contains(c.what, "write rank 1's output chunk 0"));
  // a registered schedule points at its MK_SCHEDULE line
  ir::Schedule s = dsl::build(*dsl::find_schedule("allreduce.ring"), 2);
  CHECK(contains(s.loc.file, "allreduce_ring.cpp"));
  CHECK(s.loc.line > 0);
}

TEST_CASE("verify: mk.verify.E001 gives the trail of a lost contribution") {
  Program p(Collective::allreduce, 3, 0, "test.lost");
  p.reduce(p.scratch(0, 0), {p.input(0, 0), p.input(1, 0)});  // %0: ranks 0 and 1
  p.copy(p.scratch(0, 0), p.input(2, 0));                      // %1 (pushed by rank 2): overwrites it
  p.reduce(p.output(0, 0), {p.input(0, 0), p.scratch(0, 0)});  // %2: ranks 0 and 2
  auto c = lower_error(p);
  INFO(c.message);
  CHECK(c.id == "mk.verify.E001");
  CHECK(contains(c.message, "rank 0 output chunk 0 misses the contribution of rank 1 input chunk 0; last written by "
                            "%2 (reduce on rank 0, step 1)"));
  CHECK(contains(c.message, "trail: rank 1 input chunk 0 was last carried by %0 (reduce on rank 0, step 0), which "
                            "wrote r0.sc[0] (2 of 3 contributions); it was overwritten by %1 (copy on rank 2, step 0) "
                            "before anything read it"));
  // read but dropped: the partial is read by an op whose result goes elsewhere
  Program q(Collective::allreduce, 2, 0, "test.dropped");
  q.reduce(q.scratch(0, 0), {q.input(0, 0), q.input(1, 0)});  // %0: complete
  q.copy(q.scratch(0, 1), q.scratch(0, 0));                    // %1: read, result unused
  q.copy(q.output(0, 0), q.input(0, 0));                       // %2
  auto d = lower_error(q);
  CHECK(d.id == "mk.verify.E001");
  CHECK(contains(d.message, "was last carried by %1 (copy on rank 0, step 1), which wrote r0.sc[1] (2 of 2 "
                            "contributions); nothing read it afterwards"));
}

TEST_CASE("verify: mk.verify.E015 ranks that reduce in different orders") {
  auto build = [](bool by_rank) {
    Program p(Collective::allreduce, 3, 0, "test.order");
    for (int r = 0; r < 3; ++r) {
      std::vector<dsl::Chunk> srcs{p.input(r, 0)};  // own input first
      for (int q = 0; q < 3; ++q)
        if (q != r) srcs.push_back(p.input(q, 0));
      if (by_rank) srcs = {p.input(0, 0), p.input(1, 0), p.input(2, 0)};
      p.reduce(p.scratch(r, 0), srcs);
    }
    for (int r = 0; r < 3; ++r) p.copy(p.output(r, 0), p.scratch(r, 0));
    return std::move(p.ir());
  };
  CHECK_NOTHROW(verify::verify_deterministic(build(true)));
  ir::Schedule s = build(false);
  CHECK_NOTHROW(verify::verify_semantics(s));  // correct, just not bit-identical
  auto c = catch_error([&] { verify::verify_deterministic(s); });
  CHECK(c.id == "mk.verify.E015");
  // rank 0 and 1 both add (in0 + in1) first, then in2; rank 2 adds (in2 + in0) first
  CHECK(contains(c.message, "ranks 0 and 2 combine the contributions to input chunk 0 in different orders"));
  CHECK(contains(c.message, "last written by %5 (copy on rank 2, step 1)"));
}

// Every rank reduces its n sources in one reduce (one rounding), except rank
// 1, which reduces sources 0 and 1 into scratch first (two roundings): the
// same tree shape, different rounding points (the 2026-12-05 probe).
ir::Schedule rounds_apart(int n, bool apart = true) {
  Program p(Collective::allreduce, n, 0, "test.rounds_apart");
  for (int r = 0; r < n; ++r) {
    std::vector<dsl::Chunk> srcs;
    for (int q = 0; q < n; ++q) srcs.push_back(p.input(q, 0));
    if (r == 1 && apart) {
      p.reduce(p.scratch(r, 0), {srcs[0], srcs[1]});  // MARK-round-partial
      std::vector<dsl::Chunk> rest{p.scratch(r, 0)};
      for (int q = 2; q < n; ++q) rest.push_back(srcs[size_t(q)]);
      p.reduce(p.scratch(r, 1), rest);
    } else {
      p.reduce(p.scratch(r, 1), srcs);
    }
  }
  for (int r = 0; r < n; ++r) p.copy(p.output(r, 0), p.scratch(r, 1));
  return std::move(p.ir());
}

TEST_CASE("verify: mk.verify.E015 ranks that round a reduction at different points (fp16, bf16, fp8)") {
  CHECK_NOTHROW(verify::verify_deterministic(rounds_apart(3, false)));
  const ir::Schedule s = rounds_apart(3);
  CHECK_NOTHROW(verify::verify_semantics(s));  // correct, just not bit-identical in narrow dtypes
  const verify::Orders o = verify::nondeterminism(s);
  CHECK(o.order.empty());  // the same order: fp32 and fp64 agree
  CHECK(contains(o.rounding, "ranks 0 and 1 combine the contributions to input chunk 0 in the same order but round "
                             "at different points"));
  CHECK(contains(o.rounding, "%1 (reduce on rank 1, step 0) at test_verify.cpp:"));  // the rounding op and its line
  CHECK(contains(o.rounding, "stores a partial result of 2 of the 3 contributions"));
  CHECK(contains(o.rounding, "%0 (reduce on rank 0, step 0)"));  // the rank that does not round there
  CHECK(o.rounding_loc.line == uint32_t(mkt::line_of(__FILE__, "MARK-round-partial")));
  // which calls it matters for
  for (DType t : {DType::fp16, DType::bf16, DType::fp8e4m3, DType::fp8e5m2}) {
    CAPTURE(name(t));
    auto c = catch_error([&] { verify::verify_deterministic(s, t); });
    CHECK(c.id == "mk.verify.E015");
    CHECK(here(c.loc));
    CHECK(contains(c.what, "reduce in one op"));
    CHECK_NOTHROW(verify::verify_deterministic(s, t, RedOp::max));  // min and max round nothing
  }
  CHECK(catch_error([&] { verify::verify_deterministic(s); }).id == "mk.verify.E015");  // any dtype
  for (DType t : {DType::fp32, DType::fp64, DType::int32, DType::uint8, DType::int64})
    CHECK_NOTHROW(verify::verify_deterministic(s, t));
  // the order case matters for every float dtype but not for integers, min or max
  Program q(Collective::allreduce, 3, 0, "test.order2");
  for (int r = 0; r < 3; ++r) {
    std::vector<dsl::Chunk> srcs{q.input(r, 0)};  // own input first
    for (int k = 0; k < 3; ++k)
      if (k != r) srcs.push_back(q.input(k, 0));
    q.reduce(q.scratch(r, 0), srcs);
  }
  for (int r = 0; r < 3; ++r) q.copy(q.output(r, 0), q.scratch(r, 0));
  const ir::Schedule ord = q.ir();
  for (DType t : {DType::fp32, DType::fp64, DType::bf16})
    CHECK(catch_error([&] { verify::verify_deterministic(ord, t, RedOp::prod); }).id == "mk.verify.E015");
  CHECK_NOTHROW(verify::verify_deterministic(ord, DType::int32, RedOp::sum));
  CHECK_NOTHROW(verify::verify_deterministic(ord, DType::fp32, RedOp::min));
}

TEST_CASE("simulate: data whose partial sums round shows ranks that round apart, exact data cannot") {
  const compiler::Lowered l = lower(rounds_apart(3));
  for (DType t : {DType::bf16, DType::fp16}) {
    CAPTURE(name(t));
    verify::SimOptions so;
    so.dtype = t;
    so.count = 777;
    const verify::SimResult exact = verify::simulate(l.variants.back(), so);
    CHECK(exact.ok);  // every partial sum exact: the rounding points cannot show
    so.inexact = true;
    const verify::SimResult r = verify::simulate(l.variants.back(), so);
    CHECK(r.mismatches == 0);  // every value within the float64 bound ...
    CHECK(r.rank_diffs > 0);   // ... but rank 1's bits differ
    CHECK(contains(r.first_diff, "rank 1 element"));
    CHECK(contains(r.first_diff, "differs bit-wise from rank 0's"));
    CHECK(!r.ok);
  }
  // the same schedule written with one rounding point everywhere agrees bit for bit
  verify::SimOptions so;
  so.dtype = DType::bf16;
  so.count = 777;
  so.inexact = true;
  CHECK(verify::simulate(lower(rounds_apart(3, false)).variants.back(), so).ok);
  so.dtype = DType::fp32;  // the same order: fp32 agrees
  CHECK(verify::simulate(l.variants.back(), so).ok);
}

TEST_CASE("simulate: every built-in all-reduce is bit-identical across ranks on data whose partial sums round") {
  for (const auto& info : dsl::registered_schedules()) {
    if (info.coll != Collective::allreduce) continue;
    for (int n : {2, 3, 4, 5, 8}) {
      ir::Schedule raw;
      try {
        raw = dsl::build(info, n);
      } catch (const Error&) {
        continue;  // not for this rank count (hierarchical shapes)
      }
      const compiler::Lowered l = lower(raw);
      for (size_t b = 0; b < l.variants.size(); ++b)
        for (DType t : {DType::bf16, DType::fp16, DType::fp8e4m3})
          for (RedOp op : {RedOp::sum, RedOp::avg}) {
            CAPTURE(info.name);
            CAPTURE(n);
            CAPTURE(b);
            CAPTURE(name(t));
            CAPTURE(name(op));
            verify::SimOptions so;
            so.dtype = t;
            so.op = op;
            so.count = 301;
            so.inexact = true;
            so.launches = 1;
            const verify::SimResult r = verify::simulate(l.variants[b], so);
            CHECK(r.mismatches == 0);
            CHECK(r.rank_diffs == 0);
          }
    }
  }
}

TEST_CASE("lower with orders answers verify_deterministic, as written and as lowered, in its own runs") {
  // The schedule of the E015 case above: each rank adds its own input first.
  Program p(Collective::allreduce, 3, 0, "test.order");
  for (int r = 0; r < 3; ++r) {
    std::vector<dsl::Chunk> srcs{p.input(r, 0)};
    for (int q = 0; q < 3; ++q)
      if (q != r) srcs.push_back(p.input(q, 0));
    p.reduce(p.scratch(r, 0), srcs);
  }
  for (int r = 0; r < 3; ++r) p.copy(p.output(r, 0), p.scratch(r, 0));
  const ir::Schedule s = p.ir();
  compiler::LowerOptions o;
  o.orders = true;
  ir::Schedule analyzed;  // as lowered: the data ops the variants run, before thread blocks
  o.on_pass = [&](std::string_view pass, const ir::Schedule& x, const compiler::PassInfo&) {
    if (pass == "analyze") analyzed = x;
  };
  const compiler::Lowered l = compiler::lower(s, o);
  o.on_pass = nullptr;
  CHECK(contains(l.nondeterministic_written.order, "ranks 0 and 2 combine the contributions to input chunk 0"));
  CHECK(l.nondeterministic_written.order == verify::nondeterminism(s).order);
  CHECK(l.nondeterministic_lowered.order == verify::nondeterminism(analyzed).order);
  CHECK(contains(verify::nondeterminism(l.variants.front()).order, "ranks 0 and 2 combine"));
  CHECK(verify::nondeterministic_error(l.nondeterministic_written).id() == ErrId::verify_E015);
  // not asked: not answered
  const compiler::Lowered quiet = compiler::lower(s, {});
  CHECK(quiet.nondeterministic_written.empty());
  CHECK(quiet.nondeterministic_lowered.empty());
  // Every built-in, rooted ones also as written for root 1 (relabelled before
  // the proof): the answers of separate runs.
  for (const auto& info : dsl::registered_schedules())
    for (int n : {3, 4}) {
      CAPTURE(info.name);
      CAPTURE(n);
      std::vector<ir::Schedule> forms{dsl::build(info, n)};
      if (collective_rooted(info.coll)) forms.push_back(verify::rotate_root(forms[0], 1));
      for (const ir::Schedule& raw : forms) {
        const compiler::Lowered x = compiler::lower(raw, o);
        CHECK(x.nondeterministic_written.order == verify::nondeterminism(raw).order);
        CHECK(x.nondeterministic_written.rounding == verify::nondeterminism(raw).rounding);
        verify::Orders lowered;
        for (const auto& v : x.variants)
          if (lowered.empty()) lowered = verify::nondeterminism(v);
        CHECK(x.nondeterministic_lowered.empty() == lowered.empty());
      }
    }
}

TEST_CASE("verify: built-in schedules are deterministic across ranks") {
  for (const auto& info : dsl::registered_schedules())
    for (int n : {2, 3, 4, 5, 8}) {
      CAPTURE(info.name);
      CAPTURE(n);
      ir::Schedule raw = dsl::build(info, n);
      CHECK_NOTHROW(verify::verify_deterministic(raw));
      for (const auto& v : lower(raw).variants) CHECK_NOTHROW(verify::verify_deterministic(v));
    }
}

TEST_CASE("verify: sparse scratch slots are compacted, mk.verify.E016 a plan over the communicator's scratch") {
  Program p(Collective::allreduce, 2, 0, "test.sparse");
  p.chunks(2);
  p.copy(p.scratch(1, 0, 2), p.input(0, 0, 2));
  p.copy(p.scratch(0, 1000000, 2), p.input(1, 0, 2));
  p.copy(p.scratch(0, 2000000), p.input(1, 1));  // a third, lone slot
  p.reduce(p.output(0, 0, 2), {p.input(0, 0, 2), p.scratch(0, 1000000, 2)});
  p.reduce(p.output(1, 0, 2), {p.scratch(1, 0, 2), p.input(1, 0, 2)});
  CHECK(p.ir().scratch == 2000001);
  const auto t0 = std::chrono::steady_clock::now();
  auto l = lower(std::move(p.ir()));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  for (const auto& v : l.variants) {
    CHECK(v.scratch <= 5 + 2 * 2);  // 5 slots used, plus what staging adds
    CHECK(verify::scratch_bytes(v) < (int64_t(64) << 20));
    CHECK_NOTHROW(verify::verify_resources(v));
  }
  // compacting keeps runs together and the order of slots
  auto c = passes::compact_scratch(dsl::build(*dsl::find_schedule("allreduce.ring"), 3));
  CHECK(c.scratch == dsl::build(*dsl::find_schedule("allreduce.ring"), 3).scratch);
  ir::Schedule raw;
  raw.nranks = 1;
  raw.scratch = 70;
  ir::Op op;
  op.kind = ir::OpKind::copy;
  op.rank = 0;
  op.srcs = {ir::Ref{0, ir::Buf::scratch, 40, 3}};
  op.dsts = {ir::Ref{0, ir::Buf::scratch, 9, 3}};
  raw.ops = {op, op};
  raw.ops[1].srcs = {ir::Ref{0, ir::Buf::scratch, 41, 3}};  // overlaps 40..42: one run 40..43
  auto d = passes::compact_scratch(raw);
  CHECK(d.scratch == 7);
  CHECK(d.ops[0].dsts[0] == ir::Ref{0, ir::Buf::scratch, 0, 3});
  CHECK(d.ops[0].srcs[0] == ir::Ref{0, ir::Buf::scratch, 3, 3});
  CHECK(d.ops[1].srcs[0] == ir::Ref{0, ir::Buf::scratch, 4, 3});

  // more scratch than MK_SCRATCH_BYTES' default is refused
  ir::Schedule big = l.variants.back();
  big.scratch = int32_t(verify::kDefaultScratchBytes / (big.tile_bytes * big.depth * big.instances) + 1);
  auto e = catch_error([&] { verify::verify_resources(big); });
  CHECK(e.id == "mk.verify.E016");
  CHECK(contains(e.message, fmt::format("{} slot(s)", big.scratch)));
  CHECK(contains(e.message, "MK_SCRATCH_BYTES"));
}

TEST_CASE("verify: access needs handed to verify_sync are checked to be the schedule's") {
  // The pipeline computes the needs once, before insert_sync, for the sync and
  // its proof. verify_sync maps them onto the synced schedule only when the
  // schedule they came from has its data ops, root and protocol.
  int races = 0;
  for (const char* name : {"allreduce.two_shot", "allgather.hier"}) {
    CAPTURE(name);
    const auto* info = dsl::find_schedule(name);
    REQUIRE(info);
    std::vector<ir::Schedule> before, after;
    compiler::LowerOptions o;
    o.on_pass = [&](std::string_view pass, const ir::Schedule& x, const compiler::PassInfo&) {
      if (pass == "protocol") before.push_back(x);
      if (pass == "sync") after.push_back(x);
    };
    compiler::lower(dsl::build(*info, 4, 0), o);
    REQUIRE(!before.empty());
    REQUIRE(before.size() == after.size());
    for (size_t b = 0; b < before.size(); ++b) {
      const bool ll = before[b].proto == ir::Proto::ll;
      const verify::DataNeeds needs = verify::data_needs(before[b], ll);
      const auto with = [&](const ir::Schedule& s, const ir::Schedule& pre, const verify::DataNeeds& d) {
        return catch_error([&] { verify::verify_sync_budget(s, verify::kClockBudget, verify::SymMode::automatic, {&pre, &d}); });
      };
      CHECK_FALSE(with(after[b], before[b], needs));
      // a race (a signal/wait pair gone) is found the same with the needs handed over
      ir::Schedule racy;
      Caught own;
      for (size_t i = 0; i < after[b].ops.size() && own.id.empty(); ++i) {
        if (after[b].ops[i].kind != ir::OpKind::wait || after[b].ops[i].iter != 0) continue;
        racy = after[b];
        const int32_t rank = racy.ops[i].rank, slot = racy.ops[i].slot;
        racy.ops.erase(racy.ops.begin() + std::ptrdiff_t(i));
        std::erase_if(racy.ops, [&](const ir::Op& op) {
          return op.kind == ir::OpKind::signal && op.peer == rank && op.slot == slot;
        });
        own = catch_error([&] { verify::verify_sync(racy); });
      }
      if (!own.id.empty()) {  // LL buckets may have no within-step wait
        const auto handed = with(racy, before[b], needs);
        CHECK(own.id == "mk.verify.E004");
        CHECK(own.id == handed.id);
        CHECK(own.message == handed.message);
        ++races;
      }
      // needs of another protocol, of other data ops, of another root: refused
      verify::DataNeeds other = needs;
      other.ll = !ll;
      CHECK(with(after[b], before[b], other).internal);
      verify::DataNeeds stale = needs;  // computed for a schedule with another op count
      stale.ops += 1;
      CHECK(with(after[b], before[b], stale).internal);
      verify::DataNeeds wild = needs;  // a need naming an op that is not a data op there
      if (!wild.out_of_place.within.empty()) {
        wild.out_of_place.within[0].a = uint32_t(before[b].ops.size() + 7);
        CHECK(with(after[b], before[b], wild).internal);
      }
      ir::Schedule moved = before[b];
      for (auto& op : moved.ops)
        if (op.is_data()) {
          op.srcs[0].index ^= 1;
          break;
        }
      CHECK(with(after[b], moved, needs).internal);
      ir::Schedule rooted = before[b];
      rooted.root = 1;
      CHECK(with(after[b], rooted, needs).internal);
      CHECK(with(after[b], after[b], needs).internal);  // sync ops in "before"
    }
  }
  CHECK(races >= 2);
}

TEST_CASE("verify: error texts say what happened (the 2026-12-05 probe)") {
  SUBCASE("mk.verify.E004: one destination listed twice carries the same data; it is not order-dependent") {
    Program p(Collective::allreduce, 1, 0, "test.dup_dst");
    p.copy({p.output(0, 0), p.output(0, 0)}, p.input(0, 0));
    auto c = catch_error([&] { verify::verify_bounds(p.ir()); });
    CHECK(c.id == "mk.verify.E004");
    CHECK(contains(c.message, "names r0.out[0] twice as a destination (the destination r0.out[0] is listed twice)"));
    CHECK(contains(c.message, "both writes carry the same data"));
    CHECK(!contains(c.message, "would depend on execution order"));
    CHECK(contains(c.what, "list each destination once"));
    // overlapping runs at different positions still are order-dependent
    Program q(Collective::allreduce, 1, 0, "test.dst_overlap");
    q.chunks(3);
    q.copy({q.scratch(0, 0, 2), q.scratch(0, 1, 2)}, q.input(0, 0, 2));
    c = catch_error([&] { verify::verify_bounds(q.ir()); });
    CHECK(c.id == "mk.verify.E004");
    CHECK(contains(c.message, "would depend on execution order"));
  }
  SUBCASE("mk.verify.E001: in place, an input overwritten before anything read it") {
    // an all-gather: rank 0 fills its output block 0 with rank 1's data first
    // and fixes it last; out of place that is fine, in place block 0 is
    // rank 0's input, gone before rank 1 copies it
    Program p(Collective::allgather, 2, 0, "test.overwritten");
    p.copy(p.output(0, 0), p.input(1, 0));  // MARK-overwrites-input
    p.copy(p.output(1, 0), p.input(0, 0));
    p.copy(p.output(0, 0), p.input(0, 0));
    p.copy(p.output(0, 1), p.input(1, 0));
    p.copy(p.output(1, 1), p.input(1, 0));
    auto c = catch_error([&] { verify::verify_semantics(p.ir()); });
    CHECK(c.id == "mk.verify.E001");
    CHECK(contains(c.message, "in-place"));
    CHECK(contains(c.message, "in place, rank 0 input chunk 0 is rank 0's output chunk 0, which %0 (copy on rank 1, "
                              "step 0) overwrote before anything read it"));  // a copy runs on its source's rank
    CHECK(!contains(c.message, "no partial result"));
    CHECK(contains(c.what, "before anything writes the output chunk it shares memory with"));
  }
  SUBCASE("mk.verify.E018: a self-copy and a later read on one thread block are ordered; the text says what goes wrong") {
    Program p(Collective::allreduce, 1, 0, "test.self_then_read");
    p.copy(p.output(0, 0), p.input(0, 0), dsl::on(0, 0));
    p.copy(p.scratch(0, 0), p.input(0, 0), dsl::on(0, 0));
    p.copy(p.output(0, 0), p.scratch(0, 0), dsl::on(0, 0));
    CHECK_NOTHROW(verify::verify_semantics(p.ir()));
    auto c = catch_error([&] { verify::verify_prologue(p.ir()); });
    CHECK(c.id == "mk.verify.E018");
    CHECK(contains(c.message, "on the same thread block reads r0.in[0] back, transformed already"));
    CHECK(!contains(c.message, "unordered"));
  }
  SUBCASE("mk.verify.E016: slots that staging added are named as such") {
    Program p(Collective::allreduce, 2, 0, "test.staged_slots");
    for (int r = 0; r < 2; ++r)  // reads a peer's input: staging adds a slot
      p.reduce(p.scratch(r, 0), {p.input(0, 0), p.input(1, 0)}, dsl::on(r));
    for (int r = 0; r < 2; ++r) p.copy(p.output(r, 0), p.scratch(r, 0));
    const auto l = lower(p.ir());
    ir::Schedule v = l.variants.back();
    REQUIRE(v.author_scratch == 1);
    REQUIRE(v.scratch > 0);
    v.instances = int32_t(verify::kDefaultScratchBytes / (v.tile_bytes * v.depth * v.scratch) + 1);
    auto c = catch_error([&] { verify::verify_resources(v); });
    CHECK(c.id == "mk.verify.E016");
    CHECK(contains(c.message, fmt::format("{} slot(s): the schedule's 1 and {} that staging added", v.scratch,
                                          v.scratch - 1)));
  }
}
