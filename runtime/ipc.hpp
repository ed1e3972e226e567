// Passing file descriptors (CUDA VMM shareable handles) between processes of
// one node over abstract Unix domain sockets (SCM_RIGHTS).
//
// Threat model: every local user can see abstract socket names and connect to
// them, or bind a name first. The descriptor is the scratch arena, which holds
// every rank's symmetric memory, so it goes only to a client that (1) runs as
// the same user as this process and (2) has a pid the job's ranks announced
// through the authenticated bootstrap (SO_PEERCRED, checked before anything is
// read), and (3) proves it knows the unique id's secret (runtime/auth.hpp).
// The client checks the server the same way (pid of the rank it wants, same
// user, secret), so a process squatting on the name cannot hand out a bogus
// descriptor. Connections that fail are closed without a reply and do not
// count; the server serves all connections concurrently, each with a
// handshake deadline, so unauthorised ones cannot starve the real peers.
#pragma once

#include <sys/types.h>

#include <string>
#include <thread>
#include <vector>

#include "runtime/auth.hpp"

namespace mk::rt {

// Serves `fd` to `count` authorised connecting peers (pid in `pids`) on the
// abstract socket `name`, in a thread, for at most `timeout_ms`. wait() joins it.
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
  int served_ = 0;
  std::thread thread_;
};

// Connects to the server `name`, which must be process `server_pid` of this
// user and prove `secret`, and receives its descriptor (the caller owns the
// returned fd). Retries until `timeout_ms`; throws RtError on failure, at once
// when someone else holds the name.
int fetch_fd(const std::string& name, int timeout_ms, pid_t server_pid, const Secret& secret);

}  // namespace mk::rt
