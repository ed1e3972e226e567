// Transports: how a rank reaches its peers' symmetric memory.
//
// A transport is set up once per communicator, after the ranks have
// exchanged their RankInfo through the bootstrap (or, for mkCommInitAll,
// directly in the process). It gives every rank's arena base as mapped on
// this GPU (what kernels address peers' scratch and flags by) and tears down
// whatever it opened. Today: `p2p` (NVLink / PCIe peer memory: peers in this
// process by address with access granted, peers in other processes by a VMM
// POSIX fd passed over a local socket). The network transport plugs in here:
// each peer gets the first transport of make_transports() that can reach it
// (NCCL's canConnect), decided from the exchanged RankInfo alone, so that
// every rank decides alike (choose_transports).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mk::rt {

class Arena;
class Bootstrap;

// What every rank tells the others at init (fixed layout: it travels as
// bytes between processes of one mKernel version).
struct RankInfo {
  char host[64];
  char boot_id[40];
  uint64_t token;  // identifies the process (pids repeat across containers)
  int64_t pid;
  int32_t device;
  int32_t arch;
  uint8_t uuid[16];
  uint64_t arena_base;
  uint64_t arena_size;
  // The machine (runtime/topology/machine.hpp): this GPU's PCI bus id, the
  // NIC nearest it ("" unknown), and its links to the other GPUs this
  // process sees (by UUID; kind: a PairLink).
  static constexpr int kMaxLinks = 32;
  struct Link {
    uint8_t uuid[16];
    uint8_t kind;
    uint8_t pad[7];
  };
  char pci[16];
  char nic[32];
  int32_t nlinks;
  int32_t pad;
  Link links[kMaxLinks];
};

// Everything a transport needs to connect one rank.
struct TransportSetup {
  int rank = 0;
  int nranks = 0;
  CUdevice cudev = 0;
  CUcontext ctx = nullptr;
  std::shared_ptr<Arena> arena;          // this rank's symmetric memory
  const std::vector<RankInfo>* all = nullptr;  // every rank's info, by rank
  Bootstrap* boot = nullptr;             // null when every rank is in this process
  int timeout_ms = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  // Whether this transport can reach `peer` from `me`: from what every rank
  // was told at init (never a rank-local fact), so every rank answers alike.
  virtual bool can_reach(const RankInfo& me, const RankInfo& peer) const = 0;
  // Connects to every peer; after it returns, peer_base() is valid for all
  // ranks. Throws RtError; on failure releases what it opened.
  virtual void connect(const TransportSetup& s) = 0;
  // Rank r's arena as this GPU addresses it (r == own rank: the arena itself).
  virtual CUdeviceptr peer_base(int r) const = 0;
  // Number of peers reached in other processes (for the log).
  virtual int remote_peers() const = 0;
};

// Peer memory inside a node: CUDA P2P within the process, VMM fds across.
std::unique_ptr<Transport> make_p2p_transport();

// One node: the same host name and boot id (or MK_HOST_ID).
bool same_node(const RankInfo& a, const RankInfo& b);

// The transports of this build, in order of preference: p2p (the network
// comes in multi-node part 2).
std::vector<std::unique_ptr<Transport>> make_transports();

// Which transport reaches each rank from `rank`: by_peer[r] indexes
// `transports` (-1: none). `a`, `b`: the first pair no transport reaches,
// looked for between rank 0 and every other rank (the same pairs on every
// rank, so every rank finds the same one; enough while reachability is
// "one node" or "every pair"); -1 when every rank is reached.
struct Reach {
  std::vector<int> by_peer;
  int a = -1, b = -1;
};
Reach choose_transports(const std::vector<std::unique_ptr<Transport>>& transports, const std::vector<RankInfo>& all,
                        int rank);

// Makes `a` findable by its base address for the other ranks of this process
// (p2p keeps a reference to each peer's arena it addresses).
void publish_arena(const std::shared_ptr<Arena>& a);

// Identifies this process among the ranks (a pid alone repeats across
// containers on one host); a forked child gets its own.
uint64_t process_token();

// Fails with mkSystemError unless GPUs a and b can reach each other's memory.
void check_peer_access(CUdevice a, CUdevice b);

}  // namespace mk::rt
