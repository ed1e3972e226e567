// Passing file descriptors (CUDA VMM shareable handles) between processes of
// one node over abstract Unix domain sockets (SCM_RIGHTS).
#pragma once

#include <string>
#include <thread>

namespace mk::rt {

// Serves `fd` to `count` connecting peers on the abstract socket `name`, in a
// thread, for at most `timeout_ms`. wait() joins it.
class FdServer {
 public:
  FdServer(const std::string& name, int fd, int count, int timeout_ms);
  ~FdServer();
  void wait();
  FdServer(const FdServer&) = delete;
  FdServer& operator=(const FdServer&) = delete;

 private:
  int listen_fd_ = -1;
  std::thread thread_;
};

// Connects to the server `name` and receives its descriptor (the caller owns
// the returned fd). Retries until `timeout_ms`; throws RtError on failure.
int fetch_fd(const std::string& name, int timeout_ms);

}  // namespace mk::rt
