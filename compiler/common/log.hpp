// MK_DEBUG=1: one line per event on stderr, "[mkernel] ...". Shared by the
// compiler (shipped plans) and the runtime (rt::debug_log).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace mk {

inline bool debug_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("MK_DEBUG");
    return e && *e && std::strcmp(e, "0") != 0;
  }();
  return on;
}

inline void debug_log(const std::string& msg) {
  if (debug_enabled()) std::fprintf(stderr, "[mkernel] %s\n", msg.c_str());
}

}  // namespace mk
