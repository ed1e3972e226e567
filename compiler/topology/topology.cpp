#include "compiler/topology/topology.hpp"

#include "mk/error.hpp"

namespace mk::topology {

std::string Topology::name() const { return kind + ":" + std::to_string(nranks); }

Topology parse(const std::string& text, int nranks) {
  Topology t;
  t.nranks = nranks;
  if (text.empty()) return t;
  auto colon = text.find(':');
  std::string kind = text.substr(0, colon);
  if (kind != "nvlink" && kind != "pcie")
    throw Error(ErrId::cli_E011, "unknown topology '" + text + "'", {}, "use nvlink:N or pcie:N");
  t.kind = kind;
  if (kind == "pcie") {
    t.link_gbps = 25;
    t.alpha_us = 3.0;
  }
  if (colon != std::string::npos) {
    int n = 0;
    try {
      n = std::stoi(text.substr(colon + 1));
    } catch (...) {
      n = -1;
    }
    if (n != nranks)
      throw Error(ErrId::cli_E011,
                  "topology '" + text + "' has " + text.substr(colon + 1) + " ranks but the schedule has " +
                      std::to_string(nranks));
  }
  return t;
}

}  // namespace mk::topology
