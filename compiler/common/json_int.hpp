// Whether a JSON integer fits the C++ integer type a field is read into
// (4294967298 must not silently become 2 in an int32_t).
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>

namespace mk {

template <typename T>
bool json_int_fits(const nlohmann::json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>() <= uint64_t(std::numeric_limits<T>::max());
  const int64_t x = v.get<int64_t>();
  return x >= int64_t(std::numeric_limits<T>::min()) && (x <= 0 || uint64_t(x) <= uint64_t(std::numeric_limits<T>::max()));
}

}  // namespace mk
