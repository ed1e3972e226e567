// Helpers shared by the unit and runtime test binaries: what a piece of code
// writes to stderr, and how often a text occurs in it.
#pragma once

#include <doctest/doctest.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

namespace mkt {

// What `f` writes to stderr (fd 2), kept off the terminal; stderr is put
// back also when `f` throws.
inline std::string stderr_of(const std::function<void()>& f) {
  char path[] = "/tmp/mkt-err.XXXXXX";
  const int fd = ::mkstemp(path);  // 0600, a fresh name
  REQUIRE(fd >= 0);
  std::fflush(stderr);
  const int saved = ::dup(2);
  REQUIRE(saved >= 0);
  ::dup2(fd, 2);
  ::close(fd);
  auto restore = [&] {
    std::fflush(stderr);
    ::dup2(saved, 2);
    ::close(saved);
  };
  try {
    f();
  } catch (...) {
    restore();
    ::unlink(path);
    throw;
  }
  restore();
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  ::unlink(path);
  return ss.str();
}

// How often `what` occurs in `s` (overlapping occurrences too).
inline size_t occurrences(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

}  // namespace mkt
