// Network interfaces for the socket transport and the bootstrap: this host's
// addresses (IPv4 and IPv6) and NCCL_SOCKET_IFNAME's syntax for choosing one.
// Standalone (libc only): libnccl-net-mkernel.so compiles it too.
#pragma once

#include <sys/socket.h>

#include <string>
#include <vector>

namespace mk::rt::net {

// One address of one interface, as getifaddrs reports it. IPv6 link-local
// addresses (fe80::/10) are left out: they need a scope to be reached and are
// not routable between hosts.
struct Iface {
  std::string name;
  sockaddr_storage addr{};  // port 0
  int family = 0;           // AF_INET or AF_INET6
  bool up = false;          // IFF_UP and IFF_RUNNING
  bool loopback = false;
};
std::vector<Iface> list_ifaces();

// NCCL_SOCKET_IFNAME's syntax: comma-separated name prefixes to use
// ("eth,ens"), or to avoid with a leading '^' ("^docker,lo"), '=' before the
// list for exact names ("=eth0"). Empty: the default rule (up, not loopback,
// not docker*, virbr*, veth*). `var` names the setting in errors.
class IfnameSpec {
 public:
  // Throws mkInvalidArgument when a non-empty spec names nothing.
  IfnameSpec(const std::string& spec, const char* var);
  bool empty() const { return names_.empty(); }
  // Whether the interface may be used (up interfaces only; loopback only when
  // the spec names it).
  bool allows(const Iface& f) const;
  const std::string& text() const { return spec_; }

 private:
  std::string spec_;
  bool avoid_ = false, exact_ = false;
  std::vector<std::string> names_;
};

// The first interface `spec` allows whose family is `family` (AF_INET,
// AF_INET6, or 0 for either: IPv4 first, then IPv6). With an empty spec and
// no such interface: loopback of that family (127.0.0.1, else ::1).
// Throws mkInvalidArgument when a non-empty spec allows none, naming the
// interfaces this host has.
Iface choose_iface(const std::vector<Iface>& ifaces, const IfnameSpec& spec, int family);

// "10.0.0.2:41234", "[fd00::2]:41234" (port 0: the address alone).
std::string addr_text(const sockaddr* sa);
// What `ifaces` holds, for errors: "eth0 (10.0.0.2), lo (127.0.0.1), ...".
std::string ifaces_text(const std::vector<Iface>& ifaces);
// MK_SOCKET_FAMILY / NCCL_SOCKET_FAMILY values: "", "AF_INET", "AF_INET6"
// (also "4", "6", "inet", "inet6"); throws mkInvalidArgument otherwise.
int parse_family(const std::string& text, const char* var);

}  // namespace mk::rt::net
