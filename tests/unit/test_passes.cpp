// Each compiler pass (compiler/passes/*) on hand-built IR, against the
// "Guarantees" in its header; and LowerOptions::verify_each, which re-runs
// the structural checks after every pass of the pipeline.
#include <doctest/doctest.h>

#include <algorithm>
#include <mutex>

#include "compiler/passes/passes.hpp"
#include "compiler/pipeline.hpp"
#include "compiler/verify/hb.hpp"
#include "compiler/verify/verify.hpp"
#include "mk/dsl.hpp"
#include "support.hpp"

using namespace mk;

namespace {

// A 2-rank all-reduce written by hand: push the peer's half into its scratch,
// reduce the own half, then push the result into the peer's output (a remote
// user-buffer write, which stage_remote must route through scratch).
ir::Schedule two_rank_allreduce() {
  dsl::Program p(Collective::allreduce, 2, 0, "hand.ar2");
  p.chunks(2);
  p.copy(p.scratch(1, 0), p.input(0, 1));
  p.copy(p.scratch(0, 0), p.input(1, 0));
  p.reduce(p.output(0, 0), {p.input(0, 0), p.scratch(0, 0)});
  p.reduce(p.output(1, 1), {p.input(1, 1), p.scratch(1, 0)});
  p.copy(p.output(1, 0), p.output(0, 0));
  p.copy(p.output(0, 1), p.output(1, 1));
  return std::move(p.ir());
}

bool only_own_user_buffers(const ir::Schedule& s) {
  for (const auto& op : s.ops)
    for (const auto* list : {&op.srcs, &op.dsts})
      for (const auto& r : *list)
        if (r.buf != ir::Buf::scratch && r.rank != op.rank) return false;
  return true;
}

ir::Schedule staged_and_analyzed() {
  ir::Schedule s = passes::fuse(passes::stage_remote(two_rank_allreduce()));
  verify::analyze(s);
  return s;
}

}  // namespace

TEST_CASE("pass stage_remote: same meaning, data ops touch only their own rank's user buffers") {
  ir::Schedule in = two_rank_allreduce();
  REQUIRE(!only_own_user_buffers(in));
  ir::Schedule s = passes::stage_remote(in);
  CHECK(s.staged);
  CHECK(only_own_user_buffers(s));
  CHECK_NOTHROW(verify::verify_semantics(s));
  CHECK_NOTHROW(verify::verify_bounds(s));
}

TEST_CASE("pass fuse: same meaning, fewer ops") {
  ir::Schedule s = passes::stage_remote(two_rank_allreduce());
  const size_t before = s.ops.size();
  ir::Schedule f = passes::fuse(s);
  // staging wrote the result into scratch and copies it out: a copy to fuse
  CHECK(f.ops.size() < before);
  CHECK_NOTHROW(verify::verify_semantics(f));
}

// Every rank reduces all inputs into its own scratch, then copies the sum to
// its output. Fused, a rank's reduce would write its output early, which
// in-place is its input, before the later ranks' staged copies read that
// input (they would then count the sum as a contribution).
TEST_CASE("pass fuse: does not move a write of an output before in-place reads of the input it aliases") {
  dsl::Program p(Collective::allreduce, 3, 0, "hand.reduce_then_copy");
  p.chunks(1);
  for (int r = 0; r < 3; ++r) p.reduce(p.scratch(r, 0), {p.input(0, 0), p.input(1, 0), p.input(2, 0)}, dsl::on(r));
  for (int r = 0; r < 3; ++r) p.copy(p.output(r, 0), p.scratch(r, 0));
  ir::Schedule s = std::move(p.ir());
  REQUIRE_NOTHROW(verify::verify_semantics(s));
  ir::Schedule f = passes::fuse(passes::stage_remote(s));
  CHECK_NOTHROW(verify::verify_semantics(f));
  compiler::LowerOptions o;
  o.verify_each = true;
  CHECK_NOTHROW(compiler::lower(s, o));
}

// An owner reads chunk c of every rank's input (a peer's, in place, is that
// peer's output chunk c) and then copies its result into every rank's output
// chunk c: the copies merge into the reduce, which then reads and writes the
// same bytes element for element, as an in-place reduce does. (Zero-copy
// all-reduce: one op per rank, no read-back of the result.)
TEST_CASE("pass fuse: an owner's broadcast of its result merges into the reduce that read the aliased chunks") {
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    ir::Schedule s = dsl::build(*dsl::find_schedule("allreduce.direct"), n, 0);
    ir::Schedule f = passes::fuse(s);
    size_t data = 0;
    for (const auto& op : f.ops)
      if (op.is_data()) {
        ++data;
        CHECK(op.kind == ir::OpKind::reduce);
        CHECK(op.dsts.size() == size_t(n));
      }
    CHECK(data == size_t(n));
    CHECK_NOTHROW(verify::verify_semantics(f));
    compiler::LowerOptions o;
    o.verify_each = true;
    o.zero_copy = true;
    CHECK_NOTHROW(compiler::lower(s, o));
    o.zero_copy = false;
    CHECK_NOTHROW(compiler::lower(s, o));
  }
}

TEST_CASE("pass parallelize: sets instances, leaves the ops alone") {
  ir::Schedule s = staged_and_analyzed();
  ir::Schedule p = passes::parallelize(s, 3);
  CHECK(p.instances == 3);
  CHECK(ir::print(p).size() > 0);
  CHECK(p.ops.size() == s.ops.size());
}

TEST_CASE("pass assign_tbs: every op gets a block in 0..tbs-1, tbs is the largest count") {
  for (int max_tbs : {1, 2, 32}) {
    CAPTURE(max_tbs);
    ir::Schedule a = passes::assign_tbs(staged_and_analyzed(), max_tbs);
    REQUIRE(a.tbs >= 1);
    CHECK(a.tbs <= max_tbs);
    std::vector<int32_t> used(2, 0);
    for (const auto& op : a.ops) {
      CHECK(op.tb >= 0);
      CHECK(op.tb < a.tbs);
      used[size_t(op.rank)] = std::max(used[size_t(op.rank)], op.tb + 1);
    }
    CHECK(std::max(used[0], used[1]) == a.tbs);
  }
}

TEST_CASE("pass choose_protocol: tile a multiple of 16, depth and instances set, scratch within the budget") {
  ir::Schedule a = passes::assign_tbs(staged_and_analyzed(), 32);
  passes::ProtocolOptions po;
  po.scratch_budget = 1 << 20;
  for (const auto& b : passes::plan_buckets(a, 0, -1, po)) {
    ir::Schedule v = passes::choose_protocol(a, b);
    CHECK(v.tile_bytes > 0);
    CHECK(v.tile_bytes % 16 == 0);
    CHECK(v.depth >= 1);
    CHECK(v.instances >= 1);
    const int64_t bytes = v.tile_bytes * std::max(v.scratch, 1) * v.depth * v.instances * (v.proto == ir::Proto::ll ? 2 : 1);
    CHECK(bytes <= po.scratch_budget);
  }
}

TEST_CASE("pass plan_buckets: LL is offered exactly where no scratch chunk is written twice (access_needs' double_write)") {
  // plan_buckets answers from a table of scratch writers; the sync analyses'
  // access_needs is the definition. Both on every built-in (all single-writer)
  // and on variants with a second write of a scratch chunk made in a few ways.
  passes::ProtocolOptions po;
  int offered = 0, refused = 0;
  auto agree = [&](const ir::Schedule& a) {
    const bool ll_def = !verify::access_needs(a, false, true).double_write;
    bool ll_offered = false;
    for (const auto& b : passes::plan_buckets(a, 0, -1, po)) ll_offered = ll_offered || b.proto == ir::Proto::ll;
    CHECK(ll_offered == ll_def);
    (ll_def ? offered : refused)++;
  };
  for (const auto& info : dsl::registered_schedules())
    for (int n : {2, 3, 4, 8}) {
      CAPTURE(info.name);
      CAPTURE(n);
      compiler::LowerOptions o;
      ir::Schedule assigned;
      o.on_pass = [&](std::string_view pass, const ir::Schedule& x, const compiler::PassInfo&) {
        if (pass == "assign") assigned = x;
      };
      compiler::lower(dsl::build(info, n, 0), o);
      agree(assigned);
      // a second writer of the first scratch chunk written: a copy of the same
      // value from another op, appended
      for (const auto& op : assigned.ops) {
        const auto it = std::find_if(op.dsts.begin(), op.dsts.end(), [](const ir::Ref& r) { return r.buf == ir::Buf::scratch; });
        if (!op.is_data() || it == op.dsts.end()) continue;
        ir::Schedule twice = assigned;
        ir::Op again = op;
        again.id = twice.next_id();
        twice.ops.push_back(again);
        agree(twice);
        // a copy of a scratch chunk onto itself writes nothing
        ir::Schedule self = assigned;
        ir::Op onto = op;
        onto.id = self.next_id();
        onto.kind = ir::OpKind::copy;
        onto.srcs = {*it};
        onto.dsts = {*it};
        onto.final = false;
        self.ops.push_back(onto);
        agree(self);
        break;
      }
    }
  CHECK(offered > 20);
  CHECK(refused > 10);
}

TEST_CASE("pass insert_sync: synced, and the synchronisation proves (pairing, no deadlock, no race)") {
  ir::Schedule a = passes::assign_tbs(staged_and_analyzed(), 32);
  passes::ProtocolOptions po;
  for (const auto& b : passes::plan_buckets(a, 0, -1, po)) {
    ir::Schedule v = passes::insert_sync(passes::choose_protocol(a, b));
    CHECK(v.synced);
    CHECK(v.slots >= 1);
    CHECK_NOTHROW(verify::verify_sync(v));
    CHECK_NOTHROW(verify::verify_all(v));
  }
}

TEST_CASE("lower: verify_each checks after every pass, the log names every pass with its time") {
  compiler::LowerOptions o;
  o.verify_each = true;
  std::vector<std::string> seen;
  int unchanged = 0;
  o.on_pass = [&](std::string_view pass, const ir::Schedule&, const compiler::PassInfo& info) {
    seen.emplace_back(pass);
    CHECK(info.ms >= 0);
    unchanged += !info.changed;
  };
  compiler::lower(two_rank_allreduce(), o);
  CHECK(seen.front() == "build");
  CHECK(seen.back() == "sync");
  CHECK(unchanged >= 1);  // verify changes nothing
  for (const auto& info : dsl::registered_schedules())
    for (int n : {2, 3, 4, 8}) {
      CAPTURE(info.name);
      CAPTURE(n);
      compiler::LowerOptions e;
      e.verify_each = true;
      CHECK_NOTHROW(compiler::lower(dsl::build(info, n), e));
    }
}

TEST_CASE("lower: on_variant sees each bucket once, synced and proved, and may take its ops") {
  for (bool watched : {false, true}) {
    CAPTURE(watched);
    compiler::LowerOptions o;
    o.verify_each = watched;  // then after the last pass, in bucket order
    std::mutex m;
    std::vector<size_t> order, total;
    std::vector<size_t> ops;
    std::vector<std::string> passes_then;
    std::vector<std::string> passes;
    if (watched)
      o.on_pass = [&](std::string_view pass, const ir::Schedule&, const compiler::PassInfo&) {
        passes.emplace_back(pass);
      };
    o.on_variant = [&](size_t b, size_t nb, ir::Schedule& v) {
      std::lock_guard<std::mutex> g(m);
      order.push_back(b);
      total.push_back(nb);
      CHECK(v.synced);
      CHECK_NOTHROW(verify::verify_sync(v));
      if (ops.size() <= b) ops.resize(b + 1);
      ops[b] = v.ops.size();
      passes_then.push_back(passes.empty() ? "" : passes.back());
      if (b == 0) std::vector<ir::Op>().swap(v.ops);  // taken
    };
    const compiler::Lowered l = compiler::lower(dsl::build(*dsl::find_schedule("allreduce.ring"), 4), o);
    REQUIRE(l.variants.size() == 2);  // LL and simple
    std::vector<size_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    CHECK(sorted == std::vector<size_t>{0, 1});
    CHECK(total == std::vector<size_t>{2, 2});
    CHECK(l.variants[0].ops.empty());
    CHECK(l.variants[1].ops.size() == ops[1]);
    CHECK(ops[0] > 0);
    if (watched) {
      CHECK(order == std::vector<size_t>{0, 1});
      CHECK(passes_then == std::vector<std::string>{"sync", "sync"});  // after the log's last pass
    }
  }
}

// ---- size limits ------------------------------------------------------------

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "compiler/topology/topology.hpp"

TEST_CASE("lower: running out of memory is jit E005 naming the pass, not an internal error") {
#if defined(__SANITIZE_ADDRESS__)
  MESSAGE("skipped under AddressSanitizer: it reserves more address space than the limit allows");
  return;
#endif
  // A child process with its address space capped a little above what it
  // already uses lowers a 512-rank hierarchical all-reduce (about 480 MB more).
  ir::Schedule s = dsl::build(*dsl::find_schedule("allreduce.hier"), topology::parse("64x8:direct", 512), 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    long pages = 0;
    std::ifstream("/proc/self/statm") >> pages;
    const rlim_t cap = rlim_t(pages) * rlim_t(sysconf(_SC_PAGESIZE)) + (rlim_t(64) << 20);
    const struct rlimit r = {cap, cap};
    setrlimit(RLIMIT_AS, &r);
    int code = 2;  // lowered: the cap was too generous
    try {
      compiler::lower(std::move(s), compiler::LowerOptions{});
    } catch (const Error& e) {
      code = e.id() == ErrId::jit_E005 && std::string(e.what()).find("out of memory after pass") != std::string::npos
                 ? 0
                 : 3;
    } catch (...) {
      code = 4;  // std::bad_alloc or an internal error escaped
    }
    _exit(code);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
