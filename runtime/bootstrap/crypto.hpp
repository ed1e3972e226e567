// The few cryptographic primitives the bootstrap and local IPC need to tell
// the job's own processes from everybody else: SHA-256 (FIPS 180-4),
// HMAC-SHA256 (RFC 2104), bytes from the kernel's CSPRNG and a constant-time
// comparison. No dependency on OpenSSL; tested against the standard vectors.
// SHA-256 runs on the CPU's SHA extensions where it has them (x86 SHA-NI,
// checked at run time), else on portable code; both give the same digests.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string_view>

namespace mk::rt {

using Digest = std::array<uint8_t, 32>;

// Incremental SHA-256: update() any number of times, then finish() once.
class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  Digest finish();

 private:
  void blocks(const uint8_t* p, size_t n);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buffered_ = 0;
  uint64_t total_ = 0;
};

Digest sha256(const void* data, size_t n);
// Whether SHA-256 uses the CPU's SHA extensions now.
bool sha256_accelerated();
// For tests: the portable code even where the extensions exist.
void sha256_force_portable(bool on);
// HMAC-SHA256 of the concatenation of `parts` under `key` (any key length).
Digest hmac_sha256(const void* key, size_t key_len, std::initializer_list<std::string_view> parts);

// Fills `out` from the kernel's CSPRNG (getrandom, else /dev/urandom); throws
// RtError(mkSystemError) if neither works. Never falls back to a weak source.
void random_bytes(void* out, size_t n);

// Equal in time independent of where the first difference is.
bool equal_constant_time(const void* a, const void* b, size_t n);

}  // namespace mk::rt
