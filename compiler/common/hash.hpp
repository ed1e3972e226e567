// The content hash behind every cache key (cubins, plans, resource layouts).
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <utility>

namespace mk {

// Two independent 64-bit FNV-1a streams, as 32 hex digits. Not a
// cryptographic hash: keys only tell apart inputs nobody chose to collide
// (the cache directory is private, jit.hpp).
inline std::string hash_hex(const std::string& data) {
  uint64_t a = 0xcbf29ce484222325ull, b = 0x84222325cbf29ce4ull;
  for (unsigned char c : data) {
    a = (a ^ c) * 0x100000001b3ull;
    b = (b ^ (c + 0x5bu)) * 0x100000001b3ull;
    b ^= b >> 29;
  }
  return fmt::format("{:016x}{:016x}", a, b);
}

}  // namespace mk
