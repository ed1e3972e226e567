#include "compiler/topology/topology.hpp"

#include <fmt/format.h>

#include <charconv>
#include <fstream>
#include <nlohmann/json.hpp>

#include "mk/error.hpp"

namespace mk::topology {

namespace {

constexpr const char* kForms = "use nvlink:N, pcie:N, NxG (N nodes of G GPUs) or NxG:direct";

[[noreturn]] void malformed(const std::string& text, const std::string& why) {
  throw Error(ErrId::cli_E011, fmt::format("topology '{}': {}", text, why), {}, kForms);
}

// A positive decimal number, all of `s`; -1 otherwise.
int64_t positive(std::string_view s) {
  int64_t v = -1;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < 1) return -1;
  return v;
}

void check_ranks(const std::string& text, int64_t have, int32_t nranks) {
  if (have > (1 << 20)) malformed(text, "too many ranks");
  if (nranks != 0 && have != nranks)
    throw Error(ErrId::cli_E011,
                fmt::format("topology '{}' has {} ranks but the schedule has {}", text, have, nranks), {},
                "give --ranks and --topology the same rank count (NxG has N*G ranks)");
}

// Canonical form: one node is never "direct" (every pair already is linked).
Topology normalised(Topology t) {
  if (t.nodes == 1) t.direct = false;
  return t;
}

}  // namespace

const char* name(Link l) {
  switch (l) {
    case Link::self: return "self";
    case Link::nvlink: return "nvlink";
    case Link::pcie: return "pcie";
    case Link::net: return "net";
  }
  return "?";
}

int32_t Topology::rail(int32_t r) const { return rails.empty() ? local(r) : rails[size_t(local(r))]; }

Link Topology::link(int32_t a, int32_t b) const {
  if (a == b) return Link::self;
  if (node(a) == node(b)) return intra;
  return direct ? Link::nvlink : Link::net;
}

const LinkCost& Topology::cost(Link l) const {
  switch (l) {
    case Link::self: return self;
    case Link::nvlink: return nvlink;
    case Link::pcie: return pcie;
    case Link::net: return net;
  }
  return net;
}

std::string Topology::name() const {
  if (nodes == 1) return fmt::format("{}:{}", topology::name(intra), gpus_per_node);
  std::string s = fmt::format("{}x{}", nodes, gpus_per_node);
  if (intra == Link::pcie) s += ":pcie";
  if (direct) s += ":direct";
  return s;
}

bool Topology::operator==(const Topology& o) const {
  return nodes == o.nodes && gpus_per_node == o.gpus_per_node && intra == o.intra && direct == o.direct &&
         rails == o.rails;
}

Topology single(int32_t nranks, Link intra) {
  Topology t;
  t.gpus_per_node = nranks;
  t.intra = intra;
  return t;
}

Topology parse(const std::string& text, int32_t nranks) {
  if (nranks == 0 && (text == "" || text == "nvlink" || text == "pcie"))
    throw Error(ErrId::cli_E004, "topology '" + text + "' does not say how many ranks", {},
                "pass --ranks N, or a topology with a count: nvlink:8, 2x8");
  if (text.empty()) return single(nranks);
  const auto colon = text.find(':');
  const std::string head = text.substr(0, colon);
  if (head == "nvlink" || head == "pcie") {
    if (colon != std::string::npos) {
      const std::string tail = text.substr(colon + 1);
      const int64_t n = positive(tail);
      if (n < 0) malformed(text, "'" + tail + "' is not a positive rank count");
      check_ranks(text, n, nranks);
      nranks = int32_t(n);
    }
    return single(nranks, head == "pcie" ? Link::pcie : Link::nvlink);
  }
  const auto x = head.find('x');
  if (x == std::string::npos) throw Error(ErrId::cli_E011, "unknown topology '" + text + "'", {}, kForms);
  const int64_t nodes = positive(std::string_view(head).substr(0, x));
  const int64_t gpus = positive(std::string_view(head).substr(x + 1));
  if (nodes < 0 || gpus < 0) malformed(text, "NxG needs two positive numbers, e.g. 2x8");
  if (nodes > (1 << 20) || gpus > (1 << 20)) malformed(text, "too many ranks");
  Topology t;
  t.nodes = int32_t(nodes);
  t.gpus_per_node = int32_t(gpus);
  // suffixes, in any order: ":pcie" (inside a node), ":direct"
  for (size_t at = colon; at != std::string::npos;) {
    const size_t next = text.find(':', at + 1);
    const std::string word = text.substr(at + 1, next == std::string::npos ? std::string::npos : next - at - 1);
    if (word == "direct")
      t.direct = true;
    else if (word == "pcie")
      t.intra = Link::pcie;
    else
      malformed(text, "'" + word + "' is not a known suffix (':direct' or ':pcie')");
    at = next;
  }
  check_ranks(text, nodes * gpus, nranks);
  return normalised(t);
}

nlohmann::json to_json(const Topology& t) {
  nlohmann::json j = {{"nodes", t.nodes},
                      {"gpus_per_node", t.gpus_per_node},
                      {"intra", name(t.intra)},
                      {"direct", t.direct}};
  if (!t.rails.empty()) j["rails"] = t.rails;
  return j;
}

Topology from_json(const nlohmann::json& j, int32_t nranks, const BadField& bad) {
  if (j.is_string()) {
    // the label form of older files ("nvlink:8", "pcie:4", "")
    try {
      return parse(j.get<std::string>(), nranks);
    } catch (const Error& e) {
      bad("", e.message());
    }
  }
  if (!j.is_object()) bad("", "expected an object {\"nodes\":N,\"gpus_per_node\":G,...} or a label like \"nvlink:8\"");
  auto count = [&](const char* key) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > (1 << 20))
      bad(std::string(".") + key, "expected a positive integer");
    return int32_t(it->get<int64_t>());
  };
  Topology t;
  t.nodes = count("nodes");
  t.gpus_per_node = count("gpus_per_node");
  if (int64_t(t.nodes) * t.gpus_per_node > (1 << 20))
    bad("", fmt::format("{} nodes of {} GPUs is more than {} ranks", t.nodes, t.gpus_per_node, 1 << 20));
  if (nranks != 0 && int64_t(t.nodes) * t.gpus_per_node != nranks)
    bad("", fmt::format("{} nodes of {} GPUs is {} ranks but the schedule has {}", t.nodes, t.gpus_per_node,
                        int64_t(t.nodes) * t.gpus_per_node, nranks));
  if (auto it = j.find("intra"); it != j.end()) {
    if (!it->is_string() || (*it != "nvlink" && *it != "pcie")) bad(".intra", "expected \"nvlink\" or \"pcie\"");
    t.intra = *it == "pcie" ? Link::pcie : Link::nvlink;
  }
  if (auto it = j.find("direct"); it != j.end()) {
    if (!it->is_boolean()) bad(".direct", "expected true or false");
    t.direct = it->get<bool>();
  }
  if (auto it = j.find("rails"); it != j.end()) {
    if (!it->is_array() || it->size() != size_t(t.gpus_per_node))
      bad(".rails", fmt::format("expected an array of {} rail numbers (one per GPU of a node)", t.gpus_per_node));
    for (const auto& r : *it) {
      if (!r.is_number_integer() || r.get<int64_t>() < 0 || r.get<int64_t>() >= t.gpus_per_node)
        bad(".rails", fmt::format("rail numbers must be integers in 0..{}", t.gpus_per_node - 1));
      t.rails.push_back(int32_t(r.get<int64_t>()));
    }
  }
  return normalised(t);
}

Topology read_file(const std::string& path, int32_t nranks) {
  constexpr std::streamsize kMax = 1 << 20;
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(ErrId::cli_E011, "topology file '" + path + "' cannot be read", {}, "`mkc topo -o FILE` writes one");
  std::string text(size_t(kMax) + 1, '\0');
  f.read(text.data(), kMax + 1);
  if (f.gcount() > kMax) throw Error(ErrId::cli_E011, "topology file '" + path + "' is larger than 1 MiB");
  text.resize(size_t(f.gcount()));
  auto bad = [&](const std::string& where, const std::string& what) -> void {
    throw Error(ErrId::cli_E011, fmt::format("topology file '{}': {}: {}", path, where, what), {},
                "`mkc topo -o FILE` writes one: {\"mkernel_topology\": 1, \"topology\": {\"nodes\": N, "
                "\"gpus_per_node\": G, \"intra\": \"nvlink\"}}");
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text, [](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
      if (depth > 16) throw std::runtime_error("nested more than 16 levels deep");
      return true;
    });
  } catch (const std::exception& e) {
    bad("$", std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) bad("$", "expected an object");
  if (auto v = j.find("mkernel_topology"); v == j.end() || *v != 1) bad("$.mkernel_topology", "expected 1 (the format's version)");
  auto t = j.find("topology");
  if (t == j.end()) bad("$.topology", "missing");
  Topology out = from_json(*t, 0, [&](const std::string& where, const std::string& what) { bad("$.topology" + where, what); });
  if (nranks != 0 && out.nranks() != nranks)
    throw Error(ErrId::cli_E004,
                fmt::format("topology file '{}' describes {} ranks ({}), not {}", path, out.nranks(), out.name(), nranks),
                {}, "leave --ranks out: the file says how many");
  return out;
}

}  // namespace mk::topology
