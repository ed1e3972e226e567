// Socket addresses of the bootstrap (the rendezvous, each rank's peer
// listener): IPv4 or IPv6, parsed from settings, and their fixed-size form
// in messages.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <string>

namespace mk::rt {

struct SockAddr {
  sockaddr_storage ss{};
  int family() const { return ss.ss_family; }
  socklen_t len() const { return family() == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in); }
  const sockaddr* sa() const { return reinterpret_cast<const sockaddr*>(&ss); }
  sockaddr* sa() { return reinterpret_cast<sockaddr*>(&ss); }
  uint16_t port() const;  // host order
  void set_port(uint16_t port);
  std::string text() const;  // "10.0.0.2:41234", "[fd00::2]:41234"
  static SockAddr of(const sockaddr* sa);
};

// An address as a rank announces it (24 bytes on the wire): family
// (AF_INET or AF_INET6), port and scope in network byte order, the IPv4
// address in the first 4 bytes of `addr` or the IPv6 address in all 16.
struct WireAddr {
  uint16_t family = 0;
  uint16_t port = 0;
  uint32_t scope = 0;
  uint8_t addr[16] = {};
};
static_assert(sizeof(WireAddr) == 24, "WireAddr is a wire format");
WireAddr to_wire(const SockAddr& a);
// False when `w` is not an IPv4 or IPv6 address with a port.
bool from_wire(const WireAddr& w, SockAddr* out);

// `text` as MK_BOOTSTRAP_ADDR and MK_COMM_ID take it: "host", "host:port",
// "[IPv6]:port", "[IPv6]" or a bare IPv6 address (no port then); the host an
// IPv4 or IPv6 address or a name that resolves to one (`family`: AF_INET or
// AF_INET6 to take only that family, 0 for IPv4 first, then IPv6), the port
// 1 to 5 decimal digits in 1..65535 and nothing else. No port: port 0
// (an ephemeral one), unless `port_required`. Throws mkInvalidArgument
// naming `var`, the value and what is accepted.
SockAddr parse_host_port(const std::string& text, const char* var, bool port_required, int family);

}  // namespace mk::rt
