#include "runtime/bootstrap/bootstrap.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <thread>

#include "compiler/common/env_parse.hpp"
#include "runtime/bootstrap/crypto.hpp"
#include "runtime/comm/env.hpp"
#include "runtime/api/status.hpp"
#include "runtime/transport/net/iface.hpp"

namespace mk::rt {
namespace {

constexpr char kMagic[4] = {'M', 'K', 'I', 'D'};
constexpr uint32_t kHello = 0x4d4b4845;  // "MKHE"

// Status a rank reads after its hello.
constexpr int32_t kJoined = 0, kMismatch = -1, kDuplicate = -2, kOutOfRange = -3;

// After the rendezvous every message starts with a 64-bit length; two values
// far above kMaxBlobBytes are marks instead (a peer of an older version
// reads them as a length over the limit and fails, which is also right).
// kAbortMark, rank -> root, between two of the rank's messages: the rank
// aborted its communicator (mkCommAbort). kGoneMark, root -> rank, then int32
// rank and int32 Gone: that rank left, so no all-gather of the job can
// complete any more; the root sends it to every rank still connected, once,
// between two of its broadcasts, and reads nothing more from them.
constexpr uint64_t kAbortMark = 0x21544f4241424b4dull;  // "MKABORT!"
constexpr uint64_t kGoneMark = 0x2121454e4f474b4dull;   // "MKGONE!!"
enum Gone : int32_t { kGoneDropped = 0, kGoneClosed = 1, kGoneAborted = 2 };

std::atomic<int> g_live_servers{0};
// Rendezvous servers with work in hand: not blocked in poll(), or holding
// bytes not yet written to a rank. The server is a thread of the process
// that made the id; at that process's exit (wait_for_servers) the others may
// still be reading a round it has answered only in part.
std::atomic<int> g_busy_servers{0};

void wait_for_servers() {
  const auto t0 = std::chrono::steady_clock::now();
  while (g_busy_servers.load() > 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

std::string errno_text() { return std::strerror(errno); }

struct Hello {
  uint32_t magic;
  int32_t nranks;
  int32_t rank;
  uint8_t nonce[16];
};

// The rendezvous server: one poll loop over the listening socket and every
// connection, so that no connection (idle, slow, garbage) can hold up another.
// Phases of a connection: handshake -> hello -> joined (waits for the others)
// -> all-gather rounds. The loop ends when every rank has gone after the
// rendezvous, or at the deadline before it.
class Rendezvous {
 public:
  Rendezvous(int listen_fd, const IdContents& id, int timeout_ms)
      : listen_fd_(listen_fd), id_(id), timeout_(timeout_ms),
        handshake_ms_(handshake_timeout_ms(timeout_)), deadline_(Clock::now() + std::chrono::milliseconds(timeout_)) {
    if (!set_nonblocking(listen_fd_)) throw std::runtime_error("fcntl(O_NONBLOCK): " + errno_text());
  }
  ~Rendezvous() {
    set_busy(false);
    if (listen_fd_ >= 0) ::close(listen_fd_);
    for (auto& p : peers_) ::close(p->c.fd);
  }
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  void run() {
    while (started_ ? !peers_.empty() : Clock::now() < deadline_) {
      poll_once();
      if (!started_ && nranks_ > 0 && joined_ == nranks_) start();
      if (started_ && !broken_) maybe_broadcast();
      reap();
    }
    if (!started_)
      debug_log("bootstrap: the rendezvous did not complete within MK_BOOTSTRAP_TIMEOUT_MS; closing (" +
                std::to_string(evicted_) + " unauthenticated connection(s) evicted)");
  }

 private:
  enum class Phase { kHandshake, kHello, kJoined, kLength, kBlob, kHaveBlob };
  struct Peer {
    NbConn c;
    ServerHandshake hs;
    Phase phase = Phase::kHandshake;
    Clock::time_point deadline;  // until the hello is read
    int rank = -1;
    bool dead = false;
    bool close_after_flush = false;
    bool notified = false;  // sent kGoneMark: its input is read and dropped until it closes
    std::string tail;       // what a waiting rank sent (kJoined, kHaveBlob): at most a mark
    Peer(const Secret& s) : hs(s, Channel::kBootstrap) {}
    // Not yet authenticated and has not even sent its whole challenge (a
    // real rank sends it with its connect).
    bool silent() const { return phase == Phase::kHandshake && hs.want() == kClientHelloBytes; }
  };

  void set_busy(bool b) {
    if (b == busy_) return;
    busy_ = b;
    if (b)
      g_busy_servers.fetch_add(1);
    else
      g_busy_servers.fetch_sub(1);
  }

  void poll_once() {
    std::vector<pollfd> fds;
    // Before the rendezvous the root always accepts: a full table evicts
    // (accept_new), so the kernel's backlog never fills with connections
    // that would wait behind a flood.
    const bool listening = !started_ && Clock::now() >= listen_pause_until_;
    if (listening) fds.push_back({listen_fd_, POLLIN, 0});
    Clock::time_point wake = started_ ? Clock::time_point::max() : deadline_;
    for (auto& p : peers_) {
      short ev = wants_input(*p) ? POLLIN : 0;
      if (!p->c.out.empty()) ev |= POLLOUT;
      fds.push_back({p->c.fd, ev, 0});
      if (p->phase == Phase::kHandshake || p->phase == Phase::kHello) wake = std::min(wake, p->deadline);
    }
    if (!started_ && !listening) wake = std::min(wake, listen_pause_until_);
    int timeout = wake == Clock::time_point::max() ? -1 : std::max(1, ms_left(wake));
    bool pending = false;  // bytes a rank still waits for
    for (auto& p : peers_) pending = pending || (!p->dead && !p->c.out.empty());
    set_busy(pending);
    int r = ::poll(fds.data(), nfds_t(fds.size()), timeout);
    set_busy(true);
    if (r < 0 && errno != EINTR) throw std::runtime_error("poll: " + errno_text());
    const size_t first = listening ? 1 : 0, polled = fds.size() - first;  // accept_new appends after these
    if (listening && r > 0 && (fds[0].revents & POLLIN)) accept_new();
    for (size_t k = 0; k < polled && r > 0; ++k) {
      Peer& p = *peers_[k];
      const short rev = fds[first + k].revents;
      if (p.dead) continue;
      if (rev & (POLLIN | POLLHUP | POLLERR)) on_readable(p);
      if (!p.dead && (rev & POLLOUT)) on_writable(p);
    }
    const auto now = Clock::now();
    for (auto& p : peers_)
      if ((p->phase == Phase::kHandshake || p->phase == Phase::kHello) && now >= p->deadline)
        drop(*p, "did not authenticate in time");
  }

  bool wants_input(const Peer& p) const {
    // A rank that waits (for the rendezvous or for a round) sends nothing but
    // the abort mark; polling it still tells us when it goes away (before the
    // rendezvous its slot is then free again; after it, the job is broken).
    return !p.close_after_flush;
  }

  // Accepts at most a quarter of the table a round, so that a new connection
  // is read at least once before newer ones can evict it, and reads what
  // each one already sent (a real rank's challenge comes with its connect).
  // A connection that has not authenticated costs the real ranks at most its
  // handshake deadline: when such connections fill the table, the oldest
  // that has not sent its whole challenge goes first, then the oldest that
  // waits for its proof. A flood of idle, slow or garbage connections thus
  // evicts only its own, and a rank that is evicted anyway connects again.
  void accept_new() {
    for (int k = 0; k < kMaxPendingConnections / 4; ++k) {
      int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (c < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) return;
        // Out of descriptors (EMFILE, ENFILE) or memory: free one of ours
        // if we can, and do not spin on a backlog we cannot take.
        if (!evict_one()) listen_pause_until_ = Clock::now() + std::chrono::milliseconds(20);
        return;
      }
      if (unauthenticated_ >= kMaxPendingConnections) evict_one();
      int one = 1;
      ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      auto p = std::make_unique<Peer>(id_.secret);
      p->c.fd = c;
      p->c.expect(p->hs.want());
      p->deadline = Clock::now() + std::chrono::milliseconds(handshake_ms_);
      Peer& q = *p;
      peers_.push_back(std::move(p));
      unauth_.push_back(&q);
      ++unauthenticated_;
      on_readable(q);
    }
  }

  // Frees a place in the table of unauthenticated connections (see
  // accept_new); false if there is none to free. A candidate's bytes that
  // already arrived are read first: a real rank whose challenge or proof is
  // waiting moves on instead of being evicted.
  bool evict_one() {
    for (const bool silent_only : {true, false})
      for (size_t i = 0; i < unauth_.size(); ++i) {
        Peer& p = *unauth_[i];
        auto candidate = [&] { return !p.dead && p.phase == Phase::kHandshake && (!silent_only || p.silent()); };
        if (!candidate()) continue;
        on_readable(p);
        if (p.dead || p.phase != Phase::kHandshake) return true;  // it failed, left or authenticated: a place is free
        if (!candidate()) continue;                                // it sent its challenge: spare it this pass
        ++evicted_;
        evicting_ = true;
        drop(p, "was evicted: the table of unauthenticated connections was full");
        evicting_ = false;
        return true;
      }
    return false;
  }

  void on_writable(Peer& p) {
    std::string why;
    if (!p.c.flush(&why)) drop(p, why, kGoneClosed);
  }

  // A waiting rank (kJoined, kHaveBlob) became readable: it left, aborted
  // (kAbortMark, only after the rendezvous) or broke the protocol.
  void read_tail(Peer& p) {
    for (;;) {
      char buf[sizeof(uint64_t)];
      const ssize_t got = ::recv(p.c.fd, buf, sizeof buf - p.tail.size(), MSG_DONTWAIT);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (got <= 0) {
        const std::string why = got == 0 ? std::string("connection closed") : errno_text();
        return drop(p, started_ ? why : "left before the rendezvous completed (" + why + ")", kGoneClosed);
      }
      p.tail.append(buf, size_t(got));
      if (p.tail.size() < sizeof(uint64_t)) continue;
      uint64_t mark = 0;
      std::memcpy(&mark, p.tail.data(), sizeof mark);
      if (started_ && mark == kAbortMark) return drop(p, "aborted its communicator", kGoneAborted);
      return drop(p, started_ ? "sent bytes while it waited for a round" : "sent bytes before the rendezvous completed");
    }
  }

  // A rank told that the job broke: its bytes mean nothing now; it is done
  // when it closes its connection.
  void discard(Peer& p) {
    char buf[16384];
    for (;;) {
      const ssize_t got = ::recv(p.c.fd, buf, sizeof buf, MSG_DONTWAIT);
      if (got > 0 || (got < 0 && errno == EINTR)) continue;
      if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      p.dead = true;
      return;
    }
  }

  // Tells a rank that the job broke (see kGoneMark), after whatever it was
  // already sent.
  void notify(Peer& p) {
    std::string m(sizeof(uint64_t) + 2 * sizeof(int32_t), '\0');
    std::memcpy(m.data(), &kGoneMark, sizeof kGoneMark);
    std::memcpy(m.data() + 8, &gone_rank_, sizeof gone_rank_);
    std::memcpy(m.data() + 12, &gone_cause_, sizeof gone_cause_);
    p.notified = true;
    p.c.send(std::move(m));
    on_writable(p);
  }

  void on_readable(Peer& p) {
    std::string why;
    if (p.notified) return discard(p);
    if (p.close_after_flush) {
      // Nothing is expected now: the peer left (or broke the protocol).
      drop(p, "left before the rendezvous completed");
      return;
    }
    if (p.phase == Phase::kJoined || p.phase == Phase::kHaveBlob) return read_tail(p);
    if (!p.c.read_some(&why)) {
      drop(p, why, kGoneClosed);
      return;
    }
    if (!p.c.complete()) return;
    const auto* bytes = reinterpret_cast<const uint8_t*>(p.c.in.data());
    switch (p.phase) {
      case Phase::kHandshake: {
        std::string reply = p.hs.feed(bytes);
        if (p.hs.failed()) return drop(p, "failed the secret challenge");
        if (!reply.empty()) p.c.send(std::move(reply));
        if (p.hs.done()) {
          --unauthenticated_;
          p.phase = Phase::kHello;
          p.c.expect(sizeof(Hello));
        } else {
          p.c.expect(p.hs.want());
        }
        on_writable(p);
        return;
      }
      case Phase::kHello: return on_hello(p, bytes);
      case Phase::kLength: return on_length(p, bytes);
      case Phase::kBlob: p.phase = Phase::kHaveBlob; return;
      default: return;
    }
  }

  void refuse(Peer& p, int32_t status) {
    p.c.send(std::string(reinterpret_cast<const char*>(&status), sizeof status));
    p.close_after_flush = true;
    on_writable(p);
  }

  void on_hello(Peer& p, const uint8_t* bytes) {
    Hello h;
    std::memcpy(&h, bytes, sizeof h);
    if (h.magic != kHello || std::memcmp(h.nonce, id_.nonce, 16) != 0) return drop(p, "sent a malformed hello");
    if (h.nranks < 1 || h.nranks > kMaxRanks || h.rank < 0 || h.rank >= h.nranks) return refuse(p, kOutOfRange);
    if (nranks_ > 0 && h.nranks != nranks_) return refuse(p, kMismatch);
    if (nranks_ < 0) {
      nranks_ = h.nranks;
      slots_.assign(size_t(nranks_), nullptr);
    }
    if (slots_[size_t(h.rank)]) return refuse(p, kDuplicate);
    slots_[size_t(h.rank)] = &p;
    p.rank = h.rank;
    p.phase = Phase::kJoined;
    ++joined_;
    deadline_ = Clock::now() + std::chrono::milliseconds(timeout_);  // progress: give the rest time
  }

  void on_length(Peer& p, const uint8_t* bytes) {
    uint64_t len = 0;
    std::memcpy(&len, bytes, sizeof len);
    if (len == kAbortMark) return drop(p, "aborted its communicator", kGoneAborted);
    if (len > kMaxBlobBytes) return drop(p, "sent a blob length over the " + std::to_string(kMaxBlobBytes) + "-byte limit");
    round_bytes_ += len;
    if (round_bytes_ > kMaxRoundBytes) return drop(p, "all-gather round over the " + std::to_string(kMaxRoundBytes) + "-byte limit");
    p.phase = len ? Phase::kBlob : Phase::kHaveBlob;
    p.c.expect(len);
  }

  void start() {
    started_ = true;
    if (evicted_ > 0)
      debug_log("bootstrap: " + std::to_string(evicted_) +
                " unauthenticated connection(s) were evicted while the ranks joined (a flood of connections "
                "that do not know the secret?)");
    ::close(listen_fd_);
    listen_fd_ = -1;
    for (auto& p : peers_)
      if (p->phase != Phase::kJoined) p->dead = true;  // late arrivals that never authenticated
    for (Peer* p : slots_) {
      int32_t ok = kJoined;
      p->c.send(std::string(reinterpret_cast<const char*>(&ok), sizeof ok));
      p->phase = Phase::kLength;
      p->c.expect(sizeof(uint64_t));
      on_writable(*p);
    }
  }

  void maybe_broadcast() {
    for (Peer* p : slots_)
      if (p->phase != Phase::kHaveBlob) return;
    std::string out;
    out.reserve(round_bytes_ + slots_.size() * sizeof(uint64_t));
    for (Peer* p : slots_) {
      uint64_t len = p->c.in.size();
      out.append(reinterpret_cast<const char*>(&len), sizeof len);
      out += p->c.in;
    }
    auto shared = std::make_shared<const std::string>(std::move(out));
    round_bytes_ = 0;
    for (Peer* p : slots_) {
      p->c.out.push_back(shared);
      p->phase = Phase::kLength;
      p->c.expect(sizeof(uint64_t));
      on_writable(*p);
    }
  }

  // Marks a connection for closing; a joined rank's slot is free again. A rank
  // that goes after the rendezvous breaks the job (see reap()); the first one
  // and `cause` are what the others are told.
  void drop(Peer& p, const std::string& why, Gone cause = kGoneDropped) {
    if (p.dead) return;
    p.dead = true;
    if (p.phase == Phase::kHandshake) --unauthenticated_;
    if (debug_enabled() && !(evicting_ && evicted_ > 1))  // under a flood, one line for all evictions (start())
      debug_log(p.rank >= 0 ? "bootstrap: rank " + std::to_string(p.rank) + " connection closed: " + why
                            : "bootstrap: dropped a connection that " + why);
    if (p.rank >= 0 && !started_) {
      slots_[size_t(p.rank)] = nullptr;
      --joined_;
    }
    if (p.rank >= 0 && started_ && !broken_) {
      broken_ = true;
      gone_rank_ = p.rank;
      gone_cause_ = cause;
    }
  }

  // Closes what is done. Once the job is broken, every rank still connected
  // is told which rank left and why (notify()): one waiting in a round that
  // can no longer complete fails now instead of at its timeout, one that is
  // idle fails at its next all-gather (a rank that only destroys its
  // communicator never reads it). They close their own connections.
  void reap() {
    if (broken_)
      for (Peer* q : slots_)
        if (!q->dead && !q->notified) notify(*q);
    for (auto& p : peers_)
      if (p->close_after_flush && p->c.out.empty()) p->dead = true;
    unauth_.erase(std::remove_if(unauth_.begin(), unauth_.end(),
                                 [](const Peer* p) { return p->dead || p->phase != Phase::kHandshake; }),
                  unauth_.end());
    for (size_t k = 0; k < peers_.size();) {
      if (!peers_[k]->dead) {
        ++k;
        continue;
      }
      if (started_)
        for (Peer*& s : slots_)
          if (s == peers_[k].get()) s = nullptr;
      ::close(peers_[k]->c.fd);
      peers_[k] = std::move(peers_.back());
      peers_.pop_back();
    }
    if (started_) slots_.erase(std::remove(slots_.begin(), slots_.end(), nullptr), slots_.end());
  }

  int listen_fd_;
  IdContents id_;
  int timeout_, handshake_ms_;
  Clock::time_point deadline_;
  std::vector<std::unique_ptr<Peer>> peers_;
  // By rank; after the rendezvous, the ranks still connected (in rank order,
  // which matters only until one leaves: then no round completes).
  std::vector<Peer*> slots_;
  // Connections still in the handshake, oldest first (dead ones until reap()).
  std::vector<Peer*> unauth_;
  int unauthenticated_ = 0;  // live ones among them
  long evicted_ = 0;
  bool evicting_ = false;
  Clock::time_point listen_pause_until_;
  int nranks_ = -1, joined_ = 0;
  bool started_ = false, broken_ = false;
  int32_t gone_rank_ = -1, gone_cause_ = kGoneDropped;  // the first rank that left after the rendezvous
  uint64_t round_bytes_ = 0;
  bool busy_ = false;  // counted in g_busy_servers
};

void serve(int listen_fd, IdContents id, int timeout_ms) {
  struct Live {
    ~Live() { --g_live_servers; }
  } live;
  try {
    Rendezvous(listen_fd, id, timeout_ms).run();
  } catch (const std::exception& e) {
    debug_log(std::string("bootstrap: rendezvous server stopped: ") + e.what());
  } catch (...) {
    debug_log("bootstrap: rendezvous server stopped by an unknown exception");
  }
}

// MK_BOOTSTRAP_ADDR: "host" (an ephemeral port) or "host:port", the host an
// IPv4 address or a name that resolves to one, the port 1 to 5 decimal
// digits in 1..65535 and nothing else (no sign, space or suffix). Throws
// mkInvalidArgument naming the variable, its value and what is accepted.
sockaddr_in parse_addr(const std::string& text) {
  static const char* accepted =
      "expected host or host:port, the host an IPv4 address or a name that resolves to one, the port a decimal "
      "number in 1..65535 (digits only); leave the port out for an ephemeral one";
  auto refuse = [&](const std::string& what) {
    fail(mkInvalidArgument, "MK_BOOTSTRAP_ADDR='" + text + "': " + what + "; " + accepted);
  };
  const auto colon = text.rfind(':');
  const std::string host = colon == std::string::npos ? text : text.substr(0, colon);
  int64_t port = 0;
  if (colon != std::string::npos) {
    const std::string p = text.substr(colon + 1);
    if (p.size() > 5 || !env_parse::parse_int(p, 1, 65535, &port))
      refuse("the port '" + p + "' is not a number in 1..65535");
  }
  if (host.empty()) refuse("the host is empty");
  for (unsigned char ch : host)
    if (ch <= ' ' || ch >= 0x7f) refuse("the host '" + host + "' has a space or control character");
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || !res)
    refuse("the host '" + host + "' is not an IPv4 address or resolvable name (" + gai_strerror(rc) + ")");
  sockaddr_in sa = *reinterpret_cast<sockaddr_in*>(res->ai_addr);
  ::freeaddrinfo(res);
  sa.sin_port = htons(uint16_t(port));
  return sa;
}

std::string ipv4_text(uint32_t a) {
  in_addr x{};
  x.s_addr = a;
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &x, buf, sizeof buf);
  return buf;
}

}  // namespace

std::vector<NetIface> net_ifaces() {
  std::vector<NetIface> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;  // none known: the caller falls back to loopback
  for (const ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !i->ifa_name) continue;
    NetIface f;
    f.name = i->ifa_name;
    f.ipv4 = reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
    f.up = (i->ifa_flags & IFF_UP) != 0 && (i->ifa_flags & IFF_RUNNING) != 0;
    f.loopback = (i->ifa_flags & IFF_LOOPBACK) != 0;
    out.push_back(std::move(f));
  }
  ::freeifaddrs(list);
  return out;
}

uint32_t choose_bootstrap_ipv4(const std::vector<NetIface>& ifaces, const std::string& spec) {
  const net::IfnameSpec allowed(spec, "MK_SOCKET_IFNAME");
  auto as_iface = [](const NetIface& f) {
    net::Iface x;
    x.name = f.name;
    x.family = AF_INET;
    x.up = f.up;
    x.loopback = f.loopback;
    return x;
  };
  for (const NetIface& f : ifaces)
    if (allowed.allows(as_iface(f))) return f.ipv4;
  if (allowed.empty()) return htonl(INADDR_LOOPBACK);
  std::string have;
  for (const NetIface& f : ifaces)
    have += (have.empty() ? "" : ", ") + f.name + " (" + ipv4_text(f.ipv4) + (f.up ? "" : ", down") + ")";
  fail(mkInvalidArgument, "MK_SOCKET_IFNAME='" + spec + "' matches no IPv4 interface that is up; this host has: " +
                              (have.empty() ? std::string("none") : have));
}

int bootstrap_timeout_ms() { return env::bootstrap_timeout_ms(); }

void bootstrap_create_id(mkUniqueId* id) {
  IdContents c;  // the random parts first: nothing to clean up if there is no randomness
  random_bytes(c.nonce, sizeof c.nonce);
  random_bytes(c.secret.data(), c.secret.size());
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  if (const char* a = std::getenv("MK_BOOTSTRAP_ADDR"); a && *a) {
    sa = parse_addr(a);
  } else {
    const char* spec = std::getenv("MK_SOCKET_IFNAME");
    sa.sin_addr.s_addr = choose_bootstrap_ipv4(net_ifaces(), spec ? spec : "");
  }
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fail(mkSystemError, "bootstrap: socket(): " + errno_text());
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || ::listen(fd, 1024) != 0) {
    std::string e = errno_text();
    ::close(fd);
    fail(mkSystemError, "bootstrap: cannot listen on the rendezvous address: " + e);
  }
  socklen_t len = sizeof sa;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  c.ipv4 = sa.sin_addr.s_addr;
  c.port = sa.sin_port;
  std::memset(id->internal, 0, sizeof id->internal);
  std::memcpy(id->internal, kMagic, 4);
  std::memcpy(id->internal + 4, &c.ipv4, 4);
  std::memcpy(id->internal + 8, &c.port, 2);
  std::memcpy(id->internal + 16, c.nonce, 16);
  std::memcpy(id->internal + 32, c.secret.data(), c.secret.size());
  ++g_live_servers;
  // At exit this process waits (at most 2 s) until its servers have written
  // every round they answered: a rank that exits right after its
  // communicator's init must not cut its peers off in the middle of it.
  static std::once_flag at_exit;
  std::call_once(at_exit, [] {
    std::atexit(wait_for_servers);
    // a forked child has none of the servers (threads do not survive fork)
    pthread_atfork(nullptr, nullptr, [] { g_busy_servers.store(0); });
  });
  try {
    std::thread(serve, fd, c, bootstrap_timeout_ms()).detach();
  } catch (...) {
    --g_live_servers;
    ::close(fd);
    throw;
  }
}

int bootstrap_live_servers() { return g_live_servers.load(); }

IdContents bootstrap_decode(const mkUniqueId& id) {
  if (std::memcmp(id.internal, kMagic, 4) != 0)
    fail(mkInvalidArgument, "the unique id was not made by mkGetUniqueId (or was corrupted in transit)");
  IdContents c;
  std::memcpy(&c.ipv4, id.internal + 4, 4);
  std::memcpy(&c.port, id.internal + 8, 2);
  std::memcpy(c.nonce, id.internal + 16, 16);
  std::memcpy(c.secret.data(), id.internal + 32, c.secret.size());
  return c;
}

std::string nonce_hex(const IdContents& c) {
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (uint8_t b : c.nonce) {
    s += hex[b >> 4];
    s += hex[b & 15];
  }
  return s;
}

namespace {

// One connect, bounded by `deadline` (a blocking connect to a listener
// whose backlog is full would wait for SYN retries, up to minutes). Returns 0
// or the errno, with *why set.
int connect_once(int fd, const sockaddr_in& sa, Clock::time_point deadline, std::string* why) {
  int err = 0;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) == 0) return 0;
  if (errno != EINPROGRESS && errno != EINTR) {
    err = errno;
  } else {
    for (;;) {
      pollfd p{fd, POLLOUT, 0};
      const int r = ::poll(&p, 1, ms_left(deadline));
      if (r == 0) {
        *why = "connect timed out";
        return ETIMEDOUT;
      }
      if (r > 0) break;
      if (errno != EINTR) {
        err = errno;
        break;
      }
    }
    socklen_t len = sizeof err;
    if (err == 0 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  }
  if (err != 0) *why = std::strerror(err);
  return err;
}

// Connects to the root, retrying until `deadline` (it may not listen yet).
// `again`: we were connected before, so a refusal means that the rendezvous
// is gone; returns -1 then, with *refused set to why.
int connect_root(const sockaddr_in& sa, int rank, Clock::time_point deadline, bool again = false,
                 std::string* refused = nullptr) {
  std::string why;
  for (;;) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) fail(mkSystemError, "bootstrap: socket(): " + errno_text());
    const int err = connect_once(fd, sa, deadline, &why);
    if (err == 0) {
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return fd;  // nonblocking: every read and write below waits with poll() until its deadline
    }
    ::close(fd);
    if (again && err == ECONNREFUSED) {
      *refused = why;
      return -1;
    }
    if (ms_left(deadline) == 0)
      fail(mkSystemError, "rank " + std::to_string(rank) + ": cannot reach the rendezvous at " +
                              ipv4_text(sa.sin_addr.s_addr) + ":" + std::to_string(ntohs(sa.sin_port)) + ": " + why +
                              " (is the process that called mkGetUniqueId still alive?)");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::string refusal_text(int32_t status, int rank, int nranks) {
  if (status == kDuplicate) return "rank " + std::to_string(rank) + " joined twice with the same unique id";
  if (status == kOutOfRange)
    return "the rendezvous refused rank " + std::to_string(rank) + " of " + std::to_string(nranks) +
           ": nranks must be 1.." + std::to_string(kMaxRanks) + " and rank in 0..nranks-1";
  return "the rendezvous rejected rank " + std::to_string(rank) + ": nranks=" + std::to_string(nranks) +
         " differs from what another rank said; pass the same nranks on every rank";
}

}  // namespace

void BootstrapCancel::cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
  if (fd_ < 0) return;
  if (boundary_) {
    // Tell the rendezvous first (best effort, never blocks): it tells the
    // other ranks that this one aborted, also those waiting in a round now.
    const uint64_t mark = kAbortMark;
    (void)::send(fd_, &mark, sizeof mark, MSG_NOSIGNAL | MSG_DONTWAIT);
    boundary_ = false;
  }
  ::shutdown(fd_, SHUT_RDWR);  // a blocked read or write returns now
}

void BootstrapCancel::at_boundary(bool yes) {
  std::lock_guard<std::mutex> lock(mu_);
  boundary_ = yes && fd_ >= 0 && !cancelled_;
}

bool BootstrapCancel::cancelled() {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

bool BootstrapCancel::watch(int fd) {
  std::lock_guard<std::mutex> lock(mu_);
  fd_ = fd;
  boundary_ = false;
  if (cancelled_ && fd >= 0) ::shutdown(fd, SHUT_RDWR);
  return !cancelled_;
}

void Bootstrap::close_fd() {
  if (cancel_) cancel_->watch(-1);  // before the number can be reused
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Bootstrap::Bootstrap(const mkUniqueId& id, int nranks, int rank, BootstrapCancel* cancel)
    : id_(bootstrap_decode(id)), nranks_(nranks), rank_(rank), cancel_(cancel) {
  if (nranks < 1 || nranks > kMaxRanks || rank < 0 || rank >= nranks)
    fail(mkInvalidArgument, "bootstrap: rank " + std::to_string(rank) + " of nranks " + std::to_string(nranks) +
                                " is out of range (nranks 1.." + std::to_string(kMaxRanks) + ", rank 0..nranks-1)");
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = id_.ipv4;
  sa.sin_port = id_.port;
  const auto deadline = Clock::now() + std::chrono::milliseconds(bootstrap_timeout_ms());
  const std::string where = ipv4_text(sa.sin_addr.s_addr) + ":" + std::to_string(ntohs(sa.sin_port));
  auto aborted = [&] {
    close_fd();
    fail(mkInvalidUsage, "rank " + std::to_string(rank) + ": the communicator was aborted during init");
  };
  auto failed = [&](const std::string& why) {
    close_fd();
    fail(mkSystemError, "rank " + std::to_string(rank) + ": bootstrap rendezvous at " + where + " failed: " + why +
                            " (did every rank of " + std::to_string(nranks) + " call mkCommInitRank with this id?)");
  };
  Hello h{kHello, nranks, rank, {}};
  std::memcpy(h.nonce, id_.nonce, 16);
  std::string why;
  int32_t status = 0;
  for (int attempt = 1;; ++attempt) {
    if (attempt == 1) {
      fd_ = connect_root(sa, rank, deadline);
    } else {
      std::string refused;
      fd_ = connect_root(sa, rank, deadline, /*again=*/true, &refused);
      if (fd_ < 0) failed(why + "; connecting again: " + refused + " (the rendezvous has ended)");
    }
    if (cancel_ && !cancel_->watch(fd_)) aborted();
    const ClientAuth auth = client_handshake(fd_, id_.secret, Channel::kBootstrap, deadline, &why);
    if (cancel_ && cancel_->cancelled()) aborted();
    if (auth == ClientAuth::kServerUnproven) {
      close_fd();
      fail(mkRemoteError, "rank " + std::to_string(rank) + ": the rendezvous at " + where +
                              " could not prove it knows this unique id's secret: another process owns that port, or "
                              "the id is stale or from another job; get a fresh id from mkGetUniqueId");
    }
    if (auth == ClientAuth::kOk && write_full(fd_, &h, sizeof h, deadline, &why) &&
        read_full(fd_, &status, sizeof status, deadline, &why))
      break;
    if (cancel_ && cancel_->cancelled()) aborted();
    if (ms_left(deadline) == 0) failed(why);
    // The root closed the connection before we joined. Under a flood of
    // connections that do not know the secret it evicts unauthenticated ones,
    // ours too if our proof had not arrived yet: connect again (a root that
    // has ended refuses the connection, and we fail then).
    close_fd();
    if (debug_enabled() && (attempt == 1 || attempt % 100 == 0))
      debug_log("bootstrap: rank " + std::to_string(rank) + ": the rendezvous at " + where +
                " closed the connection before we joined (" + why + "), attempt " + std::to_string(attempt) +
                "; connecting again");
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(attempt, 20)));
  }
  if (status != kJoined) {
    close_fd();
    fail(status == kOutOfRange ? mkInvalidArgument : mkInvalidUsage, refusal_text(status, rank, nranks));
  }
  if (cancel_) cancel_->at_boundary(true);
}

Bootstrap::~Bootstrap() { close_fd(); }

void Bootstrap::on_gone(Clock::time_point deadline) {
  int32_t who[2] = {-1, kGoneDropped};
  std::string why;
  const bool read = read_full(fd_, who, sizeof who, deadline, &why);
  const std::string peer = "rank " + std::to_string(who[0]);
  std::string what;
  if (!read)
    what = "a rank left the job (" + why + ")";
  else if (who[1] == kGoneAborted)
    what = peer + " aborted its communicator";
  else if (who[1] == kGoneClosed)
    what = peer + "'s connection closed (process ended or communicator destroyed)";
  else
    what = peer + " was dropped by the rendezvous (it broke the bootstrap protocol)";
  gone_ = "rank " + std::to_string(rank_) + ": " + what +
          ", so this communicator's bootstrap exchanges (mkCommSplit, mkCommRegister, mkCommDeregister, "
          "mkCommBootstrapBroadcast) can no longer complete; destroy or abort it";
  close_fd();  // the rendezvous reads nothing more from us
  fail(mkRemoteError, gone_);
}

std::vector<std::string> Bootstrap::allgather(const std::string& mine) {
  if (mine.size() > kMaxBlobBytes)
    fail(mkInvalidArgument, "bootstrap all-gather: " + std::to_string(mine.size()) + " bytes exceed the limit of " +
                                std::to_string(kMaxBlobBytes) + " bytes per rank");
  if (!gone_.empty()) fail(mkRemoteError, gone_);
  std::string why;
  const auto deadline = Clock::now() + std::chrono::milliseconds(bootstrap_timeout_ms());
  uint64_t len = mine.size();
  if (cancel_) cancel_->at_boundary(false);  // an abort now only shuts the socket down
  if (!write_full(fd_, &len, sizeof len, deadline, &why) || !write_full(fd_, mine.data(), mine.size(), deadline, &why))
    fail(mkSystemError, "rank " + std::to_string(rank_) + ": bootstrap send failed: " + why);
  if (cancel_) cancel_->at_boundary(true);
  std::vector<std::string> all(static_cast<size_t>(nranks_));
  for (int r = 0; r < nranks_; ++r) {
    uint64_t n = 0;
    if (!read_full(fd_, &n, sizeof n, deadline, &why))
      fail(mkRemoteError, "rank " + std::to_string(rank_) + ": waiting for the other ranks during setup: " + why);
    if (n == kGoneMark) on_gone(deadline);
    if (n > kMaxBlobBytes)
      fail(mkRemoteError, "rank " + std::to_string(rank_) + ": the rendezvous sent a " + std::to_string(n) +
                              "-byte blob for rank " + std::to_string(r) + ", over the " +
                              std::to_string(kMaxBlobBytes) + "-byte limit");
    all[size_t(r)].resize(n);
    if (n && !read_full(fd_, all[size_t(r)].data(), n, deadline, &why))
      fail(mkRemoteError, "rank " + std::to_string(rank_) + ": waiting for the other ranks during setup: " + why);
  }
  return all;
}

}  // namespace mk::rt
