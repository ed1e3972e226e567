// The machine a communicator runs on, as every rank learns it at init from
// the exchanged RankInfo (runtime/transport/transport.hpp): which node each
// rank sits on, its index there, the links between GPUs of one node, the NIC
// nearest each GPU, and the node-major order schedules number ranks in.
//
// Everything here is computed from what every rank was told, never from a
// rank-local fact, so every rank builds the same Machine and decides alike
// (one rank choosing a schedule another does not is a hang).
//
// Facts and where they come from:
//   node        host name + boot id (/proc/sys/kernel/random/boot_id), or
//               MK_HOST_ID (a process counts as that node: tests, containers
//               that share a kernel but not a network namespace)
//   local index a rank's place among its node's ranks, in rank order
//   pair link   between two GPUs of one node, as the rank's process sees
//               them (cuDeviceCanAccessPeer, cuDeviceGetP2PAttribute):
//               `nvlink` when peer access has native atomics (what NVLink
//               and NVSwitch give; PCIe peer access has none), `pcie` with
//               peer access only, `none` without, `unknown` when neither
//               process sees the other's GPU (CUDA_VISIBLE_DEVICES per
//               process), `self` for ranks sharing one GPU
//   NIC         the RDMA device (/sys/class/infiniband) or else the network
//               interface with a device (/sys/class/net) whose PCI path
//               shares the most bridges with the GPU's; "" (unknown) where
//               there is none
//
// Node-major order: schedules see rank r as GPU r % G of node r / G
// (compiler/topology/topology.hpp). Launchers often number ranks that way
// (torchrun, Slurm's block distribution), MPI with --map-by does not: the
// runtime keeps the permutation (`order`, `position`), for part 2 to run
// plans across nodes in node-major positions (nothing applies it yet: a
// communicator with plans sits on one node, where it is the identity).
// Nodes with different rank counts have no node-major shape: topology()
// says which nodes differ.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/topology/topology.hpp"
#include "runtime/transport/transport.hpp"

namespace mk::rt {

enum class PairLink : uint8_t { unknown = 0, none = 1, pcie = 2, nvlink = 3, self = 4 };
const char* name(PairLink l);

struct Machine {
  int nranks = 0;
  int nodes = 0;
  std::vector<std::string> node_name;     // by node: its host name (or MK_HOST_ID)
  std::vector<std::vector<int>> node_ranks;  // by node: its ranks, ascending
  std::vector<int> node_of;               // by rank: its node (nodes numbered by their lowest rank)
  std::vector<int> local_of;              // by rank: its index among its node's ranks
  std::vector<int> order;                 // node-major position -> rank (nodes in order, then local index)
  std::vector<int> position;              // rank -> node-major position
  // By node: the links between its ranks, [local a * its ranks + local b].
  std::vector<std::vector<PairLink>> node_links;
  std::vector<std::string> pci;           // by rank: its GPU's PCI bus id
  std::vector<std::string> nic;           // by rank: the NIC nearest its GPU ("" unknown)

  // Between ranks a and b: `none` for ranks on different nodes.
  PairLink link(int a, int b) const {
    const int n = node_of[size_t(a)];
    if (n != node_of[size_t(b)]) return PairLink::none;
    return node_links[size_t(n)][size_t(local_of[size_t(a)]) * node_ranks[size_t(n)].size() + size_t(local_of[size_t(b)])];
  }
  // Every node has the same number of ranks.
  bool uniform() const;
  // Ranks per node when uniform(), else -1.
  int ranks_per_node() const;
  // Rank r is node-major position r (no permutation needed).
  bool node_major() const;
  // The link kind between this machine's GPUs of one node: pcie when any
  // pair of distinct GPUs is PCIe-linked, else nvlink (unknown pairs count as
  // nvlink, as before this was detected). `none` pairs are the transport's
  // error (peer access), not this one's.
  topology::Link intra() const;
  // The compiler's view: nodes x ranks per node, intra link, and across
  // nodes the rails the NICs give (GPUs sharing a NIC share a rail, when
  // every node is alike and every NIC known). Throws RtError
  // (mkInvalidUsage) naming two nodes with different rank counts when the
  // nodes are not uniform.
  topology::Topology topology() const;
  // One line per node for MK_DEBUG: "node 0 'host' ranks 0,1 (local 0,1) nic ..."
  std::string describe() const;
};

// The machine of `all` (every rank's RankInfo, by rank).
Machine machine_of(const std::vector<RankInfo>& all);

// The NIC nearest the GPU at PCI bus id `bus` ("0000:17:00.0", any case,
// 4- or 8-digit domain), looked up under `sysfs_root` ("" for the real /):
// RDMA devices first, network interfaces with a PCI device else; "" when
// none (or the GPU's path is unknown). Ties go to the lower name.
std::string nearest_nic(const std::string& bus, const std::string& sysfs_root = "");

// `mkc topo`: this host's GPUs as one node of a machine of `nodes` such
// nodes, as a topology file (compiler/topology/topology.hpp read_file):
//   {"mkernel_topology": 1, "topology": {"nodes", "gpus_per_node", "intra",
//    "direct": false, "rails" (nodes > 1: GPUs sharing a NIC share a rail;
//    left out when a NIC is unknown or every GPU has its own)}, "host", "gpus": [{"index", "name", "pci", "nic"}],
//    "links": [[kind, ...], ...] (by GPU index), "note"}
// Throws RtError when the driver is missing or sees no GPU.
std::string local_machine_json(int nodes);

// This process's view of its GPU `dev`'s links to every other GPU it sees:
// fills `me.links` / `me.nlinks` (at most RankInfo::kMaxLinks), `me.pci`
// and `me.nic`. Checks every driver call; a failed query leaves the rest
// unknown (said with MK_DEBUG) rather than failing init: the facts only
// inform selection. (`mkc topo` uses the throwing form.)
void fill_machine_info(RankInfo& me, CUdevice dev);
void fill_machine_info_checked(RankInfo& me, CUdevice dev);

}  // namespace mk::rt
