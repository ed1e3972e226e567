// The topology: its text and JSON forms, the DSL's accessors, the verifier's
// link checks (mk.verify.E017, E023), network operations (puts, flushes: the
// hierarchical schedules on real shapes, and broken variants refused), the
// hierarchical schedules on every shape, and the cost model's estimates
// against hand computations.
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
  for (const std::string name : {"allreduce.hier", "allreduce.hier_tree", "allgather.hier", "reducescatter.hier",
                                 "reducescatter.hier_direct"}) {
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

TEST_CASE("network operations: built-ins prove and simulate on real shapes, every dtype and op") {
  // Between nodes only puts move data (stage_network); each connection is a
  // reader and a deliverer thread block in the simulation, interleaved at
  // random. The hierarchical built-ins, and the one-node ones run across
  // nodes as written (broadcast, reduce and all-to-all among them; rooted
  // ones at the last rank too).
  const std::vector<DType> dtypes = {DType::fp32, DType::bf16, DType::fp16, DType::fp64, DType::int32,
                                     DType::uint8, DType::fp8e4m3};
  for (const char* shape : {"2x1", "2x2", "2x4", "4x2", "3x2", "2x3"})
    for (const std::string name : {"allreduce.hier", "allreduce.hier_tree", "allgather.hier", "reducescatter.hier",
                                   "reducescatter.hier_direct", "broadcast.direct", "reduce.direct", "alltoall.direct", "allreduce.ring",
                                   "allgather.ring"}) {
      CAPTURE(name);
      CAPTURE(shape);
      const Topology t = topology::parse(shape, 0);
      auto l = lower_for(name, t);
      size_t puts = 0, flushes = 0;
      for (const auto& op : l.variants[0].ops) {
        puts += op.kind == ir::OpKind::put;
        flushes += op.kind == ir::OpKind::flush;
      }
      CHECK(puts > 0);
      CHECK(flushes > 0);
      const bool reduces = collective_reduces(dsl::find_schedule(name)->coll);
      const std::vector<RedOp> ops = reduces ? std::vector<RedOp>{RedOp::sum, RedOp::max, RedOp::prod, RedOp::avg}
                                             : std::vector<RedOp>{RedOp::sum};
      for (size_t v = 0; v < l.variants.size(); ++v)
        for (DType dt : dtypes)
          for (RedOp op : ops)
            for (bool inplace : {false, true}) {
              if (op == RedOp::avg && !dtype_is_float(dt)) continue;
              if (inplace && inplace_rule(dsl::find_schedule(name)->coll) == InPlace::unsupported) continue;
              CAPTURE(v);
              CAPTURE(mk::name(dt));
              CAPTURE(int(op));
              CAPTURE(inplace);
              verify::SimOptions o;
              o.dtype = dt;
              o.op = op;
              o.count = 7 + int64_t(v) * 994;  // odd counts, a partial tile
              o.inplace = inplace;
              o.seed = uint64_t(o.count) * 31 + uint64_t(dt);
              if (collective_rooted(dsl::find_schedule(name)->coll)) o.root = inplace ? t.nranks() - 1 : 0;
              auto r = verify::simulate(l.variants[v], o);
              CHECK_MESSAGE(r.ok, r.first_bad);
            }
    }
}

// The pipeline proves a network schedule in a model made of its own ops and
// then gives the schedule back: exactly as it was (also after a failed proof).
TEST_CASE("network operations: a schedule proved in place comes back unchanged") {
  for (const std::string name : {"allreduce.hier", "alltoall.direct"}) {
    CAPTURE(name);
    ir::Schedule v = lower_for(name, topology::parse("2x4", 8)).variants[0];
    const std::string before = ir::to_json(v);
    verify::verify_sync_network(v, size_t(64) << 20);
    CHECK(ir::to_json(v) == before);
    // broken (no flushes): refused, and still given back as it was
    v.ops.erase(std::remove_if(v.ops.begin(), v.ops.end(), [](const ir::Op& op) { return op.kind == ir::OpKind::flush; }),
                v.ops.end());
    const std::string broken = ir::to_json(v);
    CHECK(error_id([&] { verify::verify_sync_network(v, size_t(64) << 20); }) == ErrId::verify_E004);
    CHECK(ir::to_json(v) == broken);
  }
}

TEST_CASE("network operations: 8x8 hierarchical built-ins prove and simulate") {
  for (const std::string name : {"allreduce.hier", "allreduce.hier_tree", "allgather.hier", "reducescatter.hier",
                                 "reducescatter.hier_direct"}) {
    CAPTURE(name);
    auto l = lower_for(name, topology::parse("8x8", 64));
    verify::SimOptions o;
    o.count = 4099;
    auto r = verify::simulate(l.variants.back(), o);
    CHECK_MESSAGE(r.ok, r.first_bad);
  }
}

namespace {

// The lowered allreduce.hier on 2x4 (its first bucket), for breaking.
ir::Schedule hier_2x4() { return lower_for("allreduce.hier", topology::parse("2x4", 8)).variants[0]; }

bool net_signal(const ir::Schedule& s, const ir::Op& op) {
  return op.kind == ir::OpKind::signal && ir::topology_of(s).link(op.rank, op.peer) == Link::net;
}

}  // namespace

TEST_CASE("network operations: broken variants are refused with their DSL line") {
  const ir::Schedule good = hier_2x4();
  verify::verify_sync(good);
  auto refused = [](const ir::Schedule& s, std::initializer_list<ErrId> ids, const char* file = "allreduce_hier.cpp:") {
    std::string what;
    const ErrId id = error_id([&] { verify::verify_sync(s); }, &what);
    INFO(what);
    CHECK(std::find(ids.begin(), ids.end(), id) != ids.end());
    CHECK(contains(what, file));
    return what;
  };
  SUBCASE("a dropped network signal leaves its wait unpaired") {
    ir::Schedule s = good;
    auto it = std::find_if(s.ops.begin(), s.ops.end(), [&](const ir::Op& op) { return net_signal(s, op); });
    REQUIRE(it != s.ops.end());
    s.ops.erase(it);
    refused(s, {ErrId::verify_E011});
  }
  SUBCASE("a wait on the wrong value: a step back instead of this step") {
    ir::Schedule s = good;
    // the wait that pairs with the first network signal (same rank and slot)
    auto sig = std::find_if(s.ops.begin(), s.ops.end(), [&](const ir::Op& op) { return net_signal(s, op); });
    REQUIRE(sig != s.ops.end());
    auto w = std::find_if(s.ops.begin(), s.ops.end(), [&](const ir::Op& op) {
      return op.kind == ir::OpKind::wait && op.rank == sig->peer && op.slot == sig->slot;
    });
    REQUIRE(w != s.ops.end());
    w->iter = w->iter == 0 ? -s.depth : 0;
    refused(s, {ErrId::verify_E004, ErrId::verify_E005, ErrId::verify_E011});  // a race, a cycle or a lone signal
  }
  SUBCASE("a slot reused one step early: the sender's credit wait dropped") {
    // reducescatter.hier's ring puts wait for their credit right before them
    ir::Schedule s = lower_for("reducescatter.hier", topology::parse("2x4", 8)).variants[0];
    verify::verify_sync(s);
    // a wait reaching back `depth` steps right before a put on its thread block
    size_t removed = 0;
    for (size_t i = 0; i + 1 < s.ops.size() && !removed; ++i) {
      const ir::Op& w = s.ops[i];
      if (w.kind != ir::OpKind::wait || w.iter != -s.depth) continue;
      for (size_t j = i + 1; j < s.ops.size(); ++j) {
        const ir::Op& n = s.ops[j];
        if (n.rank != w.rank || n.tb != w.tb) continue;
        if (n.kind == ir::OpKind::put) {
          s.ops.erase(s.ops.begin() + long(i));
          removed = 1;
        }
        break;
      }
    }
    REQUIRE(removed == 1);
    // a race, or the credit signal left unpaired
    refused(s, {ErrId::verify_E004, ErrId::verify_E011}, "reducescatter_hier.cpp:");
  }
  SUBCASE("a put with no flush after it: the kernel may return while its source is read") {
    ir::Schedule s = good;
    // the last flush of some thread block
    auto last = std::find_if(s.ops.rbegin(), s.ops.rend(), [](const ir::Op& op) { return op.kind == ir::OpKind::flush; });
    REQUIRE(last != s.ops.rend());
    s.ops.erase(std::next(last).base());
    const std::string what = refused(s, {ErrId::verify_E004});
    CHECK(contains(what, "has no flush after it"));
  }
  SUBCASE("a source written again before its flush") {
    ir::Schedule s = good;
    const size_t before = s.ops.size();
    s.ops.erase(std::remove_if(s.ops.begin(), s.ops.end(), [](const ir::Op& op) { return op.kind == ir::OpKind::flush; }),
                s.ops.end());
    REQUIRE(s.ops.size() < before);
    refused(s, {ErrId::verify_E004});
  }
  SUBCASE("a put to a node-local peer's address") {
    ir::Schedule s = good;
    auto p = std::find_if(s.ops.begin(), s.ops.end(), [](const ir::Op& op) { return op.kind == ir::OpKind::put; });
    REQUIRE(p != s.ops.end());
    const Topology t = ir::topology_of(s);
    p->dsts[0].rank = t.rank_of(t.node(p->rank), (t.local(p->rank) + 1) % t.gpus_per_node);
    const std::string what = refused(s, {ErrId::verify_E023});
    CHECK(contains(what, "a put to a node-local peer"));
  }
  SUBCASE("a plain copy across nodes once staged") {
    ir::Schedule s = good;
    auto p = std::find_if(s.ops.begin(), s.ops.end(), [](const ir::Op& op) { return op.kind == ir::OpKind::put; });
    REQUIRE(p != s.ops.end());
    p->kind = ir::OpKind::copy;
    std::string what;
    CHECK(error_id([&] { verify::verify_semantics(s); }, &what) == ErrId::verify_E017);
    CHECK(contains(what, "which have no direct link"));
    CHECK(contains(what, "allreduce_hier.cpp:"));
  }
}

// Schedules an independent review built to break the network model (synced
// IR, tests/fixtures/network/). A flush completes the *reads* of the puts
// before it, never their delivery: there a rank reads a slot whose put was
// only flushed (the model once had each connection read and deliver in one
// thread block, so a flush waited for the earlier puts' deliveries too and
// accepted it). A synced schedule that was not marked staged still may not
// copy across nodes.
TEST_CASE("network operations: a flush is not a delivery, and a synced schedule's copies stay inside nodes") {
  auto load = [](const char* name) {
    return ir::from_json(mkt::read_text(mkt::fs::path(mkt::test_dir()) / "fixtures" / "network" / name));
  };
  std::string what;
  const ir::Schedule flushed = load("flush_is_not_delivery.json");
  CHECK(error_id([&] { verify::verify_sync(flushed); }, &what) == ErrId::verify_E004);
  CHECK(contains(what, "race"));
  const ir::Schedule unstaged = load("copy_across_nodes_unstaged.json");
  CHECK_FALSE(unstaged.staged);
  CHECK(error_id([&] { verify::verify_sync(unstaged); }, &what) == ErrId::verify_E017);
  // puts never travel the LL protocol (a NIC writes no LL flags): every
  // bucket of a schedule with puts is simple
  for (const std::string name : {"allreduce.hier", "allgather.hier", "reducescatter.hier", "allgather.ring"})
    for (const auto& v : lower_for(name, topology::parse("2x2", 4)).variants) CHECK(v.proto == ir::Proto::simple);
}

TEST_CASE("mk.verify.E017: plain loads and stores across nodes, once staged or zero-copy") {
  // the author's program may copy across nodes (stage_network makes puts)
  const auto* one_shot = dsl::find_schedule("allreduce.one_shot");
  verify::verify_semantics(dsl::build(*one_shot, topology::parse("2x1", 2)));
  auto l = lower_for("allreduce.one_shot", topology::parse("2x1", 2));
  CHECK_FALSE(l.variants.empty());
  // zero-copy plans read and write peers' user buffers (allreduce.direct
  // does, in place): no put reaches those
  const auto* direct = dsl::find_schedule("allreduce.direct");
  compiler::LowerOptions o;
  o.topology = topology::parse("2x1", 2);
  o.zero_copy = true;
  std::string what;
  CHECK(error_id([&] { compiler::lower(dsl::build(*direct, *o.topology), o); }, &what) == ErrId::verify_E017);
  CHECK(contains(what, "memory of rank 1 (node 1) from rank 0 (node 0)"));
  CHECK(contains(what, "allreduce_direct.cpp:"));
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
// An all-gather schedule of `nranks` with no ops yet: 4096-byte tiles, one
// chunk, one instance (the cost tests' hand-built schedules).
ir::Schedule bare(const char* name, int32_t nranks) {
  ir::Schedule s;
  s.name = name;
  s.coll = Collective::allgather;
  s.nranks = nranks;
  s.tile_bytes = 4096;
  s.chunks = 1;
  s.instances = 1;
  return s;
}

// Appends an op of `kind` run by `rank` on thread block `tb`.
ir::Op* add_op(ir::Schedule& s, ir::OpKind kind, int32_t rank, int32_t tb, std::vector<ir::Ref> dsts,
               std::vector<ir::Ref> srcs) {
  ir::Op op;
  op.id = int32_t(s.ops.size());
  op.kind = kind;
  op.rank = rank;
  op.tb = tb;
  op.dsts = std::move(dsts);
  op.srcs = std::move(srcs);
  s.ops.push_back(op);
  return &s.ops.back();
}

ir::Schedule two_hop() {
  ir::Schedule s = bare("two_hop", 2);
  auto add = [&](ir::OpKind k, int32_t rank, std::vector<ir::Ref> dsts, std::vector<ir::Ref> srcs) {
    return add_op(s, k, rank, 0, std::move(dsts), std::move(srcs));
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

TEST_CASE("cost: transfers that share a NIC take turns, and its busy time bounds the rate") {
  // 2x2: rank 0 (node 0, rail 0) puts one tile to rank 2 and one to rank 3
  // (node 1) from two thread blocks: both hold rank 0's NIC, so the second
  // starts when the first ends. Inside a node (nvlink:4) they run at once.
  ir::Schedule s = bare("fan_out", 4);
  for (int32_t to : {2, 3})
    add_op(s, ir::OpKind::copy, 0, to - 2, {ir::Ref{to, ir::Buf::scratch, 0, 1}}, {ir::Ref{0, ir::Buf::input, 0, 1}});
  const double one = 0.2 + 4096 / 45e3;  // a tile over the network
  auto net = cost::step_timeline(s, topology::parse("2x2", 4), 4096);
  CHECK(net.step_us == doctest::Approx(2 * one).epsilon(1e-9));
  CHECK(net.bottleneck_us == doctest::Approx(2 * one).epsilon(1e-9));  // the NIC's, not a thread block's
  auto local = cost::step_timeline(s, topology::parse("nvlink:4", 4), 4096);
  CHECK(local.step_us == doctest::Approx(0.2 + 4096 / 365e3).epsilon(1e-9));
  // Rank 0 to rank 2 and rank 1 to rank 3: a NIC per GPU (rail = local
  // index) keeps them apart; both GPUs of a node on one NIC (rails [0, 0])
  // makes them take turns.
  s.ops[1].rank = 1;
  s.ops[1].srcs[0].rank = 1;
  Topology shared = topology::parse("2x2", 4);
  auto apart = cost::step_timeline(s, shared, 4096);
  CHECK(apart.step_us == doctest::Approx(one).epsilon(1e-9));
  shared.rails = {0, 0};
  auto together = cost::step_timeline(s, shared, 4096);
  CHECK(together.step_us == doctest::Approx(2 * one).epsilon(1e-9));
  // A NIC sends and receives at once: rank 0 to rank 2 and rank 2 to rank 0 do not wait for each other.
  s.ops[1].rank = 2;
  s.ops[1].srcs[0].rank = 2;
  s.ops[1].dsts[0].rank = 0;
  auto both_ways = cost::step_timeline(s, topology::parse("2x2", 4), 4096);
  CHECK(both_ways.step_us == doctest::Approx(one).epsilon(1e-9));
  // The selection follows: on 8x8, a one-shot's 63 transfers per rank through
  // one NIC cost more than the hierarchical tree's few.
  const Topology big = topology::parse("8x8", 64);
  auto at = [&](const char* name, int64_t bytes) {
    const auto l = compiler::lower(dsl::build(*dsl::find_schedule(name), big), compiler::LowerOptions{});
    return cost::estimate_us(compiler::variant_for(l, bytes), big, bytes);
  };
  for (int64_t bytes : {int64_t(64) << 10, int64_t(1) << 20}) {
    CAPTURE(bytes);
    CHECK(at("allreduce.hier_tree", bytes) < at("allreduce.one_shot", bytes));
    CHECK(at("allreduce.hier_tree", bytes) < at("allreduce.hier", bytes));  // log2 steps, not N-1
  }
  CHECK(at("allreduce.hier", int64_t(256) << 20) < at("allreduce.hier_tree", int64_t(256) << 20));  // the ring's bandwidth
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
