#include "runtime/ipc.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "runtime/status.hpp"

namespace mk::rt {
namespace {

sockaddr_un abstract_addr(const std::string& name, socklen_t* len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  // Abstract namespace: a leading NUL, no file on disk, gone with the socket.
  size_t n = std::min(name.size(), sizeof(a.sun_path) - 2);
  std::memcpy(a.sun_path + 1, name.data(), n);
  *len = socklen_t(offsetof(sockaddr_un, sun_path) + 1 + n);
  return a;
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

}  // namespace

FdServer::FdServer(const std::string& name, int fd, int count, int timeout_ms) {
  listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) fail(mkSystemError, std::string("socket(AF_UNIX): ") + std::strerror(errno));
  socklen_t len;
  sockaddr_un a = abstract_addr(name, &len);
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(listen_fd_, 256) != 0) {
    std::string e = std::strerror(errno);
    ::close(listen_fd_);
    listen_fd_ = -1;
    fail(mkSystemError, "cannot open the local IPC socket: " + e);
  }
  int lfd = listen_fd_;
  thread_ = std::thread([lfd, fd, count, timeout_ms] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (int served = 0; served < count;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return;
      pollfd p{lfd, POLLIN, 0};
      if (::poll(&p, 1, int(left.count())) <= 0) continue;
      int c = ::accept(lfd, nullptr, nullptr);
      if (c < 0) continue;
      FdMessage msg;
      cmsghdr* cm = CMSG_FIRSTHDR(&msg.m);
      cm->cmsg_level = SOL_SOCKET;
      cm->cmsg_type = SCM_RIGHTS;
      cm->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(cm), &fd, sizeof(int));
      if (::sendmsg(c, &msg.m, MSG_NOSIGNAL) == 1) ++served;
      ::close(c);
    }
  });
}

void FdServer::wait() {
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) {
    ::close(listen_fd_);
    listen_fd_ = -1;
  }
}

FdServer::~FdServer() { wait(); }

int fetch_fd(const std::string& name, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  std::string why;
  for (;;) {
    int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) fail(mkSystemError, std::string("socket(AF_UNIX): ") + std::strerror(errno));
    socklen_t len;
    sockaddr_un a = abstract_addr(name, &len);
    if (::connect(s, reinterpret_cast<sockaddr*>(&a), len) == 0) {
      pollfd p{s, POLLIN, 0};
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (::poll(&p, 1, std::max<int>(1, int(left.count()))) > 0) {
        FdMessage msg;
        if (::recvmsg(s, &msg.m, 0) == 1) {
          cmsghdr* cm = CMSG_FIRSTHDR(&msg.m);
          if (cm && cm->cmsg_type == SCM_RIGHTS) {
            int fd = -1;
            std::memcpy(&fd, CMSG_DATA(cm), sizeof(int));
            ::close(s);
            return fd;
          }
        }
      }
      why = "no descriptor received";
    } else {
      why = std::strerror(errno);
    }
    ::close(s);
    if (std::chrono::steady_clock::now() >= deadline)
      fail(mkRemoteError, "could not get a peer's memory handle over local IPC (" + why +
                              "); are all ranks on this node alive?");
    ::usleep(20000);
  }
}

}  // namespace mk::rt
