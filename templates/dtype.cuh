// Element types and exact conversions to and from float.
//
// Narrow floats (fp16, bf16, fp8 e4m3/e5m2) are stored as their bit patterns and
// computed in float. Conversions round to nearest even; fp8 conversions saturate
// to the largest finite value (NVIDIA's "satfinite"), fp16/bf16 overflow to inf.
// The integer routines below are bit-exact with the hardware cvt instructions,
// so the CPU executor and the GPU produce identical bits. On devices that have
// the cvt instructions, the device path uses them (faster, same result).
#pragma once
#include "common.cuh"

namespace mk {
namespace dev {

struct f16 { uint16_t bits; };
struct bf16 { uint16_t bits; };
struct f8e4m3 { uint8_t bits; };
struct f8e5m2 { uint8_t bits; };

// Generic narrow float <-> float. EB exponent bits, MB mantissa bits. IEEE=true
// formats have inf and NaN at the top exponent (fp16, e5m2); e4m3 ("fn") has no
// inf and a single NaN mantissa (all ones) at the top exponent.
template <int EB, int MB, bool IEEE>
struct NarrowFloat {
  static constexpr int kBias = (1 << (EB - 1)) - 1;
  static constexpr uint32_t kExpMax = (1u << EB) - 1;
  static constexpr uint32_t kMaxFinite =
      IEEE ? (((kExpMax - 1) << MB) | ((1u << MB) - 1)) : ((kExpMax << MB) | ((1u << MB) - 2));
  static constexpr uint32_t kNaN = IEEE ? ((kExpMax << MB) | (1u << (MB - 1))) : ((kExpMax << MB) | ((1u << MB) - 1));
  static constexpr uint32_t kInf = kExpMax << MB;  // only meaningful when IEEE

  MK_HD static uint32_t round_shift(uint32_t m, int shift) {
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return q;
  }

  // SAT: overflow (and inf input) gives the largest finite value.
  template <bool SAT>
  MK_HD static uint32_t from_float(float f) {
    uint32_t x = bitcast<uint32_t>(f);
    uint32_t sign = (x >> 31) << (EB + MB);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return sign | kNaN;
    if (ax == 0x7f800000u) return sign | ((IEEE && !SAT) ? kInf : kMaxFinite);
    if ((ax >> 23) == 0) return sign;  // float subnormals are far below every target's range
    int te = int(ax >> 23) - 127 + kBias;
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t r;
    if (te >= 1) {
      uint32_t q = round_shift(m, 23 - MB);
      if (q >> (MB + 1)) {
        q >>= 1;
        ++te;
      }
      if (te > int(kExpMax)) return sign | ((IEEE && !SAT) ? kInf : kMaxFinite);
      r = (uint32_t(te) << MB) | (q & ((1u << MB) - 1u));
    } else {
      int shift = (23 - MB) + (1 - te);
      if (shift >= 25) return sign;
      r = round_shift(m, shift);  // may round up into the smallest normal: still right
    }
    if (r > kMaxFinite) r = ((IEEE && !SAT) ? kInf : kMaxFinite);
    return sign | r;
  }

  MK_HD static float to_float(uint32_t v) {
    uint32_t sign = (v >> (EB + MB)) & 1u;
    uint32_t e = (v >> MB) & kExpMax;
    uint32_t m = v & ((1u << MB) - 1u);
    float out;
    if (e == kExpMax && (IEEE || m == (1u << MB) - 1u)) {
      out = bitcast<float>(IEEE && m == 0 ? 0x7f800000u : 0x7fc00000u);
    } else if (e == 0) {
      out = float(m) / float(1u << (kBias + MB - 1));
    } else {
      out = bitcast<float>(((e - kBias + 127) << 23) | (m << (23 - MB)));
    }
    return sign ? -out : out;
  }
};

using F16Fmt = NarrowFloat<5, 10, true>;
using E4M3Fmt = NarrowFloat<4, 3, false>;
using E5M2Fmt = NarrowFloat<5, 2, true>;

MK_HD float to_float(f16 v) {
#if MK_DEVICE_CODE && defined(__CUDA_ARCH__)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
  return f;
#else
  return F16Fmt::to_float(v.bits);
#endif
}
MK_HD float to_float(bf16 v) { return bitcast<float>(uint32_t(v.bits) << 16); }
MK_HD float to_float(f8e4m3 v) { return E4M3Fmt::to_float(v.bits); }
MK_HD float to_float(f8e5m2 v) { return E5M2Fmt::to_float(v.bits); }

template <typename T>
MK_HD T from_float(float f);
template <>
MK_HD f16 from_float<f16>(float f) {
#if MK_DEVICE_CODE && defined(__CUDA_ARCH__)
  uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return f16{h};
#else
  return f16{uint16_t(F16Fmt::from_float<false>(f))};
#endif
}
template <>
MK_HD bf16 from_float<bf16>(float f) {
#if MK_DEVICE_CODE && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint16_t h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return bf16{h};
#else
  uint32_t x = bitcast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((x >> 16) | 0x40u)};
  return bf16{uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16)};
#endif
}
template <>
MK_HD f8e4m3 from_float<f8e4m3>(float f) {
  return f8e4m3{uint8_t(E4M3Fmt::from_float<true>(f))};
}
template <>
MK_HD f8e5m2 from_float<f8e5m2>(float f) {
  return f8e5m2{uint8_t(E5M2Fmt::from_float<true>(f))};
}

// Traits: how an element type computes. Narrow floats compute in float.
template <typename T>
struct Compute {
  using type = T;
  MK_HD static type load(T v) { return v; }
  MK_HD static T store(type v) { return v; }
};
#define MK_NARROW_COMPUTE(T)                                 \
  template <>                                                \
  struct Compute<T> {                                        \
    using type = float;                                      \
    MK_HD static float load(T v) { return to_float(v); }     \
    MK_HD static T store(float v) { return from_float<T>(v); } \
  };
MK_NARROW_COMPUTE(f16)
MK_NARROW_COMPUTE(bf16)
MK_NARROW_COMPUTE(f8e4m3)
MK_NARROW_COMPUTE(f8e5m2)
#undef MK_NARROW_COMPUTE

}  // namespace dev
}  // namespace mk
