// The simple protocol's primitives: plain 16-byte loads and stores (through
// L2) over a tile; a flag per dependency (kernel.cuh) says the data is there.
//
// X: the kernel's context type (kernel.cuh Ctx<P>): T, NT (threads), VE
// (elements per 16 bytes), Comb (prims.cuh Combine) and the plan traits P
// (kLoads, kPipeline).
#pragma once
#include "prims.cuh"

#if MK_DEVICE_CODE
namespace mk {
namespace dev {

// Batches of UU vectors per thread from vector i (this thread's next) while
// a whole batch lies below `end` (a multiple of UU x NT): all of a batch's
// loads are issued before its stores. `skip`: destinations not written.
template <class X, int NS, int ND, bool RED, bool FINAL, int UU>
MK_DEV void simple_batches(typename X::T* const (&src)[NS], typename X::T* const (&dst)[ND], unsigned skip,
                           int64_t& i, int64_t end, const typename X::Comb::Pro& pro) {
  constexpr int NT = X::NT, VE = X::VE;
  for (; i < end; i += int64_t(UU) * NT) {
    V16 a[UU][NS];
#pragma unroll
    for (int u = 0; u < UU; ++u)
#pragma unroll
      for (int s = 0; s < NS; ++s) a[u][s] = ld_cg16(src[s] + (i + int64_t(u) * NT) * VE);
#pragma unroll
    for (int u = 0; u < UU; ++u) {
      V16 r;
      X::Comb::template combine<NS, RED, FINAL, V16, VE>(a[u], r, pro);
#pragma unroll
      for (int d = 0; d < ND; ++d)
        if (!(skip >> d & 1u)) st16(dst[d] + (i + int64_t(u) * NT) * VE, r);
    }
  }
}

// dst[d][0..n) := combine(src[0][0..n), ..., src[NS-1][0..n)).
//
// The streaming loop: each thread keeps P::kLoads 16-byte loads in flight
// (over all sources: U = kLoads / NS vectors of each), issued as a batch,
// then combines and stores them. With P::kPipeline the next batch's loads
// are issued before this batch's stores (twice the registers). The source
// order is the memory order: loads and stores may alias (in-place), so the
// compiler keeps them as written. A copy onto its own source (in-place)
// writes nothing there, unless the prologue scales that source.
template <class X, int NS, int ND, bool RED, bool FINAL>
MK_DEV void simple_tile(typename X::T* const (&src)[NS], typename X::T* const (&dst)[ND], int64_t n,
                        const typename X::Comb::Pro& pro) {
  using T = typename X::T;
  using P = typename X::Plan;
  constexpr int NT = X::NT, VE = X::VE;
  unsigned skip = 0;
  if constexpr (!RED) {
#pragma unroll
    for (int d = 0; d < ND; ++d)
      if (dst[d] == src[0] && !X::Comb::pre(pro, 0)) skip |= 1u << d;
    if (skip == (1u << ND) - 1u) return;
  }
  uintptr_t bits = 0;
#pragma unroll
  for (int s = 0; s < NS; ++s) bits |= uintptr_t(src[s]);
#pragma unroll
  for (int d = 0; d < ND; ++d) bits |= uintptr_t(dst[d]);
  const int64_t nvec = (bits & 15) == 0 ? n / VE : 0;
  constexpr int U = P::kLoads / NS > 0 ? P::kLoads / NS : 1;
  constexpr int64_t B = int64_t(U) * NT;  // vectors per batch of the block
  auto load = [&](V16 (&v)[U][NS], int64_t at) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int s = 0; s < NS; ++s) v[u][s] = ld_cg16(src[s] + (at + int64_t(u) * NT) * VE);
  };
  auto store = [&](const V16 (&v)[U][NS], int64_t at) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      V16 r;
      X::Comb::template combine<NS, RED, FINAL, V16, VE>(v[u], r, pro);
#pragma unroll
      for (int d = 0; d < ND; ++d)
        if (!(skip >> d & 1u)) st16(dst[d] + (at + int64_t(u) * NT) * VE, r);
    }
  };
  int64_t i = threadIdx.x;
  const int64_t full = nvec / B * B;  // vectors in whole batches
  if constexpr (P::kPipeline) {
    if (i < full) {
      V16 a[U][NS], b[U][NS];
      load(a, i);
      for (;;) {
        const bool more = i + B < full;  // (batches are whole: i + B < full iff the next one is)
        if (more) load(b, i + B);
        store(a, i);
        i += B;
        if (!more) break;
        const bool again = i + B < full;
        if (again) load(a, i + B);
        store(b, i);
        i += B;
        if (!again) break;
      }
    }
  } else {
    simple_batches<X, NS, ND, RED, FINAL, U>(src, dst, skip, i, full, pro);
  }
  // What is left is less than a batch (a whole tile when tiles are smaller
  // than one): in batches of a quarter as many vectors, then one at a time,
  // so that small tiles too keep several loads in flight.
  constexpr int U4 = U / 4 > 0 ? U / 4 : 1;
  simple_batches<X, NS, ND, RED, FINAL, U4>(src, dst, skip, i, nvec / (int64_t(U4) * NT) * (int64_t(U4) * NT), pro);
  simple_batches<X, NS, ND, RED, FINAL, 1>(src, dst, skip, i, nvec, pro);
  for (int64_t e = nvec * VE + threadIdx.x; e < n; e += NT) {
    T v[NS];
#pragma unroll
    for (int s = 0; s < NS; ++s) v[s] = ld_elem(src[s] + e);
    T r;
    X::Comb::template combine<NS, RED, FINAL, T, 1>(v, r, pro);
#pragma unroll
    for (int d = 0; d < ND; ++d)
      if (!(skip >> d & 1u)) st_elem(dst[d] + e, r);
  }
}

// A wide op (kernel.cuh op_wide): p holds ns sources then nd destinations.
template <class X, bool RED, bool FINAL>
MK_DEV void simple_wide(typename X::T* const* p, int ns, int nd, int64_t n, const typename X::Comb::Pro& pro) {
  const bool scaled0 = X::Comb::pre(pro, 0);  // a copy of a scaled source writes even onto itself
  using T = typename X::T;
  constexpr int NT = X::NT, VE = X::VE;
  uintptr_t bits = 0;
#pragma unroll 1
  for (int k = 0; k < ns + nd; ++k) bits |= uintptr_t(p[k]);
  const int64_t nvec = (bits & 15) == 0 ? n / VE : 0;
  for (int64_t i = threadIdx.x; i < nvec; i += NT) {
    V16 r;
    X::Comb::template gather<RED, FINAL, V16, VE>(ns, [&](int s) { return ld_cg16(p[s] + i * VE); }, r, pro);
#pragma unroll 1
    for (int d = ns; d < ns + nd; ++d)
      if (RED || scaled0 || p[d] != p[0]) st16(p[d] + i * VE, r);
  }
  for (int64_t e = nvec * VE + threadIdx.x; e < n; e += NT) {
    T r;
    X::Comb::template gather<RED, FINAL, T, 1>(ns, [&](int s) { return ld_elem(p[s] + e); }, r, pro);
#pragma unroll 1
    for (int d = ns; d < ns + nd; ++d)
      if (RED || scaled0 || p[d] != p[0]) st_elem(p[d] + e, r);
  }
}

}  // namespace dev
}  // namespace mk
#endif
