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

std::string_view magic(Channel ch) {
  return ch == Channel::kBootstrap ? "MKB1" : ch == Channel::kPeer ? "MKP1" : "MKI1";
}

std::string_view channel_name(Channel ch) {
  return ch == Channel::kBootstrap ? "mkernel bootstrap" : ch == Channel::kPeer ? "mkernel bootstrap peer" : "mkernel ipc";
}

std::string_view bytes(const uint8_t* p, size_t n) { return std::string_view(reinterpret_cast<const char*>(p), n); }

Digest proof(const Secret& s, const uint8_t* challenge, Channel ch, bool server) {
  const std::string role = std::string(channel_name(ch)) + (server ? " server" : " client");
  return hmac_sha256(s.data(), s.size(), {bytes(challenge, kChallengeBytes), role});
}

// Both directions' keys from the secret and both challenges: fresh per
// connection, bound to its channel, never sent.
SessionKeys derive_keys(const Secret& s, Channel ch, const uint8_t* client_challenge,
                        const uint8_t* server_challenge, bool server) {
  const std::string label = std::string(channel_name(ch)) + " session keys";
  const Digest base = hmac_sha256(s.data(), s.size(), {label, bytes(client_challenge, kChallengeBytes),
                                                       bytes(server_challenge, kChallengeBytes)});
  const Digest c2s = hmac_sha256(base.data(), base.size(), {"client to server"});
  const Digest s2c = hmac_sha256(base.data(), base.size(), {"server to client"});
  return server ? SessionKeys{s2c, c2s} : SessionKeys{c2s, s2c};
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

ClientHandshake::ClientHandshake(const Secret& secret, Channel ch) : secret_(secret), ch_(ch) {
  uint8_t mine[kChallengeBytes];
  random_bytes(mine, sizeof mine);
  hello_ = std::string(magic(ch));
  hello_.append(bytes(mine, sizeof mine));
}

std::string ClientHandshake::feed(const uint8_t* reply) {
  if (state_ != State::kReply) return {};
  const auto* mine = reinterpret_cast<const uint8_t*>(hello_.data()) + 4;
  Digest expect = proof(secret_, mine, ch_, /*server=*/true);
  if (!equal_constant_time(expect.data(), reply + kChallengeBytes, kProofBytes)) {
    state_ = State::kFailed;
    return {};
  }
  std::memcpy(theirs_, reply, kChallengeBytes);
  state_ = State::kDone;
  Digest answer = proof(secret_, reply, ch_, /*server=*/false);
  return std::string(reinterpret_cast<const char*>(answer.data()), answer.size());
}

SessionKeys ClientHandshake::keys() const {
  return derive_keys(secret_, ch_, reinterpret_cast<const uint8_t*>(hello_.data()) + 4, theirs_, /*server=*/false);
}

ClientAuth client_handshake(int fd, const Secret& secret, Channel ch, Clock::time_point deadline, std::string* why,
                            SessionKeys* keys) {
  ClientHandshake hs(secret, ch);
  uint8_t reply[kServerReplyBytes];
  if (!write_full(fd, hs.hello().data(), hs.hello().size(), deadline, why) ||
      !read_full(fd, reply, sizeof reply, deadline, why))
    return ClientAuth::kIoError;
  const std::string answer = hs.feed(reply);
  if (hs.failed()) {
    *why = "the server could not prove it knows the unique id's secret";
    return ClientAuth::kServerUnproven;
  }
  if (!write_full(fd, answer.data(), answer.size(), deadline, why)) return ClientAuth::kIoError;
  if (keys) *keys = hs.keys();
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
    std::memcpy(theirs_, data + 4, sizeof theirs_);
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

SessionKeys ServerHandshake::keys() const { return derive_keys(secret_, ch_, theirs_, mine_, /*server=*/true); }

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
