// Mutual authentication of the job's own connections (bootstrap TCP to the
// rendezvous and between ranks, and the local fd-passing socket), the keys
// that protect the bootstrap's messages after it (frame.hpp), and the
// deadline-bounded socket I/O they use.
//
// Threat model. Trusted: processes of the same user that know the unique id
// (it carries a 32-byte secret from the kernel's CSPRNG; the id is passed
// between ranks by the launcher, MPI, torchrun, ...). Not trusted: the network
// and every other process, local or remote, that can reach the rendezvous port
// or see the abstract socket names. Before anything else is read or served,
// each side of every connection proves it knows the secret:
//
//   client -> server  magic(4) + Cc(32)              fresh random challenge
//   server -> client  Cs(32) + HMAC(secret, Cc || "mkernel <channel> server")
//   client -> server  HMAC(secret, Cs || "mkernel <channel> client")
//
// The role and the channel are part of every proof, so neither side can be made
// to answer the other's challenge (reflection), and a bootstrap proof never
// opens the IPC channel or a rank's peer listener. Proofs are compared in
// constant time. Both challenges and the secret give each bootstrap
// connection two keys of its own, one per direction (session_keys); every
// message after the handshake carries a MAC under them with a sequence
// number (frame.hpp), so bytes an on-path attacker injects, alters, replays
// or reorders fail the bootstrap with an integrity error instead of being
// used. Not covered: confidentiality (the bytes are readable on the wire:
// addresses, device info, memory handles, never the secret) and availability
// against someone who can reset or drop the job's TCP connections; the local
// IPC channel (a Unix socket no network attacker sees) has no per-message
// MACs. Run multi-node jobs on a fabric you trust with what the bootstrap says.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "runtime/bootstrap/crypto.hpp"

namespace mk::rt {

using Secret = std::array<uint8_t, 32>;
using Clock = std::chrono::steady_clock;

// kBootstrap: a rank to the rendezvous; kPeer: a rank to another rank's
// listener (runtime/bootstrap/peers.hpp); kIpc: the local fd server.
enum class Channel { kBootstrap, kIpc, kPeer };

constexpr size_t kChallengeBytes = 32;
constexpr size_t kProofBytes = 32;
constexpr size_t kClientHelloBytes = 4 + kChallengeBytes;
constexpr size_t kServerReplyBytes = kChallengeBytes + kProofBytes;

// How long a server waits for one connection to finish the handshake: a few
// seconds, never more than the overall timeout.
int handshake_timeout_ms(int overall_ms);

int ms_left(Clock::time_point deadline);
// Full reads/writes on a blocking or nonblocking socket, bounded by `deadline`.
// Return false with *why set on timeout, error or a closed peer.
bool read_full(int fd, void* buf, size_t n, Clock::time_point deadline, std::string* why);
bool write_full(int fd, const void* buf, size_t n, Clock::time_point deadline, std::string* why);

// One connection's MAC keys, as one side sees them.
struct SessionKeys {
  Digest send{}, recv{};
};

enum class ClientAuth { kOk, kIoError, kServerUnproven };
// The client side, blocking until `deadline`: sends a challenge, checks the
// server's proof (kServerUnproven: whoever listens does not know the secret),
// then proves the secret itself. `keys` (may be null): the connection's keys.
ClientAuth client_handshake(int fd, const Secret& secret, Channel ch, Clock::time_point deadline, std::string* why,
                            SessionKeys* keys = nullptr);

// The client side as a state machine without I/O, for poll loops: send
// hello(), feed the server's reply (want() bytes) and send what feed()
// returns; failed(): the server could not prove the secret.
class ClientHandshake {
 public:
  ClientHandshake(const Secret& secret, Channel ch);
  const std::string& hello() const { return hello_; }
  size_t want() const { return state_ == State::kReply ? kServerReplyBytes : 0; }
  std::string feed(const uint8_t* reply);
  bool done() const { return state_ == State::kDone; }
  bool failed() const { return state_ == State::kFailed; }
  SessionKeys keys() const;  // once done()

 private:
  enum class State { kReply, kDone, kFailed };
  Secret secret_;
  Channel ch_;
  State state_ = State::kReply;
  std::string hello_;
  uint8_t theirs_[kChallengeBytes] = {};
};

// The server side as a state machine without I/O, for poll loops: feed it
// exactly want() bytes at a time and send what feed() returns. want() is 0 once
// done() or failed(); a failed connection must be closed without a reply.
class ServerHandshake {
 public:
  ServerHandshake(const Secret& secret, Channel ch) : secret_(secret), ch_(ch) {}
  size_t want() const;
  std::string feed(const uint8_t* data);
  bool done() const { return state_ == State::kDone; }
  bool failed() const { return state_ == State::kFailed; }
  SessionKeys keys() const;  // once done()

 private:
  enum class State { kChallenge, kProof, kDone, kFailed };
  Secret secret_;
  Channel ch_;
  State state_ = State::kChallenge;
  uint8_t mine_[kChallengeBytes] = {};
  uint8_t theirs_[kChallengeBytes] = {};
};

// A nonblocking socket in a poll loop: an input target of `want` bytes and a
// queue of output buffers (shared, so one broadcast is not copied per peer).
struct NbConn {
  int fd = -1;
  std::string in;
  size_t want = 0;
  std::deque<std::shared_ptr<const std::string>> out;
  size_t out_off = 0;

  void expect(size_t n) {
    in.clear();
    want = n;
  }
  bool complete() const { return in.size() == want; }
  void send(std::string bytes) { out.push_back(std::make_shared<const std::string>(std::move(bytes))); }
  // Reads what is available toward `want`; false on EOF or error.
  bool read_some(std::string* why);
  // Writes what the socket takes; false on error.
  bool flush(std::string* why);
};

// Sets O_NONBLOCK; false on failure.
bool set_nonblocking(int fd);

}  // namespace mk::rt
