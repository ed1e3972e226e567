// The topology: its text and JSON forms, the DSL's accessors, the verifier's
// direct-link check (mk.verify.E017), the hierarchical schedules on every
// shape, and the cost model's estimates against hand computations.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "compiler/cost/cost.hpp"
#include "compiler/pipeline.hpp"
#include "compiler/plan/plan.hpp"
#include "compiler/topology/topology.hpp"
#include "compiler/verify/executor.hpp"
#include "compiler/verify/verify.hpp"
#include "mk/dsl.hpp"
#include "plan_util.hpp"
#include "support.hpp"

using namespace mk;
using mkt::contains;
using topology::Link;
using topology::Topology;

namespace {

using mkt::error_id;

compiler::Lowered lower_for(const std::string& name, const Topology& t) {
  const auto* info = dsl::find_schedule(name);
  REQUIRE(info != nullptr);
  compiler::LowerOptions o;
  o.proto.simple_instances = 2;
  o.proto.ll_instances = 2;
  o.proto.max_tile_bytes = 8192;
  o.topology = t;
  return compiler::lower(dsl::build(*info, t), o);
}

}  // namespace

TEST_CASE("topology: text forms, rank numbering, link kinds") {
  const Topology t = topology::parse("2x4", 8);
  CHECK(t.nodes == 2);
  CHECK(t.gpus_per_node == 4);
  CHECK(t.name() == "2x4");
  CHECK(t.node(5) == 1);
  CHECK(t.local(5) == 1);
  CHECK(t.rail(6) == 2);
  CHECK(t.rank_of(1, 3) == 7);
  CHECK(t.link(2, 2) == Link::self);
  CHECK(t.link(0, 3) == Link::nvlink);
  CHECK(t.link(3, 4) == Link::net);
  CHECK(t.link(1, 5) == Link::net);

  const Topology d = topology::parse("2x4:direct", 8);
  CHECK(d.name() == "2x4:direct");
  CHECK(d.link(3, 4) == Link::nvlink);
  CHECK_FALSE(d == t);

  const Topology p = topology::parse("4x2:pcie", 8);
  CHECK(p.link(0, 1) == Link::pcie);
  CHECK(p.link(1, 2) == Link::net);
  CHECK(topology::parse(p.name(), 8) == p);

  // one node, however written, is nvlink:N
  CHECK(topology::parse("1x4", 4).name() == "nvlink:4");
  CHECK(topology::parse("1x4:direct", 4) == topology::parse("nvlink:4", 4));
  CHECK(topology::parse("", 4) == topology::single(4));
  CHECK(topology::parse("pcie", 3).name() == "pcie:3");
  CHECK(topology::parse("pcie:3", 3).link(0, 2) == Link::pcie);
  // the count from the text when the caller has none
  CHECK(topology::parse("8x8", 0).nranks() == 64);
  CHECK(topology::parse("nvlink:5", 0).nranks() == 5);

  for (const char* bad : {"2x", "x4", "2x4x", "-2x4", "2x4:fast", "nvlink:0", "nvlink:", "ring:8", "2x0"}) {
    const std::string text = bad;
    CAPTURE(text);
    CHECK(error_id([&] { topology::parse(bad, 8); }) == ErrId::cli_E011);
  }
  std::string what;
  CHECK(error_id([&] { topology::parse("2x4", 6); }, &what) == ErrId::cli_E011);
  CHECK(contains(what, "has 8 ranks but the schedule has 6"));
  CHECK(error_id([&] { topology::parse("nvlink", 0); }) == ErrId::cli_E004);
}

TEST_CASE("topology: JSON form, old label strings, rails") {
  auto fail = [](const std::string& path, const std::string& msg) { throw std::runtime_error(path + ": " + msg); };
  Topology t = topology::parse("4x2:direct", 8);
  t.rails = {1, 0};
  const nlohmann::json j = topology::to_json(t);
  CHECK(j["nodes"] == 4);
  CHECK(j["gpus_per_node"] == 2);
  CHECK(j["direct"] == true);
  const Topology back = topology::from_json(j, 8, fail);
  CHECK(back == t);
  CHECK(back.rail(0) == 1);
  CHECK(back.rail(3) == 0);
  CHECK(topology::from_json(nlohmann::json("pcie:8"), 8, fail) == topology::single(8, Link::pcie));

  auto error_at = [&](nlohmann::json x, int n) {
    try {
      topology::from_json(x, n, fail);
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(contains(error_at({{"nodes", 2}, {"gpus_per_node", 4}}, 6), "is 8 ranks but the schedule has 6"));
  CHECK(contains(error_at({{"nodes", 0}, {"gpus_per_node", 4}}, 0), ".nodes"));
  CHECK(contains(error_at({{"nodes", 2}}, 8), ".gpus_per_node"));
  CHECK(contains(error_at({{"nodes", 2}, {"gpus_per_node", 4}, {"intra", "ib"}}, 8), ".intra"));
  CHECK(contains(error_at({{"nodes", 2}, {"gpus_per_node", 2}, {"rails", {0, 2}}}, 4), ".rails"));
  CHECK(contains(error_at({{"nodes", 2}, {"gpus_per_node", 2}, {"rails", {0}}}, 4), ".rails"));
  CHECK(contains(error_at(nlohmann::json("nvlink:3"), 4), "has 3 ranks"));
  CHECK(contains(error_at(nlohmann::json(3), 4), "expected an object"));
}

TEST_CASE("topology: IR JSON and plan.json carry it, old label files still read") {
  ir::Schedule s = dsl::build(*dsl::find_schedule("allgather.hier"), topology::parse("2x2:direct", 4));
  REQUIRE(s.topology);
  ir::Schedule back = ir::from_json(ir::to_json(s));
  REQUIRE(back.topology);
  CHECK(*back.topology == *s.topology);
  CHECK(contains(ir::print(back), "topology=2x2:direct"));

  auto j = nlohmann::json::parse(ir::to_json(s));
  j["topology"] = "pcie:4";  // the label form older files have
  CHECK(ir::from_json(j.dump()).topology == topology::single(4, Link::pcie));
  j["topology"] = "";
  CHECK_FALSE(ir::from_json(j.dump()).topology.has_value());
  j["topology"] = {{"nodes", 3}, {"gpus_per_node", 2}};
  std::string what;
  CHECK(error_id([&] { ir::from_json(j.dump()); }, &what) == ErrId::ir_E001);
  CHECK(contains(what, "$.topology"));

  auto p = mkt::fake_plan();
  p.topology = topology::parse("2x1", p.nranks);
  auto q = plan::from_json(plan::to_json(p), "plan.json");
  REQUIRE(q.topology);
  CHECK(*q.topology == *p.topology);
  auto pj = nlohmann::json::parse(plan::to_json(p));
  pj["topology"] = "nvlink:2";
  CHECK(plan::from_json(pj.dump(), "plan.json").topology == topology::single(2));
  pj["topology"] = "2x2";
  CHECK(error_id([&] { plan::from_json(pj.dump(), "plan.json"); }, &what) == ErrId::plan_E001);
  CHECK(contains(what, "$.topology"));
}

TEST_CASE("DSL: topology accessors") {
  dsl::Program p(Collective::allreduce, 8);
  CHECK(p.nodes() == 1);  // the default: one node of all ranks
  CHECK(p.gpus_per_node() == 8);
  CHECK(p.node(7) == 0);
  CHECK(p.local(7) == 7);
  p.ir().topology = topology::parse("4x2", 8);
  CHECK(p.nodes() == 4);
  CHECK(p.gpus_per_node() == 2);
  CHECK(p.node(5) == 2);
  CHECK(p.local(5) == 1);
  CHECK(p.rank_of(3, 0) == 6);
  CHECK(error_id([&] { p.node(8); }) == ErrId::dsl_E001);
  CHECK(error_id([&] { p.local(-1); }) == ErrId::dsl_E001);
  CHECK(error_id([&] { p.rank_of(4, 0); }) == ErrId::dsl_E001);
  CHECK(error_id([&] { p.rank_of(0, 2); }) == ErrId::dsl_E001);
}

TEST_CASE("hierarchical schedules prove and simulate on every shape") {
  std::vector<Topology> shapes;
  for (const char* t : {"1x4", "2x2:direct", "2x4:direct", "4x2:direct", "4x1:direct", "2x3:direct"})
    shapes.push_back(topology::parse(t, 0));
  for (int n : {1, 2, 3, 4, 8}) shapes.push_back(topology::single(n));
  for (const std::string name : {"allreduce.hier", "allgather.hier", "reducescatter.hier"}) {
    for (const auto& t : shapes) {
      CAPTURE(name);
      const std::string shape = t.name();
      CAPTURE(shape);
      auto l = lower_for(name, t);
      for (size_t v = 0; v < l.variants.size(); ++v)
        for (int64_t count : {1, 7, 1000, 30001})
          for (bool inplace : {false, true}) {
            CAPTURE(v);
            CAPTURE(count);
            CAPTURE(inplace);
            verify::SimOptions o;
            o.count = count;
            o.inplace = inplace;
            o.seed = uint64_t(count + t.nranks());
            auto r = verify::simulate(l.variants[v], o);
            CHECK_MESSAGE(r.ok, r.first_bad);
          }
    }
  }
}

TEST_CASE("mk.verify.E017: hierarchical schedules on 2x4 move data across nodes directly") {
  for (const std::string name : {"allreduce.hier", "allgather.hier", "reducescatter.hier"}) {
    CAPTURE(name);
    std::string what;
    CHECK(error_id([&] { lower_for(name, topology::parse("2x4", 8)); }, &what) == ErrId::verify_E017);
    CHECK(contains(what, "topology 2x4"));
    CHECK(contains(what, "rank 0 (node 0) and rank 4 (node 1)"));
    CHECK(contains(what, "network operations are not yet supported"));
    CHECK(contains(what, "_hier.cpp:"));  // the DSL line
  }
  // a single-node schedule pushing everywhere is refused too, on any shape
  // with a network, and accepted where every pair is linked
  const auto* one_shot = dsl::find_schedule("allreduce.one_shot");
  CHECK(error_id([&] { verify::verify_semantics(dsl::build(*one_shot, topology::parse("2x1", 2))); }) ==
        ErrId::verify_E017);
  verify::verify_semantics(dsl::build(*one_shot, topology::parse("2x1:direct", 2)));
  verify::verify_semantics(dsl::build(*one_shot, topology::parse("pcie:2", 2)));
}

TEST_CASE("lower: a schedule built for one topology is not lowered for another") {
  const auto* info = dsl::find_schedule("allreduce.hier");
  compiler::LowerOptions o;
  o.topology = topology::parse("2x2:direct", 4);
  std::string what;
  CHECK(error_id([&] { compiler::lower(dsl::build(*info, topology::single(4)), o); }, &what) == ErrId::cli_E011);
  CHECK(contains(what, "built for topology nvlink:4 but is lowered for 2x2:direct"));
  o.topology = topology::single(2);
  CHECK(error_id([&] { compiler::lower(dsl::build(*info, 4), o); }) == ErrId::cli_E011);
}

namespace {

// rank 0 tb 0: copy 1 chunk into rank 1's scratch, signal rank 1;
// rank 1 tb 0: wait, copy the chunk into its output (local).
ir::Schedule two_hop() {
  ir::Schedule s;
  s.name = "two_hop";
  s.coll = Collective::allgather;
  s.nranks = 2;
  s.tile_bytes = 4096;
  s.chunks = 1;
  s.instances = 1;
  auto add = [&](ir::OpKind k, int32_t rank, std::vector<ir::Ref> dsts, std::vector<ir::Ref> srcs) {
    ir::Op op;
    op.id = int32_t(s.ops.size());
    op.kind = k;
    op.rank = rank;
    op.tb = 0;
    op.dsts = std::move(dsts);
    op.srcs = std::move(srcs);
    s.ops.push_back(op);
    return &s.ops.back();
  };
  add(ir::OpKind::copy, 0, {ir::Ref{1, ir::Buf::scratch, 0, 1}}, {ir::Ref{0, ir::Buf::input, 0, 1}});
  auto* sig = add(ir::OpKind::signal, 0, {}, {});
  sig->peer = 1;
  sig->slot = 0;
  auto* w = add(ir::OpKind::wait, 1, {}, {});
  w->slot = 0;
  add(ir::OpKind::copy, 1, {ir::Ref{1, ir::Buf::output, 0, 1}}, {ir::Ref{1, ir::Buf::scratch, 0, 1}});
  return s;
}

}  // namespace

TEST_CASE("cost: estimates match a hand computation per link kind") {
  const ir::Schedule s = two_hop();
  // 1 MiB in one chunk, tiles of 4096 B: 256 tiles, 1 instance -> 256 steps.
  const int64_t bytes = 1 << 20;
  const double tile = 4096;
  struct Case {
    const char* topo;
    double alpha, gbps;  // the link between rank 0 and rank 1 (defaults in topology.hpp)
  };
  for (const Case c : {Case{"nvlink:2", 1.3, 365.0}, Case{"pcie:2", 3.0, 25.0}, Case{"2x1", 6.0, 45.0},
                       Case{"2x1:direct", 1.3, 365.0}}) {
    const std::string topo = c.topo;
    CAPTURE(topo);
    const Topology t = topology::parse(topo, 2);
    // rank 0: copy (0.2 + 4096 B over the link), signal 0.05;
    // rank 1: wait from the signal's end + alpha/2, 0.05; local copy 0.2 + 4096 B at 2000 GB/s
    const double remote = 0.2 + tile / (c.gbps * 1e3);
    const double local = 0.2 + tile / (2000.0 * 1e3);
    const double step = remote + 0.05 + c.alpha / 2 + 0.05 + local;
    const double bottleneck = std::max(remote, local);  // busiest thread block's data ops
    const double want = 4.5 + step + 255 * bottleneck;
    CHECK(cost::estimate_us(s, t, bytes) == doctest::Approx(want).epsilon(1e-9));
    auto tl = cost::step_timeline(s, t, 4096);
    CHECK(tl.step_us == doctest::Approx(step).epsilon(1e-9));
  }
  CHECK(cost::estimate_us(s, topology::single(2), 0) == 0);
  // a small message uses one tile of the chunk's size: 100 B, one step
  const double small = 4.5 + (0.2 + 100 / 365e3) + 0.05 + 0.65 + 0.05 + (0.2 + 100 / 2000e3);
  CHECK(cost::estimate_us(s, topology::single(2), 100) == doctest::Approx(small).epsilon(1e-9));
}

TEST_CASE("cost: instances share the links, so more of them never make a large message faster than its bytes") {
  ir::Schedule s = two_hop();
  s.tile_bytes = 256 << 10;
  const Topology t = topology::parse("nvlink:2", 2);
  const int64_t bytes = int64_t(256) << 20;
  // 256 MiB over one NVLink at 365 GB/s: 735 us of link time whatever the
  // instances; on top, a fixed 0.2 us per op and step (1024 tiles)
  const double wire = double(bytes) / 365e3;
  for (int32_t inst : {1, 4, 16, 64}) {
    CAPTURE(inst);
    s.instances = inst;
    const double us = cost::estimate_us(s, t, bytes);
    CHECK(us > wire);
    CHECK(us < wire * 1.05 + 0.25 * 1024 / inst + 10);
  }
  // a step of 64 instances, each a 4096 B tile: the remote copy moves 64 tiles over the link
  s.instances = 64;
  auto tl = cost::step_timeline(s, t, 4096, 64);
  auto one = cost::step_timeline(s, t, 4096);
  CHECK(tl.bottleneck_us == doctest::Approx(0.2 + 64 * 4096 / 365e3).epsilon(1e-9));
  CHECK(one.bottleneck_us == doctest::Approx(0.2 + 4096 / 365e3).epsilon(1e-9));
}

TEST_CASE("cost: each event names what it started after, and the critical path follows those causes") {
  const ir::Schedule s = two_hop();  // rank 0: copy into rank 1, signal; rank 1: wait, local copy
  const auto tl = cost::step_timeline(s, topology::parse("nvlink:2", 2), 4096);
  REQUIRE(tl.events.size() == 4);
  auto index_of = [&](size_t op) {
    for (size_t i = 0; i < tl.events.size(); ++i)
      if (tl.events[i].op == op) return int64_t(i);
    return int64_t(-1);
  };
  const int64_t copy0 = index_of(0), signal0 = index_of(1), wait1 = index_of(2), copy1 = index_of(3);
  CHECK(tl.events[size_t(copy0)].cause == -1);  // a thread block's first op
  CHECK(tl.events[size_t(signal0)].cause == copy0);
  CHECK(tl.events[size_t(wait1)].signal == signal0);
  CHECK(tl.events[size_t(wait1)].cause == signal0);  // it waited for the signal
  CHECK(tl.events[size_t(copy1)].cause == wait1);
  CHECK(tl.events[size_t(copy1)].signal == -1);
  const auto path = cost::critical_path(tl);
  CHECK(path == std::vector<size_t>{size_t(copy1), size_t(wait1), size_t(signal0), size_t(copy0)});
}
