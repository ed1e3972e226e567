#include "runtime/bootstrap/rendezvous.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include "runtime/api/status.hpp"
#include "runtime/bootstrap/protocol.hpp"

namespace mk::rt {
namespace {

using namespace proto;

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

// The rendezvous server: one poll loop over the listening socket and every
// connection, so that no connection (idle, slow, garbage) can hold up another.
// Phases of a connection: handshake -> hello -> joined (waits for the
// others) -> run. In the run phase a rank sends only its goodbye, abort or a
// fault report (and, relaying, its part of each all-gather). The loop ends
// when every rank has gone after the rendezvous, or at the deadline before it.
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
      if (started_ && relay_ && !broken_) maybe_broadcast();
      reap();
    }
    if (!started_)
      debug_log("bootstrap: the rendezvous did not complete within MK_BOOTSTRAP_TIMEOUT_MS; closing (" +
                std::to_string(evicted_) + " unauthenticated connection(s) evicted)");
  }

 private:
  enum class Phase { kHandshake, kHello, kJoined, kRun };
  struct Peer {
    NbConn c;
    ServerHandshake hs;
    Link link;
    Phase phase = Phase::kHandshake;
    Clock::time_point deadline;  // until the hello is read
    int rank = -1;
    bool dead = false;
    bool close_after_flush = false;
    bool body = false;  // reading the payload of the message whose checked head is `head`
    FrameHeader head;
    bool has_blob = false;  // relaying: its part of this all-gather came
    std::string blob;
    WireAddr listener;
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
      short ev = p->close_after_flush ? 0 : POLLIN;  // a waiting rank's input: its end, abort or goodbye
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

  // Before the rendezvous completes a joined rank only waits: readable
  // means it left (its slot is free again) or broke the protocol.
  void read_waiting(Peer& p) {
    char b;
    for (;;) {
      const ssize_t got = ::recv(p.c.fd, &b, 1, MSG_DONTWAIT);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (got <= 0)
        return drop(p, "left before the rendezvous completed (" +
                           (got == 0 ? std::string("connection closed") : errno_text()) + ")");
      return drop(p, "sent bytes before the rendezvous completed");
    }
  }

  void on_readable(Peer& p) {
    std::string why;
    if (p.close_after_flush) {
      // Nothing is expected now: the peer left (or broke the protocol).
      drop(p, "left before the rendezvous completed");
      return;
    }
    if (p.phase == Phase::kJoined) return read_waiting(p);
    if (!p.c.read_some(&why)) {
      drop(p, started_ ? why : "left before the rendezvous completed (" + why + ")", kGoneClosed);
      return;
    }
    if (!p.c.complete()) return;
    if (p.phase != Phase::kHandshake) return on_frame_bytes(p);
    const auto* bytes = reinterpret_cast<const uint8_t*>(p.c.in.data());
    std::string reply = p.hs.feed(bytes);
    if (p.hs.failed()) return drop(p, "failed the secret challenge");
    if (!reply.empty()) p.c.send(std::move(reply));
    if (p.hs.done()) {
      --unauthenticated_;
      p.link = Link(p.hs.keys());
      p.phase = Phase::kHello;
      p.c.expect(kFrameHeadBytes);
    } else {
      p.c.expect(p.hs.want());
    }
    on_writable(p);
  }

  // What a message of this type may carry from `p` now; -1: not allowed.
  int64_t allowed(const Peer& p, const FrameHeader& h) const {
    if (p.phase == Phase::kHello) return h.type == kHello ? int64_t(sizeof(HelloBody)) : -1;
    switch (h.type) {
      case kAbort:
      case kBye:
      case kFault: return 0;
      case kBlob: return relay_ && !p.has_blob ? int64_t(kMaxBlobBytes) : -1;
      default: return -1;
    }
  }

  // A complete head or payload of a message from an authenticated rank.
  void on_frame_bytes(Peer& p) {
    if (!p.body) {
      FrameHeader h;
      if (!p.link.open_head(p.c.in.data(), &h)) return corrupted(p);
      const int64_t limit = allowed(p, h);
      if (limit < 0) return drop(p, "sent a message of type " + std::to_string(h.type) + " out of turn");
      if (h.type == kBlob && h.len > kMaxBlobBytes)
        return drop(p, "sent a blob length over the " + std::to_string(kMaxBlobBytes) + "-byte limit");
      if (h.len > uint64_t(limit) || (h.type == kHello && h.len != sizeof(HelloBody)))
        return drop(p, "sent a message of type " + std::to_string(h.type) + " with a wrong length");
      if (h.type == kBlob) {
        round_bytes_ += h.len;
        if (round_bytes_ > kMaxRoundBytes)
          return drop(p, "all-gather round over the " + std::to_string(kMaxRoundBytes) + "-byte limit");
      }
      p.head = h;
      p.body = true;
      p.c.expect(h.len);  // (none: complete at once)
      if (h.len > 0) return;
    }
    if (!Link::payload_ok(p.head, p.c.in)) return corrupted(p);
    p.body = false;
    std::string payload = std::move(p.c.in);
    p.c.expect(kFrameHeadBytes);
    on_message(p, p.head, std::move(payload));
  }

  void on_message(Peer& p, const FrameHeader& h, std::string payload) {
    switch (h.type) {
      case kHello: return on_hello(p, payload);
      case kAbort: return drop(p, "aborted its communicator", kGoneAborted, h.c);
      case kBye: return drop(p, "destroyed its bootstrap", kGoneClosed, h.c);
      case kFault: return verdict(h.a, h.b, h.c, p.rank);
      case kBlob:
        p.has_blob = true;
        p.blob = std::move(payload);
        return;
      default: return;
    }
  }

  // A message from `p` failed its integrity check: something on the way
  // altered it. Before the rendezvous the rank is told so (our messages to it
  // carry their own MACs); after it, every rank is.
  void corrupted(Peer& p) {
    debug_log("bootstrap: a message from " + (p.rank >= 0 ? "rank " + std::to_string(p.rank) : std::string("a rank")) +
              " failed its integrity check");
    if (!started_) return refuse(p, kCorrupted);
    verdict(p.rank, kGoneIntegrity, -1, -1);
    p.close_after_flush = true;  // after the verdict, which it gets too
    if (p.c.out.empty()) p.dead = true;
  }

  void refuse(Peer& p, int32_t status) {
    p.c.send(p.link.seal(kStatus, status, 0, 0));
    p.close_after_flush = true;
    on_writable(p);
  }

  void on_hello(Peer& p, const std::string& body) {
    HelloBody h;
    std::memcpy(&h, body.data(), sizeof h);
    SockAddr listener;
    if (h.magic != kHelloMagic || std::memcmp(h.nonce, id_.nonce, 16) != 0 || !from_wire(h.listener, &listener))
      return drop(p, "sent a malformed hello");
    if (h.nranks < 1 || h.nranks > kMaxRanks || h.rank < 0 || h.rank >= h.nranks) return refuse(p, kOutOfRange);
    if (nranks_ > 0 && h.nranks != nranks_) return refuse(p, kMismatch);
    const bool relay = (h.flags & kHelloRelay) != 0;
    if (nranks_ > 0 && relay != relay_) return refuse(p, kRelayMismatch);
    if (nranks_ < 0) {
      nranks_ = h.nranks;
      relay_ = relay;
      slots_.assign(size_t(nranks_), nullptr);
    }
    if (slots_[size_t(h.rank)]) return refuse(p, kDuplicate);
    slots_[size_t(h.rank)] = &p;
    p.rank = h.rank;
    p.listener = h.listener;
    p.phase = Phase::kJoined;
    ++joined_;
    deadline_ = Clock::now() + std::chrono::milliseconds(timeout_);  // progress: give the rest time
  }

  // Every rank gets every rank's listener address: the same bytes for all
  // (hashed once), each behind a head sealed for its own connection. That
  // is nranks * 24 bytes per rank, a tenth of one 256-byte all-gather.
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
    std::string table;
    table.reserve(slots_.size() * sizeof(WireAddr));
    for (Peer* p : slots_) table.append(reinterpret_cast<const char*>(&p->listener), sizeof(WireAddr));
    send_all(kStatus, kJoined, relay_ ? 1 : 0, std::move(table));
    for (Peer* p : slots_) p->phase = Phase::kRun;
  }

  // One message with the same payload to every rank still connected.
  void send_all(uint32_t type, int32_t a, int32_t b, std::string payload) {
    const Digest d = sha256(payload.data(), payload.size());
    auto shared = std::make_shared<const std::string>(std::move(payload));
    for (Peer* p : slots_) {
      if (p->dead) continue;
      p->c.send(p->link.seal_head(type, a, b, 0, shared->size(), d));
      if (!shared->empty()) p->c.out.push_back(shared);
      on_writable(*p);
    }
  }

  void maybe_broadcast() {
    for (Peer* p : slots_)
      if (!p->has_blob) return;
    std::vector<std::string> parts;
    for (Peer* p : slots_) {
      parts.push_back(std::move(p->blob));
      p->blob.clear();
      p->has_blob = false;
    }
    std::string out;
    out.reserve(round_bytes_ + slots_.size() * sizeof(uint64_t));
    append_parts(&out, parts);
    round_bytes_ = 0;
    send_all(kRound, 0, 0, std::move(out));
  }

  // Rank `rank` left or broke the job (`cause`), having completed `count`
  // all-gathers (-1: unknown); `seen_by` is the rank that found a message of
  // it altered (-1: the root). Every rank still connected is told when this
  // fails more all-gathers than what it was told before (the smallest count
  // so far): a job's normal end, every rank leaving after the same count,
  // costs one message to each. Relaying, no round can complete any more.
  void verdict(int32_t rank, int32_t cause, int32_t count, int32_t seen_by) {
    if (relay_) count = -1;
    if (count >= told_count_) return;
    told_count_ = count;
    broken_ = true;
    for (Peer* q : slots_) {
      if (q->dead) continue;
      q->c.send(q->link.seal(kGone, rank, cause, count, bytes_of(&seen_by, sizeof seen_by)));
      on_writable(*q);
    }
  }

  // Marks a connection for closing; a joined rank's slot is free again. A rank
  // that goes after the rendezvous breaks the job (see verdict()).
  void drop(Peer& p, const std::string& why, Gone cause = kGoneDropped, int32_t count = -1) {
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
    if (p.rank >= 0 && started_) verdict(p.rank, cause, count, -1);
  }

  // Closes what is done.
  void reap() {
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
  bool relay_ = false;
  bool started_ = false, broken_ = false;
  int32_t told_count_ = INT32_MAX;  // the smallest count a verdict carried
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

}  // namespace

void start_server(int fd, const IdContents& c) {
  ++g_live_servers;
  // At exit this process waits (at most 2 s) until its servers have written
  // every message they owe: a rank that exits right after its
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

namespace proto {

void append_parts(std::string* out, const std::vector<std::string>& parts) {
  for (const std::string& p : parts) {
    const uint64_t len = p.size();
    out->append(reinterpret_cast<const char*>(&len), sizeof len);
    *out += p;
  }
}

std::string parse_parts(const std::string& buf, int count, std::vector<std::string>* into, uint64_t* bytes) {
  size_t at = 0;
  for (int i = 0; i < count; ++i) {
    uint64_t len = 0;
    if (buf.size() - at < sizeof len) return "a short all-gather message";
    std::memcpy(&len, buf.data() + at, sizeof len);
    at += sizeof len;
    if (len > kMaxBlobBytes || len > buf.size() - at)
      return "a part of " + std::to_string(len) + " bytes, over the " + std::to_string(kMaxBlobBytes) +
             "-byte limit or its message";
    *bytes += len;
    if (*bytes > kMaxRoundBytes) return "the all-gather grew over the " + std::to_string(kMaxRoundBytes) + "-byte limit";
    into->emplace_back(buf.data() + at, len);
    at += len;
  }
  return at == buf.size() ? std::string() : "an all-gather message with bytes left over";
}

}  // namespace proto
}  // namespace mk::rt
