// Helpers of the bootstrap tests (test_bootstrap*.cpp): ranks in threads, a
// rank that speaks the wire protocol by hand, and a TCP relay in the middle
// that counts, alters or duplicates bytes.
#pragma once

#include <doctest/doctest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mk.h"
#include "runtime/api/status.hpp"
#include "runtime/bootstrap/auth.hpp"
#include "runtime/bootstrap/bootstrap.hpp"
#include "runtime/bootstrap/frame.hpp"
#include "runtime/bootstrap/protocol.hpp"

namespace mkt::boot {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

inline int connect_to(const mk::rt::SockAddr& a) {
  int s = ::socket(a.family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (::connect(s, a.sa(), a.len()) != 0) {
    ::close(s);
    return -1;
  }
  return s;
}

// A listening socket on `at`'s address, an ephemeral port; its address in *a.
inline int listener_at(const mk::rt::SockAddr& at, mk::rt::SockAddr* a) {
  *a = at;
  a->set_port(0);
  int l = ::socket(a->family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(::bind(l, a->sa(), a->len()) == 0);
  REQUIRE(::listen(l, 64) == 0);
  socklen_t len = sizeof a->ss;
  ::getsockname(l, a->sa(), &len);
  return l;
}

// A listening socket on loopback of `family`, its address in *a.
inline int loopback_listener(mk::rt::SockAddr* a, int family = AF_INET) {
  *a = mk::rt::SockAddr{};
  if (family == AF_INET6) {
    auto* s = reinterpret_cast<sockaddr_in6*>(&a->ss);
    s->sin6_family = AF_INET6;
    s->sin6_addr = in6addr_loopback;
  } else {
    auto* s = reinterpret_cast<sockaddr_in*>(&a->ss);
    s->sin_family = AF_INET;
    s->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  }
  int l = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(::bind(l, a->sa(), a->len()) == 0);
  REQUIRE(::listen(l, 64) == 0);
  socklen_t len = sizeof a->ss;
  ::getsockname(l, a->sa(), &len);
  return l;
}

// Points `id` at another port of its address (a relay or a fake root there).
inline void set_id_port(mkUniqueId* id, uint16_t port) {
  const uint16_t be = htons(port);
  std::memcpy(id->internal + 8, &be, 2);
}

// A connection that authenticated like a rank and speaks frames by hand.
struct RawConn {
  int fd = -1;
  mk::rt::Link link;
  RawConn() = default;
  RawConn(const mk::rt::SockAddr& to, const mk::rt::Secret& secret, mk::rt::Channel ch) {
    fd = connect_to(to);
    REQUIRE(fd >= 0);
    mk::rt::SessionKeys keys;
    std::string why;
    REQUIRE(mk::rt::client_handshake(fd, secret, ch, Clock::now() + std::chrono::seconds(5), &why, &keys) ==
            mk::rt::ClientAuth::kOk);
    link = mk::rt::Link(keys);
  }
  RawConn(RawConn&& o) noexcept : fd(o.fd), link(o.link) { o.fd = -1; }
  ~RawConn() {
    if (fd >= 0) ::close(fd);
  }
  bool send_bytes(const std::string& b) {
    std::string why;
    return mk::rt::write_full(fd, b.data(), b.size(), Clock::now() + std::chrono::seconds(5), &why);
  }
  bool send(uint32_t type, int32_t a = 0, int32_t b = 0, int32_t c = 0, const std::string& payload = {}) {
    return send_bytes(link.seal(type, a, b, c, payload));
  }
  // The next message; false when the socket closed or it failed its check.
  bool read(mk::rt::FrameHeader* h, std::string* payload, int ms = 5000) {
    uint8_t head[mk::rt::kFrameHeadBytes];
    std::string why;
    const auto deadline = Clock::now() + std::chrono::milliseconds(ms);
    if (!mk::rt::read_full(fd, head, sizeof head, deadline, &why) || !link.open_head(head, h)) return false;
    payload->assign(h->len, '\0');
    return (h->len == 0 || mk::rt::read_full(fd, payload->data(), h->len, deadline, &why)) &&
           mk::rt::Link::payload_ok(*h, *payload);
  }
};

// The hello of rank `rank` of `nranks`, announcing `listener` as its peer listener.
inline std::string hello_payload(const mk::rt::IdContents& c, int32_t nranks, int32_t rank,
                                 const mk::rt::SockAddr& listener, uint32_t flags = 0) {
  mk::rt::proto::HelloBody h;
  h.nranks = nranks;
  h.rank = rank;
  h.flags = flags;
  std::memcpy(h.nonce, c.nonce, 16);
  h.listener = mk::rt::to_wire(listener);
  return std::string(reinterpret_cast<const char*>(&h), sizeof h);
}

// Runs fn(rank) for ranks 0..n-1 in threads; returns how many returned true
// (an exception counts as false and is printed).
inline int run_threads(int n, const std::function<bool(int)>& fn) {
  std::atomic<int> ok{0};
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      try {
        if (fn(r)) ++ok;
      } catch (const std::exception& e) {
        MESSAGE("rank " << r << ": " << std::string(e.what()));
      }
    });
  for (auto& t : ts) t.join();
  return ok.load();
}

// A TCP relay on `target`'s address (another port) in front of it: every connection it accepts
// is forwarded there. `alter(dir, offset, bytes)` may change what passes
// (dir 0: towards the target, 1: back; offset: of bytes[0] in that
// direction of that connection, counted from 0; `conn`: the connection's
// number, from 0); the relay counts what passed.
class TcpRelay {
 public:
  using Alter = std::function<void(int conn, int dir, uint64_t offset, std::string& bytes)>;
  TcpRelay(const mk::rt::SockAddr& target, Alter alter = nullptr) : target_(target), alter_(std::move(alter)) {
    listen_ = listener_at(target, &addr_);
    t_ = std::thread([this] { loop(); });
  }
  ~TcpRelay() {
    stop_ = true;
    t_.join();
    ::close(listen_);
    for (auto& c : conns_) {
      ::close(c.fd[0]);
      ::close(c.fd[1]);
    }
  }
  const mk::rt::SockAddr& address() const { return addr_; }
  uint64_t bytes(int dir) const { return passed_[dir].load(); }
  int connections() const { return accepted_.load(); }

 private:
  struct Pair {
    int fd[2];  // 0: from the client, 1: to the target
    uint64_t offset[2] = {0, 0};
    bool open[2] = {true, true};
    int n;
  };
  void loop() {
    while (!stop_) {
      std::vector<pollfd> fds{{listen_, POLLIN, 0}};
      for (auto& c : conns_)
        for (int d = 0; d < 2; ++d) fds.push_back({c.open[d] ? c.fd[d] : -1, POLLIN, 0});
      if (::poll(fds.data(), nfds_t(fds.size()), 20) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        int a = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
        int b = connect_to(target_);
        if (a >= 0 && b >= 0) {
          conns_.push_back({{a, b}, {0, 0}, {true, true}, accepted_++});
        } else {
          if (a >= 0) ::close(a);
          if (b >= 0) ::close(b);
        }
        continue;
      }
      for (size_t i = 0; i < conns_.size(); ++i)
        for (int d = 0; d < 2; ++d) {
          Pair& c = conns_[i];
          if (!fds[1 + 2 * i + size_t(d)].revents || !c.open[d]) continue;
          char buf[65536];
          const ssize_t got = ::recv(c.fd[d], buf, sizeof buf, 0);
          if (got <= 0) {  // pass the end on
            c.open[d] = false;
            ::shutdown(c.fd[1 - d], SHUT_WR);
            continue;
          }
          std::string bytes(buf, size_t(got));
          if (alter_) alter_(c.n, d, c.offset[d], bytes);
          c.offset[d] += uint64_t(got);
          passed_[d] += bytes.size();
          std::string why;
          mk::rt::write_full(c.fd[1 - d], bytes.data(), bytes.size(), Clock::now() + std::chrono::seconds(5), &why);
        }
    }
  }
  mk::rt::SockAddr target_, addr_;
  Alter alter_;
  int listen_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> passed_[2] = {0, 0};
  std::atomic<int> accepted_{0};
  std::vector<Pair> conns_;
  std::thread t_;
};

}  // namespace mkt::boot
