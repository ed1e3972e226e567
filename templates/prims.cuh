// What every protocol's primitives share: element loads and stores that go
// through L2 (data another block or GPU wrote), and the one way sources are
// combined (left to right in the compute type, finalised by the op that
// completes a reduction), so every path gives the same bits.
#pragma once
#include "dtype.cuh"
#include "epilogue.cuh"
#include "reduce.cuh"
#include "vec.cuh"

#if MK_DEVICE_CODE
namespace mk {
namespace dev {

template <typename T>
MK_DEV T ld_elem(const T* p) {
  static_assert(sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8,
                "element size must be 1, 2, 4 or 8 bytes");
  if constexpr (sizeof(T) == 1) {
    uint16_t v;
    asm volatile("ld.global.cg.u8 %0, [%1];" : "=h"(v) : "l"(p));
    return bitcast<T>(uint8_t(v));
  } else if constexpr (sizeof(T) == 2) {
    uint16_t v;
    asm volatile("ld.global.cg.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return bitcast<T>(v);
  } else if constexpr (sizeof(T) == 4) {
    uint32_t v;
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return bitcast<T>(v);
  } else {
    uint64_t v;
    asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(v) : "l"(p));
    return bitcast<T>(v);
  }
}

template <typename T>
MK_DEV void st_elem(T* p, T x) {
  if constexpr (sizeof(T) == 1) {
    asm volatile("st.global.u8 [%0], %1;" ::"l"(p), "h"(uint16_t(bitcast<uint8_t>(x))) : "memory");
  } else if constexpr (sizeof(T) == 2) {
    asm volatile("st.global.u16 [%0], %1;" ::"l"(p), "h"(bitcast<uint16_t>(x)) : "memory");
  } else if constexpr (sizeof(T) == 4) {
    asm volatile("st.global.u32 [%0], %1;" ::"l"(p), "r"(bitcast<uint32_t>(x)) : "memory");
  } else {
    asm volatile("st.global.u64 [%0], %1;" ::"l"(p), "l"(bitcast<uint64_t>(x)) : "memory");
  }
}

// PreMulSum's prologue (reduce.cuh red_pre): the sources of an op that are
// this rank's own input are multiplied by the rank's scalar as they are
// loaded, before anything else uses them; every other source (scratch,
// output) holds values that were scaled where they were read from an input.
// `mask`: bit s for source s of an op of few operands; `wide`: bit s of
// wide[s / 32] for a wide op (kernel.cuh op_wide), else null. Kernels of
// other ops never read it.
//
// A fusion's prologue (include/mk/fusion.hpp MK_PROLOGUE) takes the same
// path: U::Fn::in(p, x) instead of the scalar product, with the call's
// scalars (Args::epi_scalars) in `s`; the struct is also the `q` the
// user's code sees (q.scalar(k), q.abs(x), q.rsqrt(x), Q::C).
template <typename CT>
struct Prologue {
  using C = CT;
  C scale;
  uint32_t mask;
  const uint32_t* wide;
  C s[4];
  MK_DEV bool on(int i) const { return wide ? ((wide[i >> 5] >> (i & 31)) & 1u) != 0 : ((mask >> i) & 1u) != 0; }
  MK_DEV C scalar(int k) const { return unsigned(k) < 4u ? s[k] : C(0); }  // undeclared: 0
  MK_DEV C abs(C x) const { return x < C(0) ? -x : x; }
  MK_DEV C rsqrt(C x) const {
    if constexpr (sizeof(C) == 8)
      return ::rsqrt(x);
    else
      return ::rsqrtf(x);
  }
};

// The prologue of a fusion, or none (the generated plan traits' P::Pre).
struct NoPre {
  static constexpr bool kOn = false;
};
template <class U>
struct UserPre {
  static constexpr bool kOn = true;
  using Fn = U;
};
// P::Pre, or NoPre for plan traits generated before prologues existed (a
// plan from MK_PLAN_DIR whose source a group kernel recompiles).
template <class...>
struct VoidOf {
  using type = void;
};
template <class P, class = void>
struct PreOf {
  using type = NoPre;
};
template <class P>
struct PreOf<P, typename VoidOf<typename P::Pre>::type> {
  using type = typename P::Pre;
};

// Combining sources: T the element type, K the reduction (reduce.cuh), N the
// rank count (avg's divisor), U the fusion's prologue (NoPre, UserPre<Pro>).
template <typename T, int K, int N, class U = NoPre>
struct Combine {
  using C = typename Compute<T>::type;
  using Pro = Prologue<C>;
  static constexpr bool kUser = U::kOn;
  static_assert(!(kUser && K == kRedPreMulSum), "a PreMulSum kernel runs no fusion prologue");
  static constexpr bool kPre = K == kRedPreMulSum || kUser;

  // Whether source s gets the prologue (never outside PreMulSum kernels).
  MK_DEV static bool pre(const Pro& p, int s) {
    if constexpr (kPre)
      return p.on(s);
    else
      return false;
  }
  // Source s's factor: the scalar where the prologue applies, else 1. Chosen
  // once per source and always multiplied (x * 1 is x, bit for bit), so that
  // the element loops have no branch per source: NVVM would otherwise
  // unswitch them into 2^sources copies (NVRTC took minutes for 10 sources).
  MK_DEV static C factor(const Pro& p, int s) {
    if constexpr (K == kRedPreMulSum)
      return p.on(s) ? p.scale : C(1);
    else
      return C(1);
  }
  // A source in the compute type; through the prologue, rounded to the dtype
  // as a copy of it into scratch would store it, so every rank adds the very
  // same terms whichever rank scaled them (bit-identical results). A fusion's
  // prologue (`on`: this source is this rank's input) is computed for every
  // source and selected, so that the element loops have no branch per
  // source either.
  MK_DEV static C in(T v, C f, bool on, const Pro& p) {
    if constexpr (K == kRedPreMulSum) {
      return rounded(red_pre<C>(Compute<T>::load(v), f));
    } else if constexpr (kUser) {
      const C x = Compute<T>::load(v);
      const C y = rounded(settle_rn(U::Fn::in(p, x)));
      return on ? y : x;
    } else {
      return Compute<T>::load(v);
    }
  }
  MK_DEV static C rounded(C x) {
    if constexpr (sizeof(T) == 1 && !IsInt<T>::value)
      return rounded_fp8(x);
    else
      return Compute<T>::load(Compute<T>::store(x));  // the identity where C is T
  }
  // Called, not inlined: fp8's conversions are long (see scaled below).
  __device__ __noinline__ static C rounded_fp8(C x) { return Compute<T>::load(Compute<T>::store(x)); }

  // out := load(0) op load(1) op ... op load(ns - 1), left to right in the
  // compute type (each source through the prologue), finalised if FINAL.
  // NS > 0: that many sources, unrolled; NS == 0: `ns` sources in a loop
  // (wide ops). Both fold in the same order, so a reduce gives the same bits
  // on either path.
  template <int NS, bool FINAL, typename V, int E, typename Load>
  MK_DEV static void fold(int ns, Load load, V& out, const Pro& p) {
    union W {
      V v;
      T e[E];
    };
    W u;
    u.v = load(0);
    C acc[E];
    const C f0 = factor(p, 0);
    const bool on0 = pre(p, 0);
#pragma unroll
    for (int i = 0; i < E; ++i) acc[i] = in(u.e[i], f0, on0, p);
    auto add = [&](int s) {
      W w;
      w.v = load(s);
      const C f = factor(p, s);
      const bool on = pre(p, s);
#pragma unroll
      for (int i = 0; i < E; ++i) acc[i] = red_apply<K, C>(acc[i], in(w.e[i], f, on, p));
    };
    if constexpr (NS > 0) {
#pragma unroll
      for (int s = 1; s < NS; ++s) add(s);
    } else {
      // never unrolled, even where NVVM propagates a constant `ns` into a wide op
#pragma unroll 1
      for (int s = 1; s < ns; ++s) add(s);
    }
#pragma unroll
    for (int i = 0; i < E; ++i) {
      C x = acc[i];
      if constexpr (FINAL) x = NoEpilogue::apply(red_finalize<K, C>(x, N));
      u.e[i] = Compute<T>::store(x);
    }
    out = u.v;
  }

  // A copy's source: as it is, or through the prologue.
  template <typename V, int E>
  MK_DEV static void pass(const V& v, V& out, const Pro& p) {
    if (!pre(p, 0)) {
      out = v;
      return;
    }
    out = scaled<V, E>(v, p);
  }
  // Called, not inlined: the conversions back into a narrow dtype (fp8's
  // are long) inlined into every unrolled copy made NVRTC take minutes.
  template <typename V, int E>
  __device__ __noinline__ static V scaled(V v, const Pro& p) {
    union W {
      V v;
      T e[E];
    };
    W u;
    u.v = v;
#pragma unroll
    for (int i = 0; i < E; ++i) u.e[i] = Compute<T>::store(in(u.e[i], p.scale, true, p));
    return u.v;
  }

  // NS sources in registers: a copy's one as it is (or scaled), a reduce's folded.
  template <int NS, bool RED, bool FINAL, typename V, int E>
  MK_DEV static void combine(const V (&v)[NS], V& out, const Pro& p) {
    if constexpr (!RED)
      pass<V, E>(v[0], out, p);
    else
      fold<NS, FINAL, V, E>(NS, [&](int s) { return v[s]; }, out, p);
  }

  // `ns` sources from a loader: the wide ops' form of combine.
  template <bool RED, bool FINAL, typename V, int E, typename Load>
  MK_DEV static void gather(int ns, Load load, V& out, const Pro& p) {
    if constexpr (RED)
      fold<0, FINAL, V, E>(ns, load, out, p);
    else
      pass<V, E>(load(0), out, p);
  }
};

}  // namespace dev
}  // namespace mk
#endif
