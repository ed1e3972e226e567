#include "runtime/transport/net/iface.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <cstring>

#include "runtime/api/status.hpp"

namespace mk::rt::net {
namespace {

bool starts(const std::string& name, const std::string& prefix) { return name.rfind(prefix, 0) == 0; }

bool link_local_v6(const sockaddr_in6& a) { return a.sin6_addr.s6_addr[0] == 0xfe && (a.sin6_addr.s6_addr[1] & 0xc0) == 0x80; }

}  // namespace

std::vector<Iface> list_ifaces() {
  std::vector<Iface> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;  // none known: callers fall back to loopback
  for (const ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || !i->ifa_name) continue;
    const int fam = i->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    if (fam == AF_INET6 && link_local_v6(*reinterpret_cast<const sockaddr_in6*>(i->ifa_addr))) continue;
    Iface f;
    f.name = i->ifa_name;
    f.family = fam;
    std::memcpy(&f.addr, i->ifa_addr, fam == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
    f.up = (i->ifa_flags & IFF_UP) != 0 && (i->ifa_flags & IFF_RUNNING) != 0;
    f.loopback = (i->ifa_flags & IFF_LOOPBACK) != 0;
    out.push_back(std::move(f));
  }
  ::freeifaddrs(list);
  return out;
}

IfnameSpec::IfnameSpec(const std::string& spec, const char* var) : spec_(spec) {
  if (spec.empty()) return;
  std::string list = spec;
  avoid_ = list[0] == '^';
  if (avoid_) list.erase(0, 1);
  exact_ = !list.empty() && list[0] == '=';
  if (exact_) list.erase(0, 1);
  for (size_t at = 0; at <= list.size();) {
    const size_t comma = std::min(list.find(',', at), list.size());
    if (comma > at) names_.push_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  if (names_.empty())
    fail(mkInvalidArgument,
         std::string(var) + "='" + spec + "' names no interface (expected e.g. eth0, ^docker or =ib0)");
}

bool IfnameSpec::allows(const Iface& f) const {
  if (!f.up) return false;
  if (names_.empty())
    return !f.loopback && !starts(f.name, "docker") && !starts(f.name, "virbr") && !starts(f.name, "veth");
  bool named = false;
  for (const std::string& x : names_)
    if (exact_ ? f.name == x : starts(f.name, x)) named = true;
  return named != avoid_;
}

Iface choose_iface(const std::vector<Iface>& ifaces, const IfnameSpec& spec, int family) {
  for (int fam : {AF_INET, AF_INET6}) {
    if (family && fam != family) continue;
    for (const Iface& f : ifaces)
      if (f.family == fam && spec.allows(f)) return f;
  }
  if (spec.empty()) {
    Iface lo;
    lo.name = "lo";
    lo.up = lo.loopback = true;
    if (family == AF_INET6) {
      auto* a = reinterpret_cast<sockaddr_in6*>(&lo.addr);
      a->sin6_family = AF_INET6;
      a->sin6_addr = in6addr_loopback;
      lo.family = AF_INET6;
    } else {
      auto* a = reinterpret_cast<sockaddr_in*>(&lo.addr);
      a->sin_family = AF_INET;
      a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      lo.family = AF_INET;
    }
    return lo;
  }
  const char* fam = family == AF_INET ? "IPv4 " : family == AF_INET6 ? "IPv6 " : "";
  fail(mkInvalidArgument, "socket interface '" + spec.text() + "' matches no " + fam +
                              "interface that is up; this host has: " + ifaces_text(ifaces));
}

std::string addr_text(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(sa);
    ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    return a->sin_port ? std::string(buf) + ":" + std::to_string(ntohs(a->sin_port)) : std::string(buf);
  }
  if (sa->sa_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(sa);
    ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
    return a->sin6_port ? "[" + std::string(buf) + "]:" + std::to_string(ntohs(a->sin6_port)) : std::string(buf);
  }
  return "(address family " + std::to_string(sa->sa_family) + ")";
}

std::string ifaces_text(const std::vector<Iface>& ifaces) {
  std::string have;
  for (const Iface& f : ifaces)
    have += (have.empty() ? "" : ", ") + f.name + " (" + addr_text(reinterpret_cast<const sockaddr*>(&f.addr)) +
            (f.up ? "" : ", down") + ")";
  return have.empty() ? std::string("none") : have;
}

int parse_family(const std::string& t, const char* var) {
  if (t.empty()) return 0;
  if (t == "AF_INET" || t == "4" || t == "inet" || t == "ipv4") return AF_INET;
  if (t == "AF_INET6" || t == "6" || t == "inet6" || t == "ipv6") return AF_INET6;
  fail(mkInvalidArgument, std::string(var) + "='" + t + "': expected AF_INET or AF_INET6");
}

}  // namespace mk::rt::net
