#include "runtime/bootstrap/address.hpp"

#include <arpa/inet.h>
#include <netdb.h>

#include <algorithm>
#include <cstring>

#include "compiler/common/env_parse.hpp"
#include "runtime/api/status.hpp"
#include "runtime/transport/net/iface.hpp"

namespace mk::rt {

uint16_t SockAddr::port() const {
  return ntohs(family() == AF_INET6 ? reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port
                                    : reinterpret_cast<const sockaddr_in*>(&ss)->sin_port);
}

void SockAddr::set_port(uint16_t port) {
  if (family() == AF_INET6)
    reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port = htons(port);
  else
    reinterpret_cast<sockaddr_in*>(&ss)->sin_port = htons(port);
}

std::string SockAddr::text() const {
  std::string t = net::addr_text(sa());
  // addr_text leaves port 0 out; the bootstrap's messages always name it
  if (port() == 0) t = family() == AF_INET6 ? "[" + t + "]:0" : t + ":0";
  return t;
}

SockAddr SockAddr::of(const sockaddr* sa) {
  SockAddr a;
  std::memcpy(&a.ss, sa, sa->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in));
  return a;
}

WireAddr to_wire(const SockAddr& a) {
  WireAddr w;
  w.family = uint16_t(a.family());
  if (a.family() == AF_INET6) {
    const auto* s = reinterpret_cast<const sockaddr_in6*>(&a.ss);
    w.port = s->sin6_port;
    w.scope = htonl(s->sin6_scope_id);
    std::memcpy(w.addr, &s->sin6_addr, 16);
  } else {
    const auto* s = reinterpret_cast<const sockaddr_in*>(&a.ss);
    w.port = s->sin_port;
    std::memcpy(w.addr, &s->sin_addr, 4);
  }
  return w;
}

bool from_wire(const WireAddr& w, SockAddr* out) {
  *out = SockAddr{};
  if (w.port == 0) return false;
  if (w.family == AF_INET6) {
    auto* s = reinterpret_cast<sockaddr_in6*>(&out->ss);
    s->sin6_family = AF_INET6;
    s->sin6_port = w.port;
    s->sin6_scope_id = ntohl(w.scope);
    std::memcpy(&s->sin6_addr, w.addr, 16);
    return true;
  }
  if (w.family != AF_INET) return false;
  auto* s = reinterpret_cast<sockaddr_in*>(&out->ss);
  s->sin_family = AF_INET;
  s->sin_port = w.port;
  std::memcpy(&s->sin_addr, w.addr, 4);
  return true;
}

SockAddr parse_host_port(const std::string& text, const char* var, bool port_required, int family) {
  const std::string accepted =
      std::string("expected ") + (port_required ? "host:port or [IPv6 address]:port" : "host, host:port or [IPv6 address]:port") +
      ", the host an IPv4 or IPv6 address or a name that resolves to one, the port a decimal number in 1..65535 "
      "(digits only)" +
      (port_required ? "" : "; leave the port out for an ephemeral one");
  auto refuse = [&](const std::string& what) {
    fail(mkInvalidArgument, std::string(var) + "='" + text + "': " + what + "; " + accepted);
  };
  std::string host, port_text;
  bool has_port = false, bracketed = false;
  if (!text.empty() && text[0] == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos) refuse("the '[' before an IPv6 address is not closed");
    host = text.substr(1, close - 1);
    bracketed = true;
    const std::string rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest[0] != ':') refuse("unexpected text after ']'");
      has_port = true;
      port_text = rest.substr(1);
    }
  } else if (std::count(text.begin(), text.end(), ':') >= 2) {
    host = text;  // a bare IPv6 address: "[address]:port" gives it a port
  } else if (const size_t colon = text.rfind(':'); colon != std::string::npos) {
    host = text.substr(0, colon);
    has_port = true;
    port_text = text.substr(colon + 1);
  } else {
    host = text;
  }
  int64_t port = 0;
  if (has_port && (port_text.size() > 5 || !env_parse::parse_int(port_text, 1, 65535, &port)))
    refuse("the port '" + port_text + "' is not a number in 1..65535");
  if (port_required && !has_port) refuse("a port is required");
  if (host.empty()) refuse("the host is empty");
  for (unsigned char ch : host)
    if (ch <= ' ' || ch >= 0x7f) refuse("the host '" + host + "' has a space or control character");
  if (bracketed && family == AF_INET) refuse("an IPv6 address, but MK_SOCKET_FAMILY asks for IPv4");
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = bracketed ? AF_INET6 : family ? family : AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (bracketed) hints.ai_flags = AI_NUMERICHOST;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || !res)
    refuse("the host '" + host + "' is not an " +
           (hints.ai_family == AF_INET ? "IPv4" : hints.ai_family == AF_INET6 ? "IPv6" : "IPv4 or IPv6") +
           " address or a name that resolves to one (" + gai_strerror(rc) + ")");
  const addrinfo* pick = nullptr;
  for (const addrinfo* r = res; r && !pick; r = r->ai_next)
    if (r->ai_family == AF_INET) pick = r;  // IPv4 first where a name has both
  for (const addrinfo* r = res; r && !pick; r = r->ai_next)
    if (r->ai_family == AF_INET6) pick = r;
  if (!pick) {
    ::freeaddrinfo(res);
    refuse("the host '" + host + "' has no IPv4 or IPv6 address");
  }
  SockAddr a = SockAddr::of(pick->ai_addr);
  ::freeaddrinfo(res);
  a.set_port(uint16_t(port));
  return a;
}

}  // namespace mk::rt
