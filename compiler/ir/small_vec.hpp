// mk::ir::SmallVec: a vector of trivially copyable values that keeps up to N
// of them in place. An op's refs and chunk positions are mostly one or two
// values; as std::vectors each was a heap block, and a 1024-rank schedule has
// millions of data ops, copied from pass to pass (a third of the compiler's
// memory and much of its time in malloc). The interface is the part of
// std::vector the compiler uses.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <new>
#include <stdexcept>
#include <type_traits>
#include <vector>

namespace mk::ir {

template <class T, size_t N>
class SmallVec {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>);
  static_assert(N >= 1);

 public:
  using value_type = T;
  using size_type = size_t;
  using iterator = T*;
  using const_iterator = const T*;
  using reference = T&;
  using const_reference = const T&;

  SmallVec() = default;
  SmallVec(std::initializer_list<T> v) { assign(v.begin(), v.end()); }
  template <class It, class = std::enable_if_t<std::is_base_of_v<
                                    std::forward_iterator_tag, typename std::iterator_traits<It>::iterator_category>>>
  SmallVec(It first, It last) {
    assign(first, last);
  }
  explicit SmallVec(size_t n, const T& v = T()) { resize(n, v); }
  SmallVec(const std::vector<T>& v) { assign(v.begin(), v.end()); }  // NOLINT: from the std form
  SmallVec(const SmallVec& o) { assign(o.begin(), o.end()); }
  SmallVec(SmallVec&& o) noexcept { take(o); }
  SmallVec& operator=(const SmallVec& o) {
    if (this != &o) assign(o.begin(), o.end());
    return *this;
  }
  SmallVec& operator=(SmallVec&& o) noexcept {
    if (this != &o) {
      release();
      take(o);
    }
    return *this;
  }
  SmallVec& operator=(std::initializer_list<T> v) {
    assign(v.begin(), v.end());
    return *this;
  }
  ~SmallVec() { release(); }

  template <class It>
  void assign(It first, It last) {
    const size_t n = size_t(std::distance(first, last));
    clear();
    reserve(n);
    std::copy(first, last, data());
    size_ = uint32_t(n);
  }

  void assign(size_t n, const T& v) {
    const T copy = v;  // v may live in this vector
    clear();
    resize(n, copy);
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  size_t capacity() const { return cap_; }
  T* data() { return cap_ > N ? u_.heap : reinterpret_cast<T*>(u_.inl); }
  const T* data() const { return cap_ > N ? u_.heap : reinterpret_cast<const T*>(u_.inl); }
  T* begin() { return data(); }
  T* end() { return data() + size_; }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size_; }
  const T* cbegin() const { return begin(); }
  const T* cend() const { return end(); }
  std::reverse_iterator<T*> rbegin() { return std::reverse_iterator<T*>(end()); }
  std::reverse_iterator<T*> rend() { return std::reverse_iterator<T*>(begin()); }
  std::reverse_iterator<const T*> rbegin() const { return std::reverse_iterator<const T*>(end()); }
  std::reverse_iterator<const T*> rend() const { return std::reverse_iterator<const T*>(begin()); }
  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }
  T& at(size_t i) {
    if (i >= size_) throw std::out_of_range("SmallVec::at");
    return data()[i];
  }
  const T& at(size_t i) const {
    if (i >= size_) throw std::out_of_range("SmallVec::at");
    return data()[i];
  }
  T& front() { return data()[0]; }
  const T& front() const { return data()[0]; }
  T& back() { return data()[size_ - 1]; }
  const T& back() const { return data()[size_ - 1]; }

  void reserve(size_t n) {
    if (n <= cap_) return;
    if (n > UINT32_MAX) throw std::length_error("SmallVec::reserve");
    const size_t cap = std::min<size_t>(std::max(n, size_t(cap_) * 2), UINT32_MAX);
    T* p = static_cast<T*>(::operator new(cap * sizeof(T)));
    const uint32_t n0 = size_;
    if (n0) std::memcpy(static_cast<void*>(p), data(), n0 * sizeof(T));
    release();
    u_.heap = p;
    cap_ = uint32_t(cap);
    size_ = n0;
  }
  void push_back(const T& v) {
    if (size_ == cap_) {
      const T copy = v;  // v may live in this vector
      reserve(size_t(cap_) + 1);
      data()[size_++] = copy;
      return;
    }
    data()[size_++] = v;
  }
  template <class... A>
  T& emplace_back(A&&... a) {
    push_back(T{std::forward<A>(a)...});
    return back();
  }
  void pop_back() { --size_; }
  void clear() { size_ = 0; }
  void resize(size_t n, const T& v = T()) {
    const T copy = v;  // v may live in this vector, which reserve moves
    reserve(n);
    if (n > size_) std::fill_n(data() + size_, n - size_, copy);
    size_ = uint32_t(n);
  }
  T* insert(const T* pos, const T& v) {
    const size_t at = size_t(pos - data());
    const T copy = v;
    reserve(size_t(size_) + 1);
    T* d = data();
    std::memmove(static_cast<void*>(d + at + 1), d + at, (size_ - at) * sizeof(T));
    d[at] = copy;
    ++size_;
    return d + at;
  }
  template <class It, class = typename std::iterator_traits<It>::iterator_category>
  T* insert(const T* pos, It first, It last) {
    const size_t at = size_t(pos - data());
    const std::vector<T> add(first, last);  // may alias this vector
    reserve(size_ + add.size());
    T* d = data();
    std::memmove(static_cast<void*>(d + at + add.size()), d + at, (size_ - at) * sizeof(T));
    std::copy(add.begin(), add.end(), d + at);
    size_ += uint32_t(add.size());
    return d + at;
  }
  T* erase(const T* pos) { return erase(pos, pos + 1); }
  T* erase(const T* first, const T* last) {
    T* d = data();
    const size_t a = size_t(first - d), b = size_t(last - d);
    std::memmove(static_cast<void*>(d + a), d + b, (size_ - b) * sizeof(T));
    size_ -= uint32_t(b - a);
    return d + a;
  }

  std::vector<T> vec() const { return std::vector<T>(begin(), end()); }
  bool operator==(const SmallVec& o) const { return std::equal(begin(), end(), o.begin(), o.end()); }

 private:
  void release() {
    if (cap_ > N) ::operator delete(u_.heap);
    cap_ = N;
    size_ = 0;
  }
  void take(SmallVec& o) {
    u_ = o.u_;  // in place or a pointer: both are bytes here
    size_ = o.size_;
    cap_ = o.cap_;
    o.cap_ = N;
    o.size_ = 0;
  }
  union U {
    T* heap;
    alignas(T) unsigned char inl[N * sizeof(T)];
  } u_{};
  uint32_t size_ = 0;
  uint32_t cap_ = N;
};

}  // namespace mk::ir
