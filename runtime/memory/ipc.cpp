#include "runtime/memory/ipc.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>

#include "runtime/bootstrap/crypto.hpp"
#include "runtime/api/status.hpp"

namespace mk::rt {
namespace {

constexpr int kMaxPendingClients = 64;

sockaddr_un abstract_addr(const std::string& name, socklen_t* len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  // Abstract namespace: a leading NUL, no file on disk, gone with the socket.
  size_t n = std::min(name.size(), sizeof(a.sun_path) - 2);
  std::memcpy(a.sun_path + 1, name.data(), n);
  *len = socklen_t(offsetof(sockaddr_un, sun_path) + 1 + n);
  return a;
}

bool peer_cred(int s, ucred* who) {
  socklen_t len = sizeof *who;
  return ::getsockopt(s, SOL_SOCKET, SO_PEERCRED, who, &len) == 0 && len == sizeof *who;
}

// One byte of payload and room for one descriptor.
struct FdMessage {
  char byte = 'F';
  iovec iov{&byte, 1};
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))] = {};
  msghdr m{};
  FdMessage() {
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctrl;
    m.msg_controllen = sizeof ctrl;
  }
  FdMessage(const FdMessage&) = delete;
};

bool send_fd(int s, int fd) {
  FdMessage msg;
  cmsghdr* cm = CMSG_FIRSTHDR(&msg.m);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cm), &fd, sizeof(int));
  return ::sendmsg(s, &msg.m, MSG_NOSIGNAL | MSG_DONTWAIT) == 1;
}

// The serving loop: all connections at once, each with a handshake deadline.
class Server {
 public:
  Server(int lfd, int stop_fd, int fd, int count, int timeout_ms, std::vector<pid_t> pids, const Secret& secret)
      : lfd_(lfd), stop_fd_(stop_fd), fd_(fd), count_(count), pids_(std::move(pids)), secret_(secret),
        handshake_ms_(handshake_timeout_ms(timeout_ms)),
        deadline_(Clock::now() + std::chrono::milliseconds(timeout_ms)) {
    if (!set_nonblocking(lfd_)) throw std::runtime_error(std::string("fcntl(O_NONBLOCK): ") + std::strerror(errno));
  }
  ~Server() {
    for (auto& c : clients_) ::close(c->c.fd);
  }
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int run() {
    while (served_ < count_ && Clock::now() < deadline_ && !stopped_) {
      poll_once();
      reap();
    }
    return served_;
  }

 private:
  struct Client {
    NbConn c;
    ServerHandshake hs;
    Clock::time_point deadline;
    bool dead = false;
    explicit Client(const Secret& s) : hs(s, Channel::kIpc) {}
  };

  void poll_once() {
    std::vector<pollfd> fds;
    fds.push_back({stop_fd_, POLLIN, 0});
    const bool listening = int(clients_.size()) < kMaxPendingClients;
    if (listening) fds.push_back({lfd_, POLLIN, 0});
    Clock::time_point wake = deadline_;
    for (auto& c : clients_) {
      fds.push_back({c->c.fd, short(POLLIN | (c->c.out.empty() ? 0 : POLLOUT)), 0});
      wake = std::min(wake, c->deadline);
    }
    int r = ::poll(fds.data(), nfds_t(fds.size()), std::max(1, ms_left(wake)));
    if (r > 0 && fds[0].revents) {
      stopped_ = true;
      return;
    }
    const size_t first = listening ? 2 : 1, polled = fds.size() - first;
    if (listening && r > 0 && (fds[1].revents & POLLIN)) accept_new();
    for (size_t k = 0; k < polled && r > 0; ++k) {
      const short rev = fds[first + k].revents;
      if (rev & POLLOUT) flush(*clients_[k]);
      if (rev & (POLLIN | POLLHUP | POLLERR)) on_readable(*clients_[k]);
    }
    const auto now = Clock::now();
    for (auto& c : clients_)
      if (now >= c->deadline) c->dead = true;
  }

  bool authorised(int s) const {
    ucred who{};
    if (!peer_cred(s, &who)) return false;
    return who.uid == ::geteuid() && std::find(pids_.begin(), pids_.end(), who.pid) != pids_.end();
  }

  void accept_new() {
    for (int k = 0; k < 16 && int(clients_.size()) < kMaxPendingClients; ++k) {
      int s = ::accept4(lfd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (s < 0) return;
      if (!authorised(s)) {  // another user, or a process that is not one of the job's ranks
        debug_log("ipc: refused a local connection from a process that is not a rank of this job");
        ::close(s);
        continue;
      }
      auto c = std::make_unique<Client>(secret_);
      c->c.fd = s;
      c->c.expect(c->hs.want());
      c->deadline = Clock::now() + std::chrono::milliseconds(handshake_ms_);
      clients_.push_back(std::move(c));
    }
  }

  void flush(Client& c) {
    std::string why;
    if (!c.c.flush(&why)) c.dead = true;
  }

  void on_readable(Client& c) {
    std::string why;
    if (c.dead) return;
    if (!c.c.read_some(&why)) {
      c.dead = true;
      return;
    }
    if (!c.c.complete()) return;
    std::string reply = c.hs.feed(reinterpret_cast<const uint8_t*>(c.c.in.data()));
    if (c.hs.failed()) {
      debug_log("ipc: refused a local connection that failed the secret challenge");
      c.dead = true;
      return;
    }
    if (!reply.empty()) c.c.send(std::move(reply));
    flush(c);
    if (c.hs.done()) {
      if (c.c.out.empty() && send_fd(c.c.fd, fd_)) ++served_;
      c.dead = true;
      return;
    }
    c.c.expect(c.hs.want());
  }

  void reap() {
    for (size_t k = 0; k < clients_.size();) {
      if (!clients_[k]->dead) {
        ++k;
        continue;
      }
      ::close(clients_[k]->c.fd);
      clients_[k] = std::move(clients_.back());
      clients_.pop_back();
    }
  }

  int lfd_, stop_fd_, fd_, count_;
  bool stopped_ = false;
  std::vector<pid_t> pids_;
  Secret secret_;
  int handshake_ms_;
  Clock::time_point deadline_;
  std::vector<std::unique_ptr<Client>> clients_;
  int served_ = 0;
};

}  // namespace

std::string ipc_socket_name(const Secret& secret, const uint8_t (&nonce)[16], int rank) {
  static const char* hex = "0123456789abcdef";
  std::string msg = "mkernel ipc socket name ";
  for (uint8_t b : nonce) {
    msg += hex[b >> 4];
    msg += hex[b & 15];
  }
  msg += "/" + std::to_string(rank);
  const Digest d = hmac_sha256(secret.data(), secret.size(), {msg});
  std::string name = "mkernel-";
  for (size_t i = 0; i < 16; ++i) {  // 128 bits: not guessable, short enough for sun_path
    name += hex[d[i] >> 4];
    name += hex[d[i] & 15];
  }
  return name;
}

FdServer::FdServer(const std::string& name, int fd, int count, int timeout_ms, std::vector<pid_t> pids,
                   const Secret& secret) {
  listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) fail(mkSystemError, std::string("socket(AF_UNIX): ") + std::strerror(errno));
  socklen_t len;
  sockaddr_un a = abstract_addr(name, &len);
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(listen_fd_, 256) != 0) {
    const int err = errno;
    ::close(listen_fd_);
    listen_fd_ = -1;
    if (err == EADDRINUSE)
      fail(mkSystemError,
           "the local IPC socket name '" + name +
               "' is taken: another process holds it (squatting on it), so the fd server cannot listen. The name "
               "derives from the unique id's secret, so that process has this job's id (another job or a leftover "
               "process started with the same id?); stop it and give every job a fresh id from mkGetUniqueId");
    fail(mkSystemError, "cannot open the local IPC socket '" + name + "': " + std::strerror(err));
  }
  if (::pipe2(stop_, O_CLOEXEC) != 0) {
    const int err = errno;
    ::close(listen_fd_);
    listen_fd_ = -1;
    fail(mkSystemError, std::string("pipe2: ") + std::strerror(err));
  }
  int lfd = listen_fd_, stop_fd = stop_[0];
  struct CloseOnThrow {  // the destructor does not run when the constructor throws
    FdServer* s;
    ~CloseOnThrow() {
      if (s) s->join();
    }
  } guard{this};
  thread_ = std::thread([this, lfd, stop_fd, fd, count, timeout_ms, pids = std::move(pids), secret] {
    try {
      served_ = Server(lfd, stop_fd, fd, count, timeout_ms, pids, secret).run();
    } catch (const std::exception& e) {
      debug_log(std::string("ipc: fd server stopped: ") + e.what());
    } catch (...) {
      debug_log("ipc: fd server stopped by an unknown exception");
    }
  });
  guard.s = nullptr;
}

void FdServer::join() {
  if (thread_.joinable()) thread_.join();
  for (int* f : {&listen_fd_, &stop_[0], &stop_[1]})
    if (*f >= 0) {
      ::close(*f);
      *f = -1;
    }
}

void FdServer::wait() { join(); }

FdServer::~FdServer() {
  if (thread_.joinable() && stop_[1] >= 0) (void)!::write(stop_[1], "s", 1);
  join();
}

namespace {

// Receives the descriptor after a successful handshake; -1 if none came.
int receive_fd(int s, Clock::time_point deadline, std::string* why) {
  pollfd p{s, POLLIN, 0};
  if (::poll(&p, 1, std::max(1, ms_left(deadline))) <= 0) {
    *why = "no descriptor received in time";
    return -1;
  }
  FdMessage msg;
  if (::recvmsg(s, &msg.m, MSG_CMSG_CLOEXEC) == 1) {
    cmsghdr* cm = CMSG_FIRSTHDR(&msg.m);
    if (cm && cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS && cm->cmsg_len == CMSG_LEN(sizeof(int))) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(cm), sizeof(int));
      return fd;
    }
  }
  *why = "the server closed the connection without a descriptor (are we one of its job's ranks?)";
  return -1;
}

// Checks who holds the name before sending anything to it.
void check_server(int s, const std::string& name, pid_t server_pid) {
  ucred who{};
  if (!peer_cred(s, &who)) fail(mkSystemError, "SO_PEERCRED on the local IPC socket: " + std::string(std::strerror(errno)));
  if (who.uid != ::geteuid() || who.pid != server_pid)
    fail(mkRemoteError, "the local IPC socket '" + name + "' is held by pid " + std::to_string(who.pid) + " (uid " +
                            std::to_string(who.uid) + "), not by the peer rank's process (pid " +
                            std::to_string(server_pid) + ", uid " + std::to_string(::geteuid()) +
                            "): another process squats on the name; stop it and retry");
}

}  // namespace

int fetch_fd(const std::string& name, int timeout_ms, pid_t server_pid, const Secret& secret) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  std::string why;
  for (;;) {
    int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) fail(mkSystemError, std::string("socket(AF_UNIX): ") + std::strerror(errno));
    socklen_t len;
    sockaddr_un a = abstract_addr(name, &len);
    if (::connect(s, reinterpret_cast<sockaddr*>(&a), len) == 0) {
      try {
        check_server(s, name, server_pid);
      } catch (...) {
        ::close(s);
        throw;
      }
      ClientAuth auth = client_handshake(s, secret, Channel::kIpc, deadline, &why);
      if (auth == ClientAuth::kServerUnproven) {
        ::close(s);
        fail(mkRemoteError, "the local IPC socket '" + name +
                                "' could not prove it knows the unique id's secret; refusing its descriptor");
      }
      int fd = auth == ClientAuth::kOk ? receive_fd(s, deadline, &why) : -1;
      ::close(s);
      if (fd >= 0) return fd;
    } else {
      why = std::strerror(errno);
      ::close(s);
    }
    if (Clock::now() >= deadline)
      fail(mkRemoteError, "could not get a peer's memory handle over local IPC (" + why +
                              "); are all ranks on this node alive?");
    ::usleep(20000);
  }
}

}  // namespace mk::rt
