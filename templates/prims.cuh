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

// Combining sources: T the element type, K the reduction (reduce.cuh), N the
// rank count (avg's divisor).
template <typename T, int K, int N>
struct Combine {
  using C = typename Compute<T>::type;

  // out := load(0) op load(1) op ... op load(ns - 1), left to right in the
  // compute type, finalised if FINAL. NS > 0: that many sources, unrolled;
  // NS == 0: `ns` sources in a loop (wide ops). Both fold in the same order,
  // so a reduce gives the same bits on either path.
  template <int NS, bool FINAL, typename V, int E, typename Load>
  MK_DEV static void fold(int ns, Load load, V& out) {
    union U {
      V v;
      T e[E];
    };
    U u;
    u.v = load(0);
    C acc[E];
#pragma unroll
    for (int i = 0; i < E; ++i) acc[i] = Compute<T>::load(u.e[i]);
    auto add = [&](int s) {
      U w;
      w.v = load(s);
#pragma unroll
      for (int i = 0; i < E; ++i) acc[i] = red_apply<K, C>(acc[i], Compute<T>::load(w.e[i]));
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

  // NS sources in registers: a copy's one as it is, a reduce's folded.
  template <int NS, bool RED, bool FINAL, typename V, int E>
  MK_DEV static void combine(const V (&v)[NS], V& out) {
    if constexpr (!RED)
      out = v[0];
    else
      fold<NS, FINAL, V, E>(NS, [&](int s) { return v[s]; }, out);
  }

  // `ns` sources from a loader: the wide ops' form of combine.
  template <bool RED, bool FINAL, typename V, int E, typename Load>
  MK_DEV static void gather(int ns, Load load, V& out) {
    if constexpr (RED)
      fold<0, FINAL, V, E>(ns, load, out);
    else
      out = load(0);
  }
};

}  // namespace dev
}  // namespace mk
#endif
