// What a plan is lowered for: how many ranks, how they are connected, and the
// alpha-beta constants the cost model uses. Named "KIND:RANKS", e.g.
// "nvlink:8" (one node, every GPU reaches every other over NVLink/NVSwitch) or
// "pcie:4". Defaults are measured H200 numbers (DESIGN.md).
#pragma once

#include <string>

namespace mk::topology {

struct Topology {
  std::string kind = "nvlink";  // nvlink | pcie
  int nranks = 1;
  double alpha_us = 1.3;     // one cross-GPU flag round trip
  double launch_us = 4.5;    // kernel launch outside CUDA graphs
  double link_gbps = 365.0;  // SM stores to a peer, per direction, both directions busy
  double local_gbps = 2000;  // copies within one GPU's memory (read + write halves 4.3 TB/s)
  std::string name() const;  // "nvlink:8"
};

// Parses "nvlink:8" / "pcie:4" / "" (-> nvlink:nranks); throws mk.cli.E011.
Topology parse(const std::string& text, int nranks);

}  // namespace mk::topology
