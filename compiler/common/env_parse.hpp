// Strict parsing of MK_* environment settings: one parser for the compiler,
// the runtime (runtime/comm/env.hpp wraps it with mkInvalidArgument errors) and
// the NCCL-compatible library (nccl/shim.cpp, built without exceptions and
// linked against libc alone). Header-only, allocates nothing, throws nothing.
//
// A value parses only as a whole: " 8", "8 ", "+8", "0x8", "0x1p3", "1e3",
// "8.0" and "8s" are not integers; "true", "yes", "on", "01" and "1 " are
// not booleans. Each caller names the variable, its value and what it
// accepts when a value is refused.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace mk::env_parse {

// A decimal integer: an optional '-' and 1 to 19 digits, nothing else, in
// lo..hi. False (and *out untouched) otherwise.
inline bool parse_int(std::string_view s, int64_t lo, int64_t hi, int64_t* out) {
  const bool neg = !s.empty() && s[0] == '-';
  const std::string_view digits = s.substr(neg ? 1 : 0);
  if (digits.empty() || digits.size() > 19) return false;
  uint64_t v = 0;  // 19 digits are below 2^64: no overflow
  for (const char c : digits) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + uint64_t(c - '0');
  }
  constexpr uint64_t kMax = uint64_t(INT64_MAX);
  if (v > kMax + (neg ? 1 : 0)) return false;
  const int64_t x = !neg ? int64_t(v) : v == kMax + 1 ? INT64_MIN : -int64_t(v);
  if (x < lo || x > hi) return false;
  *out = x;
  return true;
}

// "0" or "1". False (and *out untouched) otherwise.
inline bool parse_bool(std::string_view s, bool* out) {
  if (s != "0" && s != "1") return false;
  *out = s == "1";
  return true;
}

// A diagnostic switch (MK_DEBUG, MK_NCCL_STATS): unset, empty or "0" is
// off, "1" is on. It is read where no error can be returned (inside logging,
// on any code path), so any other value is off as well, with one line on
// stderr, "<prefix> warning: NAME='VALUE' ...", naming what is accepted.
// Callers read it once and keep the answer.
inline bool diagnostic_flag(const char* name, const char* prefix) {
  const char* v = std::getenv(name);
  if (!v || !*v) return false;
  bool on = false;
  if (parse_bool(v, &on)) return on;
  std::fprintf(stderr, "%s warning: %s='%.64s%s' is not accepted (expected 0 or 1; unset or empty: 0); %s is off\n",
               prefix, name, v, std::string_view(v).size() > 64 ? "..." : "", name);
  return false;
}

}  // namespace mk::env_parse
