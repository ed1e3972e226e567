// Passing file descriptors (CUDA VMM shareable handles) between processes of
// one node over abstract Unix domain sockets (SCM_RIGHTS).
//
// Threat model: every local user can see abstract socket names (once bound,
// in /proc/net/unix) and connect to them, or bind a name first. Names are
// therefore derived from the unique id's secret (ipc_socket_name), so nobody
// without the id can compute a rank's name before the rank binds it; if a
// name is taken anyway (a process that has the id, such as a second job
// started with the same id), the rank says so through the bootstrap and every
// rank's init fails at once with that message (runtime/transport/p2p/p2p.cpp).
// The descriptor is the scratch arena, which holds
// every rank's symmetric memory, so it goes only to a client that (1) runs as
// the same user as this process and (2) has a pid the job's ranks announced
// through the authenticated bootstrap (SO_PEERCRED, checked before anything is
// read), and (3) proves it knows the unique id's secret (runtime/bootstrap/auth.hpp).
// The client checks the server the same way (pid of the rank it wants, same
// user, secret), so a process squatting on the name cannot hand out a bogus
// descriptor. Connections that fail are closed without a reply and do not
// count; the server serves all connections concurrently, each with a
// handshake deadline, so unauthorised ones cannot starve the real peers.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "runtime/bootstrap/auth.hpp"

namespace mk::rt {

// The abstract socket name of `rank`'s fd server in the job whose id carries
// `secret` and `nonce`: "mkernel-" and 32 hex digits of HMAC-SHA256(secret,
// "mkernel ipc socket name " + hex(nonce) + "/" + rank). Only holders of the
// secret can compute it, and one rank's name says nothing about another's.
// (The message cannot collide with a handshake proof: those end in a role.)
std::string ipc_socket_name(const Secret& secret, const uint8_t (&nonce)[16], int rank);

// Serves `fd` to `count` authorised connecting peers (pid in `pids`) on the
// abstract socket `name`, in a thread, for at most `timeout_ms`. Throws
// RtError at once when the name cannot be bound (EADDRINUSE: "squat" in the
// message). wait() serves until every peer has the descriptor (or the
// timeout); the destructor stops serving at once, so that an init that failed
// elsewhere does not wait out the timeout.
class FdServer {
 public:
  FdServer(const std::string& name, int fd, int count, int timeout_ms, std::vector<pid_t> pids, const Secret& secret);
  ~FdServer();
  void wait();
  // Descriptors handed out so far (valid after wait()).
  int served() const { return served_; }
  FdServer(const FdServer&) = delete;
  FdServer& operator=(const FdServer&) = delete;

 private:
  int listen_fd_ = -1;
  int stop_[2] = {-1, -1};  // a byte on stop_[1] ends the serving thread
  int served_ = 0;
  std::thread thread_;
  void join();
};

// Connects to the server `name`, which must be process `server_pid` of this
// user and prove `secret`, and receives its descriptor (the caller owns the
// returned fd). Retries until `timeout_ms`; throws RtError on failure, at once
// when someone else holds the name.
int fetch_fd(const std::string& name, int timeout_ms, pid_t server_pid, const Secret& secret);

}  // namespace mk::rt
