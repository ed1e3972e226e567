#include "runtime/bootstrap/bootstrap.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "runtime/api/status.hpp"
#include "runtime/bootstrap/crypto.hpp"
#include "runtime/bootstrap/peers.hpp"
#include "runtime/bootstrap/protocol.hpp"
#include "runtime/bootstrap/rendezvous.hpp"
#include "runtime/comm/env.hpp"
#include "runtime/transport/net/iface.hpp"

namespace mk::rt {
namespace {

using namespace proto;

constexpr char kMagic[4] = {'M', 'K', 'I', 'D'};
// The direct all-gather's groups: at most this many ranks of one host each
// (direct_allgather). 16, 32 and 64 measured alike at 1024 ranks on 2 cores
// (bench/results/2026-12-07-bootstrap-scale.md), one group of all 1024 10% slower.
constexpr int kGroupRanks = 64;
std::atomic<int> g_group_ranks{kGroupRanks};
constexpr uint8_t kIdFamilyIpv6 = 6;
constexpr uint8_t kIdFlagCommId = 1;

// Bootstraps of this process made from an MK_COMM_ID id (bootstrap_create_id).
std::atomic<int> g_comm_id_boots{0};

std::string errno_text() { return std::strerror(errno); }

// A listening socket on `a` (port 0: an ephemeral one, written back).
// Returns -1 with *why set.
int listen_on(SockAddr* a, int backlog, std::string* why) {
  int fd = ::socket(a->family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *why = "socket(): " + errno_text();
    return -1;
  }
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, a->sa(), a->len()) != 0 || ::listen(fd, backlog) != 0) {
    *why = errno_text();
    ::close(fd);
    return -1;
  }
  socklen_t len = sizeof a->ss;
  ::getsockname(fd, a->sa(), &len);
  return fd;
}

std::string ipv4_text(uint32_t a) {
  in_addr x{};
  x.s_addr = a;
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &x, buf, sizeof buf);
  return buf;
}

int hex_digit(char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
  return -1;
}

// With MK_COMM_ID every process makes its own id: the nonce must be the same
// on every rank without being passed, so it derives from the secret and the
// address (it only needs to differ between jobs, and it does where they
// differ in either).
void comm_id_nonce(const Secret& s, const SockAddr& a, uint8_t* nonce) {
  const WireAddr w = to_wire(a);
  const Digest d = hmac_sha256(s.data(), s.size(), {"mkernel MK_COMM_ID nonce", bytes_of(&w, sizeof w)});
  std::memcpy(nonce, d.data(), 16);
}

void encode_id(const IdContents& c, mkUniqueId* id) {
  std::memset(id->internal, 0, sizeof id->internal);
  auto* b = reinterpret_cast<uint8_t*>(id->internal);
  std::memcpy(b, kMagic, 4);
  std::memcpy(b + 8, &c.port, 2);
  std::memcpy(b + 16, c.nonce, 16);
  if (!c.comm_id) std::memcpy(b + 32, c.secret.data(), c.secret.size());
  if (c.ipv6) {
    b[64] = kIdFamilyIpv6;
    const uint32_t scope = htonl(c.scope_id);
    std::memcpy(b + 68, &scope, 4);
    std::memcpy(b + 80, c.ipv6_addr, 16);
  } else {
    std::memcpy(b + 4, &c.ipv4, 4);
  }
  if (c.comm_id) b[65] = kIdFlagCommId;
}

void set_address(IdContents* c, const SockAddr& a) {
  if (a.family() == AF_INET6) {
    const auto* s = reinterpret_cast<const sockaddr_in6*>(&a.ss);
    c->ipv6 = true;
    std::memcpy(c->ipv6_addr, &s->sin6_addr, 16);
    c->scope_id = s->sin6_scope_id;
    c->port = s->sin6_port;
  } else {
    const auto* s = reinterpret_cast<const sockaddr_in*>(&a.ss);
    c->ipv4 = s->sin_addr.s_addr;
    c->port = s->sin_port;
  }
}

// Where the rendezvous listens when MK_BOOTSTRAP_ADDR is unset.
SockAddr default_listen_address() {
  const char* spec = std::getenv("MK_SOCKET_IFNAME");
  const char* fam = std::getenv("MK_SOCKET_FAMILY");
  SockAddr a;
  if (net::parse_family(fam ? fam : "", "MK_SOCKET_FAMILY") == AF_INET6) {
    const net::Iface f = net::choose_iface(net::list_ifaces(), net::IfnameSpec(spec ? spec : "", "MK_SOCKET_IFNAME"),
                                           AF_INET6);
    a = SockAddr::of(reinterpret_cast<const sockaddr*>(&f.addr));
  } else {
    auto* s = reinterpret_cast<sockaddr_in*>(&a.ss);
    s->sin_family = AF_INET;
    s->sin_addr.s_addr = choose_bootstrap_ipv4(net_ifaces(), spec ? spec : "");
  }
  a.set_port(0);
  return a;
}

int socket_family_setting() {
  const char* fam = std::getenv("MK_SOCKET_FAMILY");
  return net::parse_family(fam ? fam : "", "MK_SOCKET_FAMILY");
}

}  // namespace

SockAddr IdContents::address() const {
  SockAddr a;
  if (ipv6) {
    auto* s = reinterpret_cast<sockaddr_in6*>(&a.ss);
    s->sin6_family = AF_INET6;
    std::memcpy(&s->sin6_addr, ipv6_addr, 16);
    s->sin6_scope_id = scope_id;
    s->sin6_port = port;
  } else {
    auto* s = reinterpret_cast<sockaddr_in*>(&a.ss);
    s->sin_family = AF_INET;
    s->sin_addr.s_addr = ipv4;
    s->sin_port = port;
  }
  return a;
}

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

Secret comm_secret_from_env() {
  static const char* how =
      "; give every rank the same 64 hex characters (32 random bytes), e.g. MK_COMM_SECRET=$(openssl rand -hex 32), "
      "passed to the ranks the way the job's other secrets are";
  const char* v = std::getenv("MK_COMM_SECRET");
  if (!v || !*v) fail(mkInvalidArgument, std::string("MK_COMM_ID is set, so MK_COMM_SECRET must be too: the unique id "
                                                      "cannot carry the job's secret when no id passes between "
                                                      "processes") + how);
  const std::string t = v;
  if (t.size() != 64)
    fail(mkInvalidArgument, "MK_COMM_SECRET has " + std::to_string(t.size()) + " characters, not 64" + how);
  Secret s;
  for (size_t i = 0; i < 32; ++i) {
    const int hi = hex_digit(t[2 * i]), lo = hex_digit(t[2 * i + 1]);
    if (hi < 0 || lo < 0)
      fail(mkInvalidArgument, "MK_COMM_SECRET has a character that is not a hex digit at position " +
                                  std::to_string(hi < 0 ? 2 * i + 1 : 2 * i + 2) + how);
    s[i] = uint8_t(hi << 4 | lo);
  }
  if (s == Secret{}) fail(mkInvalidArgument, std::string("MK_COMM_SECRET is all zeros") + how);
  return s;
}

void bootstrap_create_id(mkUniqueId* id) {
  IdContents c;  // the random parts first: nothing to clean up if there is no randomness
  const int family = socket_family_setting();
  if (const char* cid = std::getenv("MK_COMM_ID"); cid && *cid && g_comm_id_boots.load() == 0) {
    const SockAddr a = parse_host_port(cid, "MK_COMM_ID", /*port_required=*/true, family);
    c.secret = comm_secret_from_env();
    c.comm_id = true;
    set_address(&c, a);
    comm_id_nonce(c.secret, a, c.nonce);
    encode_id(c, id);
    return;
  }
  random_bytes(c.nonce, sizeof c.nonce);
  random_bytes(c.secret.data(), c.secret.size());
  SockAddr a;
  if (const char* v = std::getenv("MK_BOOTSTRAP_ADDR"); v && *v)
    a = parse_host_port(v, "MK_BOOTSTRAP_ADDR", /*port_required=*/false, family);
  else
    a = default_listen_address();
  std::string why;
  const int fd = listen_on(&a, 1024, &why);
  if (fd < 0) fail(mkSystemError, "bootstrap: cannot listen on the rendezvous address " + a.text() + ": " + why);
  set_address(&c, a);
  encode_id(c, id);
  start_server(fd, c);
}

void bootstrap_group_ranks_for_tests(int ranks) { g_group_ranks.store(ranks > 0 ? ranks : kGroupRanks); }

IdContents bootstrap_decode(const mkUniqueId& id) {
  const auto* b = reinterpret_cast<const uint8_t*>(id.internal);
  if (std::memcmp(b, kMagic, 4) != 0 || (b[64] != 0 && b[64] != kIdFamilyIpv6) || (b[65] & ~kIdFlagCommId) != 0)
    fail(mkInvalidArgument, "the unique id was not made by mkGetUniqueId (or was corrupted in transit)");
  IdContents c;
  std::memcpy(&c.port, b + 8, 2);
  std::memcpy(c.nonce, b + 16, 16);
  c.ipv6 = b[64] == kIdFamilyIpv6;
  if (c.ipv6) {
    uint32_t scope = 0;
    std::memcpy(&scope, b + 68, 4);
    c.scope_id = ntohl(scope);
    std::memcpy(c.ipv6_addr, b + 80, 16);
  } else {
    std::memcpy(&c.ipv4, b + 4, 4);
  }
  c.comm_id = (b[65] & kIdFlagCommId) != 0;
  if (!c.comm_id) {
    std::memcpy(c.secret.data(), b + 32, c.secret.size());
    return c;
  }
  c.secret = comm_secret_from_env();
  uint8_t nonce[16];
  comm_id_nonce(c.secret, c.address(), nonce);
  if (!equal_constant_time(nonce, c.nonce, sizeof nonce))
    fail(mkInvalidArgument, "this MK_COMM_ID unique id was made with another MK_COMM_SECRET than this process has; "
                            "give every rank the same MK_COMM_SECRET");
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
int connect_once(int fd, const SockAddr& sa, Clock::time_point deadline, std::string* why) {
  int err = 0;
  if (::connect(fd, sa.sa(), sa.len()) == 0) return 0;
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
int connect_root(const SockAddr& sa, int rank, Clock::time_point deadline, bool again = false,
                 std::string* refused = nullptr) {
  std::string why;
  for (;;) {
    int fd = ::socket(sa.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
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
      fail(mkSystemError, "rank " + std::to_string(rank) + ": cannot reach the rendezvous at " + sa.text() + ": " +
                              why + " (is the process that called mkGetUniqueId, or rank 0 with MK_COMM_ID, alive?)");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::string refusal_text(int32_t status, int rank, int nranks, const std::string& where) {
  if (status == kDuplicate) return "rank " + std::to_string(rank) + " joined twice with the same unique id";
  if (status == kOutOfRange)
    return "the rendezvous refused rank " + std::to_string(rank) + " of " + std::to_string(nranks) +
           ": nranks must be 1.." + std::to_string(kMaxRanks) + " and rank in 0..nranks-1";
  if (status == kRelayMismatch)
    return "the rendezvous rejected rank " + std::to_string(rank) +
           ": MK_BOOTSTRAP_RELAY differs from what another rank said; set it alike on every rank";
  if (status == kCorrupted)
    return "rank " + std::to_string(rank) + ": our hello reached the rendezvous at " + where +
           " altered (it failed its integrity check): something between this host and the rendezvous changes "
           "bytes (a faulty device, or an attacker on the network)";
  return "the rendezvous rejected rank " + std::to_string(rank) + ": nranks=" + std::to_string(nranks) +
         " differs from what another rank said; pass the same nranks on every rank";
}

// "a message from rank 3 to rank 5", "a message from the rendezvous to rank 5"
std::string message_between(int32_t from, int32_t to) {
  auto name = [](int32_t r) { return r < 0 ? std::string("the rendezvous") : "rank " + std::to_string(r); };
  return "a message from " + name(from) + " to " + name(to);
}

constexpr const char* kAltered =
    " failed its integrity check: something on the way altered it (a faulty device, or an attacker on the network)";

// What a kGone message says.
std::string gone_text(int32_t rank, int32_t cause, int32_t seen_by) {
  const std::string peer = "rank " + std::to_string(rank);
  if (cause == kGoneAborted) return peer + " aborted its communicator";
  if (cause == kGoneClosed) return peer + "'s connection closed (process ended or communicator destroyed)";
  if (cause == kGoneIntegrity) return message_between(rank, seen_by) + kAltered;
  return peer + (seen_by < 0 ? " was dropped by the rendezvous" : " was reported by rank " + std::to_string(seen_by)) +
         " (it broke the bootstrap protocol)";
}

// The address a rank's peers reach it on: MK_SOCKET_IFNAME's interface of the
// root's family when set, else the address this rank reaches the root from.
SockAddr peer_listen_address(int root_fd, int family) {
  SockAddr a;
  if (const char* spec = std::getenv("MK_SOCKET_IFNAME"); spec && *spec) {
    const net::Iface f = net::choose_iface(net::list_ifaces(), net::IfnameSpec(spec, "MK_SOCKET_IFNAME"), family);
    a = SockAddr::of(reinterpret_cast<const sockaddr*>(&f.addr));
  } else {
    socklen_t len = sizeof a.ss;
    if (::getsockname(root_fd, a.sa(), &len) != 0) fail(mkSystemError, "bootstrap: getsockname: " + errno_text());
  }
  a.set_port(0);
  return a;
}

}  // namespace

void BootstrapCancel::cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
  if (fd_ < 0) return;
  if (boundary_ && !abort_.empty()) {
    // Tell the rendezvous first (best effort, never blocks): it tells the
    // other ranks that this one aborted, also those waiting in a round now.
    (void)::send(fd_, abort_.data(), abort_.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    boundary_ = false;
  }
  ::shutdown(fd_, SHUT_RDWR);  // a blocked read or write returns now, and every wait polls this socket
}

void BootstrapCancel::at_boundary(bool yes, std::string abort_message) {
  std::lock_guard<std::mutex> lock(mu_);
  boundary_ = yes && fd_ >= 0 && !cancelled_;
  abort_ = boundary_ ? std::move(abort_message) : std::string();
}

bool BootstrapCancel::cancelled() {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

bool BootstrapCancel::watch(int fd) {
  std::lock_guard<std::mutex> lock(mu_);
  fd_ = fd;
  boundary_ = false;
  abort_.clear();
  if (cancelled_ && fd >= 0) ::shutdown(fd, SHUT_RDWR);
  return !cancelled_;
}

struct Bootstrap::Verdict {
  int32_t rank, cause, count;
  std::string text;
};

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
  relay_ = env::get_bool("MK_BOOTSTRAP_RELAY", false);
  const SockAddr root = id_.address();
  const std::string where = root.text();
  if (id_.comm_id && rank == 0) {  // MK_COMM_ID: the root is ours to start, exactly there
    SockAddr a = root;
    std::string why;
    const int fd = listen_on(&a, 1024, &why);
    if (fd < 0)
      fail(mkSystemError, "rank 0: cannot start the rendezvous on MK_COMM_ID's address " + where + ": " + why +
                              " (is it an address of this host, and is no other job's rendezvous on that port?)");
    start_server(fd, id_);
  }
  try {
    join(root, where);
  } catch (...) {
    if (listen_fd_ >= 0) ::close(listen_fd_);
    listen_fd_ = -1;
    close_fd();
    throw;
  }
  if (id_.comm_id) ++g_comm_id_boots;
}

void Bootstrap::join(const SockAddr& root, const std::string& where) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(bootstrap_timeout_ms());
  auto aborted = [&] {
    close_fd();
    fail(mkInvalidUsage, "rank " + std::to_string(rank_) + ": the communicator was aborted during init");
  };
  auto failed = [&](const std::string& why) {
    close_fd();
    fail(mkSystemError, "rank " + std::to_string(rank_) + ": bootstrap rendezvous at " + where + " failed: " + why +
                            " (did every rank of " + std::to_string(nranks_) + " call mkCommInitRank with this id?)");
  };
  HelloBody h;
  h.nranks = nranks_;
  h.rank = rank_;
  h.flags = relay_ ? kHelloRelay : 0;
  std::memcpy(h.nonce, id_.nonce, 16);
  std::string why;
  uint8_t head[kFrameHeadBytes];
  for (int attempt = 1;; ++attempt) {
    if (attempt == 1) {
      fd_ = connect_root(root, rank_, deadline);
    } else {
      std::string refused;
      fd_ = connect_root(root, rank_, deadline, /*again=*/true, &refused);
      if (fd_ < 0) failed(why + "; connecting again: " + refused + " (the rendezvous has ended)");
    }
    if (listen_fd_ < 0) {
      SockAddr a = peer_listen_address(fd_, root.family());
      listen_fd_ = listen_on(&a, 512, &why);
      if (listen_fd_ < 0) {
        close_fd();
        fail(mkSystemError, "rank " + std::to_string(rank_) + ": cannot listen for the other ranks on " + a.text() +
                                ": " + why);
      }
      h.listener = to_wire(a);
    }
    if (cancel_ && !cancel_->watch(fd_)) aborted();
    SessionKeys keys;
    const ClientAuth auth = client_handshake(fd_, id_.secret, Channel::kBootstrap, deadline, &why, &keys);
    if (cancel_ && cancel_->cancelled()) aborted();
    if (auth == ClientAuth::kServerUnproven) {
      close_fd();
      fail(mkRemoteError, "rank " + std::to_string(rank_) + ": the rendezvous at " + where +
                              " could not prove it knows this unique id's secret: another process owns that port, or " +
                              (id_.comm_id ? "MK_COMM_SECRET differs between the ranks (give every rank the same one)"
                                           : "the id is stale or from another job; get a fresh id from mkGetUniqueId"));
    }
    if (auth == ClientAuth::kOk) {
      root_ = Link(keys);
      const std::string hello = root_.seal(kHello, 0, 0, 0, bytes_of(&h, sizeof h));
      if (write_full(fd_, hello.data(), hello.size(), deadline, &why) &&
          read_full(fd_, head, sizeof head, deadline, &why))
        break;
    }
    if (cancel_ && cancel_->cancelled()) aborted();
    if (ms_left(deadline) == 0) failed(why);
    // The root closed the connection before we joined. Under a flood of
    // connections that do not know the secret it evicts unauthenticated ones,
    // ours too if our proof had not arrived yet: connect again (a root that
    // has ended refuses the connection, and we fail then).
    close_fd();
    if (debug_enabled() && (attempt == 1 || attempt % 100 == 0))
      debug_log("bootstrap: rank " + std::to_string(rank_) + ": the rendezvous at " + where +
                " closed the connection before we joined (" + why + "), attempt " + std::to_string(attempt) +
                "; connecting again");
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(attempt, 20)));
  }
  FrameHeader st;
  if (!root_.open_head(head, &st)) root_altered();
  if (st.type != kStatus) failed("it answered our hello with message type " + std::to_string(st.type));
  if (st.a != kJoined) {
    close_fd();
    fail(st.a == kOutOfRange ? mkInvalidArgument : st.a == kCorrupted ? mkRemoteError : mkInvalidUsage,
         refusal_text(st.a, rank_, nranks_, where));
  }
  if (st.len != uint64_t(nranks_) * sizeof(WireAddr)) failed("its table of the ranks' addresses has the wrong size");
  std::string table(st.len, '\0');
  if (!read_full(fd_, table.data(), table.size(), deadline, &why)) failed(why);
  if (!Link::payload_ok(st, table)) root_altered();
  std::vector<SockAddr> addrs(static_cast<size_t>(nranks_));
  for (int r = 0; r < nranks_; ++r) {
    WireAddr w;
    std::memcpy(&w, table.data() + size_t(r) * sizeof w, sizeof w);
    if (!from_wire(w, &addrs[size_t(r)])) failed("rank " + std::to_string(r) + "'s address is malformed");
  }
  // The all-gather's groups (direct_allgather): ranks of one host address,
  // in rank order, at most kGroupRanks a group; the same on every rank.
  std::map<std::string, int> open;  // host address -> its group still taking ranks
  group_of_.assign(size_t(nranks_), -1);
  for (int r = 0; r < nranks_; ++r) {
    WireAddr w;
    std::memcpy(&w, table.data() + size_t(r) * sizeof w, sizeof w);
    w.port = 0;
    const std::string host(reinterpret_cast<const char*>(&w), sizeof w);
    auto it = open.find(host);
    if (it == open.end() || groups_[size_t(it->second)].size() >= size_t(g_group_ranks.load())) {
      groups_.emplace_back();
      open[host] = int(groups_.size()) - 1;
    }
    const int gi = open[host];
    groups_[size_t(gi)].push_back(r);
    group_of_[size_t(r)] = gi;
  }
  peers_ = std::make_unique<PeerMesh>(id_, nranks_, rank_, listen_fd_, std::move(addrs), fd_, [this] { on_root(); },
                                      [this] { return cancel_ && cancel_->cancelled(); });
  listen_fd_ = -1;
  arm_abort();
}

Bootstrap::~Bootstrap() {
  if (cancel_) cancel_->at_boundary(false);
  // A goodbye first, with the all-gathers this rank completed: the others
  // then finish what it took part in and fail what it did not.
  if (fd_ >= 0 && !(cancel_ && cancel_->cancelled())) {
    const std::string bye = root_.seal(kBye, 0, 0, ops_);
    std::string why;  // whole or not at all (a part would read as an altered message): bounded, best effort
    (void)write_full(fd_, bye.data(), bye.size(), Clock::now() + std::chrono::milliseconds(200), &why);
  }
  peers_.reset();
  close_fd();
  if (id_.comm_id) --g_comm_id_boots;
}

// The abort message cancel() sends: this rank's next message to the root,
// with the all-gathers it completed.
void Bootstrap::arm_abort() {
  if (!cancel_ || fd_ < 0) return;
  Link next = root_;
  cancel_->at_boundary(true, next.seal(kAbort, 0, 0, ops_));
}

void Bootstrap::report_fault(int32_t sender, int32_t cause) {
  if (fd_ < 0) return;
  if (cancel_) cancel_->at_boundary(false);
  const std::string m = root_.seal(kFault, sender, cause, ops_);
  std::string why;
  (void)write_full(fd_, m.data(), m.size(), Clock::now() + std::chrono::seconds(1), &why);  // best effort
  arm_abort();
}

void Bootstrap::broken(mkResult_t code, const std::string& what) {
  gone_ = what;
  gone_code_ = code;
  fail(code, what);
}

void Bootstrap::root_altered() {
  report_fault(-1, kGoneIntegrity);
  const std::string what = "rank " + std::to_string(rank_) + ": " + message_between(-1, rank_) + kAltered;
  if (!peers_) {  // still joining
    close_fd();
    fail(mkRemoteError, what);
  }
  broken(mkRemoteError, what);
}

void Bootstrap::begin(bool collective, int peer) {
  if (!gone_.empty()) fail(gone_code_, gone_);
  op_ = {collective, peer, Clock::now() + std::chrono::milliseconds(bootstrap_timeout_ms())};
  if (cancel_ && cancel_->cancelled())
    broken(mkInvalidUsage, "rank " + std::to_string(rank_) + ": the communicator was aborted");
  drain_root();
  check_verdict();
}

// Reads what the rendezvous has sent so far without waiting for more.
void Bootstrap::drain_root() {
  for (;;) {
    if (fd_ < 0) return;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) return;
    on_root();
  }
}

// The rendezvous's socket is readable: a verdict (a rank left or broke the
// job), its end, or our own abort (cancel() shut the socket down). Throws
// when the call in progress cannot complete any more.
void Bootstrap::on_root() {
  if (cancel_ && cancel_->cancelled())
    broken(mkInvalidUsage, "rank " + std::to_string(rank_) + ": the communicator was aborted");
  uint8_t head[kFrameHeadBytes];
  std::string why;
  const auto until = std::min(op_.deadline, Clock::now() + std::chrono::seconds(5));
  FrameHeader h;
  if (read_full(fd_, head, sizeof head, until, &why)) {
    if (!root_.open_head(head, &h)) root_altered();
    if (h.type != kGone)
      broken(mkRemoteError, "rank " + std::to_string(rank_) + ": the rendezvous sent message type " +
                                std::to_string(h.type) + " out of turn");
    if (take_verdict(h, until)) return check_verdict();
  } else {
    why = "rendezvous closed its connection (" + why + ")";
  }
  // The rendezvous ended (its process did): nothing tells us any more who
  // leaves, so no later all-gather is safe to wait for. The one in progress
  // may still complete (the process may have ended normally right after
  // it), within a short grace: if it crashed mid-way, its peers fail here
  // soon instead of at the timeout.
  if (peers_) peers_->forget_root();
  close_fd();
  const int32_t count = op_.collective ? ops_ + 1 : ops_;
  if (!verdict_ || verdict_->count > count)
    verdict_.reset(new Verdict{-1, kGoneClosed, count,
                               "rank " + std::to_string(rank_) + ": the " + why +
                                   ": the process that made the unique id (rank 0's with MK_COMM_ID) ended, so this "
                                   "communicator's bootstrap exchanges can no longer complete; destroy or abort it"});
  if (!recovering_) op_.deadline = std::min(op_.deadline, Clock::now() + std::chrono::seconds(2));
  check_verdict();
}

// The rest of a kGone message: keeps it when it fails more all-gathers than
// the one kept. False when the socket closed first.
bool Bootstrap::take_verdict(const FrameHeader& h, Clock::time_point until) {
  int32_t seen_by = -1;
  std::string payload(sizeof seen_by, '\0'), why;
  if (h.len != payload.size())
    broken(mkRemoteError, "rank " + std::to_string(rank_) + ": the rendezvous sent a malformed message");
  if (!read_full(fd_, payload.data(), payload.size(), until, &why)) return false;
  if (!Link::payload_ok(h, payload)) root_altered();
  std::memcpy(&seen_by, payload.data(), sizeof seen_by);
  if (!verdict_ || h.c < verdict_->count)
    verdict_.reset(new Verdict{h.a, h.b, h.c,
                               "rank " + std::to_string(rank_) + ": " + gone_text(h.a, h.b, seen_by) +
                                   ", so this communicator's bootstrap exchanges (mkCommSplit, mkCommRegister, "
                                   "mkCommDeregister, mkCommBootstrapBroadcast) can no longer complete; destroy or "
                                   "abort it"});
  return true;
}

// An all-gather fails when the rank that left had not completed it (count:
// how many it completed; -1 unknown). Point-to-point calls fail only when
// their own peer is gone (PeerMesh says so: its messages come first).
void Bootstrap::check_verdict() {
  if (verdict_ && op_.collective && ops_ + 1 > verdict_->count) broken(mkRemoteError, verdict_->text);
}

void Bootstrap::on_peer_error(const std::exception& ex) {
  const auto* e = dynamic_cast<const PeerMesh::Error*>(&ex);
  if (!e) throw;
  const std::string me = "rank " + std::to_string(rank_) + ": ";
  const std::string peer = e->peer >= 0 ? "rank " + std::to_string(e->peer) : std::string("the other ranks");
  if (e->peer >= 0 && e->kind != PeerMesh::Error::kTimeout) lost_.push_back(e->peer);
  switch (e->kind) {
    case PeerMesh::Error::kLost: {
      // The rendezvous names the cause (aborted, destroyed, ended) within
      // about a round trip of the departure: wait for its word a little.
      const auto until = std::min(op_.deadline, Clock::now() + std::chrono::seconds(2));
      while (fd_ >= 0 && !(verdict_ && verdict_->rank == e->peer)) {
        pollfd p{fd_, POLLIN, 0};
        const int r = ::poll(&p, 1, ms_left(until));
        if (r == 0) break;
        if (r < 0 && errno != EINTR) break;
        if (r > 0) on_root();  // closes fd_ when the rendezvous ended
      }
      if (verdict_ && verdict_->rank == e->peer) broken(mkRemoteError, verdict_->text);
      broken(mkRemoteError, me + peer + "'s connection closed (process ended or communicator destroyed): " + e->why +
                                ", so this communicator's bootstrap exchanges can no longer complete; destroy or "
                                "abort it");
    }
    case PeerMesh::Error::kIntegrity:
      report_fault(e->peer, kGoneIntegrity);
      broken(mkRemoteError, me + message_between(e->peer, rank_) + kAltered);
    case PeerMesh::Error::kProtocol:
      report_fault(e->peer, kGoneDropped);
      broken(mkRemoteError, me + peer + " broke the bootstrap protocol: " + e->why);
    case PeerMesh::Error::kTimeout:
    default:
      if (verdict_ && verdict_->rank < 0) broken(mkRemoteError, verdict_->text);  // the rendezvous ended meanwhile
      broken(mkRemoteError, me + "waiting for " + peer + " during setup: timed out after " +
                                std::to_string(bootstrap_timeout_ms()) + " ms (MK_BOOTSTRAP_TIMEOUT_MS)");
  }
}

std::vector<std::string> Bootstrap::allgather(const std::string& mine) {
  if (mine.size() > kMaxBlobBytes)
    fail(mkInvalidArgument, "bootstrap all-gather: " + std::to_string(mine.size()) + " bytes exceed the limit of " +
                                std::to_string(kMaxBlobBytes) + " bytes per rank");
  begin(/*collective=*/true, -1);
  std::vector<std::string> all;
  if (nranks_ == 1) {
    all = {mine};
  } else {
    try {
      all = relay_ ? relay_allgather(mine) : direct_allgather(mine);
    } catch (const PeerMesh::Error& e) {
      on_peer_error(e);
    }
  }
  ++ops_;
  arm_abort();
  return all;
}

namespace {

enum Phase : int32_t { kUp = 0, kAcross = 1, kDown = 2 };  // the c field of kGather messages

// Takes `count` parts out of an all-gather message from `who`, checked to be
// of the phase and step due.
void take_parts(const PeerMesh::Frame& f, int who, int32_t phase, int32_t step, int count,
                std::vector<std::string>* into, uint64_t* bytes) {
  auto bad = [&](const std::string& why) { throw PeerMesh::Error(PeerMesh::Error::kProtocol, who, why); };
  if (f.h.type != kGather || f.h.c != phase || f.h.a != step || f.h.b != count)
    bad("it sent message type " + std::to_string(f.h.type) + " (phase " + std::to_string(f.h.c) + ", step " +
        std::to_string(f.h.a) + ", " + std::to_string(f.h.b) + " parts) where phase " + std::to_string(phase) +
        ", step " + std::to_string(step) + " of an all-gather with " + std::to_string(count) +
        " parts was due (do all ranks make the same bootstrap calls?)");
  const std::string wrong = parse_parts(f.payload, count, into, bytes);
  if (!wrong.empty()) bad(wrong);
}

}  // namespace

// The direct all-gather, in three phases over rank-to-rank connections:
//   up      each rank sends its part to its group's leader (a group: at
//           most kGroupRanks ranks that announced the same host address,
//           in rank order; the leader is the lowest);
//   across  the leaders run Bruck's all-gather on whole groups: in step k
//           (distance d = 2^k) leader l sends the groups it holds, those of
//           leaders l .. l+d-1, to leader l-d and receives those of l+d ..
//           l+2d-1 from leader l+d (mod L leaders; the last step only what
//           is missing);
//   down    each leader sends every part to its group, one buffer.
// Why: the cost of the bootstrap's small all-gathers (a few hundred bytes a
// rank) is sequential messages and process wake-ups, not bytes. Bruck alone
// over all n ranks takes ceil(log2 n) rounds in which every process wakes
// (a ring: n-1): at n = 1024 on one host that is 10 wake-ups of 1024
// processes sharing its CPUs, where the groups need 2 for most ranks. Across
// hosts only leaders talk, in ceil(log2 L) rounds, and no socket carries
// more than a group's share (a leader sends n parts to each of its at most
// kGroupRanks ranks), where the root relay sent all n^2 through one.
std::vector<std::string> Bootstrap::direct_allgather(const std::string& mine) {
  const int n = nranks_;
  const int g = group_of_[size_t(rank_)];
  const std::vector<int>& group = groups_[size_t(g)];
  uint64_t bytes = mine.size();
  if (rank_ != group[0]) {
    std::string up;
    append_parts(&up, {mine});
    peers_->post(group[0], kGather, 0, 1, kUp, std::move(up));
    const PeerMesh::Frame f = peers_->next(group[0], op_.deadline);
    std::vector<std::string> all;
    all.reserve(size_t(n));
    take_parts(f, group[0], kDown, 0, n, &all, &bytes);
    peers_->flush(op_.deadline);
    return all;
  }
  const std::vector<int> members(group.begin() + 1, group.end());
  const int nl = int(groups_.size());
  std::vector<std::vector<std::string>> held(1);  // held[i]: the parts of group (g + i) % nl, in rank order
  held[0].push_back(mine);
  const std::vector<PeerMesh::Frame> ups = peers_->next_each(members, op_.deadline);
  for (size_t j = 0; j < ups.size(); ++j) take_parts(ups[j], members[j], kUp, 0, 1, &held[0], &bytes);
  for (int k = 0, d = 1; d < nl; ++k, d *= 2) {
    const int to = (g - d + nl) % nl, from = (g + d) % nl, count = std::min(d, nl - d);
    std::string out;
    int sent = 0, due = 0;
    for (int i = 0; i < count; ++i) {
      append_parts(&out, held[size_t(i)]);
      sent += int(held[size_t(i)].size());
      due += int(groups_[size_t((from + i) % nl)].size());
    }
    peers_->post(groups_[size_t(to)][0], kGather, k, sent, kAcross, std::move(out));
    const PeerMesh::Frame f = peers_->next(groups_[size_t(from)][0], op_.deadline);
    std::vector<std::string> parts;
    take_parts(f, groups_[size_t(from)][0], kAcross, k, due, &parts, &bytes);
    size_t at = 0;
    for (int i = 0; i < count; ++i) {
      const size_t size = groups_[size_t((from + i) % nl)].size();
      held.emplace_back(std::make_move_iterator(parts.begin() + long(at)),
                        std::make_move_iterator(parts.begin() + long(at + size)));
      at += size;
    }
  }
  std::vector<std::string> all(static_cast<size_t>(n));
  for (int i = 0; i < nl; ++i) {
    const std::vector<int>& ranks = groups_[size_t((g + i) % nl)];
    for (size_t j = 0; j < ranks.size(); ++j) all[size_t(ranks[j])] = std::move(held[size_t(i)][j]);
  }
  if (!members.empty()) {
    std::string down;
    append_parts(&down, all);
    const Digest digest = sha256(down.data(), down.size());
    auto shared = std::make_shared<const std::string>(std::move(down));
    for (int m : members) peers_->post(m, kGather, 0, n, kDown, shared, digest);
  }
  peers_->flush(op_.deadline);  // what this rank sent reaches its peers also if it leaves now
  return all;
}

// MK_BOOTSTRAP_RELAY=1: this rank's part to the root, every part back from it.
std::vector<std::string> Bootstrap::relay_allgather(const std::string& mine) {
  std::string why;
  const std::string me = "rank " + std::to_string(rank_) + ": ";
  if (cancel_) cancel_->at_boundary(false);  // an abort now only shuts the socket down
  const std::string blob = root_.seal(kBlob, 0, 0, 0, mine);
  if (!write_full(fd_, blob.data(), blob.size(), op_.deadline, &why))
    broken(mkSystemError, me + "bootstrap send failed: " + why);
  arm_abort();
  uint8_t head[kFrameHeadBytes];
  for (;;) {
    if (!read_full(fd_, head, sizeof head, op_.deadline, &why)) {
      if (cancel_ && cancel_->cancelled()) broken(mkInvalidUsage, me + "the communicator was aborted");
      broken(mkRemoteError, me + "waiting for the other ranks during setup: " + why);
    }
    FrameHeader h;
    if (!root_.open_head(head, &h)) root_altered();
    if (h.type == kGone) {  // the rest of it, then the verdict fails this call
      if (!take_verdict(h, op_.deadline)) broken(mkRemoteError, me + "a rank left the job (" + why + ")");
      check_verdict();
    }
    if (h.type != kRound || h.len > kMaxRoundBytes + uint64_t(nranks_) * 8)
      broken(mkRemoteError, me + "the rendezvous sent message type " + std::to_string(h.type) + " of " +
                                std::to_string(h.len) + " bytes where an all-gather round was due");
    std::string round(h.len, '\0');
    if (!read_full(fd_, round.data(), round.size(), op_.deadline, &why))
      broken(mkRemoteError, me + "waiting for the other ranks during setup: " + why);
    if (!Link::payload_ok(h, round)) root_altered();
    std::vector<std::string> all;
    all.reserve(size_t(nranks_));
    uint64_t bytes = 0;
    const std::string wrong = parse_parts(round, nranks_, &all, &bytes);
    if (!wrong.empty()) broken(mkRemoteError, me + "the rendezvous sent " + wrong);
    return all;
  }
}

void Bootstrap::send(int peer, const std::string& bytes) {
  if (peer < 0 || peer >= nranks_ || peer == rank_)
    fail(mkInvalidArgument, "bootstrap send: peer " + std::to_string(peer) + " is not another rank of " +
                                std::to_string(nranks_));
  if (bytes.size() > kMaxBlobBytes)
    fail(mkInvalidArgument, "bootstrap send: " + std::to_string(bytes.size()) + " bytes exceed the limit of " +
                                std::to_string(kMaxBlobBytes));
  begin(/*collective=*/false, peer);
  try {
    peers_->post(peer, kSend, 0, 0, 0, bytes);
    peers_->flush(op_.deadline);
  } catch (const PeerMesh::Error& e) {
    on_peer_error(e);
  }
}

std::string Bootstrap::recv(int peer) {
  if (peer < 0 || peer >= nranks_ || peer == rank_)
    fail(mkInvalidArgument, "bootstrap recv: peer " + std::to_string(peer) + " is not another rank of " +
                                std::to_string(nranks_));
  begin(/*collective=*/false, peer);
  try {
    PeerMesh::Frame f = peers_->next(peer, op_.deadline);
    if (f.h.type != kSend)
      throw PeerMesh::Error(PeerMesh::Error::kProtocol, peer,
                            "it sent an all-gather message where this rank expected its send (do both ranks make the "
                            "same bootstrap calls?)");
    return std::move(f.payload);
  } catch (const PeerMesh::Error& e) {
    on_peer_error(e);
  }
}

void Bootstrap::begin_recovery(int peer) {
  if (peer < 0 || peer >= nranks_ || peer == rank_)
    fail(mkInvalidArgument, "bootstrap recovery: peer " + std::to_string(peer) + " is not another rank of " +
                                std::to_string(nranks_));
  if (!peers_) fail(mkInternalError, "bootstrap recovery: no connections between ranks");
  if (cancel_ && cancel_->cancelled()) fail(mkInvalidUsage, "rank " + std::to_string(rank_) + ": the communicator was aborted");
  if (std::find(lost_.begin(), lost_.end(), peer) != lost_.end())
    fail(mkRemoteError, "rank " + std::to_string(rank_) + ": rank " + std::to_string(peer) +
                            "'s bootstrap connection failed earlier (" + gone_ + ")");
  op_ = {false, peer, Clock::now() + std::chrono::milliseconds(bootstrap_timeout_ms())};
}

namespace {
// recovering_ for the length of one recovery call, however it ends.
struct Recovering {
  bool& flag;
  explicit Recovering(bool& f) : flag(f) { flag = true; }
  ~Recovering() { flag = false; }
};
}  // namespace

void Bootstrap::send_recovery(int peer, const std::string& bytes) {
  if (bytes.size() > kMaxBlobBytes) fail(mkInvalidArgument, "bootstrap recovery: message too large");
  begin_recovery(peer);
  Recovering during(recovering_);
  try {
    peers_->post(peer, proto::kRecover, 0, 0, 0, bytes);
    peers_->flush(op_.deadline);
  } catch (const PeerMesh::Error& e) {
    on_peer_error(e);
  }
}

std::string Bootstrap::recv_recovery(int peer) {
  begin_recovery(peer);
  Recovering during(recovering_);
  try {
    for (;;) {  // what the peer sent for exchanges this rank left unread is skipped
      PeerMesh::Frame f = peers_->next(peer, op_.deadline);
      if (f.h.type == proto::kRecover) return std::move(f.payload);
    }
  } catch (const PeerMesh::Error& e) {
    on_peer_error(e);
  }
}

}  // namespace mk::rt
