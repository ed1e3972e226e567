#include "runtime/bootstrap/auth.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "runtime/bootstrap/crypto.hpp"

namespace mk::rt {
namespace {

std::string_view magic(Channel ch) { return ch == Channel::kBootstrap ? "MKB1" : "MKI1"; }

Digest proof(const Secret& s, const uint8_t* challenge, Channel ch, bool server) {
  std::string_view role = ch == Channel::kBootstrap ? (server ? "mkernel bootstrap server" : "mkernel bootstrap client")
                                                    : (server ? "mkernel ipc server" : "mkernel ipc client");
  return hmac_sha256(s.data(), s.size(),
                     {std::string_view(reinterpret_cast<const char*>(challenge), kChallengeBytes), role});
}

// Waits until `fd` is ready for `events` or the deadline passes.
bool wait_ready(int fd, short events, Clock::time_point deadline, std::string* why) {
  for (;;) {
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, ms_left(deadline));
    if (r > 0) return true;
    if (r == 0) {
      *why = "timed out";
      return false;
    }
    if (errno != EINTR) {
      *why = std::strerror(errno);
      return false;
    }
  }
}

}  // namespace

int handshake_timeout_ms(int overall_ms) { return std::clamp(overall_ms, 1, 5000); }

int ms_left(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left > 0 ? int(std::min<long long>(left, 1 << 30)) : 0;
}

bool read_full(int fd, void* buf, size_t n, Clock::time_point deadline, std::string* why) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    if (!wait_ready(fd, POLLIN, deadline, why)) return false;
    ssize_t got = ::recv(fd, p, n, MSG_DONTWAIT);
    if (got == 0) {
      *why = "connection closed (a peer process exited?)";
      return false;
    }
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      *why = std::strerror(errno);
      return false;
    }
    p += got;
    n -= size_t(got);
  }
  return true;
}

bool write_full(int fd, const void* buf, size_t n, Clock::time_point deadline, std::string* why) {
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t put = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (put < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!wait_ready(fd, POLLOUT, deadline, why)) return false;
        continue;
      }
      *why = std::strerror(errno);
      return false;
    }
    p += put;
    n -= size_t(put);
  }
  return true;
}

ClientAuth client_handshake(int fd, const Secret& secret, Channel ch, Clock::time_point deadline, std::string* why) {
  uint8_t hello[kClientHelloBytes];
  std::memcpy(hello, magic(ch).data(), 4);
  uint8_t* mine = hello + 4;
  random_bytes(mine, kChallengeBytes);
  uint8_t reply[kServerReplyBytes];
  if (!write_full(fd, hello, sizeof hello, deadline, why) || !read_full(fd, reply, sizeof reply, deadline, why))
    return ClientAuth::kIoError;
  Digest expect = proof(secret, mine, ch, /*server=*/true);
  if (!equal_constant_time(expect.data(), reply + kChallengeBytes, kProofBytes)) {
    *why = "the server could not prove it knows the unique id's secret";
    return ClientAuth::kServerUnproven;
  }
  Digest answer = proof(secret, reply, ch, /*server=*/false);
  if (!write_full(fd, answer.data(), answer.size(), deadline, why)) return ClientAuth::kIoError;
  return ClientAuth::kOk;
}

size_t ServerHandshake::want() const {
  switch (state_) {
    case State::kChallenge: return kClientHelloBytes;
    case State::kProof: return kProofBytes;
    default: return 0;
  }
}

std::string ServerHandshake::feed(const uint8_t* data) {
  if (state_ == State::kChallenge) {
    if (std::memcmp(data, magic(ch_).data(), 4) != 0) {
      state_ = State::kFailed;
      return {};
    }
    random_bytes(mine_, sizeof mine_);
    Digest p = proof(secret_, data + 4, ch_, /*server=*/true);
    state_ = State::kProof;
    std::string reply(reinterpret_cast<const char*>(mine_), sizeof mine_);
    reply.append(reinterpret_cast<const char*>(p.data()), p.size());
    return reply;
  }
  if (state_ == State::kProof) {
    Digest expect = proof(secret_, mine_, ch_, /*server=*/false);
    state_ = equal_constant_time(expect.data(), data, kProofBytes) ? State::kDone : State::kFailed;
  }
  return {};
}

bool NbConn::read_some(std::string* why) {
  while (in.size() < want) {
    char buf[65536];
    size_t n = std::min(sizeof buf, want - in.size());
    ssize_t got = ::recv(fd, buf, n, MSG_DONTWAIT);
    if (got == 0) {
      *why = "connection closed";
      return false;
    }
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      *why = std::strerror(errno);
      return false;
    }
    in.append(buf, size_t(got));
  }
  return true;
}

bool NbConn::flush(std::string* why) {
  while (!out.empty()) {
    const std::string& b = *out.front();
    if (out_off == b.size()) {
      out.pop_front();
      out_off = 0;
      continue;
    }
    ssize_t put = ::send(fd, b.data() + out_off, b.size() - out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (put < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      *why = std::strerror(errno);
      return false;
    }
    out_off += size_t(put);
  }
  return true;
}

bool set_nonblocking(int fd) {
  int fl = ::fcntl(fd, F_GETFL, 0);
  return fl >= 0 && ::fcntl(fd, F_SETFL, fl | O_NONBLOCK) == 0;
}

}  // namespace mk::rt
