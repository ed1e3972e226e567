// Basic definitions shared by device code (NVRTC) and host code (the CPU
// executor compiles the same headers as plain C++).
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define MK_DEVICE_CODE 1
#define MK_HD __host__ __device__ __forceinline__
#define MK_DEV __device__ __forceinline__
#else
#define MK_DEVICE_CODE 0
#define MK_HD inline
#define MK_DEV inline
#endif

#if defined(__CUDACC_RTC__)
// NVRTC has no C library headers; the few fixed-width types we need.
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
typedef unsigned long long uintptr_t;
#else
#include <cstdint>
#include <cstring>
#endif

namespace mk {
namespace dev {

template <typename To, typename From>
MK_HD To bitcast(const From& v) {
  static_assert(sizeof(To) == sizeof(From), "bitcast needs types of equal size");
#if MK_DEVICE_CODE
  union {
    From f;
    To t;
  } u;
  u.f = v;
  return u.t;
#else
  To t;
  std::memcpy(&t, &v, sizeof(To));
  return t;
#endif
}

MK_HD int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
MK_HD int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }
MK_HD int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
MK_HD int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

}  // namespace dev
}  // namespace mk
