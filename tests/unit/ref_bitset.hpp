// Test-only: a dense bit matrix (row = op, column = data op), the data
// structure of the reference happens-before closures in ref_sync.cpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace mk::test_ref {

class BitRows {
 public:
  BitRows() = default;
  BitRows(size_t rows, size_t cols) { assign(rows, cols); }
  BitRows(BitRows&&) noexcept = default;
  BitRows& operator=(BitRows&& o) noexcept {
    recycle(std::move(bits_));
    words_ = o.words_;
    bits_ = std::move(o.bits_);
    return *this;
  }
  ~BitRows() { recycle(std::move(bits_)); }
  // Reuses the allocation (large matrices: page faults cost more than the work).
  void assign(size_t rows, size_t cols) {
    words_ = (cols + 63) / 64;
    if (bits_.capacity() < rows * words_) {
      recycle(std::move(bits_));
      bits_ = take(rows * words_);
    }
    bits_.assign(rows * words_, 0);
  }
  size_t rows() const { return words_ ? bits_.size() / words_ : 0; }
  // Appends an all-zero row, returns its index.
  size_t add_row() {
    bits_.resize(bits_.size() + words_, 0);
    return rows() - 1;
  }
  void copy_row(size_t dst, const BitRows& other, size_t src) {
    std::copy(other.bits_.begin() + std::ptrdiff_t(src * words_), other.bits_.begin() + std::ptrdiff_t((src + 1) * words_),
              bits_.begin() + std::ptrdiff_t(dst * words_));
  }
  void set(size_t row, size_t col) { bits_[row * words_ + col / 64] |= uint64_t(1) << (col % 64); }
  bool test(size_t row, size_t col) const {
    return (bits_[row * words_ + col / 64] >> (col % 64)) & 1u;
  }
  void or_into(size_t dst, size_t src) {
    uint64_t* d = &bits_[dst * words_];
    const uint64_t* s = &bits_[src * words_];
    for (size_t i = 0; i < words_; ++i) d[i] |= s[i];
  }
  // row dst |= row src of another matrix with the same column count
  void or_from(size_t dst, const BitRows& other, size_t src) {
    uint64_t* d = &bits_[dst * words_];
    const uint64_t* s = &other.bits_[src * words_];
    for (size_t i = 0; i < words_; ++i) d[i] |= s[i];
  }

 private:
  // Large buffers go back to a per-thread pool instead of to the system, so a
  // compile that builds several closures faults its pages in once.
  static std::vector<std::vector<uint64_t>>& pool() {
    thread_local std::vector<std::vector<uint64_t>> p;
    return p;
  }
  static std::vector<uint64_t> take(size_t n) {
    auto& p = pool();
    for (size_t i = 0; i < p.size(); ++i)
      if (p[i].capacity() >= n) {
        std::vector<uint64_t> v = std::move(p[i]);
        p.erase(p.begin() + std::ptrdiff_t(i));
        return v;
      }
    std::vector<uint64_t> v;
    v.reserve(n);
    return v;
  }
  static void recycle(std::vector<uint64_t>&& v) {
    if (v.capacity() < (1u << 17)) return;  // small ones: let them go
    auto& p = pool();
    if (p.size() >= 8) p.erase(p.begin());
    v.clear();
    p.push_back(std::move(v));
  }

  size_t words_ = 0;
  std::vector<uint64_t> bits_;
};

}  // namespace mk::test_ref
