// MK_DEBUG=1: one line per event on stderr, "[mkernel] ...". Shared by the
// compiler (shipped plans) and the runtime (rt::debug_log). Unset, empty or
// 0: off. Any other value is off too, with one warning on stderr naming it
// (env_parse.hpp): logging runs inside arbitrary code paths and never throws.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "compiler/common/env_parse.hpp"

namespace mk {

inline bool debug_enabled() {
  static const bool on = env_parse::diagnostic_flag("MK_DEBUG", "[mkernel]");
  return on;
}

inline void debug_log(const std::string& msg) {
  if (debug_enabled()) std::fprintf(stderr, "[mkernel] %s\n", msg.c_str());
}

}  // namespace mk
