// The socket backend of the network transport (runtime/transport/net/net.hpp):
// TCP streams between hosts, IPv4 or IPv6, no dependency beyond libc.
// Standalone: libnccl-net-mkernel.so compiles this file too.
//
// A connection is `nstreams` TCP streams (the listener's choice, carried in
// its handle). Message framing, on every stream in message order: stream 0
// carries a 16-byte header (size, tag, sequence number) and then its part of
// the data; stream j carries part j of split(size) (nothing for a small
// message). Both sides compute the same split from the size, so streams move
// in parallel and each stays in message order on its own.
//
// Who may connect: the handle holds a random 16-byte token, and every stream
// opens with a hello that repeats it (with its connection id, index and
// count). The handle reaches peers only through the authenticated bootstrap,
// so a stranger cannot know the token: its connection is closed after at most
// 32 bytes or kHelloMs, without taking a connection slot (at most
// kMaxPending unauthenticated streams are kept; the oldest goes first).
// The data that follows is not authenticated per message (the stream is
// trusted from its hello on, as NCCL's socket transport trusts its peers).
//
// Progress: everything is non-blocking; test() moves every stream of the
// request's connection as far as the kernel's socket buffers allow.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

#include "compiler/common/env_parse.hpp"
#include "runtime/api/status.hpp"
#include "runtime/transport/net/iface.hpp"
#include "runtime/transport/net/net.hpp"

namespace mk::rt::net {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kHandleMagic[4] = {'M', 'K', 'S', 'N'};
constexpr char kHelloMagic[4] = {'M', 'K', 'S', 'H'};
constexpr uint8_t kWireVersion = 1;
constexpr int kHelloMs = 5000;
constexpr size_t kMaxPending = 1024;
constexpr int kGroupMs = 30000;  // a connection's streams all arrive within this
constexpr size_t kMinPart = size_t(64) << 10;  // below 2 parts of this, one stream carries a message

struct WireHandle {
  char magic[4];
  uint8_t version;
  uint8_t nstreams;
  uint16_t port;    // network byte order
  uint16_t family;  // AF_INET / AF_INET6
  uint16_t pad;
  uint32_t scope;
  uint8_t addr[16];
  uint8_t token[16];
};
static_assert(sizeof(WireHandle) == 48 && sizeof(WireHandle) <= kHandleBytes, "the handle must fit NCCL's 128 bytes");

struct Hello {
  char magic[4];
  uint8_t version;
  uint8_t index;
  uint8_t nstreams;
  uint8_t pad;
  uint8_t token[16];
  uint64_t conn_id;
};
static_assert(sizeof(Hello) == 32, "hello is 32 bytes on the wire");

struct Header {
  uint64_t size;
  int32_t tag;
  uint32_t seq;  // low 32 bits of the message's sequence number
};
static_assert(sizeof(Header) == 16, "message header is 16 bytes on the wire");

std::string errno_text(int e) { return std::strerror(e); }

void random_fill(void* out, size_t n) {
  auto* p = static_cast<uint8_t*>(out);
  while (n) {
    const ssize_t r = ::getrandom(p, n, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      fail(mkSystemError, "socket transport: getrandom(): " + errno_text(errno));
    }
    p += r;
    n -= size_t(r);
  }
}

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : int(std::min<int64_t>(left, 1 << 30));
}

// Part `j` of a message of `size` bytes over `n` streams: [lo, hi).
void split(size_t size, int n, int j, size_t* lo, size_t* hi) {
  size_t parts = std::min<size_t>(size_t(n), size / kMinPart);
  if (parts < 2) parts = 1;
  if (size_t(j) >= parts) {
    *lo = *hi = size;
    return;
  }
  const size_t per = ((size + parts - 1) / parts + 4095) & ~size_t(4095);
  *lo = std::min(size, per * size_t(j));
  *hi = std::min(size, per * size_t(j + 1));
}

struct Stream {
  int fd = -1;
  uint64_t pos = 0;    // sequence number of the message this stream is on
  size_t off = 0;      // bytes of that message's part done (header included on stream 0)
};

struct Conn;

struct Req {
  Conn* conn = nullptr;
  bool in_use = false;
  uint64_t seq = 0;
  char* data = nullptr;
  size_t cap = 0;        // send: the size; recv: the posted size
  size_t size = 0;       // bytes of the message (recv: known once its header arrived)
  bool size_known = false;
  int tag = 0;
  int streams_done = 0;
  Header hdr{};          // send: the header to write; recv: the header being read
};

struct Conn {
  bool sending = false;
  std::string peer;  // address, for errors
  std::vector<Stream> streams;
  Req reqs[kMaxRequests];
  uint64_t next_seq = 0;
  std::string error;  // sticky
  uint64_t seq_base = 0;  // first sequence number (tests start near 2^32 to cross the wrap)

  ~Conn() {
    for (Stream& s : streams)
      if (s.fd >= 0) ::close(s.fd);
  }
  Req* at(uint64_t seq) {
    Req& r = reqs[seq % kMaxRequests];
    return r.in_use && r.seq == seq ? &r : nullptr;
  }
  [[noreturn]] void broken(const std::string& what) {
    if (error.empty()) error = "socket transport: connection " + std::string(sending ? "to " : "from ") + peer + ": " + what;
    fail(mkRemoteError, error);
  }
  void check() {
    if (!error.empty()) fail(mkRemoteError, error);
  }
};

// Moves stream `j` of a sending connection; false when it must wait.
bool send_step(Conn& c, int j) {
  Stream& s = c.streams[j];
  Req* r = c.at(s.pos);
  if (!r) return false;
  size_t lo, hi;
  split(r->size, int(c.streams.size()), j, &lo, &hi);
  const size_t head = j == 0 ? sizeof(Header) : 0;
  const size_t total = head + (hi - lo);
  while (s.off < total) {
    const char* p = s.off < head ? reinterpret_cast<const char*>(&r->hdr) + s.off : r->data + lo + (s.off - head);
    const size_t n = s.off < head ? head - s.off : total - s.off;
    const ssize_t w = ::send(s.fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
      if (errno == EINTR) continue;
      c.broken("send on stream " + std::to_string(j) + ": " + errno_text(errno) + " (the peer closed or reset it)");
    }
    s.off += size_t(w);
  }
  s.off = 0;
  ++s.pos;
  ++r->streams_done;
  return true;
}

bool recv_step(Conn& c, int j) {
  Stream& s = c.streams[j];
  Req* r = c.at(s.pos);
  if (!r) return false;
  const size_t head = j == 0 ? sizeof(Header) : 0;
  for (;;) {
    if (s.off < head) {
      const ssize_t g = ::recv(s.fd, reinterpret_cast<char*>(&r->hdr) + s.off, head - s.off, MSG_DONTWAIT);
      if (g == 0) c.broken("closed by the peer (stream 0, message " + std::to_string(s.pos - c.seq_base) + ")");
      if (g < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
        if (errno == EINTR) continue;
        c.broken("receive on stream 0: " + errno_text(errno));
      }
      s.off += size_t(g);
      if (s.off < head) continue;
      if (r->hdr.seq != uint32_t(s.pos))
        c.broken("protocol violation: message " + std::to_string(r->hdr.seq) + " where " +
                 std::to_string(uint32_t(s.pos)) + " was due");
      if (r->hdr.size > r->cap)
        c.broken("a message of " + std::to_string(r->hdr.size) + " bytes arrived for a receive of " +
                 std::to_string(r->cap) + " bytes");
      if (r->hdr.tag != r->tag)
        c.broken("a message with tag " + std::to_string(r->hdr.tag) + " arrived for a receive with tag " +
                 std::to_string(r->tag));
      r->size = r->hdr.size;
      r->size_known = true;
    }
    if (!r->size_known) return false;  // stream j > 0 waits for stream 0's header
    size_t lo, hi;
    split(r->size, int(c.streams.size()), j, &lo, &hi);
    const size_t total = head + (hi - lo);
    if (s.off >= total) break;
    const ssize_t g = ::recv(s.fd, r->data + lo + (s.off - head), total - s.off, MSG_DONTWAIT);
    if (g == 0)
      c.broken("closed by the peer (stream " + std::to_string(j) + ", message " + std::to_string(s.pos - c.seq_base) +
               ")");
    if (g < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
      if (errno == EINTR) continue;
      c.broken("receive on stream " + std::to_string(j) + ": " + errno_text(errno));
    }
    s.off += size_t(g);
  }
  s.off = 0;
  ++s.pos;
  ++r->streams_done;
  return true;
}

void progress(Conn& c) {
  c.check();
  for (int j = 0; j < int(c.streams.size()); ++j) {
    if (c.sending) {
      while (send_step(c, j)) {
      }
    } else {
      // A closed stream is an error only where a receive still needs its
      // bytes: a peer may close cleanly after its last message.
      while (recv_step(c, j)) {
      }
    }
  }
}

struct Pending {
  int fd = -1;
  Clock::time_point deadline;
  size_t got = 0;
  Hello hello{};
};

struct Listen {
  int fd = -1;
  WireHandle handle{};
  std::deque<Pending> pending;                       // unauthenticated
  std::map<uint64_t, std::vector<int>> groups;       // connection id -> stream fds by index
  std::map<uint64_t, std::string> group_peer;
  std::map<uint64_t, Clock::time_point> group_deadline;  // incomplete groups are dropped after it
  ~Listen() {
    if (fd >= 0) ::close(fd);
    for (Pending& p : pending) ::close(p.fd);
    for (auto& [id, fds] : groups)
      for (int f : fds)
        if (f >= 0) ::close(f);
  }
};

void tune(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

class SocketNet final : public Net {
 public:
  explicit SocketNet(const SocketOptions& o) : opts_(o) {
    if (o.nstreams < 1 || o.nstreams > kMaxStreams)
      fail(mkInvalidArgument, "MK_SOCKET_NSTREAMS=" + std::to_string(o.nstreams) + ": expected 1.." +
                                  std::to_string(kMaxStreams));
    const IfnameSpec spec(o.ifname, "MK_SOCKET_IFNAME");
    iface_ = choose_iface(list_ifaces(), spec, o.family);
  }
  std::string name() const override { return "socket"; }
  int devices() override { return 1; }
  Props properties(int dev) override {
    check_dev(dev);
    Props p;
    p.name = iface_.name;
    char path[512];
    const std::string link = "/sys/class/net/" + iface_.name + "/device";
    if (::realpath(link.c_str(), path)) p.pci_path = path;
    p.ptr_support = kPtrHost;
    p.speed_mbps = 10000;
    p.latency_us = 0;
    p.max_comms = 65536;
    p.max_recvs = 1;
    p.max_p2p_bytes = size_t(1) << 31;
    return p;
  }

  ListenComm* listen(int dev, Handle* handle) override {
    check_dev(dev);
    auto l = std::make_unique<Listen>();
    l->fd = ::socket(iface_.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (l->fd < 0) fail(mkSystemError, "socket transport: socket(): " + errno_text(errno));
    int one = 1;
    ::setsockopt(l->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_storage sa = iface_.addr;
    socklen_t len = iface_.family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (::bind(l->fd, reinterpret_cast<sockaddr*>(&sa), len) != 0 || ::listen(l->fd, 256) != 0 ||
        ::getsockname(l->fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0)
      fail(mkSystemError, "socket transport: cannot listen on " + iface_.name + " (" +
                              addr_text(reinterpret_cast<sockaddr*>(&sa)) + "): " + errno_text(errno));
    WireHandle& h = l->handle;
    std::memcpy(h.magic, kHandleMagic, 4);
    h.version = kWireVersion;
    h.nstreams = uint8_t(opts_.nstreams);
    h.family = uint16_t(iface_.family);
    if (iface_.family == AF_INET) {
      const auto* a = reinterpret_cast<const sockaddr_in*>(&sa);
      h.port = a->sin_port;
      std::memcpy(h.addr, &a->sin_addr, 4);
    } else {
      const auto* a = reinterpret_cast<const sockaddr_in6*>(&sa);
      h.port = a->sin6_port;
      h.scope = a->sin6_scope_id;
      std::memcpy(h.addr, &a->sin6_addr, 16);
    }
    random_fill(h.token, sizeof h.token);
    std::memset(handle->bytes, 0, kHandleBytes);
    std::memcpy(handle->bytes, &h, sizeof h);
    return l.release();
  }

  SendComm* connect(int dev, const Handle& handle) override {
    check_dev(dev);
    WireHandle h;
    std::memcpy(&h, handle.bytes, sizeof h);
    if (std::memcmp(h.magic, kHandleMagic, 4) != 0 || h.version != kWireVersion || h.nstreams < 1 ||
        h.nstreams > kMaxStreams || (h.family != AF_INET && h.family != AF_INET6))
      fail(mkInvalidArgument, "socket transport: the connection handle is not one of mKernel's socket transport "
                              "(of this version)");
    sockaddr_storage sa{};
    socklen_t len;
    if (h.family == AF_INET) {
      auto* a = reinterpret_cast<sockaddr_in*>(&sa);
      a->sin_family = AF_INET;
      a->sin_port = h.port;
      std::memcpy(&a->sin_addr, h.addr, 4);
      len = sizeof *a;
    } else {
      auto* a = reinterpret_cast<sockaddr_in6*>(&sa);
      a->sin6_family = AF_INET6;
      a->sin6_port = h.port;
      a->sin6_scope_id = h.scope;
      std::memcpy(&a->sin6_addr, h.addr, 16);
      len = sizeof *a;
    }
    auto c = std::make_unique<Conn>();
    c->sending = true;
    c->peer = addr_text(reinterpret_cast<sockaddr*>(&sa));
    c->seq_base = c->next_seq = seq_base_;
    uint64_t conn_id;
    random_fill(&conn_id, sizeof conn_id);
    const auto deadline = Clock::now() + std::chrono::milliseconds(opts_.timeout_ms);
    for (int j = 0; j < h.nstreams; ++j) {
      Stream s;
      s.pos = seq_base_;
      s.fd = ::socket(h.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (s.fd < 0) fail(mkSystemError, "socket transport: socket(): " + errno_text(errno));
      c->streams.push_back(s);
      tune(s.fd);
      connect_bounded(s.fd, sa, len, deadline, c->peer);
      Hello hello{};
      std::memcpy(hello.magic, kHelloMagic, 4);
      hello.version = kWireVersion;
      hello.index = uint8_t(j);
      hello.nstreams = h.nstreams;
      std::memcpy(hello.token, h.token, 16);
      hello.conn_id = conn_id;
      write_bounded(s.fd, &hello, sizeof hello, deadline, c->peer);
    }
    return c.release();
  }

  RecvComm* accept(ListenComm* lc) override {
    auto* l = static_cast<Listen*>(lc);
    const auto now = Clock::now();
    for (;;) {  // take every connection the kernel has queued
      sockaddr_storage sa{};
      socklen_t len = sizeof sa;
      const int fd = ::accept4(l->fd, reinterpret_cast<sockaddr*>(&sa), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        fail(mkSystemError, "socket transport: accept(): " + errno_text(errno));
      }
      tune(fd);
      if (l->pending.size() >= kMaxPending) {  // a flood: the oldest unauthenticated stream goes
        ::close(l->pending.front().fd);
        l->pending.pop_front();
      }
      Pending p;
      p.fd = fd;
      p.deadline = now + std::chrono::milliseconds(kHelloMs);
      l->pending.push_back(p);
    }
    for (size_t i = 0; i < l->pending.size();) {
      Pending& p = l->pending[i];
      bool drop = false, done = false;
      while (!drop && p.got < sizeof(Hello)) {
        const ssize_t g =
            ::recv(p.fd, reinterpret_cast<char*>(&p.hello) + p.got, sizeof(Hello) - p.got, MSG_DONTWAIT);
        if (g > 0) {
          p.got += size_t(g);
        } else if (g < 0 && errno == EINTR) {
          continue;
        } else {
          drop = g == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
          break;
        }
      }
      if (!drop && p.got == sizeof(Hello)) {
        const Hello& h = p.hello;
        drop = std::memcmp(h.magic, kHelloMagic, 4) != 0 || h.version != kWireVersion ||
               std::memcmp(h.token, l->handle.token, 16) != 0 || h.nstreams != l->handle.nstreams ||
               h.index >= h.nstreams;
        if (!drop) {
          auto& g = l->groups[h.conn_id];
          if (g.empty()) {
            g.assign(h.nstreams, -1);
            l->group_deadline[h.conn_id] = now + std::chrono::milliseconds(kGroupMs);
          }
          if (g[h.index] >= 0) {
            drop = true;  // a second stream with the same index
          } else {
            g[h.index] = p.fd;
            if (h.index == 0) {
              sockaddr_storage sa{};
              socklen_t len = sizeof sa;
              ::getpeername(p.fd, reinterpret_cast<sockaddr*>(&sa), &len);
              l->group_peer[h.conn_id] = addr_text(reinterpret_cast<sockaddr*>(&sa));
            }
            done = true;
          }
        }
      }
      if (!drop && !done && now > p.deadline) drop = true;
      if (drop) ::close(p.fd);
      if (drop || done) {
        l->pending.erase(l->pending.begin() + ptrdiff_t(i));
      } else {
        ++i;
      }
    }
    for (auto it = l->groups.begin(); it != l->groups.end();) {  // a connector that died between its streams
      if (std::count(it->second.begin(), it->second.end(), -1) && now > l->group_deadline[it->first]) {
        for (int f : it->second)
          if (f >= 0) ::close(f);
        l->group_peer.erase(it->first);
        l->group_deadline.erase(it->first);
        it = l->groups.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = l->groups.begin(); it != l->groups.end(); ++it) {
      if (std::count(it->second.begin(), it->second.end(), -1)) continue;
      auto c = std::make_unique<Conn>();
      c->sending = false;
      c->peer = l->group_peer[it->first];
      c->seq_base = c->next_seq = seq_base_;
      for (int fd : it->second) {
        Stream s;
        s.fd = fd;
        s.pos = seq_base_;
        c->streams.push_back(s);
      }
      l->group_peer.erase(it->first);
      l->group_deadline.erase(it->first);
      l->groups.erase(it);
      return c.release();
    }
    return nullptr;
  }

  MemHandle* reg_mr(void* comm, void* data, size_t bytes, int type) override {
    if (type != kPtrHost)
      fail(mkInvalidUsage, "socket transport: only host memory can be registered (stage GPU data in pinned host memory)");
    return comm;
  }
  MemHandle* reg_mr_dmabuf(void*, void*, size_t, int, uint64_t, int) override {
    fail(mkInvalidUsage, "socket transport: dma-buf registration is not supported (host memory only)");
  }
  void dereg_mr(void*, MemHandle*) override {}

  Request* isend(SendComm* comm, void* data, size_t bytes, int tag, MemHandle*) override {
    auto* c = static_cast<Conn*>(comm);
    Req* r = claim(*c, data, bytes, tag);
    if (!r) return nullptr;
    r->size = bytes;
    r->size_known = true;
    r->hdr = Header{uint64_t(bytes), tag, uint32_t(r->seq)};
    progress_posted(*c);
    return r;
  }
  Request* irecv(RecvComm* comm, void* data, size_t bytes, int tag, MemHandle*) override {
    auto* c = static_cast<Conn*>(comm);
    Req* r = claim(*c, data, bytes, tag);
    if (!r) return nullptr;
    progress_posted(*c);
    return r;
  }
  // Moves a connection after a request was posted: a failure met there (a
  // peer that closed after its last message) is the connection's sticky
  // error, reported by the tests of the requests it stops, not by the post.
  static void progress_posted(Conn& c) {
    try {
      progress(c);
    } catch (const RtError&) {
    }
  }
  Request* iflush(RecvComm*, void*, size_t, MemHandle*) override { return nullptr; }

  bool test(Request* req, size_t* bytes) override {
    auto* r = static_cast<Req*>(req);
    Conn& c = *r->conn;
    if (r->streams_done < int(c.streams.size())) {
      try {
        progress(c);
      } catch (const RtError&) {
        // Moving the connection may read past this request into a close (a
        // peer that ended cleanly after its last message): a request that
        // completed still completes; the failure stays for the next ones.
        if (r->streams_done < int(c.streams.size())) throw;
      }
    }
    if (r->streams_done < int(c.streams.size())) return false;
    if (bytes) *bytes = r->size;
    r->in_use = false;
    return true;
  }

  void close_send(SendComm* comm) override { delete static_cast<Conn*>(comm); }
  void close_recv(RecvComm* comm) override { delete static_cast<Conn*>(comm); }
  void close_listen(ListenComm* comm) override { delete static_cast<Listen*>(comm); }

  // Tests: connections made from now on number their messages from `base`
  // (near 2^32 to cross the header's 32-bit wrap).
  void set_seq_base(uint64_t base) { seq_base_ = base; }

 private:
  SocketOptions opts_;
  Iface iface_;
  uint64_t seq_base_ = 0;

  // The next message's request slot, or null while its previous user is untested.
  static Req* claim(Conn& c, void* data, size_t bytes, int tag) {
    c.check();
    Req& r = c.reqs[c.next_seq % kMaxRequests];
    if (r.in_use) return nullptr;
    r = Req{};
    r.conn = &c;
    r.in_use = true;
    r.seq = c.next_seq++;
    r.data = static_cast<char*>(data);
    r.cap = bytes;
    r.tag = tag;
    return &r;
  }
  static void check_dev(int dev) {
    if (dev != 0) fail(mkInvalidArgument, "socket transport: device " + std::to_string(dev) + " does not exist (it has 1)");
  }
  static void connect_bounded(int fd, const sockaddr_storage& sa, socklen_t len, Clock::time_point deadline,
                              const std::string& peer) {
    int err = 0;
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&sa), len) != 0) {
      if (errno != EINPROGRESS && errno != EINTR) {
        err = errno;
      } else {
        for (;;) {
          pollfd p{fd, POLLOUT, 0};
          const int r = ::poll(&p, 1, ms_left(deadline));
          if (r == 0) fail(mkRemoteError, "socket transport: connecting to " + peer + " timed out");
          if (r > 0) break;
          if (errno != EINTR) fail(mkSystemError, "socket transport: poll(): " + errno_text(errno));
        }
        socklen_t l = sizeof err;
        if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l) != 0) err = errno;
      }
    }
    if (err) fail(mkRemoteError, "socket transport: cannot connect to " + peer + ": " + errno_text(err));
  }
  static void write_bounded(int fd, const void* data, size_t n, Clock::time_point deadline, const std::string& peer) {
    const char* p = static_cast<const char*>(data);
    while (n) {
      const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) {
        p += w;
        n -= size_t(w);
        continue;
      }
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        pollfd pf{fd, POLLOUT, 0};
        if (::poll(&pf, 1, ms_left(deadline)) == 0)
          fail(mkRemoteError, "socket transport: " + peer + " accepts no data (handshake timed out)");
        continue;
      }
      fail(mkRemoteError, "socket transport: handshake with " + peer + ": " + errno_text(errno));
    }
  }
};

int env_int(const char* name, int64_t lo, int64_t hi, int64_t dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return int(dflt);
  int64_t x = 0;
  if (!env_parse::parse_int(v, lo, hi, &x))
    fail(mkInvalidArgument, std::string(name) + "='" + v + "': expected an integer in " + std::to_string(lo) + ".." +
                                std::to_string(hi));
  return int(x);
}

}  // namespace

std::unique_ptr<Net> make_socket_net(const SocketOptions& opts) { return std::make_unique<SocketNet>(opts); }

SocketOptions socket_options_from_env() {
  SocketOptions o;
  if (const char* v = std::getenv("MK_SOCKET_IFNAME")) o.ifname = v;
  if (const char* v = std::getenv("MK_SOCKET_FAMILY")) o.family = parse_family(v, "MK_SOCKET_FAMILY");
  o.nstreams = env_int("MK_SOCKET_NSTREAMS", 1, kMaxStreams, o.nstreams);
  return o;
}

void socket_set_seq_base(Net* net, uint64_t base) {
  if (auto* s = dynamic_cast<SocketNet*>(net)) s->set_seq_base(base);
}

}  // namespace mk::rt::net
