// mk_bench's test data: inputs a pure function of (rank, element, input set),
// generated on the GPU, and a checker that computes every expected output
// element on the GPU from the same function. So every timed batch can be
// checked, up to 1 GiB, without copying buffers to the host.
//
// Values are small multiples of 1/4 (floats) or small integers, differing per
// rank, element and set, and never all zero. With |value| <= K units and
// K = max(1, 255 / nranks), every partial sum of a reduction has at most 8
// significant bits: exact in bf16, fp16, fp32 and fp64 whatever the order of
// the additions (integers wrap the same way on the GPU and here). So outputs
// are compared bit for bit with the exact (float64) result; the element type
// only decides how that result is stored. fp8 is not supported (too few bits).
//
// The functions below are compiled twice: as host C++ (tests, and the
// host-side cross-check `mk_bench --host-check`) and, stringified, by NVRTC
// into the bench's helper kernels (data.cpp), so both sides agree by
// construction.
#pragma once

#include <cstdint>
#include <string>

#include "mk/types.hpp"

#define MKB_SHARED_SOURCE(...)                        \
  namespace mkb {                                     \
  __VA_ARGS__                                         \
  }                                                   \
  inline const char* mkb_shared_source() { return #__VA_ARGS__; }

#define MKB_HD inline
MKB_SHARED_SOURCE(
    // A 64-bit mix (splitmix64's finaliser) of rank, element and set.
    MKB_HD unsigned long long mix(unsigned int rank, unsigned long long elem, unsigned int set) {
      unsigned long long x = elem * 0x9E3779B97F4A7C15ull + ((unsigned long long)rank << 40) +
                             ((unsigned long long)set << 56) + 0x632BE59BD9B4E019ull;
      x ^= x >> 31;
      x *= 0xBF58476D1CE4E5B9ull;
      x ^= x >> 27;
      x *= 0x94D049BB133111EBull;
      x ^= x >> 33;
      return x;
    }
    // Largest |units| of one rank's value for n ranks.
    MKB_HD int unit_range(int nranks) { return nranks >= 255 ? 1 : 255 / (nranks < 1 ? 1 : nranks); }
    // Rank `rank`'s input element `elem` in input set `set`, in units
    // (floats: quarters), in [-K, K].
    MKB_HD long long units(unsigned int rank, unsigned long long elem, unsigned int set, int K) {
      return (long long)(mix(rank, elem, set) % (unsigned long long)(2 * K + 1)) - K;
    }
    // The bits of `u` units stored as element kind `kind` (0 signed or
    // unsigned integer, 1 fp16, 2 bf16, 3 fp32, 4 fp64) of `bytes` bytes.
    // Exact: |u| / 4 has at most 8 significant bits.
    MKB_HD unsigned long long to_bits(long long u, int kind, int bytes) {
      if (kind == 0) {
        unsigned long long v = (unsigned long long)u;
        return bytes == 8 ? v : (v & ((1ull << (8 * bytes)) - 1ull));
      }
      if (u == 0) return 0;  // +0.0 in every format
      const unsigned long long sign = u < 0 ? 1ull : 0ull;
      unsigned long long m = (unsigned long long)(u < 0 ? -u : u);  // value = m * 2^-2
      int e = 0;                                                       // m = 1.f * 2^e
      while ((m >> (e + 1)) != 0) ++e;
      const int exp2 = e - 2;  // the value's binary exponent
      const unsigned long long frac = m - (1ull << e);  // e fraction bits
      if (kind == 1) return (sign << 15) | ((unsigned long long)(exp2 + 15) << 10) | (frac << (10 - e));
      if (kind == 2) return (sign << 15) | ((unsigned long long)(exp2 + 127) << 7) | (frac << (7 - e));
      if (kind == 3) return (sign << 31) | ((unsigned long long)(exp2 + 127) << 23) | (frac << (23 - e));
      return (sign << 63) | ((unsigned long long)(exp2 + 1023) << 52) | (frac << (52 - e));
    })
#undef MKB_HD

namespace mkb {

// to_bits' `kind` of a dtype; -1: not supported by the bench (fp8).
int dtype_kind(mk::DType t);

// The source of the bench's helper kernels (fill, check), for NVRTC.
std::string kernel_source();

// Expected bits of element `i` of output block `b` of `rank` (host twin of
// the check kernel; `count` elements per block).
unsigned long long expected_bits(mk::Collective c, mk::DType t, int nranks, int root, int rank, int64_t count,
                                 int64_t elem, unsigned set);

}  // namespace mkb
