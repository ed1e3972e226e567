// What a plan is lowered for: nodes of GPUs, the link between any two ranks,
// and the alpha-beta constants the cost model uses per link kind.
//
// Ranks are numbered node-major: rank r is GPU `local(r) = r % gpus_per_node`
// of node `node(r) = r / gpus_per_node`. Inside a node GPUs are linked by
// NVLink (NVSwitch: every pair) or PCIe peer access; between nodes there is
// only the network, which only puts cross (ir/ops.def; stage_network makes
// them; a plain load or store across it is mk.verify.E017).
//
// Text form (`mkc --topology`, name()):
//   nvlink:N     one node of N GPUs over NVLink (the default, N = the ranks)
//   pcie:N       one node of N GPUs over PCIe peer access
//   NxG          N nodes of G GPUs: NVLink inside a node, network between
//   NxG:direct   the same shape with every pair treated as NVLink-linked. NOT a
//                real machine: a stand-in for compile benchmarks until network
//                operations have a code generator (and the verifier's
//                network model, verify/network.cpp, is proved on it).
//   NxG:pcie     PCIe peer access inside each node (combines with :direct)
// A one-node NxG is the same topology as nvlink:G and is named so.
//
// Rails: GPU `local` of every node uses NIC rail `rails[local]`; without
// `rails` a rank's rail is its local index. Rails are set from JSON only.
//
// Cost constants are defaults (measured H200 numbers for NVLink, DESIGN.md;
// PCIe and the network are assumptions: PCIe 4 x16 peer writes, one 400 Gb/s
// NIC per GPU). They are not part of the serialised form: they change no
// plan, only estimates.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace mk::topology {

enum class Link : uint8_t { self, nvlink, pcie, net };
const char* name(Link l);  // "self" "nvlink" "pcie" "net"

// One link kind in the alpha-beta model: a transfer of B bytes costs
// alpha_us + B / (gbps * 1e3) microseconds.
struct LinkCost {
  double alpha_us = 0;  // one flag round trip over this link
  double gbps = 0;      // per direction, both directions busy
};

struct Topology {
  int32_t nodes = 1;
  int32_t gpus_per_node = 1;
  Link intra = Link::nvlink;    // between GPUs of one node: nvlink or pcie
  bool direct = false;          // NxG:direct (see above); always false for one node
  std::vector<int32_t> rails;   // per local index; empty: rail = local index

  // cost model constants
  double launch_us = 4.5;  // kernel launch outside CUDA graphs
  LinkCost self{0.0, 2000.0};  // copies within one GPU's memory (read + write halves 4.3 TB/s)
  LinkCost nvlink{1.3, 365.0};
  LinkCost pcie{3.0, 25.0};
  LinkCost net{6.0, 45.0};

  int32_t nranks() const { return nodes * gpus_per_node; }
  // Rank queries; r must be in 0..nranks()-1 (callers check).
  int32_t node(int32_t r) const { return r / gpus_per_node; }
  int32_t local(int32_t r) const { return r % gpus_per_node; }
  int32_t rail(int32_t r) const;
  int32_t rank_of(int32_t node, int32_t local) const { return node * gpus_per_node + local; }
  Link link(int32_t a, int32_t b) const;
  const LinkCost& cost(Link l) const;
  std::string name() const;  // the text form: "nvlink:8", "pcie:4", "2x4", "2x4:direct"

  // Equal structure (the serialised fields; cost constants are not compared).
  bool operator==(const Topology& o) const;
};

// One node of `nranks` GPUs linked by `intra`.
Topology single(int32_t nranks, Link intra = Link::nvlink);

// Parses the text form; "" is nvlink:nranks. Throws mk.cli.E011 for malformed
// text or a shape whose rank count is not `nranks`. nranks 0: the text says
// the count ("nvlink:8", "2x4"); mk.cli.E004 if it does not.
Topology parse(const std::string& text, int32_t nranks);

// JSON: {"nodes":2,"gpus_per_node":4,"intra":"nvlink","direct":false,
// "rails":[...]} ("rails" only when given). from_json also takes the old label
// strings ("nvlink:8", "pcie:4", "" for the default). `bad(path, message)`
// reports a malformed field and must not return; `path` is relative ("" for
// the value itself, ".nodes", ...).
nlohmann::json to_json(const Topology& t);
using BadField = std::function<void(const std::string& path, const std::string& message)>;
// nranks 0: any count.
Topology from_json(const nlohmann::json& j, int32_t nranks, const BadField& bad);

// A topology file (`mkc topo` writes one; `mkc --topology-file` reads it):
// {"mkernel_topology": 1, "topology": <to_json's form>, ...what mkc topo saw}.
// Hostile input: a clear mk.cli.E011 naming the file and the JSON path;
// mk.cli.E004 when `nranks` (0: any) differs from the file's.
Topology read_file(const std::string& path, int32_t nranks);

}  // namespace mk::topology
