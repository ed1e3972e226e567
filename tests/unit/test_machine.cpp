// The machine a communicator learns at init (runtime/topology/machine.hpp),
// from RankInfo built here by hand: nodes, local indices, the node-major
// permutation, unequal nodes, pair links, the NIC nearest a GPU (on a sysfs
// tree built in a temporary directory), and topology files.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "compiler/topology/topology.hpp"
#include "runtime/api/status.hpp"
#include "runtime/topology/machine.hpp"
#include "support.hpp"

using namespace mk;
using rt::Machine;
using rt::PairLink;
using rt::RankInfo;
using mkt::contains;
using mkt::error_id;

namespace {

// A rank on host `host`, GPU `gpu` of that host (its UUID says both).
RankInfo rank_on(const std::string& host, int gpu) {
  RankInfo r{};
  std::strncpy(r.host, host.c_str(), sizeof r.host - 1);
  std::strncpy(r.boot_id, "boot", sizeof r.boot_id - 1);
  std::snprintf(reinterpret_cast<char*>(r.uuid), sizeof r.uuid, "%s-%d", host.c_str(), gpu);
  std::snprintf(r.pci, sizeof r.pci, "0000:%02x:00.0", 0x10 + gpu);
  return r;
}

// `a` sees `b`'s GPU linked by `kind`.
void sees(RankInfo& a, const RankInfo& b, PairLink kind) {
  RankInfo::Link& l = a.links[a.nlinks++];
  std::memcpy(l.uuid, b.uuid, 16);
  l.kind = uint8_t(kind);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const rt::RtError& e) {
    return e.what();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("machine: nodes, local indices and the node-major order of ranks numbered round-robin") {
  // MPI's --map-by node: rank r on host r % 2.
  std::vector<RankInfo> all;
  for (int r = 0; r < 8; ++r) all.push_back(rank_on(r % 2 ? "hostB" : "hostA", r / 2));
  const Machine m = rt::machine_of(all);
  CHECK(m.nodes == 2);
  CHECK(m.node_name == std::vector<std::string>{"hostA", "hostB"});
  CHECK(m.node_of == std::vector<int>{0, 1, 0, 1, 0, 1, 0, 1});
  CHECK(m.local_of == std::vector<int>{0, 0, 1, 1, 2, 2, 3, 3});
  CHECK(m.order == std::vector<int>{0, 2, 4, 6, 1, 3, 5, 7});
  CHECK(m.position == std::vector<int>{0, 4, 1, 5, 2, 6, 3, 7});
  CHECK_FALSE(m.node_major());
  CHECK(m.uniform());
  CHECK(m.ranks_per_node() == 4);
  const topology::Topology t = m.topology();
  CHECK(t.name() == "2x4");
  CHECK(m.link(0, 1) == PairLink::none);  // different nodes
  CHECK(m.pci[3] == "0000:11:00.0");

  // torchrun's numbering: node-major already.
  std::vector<RankInfo> block;
  for (int r = 0; r < 8; ++r) block.push_back(rank_on(r < 4 ? "hostA" : "hostB", r % 4));
  const Machine b = rt::machine_of(block);
  CHECK(b.node_major());
  CHECK(b.order == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
  // The first node is the one of rank 0, whatever the host names.
  std::vector<RankInfo> rev;
  for (int r = 0; r < 4; ++r) rev.push_back(rank_on(r < 2 ? "zeta" : "alpha", r % 2));
  CHECK(rt::machine_of(rev).node_name == std::vector<std::string>{"zeta", "alpha"});
  // The same host name with another boot id is another node (a rebooted or cloned host).
  std::vector<RankInfo> boots = {rank_on("h", 0), rank_on("h", 1)};
  std::strncpy(boots[1].boot_id, "other", sizeof boots[1].boot_id - 1);
  CHECK(rt::machine_of(boots).nodes == 2);
}

TEST_CASE("machine: rails across nodes come from the NICs the GPUs share, the same on every node") {
  auto node = [](const std::string& host, std::vector<std::string> nics) {
    std::vector<RankInfo> v;
    for (size_t g = 0; g < nics.size(); ++g) {
      v.push_back(rank_on(host, int(g)));
      std::strncpy(v.back().nic, nics[g].c_str(), sizeof v.back().nic - 1);
    }
    return v;
  };
  auto join = [](std::vector<RankInfo> a, const std::vector<RankInfo>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const std::vector<std::string> two = {"mlx5_0", "mlx5_0", "mlx5_1", "mlx5_1"};
  CHECK(rt::machine_of(join(node("a", two), node("b", two))).topology().rails == std::vector<int32_t>{0, 0, 1, 1});
  // a NIC per GPU is the default (no rails), one unknown NIC leaves them unknown
  const std::vector<std::string> own = {"m0", "m1", "m2", "m3"}, gap = {"m0", "m0", "", "m1"};
  CHECK(rt::machine_of(join(node("a", own), node("b", own))).topology().rails.empty());
  CHECK(rt::machine_of(join(node("a", gap), node("b", gap))).topology().rails.empty());
  // nodes wired differently: no rails (every rank computes the same)
  CHECK(rt::machine_of(join(node("a", two), node("b", own))).topology().rails.empty());
  // one node has no network: no rails, so its plans stay those of a plain node
  CHECK(rt::machine_of(node("a", two)).topology() == topology::single(4));
}

TEST_CASE("machine: nodes with different rank counts have no node-major shape, and the error names them") {
  std::vector<RankInfo> all = {rank_on("big", 0), rank_on("big", 1), rank_on("small", 0), rank_on("big", 2)};
  const Machine m = rt::machine_of(all);
  CHECK_FALSE(m.uniform());
  CHECK(m.ranks_per_node() == -1);
  const std::string e = error_of([&] { (void)m.topology(); });
  CHECK(contains(e, "node 'big' has 3 (ranks 0...)"));
  CHECK(contains(e, "node 'small' has 1 (ranks 2...)"));
  CHECK(contains(m.describe(), "unequal nodes"));
}

TEST_CASE("machine: pair links are the weaker of what both sides see, ranks on one GPU are 'self'") {
  RankInfo a = rank_on("h", 0), b = rank_on("h", 1), c = rank_on("h", 2), d = rank_on("h", 3);
  RankInfo a2 = a;  // a second rank on a's GPU
  sees(a, b, PairLink::nvlink);
  sees(b, a, PairLink::pcie);  // b's side says PCIe: the pair is PCIe
  sees(a, c, PairLink::nvlink);  // c's process does not see a's GPU: a's view holds
  // d sees nobody and nobody sees d: unknown
  const Machine m = rt::machine_of({a, b, c, d, a2});
  CHECK(m.link(0, 1) == PairLink::pcie);
  CHECK(m.link(1, 0) == PairLink::pcie);
  CHECK(m.link(0, 2) == PairLink::nvlink);
  CHECK(m.link(2, 0) == PairLink::nvlink);
  CHECK(m.link(0, 3) == PairLink::unknown);
  CHECK(m.link(0, 4) == PairLink::self);
  CHECK(m.intra() == topology::Link::pcie);
  CHECK(m.topology().name() == "pcie:5");
  CHECK(contains(m.describe(), "pairs: 1 nvlink 2 pcie 1 self 6 unknown"));
  // Without the PCIe pair the node counts as NVLink (unknown pairs as before detection).
  RankInfo b2 = rank_on("h", 1);
  sees(b2, a, PairLink::nvlink);
  a.nlinks = 0;
  sees(a, b2, PairLink::nvlink);
  CHECK(rt::machine_of({a, b2, d}).topology() == topology::single(3));
  // A hostile peer's link count or kind: clamped, read as unknown.
  RankInfo e = rank_on("h", 4), f = rank_on("h", 5);
  e.nlinks = 1 << 30;
  sees(f, e, PairLink(200));
  CHECK(rt::machine_of({e, f}).link(0, 1) == PairLink::unknown);
  f.nlinks = -5;
  CHECK(rt::machine_of({e, f}).link(1, 0) == PairLink::unknown);
}

TEST_CASE("machine: the NIC nearest a GPU is the one sharing the most PCI bridges with it, from sysfs") {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("mkt-sysfs-" + std::to_string(::getpid()));
  fs::remove_all(root);
  auto dev = [&](const std::string& path) {
    fs::create_directories(root / path);
    return root / path;
  };
  // Two PCIe switches under one root port each: GPU 0 and mlx5_0 share one, GPU 1 and mlx5_1 the other.
  const fs::path gpu0 = dev("sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:17:00.0");
  const fs::path nic0 = dev("sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:18:00.0");
  const fs::path gpu1 = dev("sys/devices/pci0000:00/0000:00:02.0/0000:02:00.0/0000:2a:00.0");
  const fs::path nic1 = dev("sys/devices/pci0000:00/0000:00:02.0/0000:02:00.0/0000:2b:00.0");
  const fs::path eth = dev("sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0");
  fs::create_directories(root / "sys/bus/pci/devices");
  fs::create_directory_symlink(gpu0, root / "sys/bus/pci/devices/0000:17:00.0");
  fs::create_directory_symlink(gpu1, root / "sys/bus/pci/devices/0000:2a:00.0");
  fs::create_directories(root / "sys/class/infiniband/mlx5_1");  // listed out of order on purpose
  fs::create_directories(root / "sys/class/infiniband/mlx5_0");
  fs::create_directory_symlink(nic0, root / "sys/class/infiniband/mlx5_0/device");
  fs::create_directory_symlink(nic1, root / "sys/class/infiniband/mlx5_1/device");
  fs::create_directories(root / "sys/class/net/lo");  // virtual: no device
  fs::create_directories(root / "sys/class/net/eth0");
  fs::create_directory_symlink(eth, root / "sys/class/net/eth0/device");

  CHECK(rt::nearest_nic("0000:17:00.0", root.string()) == "mlx5_0");
  // Two NICs as near as each other: the lower name.
  fs::create_directories(root / "sys/class/infiniband/mlx5_9");
  fs::create_directories(root / "sys/class/infiniband/mlx5_10");
  fs::create_directory_symlink(nic0, root / "sys/class/infiniband/mlx5_9/device");
  fs::create_directory_symlink(nic0, root / "sys/class/infiniband/mlx5_10/device");
  fs::remove_all(root / "sys/class/infiniband/mlx5_0");
  CHECK(rt::nearest_nic("0000:17:00.0", root.string()) == "mlx5_10");
  CHECK(rt::nearest_nic("0000:2A:00.0", root.string()) == "mlx5_1");      // the driver's upper case
  CHECK(rt::nearest_nic("00000000:2a:00.0", root.string()) == "mlx5_1");  // an 8-digit domain
  CHECK(rt::nearest_nic("0000:99:00.0", root.string()).empty());         // a GPU sysfs does not know
  CHECK(rt::nearest_nic("", root.string()).empty());
  // Without RDMA devices: the network interface with a device.
  fs::remove_all(root / "sys/class/infiniband");
  CHECK(rt::nearest_nic("0000:17:00.0", root.string()) == "eth0");
  fs::remove_all(root / "sys/class/net/eth0");
  CHECK(rt::nearest_nic("0000:17:00.0", root.string()).empty());  // nothing but lo
  fs::remove_all(root);
}

TEST_CASE("topology files: read back, and hostile ones refused naming the file and the field") {
  namespace fs = std::filesystem;
  const fs::path f = fs::temp_directory_path() / ("mkt-topo-" + std::to_string(::getpid()) + ".json");
  auto write = [&](const std::string& text) {
    std::ofstream(f) << text;
    return f.string();
  };
  const std::string good =
      R"({"mkernel_topology": 1, "topology": {"nodes": 2, "gpus_per_node": 4, "intra": "pcie", "rails": [0, 0, 1, 1]},
          "gpus": [], "note": "extra fields are what mkc topo saw"})";
  const topology::Topology t = topology::read_file(write(good), 0);
  CHECK(t.name() == "2x4:pcie");
  CHECK(t.rails == std::vector<int32_t>{0, 0, 1, 1});
  CHECK(topology::read_file(write(good), 8) == t);
  CHECK(error_id([&] { topology::read_file(write(good), 4); }) == ErrId::cli_E004);
  const std::pair<std::string, std::string> bad[] = {
      {"", "not valid JSON"},
      {"[1]", "$: expected an object"},
      {R"({"topology": {"nodes": 1, "gpus_per_node": 2}})", "$.mkernel_topology: expected 1"},
      {R"({"mkernel_topology": 2, "topology": {}})", "$.mkernel_topology: expected 1"},
      {R"({"mkernel_topology": 1})", "$.topology: missing"},
      {R"({"mkernel_topology": 1, "topology": {"nodes": 0, "gpus_per_node": 2}})", "$.topology.nodes"},
      {R"({"mkernel_topology": 1, "topology": {"nodes": 1, "gpus_per_node": 2, "intra": "x"}})", "$.topology.intra"},
      {R"({"mkernel_topology": 1, "topology": {"nodes": 1, "gpus_per_node": 2, "rails": [0, 5]}})",
       "$.topology.rails"},
      {std::string(200, '[') + std::string(200, ']'), "nested more than 16 levels"},
      {R"({"mkernel_topology": 1, "topology": {"nodes": 1047553, "gpus_per_node": 4100}})",
       "is more than 1048576 ranks"},  // each count in range, their product not
  };
  for (const auto& [text, says] : bad) {
    CAPTURE(text);
    const std::string e = error_of([&] { topology::read_file(write(text), 0); });
    CHECK(contains(e, "topology file '" + f.string() + "'"));
    CHECK(contains(e, says));
  }
  CHECK(contains(error_of([&] { topology::read_file(write(std::string((1 << 20) + 1, ' ')), 0); }), "larger than 1 MiB"));
  fs::remove(f);
  CHECK(contains(error_of([&] { topology::read_file(f.string(), 0); }), "cannot be read"));
}

TEST_CASE("mkc topo: a node count out of range is refused before the driver is asked") {
  for (int nodes : {0, -1, 65537}) {
    CAPTURE(nodes);
    const std::string e = error_of([&] { (void)rt::local_machine_json(nodes); });
    CHECK(contains(e, "--nodes " + std::to_string(nodes) + ": must be in 1..65536"));
  }
}
