#include "runtime/topology/machine.hpp"

#include <fmt/format.h>
#include <limits.h>
#include <stdlib.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <map>
#include <utility>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "runtime/api/status.hpp"
#include "runtime/driver/cuda_driver.hpp"

namespace mk::rt {

const char* name(PairLink l) {
  switch (l) {
    case PairLink::unknown: return "unknown";
    case PairLink::none: return "none";
    case PairLink::pcie: return "pcie";
    case PairLink::nvlink: return "nvlink";
    case PairLink::self: return "self";
  }
  return "?";
}

namespace {

std::string field(const char* s, size_t n) { return std::string(s, strnlen(s, n)); }

// What `a` says about its link to `b`'s GPU, if `a`'s process sees it.
PairLink seen(const RankInfo& a, const RankInfo& b) {
  const int n = std::clamp(a.nlinks, 0, RankInfo::kMaxLinks);
  for (int i = 0; i < n; ++i)
    if (std::memcmp(a.links[i].uuid, b.uuid, 16) == 0) {
      const uint8_t k = a.links[i].kind;
      return k <= uint8_t(PairLink::nvlink) ? PairLink(k) : PairLink::unknown;
    }
  return PairLink::unknown;
}

// The link between two ranks of one node: the weaker of what the two sides
// see (a side that does not see the other's GPU says nothing).
PairLink pair_link(const RankInfo& a, const RankInfo& b) {
  if (std::memcmp(a.uuid, b.uuid, 16) == 0) return PairLink::self;
  const PairLink x = seen(a, b), y = seen(b, a);
  if (x == PairLink::unknown) return y;
  if (y == PairLink::unknown) return x;
  return std::min(x, y);
}

std::string lower_bus_id(const std::string& bus) {
  std::string s = bus;
  for (char& ch : s) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  // An 8-digit domain ("00000000:17:00.0"): sysfs names it with 4.
  if (const size_t colon = s.find(':'); colon == 8 && s.compare(0, 4, "0000") == 0) s = s.substr(4);
  return s;
}

// The canonical path of `p` ("" when it does not resolve).
std::string real(const std::string& p) {
  char buf[PATH_MAX];
  if (!::realpath(p.c_str(), buf)) return {};
  return buf;
}

// Path components `a` and `b` share from the start.
size_t shared_components(const std::string& a, const std::string& b) {
  size_t n = 0, i = 0;
  while (i < a.size() && i < b.size()) {
    const size_t ea = a.find('/', i + 1), eb = b.find('/', i + 1);
    const std::string ca = a.substr(i, ea == std::string::npos ? std::string::npos : ea - i);
    const std::string cb = b.substr(i, eb == std::string::npos ? std::string::npos : eb - i);
    if (ca != cb) break;
    ++n;
    if (ea == std::string::npos) break;
    i = ea;
  }
  return n;
}

// Rails of one node's GPUs (in local order) from their NICs: GPUs that share
// a NIC share a rail, numbered by first use; empty when a NIC is unknown or
// every GPU has its own (the default: rail = local index).
std::vector<int32_t> rails_of(const std::vector<std::string>& nics) {
  std::vector<std::string> seen;
  std::vector<int32_t> rails;
  bool identity = true;
  for (const std::string& n : nics) {
    if (n.empty()) return {};
    auto it = std::find(seen.begin(), seen.end(), n);
    if (it == seen.end()) it = seen.insert(seen.end(), n);
    rails.push_back(int32_t(it - seen.begin()));
    identity = identity && rails.back() == int32_t(rails.size() - 1);
  }
  return identity ? std::vector<int32_t>{} : rails;
}

}  // namespace

bool Machine::uniform() const {
  for (const auto& r : node_ranks)
    if (r.size() != node_ranks.front().size()) return false;
  return true;
}

int Machine::ranks_per_node() const { return uniform() && nodes > 0 ? int(node_ranks.front().size()) : -1; }

bool Machine::node_major() const {
  for (int r = 0; r < nranks; ++r)
    if (order[size_t(r)] != r) return false;
  return true;
}

topology::Link Machine::intra() const {
  for (const auto& l : node_links)
    if (std::find(l.begin(), l.end(), PairLink::pcie) != l.end()) return topology::Link::pcie;
  return topology::Link::nvlink;
}

topology::Topology Machine::topology() const {
  if (!uniform()) {
    size_t odd = 1;
    while (node_ranks[odd].size() == node_ranks[0].size()) ++odd;
    fail(mkInvalidUsage,
         fmt::format("the nodes of this communicator have different numbers of ranks: node '{:.64}' has {} (ranks "
                     "{}...) and node '{:.64}' has {} (ranks {}...); schedules across nodes need the same number of "
                     "ranks on every node",
                     node_name[0], node_ranks[0].size(), node_ranks[0].front(), node_name[odd], node_ranks[odd].size(),
                     node_ranks[odd].front()));
  }
  topology::Topology t;
  t.nodes = nodes;
  t.gpus_per_node = ranks_per_node();
  t.intra = intra();
  // Across nodes, rails from the NICs when every node's GPUs share them
  // alike (one node has no network: none).
  if (nodes > 1) {
    std::vector<std::vector<int32_t>> per_node;
    for (const auto& rs : node_ranks) {
      std::vector<std::string> nics;
      for (int r : rs) nics.push_back(nic[size_t(r)]);
      per_node.push_back(rails_of(nics));
    }
    if (std::all_of(per_node.begin(), per_node.end(), [&](const auto& x) { return x == per_node[0]; }))
      t.rails = per_node[0];
  }
  return t;
}

std::string Machine::describe() const {
  std::string s = fmt::format("{} node(s), {} rank(s){}{}", nodes, nranks,
                              uniform() ? fmt::format(", {} per node", ranks_per_node()) : ", unequal nodes",
                              node_major() ? "" : ", not node-major (permuted)");
  for (int n = 0; n < nodes; ++n) {
    s += fmt::format("\n  node {} '{:.64}': ranks", n, node_name[size_t(n)]);
    for (int r : node_ranks[size_t(n)])
      s += fmt::format(" {}[{}{}{}]", r, pci[size_t(r)].empty() ? "?" : pci[size_t(r)], nic[size_t(r)].empty() ? "" : " nic ",
                       nic[size_t(r)]);
    const auto& rs = node_ranks[size_t(n)];
    if (rs.size() > 1) {
      std::map<std::string, int> kinds;
      for (size_t i = 0; i < rs.size(); ++i)
        for (size_t j = i + 1; j < rs.size(); ++j) ++kinds[name(link(rs[i], rs[j]))];
      s += "; pairs:";
      for (const auto& [k, c] : kinds) s += fmt::format(" {} {}", c, k);
    }
  }
  return s;
}

Machine machine_of(const std::vector<RankInfo>& all) {
  Machine m;
  m.nranks = int(all.size());
  std::map<std::pair<std::string, std::string>, int> index;
  for (int r = 0; r < m.nranks; ++r) {
    const RankInfo& p = all[size_t(r)];
    const auto key = std::make_pair(field(p.host, sizeof p.host), field(p.boot_id, sizeof p.boot_id));
    auto [it, fresh] = index.try_emplace(key, m.nodes);
    if (fresh) {
      ++m.nodes;
      m.node_name.push_back(key.first);
      m.node_ranks.emplace_back();
    }
    m.node_of.push_back(it->second);
    m.local_of.push_back(int(m.node_ranks[size_t(it->second)].size()));
    m.node_ranks[size_t(it->second)].push_back(r);
    m.pci.push_back(field(p.pci, sizeof p.pci));
    m.nic.push_back(field(p.nic, sizeof p.nic));
  }
  for (const auto& rs : m.node_ranks) m.order.insert(m.order.end(), rs.begin(), rs.end());
  m.position.assign(size_t(m.nranks), 0);
  for (int i = 0; i < m.nranks; ++i) m.position[size_t(m.order[size_t(i)])] = i;
  for (const auto& rs : m.node_ranks) {
    auto& l = m.node_links.emplace_back(rs.size() * rs.size(), PairLink::none);
    for (size_t a = 0; a < rs.size(); ++a)
      for (size_t b = 0; b < rs.size(); ++b) l[a * rs.size() + b] = pair_link(all[size_t(rs[a])], all[size_t(rs[b])]);
  }
  return m;
}

std::string nearest_nic(const std::string& bus, const std::string& sysfs_root) {
  namespace fs = std::filesystem;
  if (bus.empty()) return {};
  const std::string gpu = real(sysfs_root + "/sys/bus/pci/devices/" + lower_bus_id(bus));
  if (gpu.empty()) return {};
  for (const char* cls : {"/sys/class/infiniband", "/sys/class/net"}) {
    std::error_code ec;
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(sysfs_root + cls, ec)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    std::string best;
    size_t best_shared = 0;
    for (const auto& n : names) {
      const std::string dev = real(sysfs_root + cls + "/" + n + "/device");  // virtual interfaces have none
      if (dev.empty()) continue;
      const size_t shared = shared_components(gpu, dev);
      if (best.empty() || shared > best_shared) {
        best = n;
        best_shared = shared;
      }
    }
    if (!best.empty()) return best;
  }
  return {};
}

void fill_machine_info(RankInfo& me, CUdevice dev) {
  try {
    fill_machine_info_checked(me, dev);
  } catch (const RtError& e) {
    // informational: a failed query leaves it unknown (every rank then sees
    // the same unknown) instead of failing this rank's init alone
    me.nlinks = 0;
    debug_log(std::string("machine: ") + e.what() + "; this GPU's links and NIC count as unknown");
  }
}

void fill_machine_info_checked(RankInfo& me, CUdevice dev) {
  const Driver& d = cu();
  char bus[32] = {};
  MK_CU(d.cuDeviceGetPCIBusId(bus, int(sizeof bus), dev), "reading the GPU's PCI bus id");
  std::strncpy(me.pci, lower_bus_id(bus).c_str(), sizeof me.pci - 1);
  std::strncpy(me.nic, nearest_nic(bus).c_str(), sizeof me.nic - 1);
  int count = 0;
  MK_CU(d.cuDeviceGetCount(&count), "counting GPUs");
  me.nlinks = 0;
  for (int i = 0; i < count && me.nlinks < RankInfo::kMaxLinks; ++i) {
    CUdevice other = 0;
    MK_CU(d.cuDeviceGet(&other, i), "cuDeviceGet");
    CUuuid uuid{};
    MK_CU(d.cuDeviceGetUuid(&uuid, other), "reading a GPU's UUID");
    if (std::memcmp(uuid.bytes, me.uuid, 16) == 0) continue;
    int access = 0, atomics = 0;
    MK_CU(d.cuDeviceCanAccessPeer(&access, dev, other), "cuDeviceCanAccessPeer");
    if (access)
      MK_CU(d.cuDeviceGetP2PAttribute(&atomics, CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED, dev, other),
            "cuDeviceGetP2PAttribute");
    RankInfo::Link& l = me.links[me.nlinks++];
    std::memcpy(l.uuid, uuid.bytes, 16);
    l.kind = uint8_t(!access ? PairLink::none : atomics ? PairLink::nvlink : PairLink::pcie);
  }
}

std::string local_machine_json(int nodes) {
  if (nodes < 1 || nodes > 65536) fail(mkInvalidArgument, fmt::format("--nodes {}: must be in 1..65536", nodes));
  const Driver& d = cu();
  int count = 0;
  MK_CU(d.cuDeviceGetCount(&count), "counting GPUs");
  if (count < 1) fail(mkSystemError, "this machine has no GPU the driver sees");
  std::vector<RankInfo> all(static_cast<size_t>(count));
  nlohmann::json gpus = nlohmann::json::array();
  char host[64] = {};
  ::gethostname(host, sizeof host - 1);
  for (int i = 0; i < count; ++i) {
    RankInfo& me = all[size_t(i)];
    std::memset(&me, 0, sizeof me);
    std::memcpy(me.host, host, sizeof me.host);
    CUdevice dev = 0;
    MK_CU(d.cuDeviceGet(&dev, i), "cuDeviceGet");
    CUuuid uuid{};
    MK_CU(d.cuDeviceGetUuid(&uuid, dev), "reading a GPU's UUID");
    std::memcpy(me.uuid, uuid.bytes, 16);
    fill_machine_info_checked(me, dev);
    char gname[128] = {};
    MK_CU(d.cuDeviceGetName(gname, int(sizeof gname) - 1, dev), "cuDeviceGetName");
    gpus.push_back({{"index", i}, {"name", gname}, {"pci", field(me.pci, sizeof me.pci)},
                    {"nic", field(me.nic, sizeof me.nic)}});
  }
  const Machine m = machine_of(all);
  topology::Topology t = m.topology();
  t.nodes = nodes;
  // Rails (across nodes only): GPUs that share a NIC share a rail.
  if (nodes > 1) t.rails = rails_of(m.nic);
  nlohmann::json links = nlohmann::json::array();
  for (int a = 0; a < count; ++a) {
    nlohmann::json row = nlohmann::json::array();
    for (int b = 0; b < count; ++b) row.push_back(name(m.link(a, b)));
    links.push_back(std::move(row));
  }
  nlohmann::json j = {
      {"mkernel_topology", 1},
      {"topology", topology::to_json(t)},
      {"host", field(host, sizeof host)},
      {"gpus", std::move(gpus)},
      {"links", std::move(links)},
      {"note", fmt::format("this host's {} GPU(s) as one node; {} node(s) assumed alike (--nodes). Links from peer "
                           "access: nvlink = native peer atomics, pcie = peer access without them",
                           count, nodes)}};
  return j.dump(1) + "\n";
}

}  // namespace mk::rt
