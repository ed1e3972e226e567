// A stable counting sort for the compiler's flat tables: items keyed by an op
// index or a rank, millions of them at 1024 ranks, where one global sort was a
// large part of a pass.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "mk/error.hpp"

namespace mk {

// Items 0..count-1 in order of their key (0..keys-1), equal keys in item
// order; at[k]..at[k + 1] is key k's run in `order`.
struct KeyOrder {
  std::vector<uint32_t> order;
  std::vector<size_t> at;  // keys + 1 offsets
};

template <class KeyOf>
KeyOrder order_by_key(size_t keys, size_t count, KeyOf key_of) {
  MK_CHECK(count < (size_t(1) << 32), "order_by_key: too many items");
  KeyOrder o;
  o.at.assign(keys + 1, 0);
  for (size_t i = 0; i < count; ++i) ++o.at[size_t(key_of(i)) + 1];
  for (size_t k = 0; k < keys; ++k) o.at[k + 1] += o.at[k];
  o.order.resize(count);
  std::vector<size_t> fill(o.at.begin(), o.at.end() - 1);
  for (size_t i = 0; i < count; ++i) o.order[fill[size_t(key_of(i))]++] = uint32_t(i);
  return o;
}

}  // namespace mk
