// The content hash behind every cache key (cubins, plans, resource layouts).
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <utility>

namespace mk {

// Two independent 64-bit FNV-1a streams, as 32 hex digits. Not a
// cryptographic hash: keys only tell apart inputs nobody chose to collide
// (the cache directory is private, jit.hpp). Hasher streams what hash_hex
// takes at once (hash_hex(x) == Hasher().add(x).hex()).
class Hasher {
 public:
  Hasher& add(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) {
      a_ = (a_ ^ p[i]) * 0x100000001b3ull;
      b_ = (b_ ^ (p[i] + 0x5bu)) * 0x100000001b3ull;
      b_ ^= b_ >> 29;
    }
    return *this;
  }
  Hasher& add(const std::string& s) { return add(s.data(), s.size()); }
  std::string hex() const { return fmt::format("{:016x}{:016x}", a_, b_); }

 private:
  uint64_t a_ = 0xcbf29ce484222325ull, b_ = 0x84222325cbf29ce4ull;
};

inline std::string hash_hex(const std::string& data) { return Hasher().add(data).hex(); }

}  // namespace mk
