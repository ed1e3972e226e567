// Float64 references of the built-in fusions (schedules/fused/), written
// independently of their epilogue code, and the data the tests feed them:
// the CPU unit tests and the GPU suite compare with these.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "compiler/verify/typed.hpp"
#include "mk/types.hpp"

namespace mk::verify::fused {

// A value in [-1, 1) that differs per (seed, tag, index), as the dtype holds it.
inline double value(uint64_t seed, uint64_t tag, int64_t i, DType t) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull ^ (tag + 1) * 0xbf58476d1ce4e5b9ull ^ uint64_t(i) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  x *= 0xd6e8feb86659fd39ull;
  x ^= x >> 29;
  const double v = double(x >> 11) / double(1ull << 53) * 2.0 - 1.0;
  return dispatch_dtype(t, [&]<typename T>() { return Typed<T>::to_double(Typed<T>::from_double(v)); });
}

// Host bytes <-> doubles of dtype t.
inline std::vector<char> encode(const std::vector<double>& v, DType t) {
  std::vector<char> out(v.size() * dtype_size(t));
  dispatch_dtype(t, [&]<typename T>() {
    for (size_t i = 0; i < v.size(); ++i) {
      const T x = Typed<T>::from_double(v[i]);
      std::memcpy(out.data() + i * sizeof(T), &x, sizeof(T));
    }
    return 0;
  });
  return out;
}
inline std::vector<double> decode(const std::vector<char>& b, DType t) {
  std::vector<double> out(b.size() / dtype_size(t));
  dispatch_dtype(t, [&]<typename T>() {
    for (size_t i = 0; i < out.size(); ++i) {
      T x;
      std::memcpy(&x, b.data() + i * sizeof(T), sizeof(T));
      out[i] = Typed<T>::to_double(x);
    }
    return 0;
  });
  return out;
}

// Unit roundoff of the stored dtype.
inline double eps(DType t) {
  switch (t) {
    case DType::bf16: return std::ldexp(1.0, -8);
    case DType::fp16: return std::ldexp(1.0, -11);
    case DType::fp32: return std::ldexp(1.0, -24);
    case DType::fp8e4m3: return std::ldexp(1.0, -4);
    default: return std::ldexp(1.0, -53);
  }
}

// What one rank's fused all-reduce + RMSNorm should give: `ar` the exact
// all-reduce (sum over ranks, in double) and `mag` its magnitude bound
// (sum over ranks of |x|, what the all-reduce's own rounding scales with).
struct RmsNormRef {
  std::vector<double> out, residual_out;
  std::vector<double> out_tol, residual_out_tol;
};
inline RmsNormRef rmsnorm(const std::vector<double>& ar, const std::vector<double>& mag,
                          const std::vector<double>& residual, const std::vector<double>& weight, double eps_v,
                          int64_t row, DType t) {
  const int64_t count = int64_t(ar.size());
  RmsNormRef r;
  r.out.resize(size_t(count));
  r.residual_out.resize(size_t(count));
  r.out_tol.resize(size_t(count));
  r.residual_out_tol.resize(size_t(count));
  const double u = eps(t);
  for (int64_t base = 0; base < count; base += row) {
    double ss = 0;
    for (int64_t j = 0; j < row; ++j) {
      const double v = ar[size_t(base + j)] + residual[size_t(base + j)];
      r.residual_out[size_t(base + j)] = v;
      ss += v * v;
    }
    const double inv = 1.0 / std::sqrt(ss / double(row) + eps_v);
    for (int64_t j = 0; j < row; ++j) {
      const size_t i = size_t(base + j);
      const double w = weight[size_t(j)];
      r.out[i] = r.residual_out[i] * inv * w;
      // the all-reduce's rounding (per hop: n ranks' partial sums stored in
      // the dtype), the residual add's and the output's, a few ulps each
      const double err_ro = 4 * u * (mag[i] + std::fabs(residual[i]) + std::fabs(r.residual_out[i]));
      r.residual_out_tol[i] = err_ro + 1e-30;
      // plus the sum of squares' accumulation in the compute type (float):
      // at most about `row` roundings of it, halved by the square root
      r.out_tol[i] = (4 * u + double(row) * std::ldexp(1.0, -24) / 2) * std::fabs(r.out[i]) +
                     2 * err_ro * inv * std::fabs(w) + 1e-30;
    }
  }
  return r;
}

// All-reduce + e4m3 quantisation with per-row scales: scale = amax/448.
struct Fp8Ref {
  std::vector<double> q, scales;
  std::vector<double> q_tol, scale_tol;
};
inline Fp8Ref fp8_rows(const std::vector<double>& ar, const std::vector<double>& mag, int64_t row, DType t) {
  const int64_t count = int64_t(ar.size());
  Fp8Ref r;
  r.q.resize(size_t(count));
  r.q_tol.resize(size_t(count));
  const double u = eps(t);
  for (int64_t base = 0; base < count; base += row) {
    double amax = 0, magmax = 0;
    for (int64_t j = 0; j < row; ++j) {
      amax = std::max(amax, std::fabs(ar[size_t(base + j)]));
      magmax = std::max(magmax, mag[size_t(base + j)]);
    }
    const double tiny = double(std::ldexp(1.0f, -126));  // the smallest normal float
    const double scale = amax > 0 ? std::max(amax / 448.0, tiny) : 1.0;
    r.scales.push_back(scale);
    // the device's amax is of the all-reduce as rounded to the dtype
    r.scale_tol.push_back(4 * u * magmax / 448.0 + 1e-30);
    for (int64_t j = 0; j < row; ++j) {
      const size_t i = size_t(base + j);
      r.q[i] = ar[i] / scale;
      // half an e4m3 ulp (relative 2^-4; absolute 2^-10 among subnormals), plus
      // what the all-reduce's and the scale's rounding move the quotient by
      r.q_tol[i] = std::fabs(r.q[i]) * (eps(DType::fp8e4m3) * 1.01) + std::ldexp(1.0, -10) +
                   (4 * u * mag[i] + std::fabs(ar[i]) * r.scale_tol.back() / scale) / scale * 1.01;
    }
  }
  return r;
}

// The first element where got and want differ by more than tol, or "".
inline std::string first_bad(const std::vector<double>& got, const std::vector<double>& want,
                             const std::vector<double>& tol, const char* what) {
  for (size_t i = 0; i < want.size(); ++i)
    if (!(std::fabs(got[i] - want[i]) <= tol[i]))
      return std::string(what) + "[" + std::to_string(i) + "]: got " + std::to_string(got[i]) + " want " +
             std::to_string(want[i]) + " (tol " + std::to_string(tol[i]) + ")";
  return {};
}

}  // namespace mk::verify::fused
