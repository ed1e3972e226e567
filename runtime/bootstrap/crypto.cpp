#include "runtime/bootstrap/crypto.hpp"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define MK_SHA_NI 1
#endif

#include "runtime/api/status.hpp"

namespace mk::rt {
namespace {

constexpr uint32_t kK[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

}  // namespace

Sha256::Sha256()
    : h_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19} {}

namespace {

void sha256_portable(uint32_t* h_, const uint8_t* p, size_t nblocks) {
  for (; nblocks > 0; --nblocks, p += 64) {
    uint32_t w[64];
    for (int t = 0; t < 16; ++t)
      w[t] = uint32_t(p[4 * t]) << 24 | uint32_t(p[4 * t + 1]) << 16 | uint32_t(p[4 * t + 2]) << 8 | p[4 * t + 3];
    for (int t = 16; t < 64; ++t) {
      uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
      uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
      w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int t = 0; t < 64; ++t) {
      uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kK[t] + w[t];
      uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h_[0] += a;
    h_[1] += b;
    h_[2] += c;
    h_[3] += d;
    h_[4] += e;
    h_[5] += f;
    h_[6] += g;
    h_[7] += h;
  }
}

#ifdef MK_SHA_NI
// The same compression on the SHA extensions (SHA256RNDS2 does two rounds on
// the state held as {A,B,E,F} and {C,D,G,H}; SHA256MSG1/MSG2 extend the
// message schedule four words at a time). About 5x the portable code; the
// bootstrap MACs every byte it forwards, so this is most of an all-gather's
// CPU time at a thousand ranks.
__attribute__((target("sha,sse4.1,ssse3"))) void sha256_shani(uint32_t* h, const uint8_t* p, size_t nblocks) {
  const __m128i bswap = _mm_set_epi8(12, 13, 14, 15, 8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3);
  // dword 3 first: ABEF = {A,B,E,F} from the top, CDGH likewise.
  __m128i abef = _mm_set_epi32(int(h[0]), int(h[1]), int(h[4]), int(h[5]));
  __m128i cdgh = _mm_set_epi32(int(h[2]), int(h[3]), int(h[6]), int(h[7]));
  for (; nblocks > 0; --nblocks, p += 64) {
    const __m128i abef0 = abef, cdgh0 = cdgh;
    __m128i w[4];  // W[4g..4g+3] for the last four groups g, at w[g % 4]
    for (int g = 0; g < 16; ++g) {
      __m128i wg;
      if (g < 4) {
        wg = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * g)), bswap);
      } else {
        // W[t] = s1(W[t-2]) + W[t-7] + s0(W[t-15]) + W[t-16], t = 4g..4g+3
        __m128i t = _mm_sha256msg1_epu32(w[g % 4], w[(g + 1) % 4]);
        t = _mm_add_epi32(t, _mm_alignr_epi8(w[(g + 3) % 4], w[(g + 2) % 4], 4));
        wg = _mm_sha256msg2_epu32(t, w[(g + 3) % 4]);
      }
      w[g % 4] = wg;
      __m128i wk = _mm_add_epi32(wg, _mm_loadu_si128(reinterpret_cast<const __m128i*>(kK + 4 * g)));
      cdgh = _mm_sha256rnds2_epu32(cdgh, abef, wk);  // rounds 4g, 4g+1: the new ABEF
      wk = _mm_shuffle_epi32(wk, 0x0e);
      abef = _mm_sha256rnds2_epu32(abef, cdgh, wk);  // rounds 4g+2, 4g+3
    }
    abef = _mm_add_epi32(abef, abef0);
    cdgh = _mm_add_epi32(cdgh, cdgh0);
  }
  h[0] = uint32_t(_mm_extract_epi32(abef, 3));
  h[1] = uint32_t(_mm_extract_epi32(abef, 2));
  h[4] = uint32_t(_mm_extract_epi32(abef, 1));
  h[5] = uint32_t(_mm_extract_epi32(abef, 0));
  h[2] = uint32_t(_mm_extract_epi32(cdgh, 3));
  h[3] = uint32_t(_mm_extract_epi32(cdgh, 2));
  h[6] = uint32_t(_mm_extract_epi32(cdgh, 1));
  h[7] = uint32_t(_mm_extract_epi32(cdgh, 0));
}

bool cpu_has_sha() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool sha = (b >> 29) & 1;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  return sha && ((c >> 19) & 1) && ((c >> 9) & 1);  // and SSE4.1, SSSE3
}
#endif

std::atomic<bool> g_force_portable{false};

}  // namespace

bool sha256_accelerated() {
#ifdef MK_SHA_NI
  static const bool has = cpu_has_sha();
  return has && !g_force_portable.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

void sha256_force_portable(bool on) { g_force_portable.store(on); }

void Sha256::blocks(const uint8_t* p, size_t n) {
#ifdef MK_SHA_NI
  if (sha256_accelerated()) return sha256_shani(h_, p, n);
#endif
  sha256_portable(h_, p, n);
}

void Sha256::update(const void* data, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  total_ += n;
  if (buffered_ > 0) {
    const size_t take = std::min(n, sizeof buf_ - buffered_);
    std::memcpy(buf_ + buffered_, p, take);
    buffered_ += take;
    p += take;
    n -= take;
    if (buffered_ < sizeof buf_) return;
    blocks(buf_, 1);
    buffered_ = 0;
  }
  if (n >= sizeof buf_) {  // whole blocks straight from the input
    blocks(p, n / sizeof buf_);
    p += n - n % sizeof buf_;
    n %= sizeof buf_;
  }
  std::memcpy(buf_, p, n);
  buffered_ = n;
}

Digest Sha256::finish() {
  // Padding: 0x80, zeros up to 56 mod 64, then the message length in bits (big endian).
  const uint64_t bits = total_ * 8;
  const uint8_t one = 0x80, zero = 0;
  update(&one, 1);
  while (buffered_ != 56) update(&zero, 1);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(bits >> (56 - 8 * i));
  update(len, 8);
  Digest out;
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 4; ++j) out[size_t(4 * i + j)] = uint8_t(h_[i] >> (24 - 8 * j));
  return out;
}

Digest sha256(const void* data, size_t n) {
  Sha256 s;
  s.update(data, n);
  return s.finish();
}

Digest hmac_sha256(const void* key, size_t key_len, std::initializer_list<std::string_view> parts) {
  uint8_t k[64] = {};
  if (key_len > sizeof k) {
    Digest d = sha256(key, key_len);
    std::memcpy(k, d.data(), d.size());
  } else {
    std::memcpy(k, key, key_len);
  }
  uint8_t ipad[64], opad[64];
  for (int i = 0; i < 64; ++i) {
    ipad[i] = k[i] ^ 0x36;
    opad[i] = k[i] ^ 0x5c;
  }
  Sha256 inner;
  inner.update(ipad, sizeof ipad);
  for (std::string_view p : parts) inner.update(p.data(), p.size());
  Digest ih = inner.finish();
  Sha256 outer;
  outer.update(opad, sizeof opad);
  outer.update(ih.data(), ih.size());
  return outer.finish();
}

void random_bytes(void* out, size_t n) {
  uint8_t* p = static_cast<uint8_t*>(out);
  size_t done = 0;
  while (done < n) {
    ssize_t got = ::getrandom(p + done, n - done, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;  // ENOSYS (old kernel, seccomp): try the device below
    done += size_t(got);
  }
  if (done == n) return;
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(mkSystemError, std::string("no source of random bytes: getrandom and /dev/urandom failed: ") +
                                      std::strerror(errno));
  while (done < n) {
    ssize_t got = ::read(fd, p + done, n - done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      ::close(fd);
      fail(mkSystemError, "reading /dev/urandom failed; cannot make a secret for the unique id");
    }
    done += size_t(got);
  }
  ::close(fd);
}

bool equal_constant_time(const void* a, const void* b, size_t n) {
  const volatile uint8_t* x = static_cast<const volatile uint8_t*>(a);
  const volatile uint8_t* y = static_cast<const volatile uint8_t*>(b);
  uint8_t diff = 0;
  for (size_t i = 0; i < n; ++i) diff |= uint8_t(x[i] ^ y[i]);
  return diff == 0;
}

}  // namespace mk::rt
