// Lamport packets (passes/one_pass.cpp mark_lamport): one-pass kernels of
// float dtypes of at most 4 bytes whose scratch holds the data itself, 16
// data bytes a 16-byte store (LL carries 8). A 32-bit word equal to
// kLamportEmpty (all ones: a NaN in each of those formats) means "nothing
// arrived yet"; scratch is all empty at rest (the arena's scratch starts so,
// runtime/memory/memory.cpp). A writer stores the empty word as 0x7fffffff (each
// element stays NaN, with another payload); a reader polls its 16 bytes until
// no word is empty (each 32-bit word is written whole), takes them, and
// stores the empty words back, so the slot is at rest again when its launch
// ends. No flag, no fence, no second round trip.
//
// A tile is processed in 16-byte units; unit u is always thread u % NT's, in
// every op of the kernel (one pass relies on that). Each thread handles U
// units at a time (P::kLamportUnits, MK_TUNE lamport_units): every load
// issued, then the polls, then the stores.
// X: the kernel's context (kernel.cuh Ctx<P>).
#pragma once
#include "prims.cuh"
#include "prims_ll.cuh"
#include "sync.cuh"

#if MK_DEVICE_CODE
namespace mk {
namespace dev {

constexpr uint32_t kLamportEmpty = 0xffffffffu;

MK_DEV bool lamport_ready(const V16& p) {
  return p.x != kLamportEmpty && p.y != kLamportEmpty && p.z != kLamportEmpty && p.w != kLamportEmpty;
}
MK_DEV uint32_t lamport_word(uint32_t w) { return w == kLamportEmpty ? 0x7fffffffu : w; }
MK_DEV void lamport_store(void* packet, V16 v) {
  v.x = lamport_word(v.x);
  v.y = lamport_word(v.y);
  v.z = lamport_word(v.z);
  v.w = lamport_word(v.w);
  st_volatile16(packet, v);
}
MK_DEV void lamport_reset(void* packet) {
  V16 e;
  e.x = e.y = e.z = e.w = kLamportEmpty;
  st_volatile16(packet, e);
}

// Unit `unit` (16 bytes, `bytes` of them valid) of a plain buffer: as two of
// LL's 8-byte units where it is short or misaligned.
template <typename T>
MK_DEV V16 unit16_load(const T* p, int64_t unit, int bytes) {
  const char* b = reinterpret_cast<const char*>(p) + unit * 16;
  if (bytes == 16 && (uintptr_t(b) & 15) == 0) return ld_cg16(b);
  const V8 lo = unit_load(p, 2 * unit, bytes < 8 ? bytes : 8);
  const V8 hi = unit_load(p, 2 * unit + 1, bytes > 8 ? bytes - 8 : 0);
  V16 v;
  v.x = lo.x;
  v.y = lo.y;
  v.z = hi.x;
  v.w = hi.y;
  return v;
}
template <typename T>
MK_DEV void unit16_store(T* p, int64_t unit, int bytes, V16 v) {
  char* b = reinterpret_cast<char*>(p) + unit * 16;
  if (bytes == 16 && (uintptr_t(b) & 15) == 0) {
    st16(b, v);
    return;
  }
  V8 lo, hi;
  lo.x = v.x;
  lo.y = v.y;
  hi.x = v.z;
  hi.y = v.w;
  unit_store(p, 2 * unit, bytes < 8 ? bytes : 8, lo);
  if (bytes > 8) unit_store(p, 2 * unit + 1, bytes - 8, hi);
}

// The packet at `p` once no word of it is empty. On a timeout or an abort:
// zeros, with the block's `aborted` set.
template <class X>
MK_DEV V16 lamport_read(X& c, const void* p, int32_t source, int32_t op) {
  V16 pk;
  uint64_t t0 = 0;
  if (bounded_spin([&] { return lamport_ready(pk = ld_volatile16(p)); },
                   [&](uint64_t from) { return c.aborted || c.stop_requested(from); }, &t0))
    return pk;
  if (!c.aborted) c.fail(kErrLLTimeout, source, -1, op, 0, 0, globaltimer() - t0);
  V16 z;
  z.x = z.y = z.z = z.w = 0;
  return z;
}

// One tile of one op: sll/dll are the masks of sources/destinations that are
// scratch (Lamport packets): constants where the generated code names them
// (kernel.cuh prim), warp-uniform values of a generic op's operands (GEN)
// otherwise. A generic op reads its plain sources like packets, with the
// same 16-byte load, wherever they are aligned and the unit is whole: a
// load per source chosen at run time put a branch between each two loads,
// so they were no longer in flight together (20-25% slower on the one-GPU
// proxy, s22); then only the polls and resets look at the mask.
template <class X, int NS, int ND, bool RED, bool FINAL, bool GEN = false>
MK_DEV void lamport_tile(X& c, typename X::T* const (&src)[NS], typename X::T* const (&dst)[ND], int64_t n,
                         int32_t op, const typename X::Comb::Pro& pro, unsigned sll, unsigned dll) {
  using T = typename X::T;
  constexpr int NT = X::NT;
  // units in flight per thread: P::kLamportUnits, fewer with more sources (registers)
  constexpr int U = NS <= 2 ? (X::Plan::kLamportUnits < 4 ? X::Plan::kLamportUnits : 4)
                    : NS <= 4 ? (X::Plan::kLamportUnits < 2 ? X::Plan::kLamportUnits : 2)
                              : 1;
  // (a copy of a source the prologue scales writes even onto itself)
  const unsigned skip = X::Comb::pre(pro, 0) ? 0u : same_as_source<NS, ND, RED>(src, dst, sll, dll);
  const int64_t nbytes = n * int64_t(sizeof(T));
  const int64_t units = (nbytes + 15) / 16;
  bool aligned = GEN;  // GEN: every plain source 16-byte aligned
  if constexpr (GEN)
#pragma unroll
    for (int s = 0; s < NS; ++s)
      if (!(sll >> s & 1u) && (uintptr_t(src[s]) & 15) != 0) aligned = false;
  for (int64_t u0 = threadIdx.x; u0 < units; u0 += int64_t(U) * NT) {
    V16 v[U][NS];
#pragma unroll
    for (int k = 0; k < U; ++k) {
      const int64_t u = u0 + int64_t(k) * NT;
      if (u >= units) break;
      const int bytes = int(min64(16, nbytes - u * 16));
      if (GEN && aligned && bytes == 16) {
#pragma unroll
        for (int s = 0; s < NS; ++s) v[k][s] = ld_volatile16(reinterpret_cast<const char*>(src[s]) + u * 16);
        continue;
      }
      if constexpr (GEN) {  // packets first (one load each, in flight together), then plain sources
#pragma unroll
        for (int s = 0; s < NS; ++s)
          if (sll >> s & 1u) v[k][s] = ld_volatile16(reinterpret_cast<const char*>(src[s]) + u * 16);
#pragma unroll
        for (int s = 0; s < NS; ++s)
          if (!(sll >> s & 1u)) v[k][s] = unit16_load(src[s], u, bytes);
      } else {
#pragma unroll
        for (int s = 0; s < NS; ++s)
          v[k][s] = (sll >> s & 1u) ? ld_volatile16(reinterpret_cast<const char*>(src[s]) + u * 16)
                                    : unit16_load(src[s], u, bytes);
      }
    }
#pragma unroll
    for (int k = 0; k < U; ++k) {
      const int64_t u = u0 + int64_t(k) * NT;
      if (u >= units) break;
#pragma unroll
      for (int s = 0; s < NS; ++s)
        if ((sll >> s & 1u) && !lamport_ready(v[k][s]))
          v[k][s] = lamport_read(c, reinterpret_cast<const char*>(src[s]) + u * 16, s, op);
    }
    if (c.aborted) return;
#pragma unroll
    for (int k = 0; k < U; ++k) {
      const int64_t u = u0 + int64_t(k) * NT;
      if (u >= units) break;
      const int bytes = int(min64(16, nbytes - u * 16));
#pragma unroll
      for (int s = 0; s < NS; ++s)
        if (sll >> s & 1u) lamport_reset(reinterpret_cast<char*>(src[s]) + u * 16);
      V16 r;
      X::Comb::template combine<NS, RED, FINAL, V16, 16 / int(sizeof(T))>(v[k], r, pro);
#pragma unroll
      for (int d = 0; d < ND; ++d) {
        if (skip >> d & 1u) continue;
        if (dll >> d & 1u)
          lamport_store(reinterpret_cast<char*>(dst[d]) + u * 16, r);
        else
          unit16_store(dst[d], u, bytes, r);
      }
    }
  }
}

}  // namespace dev
}  // namespace mk
#endif
