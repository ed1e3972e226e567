// Reduction operators per dtype: sum, prod, min, max, avg, premulsum.
//
// Integer sum and prod wrap around (two's complement), like NCCL. avg is a sum
// whose *final* write is scaled: floats multiply by 1/nranks (in the compute
// type), integers divide by nranks (truncating toward zero). premulsum is a
// sum whose every input is first multiplied by its own rank's scalar (in the
// compute type; integers wrap): red_pre, applied by the prologue (prims.cuh).
#pragma once
#include "dtype.cuh"

namespace mk {
namespace dev {

enum RedKind { kRedSum = 0, kRedProd = 1, kRedMax = 2, kRedMin = 3, kRedAvg = 4, kRedPreMulSum = 5 };

template <typename C>
struct IsInt {
  static constexpr bool value = false;
};
#define MK_INT(T) \
  template <>     \
  struct IsInt<T> { static constexpr bool value = true; };
MK_INT(int8_t)
MK_INT(uint8_t)
MK_INT(int32_t)
MK_INT(uint32_t)
MK_INT(int64_t)
MK_INT(uint64_t)
#undef MK_INT

template <typename C>
struct Unsigned {
  using type = C;
};
template <> struct Unsigned<int8_t> { using type = uint8_t; };
template <> struct Unsigned<int32_t> { using type = uint32_t; };
template <> struct Unsigned<int64_t> { using type = uint64_t; };

// Floating-point max and min, commutative and associative bit for bit, so
// that ranks combining a reduction's contributions in different orders still
// get the same bits (the verifier's determinism proof, E015, relies on it):
// a NaN operand is ignored, as fmaxf does (NCCL's max and min); two NaNs give
// the canonical NaN (whatever their payloads); of two equal values the sign
// decides (max(+0, -0) = +0, min(+0, -0) = -0). `a < b ? b : a` returned its
// first operand for ties and for NaNs: rank order showed in the bits.
template <typename C>
struct FloatBits {
  using U = uint32_t;
  static constexpr U kNaN = 0x7fffffffu;
  static constexpr int kSign = 31;
};
template <>
struct FloatBits<double> {
  using U = uint64_t;
  static constexpr U kNaN = 0x7fffffffffffffffull;
  static constexpr int kSign = 63;
};
template <bool MAX, typename C>
MK_HD C red_minmax_float(C a, C b) {
  using B = FloatBits<C>;
  const bool na = !(a == a), nb = !(b == b);
  if (na || nb) return na && nb ? bitcast<C>(typename B::U(B::kNaN)) : na ? b : a;
  if (a < b) return MAX ? b : a;
  if (b < a) return MAX ? a : b;
  // equal: the same value, or zeros of two signs
  const bool a_neg = (bitcast<typename B::U>(a) >> B::kSign) != 0;
  return (a_neg == MAX) ? b : a;
}

// One binary step in the compute type C.
template <int K, typename C>
MK_HD C red_apply(C a, C b) {
  if constexpr (K == kRedSum || K == kRedAvg || K == kRedPreMulSum) {
    if constexpr (IsInt<C>::value) {
      using U = typename Unsigned<C>::type;
      return C(U(U(a) + U(b)));
    } else {
      return a + b;
    }
  } else if constexpr (K == kRedProd) {
    if constexpr (IsInt<C>::value) {
      using U = typename Unsigned<C>::type;
      return C(U(U(a) * U(b)));
    } else {
      return a * b;
    }
  } else if constexpr (K == kRedMax || K == kRedMin) {
    if constexpr (IsInt<C>::value) {
      if constexpr (K == kRedMax)
        return a < b ? b : a;
      else
        return b < a ? b : a;
    } else {
      return red_minmax_float<K == kRedMax>(a, b);
    }
  } else {
    static_assert(K == kRedMin, "unknown reduction kind");
    return a;
  }
}

// A product rounded on its own: never fused with a following add into one
// fused multiply-add (NVVM contracts `a + x * f` by default, which rounds
// once where a rank that adds a stored product rounds twice).
MK_HD float mul_rn(float a, float b) {
#if MK_DEVICE_CODE && defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
MK_HD double mul_rn(double a, double b) {
#if MK_DEVICE_CODE && defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

// x itself, as a value the compiler may not fuse into a following operation
// (x + -0 is x for every x; the _rn intrinsics are never contracted): a
// fusion's prologue result enters every sum as the same rounded value,
// whether it was computed in registers or read back from scratch.
MK_HD float settle_rn(float x) {
#if MK_DEVICE_CODE && defined(__CUDA_ARCH__)
  return __fadd_rn(x, -0.0f);
#else
  return x;
#endif
}
MK_HD double settle_rn(double x) {
#if MK_DEVICE_CODE && defined(__CUDA_ARCH__)
  return __dadd_rn(x, -0.0);
#else
  return x;
#endif
}

// PreMulSum's prologue: an input element times its rank's scalar. Floats
// round the product by itself, so that the rank that scales its own input
// in registers adds exactly the value its peers read back from scratch.
template <typename C>
MK_HD C red_pre(C v, C scale) {
  if constexpr (IsInt<C>::value)
    return red_apply<kRedProd, C>(v, scale);
  else
    return mul_rn(v, scale);
}

// Applied once, by the operation that completes a reduction (avg only).
template <int K, typename C>
MK_HD C red_finalize(C v, int nranks) {
  if constexpr (K == kRedAvg) {
    if constexpr (IsInt<C>::value) {
      return C(v / C(nranks));
    } else {
      return v * (C(1) / C(nranks));
    }
  } else {
    (void)nranks;
    return v;
  }
}

}  // namespace dev
}  // namespace mk
