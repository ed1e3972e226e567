// FlatMap: a hash map from 64-bit keys to 32-bit values in flat arrays (open
// addressing, linear probing), for the verifier's per-chunk tables: with a
// million entries std::unordered_map's node per entry cost most of a proof's
// time at 1024 ranks. Insert and look up only; no erase.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace mk::verify {

class FlatMap {
 public:
  // The value under `key`, storing `value` there first when the key is
  // absent; second: whether it was stored now.
  std::pair<uint32_t, bool> try_emplace(uint64_t key, uint32_t value) {
    if ((size_ + 1) * 4 > keys_.size() * 3) grow();
    size_t i = slot(key);
    if (used_[i]) return {vals_[i], false};
    used_[i] = 1;
    keys_[i] = key;
    vals_[i] = value;
    ++size_;
    return {value, true};
  }
  // The value under `key`, or null.
  const uint32_t* find(uint64_t key) const {
    if (keys_.empty()) return nullptr;
    size_t i = slot(key);
    return used_[i] ? &vals_[i] : nullptr;
  }
  size_t size() const { return size_; }

 private:
  static uint64_t mix(uint64_t x) {  // splitmix64's finaliser
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  }
  // Where `key` is, or the free slot where it would go.
  size_t slot(uint64_t key) const {
    const size_t mask = keys_.size() - 1;
    size_t i = size_t(mix(key)) & mask;
    while (used_[i] && keys_[i] != key) i = (i + 1) & mask;
    return i;
  }
  void grow() {
    std::vector<uint64_t> keys = std::move(keys_);
    std::vector<uint32_t> vals = std::move(vals_);
    std::vector<uint8_t> used = std::move(used_);
    const size_t cap = keys.empty() ? 16 : keys.size() * 2;
    keys_.assign(cap, 0);
    vals_.assign(cap, 0);
    used_.assign(cap, 0);
    for (size_t i = 0; i < keys.size(); ++i)
      if (used[i]) {
        const size_t j = slot(keys[i]);
        used_[j] = 1;
        keys_[j] = keys[i];
        vals_[j] = vals[i];
      }
  }

  std::vector<uint64_t> keys_;
  std::vector<uint32_t> vals_;
  std::vector<uint8_t> used_;
  size_t size_ = 0;
};

}  // namespace mk::verify
