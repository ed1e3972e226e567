#include "runtime/bootstrap.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <chrono>
#include <cstring>
#include <thread>

#include "runtime/crypto.hpp"
#include "runtime/env.hpp"
#include "runtime/status.hpp"

namespace mk::rt {
namespace {

constexpr char kMagic[4] = {'M', 'K', 'I', 'D'};
constexpr uint32_t kHello = 0x4d4b4845;  // "MKHE"

// Status a rank reads after its hello.
constexpr int32_t kJoined = 0, kMismatch = -1, kDuplicate = -2, kOutOfRange = -3;

std::atomic<int> g_live_servers{0};

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
    if (!started_) debug_log("bootstrap: the rendezvous did not complete within MK_BOOTSTRAP_TIMEOUT_MS; closing");
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
    Peer(const Secret& s) : hs(s, Channel::kBootstrap) {}
  };

  void poll_once() {
    std::vector<pollfd> fds;
    const bool listening = !started_ && pending() < kMaxPendingConnections;
    if (listening) fds.push_back({listen_fd_, POLLIN, 0});
    Clock::time_point wake = started_ ? Clock::time_point::max() : deadline_;
    for (auto& p : peers_) {
      short ev = wants_input(*p) ? POLLIN : 0;
      if (!p->c.out.empty()) ev |= POLLOUT;
      fds.push_back({p->c.fd, ev, 0});
      if (p->phase == Phase::kHandshake || p->phase == Phase::kHello) wake = std::min(wake, p->deadline);
    }
    int timeout = wake == Clock::time_point::max() ? -1 : std::max(1, ms_left(wake));
    int r = ::poll(fds.data(), nfds_t(fds.size()), timeout);
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

  int pending() const {
    return int(std::count_if(peers_.begin(), peers_.end(), [](const auto& p) {
      return p->phase == Phase::kHandshake || p->phase == Phase::kHello;
    }));
  }

  bool wants_input(const Peer& p) const {
    // A joined rank sends nothing until the rendezvous completes; polling it
    // still tells us when it goes away (its slot is then free again).
    return !p.close_after_flush && p.phase != Phase::kHaveBlob;
  }

  void accept_new() {
    for (int k = 0; k < 16 && pending() < kMaxPendingConnections; ++k) {
      int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (c < 0) return;
      int one = 1;
      ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      auto p = std::make_unique<Peer>(id_.secret);
      p->c.fd = c;
      p->c.expect(p->hs.want());
      p->deadline = Clock::now() + std::chrono::milliseconds(handshake_ms_);
      peers_.push_back(std::move(p));
    }
  }

  void on_writable(Peer& p) {
    std::string why;
    if (!p.c.flush(&why)) drop(p, why);
  }

  void on_readable(Peer& p) {
    std::string why;
    if (p.phase == Phase::kJoined || p.phase == Phase::kHaveBlob || p.close_after_flush) {
      // Nothing is expected now: the peer left (or broke the protocol).
      drop(p, "left before the rendezvous completed");
      return;
    }
    if (!p.c.read_some(&why)) {
      drop(p, why);
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
    if (len > kMaxBlobBytes) return drop(p, "sent a blob length over the " + std::to_string(kMaxBlobBytes) + "-byte limit");
    round_bytes_ += len;
    if (round_bytes_ > kMaxRoundBytes) return drop(p, "all-gather round over the " + std::to_string(kMaxRoundBytes) + "-byte limit");
    p.phase = len ? Phase::kBlob : Phase::kHaveBlob;
    p.c.expect(len);
  }

  void start() {
    started_ = true;
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
  // that goes after the rendezvous breaks the job (see reap()).
  void drop(Peer& p, const std::string& why) {
    if (p.dead) return;
    p.dead = true;
    if (debug_enabled())
      debug_log(p.rank >= 0 ? "bootstrap: rank " + std::to_string(p.rank) + " connection closed: " + why
                            : "bootstrap: dropped a connection that " + why);
    if (p.rank >= 0 && !started_) {
      slots_[size_t(p.rank)] = nullptr;
      --joined_;
    }
    if (p.rank >= 0 && started_) broken_ = true;
  }

  // Closes what is done. Once the job is broken, ranks waiting in a round that
  // can no longer complete are closed so that they fail now instead of at
  // their timeout; the others close their own connections when they are done.
  void reap() {
    if (broken_)
      for (Peer* q : slots_)
        if (q->phase != Phase::kLength || !q->c.in.empty()) drop(*q, "waits for a rank that left");
    for (auto& p : peers_)
      if (p->close_after_flush && p->c.out.empty()) p->dead = true;
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
  int nranks_ = -1, joined_ = 0;
  bool started_ = false, broken_ = false;
  uint64_t round_bytes_ = 0;
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

bool parse_addr(const std::string& text, sockaddr_in* sa) {
  auto colon = text.rfind(':');
  std::string host = colon == std::string::npos ? text : text.substr(0, colon);
  int port = 0;
  if (colon != std::string::npos) {
    try {
      port = std::stoi(text.substr(colon + 1));
    } catch (...) {
      return false;
    }
  }
  if (port < 0 || port > 65535) return false;
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res) return false;
  *sa = *reinterpret_cast<sockaddr_in*>(res->ai_addr);
  sa->sin_port = htons(uint16_t(port));
  ::freeaddrinfo(res);
  return true;
}

}  // namespace

int bootstrap_timeout_ms() { return env::bootstrap_timeout_ms(); }

void bootstrap_create_id(mkUniqueId* id) {
  IdContents c;  // the random parts first: nothing to clean up if there is no randomness
  random_bytes(c.nonce, sizeof c.nonce);
  random_bytes(c.secret.data(), c.secret.size());
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (const char* a = std::getenv("MK_BOOTSTRAP_ADDR"); a && *a)
    if (!parse_addr(a, &sa)) fail(mkInvalidArgument, std::string("MK_BOOTSTRAP_ADDR='") + a + "' is not host:port");
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

// Connects to the root, retrying until `deadline` (it may not listen yet).
int connect_root(const sockaddr_in& sa, int rank, Clock::time_point deadline) {
  std::string why;
  for (;;) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) fail(mkSystemError, "bootstrap: socket(): " + errno_text());
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) == 0) {
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return fd;
    }
    why = errno_text();
    ::close(fd);
    if (ms_left(deadline) == 0)
      fail(mkSystemError, "rank " + std::to_string(rank) + ": cannot reach the rendezvous at " +
                              inet_ntoa(sa.sin_addr) + ":" + std::to_string(ntohs(sa.sin_port)) + ": " + why +
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
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);  // a blocked read or write returns now
}

bool BootstrapCancel::cancelled() {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

bool BootstrapCancel::watch(int fd) {
  std::lock_guard<std::mutex> lock(mu_);
  fd_ = fd;
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
  fd_ = connect_root(sa, rank, deadline);
  if (cancel_ && !cancel_->watch(fd_)) {
    close_fd();
    fail(mkInvalidUsage, "rank " + std::to_string(rank) + ": the communicator was aborted during init");
  }
  const std::string where = std::string(inet_ntoa(sa.sin_addr)) + ":" + std::to_string(ntohs(sa.sin_port));
  std::string why;
  ClientAuth auth = client_handshake(fd_, id_.secret, Channel::kBootstrap, deadline, &why);
  if (auth == ClientAuth::kServerUnproven) {
    close_fd();
    fail(mkRemoteError, "rank " + std::to_string(rank) + ": the rendezvous at " + where +
                            " could not prove it knows this unique id's secret: another process owns that port, or "
                            "the id is stale or from another job; get a fresh id from mkGetUniqueId");
  }
  Hello h{kHello, nranks, rank, {}};
  std::memcpy(h.nonce, id_.nonce, 16);
  int32_t status = 0;
  if (auth != ClientAuth::kOk || !write_full(fd_, &h, sizeof h, deadline, &why) ||
      !read_full(fd_, &status, sizeof status, deadline, &why)) {
    close_fd();
    fail(mkSystemError, "rank " + std::to_string(rank) + ": bootstrap rendezvous at " + where + " failed: " + why +
                            " (did every rank of " + std::to_string(nranks) + " call mkCommInitRank with this id?)");
  }
  if (status != kJoined) {
    close_fd();
    fail(status == kOutOfRange ? mkInvalidArgument : mkInvalidUsage, refusal_text(status, rank, nranks));
  }
}

Bootstrap::~Bootstrap() { close_fd(); }

std::vector<std::string> Bootstrap::allgather(const std::string& mine) {
  if (mine.size() > kMaxBlobBytes)
    fail(mkInvalidArgument, "bootstrap all-gather: " + std::to_string(mine.size()) + " bytes exceed the limit of " +
                                std::to_string(kMaxBlobBytes) + " bytes per rank");
  std::string why;
  const auto deadline = Clock::now() + std::chrono::milliseconds(bootstrap_timeout_ms());
  uint64_t len = mine.size();
  if (!write_full(fd_, &len, sizeof len, deadline, &why) || !write_full(fd_, mine.data(), mine.size(), deadline, &why))
    fail(mkSystemError, "rank " + std::to_string(rank_) + ": bootstrap send failed: " + why);
  std::vector<std::string> all(static_cast<size_t>(nranks_));
  for (int r = 0; r < nranks_; ++r) {
    uint64_t n = 0;
    if (!read_full(fd_, &n, sizeof n, deadline, &why))
      fail(mkRemoteError, "rank " + std::to_string(rank_) + ": waiting for the other ranks during setup: " + why);
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
