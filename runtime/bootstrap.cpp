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
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "runtime/env.hpp"
#include "runtime/status.hpp"

namespace mk::rt {
namespace {

constexpr char kMagic[4] = {'M', 'K', 'I', 'D'};
constexpr uint32_t kHello = 0x4d4b4845;  // "MKHE"

std::string errno_text() { return std::strerror(errno); }

int deadline_ms_left(std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return left.count() > 0 ? int(left.count()) : 0;
}

// Full read/write with a deadline. Returns false on timeout or a closed peer.
bool read_all(int fd, void* buf, size_t n, std::chrono::steady_clock::time_point deadline, std::string* why) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    pollfd pfd{fd, POLLIN, 0};
    int r = ::poll(&pfd, 1, deadline_ms_left(deadline));
    if (r == 0) {
      *why = "timed out";
      return false;
    }
    if (r < 0) {
      if (errno == EINTR) continue;
      *why = errno_text();
      return false;
    }
    ssize_t got = ::recv(fd, p, n, 0);
    if (got == 0) {
      *why = "connection closed (a peer process exited?)";
      return false;
    }
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      *why = errno_text();
      return false;
    }
    p += got;
    n -= size_t(got);
  }
  return true;
}

bool write_all(int fd, const void* buf, size_t n, std::string* why) {
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t put = ::send(fd, p, n, MSG_NOSIGNAL);
    if (put < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      *why = errno_text();
      return false;
    }
    p += put;
    n -= size_t(put);
  }
  return true;
}

struct Hello {
  uint32_t magic;
  int32_t nranks;
  int32_t rank;
  uint8_t nonce[16];
};

// The rendezvous server: waits for every rank, then serves all-gather rounds
// until every rank has disconnected.
void serve(int listen_fd, IdContents id) {
  const auto timeout = std::chrono::milliseconds(bootstrap_timeout_ms());
  auto deadline = std::chrono::steady_clock::now() + std::max(timeout, std::chrono::milliseconds(600000));
  std::vector<int> fds;
  int nranks = -1;
  std::string why;
  auto close_all = [&] {
    for (int f : fds)
      if (f >= 0) ::close(f);
    ::close(listen_fd);
  };
  while (nranks < 0 || int(std::count_if(fds.begin(), fds.end(), [](int f) { return f >= 0; })) < nranks) {
    pollfd pfd{listen_fd, POLLIN, 0};
    int r = ::poll(&pfd, 1, deadline_ms_left(deadline));
    if (r <= 0) {
      if (r < 0 && errno == EINTR) continue;
      close_all();  // nobody came (or not everybody): ranks see their own timeouts
      return;
    }
    int c = ::accept(listen_fd, nullptr, nullptr);
    if (c < 0) continue;
    int one = 1;
    ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    Hello h{};
    if (!read_all(c, &h, sizeof h, std::chrono::steady_clock::now() + timeout, &why) || h.magic != kHello ||
        std::memcmp(h.nonce, id.nonce, 16) != 0 || h.nranks < 1 || h.rank < 0 || h.rank >= h.nranks ||
        (nranks >= 0 && h.nranks != nranks)) {
      int32_t status = -1;
      write_all(c, &status, sizeof status, &why);
      ::close(c);
      continue;
    }
    if (nranks < 0) {
      nranks = h.nranks;
      fds.assign(size_t(nranks), -1);
    }
    if (fds[size_t(h.rank)] >= 0) {  // the same rank twice
      int32_t status = -2;
      write_all(c, &status, sizeof status, &why);
      ::close(c);
      continue;
    }
    fds[size_t(h.rank)] = c;
  }
  ::close(listen_fd);
  for (int f : fds) {
    int32_t status = 0;
    write_all(f, &status, sizeof status, &why);
  }
  // All-gather rounds: length-prefixed blobs in, all blobs out.
  for (;;) {
    std::vector<std::string> blobs(static_cast<size_t>(nranks));
    bool closed = false;
    for (int r = 0; r < nranks && !closed; ++r) {
      uint64_t len = 0;
      auto d = std::chrono::steady_clock::now() + std::chrono::hours(24 * 365);
      if (!read_all(fds[size_t(r)], &len, sizeof len, d, &why) || len > (1u << 30)) {
        closed = true;
        break;
      }
      blobs[size_t(r)].resize(len);
      if (len && !read_all(fds[size_t(r)], blobs[size_t(r)].data(), len, d, &why)) closed = true;
    }
    if (closed) break;
    std::string out;
    for (auto& b : blobs) {
      uint64_t len = b.size();
      out.append(reinterpret_cast<const char*>(&len), sizeof len);
      out += b;
    }
    for (int f : fds) write_all(f, out.data(), out.size(), &why);
  }
  for (int f : fds) ::close(f);
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
  IdContents c;
  c.ipv4 = sa.sin_addr.s_addr;
  c.port = sa.sin_port;
  std::random_device rd;
  for (auto& b : c.nonce) b = uint8_t(rd());
  std::memset(id->internal, 0, sizeof id->internal);
  std::memcpy(id->internal, kMagic, 4);
  std::memcpy(id->internal + 4, &c.ipv4, 4);
  std::memcpy(id->internal + 8, &c.port, 2);
  std::memcpy(id->internal + 16, c.nonce, 16);
  std::thread(serve, fd, c).detach();
}

IdContents bootstrap_decode(const mkUniqueId& id) {
  if (std::memcmp(id.internal, kMagic, 4) != 0)
    fail(mkInvalidArgument, "the unique id was not made by mkGetUniqueId (or was corrupted in transit)");
  IdContents c;
  std::memcpy(&c.ipv4, id.internal + 4, 4);
  std::memcpy(&c.port, id.internal + 8, 2);
  std::memcpy(c.nonce, id.internal + 16, 16);
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

Bootstrap::Bootstrap(const mkUniqueId& id, int nranks, int rank) : id_(bootstrap_decode(id)), nranks_(nranks), rank_(rank) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = id_.ipv4;
  sa.sin_port = id_.port;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(bootstrap_timeout_ms());
  std::string why;
  // The root may not listen yet (another process): retry until the deadline.
  for (;;) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) fail(mkSystemError, "bootstrap: socket(): " + errno_text());
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) break;
    why = errno_text();
    ::close(fd_);
    fd_ = -1;
    if (deadline_ms_left(deadline) == 0)
      fail(mkSystemError, "rank " + std::to_string(rank) + ": cannot reach the rendezvous at " +
                              inet_ntoa(sa.sin_addr) + ":" + std::to_string(ntohs(sa.sin_port)) + ": " + why +
                              " (is the process that called mkGetUniqueId still alive?)");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  Hello h{kHello, nranks, rank, {}};
  std::memcpy(h.nonce, id_.nonce, 16);
  int32_t status = 0;
  if (!write_all(fd_, &h, sizeof h, &why) || !read_all(fd_, &status, sizeof status, deadline, &why)) {
    ::close(fd_);
    fail(mkSystemError, "rank " + std::to_string(rank) + ": bootstrap rendezvous failed: " + why +
                            " (did every rank of " + std::to_string(nranks) + " call mkCommInitRank with this id?)");
  }
  if (status != 0) {
    ::close(fd_);
    fail(mkInvalidUsage, status == -2 ? "rank " + std::to_string(rank) + " joined twice with the same unique id"
                                      : "the rendezvous rejected rank " + std::to_string(rank) +
                                            " (nranks differs between ranks, or the id is stale)");
  }
}

Bootstrap::~Bootstrap() {
  if (fd_ >= 0) ::close(fd_);
}

std::vector<std::string> Bootstrap::allgather(const std::string& mine) {
  std::string why;
  uint64_t len = mine.size();
  if (!write_all(fd_, &len, sizeof len, &why) || !write_all(fd_, mine.data(), mine.size(), &why))
    fail(mkSystemError, "rank " + std::to_string(rank_) + ": bootstrap send failed: " + why);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(bootstrap_timeout_ms());
  std::vector<std::string> all(static_cast<size_t>(nranks_));
  for (int r = 0; r < nranks_; ++r) {
    uint64_t n = 0;
    if (!read_all(fd_, &n, sizeof n, deadline, &why) || n > (1u << 30))
      fail(mkRemoteError, "rank " + std::to_string(rank_) + ": waiting for the other ranks during setup: " + why);
    all[size_t(r)].resize(n);
    if (n && !read_all(fd_, all[size_t(r)].data(), n, deadline, &why))
      fail(mkRemoteError, "rank " + std::to_string(rank_) + ": waiting for the other ranks during setup: " + why);
  }
  return all;
}

}  // namespace mk::rt
