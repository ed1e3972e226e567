// Host-side helpers to dispatch on DType / RedOp at run time and to convert
// elements to and from double (through the device conversion routines).
#pragma once

#include "mk/types.hpp"
#include "templates/reduce.cuh"

namespace mk::verify {

template <typename T>
struct Typed {
  static constexpr bool is_int = mk::dev::IsInt<T>::value;
  static double to_double(T v) {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || is_int)
      return double(v);
    else
      return double(mk::dev::to_float(v));
  }
  static T from_double(double v) {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || is_int)
      return T(v);
    else
      return mk::dev::from_float<T>(float(v));
  }
};

template <typename F>
decltype(auto) dispatch_dtype(DType t, F&& f) {
  using namespace mk::dev;
  switch (t) {
    case DType::int8: return f.template operator()<int8_t>();
    case DType::uint8: return f.template operator()<uint8_t>();
    case DType::int32: return f.template operator()<int32_t>();
    case DType::uint32: return f.template operator()<uint32_t>();
    case DType::int64: return f.template operator()<int64_t>();
    case DType::uint64: return f.template operator()<uint64_t>();
    case DType::fp16: return f.template operator()<f16>();
    case DType::fp32: return f.template operator()<float>();
    case DType::fp64: return f.template operator()<double>();
    case DType::bf16: return f.template operator()<bf16>();
    case DType::fp8e4m3: return f.template operator()<f8e4m3>();
    case DType::fp8e5m2: return f.template operator()<f8e5m2>();
  }
  return f.template operator()<float>();
}

template <typename F>
decltype(auto) dispatch_red(RedOp op, F&& f) {
  using namespace mk::dev;
  switch (op) {
    case RedOp::sum: return f.template operator()<kRedSum>();
    case RedOp::prod: return f.template operator()<kRedProd>();
    case RedOp::max: return f.template operator()<kRedMax>();
    case RedOp::min: return f.template operator()<kRedMin>();
    case RedOp::avg: return f.template operator()<kRedAvg>();
    case RedOp::premulsum: return f.template operator()<kRedPreMulSum>();
  }
  return f.template operator()<kRedSum>();
}

}  // namespace mk::verify
