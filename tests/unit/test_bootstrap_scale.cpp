// The bootstrap at scale and across hosts: all-gathers and point-to-point
// messages run rank to rank (not through the root), every message after the
// handshake carries a MAC (a relay in the middle that alters a byte fails
// init, naming the sender), IPv6 rendezvous addresses, and MK_COMM_ID.
#include <doctest/doctest.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "mk.h"
#include "runtime/api/status.hpp"
#include "runtime/bootstrap/bootstrap.hpp"
#include "runtime/bootstrap/crypto.hpp"
#include "runtime/bootstrap/frame.hpp"
#include "runtime/bootstrap/peers.hpp"
#include "runtime/bootstrap/protocol.hpp"
#include "tests/scoped.hpp"
#include "tests/unit/test_bootstrap_util.hpp"

using namespace mk;
using mkt::ScopedEnv;
using mkt::boot::Clock;
using mkt::boot::RawConn;
using mkt::boot::run_threads;
using mkt::boot::seconds_since;
using mkt::boot::TcpRelay;

namespace {

// Rank r's part of all-gather k: differs per rank, round and byte; some
// ranks send nothing, some 100 KB.
std::string part(int r, int k) {
  const size_t n = (r * 7 + k) % 5 == 0 ? 0 : (r + k) % 4 == 0 ? 100000 : size_t(r * 37 + k * 11) % 300;
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = char((i * 131 + size_t(r) * 17 + size_t(k) * 7) & 0xff);
  return s;
}

bool gathers_ok(rt::Bootstrap& b, int k) {
  const auto all = b.allgather(part(b.rank(), k));
  bool ok = all.size() == size_t(b.nranks());
  for (int q = 0; q < b.nranks() && ok; ++q) ok = all[size_t(q)] == part(q, k);
  return ok;
}

// The error text of `f`, or "" when it did not throw.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

bool have_ipv6_loopback() {
  int s = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return false;
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  const bool ok = ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(s);
  return ok;
}

uint16_t free_port(int family = AF_INET) {
  rt::SockAddr a;
  const int l = mkt::boot::loopback_listener(&a, family);
  ::close(l);
  return a.port();
}

}  // namespace

TEST_CASE("bootstrap: SHA-256 on the CPU's SHA extensions gives the portable code's digests") {
  if (!rt::sha256_accelerated()) MESSAGE("this CPU has no SHA extensions: both runs below use the portable code");
  std::mt19937 rng(7);
  for (int i = 0; i < 500; ++i) {
    const size_t n = rng() % 1000;
    std::string s(n, '\0');
    for (char& ch : s) ch = char(rng());
    const size_t cut = n ? rng() % n : 0;
    rt::Digest d[2];
    for (int portable = 0; portable < 2; ++portable) {
      rt::sha256_force_portable(portable == 1);
      rt::Sha256 h;  // in two pieces: updates that straddle blocks
      h.update(s.data(), cut);
      h.update(s.data() + cut, n - cut);
      d[portable] = h.finish();
    }
    rt::sha256_force_portable(false);
    CAPTURE(n);
    REQUIRE(d[0] == d[1]);
  }
}

TEST_CASE("bootstrap: a message's MAC catches a flipped bit, a replay, a reorder, a drop and the other direction") {
  rt::SessionKeys a, b;
  rt::random_bytes(a.send.data(), 32);
  rt::random_bytes(a.recv.data(), 32);
  b.send = a.recv;
  b.recv = a.send;
  auto open = [](rt::Link& l, const std::string& frame, std::string* payload = nullptr) {
    rt::FrameHeader h;
    if (!l.open_head(frame.data(), &h)) return false;
    const std::string p = frame.substr(rt::kFrameHeadBytes);
    if (payload) *payload = p;
    return rt::Link::payload_ok(h, p);
  };
  rt::Link tx(a), rx(b);
  const std::string m0 = tx.seal(18, 1, 2, 3, "hello"), m1 = tx.seal(18, 1, 2, 3, "world"), m2 = tx.seal(19, 0, 0, 0);
  std::string got;
  {
    rt::Link r = rx;
    CHECK(open(r, m0, &got));
    CHECK(got == "hello");
    CHECK(open(r, m1));
    CHECK(open(r, m2));
    CHECK_FALSE(open(r, m2));  // replayed
  }
  for (size_t i = 0; i < m0.size(); ++i) {  // any flipped byte: head, tag or payload
    rt::Link r = rx;
    std::string bad = m0;
    bad[i] ^= 0x10;
    CAPTURE(i);
    CHECK_FALSE(open(r, bad));
  }
  {
    rt::Link r = rx;
    CHECK_FALSE(open(r, m1));  // reordered, or m0 dropped
  }
  {
    rt::Link back(b);
    rt::Link r(a);
    const std::string reply = back.seal(18, 1, 2, 3, "hello");
    rt::Link r2 = rx;
    CHECK_FALSE(open(r2, reply));  // a message of the other direction
    CHECK(open(r, reply));
  }
  {
    rt::SessionKeys other = b;
    other.recv[0] ^= 1;  // another connection's keys
    rt::Link r(other);
    CHECK_FALSE(open(r, m0));
  }
}

TEST_CASE("bootstrap: all-gathers of any rank count and sizes run rank to rank, in rank order") {
  ScopedEnv direct("MK_BOOTSTRAP_RELAY", "0");  // rank to rank, whatever the caller set
  ScopedEnv env("MK_BOOTSTRAP_TIMEOUT_MS", "20000");
  // Groups of one host's ranks (here: all) of at most 64, 3 or 1 ranks: one
  // leader relaying for its group, leaders all-gathering over Bruck's steps
  // (5 leaders of 13 ranks: not a power of two), and Bruck over all ranks.
  struct Groups {
    int ranks;
    Groups(int r) : ranks(r) { rt::bootstrap_group_ranks_for_tests(r); }
    ~Groups() { rt::bootstrap_group_ranks_for_tests(0); }
  };
  for (const int group : {0, 3, 1})
  for (const int n : {1, 2, 3, 5, 8, 13}) {
    Groups set(group);
    CAPTURE(group);
    CAPTURE(n);
    mkUniqueId id;
    REQUIRE(mkGetUniqueId(&id) == mkSuccess);
    CHECK(run_threads(n, [&](int r) {
            rt::Bootstrap b(id, n, r);
            CHECK_FALSE(b.relay());
            bool ok = true;
            for (int k = 0; k < 4; ++k) ok = gathers_ok(b, k) && ok;
            b.barrier();
            return ok;
          }) == n);
  }
}

TEST_CASE("bootstrap: after the rendezvous the root carries a few bytes a rank, not the all-gathers "
          "(MK_BOOTSTRAP_RELAY=1: all of them)") {
  ScopedEnv env("MK_BOOTSTRAP_TIMEOUT_MS", "20000");
  const int n = 8;
  const size_t blob = 4096;
  uint64_t through[2] = {};
  for (const bool relay : {false, true}) {
    CAPTURE(relay);
    ScopedEnv relaying("MK_BOOTSTRAP_RELAY", relay ? "1" : "0");
    mkUniqueId id;
    REQUIRE(mkGetUniqueId(&id) == mkSuccess);
    uint64_t sent = 0;
    {
      TcpRelay counter(rt::bootstrap_decode(id).address());  // every rank reaches the root through it
      mkUniqueId via = id;
      mkt::boot::set_id_port(&via, counter.address().port());
      CHECK(run_threads(n, [&](int r) {
              rt::Bootstrap b(via, n, r);
              CHECK(b.relay() == relay);
              bool ok = true;
              for (int k = 0; k < 3; ++k) {
                const auto all = b.allgather(std::string(blob, char('a' + r)));
                for (int q = 0; q < n; ++q) ok = ok && all[size_t(q)] == std::string(blob, char('a' + q));
              }
              return ok;
            }) == n);
      sent = counter.bytes(0) + counter.bytes(1);
    }
    through[relay] = sent;
  }
  MESSAGE("bytes through the root's socket, 8 ranks, 3 all-gathers of 4 KiB: direct " << through[0] << ", relayed "
                                                                                        << through[1]);
  // Direct: handshakes, hellos, the table of listeners, goodbyes (about 1.5 KB a rank).
  CHECK(through[0] < uint64_t(n) * 2048);
  // Relayed: every rank receives every part of every all-gather from the root.
  CHECK(through[1] > uint64_t(3) * n * n * blob);
}

TEST_CASE("bootstrap: send and recv between any two ranks, in order, both ways at once") {
  ScopedEnv env("MK_BOOTSTRAP_TIMEOUT_MS", "20000");
  const int n = 4;
  mkUniqueId id;
  REQUIRE(mkGetUniqueId(&id) == mkSuccess);
  auto msg = [](int from, int to, int k) {
    const size_t len = k == 0 ? (3u << 20) : k == 1 ? 0 : size_t(100 * k + from);  // 3 MiB: more than a socket holds
    std::string s(len, '\0');
    for (size_t i = 0; i < len; ++i) s[i] = char((i * 7 + size_t(from) * 3 + size_t(to) * 5 + size_t(k)) & 0xff);
    return s;
  };
  CHECK(run_threads(n, [&](int r) {
          rt::Bootstrap b(id, n, r);
          bool ok = gathers_ok(b, 0);  // all-gathers and messages share the connections
          for (int k = 0; k < 4; ++k) {
            // everyone sends to everyone before anyone receives (one message a pair in flight)
            for (int q = 0; q < n; ++q)
              if (q != r) b.send(q, msg(r, q, k));
            for (int q = 0; q < n; ++q)
              if (q != r) ok = b.recv(q) == msg(q, r, k) && ok;
          }
          ok = gathers_ok(b, 1) && ok;
          CHECK_THROWS_AS(b.send(r, "x"), rt::RtError);  // not to itself
          CHECK_THROWS_AS(b.recv(n), rt::RtError);
          return ok;
        }) == n);
}

TEST_CASE("bootstrap: a rank that leaves after an all-gather does not fail it for the others, and the next one fails "
          "at once, naming it") {
  ScopedEnv direct("MK_BOOTSTRAP_RELAY", "0");  // rank to rank, whatever the caller set
  ScopedEnv env("MK_BOOTSTRAP_TIMEOUT_MS", "20000");
  const int n = 6;
  for (int round = 0; round < 5; ++round) {
    CAPTURE(round);
    mkUniqueId id;
    REQUIRE(mkGetUniqueId(&id) == mkSuccess);
    std::vector<std::string> errors(n);
    std::vector<double> took(n, 0);
    CHECK(run_threads(n, [&](int r) {
            rt::Bootstrap b(id, n, r);
            if (!gathers_ok(b, 0)) return false;
            if (r == round % n) {  // leaves right after the second: its goodbye says it completed 2
              const bool ok = gathers_ok(b, 1);
              return ok;
            }
            if (!gathers_ok(b, 1)) return false;
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            const auto t0 = Clock::now();
            errors[size_t(r)] = error_of([&] { b.allgather("late"); });
            took[size_t(r)] = seconds_since(t0);
            return true;
          }) == n);
    const std::string who = "rank " + std::to_string(round % n) + "'s connection closed (process ended or communicator destroyed)";
    for (int r = 0; r < n; ++r) {
      if (r == round % n) continue;
      CAPTURE(r);
      CHECK_MESSAGE(has(errors[size_t(r)], who.c_str()), errors[size_t(r)]);
      CHECK(took[size_t(r)] < 2.0);
    }
  }
}

TEST_CASE("bootstrap: an abort ends a rank's wait for its peers at once, and the others' all-gathers fail naming it") {
  ScopedEnv direct("MK_BOOTSTRAP_RELAY", "0");  // rank to rank, whatever the caller set
  ScopedEnv env("MK_BOOTSTRAP_TIMEOUT_MS", "20000");
  const int n = 4;
  mkUniqueId id;
  REQUIRE(mkGetUniqueId(&id) == mkSuccess);
  rt::BootstrapCancel cancel;
  std::atomic<bool> joined{false};
  std::string waiting_error, later_error;
  double cancel_took = 0;
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      try {
        rt::Bootstrap b(id, n, r, r == 0 ? &cancel : nullptr);
        CHECK(gathers_ok(b, 0));
        if (r == 0) {
          joined = true;
          const auto t0 = Clock::now();
          waiting_error = error_of([&] { b.allgather("rank 0 waits: rank 3 never comes"); });
          cancel_took = seconds_since(t0);
        } else if (r != 3) {
          const auto e = error_of([&] { b.allgather("waits too"); });
          CHECK_MESSAGE(has(e, "rank 0 aborted its communicator"), e);
        } else {
          while (!joined) std::this_thread::sleep_for(std::chrono::milliseconds(5));
          std::this_thread::sleep_for(std::chrono::milliseconds(400));  // after the abort
          later_error = error_of([&] { b.allgather("late"); });
        }
      } catch (const std::exception& e) {
        FAIL_CHECK("rank " << r << ": " << std::string(e.what()));
      }
    });
  while (!joined) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  const auto t0 = Clock::now();
  cancel.cancel();
  for (auto& t : ts) t.join();
  CHECK(seconds_since(t0) < 2.0);
  CHECK(cancel_took < 1.5);
  CHECK_MESSAGE(has(waiting_error, "aborted"), waiting_error);
  CHECK_MESSAGE(has(later_error, "rank 0 aborted its communicator"), later_error);
}

TEST_CASE("bootstrap: a relay that alters one byte after the handshake fails init clearly, not silently "
          "(the connection to the root)") {
  ScopedEnv env("MK_BOOTSTRAP_TIMEOUT_MS", "4000");
  // Rank 1 reaches the root through the relay. After the handshake (68
  // bytes to the root, 64 back) come the hello (128 bytes) and the root's
  // answer, then (relaying) the all-gathers.
  struct Case {
    const char* name;
    int dir;
    uint64_t at;
    bool relay;
    const char* rank1_says;
    const char* rank0_says;
  };
  const Case cases[] = {
      {"the root's answer (the table of listeners)", 1, 64 + 80, false,
       "a message from the rendezvous to rank 1 failed its integrity check",
       "a message from the rendezvous to rank 1 failed its integrity check"},
      {"the hello's head", 0, 68 + 20, false, "our hello reached the rendezvous", "rendezvous"},
      {"the hello's payload", 0, 68 + 72 + 10, false, "failed its integrity check", "rendezvous"},
      {"a relayed part of an all-gather", 0, 68 + 128 + 72 + 3, true,
       "a message from rank 1 to the rendezvous failed its integrity check",
       "a message from rank 1 to the rendezvous failed its integrity check"},
  };
  for (const Case& k : cases) {
    CAPTURE(k.name);
    ScopedEnv relaying("MK_BOOTSTRAP_RELAY", k.relay ? "1" : "0");
    mkUniqueId id;
    REQUIRE(mkGetUniqueId(&id) == mkSuccess);
    std::atomic<int> flipped{0};
    TcpRelay mitm(rt::bootstrap_decode(id).address(), [&](int, int dir, uint64_t offset, std::string& bytes) {
      if (dir == k.dir && offset <= k.at && k.at < offset + bytes.size()) {
        bytes[size_t(k.at - offset)] ^= 0x04;
        ++flipped;
      }
    });
    mkUniqueId via = id;
    mkt::boot::set_id_port(&via, mitm.address().port());
    std::string said[2];
    const auto t0 = Clock::now();
    run_threads(2, [&](int r) {
      said[r] = error_of([&] {
        rt::Bootstrap b(r == 1 ? via : id, 2, r);
        b.allgather("part of rank " + std::to_string(r));
        b.allgather("again");
      });
      return true;
    });
    MESSAGE("rank 1: " << said[1]);
    MESSAGE("rank 0: " << said[0]);
    CHECK(flipped == 1);
    CHECK_MESSAGE(has(said[1], k.rank1_says), said[1]);
    CHECK_MESSAGE(has(said[0], k.rank0_says), said[0]);
    CHECK(seconds_since(t0) < 6.0);
  }
}

namespace {

// The rendezvous played by the test (it has the id's secret): it joins two
// ranks, tells rank 1 that rank 0 listens where `rank0_seen_at` is, and
// records what the ranks report afterwards.
struct FakeRoot {
  rt::SockAddr addr;
  int listener = -1;
  std::thread t;
  std::atomic<bool> stop{false};
  std::vector<rt::FrameHeader> reports[2];
  std::mutex mu;
  std::function<rt::SockAddr(const rt::SockAddr&)> route;  // rank 0's address as rank 1 gets it

  FakeRoot(const rt::IdContents& c, std::function<rt::SockAddr(const rt::SockAddr&)> route_rank0)
      : route(std::move(route_rank0)) {
    listener = mkt::boot::listener_at(c.address(), &addr);
    t = std::thread([this, c] { serve(c); });
  }
  ~FakeRoot() {
    stop = true;
    t.join();
    ::close(listener);
  }
  void serve(const rt::IdContents& c) {
    struct Joined {
      int fd;
      rt::Link link;
      rt::proto::HelloBody hello;
    };
    std::vector<Joined> ranks;
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    std::string why;
    while (ranks.size() < 2 && !stop) {
      pollfd p{listener, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      const int fd = ::accept(listener, nullptr, nullptr);
      rt::ServerHandshake hs(c.secret, rt::Channel::kBootstrap);
      uint8_t buf[64];
      if (!rt::read_full(fd, buf, hs.want(), deadline, &why)) return;
      const std::string reply = hs.feed(buf);
      if (!rt::write_full(fd, reply.data(), reply.size(), deadline, &why)) return;
      if (!rt::read_full(fd, buf, hs.want(), deadline, &why)) return;
      hs.feed(buf);
      if (!hs.done()) return;
      Joined j{fd, rt::Link(hs.keys()), {}};
      uint8_t head[rt::kFrameHeadBytes];
      rt::FrameHeader h;
      if (!rt::read_full(fd, head, sizeof head, deadline, &why) || !j.link.open_head(head, &h) ||
          !rt::read_full(fd, &j.hello, sizeof j.hello, deadline, &why))
        return;
      ranks.push_back(j);
    }
    if (ranks.size() < 2) return;
    if (ranks[0].hello.rank != 0) std::swap(ranks[0], ranks[1]);
    rt::SockAddr l0;
    if (!rt::from_wire(ranks[0].hello.listener, &l0)) return;
    for (int r = 0; r < 2; ++r) {
      rt::WireAddr table[2] = {rt::to_wire(r == 1 ? route(l0) : l0), ranks[1].hello.listener};
      const std::string m = ranks[size_t(r)].link.seal(rt::proto::kStatus, rt::proto::kJoined, 0, 0,
                                                       std::string(reinterpret_cast<const char*>(table), sizeof table));
      if (!rt::write_full(ranks[size_t(r)].fd, m.data(), m.size(), deadline, &why)) return;
    }
    while (!stop) {  // what the ranks report, until they leave
      for (int r = 0; r < 2; ++r) {
        pollfd p{ranks[size_t(r)].fd, POLLIN, 0};
        if (::poll(&p, 1, 10) <= 0) continue;
        uint8_t head[rt::kFrameHeadBytes];
        rt::FrameHeader h;
        if (!rt::read_full(ranks[size_t(r)].fd, head, sizeof head, Clock::now() + std::chrono::seconds(1), &why) ||
            !ranks[size_t(r)].link.open_head(head, &h))
          continue;
        std::lock_guard<std::mutex> lock(mu);
        reports[r].push_back(h);
      }
    }
    for (auto& j : ranks) ::close(j.fd);
  }
};

}  // namespace

TEST_CASE("bootstrap: a relay between two ranks that alters one byte fails the receiver, naming the sender, and "
          "the rendezvous hears of it") {
  ScopedEnv direct("MK_BOOTSTRAP_RELAY", "0");  // rank to rank, whatever the caller set
  ScopedEnv env("MK_BOOTSTRAP_TIMEOUT_MS", "4000");
  // Rank 1 sends to rank 0 first (Bruck's step 0) through the relay. On that
  // connection (opener to listener) come the handshake (68 bytes), rank 1's
  // hello (88 bytes), then its messages: 72-byte head and payload.
  for (const uint64_t at : {uint64_t(156 + 5), uint64_t(156 + 40), uint64_t(156 + 72 + 3)}) {
    CAPTURE(at);
    mkUniqueId id;
    REQUIRE(mkGetUniqueId(&id) == mkSuccess);
    const rt::IdContents c = rt::bootstrap_decode(id);
    std::unique_ptr<TcpRelay> mitm;
    std::atomic<int> flipped{0};
    FakeRoot root(c, [&](const rt::SockAddr& rank0) {
      mitm = std::make_unique<TcpRelay>(rank0, [&](int, int dir, uint64_t offset, std::string& bytes) {
        if (dir == 0 && offset <= at && at < offset + bytes.size()) {
          bytes[size_t(at - offset)] ^= 0x20;
          ++flipped;
        }
      });
      return mitm->address();
    });
    mkUniqueId fake = id;
    mkt::boot::set_id_port(&fake, root.addr.port());
    std::string said[2];
    run_threads(2, [&](int r) {
      said[r] = error_of([&] {
        rt::Bootstrap b(fake, 2, r);
        b.allgather("part of rank " + std::to_string(r));
      });
      return true;
    });
    MESSAGE("rank 0: " << said[0]);
    MESSAGE("rank 1: " << (said[1].empty() ? std::string("(completed: rank 0's part reached it)") : said[1]));
    CHECK(flipped == 1);
    CHECK_MESSAGE(has(said[0], "rank 0: a message from rank 1 to rank 0 failed its integrity check"), said[0]);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::lock_guard<std::mutex> lock(root.mu);
    bool reported = false;  // rank 0 told the rendezvous: a fault of rank 1's message
    for (const auto& h : root.reports[0])
      reported = reported || (h.type == rt::proto::kFault && h.a == 1 && h.b == rt::proto::kGoneIntegrity);
    CHECK(reported);
  }
}

TEST_CASE("bootstrap: a rank's peer listener keeps strangers out, and a flood of them does not stop the all-gathers") {
  ScopedEnv direct("MK_BOOTSTRAP_RELAY", "0");  // rank to rank, whatever the caller set
  ScopedEnv env("MK_BOOTSTRAP_TIMEOUT_MS", "20000");
  const int n = 4;
  mkUniqueId id;
  REQUIRE(mkGetUniqueId(&id) == mkSuccess);
  // The table of listeners passes the wire in the clear (it is only MACed):
  // a relay in front of the root reads it like any on-path observer.
  std::mutex mu;
  std::string seen;  // what the root sent to the relay's first connection
  TcpRelay tap(rt::bootstrap_decode(id).address(), [&](int conn, int dir, uint64_t, std::string& bytes) {
    std::lock_guard<std::mutex> lock(mu);
    if (conn == 0 && dir == 1) seen += bytes;
  });
  mkUniqueId via = id;
  mkt::boot::set_id_port(&via, tap.address().port());
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  double took = 0;
  std::vector<int> strangers;
  std::thread flood([&] {
    const auto t0 = Clock::now();
    while (ready < n && seconds_since(t0) < 10) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (ready < n) {  // a rank failed to join: let the others go on (and fail the test)
      go = true;
      return;
    }
    std::string table;
    {
      std::lock_guard<std::mutex> lock(mu);
      table = seen.substr(64 + rt::kFrameHeadBytes, n * sizeof(rt::WireAddr));
    }
    for (int r = 0; r < n; ++r) {
      rt::WireAddr w;
      std::memcpy(&w, table.data() + size_t(r) * sizeof w, sizeof w);
      rt::SockAddr at;
      if (!rt::from_wire(w, &at)) break;
      // idle ones, more than a listener keeps pending; garbage; a challenge without its proof
      for (int k = 0; k < rt::kMaxPendingPeers + 16; ++k) strangers.push_back(mkt::boot::connect_to(at));
      int g = mkt::boot::connect_to(at);
      std::string junk(4096, '\0');
      rt::random_bytes(junk.data(), junk.size());
      (void)!::send(g, junk.data(), junk.size(), MSG_NOSIGNAL);
      strangers.push_back(g);
      int ch = mkt::boot::connect_to(at);
      (void)!::send(ch, "MKP1abcdefghijklmnopqrstuvwxyz012345", 36, MSG_NOSIGNAL);
      strangers.push_back(ch);
    }
    go = true;
  });
  CHECK(run_threads(n, [&](int r) {
          rt::Bootstrap b(via, n, r);
          ++ready;
          while (!go) std::this_thread::sleep_for(std::chrono::milliseconds(5));
          const auto t0 = Clock::now();
          bool ok = true;
          for (int k = 0; k < 3; ++k) ok = gathers_ok(b, k) && ok;
          if (r == 0) took = seconds_since(t0);
          return ok;
        }) == n);
  flood.join();
  MESSAGE(strangers.size() << " strangers' connections; 3 all-gathers took " << took << " s");
  CHECK(took < 3.0);  // under one handshake deadline (5 s): evicted openers connect again
  // the strangers got nothing but the handshake's reply, and are closed
  int answered_beyond_handshake = 0;
  for (int s : strangers) {
    char buf[256];
    pollfd p{s, POLLIN, 0};
    if (::poll(&p, 1, 0) > 0 && ::recv(s, buf, sizeof buf, MSG_DONTWAIT) > 64) ++answered_beyond_handshake;
    ::close(s);
  }
  CHECK(answered_beyond_handshake == 0);
}

TEST_CASE("bootstrap: ranks that disagree on MK_BOOTSTRAP_RELAY are told so") {
  ScopedEnv direct("MK_BOOTSTRAP_RELAY", "0");  // rank to rank, whatever the caller set
  ScopedEnv env("MK_BOOTSTRAP_TIMEOUT_MS", "10000");
  mkUniqueId id;
  REQUIRE(mkGetUniqueId(&id) == mkSuccess);
  // Rank 0 (relaying) reaches the root through a relay that shows when its
  // hello has passed: then the root has fixed relaying for the job.
  TcpRelay counter(rt::bootstrap_decode(id).address());
  mkUniqueId via = id;
  mkt::boot::set_id_port(&via, counter.address().port());
  std::string rank0;
  std::thread t;
  struct Join {
    std::thread& t;
    ~Join() {
      if (t.joinable()) t.join();
    }
  } join{t};
  {
    ScopedEnv relay("MK_BOOTSTRAP_RELAY", "1");
    t = std::thread([&] {
      rank0 = error_of([&] {
        rt::Bootstrap b(via, 2, 0);
        CHECK(b.relay());
        b.barrier();
      });
    });
    const auto t0 = Clock::now();
    while (counter.bytes(0) < 68 + 128 && seconds_since(t0) < 10) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    REQUIRE(counter.bytes(0) >= 68 + 128);  // its handshake and hello
    // The root must have taken that hello before rank 1's (else rank 1 fixes
    // the mode and rank 0 is the one refused, and rank 1 waits): generous on
    // a loaded machine (20 ms failed once on CI's 2 cores).
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  CHECK_THROWS_WITH_AS(rt::Bootstrap(id, 2, 1), doctest::Contains("MK_BOOTSTRAP_RELAY differs"), rt::RtError);
  {
    ScopedEnv relay("MK_BOOTSTRAP_RELAY", "1");
    rt::Bootstrap b1(id, 2, 1);
    b1.barrier();
  }
  t.join();
  CHECK(rank0.empty());
}

TEST_CASE("bootstrap: IPv6: the id carries an IPv6 rendezvous, MK_BOOTSTRAP_ADDR takes [addr]:port, "
          "MK_SOCKET_FAMILY=AF_INET6 picks an IPv6 interface") {
  // Forms refused, with what is accepted (no socket needed for these).
  for (const char* bad : {"[::1", "[::1]x", "[::1]:", "[::1]:0", "[::1]:65536", "[127.0.0.1]:80", "[]:80", "::1:80x"}) {
    CAPTURE(bad);
    ScopedEnv addr("MK_BOOTSTRAP_ADDR", bad);
    const std::string e = error_of([] {
      mkUniqueId id;
      rt::bootstrap_create_id(&id);
    });
    CHECK_MESSAGE(has(e, (std::string("MK_BOOTSTRAP_ADDR='") + bad + "'").c_str()), e);
    CHECK(has(e, "[IPv6 address]:port"));
  }
  {  // an IPv4 id keeps the old layout: address in bytes 4-7, family byte 0
    ScopedEnv addr("MK_BOOTSTRAP_ADDR", "127.0.0.1");
    mkUniqueId id;
    REQUIRE(mkGetUniqueId(&id) == mkSuccess);
    CHECK(uint8_t(id.internal[64]) == 0);
    uint32_t a;
    std::memcpy(&a, id.internal + 4, 4);
    CHECK(a == htonl(INADDR_LOOPBACK));
    CHECK(run_threads(2, [&](int r) { rt::Bootstrap b(id, 2, r); return gathers_ok(b, 0); }) == 2);
  }
  if (!have_ipv6_loopback()) {
    MESSAGE("SKIPPED: this machine has no IPv6 loopback (::1): the IPv6 rendezvous is not exercised");
    return;
  }
  const uint16_t port = free_port(AF_INET6);
  for (const std::string& value : {std::string("[::1]:") + std::to_string(port), std::string("[::1]"), std::string("::1")}) {
    CAPTURE(value);
    ScopedEnv addr("MK_BOOTSTRAP_ADDR", value.c_str());
    mkUniqueId id;
    REQUIRE(mkGetUniqueId(&id) == mkSuccess);
    const rt::IdContents c = rt::bootstrap_decode(id);
    CHECK(c.ipv6);
    CHECK(uint8_t(id.internal[64]) == 6);
    CHECK(std::memcmp(id.internal + 80, &in6addr_loopback, 16) == 0);
    CHECK(c.ipv4 == 0);
    if (value.find("]:") != std::string::npos) CHECK(ntohs(c.port) == port);
    CHECK(c.address().text().rfind("[::1]:", 0) == 0);
    // the ranks' peer listeners are IPv6 too: they listen where they reach the root from
    CHECK(run_threads(3, [&](int r) {
            rt::Bootstrap b(id, 3, r);
            bool ok = gathers_ok(b, 0) && gathers_ok(b, 1);
            if (r == 0) b.send(1, "over IPv6");
            if (r == 1) ok = b.recv(0) == "over IPv6" && ok;
            return ok;
          }) == 3);
  }
  {
    ScopedEnv fam("MK_SOCKET_FAMILY", "AF_INET6");
    ScopedEnv ifname("MK_SOCKET_IFNAME", "lo");
    mkUniqueId id;
    REQUIRE(mkGetUniqueId(&id) == mkSuccess);
    const rt::IdContents c = rt::bootstrap_decode(id);
    CHECK(c.ipv6);
    CHECK(std::memcmp(c.ipv6_addr, &in6addr_loopback, 16) == 0);
    CHECK(run_threads(2, [&](int r) { rt::Bootstrap b(id, 2, r); return gathers_ok(b, 0); }) == 2);
  }
  {  // a name, where this host resolves one to ::1 (an IPv6 name)
    const char* name = nullptr;
    for (const char* n : {"ip6-localhost", "ip6-loopback", "localhost6", "localhost"}) {
      addrinfo hints{}, *res = nullptr;
      hints.ai_family = AF_INET6;
      hints.ai_socktype = SOCK_STREAM;
      if (::getaddrinfo(n, nullptr, &hints, &res) == 0 && res) {
        const bool lo = std::memcmp(&reinterpret_cast<sockaddr_in6*>(res->ai_addr)->sin6_addr, &in6addr_loopback, 16) == 0;
        ::freeaddrinfo(res);
        if (lo) {
          name = n;
          break;
        }
      }
    }
    if (!name) {
      MESSAGE("SKIPPED: no host name resolves to ::1 here (/etc/hosts): IPv6 names are not exercised");
    } else {
      ScopedEnv fam("MK_SOCKET_FAMILY", "AF_INET6");
      ScopedEnv addr("MK_BOOTSTRAP_ADDR", name);
      mkUniqueId id;
      REQUIRE(mkGetUniqueId(&id) == mkSuccess);
      CHECK(rt::bootstrap_decode(id).ipv6);
      CHECK(run_threads(2, [&](int r) { rt::Bootstrap b(id, 2, r); return gathers_ok(b, 0); }) == 2);
    }
  }
}

namespace {

const char* kSecret = "5f0c1e8a9b2d4c6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6";

// Forked ranks that pass no id: each makes its own with MK_COMM_ID set and
// joins. Returns each child's exit code (0: joined and exchanged).
std::vector<int> comm_id_ranks(int n, const std::string& comm_id, const std::vector<const char*>& secrets) {
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::setenv("MK_COMM_ID", comm_id.c_str(), 1);
      ::setenv("MK_COMM_SECRET", secrets[size_t(r) % secrets.size()], 1);
      ::setenv("MK_BOOTSTRAP_TIMEOUT_MS", "5000", 1);
      int code = 0;
      try {
        if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(150));  // the others wait for its root
        const int servers = rt::bootstrap_live_servers();  // (this process's copy of the test's own)
        mkUniqueId id;
        if (mkGetUniqueId(&id) != mkSuccess) ::_exit(3);
        if (rt::bootstrap_live_servers() != servers) ::_exit(4);  // no server: rank 0 starts it at init
        rt::Bootstrap b(id, n, r);
        const auto all = b.allgather("rank " + std::to_string(r));
        for (int q = 0; q < n; ++q)
          if (all[size_t(q)] != "rank " + std::to_string(q)) code = 5;
        if (r == 0) b.send(n - 1, "hello from rank 0");
        if (r == n - 1 && b.recv(0) != "hello from rank 0") code = 6;
        b.barrier();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "MK_COMM_ID rank %d: %s\n", r, e.what());
        code = 7;
      }
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes;
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  for (pid_t pid : pids) {
    int st = 0;
    while (::waitpid(pid, &st, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &st, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    codes.push_back(WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  }
  return codes;
}

}  // namespace

TEST_CASE("bootstrap: MK_COMM_ID: processes that pass no id meet at that address, the secret from MK_COMM_SECRET") {
  {
    const std::string at = "127.0.0.1:" + std::to_string(free_port());
    CHECK(comm_id_ranks(3, at, {kSecret}) == std::vector<int>{0, 0, 0});
  }
  if (have_ipv6_loopback()) {
    const std::string at = "[::1]:" + std::to_string(free_port(AF_INET6));
    CHECK(comm_id_ranks(2, at, {kSecret}) == std::vector<int>{0, 0});
  }
  {  // a rank with another secret cannot join (nor can the others complete)
    const std::string at = "127.0.0.1:" + std::to_string(free_port());
    std::string other = kSecret;
    other[10] = other[10] == 'a' ? 'b' : 'a';
    const auto codes = comm_id_ranks(2, at, {kSecret, other.c_str()});
    CHECK(codes[1] == 7);
    CHECK(codes[0] != 0);
  }
  // The id: the address and the flag, no secret, and no server started here.
  ScopedEnv cid("MK_COMM_ID", "127.0.0.1:29500");
  ScopedEnv sec("MK_COMM_SECRET", kSecret);
  const int before = rt::bootstrap_live_servers();
  mkUniqueId id;
  REQUIRE(mkGetUniqueId(&id) == mkSuccess);
  CHECK(rt::bootstrap_live_servers() == before);
  CHECK(uint8_t(id.internal[65]) == 1);
  CHECK(std::all_of(id.internal + 32, id.internal + 64, [](char ch) { return ch == 0; }));
  const rt::IdContents c = rt::bootstrap_decode(id);
  CHECK(c.comm_id);
  CHECK(ntohs(c.port) == 29500);
  CHECK(c.secret[0] == 0x5f);
  mkUniqueId again;  // every process computes the same id
  REQUIRE(mkGetUniqueId(&again) == mkSuccess);
  CHECK(std::memcmp(&id, &again, sizeof id) == 0);
}

TEST_CASE("bootstrap: MK_COMM_ID without MK_COMM_SECRET, or with a malformed one, fails saying how to make one") {
  ScopedEnv cid("MK_COMM_ID", "127.0.0.1:29500");
  for (const char* bad : {(const char*)nullptr, "", "abc", "5f0c1e8a9b2d4c6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5eZ",
                          "0000000000000000000000000000000000000000000000000000000000000000"}) {
    CAPTURE(bad ? bad : "(unset)");
    ScopedEnv sec("MK_COMM_SECRET", bad);
    mkUniqueId id;
    CHECK(mkGetUniqueId(&id) == mkInvalidArgument);
    const std::string e = mkGetLastError(nullptr);
    CHECK_MESSAGE(has(e, "MK_COMM_SECRET"), e);
    CHECK_MESSAGE(has(e, "openssl rand -hex 32"), e);
    if (bad && std::strlen(bad) > 3) CHECK(!has(e, bad));  // the value is secret: never echoed
  }
  for (const char* bad : {"127.0.0.1", "[::1]", "127.0.0.1:0", "nohost.invalid:80"}) {
    CAPTURE(bad);
    ScopedEnv c2("MK_COMM_ID", bad);
    ScopedEnv sec("MK_COMM_SECRET", kSecret);
    mkUniqueId id;
    CHECK(mkGetUniqueId(&id) == mkInvalidArgument);
    CHECK(has(mkGetLastError(nullptr), "MK_COMM_ID='"));
  }
  // An MK_COMM_ID id decoded where MK_COMM_SECRET differs from the one it was made with.
  mkUniqueId id;
  {
    ScopedEnv sec("MK_COMM_SECRET", kSecret);
    REQUIRE(mkGetUniqueId(&id) == mkSuccess);
  }
  std::string other = kSecret;
  other[0] = '4';
  ScopedEnv sec("MK_COMM_SECRET", other.c_str());
  CHECK_THROWS_WITH_AS(rt::bootstrap_decode(id), doctest::Contains("another MK_COMM_SECRET"), rt::RtError);
}

TEST_CASE("bootstrap: with MK_COMM_ID set, an id made while such a bootstrap lives (a split's child) gets its own "
          "server") {
  ScopedEnv timeout("MK_BOOTSTRAP_TIMEOUT_MS", "10000");
  const std::string at = "127.0.0.1:" + std::to_string(free_port());
  ScopedEnv cid("MK_COMM_ID", at.c_str());
  ScopedEnv sec("MK_COMM_SECRET", kSecret);
  mkUniqueId id;
  REQUIRE(mkGetUniqueId(&id) == mkSuccess);
  CHECK(rt::bootstrap_decode(id).comm_id);
  CHECK(run_threads(2, [&](int r) {
          rt::Bootstrap parent(id, 2, r);  // rank 0 starts the root on MK_COMM_ID's address
          // the split: its first member makes the child's id, all-gathered through the parent
          std::string mine;
          if (r == 0) {
            mkUniqueId child;
            rt::bootstrap_create_id(&child);
            mine.assign(child.internal, sizeof child.internal);
          }
          const auto ids = parent.allgather(mine);
          mkUniqueId child;
          std::memcpy(child.internal, ids[0].data(), sizeof child.internal);
          if (rt::bootstrap_decode(child).comm_id) return false;
          rt::Bootstrap b(child, 2, 1 - r);
          return gathers_ok(b, 0);
        }) == 2);
  // and once none lives, MK_COMM_ID's id again
  mkUniqueId later;
  REQUIRE(mkGetUniqueId(&later) == mkSuccess);
  CHECK(rt::bootstrap_decode(later).comm_id);
}
