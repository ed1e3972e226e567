#include "compiler/verify/clocks.hpp"

namespace mk::verify {

namespace {

template <class T>
inline void join_loop(T* __restrict dst, const T* __restrict src, size_t w) {
  for (size_t i = 0; i < w; i += 16)
    for (size_t k = 0; k < 16; ++k) dst[i + k] = dst[i + k] < src[i + k] ? src[i + k] : dst[i + k];
}

}  // namespace

__attribute__((target_clones("avx2", "default"))) void join_clocks(int16_t* dst, const int16_t* src, size_t w) {
  join_loop(dst, src, w);
}

__attribute__((target_clones("avx2", "default"))) void join_clocks(int32_t* dst, const int32_t* src, size_t w) {
  join_loop(dst, src, w);
}

}  // namespace mk::verify
