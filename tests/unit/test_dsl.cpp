// The DSL (include/mk/dsl.hpp, dsl/program.cpp): chunk references, the
// Buffer/Rank helpers, which rank executes an operation by default, explicit
// on(rank, tb), recorded source locations, every mk.dsl.E00x error (raised
// with the caller's line), and the schedule registry.
#include <doctest/doctest.h>

#include <set>
#include <stdexcept>

#include "compiler/ir/ir.hpp"
#include "mk/dsl.hpp"
#include "support.hpp"

using namespace mk;
using mk::dsl::Chunk;
using mk::dsl::Program;
using mkt::catch_error;
using mkt::contains;

namespace {

bool same(const Chunk& a, const Chunk& b) {
  return a.rank == b.rank && a.buf == b.buf && a.index == b.index && a.count == b.count;
}

bool is_this_file(const SrcLoc& l) { return contains(l.file, "test_dsl.cpp"); }

}  // namespace

TEST_CASE("dsl: chunk references from Program, Rank and Buffer agree") {
  Program p(Collective::allgather, 4);
  p.chunks(3);
  CHECK(p.chunks() == 3);
  CHECK(p.ranks() == 4);
  CHECK(p.root() == 0);
  CHECK(p.collective() == Collective::allgather);
  // all-gather: input is one block, output one block per rank
  CHECK(p.input_chunks() == 3);
  CHECK(p.output_chunks() == 12);

  Chunk a = p.input(2, 1);
  CHECK(a.rank == 2);
  CHECK(a.buf == dsl::Buf::input);
  CHECK(a.index == 1);
  CHECK(a.count == 1);
  CHECK(same(a, p.rank(2).input()[1]));
  CHECK(same(p.output(3, 4, 2), p.rank(3).output().slice(4, 2)));
  CHECK(same(p.scratch(1, 7), p.rank(1).scratch()[7]));
  CHECK(p.rank(3).id() == 3);

  Chunk run = p.output(1, 2, 5);  // chunks 2..6 of rank 1's output
  CHECK(same(run.at(0), Chunk{1, dsl::Buf::output, 2, 1}));
  CHECK(same(run.at(4), Chunk{1, dsl::Buf::output, 6, 1}));
  CHECK(same(run.sub(1, 3), Chunk{1, dsl::Buf::output, 3, 3}));
  CHECK(same(run.sub(1, 3).at(2), Chunk{1, dsl::Buf::output, 5, 1}));
}

TEST_CASE("dsl: buffer geometry per collective") {
  struct Case {
    Collective c;
    int in, out;  // chunks per buffer for 5 ranks, 2 chunks per block
  };
  for (Case k : {Case{Collective::allreduce, 2, 2}, Case{Collective::allgather, 2, 10},
                 Case{Collective::reducescatter, 10, 2}, Case{Collective::broadcast, 2, 2},
                 Case{Collective::reduce, 2, 2}, Case{Collective::alltoall, 10, 10}}) {
    CAPTURE(name(k.c));
    Program p(k.c, 5);
    p.chunks(2);
    CHECK(p.input_chunks() == k.in);
    CHECK(p.output_chunks() == k.out);
  }
}

TEST_CASE("dsl: operations become IR ops in call order") {
  Program p(Collective::allreduce, 3);
  p.chunks(2);
  p.copy(p.scratch(1, 0, 2), p.input(0, 0, 2));
  p.copy({p.output(0, 0), p.scratch(2, 4)}, p.input(0, 1));
  p.reduce(p.output(1, 1), {p.input(1, 1), p.scratch(1, 1), p.input(2, 1)});
  p.accumulate(p.output(2, 0), p.input(2, 0));
  const auto& ops = p.ir().ops;
  REQUIRE(ops.size() == 4);
  for (size_t i = 0; i < ops.size(); ++i) CHECK(ops[i].id == int(i));
  CHECK(ops[0].kind == ir::OpKind::copy);
  CHECK(ir::to_string(ops[0].srcs.at(0)) == "r0.in[0:2]");
  CHECK(ir::to_string(ops[0].dsts.at(0)) == "r1.sc[0:2]");
  CHECK(ops[1].dsts.size() == 2);
  CHECK(ir::to_string(ops[1].dsts.at(0)) == "r0.out[0]");
  CHECK(ir::to_string(ops[1].dsts.at(1)) == "r2.sc[4]");
  CHECK(ops[2].kind == ir::OpKind::reduce);
  REQUIRE(ops[2].srcs.size() == 3);
  CHECK(ir::to_string(ops[2].srcs[2]) == "r2.in[1]");
  // accumulate(dst, src) is reduce(dst, {dst, src})
  CHECK(ops[3].kind == ir::OpKind::reduce);
  REQUIRE(ops[3].srcs.size() == 2);
  CHECK(ops[3].srcs[0] == ops[3].dsts[0]);
  CHECK(ir::to_string(ops[3].srcs[1]) == "r2.in[0]");
  // scratch size: the highest slot used + 1 (r2.sc[4])
  CHECK(p.ir().scratch == 5);
  CHECK(p.ir().coll == Collective::allreduce);
  CHECK(p.ir().nranks == 3);
  CHECK(p.ir().chunks == 2);
}

TEST_CASE("dsl: default executing rank") {
  Program p(Collective::allreduce, 4);
  // copy: on the source's rank (push)
  p.copy(p.scratch(3, 0), p.input(1, 0));
  CHECK(p.ir().ops.back().rank == 1);
  CHECK(p.ir().ops.back().tb == -1);
  p.copy({p.scratch(0, 1), p.scratch(3, 1)}, p.input(2, 0));
  CHECK(p.ir().ops.back().rank == 2);
  // reduce with every source on one rank: that rank, even if dst is remote
  p.reduce(p.scratch(0, 2), {p.input(2, 0), p.scratch(2, 0)});
  CHECK(p.ir().ops.back().rank == 2);
  // reduce with sources on different ranks: the destination's rank
  p.reduce(p.output(3, 0), {p.input(1, 0), p.input(2, 0)});
  CHECK(p.ir().ops.back().rank == 3);
  p.reduce(p.scratch(0, 3), {p.input(0, 0), p.input(3, 0), p.input(1, 0)});
  CHECK(p.ir().ops.back().rank == 0);
  // accumulate(dst, src) with src remote: sources {dst, src} differ -> dst's rank
  p.accumulate(p.output(1, 0), p.input(3, 0));
  CHECK(p.ir().ops.back().rank == 1);
  // accumulate with both local to another rank than... dst and src on rank 2
  p.accumulate(p.scratch(2, 5), p.input(2, 0));
  CHECK(p.ir().ops.back().rank == 2);
}

TEST_CASE("dsl: explicit on(rank) and on(rank, tb)") {
  Program p(Collective::allreduce, 4);
  p.copy(p.scratch(3, 0), p.input(1, 0), dsl::on(3));  // pull instead of push
  CHECK(p.ir().ops.back().rank == 3);
  CHECK(p.ir().ops.back().tb == -1);
  p.reduce(p.output(3, 0), {p.input(1, 0), p.input(2, 0)}, dsl::on(2, 5));
  CHECK(p.ir().ops.back().rank == 2);
  CHECK(p.ir().ops.back().tb == 5);
  p.copy(p.output(0, 0), p.input(0, 0), dsl::on(0, 1023));  // the largest block id
  CHECK(p.ir().ops.back().tb == 1023);
  p.copy(p.output(1, 0), p.input(1, 0), dsl::Exec{-1, 2});  // default rank, fixed block
  CHECK(p.ir().ops.back().rank == 1);
  CHECK(p.ir().ops.back().tb == 2);
}

TEST_CASE("dsl: every operation records the caller's source line") {
  Program p(Collective::allreduce, 2);
  const int l1 = __LINE__ + 1;
  p.copy(p.scratch(1, 0), p.input(0, 0));
  const int l2 = __LINE__ + 1;
  p.copy({p.scratch(0, 0)}, p.input(1, 0));
  const int l3 = __LINE__ + 1;
  p.reduce(p.output(0, 0), {p.input(0, 0), p.scratch(0, 0)});
  const int l4 = __LINE__ + 1;
  p.accumulate(p.scratch(1, 0), p.input(1, 0));
  const auto& ops = p.ir().ops;
  REQUIRE(ops.size() == 4);
  int lines[] = {l1, l2, l3, l4};
  for (size_t i = 0; i < 4; ++i) {
    CAPTURE(i);
    CHECK(ops[i].loc->line == uint32_t(lines[i]));
    CHECK(is_this_file(ops[i].loc));
    CHECK(ops[i].loc.str() == "test_dsl.cpp:" + std::to_string(lines[i]));
  }
}

TEST_CASE("dsl: mk.dsl.E001 rank outside 0..nranks-1, with the caller's line") {
  Program p(Collective::allreduce, 4);
  int line = 0;
  auto c = catch_error([&] {
    line = __LINE__ + 1;
    p.copy(p.output(4, 0), p.input(0, 0));
  });
  CHECK(c.id == "mk.dsl.E001");
  CHECK(c.loc.line == uint32_t(line));
  CHECK(is_this_file(c.loc));
  CHECK(contains(c.message, "rank 4"));
  CHECK(contains(c.what, "test_dsl.cpp:" + std::to_string(line)));

  c = catch_error([&] {
    line = __LINE__ + 1;
    p.reduce(p.output(0, 0), {p.input(0, 0), p.rank(-1).input()[0]});
  });
  CHECK(c.id == "mk.dsl.E001");
  CHECK(c.loc.line == uint32_t(line));
  CHECK(contains(c.message, "rank -1"));
  // the program is unchanged by a rejected call
  CHECK(p.ir().ops.empty());

  // a root that is not a rank (the constructor has no caller line to report)
  c = catch_error([&] { Program q(Collective::broadcast, 3, 3); });
  CHECK(c.id == "mk.dsl.E001");
  CHECK(contains(c.message, "root 3"));
}

TEST_CASE("dsl: mk.dsl.E002 bad chunk reference, with the caller's line") {
  Program p(Collective::allreduce, 2);
  int line = 0;
  auto c = catch_error([&] {
    line = __LINE__ + 1;
    p.copy(p.output(1, -1), p.input(1, 0));
  });
  CHECK(c.id == "mk.dsl.E002");
  CHECK(c.loc.line == uint32_t(line));
  CHECK(contains(c.message, "index -1"));

  c = catch_error([&] {
    line = __LINE__ + 1;
    p.copy(p.output(1, 0, 0), p.input(1, 0, 0));
  });
  CHECK(c.id == "mk.dsl.E002");
  CHECK(c.loc.line == uint32_t(line));
  CHECK(contains(c.message, "count 0"));
}

TEST_CASE("dsl: mk.dsl.E003 chunk counts differ, with the caller's line") {
  Program p(Collective::allreduce, 2);
  p.chunks(4);
  int line = 0;
  auto c = catch_error([&] {
    line = __LINE__ + 1;
    p.copy(p.output(1, 0, 2), p.input(1, 0, 3));
  });
  CHECK(c.id == "mk.dsl.E003");
  CHECK(c.loc.line == uint32_t(line));
  CHECK(contains(c.message, "3 chunk(s)"));

  c = catch_error([&] {
    line = __LINE__ + 1;
    p.copy({p.output(1, 0, 2), p.scratch(1, 0, 1)}, p.input(1, 0, 2));
  });
  CHECK(c.id == "mk.dsl.E003");
  CHECK(c.loc.line == uint32_t(line));

  c = catch_error([&] {
    line = __LINE__ + 1;
    p.copy(std::vector<Chunk>{}, p.input(1, 0));
  });
  CHECK(c.id == "mk.dsl.E003");
  CHECK(c.loc.line == uint32_t(line));

  c = catch_error([&] {
    line = __LINE__ + 1;
    p.reduce(p.output(0, 0, 2), {p.input(0, 0, 2), p.input(1, 0, 1)});
  });
  CHECK(c.id == "mk.dsl.E003");
  CHECK(c.loc.line == uint32_t(line));
  CHECK(p.ir().ops.empty());
}

TEST_CASE("dsl: mk.dsl.E004 invalid program settings, with the caller's line") {
  Program p(Collective::allreduce, 2);
  int line = 0;
  for (int bad : {0, -3, 65537}) {
    CAPTURE(bad);
    auto c = catch_error([&] {
      line = __LINE__ + 1;
      p.chunks(bad);
    });
    CHECK(c.id == "mk.dsl.E004");
    CHECK(c.loc.line == uint32_t(line));
  }
  for (int bad : {0, 65}) {
    CAPTURE(bad);
    auto c = catch_error([&] {
      line = __LINE__ + 1;
      p.instances(bad);
    });
    CHECK(c.id == "mk.dsl.E004");
    CHECK(c.loc.line == uint32_t(line));
  }
  p.chunks(65536);  // the limits themselves are fine
  p.instances(64);
  p.instances(1);
  p.chunks(1);
  // chunks() after the first operation would change the meaning of every chunk
  p.copy(p.output(0, 0), p.input(0, 0));
  auto c = catch_error([&] {
    line = __LINE__ + 1;
    p.chunks(2);
  });
  CHECK(c.id == "mk.dsl.E004");
  CHECK(c.loc.line == uint32_t(line));
  CHECK(contains(c.what, "hint:"));
  CHECK(p.chunks() == 1);

  for (int n : {0, 1025}) {
    CAPTURE(n);
    c = catch_error([&] { Program q(Collective::allreduce, n); });
    CHECK(c.id == "mk.dsl.E004");
  }
  CHECK_FALSE(catch_error([&] { Program q(Collective::allreduce, 1024); }));
}

TEST_CASE("dsl: mk.dsl.E005 invalid executing rank or thread block, with the caller's line") {
  Program p(Collective::allreduce, 4);
  int line = 0;
  auto c = catch_error([&] {
    line = __LINE__ + 1;
    p.copy(p.output(1, 0), p.input(1, 0), dsl::on(4));
  });
  CHECK(c.id == "mk.dsl.E005");
  CHECK(c.loc.line == uint32_t(line));
  CHECK(contains(c.message, "rank 4"));

  c = catch_error([&] {
    line = __LINE__ + 1;
    p.copy(p.output(1, 0), p.input(1, 0), dsl::on(1, 1024));
  });
  CHECK(c.id == "mk.dsl.E005");
  CHECK(c.loc.line == uint32_t(line));
  CHECK(contains(c.message, "1024"));

  c = catch_error([&] {
    line = __LINE__ + 1;
    p.copy(p.output(1, 0), p.input(1, 0), dsl::on(1, -7));
  });
  CHECK(c.id == "mk.dsl.E005");
  CHECK(c.loc.line == uint32_t(line));
  CHECK(p.ir().ops.empty());
}

// Regression: every negative Exec::on used to mean "default"; only -1 does.
TEST_CASE("dsl: mk.dsl.E005 for a negative executing rank other than -1") {
  Program p(Collective::allreduce, 4);
  int line = 0;
  auto c = catch_error([&] {
    line = __LINE__ + 1;
    p.copy(p.output(1, 0), p.input(1, 0), dsl::on(-2));
  });
  CHECK(c.id == "mk.dsl.E005");
  CHECK(c.loc.line == uint32_t(line));
}

TEST_CASE("dsl: mk.dsl.E006 reduce without enough sources, with the caller's line") {
  Program p(Collective::allreduce, 2);
  int line = 0;
  auto c = catch_error([&] {
    line = __LINE__ + 1;
    p.reduce(p.output(0, 0), {p.input(0, 0)});
  });
  CHECK(c.id == "mk.dsl.E006");
  CHECK(c.loc.line == uint32_t(line));
  CHECK(contains(c.message, "got 1"));
  CHECK(contains(c.what, "accumulate"));  // the hint says what to use instead

  c = catch_error([&] {
    line = __LINE__ + 1;
    p.reduce(p.output(0, 0), {});
  });
  CHECK(c.id == "mk.dsl.E006");
  CHECK(c.loc.line == uint32_t(line));
}

namespace {
void throws_std(Program& p) {
  p.copy(p.output(0, 0), p.input(0, 0));
  throw std::runtime_error("builder gave up");
}
int throws_mk_line = 0;
void throws_mk(Program& p) {
  throws_mk_line = __LINE__ + 1;
  p.copy(p.output(p.ranks(), 0), p.input(0, 0));
}
void builds_ok(Program& p) {
  for (int r = 0; r < p.ranks(); ++r) p.copy(p.output(r, 0), p.input(p.root(), 0));
}
}  // namespace

TEST_CASE("dsl: mk.dsl.E007 a builder that throws, DSL errors keep their id") {
  // Not registered: a registered broken schedule would break the other tests.
  const int reg_line = __LINE__;
  dsl::ScheduleInfo info{"test.throws", Collective::allreduce, throws_std, "throws", __FILE__, reg_line};
  auto c = catch_error([&] { dsl::build(info, 3); });
  CHECK(c.id == "mk.dsl.E007");
  CHECK(contains(c.message, "test.throws"));
  CHECK(contains(c.message, "3 ranks"));
  CHECK(contains(c.message, "builder gave up"));
  CHECK(c.loc.line == uint32_t(reg_line));  // where the schedule was registered
  CHECK(is_this_file(c.loc));

  dsl::ScheduleInfo info2{"test.dsl_error", Collective::allreduce, throws_mk, "", __FILE__, __LINE__};
  c = catch_error([&] { dsl::build(info2, 2); });
  CHECK(c.id == "mk.dsl.E001");
  CHECK(is_this_file(c.loc));
  CHECK(c.loc.line == uint32_t(throws_mk_line));
  CHECK(throws_mk_line > 0);
}

TEST_CASE("dsl: build() runs a builder for a rank count and root") {
  dsl::ScheduleInfo info{"test.bcast", Collective::broadcast, builds_ok, "", __FILE__, __LINE__};
  ir::Schedule s = dsl::build(info, 3, 2);
  CHECK(s.name == "test.bcast");
  CHECK(s.coll == Collective::broadcast);
  CHECK(s.nranks == 3);
  CHECK(s.root == 2);
  REQUIRE(s.ops.size() == 3);
  for (int r = 0; r < 3; ++r) {
    CHECK(ir::to_string(s.ops[size_t(r)].srcs.at(0)) == "r2.in[0]");
    CHECK(s.ops[size_t(r)].rank == 2);
  }
  auto c = catch_error([&] { dsl::build(info, 3, 3); });
  CHECK(c.id == "mk.dsl.E001");
  c = catch_error([&] { dsl::build(info, 0); });
  CHECK(c.id == "mk.dsl.E004");
}

TEST_CASE("dsl: the registry holds every built-in schedule once") {
  const std::set<std::string> builtin = {
      "allgather.direct",   "allgather.ring",  "allreduce.one_shot", "allreduce.ring",       "allreduce.two_shot",
      "alltoall.direct",    "broadcast.direct", "reduce.direct",     "reducescatter.direct", "reducescatter.ring"};
  std::set<std::string> seen;
  std::set<int64_t> seqs;
  for (const auto& info : dsl::registered_schedules()) {
    CAPTURE(info.name);
    CHECK(seen.insert(info.name).second);  // unique names
    CHECK(seqs.insert(info.seq).second);
    CHECK(info.seq > 0);
    CHECK((info.build != nullptr));
    CHECK(!info.doc.empty());
    CHECK(info.line > 0);
    // the collective is the first part of the name, the file is schedules/<name>.cpp
    CHECK(info.name.substr(0, info.name.find('.')) == std::string(name(info.coll)));
    std::string file = info.name;
    for (char& ch : file)
      if (ch == '.') ch = '_';
    CHECK(contains(info.file, "schedules/" + file + ".cpp"));
    // copy engines run exactly the `.ce` schedules (runtime/launch/ce.hpp)
    CHECK(info.copy_engine == (info.name.size() > 3 && info.name.substr(info.name.size() - 3) == ".ce"));
    const dsl::ScheduleInfo* found = dsl::find_schedule(info.name);
    REQUIRE(found != nullptr);
    CHECK(found->name == info.name);
    CHECK((found->build == info.build));
  }
  for (const auto& b : builtin) {
    CAPTURE(b);
    CHECK(seen.count(b) == 1);
  }
  CHECK(dsl::find_schedule("allreduce.nope") == nullptr);
  CHECK(dsl::find_schedule("") == nullptr);
  CHECK(dsl::find_schedule("allreduce") == nullptr);
}

// Phases over groups of ranks (Program::reduce_scatter, all_gather): the ops
// a hand-written loop would emit, distance by distance, and each reduction's
// sources in the order asked for.
TEST_CASE("dsl: reduce_scatter and all_gather over groups emit the ops of the loops they replace") {
  auto text = [](const Program& p) {
    std::vector<std::string> out;
    for (const auto& op : p.ir().ops) {
      std::string s = ir::print_op(op);
      out.push_back(s.substr(s.find(' ') + 1));  // without the id
    }
    return out;
  };
  auto piece = [](Program& p) { return [&p](int from, int to) { return p.input(from, to); }; };
  auto slot = [](Program& p) { return [&p](int from, int to) { return p.scratch(to, from); }; };
  {
    Program p(Collective::reducescatter, 3);
    p.reduce_scatter(p.all_ranks(), piece(p), [&](int r) { return p.output(r, 0); }, slot(p), Program::Order::own_first);
    CHECK(text(p) == std::vector<std::string>{
                         "copy r0.in[1] -> r1.sc[0]", "copy r1.in[2] -> r2.sc[1]", "copy r2.in[0] -> r0.sc[2]",
                         "copy r0.in[2] -> r2.sc[0]", "copy r1.in[0] -> r0.sc[1]", "copy r2.in[1] -> r1.sc[2]",
                         "reduce r0.in[0], r0.sc[1], r0.sc[2] -> r0.out[0]",
                         "reduce r1.in[1], r1.sc[2], r1.sc[0] -> r1.out[0]",
                         "reduce r2.in[2], r2.sc[0], r2.sc[1] -> r2.out[0]"});
  }
  {
    Program p(Collective::reducescatter, 3);
    p.reduce_scatter(p.all_ranks(), piece(p), [&](int r) { return p.output(r, 0); }, slot(p), Program::Order::group);
    const auto t = text(p);
    REQUIRE(t.size() == 9);
    CHECK(t[7] == "reduce r1.sc[0], r1.in[1], r1.sc[2] -> r1.out[0]");  // members in group order, own at its place
  }
  {
    // two groups of two (the nodes of 2x2): distance 1 in both, then the reductions
    Program p(Collective::reducescatter, 4);
    p.reduce_scatter({{0, 1}, {2, 3}}, piece(p), [&](int r) { return p.output(r, 0); }, slot(p),
                     Program::Order::own_first);
    CHECK(text(p) == std::vector<std::string>{"copy r0.in[1] -> r1.sc[0]", "copy r1.in[0] -> r0.sc[1]",
                                              "copy r2.in[3] -> r3.sc[2]", "copy r3.in[2] -> r2.sc[3]",
                                              "reduce r0.in[0], r0.sc[1] -> r0.out[0]",
                                              "reduce r1.in[1], r1.sc[0] -> r1.out[0]",
                                              "reduce r2.in[2], r2.sc[3] -> r2.out[0]",
                                              "reduce r3.in[3], r3.sc[2] -> r3.out[0]"});
  }
  {
    Program p(Collective::allgather, 3);
    p.all_gather(p.all_ranks(), [&](int r) { return p.input(r, 0); }, [&](int to, int from) { return p.output(to, from); },
                 /*self=*/true);
    CHECK(text(p) == std::vector<std::string>{
                         "copy r0.in[0] -> r0.out[0]", "copy r1.in[0] -> r1.out[1]", "copy r2.in[0] -> r2.out[2]",
                         "copy r0.in[0] -> r1.out[0]", "copy r1.in[0] -> r2.out[1]", "copy r2.in[0] -> r0.out[2]",
                         "copy r0.in[0] -> r2.out[0]", "copy r1.in[0] -> r0.out[1]", "copy r2.in[0] -> r1.out[2]"});
  }
  {
    Program p(Collective::allgather, 8);
    p.ir().topology = topology::parse("2x4", 8);
    CHECK(p.node_groups() == Program::Groups{{0, 1, 2, 3}, {4, 5, 6, 7}});
    CHECK(p.rail_groups() == Program::Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
    CHECK(p.all_ranks() == Program::Groups{{0, 1, 2, 3, 4, 5, 6, 7}});
    auto src = [&](int r) { return p.input(r, 0); };
    auto dst = [&](int to, int from) { return p.output(to, from); };
    CHECK(mkt::error_id([&] { p.all_gather({{0, 1}, {2}}, src, dst); }) == ErrId::dsl_E004);     // unequal sizes
    CHECK(mkt::error_id([&] { p.all_gather({{0, 8}}, src, dst); }) == ErrId::dsl_E001);          // no rank 8
    CHECK(mkt::error_id([&] { p.all_gather({{1, 1}}, src, dst); }) == ErrId::dsl_E004);          // twice
    CHECK(mkt::error_id([&] { p.reduce_scatter({{3}}, dst, src, dst, Program::Order::group); }) ==  // one member
          ErrId::dsl_E004);
  }
}
