// Memory access primitives (device only). Loads of data another thread block
// or GPU may have written go through L2 (.cg), never a possibly stale L1
// line; flags use acquire/release at system scope (peers write over NVLink).
#pragma once
#include "common.cuh"

#if MK_DEVICE_CODE
namespace mk {
namespace dev {

struct alignas(16) V16 {
  uint32_t x, y, z, w;
};
struct alignas(8) V8 {
  uint32_t x, y;
};

MK_DEV V16 ld_cg16(const void* p) {
  V16 v;
  asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
MK_DEV void st16(void* p, V16 v) {
  asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
}
MK_DEV V16 ld_volatile16(const void* p) {
  V16 v;
  asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
MK_DEV void st_volatile16(void* p, V16 v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}
MK_DEV V8 ld_cg8(const void* p) {
  V8 v;
  asm volatile("ld.global.cg.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
MK_DEV void st8(void* p, V8 v) {
  asm volatile("st.global.v2.u32 [%0], {%1,%2};" ::"l"(p), "r"(v.x), "r"(v.y) : "memory");
}
MK_DEV uint8_t ld_cg_byte(const void* p) {
  uint16_t v;
  asm volatile("ld.global.cg.u8 %0, [%1];" : "=h"(v) : "l"(p));
  return uint8_t(v);
}
MK_DEV void st_byte(void* p, uint8_t b) {
  asm volatile("st.global.u8 [%0], %1;" ::"l"(p), "h"(uint16_t(b)) : "memory");
}

// Up to 8 bytes at any alignment (the tail of a chunk, or a misaligned buffer).
MK_DEV V8 ld_bytes8(const void* p, int bytes) {
  if (bytes == 8 && (uintptr_t(p) & 7) == 0) return ld_cg8(p);
  uint8_t b[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < bytes; ++i) b[i] = ld_cg_byte(static_cast<const uint8_t*>(p) + i);
  V8 v;
  v.x = uint32_t(b[0]) | uint32_t(b[1]) << 8 | uint32_t(b[2]) << 16 | uint32_t(b[3]) << 24;
  v.y = uint32_t(b[4]) | uint32_t(b[5]) << 8 | uint32_t(b[6]) << 16 | uint32_t(b[7]) << 24;
  return v;
}
MK_DEV void st_bytes8(void* p, V8 v, int bytes) {
  if (bytes == 8 && (uintptr_t(p) & 7) == 0) {
    st8(p, v);
    return;
  }
  for (int i = 0; i < bytes; ++i) {
    uint32_t w = i < 4 ? v.x : v.y;
    st_byte(static_cast<uint8_t*>(p) + i, uint8_t(w >> (8 * (i & 3))));
  }
}

MK_DEV uint64_t ld_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
MK_DEV void st_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
MK_DEV uint32_t ld_volatile_u32(const volatile uint32_t* p) { return *p; }
// Programmatic dependent launch (sm_90+): wait until the previous grid of
// this stream has completed and its memory is visible. A no-op before sm_90
// and when the kernel was launched without the attribute.
MK_DEV void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
MK_DEV uint64_t globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

}  // namespace dev
}  // namespace mk
#endif
