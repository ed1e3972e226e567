// The LL ("low latency") protocol's primitives. A packet is 8 data bytes and
// two copies of a 32-bit flag in one 16-byte store {data.x, flag, data.y,
// flag}. A 16-byte store is seen whole, so a reader that sees both flags
// equal to the step's value also sees the data: no separate flag, no fence,
// no round trip. Half the bandwidth of the simple protocol.
//
// A tile is processed in 8-byte units; unit u is always thread u % NT's, in
// every op of the kernel (one-pass kernels rely on that: passes/one_pass.cpp).
// X: the kernel's context (kernel.cuh Ctx<P>).
#pragma once
#include "prims.cuh"
#include "sync.cuh"

#if MK_DEVICE_CODE
namespace mk {
namespace dev {

MK_DEV void ll_store(void* packet, V8 data, uint32_t flag) {
  V16 p;
  p.x = data.x;
  p.y = flag;
  p.z = data.y;
  p.w = flag;
  st_volatile16(packet, p);
}

MK_DEV bool ll_ready(const V16& p, uint32_t flag) { return p.y == flag && p.w == flag; }
MK_DEV V8 ll_data(const V16& p) {
  V8 v;
  v.x = p.x;
  v.y = p.z;
  return v;
}

// Unit `unit` (8 bytes, `bytes` of them valid) of a plain buffer.
template <typename T>
MK_DEV V8 unit_load(const T* p, int64_t unit, int bytes) {
  const char* b = reinterpret_cast<const char*>(p) + unit * 8;
  if (bytes == 8 && (uintptr_t(b) & 7) == 0) return ld_cg8(b);
  union {
    V8 v;
    T e[8 / sizeof(T)];
  } u;
  u.v.x = u.v.y = 0;
  const T* q = reinterpret_cast<const T*>(b);
  for (int k = 0; k < bytes / int(sizeof(T)); ++k) u.e[k] = ld_elem(q + k);
  return u.v;
}
template <typename T>
MK_DEV void unit_store(T* p, int64_t unit, int bytes, V8 v) {
  char* b = reinterpret_cast<char*>(p) + unit * 8;
  if (bytes == 8 && (uintptr_t(b) & 7) == 0) {
    st8(b, v);
    return;
  }
  union {
    V8 v;
    T e[8 / sizeof(T)];
  } u;
  u.v = v;
  T* q = reinterpret_cast<T*>(b);
  for (int k = 0; k < bytes / int(sizeof(T)); ++k) st_elem(q + k, u.e[k]);
}

// The destinations of a copy that are its (plain) source: an in-place copy
// stores nothing there. A bit per destination. sll/dll: the op's LL masks.
template <int NS, int ND, bool RED, typename T>
MK_DEV unsigned same_as_source(T* const (&src)[NS], T* const (&dst)[ND], unsigned sll, unsigned dll) {
  unsigned skip = 0;
  if constexpr (!RED) {
#pragma unroll
    for (int d = 0; d < ND; ++d)
      if (!(dll >> d & 1u) && !(sll & 1u) && dst[d] == src[0]) skip |= 1u << d;
  }
  return skip;
}

// Unit `unit` of an LL buffer, once its packet carries this step's flag.
// On a timeout or an abort: zeros, with the block's `aborted` set.
template <class X>
MK_DEV V8 ll_read(X& c, const void* packets, int64_t unit, int32_t source, int32_t op) {
  const char* p = static_cast<const char*>(packets) + unit * 16;
  const uint32_t flag = uint32_t(c.value());
  V16 pk;
  uint64_t t0 = 0;
  if (bounded_spin([&] { return ll_ready(pk = ld_volatile16(p), flag); },
                   [&](uint64_t from) { return c.aborted || c.stop_requested(from); }, &t0))
    return ll_data(pk);
  if (!c.aborted) c.fail(kErrLLTimeout, source, -1, op, 0, flag, globaltimer() - t0);
  V8 z;
  z.x = z.y = 0;
  return z;
}

// One tile of one op: sll/dll are the masks of sources/destinations in LL
// format (constants where the generated code names them, kernel.cuh prim;
// warp-uniform values of a generic op's operands otherwise). Every source's
// load is issued back to back, then the packets not there yet are polled one
// by one.
//
// GEN (a generic op, masks known at run time only): where every plain source
// is 8-byte aligned and the unit whole, each source's load is one
// instruction either way (a packet or 8 plain bytes), so that the loads
// stay in flight together (lamport_tile says why).
template <class X, int NS, int ND, bool RED, bool FINAL, bool GEN = false>
MK_DEV void ll_tile(X& c, typename X::T* const (&src)[NS], typename X::T* const (&dst)[ND], int64_t n, int32_t op,
                    const typename X::Comb::Pro& pro, unsigned sll, unsigned dll) {
  using T = typename X::T;
  constexpr int NT = X::NT;
  // (a copy of a source the prologue scales writes even onto itself)
  const unsigned skip = X::Comb::pre(pro, 0) ? 0u : same_as_source<NS, ND, RED>(src, dst, sll, dll);
  const int64_t nbytes = n * int64_t(sizeof(T));
  const int64_t units = (nbytes + 7) / 8;
  const uint32_t flag = uint32_t(c.value());
  bool aligned = GEN;  // GEN: every plain source 8-byte aligned
  if constexpr (GEN)
#pragma unroll
    for (int s = 0; s < NS; ++s)
      if (!(sll >> s & 1u) && (uintptr_t(src[s]) & 7) != 0) aligned = false;
  for (int64_t u = threadIdx.x; u < units; u += NT) {
    const int bytes = int(min64(8, nbytes - u * 8));
    V8 v[NS];
    V16 pk[NS];
    if (GEN && aligned && bytes == 8) {
#pragma unroll
      for (int s = 0; s < NS; ++s)
        if (sll >> s & 1u)
          pk[s] = ld_volatile16(reinterpret_cast<const char*>(src[s]) + u * 16);
        else
          v[s] = ld_cg8(reinterpret_cast<const char*>(src[s]) + u * 8);
    } else if constexpr (GEN) {  // packets first (one load each, in flight together), then plain sources
#pragma unroll
      for (int s = 0; s < NS; ++s)
        if (sll >> s & 1u) pk[s] = ld_volatile16(reinterpret_cast<const char*>(src[s]) + u * 16);
#pragma unroll
      for (int s = 0; s < NS; ++s)
        if (!(sll >> s & 1u)) v[s] = unit_load(src[s], u, bytes);
    } else {
#pragma unroll
      for (int s = 0; s < NS; ++s)
        if (sll >> s & 1u)
          pk[s] = ld_volatile16(reinterpret_cast<const char*>(src[s]) + u * 16);
        else
          v[s] = unit_load(src[s], u, bytes);
    }
#pragma unroll
    for (int s = 0; s < NS; ++s)
      if (sll >> s & 1u) v[s] = ll_ready(pk[s], flag) ? ll_data(pk[s]) : ll_read(c, src[s], u, s, op);
    if (c.aborted) return;
    V8 r;
    X::Comb::template combine<NS, RED, FINAL, V8, 8 / int(sizeof(T))>(v, r, pro);
#pragma unroll
    for (int d = 0; d < ND; ++d) {
      if (skip >> d & 1u) continue;
      if (dll >> d & 1u)
        ll_store(reinterpret_cast<char*>(dst[d]) + u * 16, r, flag);
      else
        unit_store(dst[d], u, bytes, r);
    }
  }
}

// A wide op (kernel.cuh op_wide): p holds ns sources then nd destinations,
// bit i of `ll` says whether operand i is in LL format.
template <class X, bool RED, bool FINAL>
MK_DEV void ll_wide(X& c, typename X::T* const* p, const uint32_t* ll, int ns, int nd, int64_t n, int32_t op,
                    const typename X::Comb::Pro& pro) {
  const bool scaled0 = X::Comb::pre(pro, 0);  // a copy of a scaled source writes even onto itself
  using T = typename X::T;
  constexpr int NT = X::NT;
  auto bit = [&](int i) { return (ll[i / 32] >> (i % 32)) & 1u; };
  const int64_t nbytes = n * int64_t(sizeof(T));
  const int64_t units = (nbytes + 7) / 8;
  const uint32_t flag = uint32_t(c.value());
  for (int64_t u = threadIdx.x; u < units; u += NT) {
    const int bytes = int(min64(8, nbytes - u * 8));
    V8 r;
    X::Comb::template gather<RED, FINAL, V8, 8 / int(sizeof(T))>(
        ns, [&](int s) { return bit(s) ? ll_read(c, p[s], u, s, op) : unit_load(p[s], u, bytes); }, r, pro);
    if (c.aborted) return;
#pragma unroll 1
    for (int d = ns; d < ns + nd; ++d) {
      if (bit(d))
        ll_store(reinterpret_cast<char*>(p[d]) + u * 16, r, flag);
      else if (RED || scaled0 || bit(0) || p[d] != p[0])
        unit_store(p[d], u, bytes, r);
    }
  }
}

}  // namespace dev
}  // namespace mk
#endif
