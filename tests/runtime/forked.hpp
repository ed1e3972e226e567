// Child processes for tests that need several processes without a fresh
// exec (the transport contract suite, the proxy's tests): the child inherits
// what its parent made (listening sockets, handles, a unique id).
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <thread>

#include <doctest/doctest.h>

namespace mkt {

// Runs `body` in a child process; its exit status (0: passed) comes back from
// join_child(). An exception in the child prints "<who>: what" and exits 1.
inline pid_t fork_child(const std::function<int()>& body, const char* who = "child") {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int rc = 1;
    try {
      rc = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: %s\n", who, e.what());
    }
    std::fflush(stderr);
    _exit(rc);
  }
  REQUIRE(pid > 0);
  return pid;
}

// The child's exit code (128 + signal when a signal ended it), or -1 when it
// did not end within `ms` (it is killed then): a hang fails the test.
inline int join_child(pid_t pid, int ms = 60000) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  int st = 0;
  while (::waitpid(pid, &st, WNOHANG) != pid) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &st, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

}  // namespace mkt
