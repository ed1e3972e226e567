// ir::SmallVec (compiler/ir/small_vec.hpp), the storage of an op's refs and
// positions: every operation the compiler uses, in random sequences, against
// std::vector, across the switch between in-place and heap storage.
#include <doctest/doctest.h>

#include <random>
#include <vector>

#include "compiler/ir/ir.hpp"

using mk::ir::SmallVec;

namespace {

template <class T, size_t N, class Make>
void against_vector(Make make, uint32_t seed) {
  std::mt19937 rng(seed);
  SmallVec<T, N> a;
  std::vector<T> b;
  auto same = [&] {
    REQUIRE(a.size() == b.size());
    CHECK(a.empty() == b.empty());
    CHECK(a.capacity() >= a.size());
    CHECK(std::equal(a.begin(), a.end(), b.begin(), b.end()));
    CHECK(a.vec() == b);
  };
  for (int step = 0; step < 3000; ++step) {
    const int what = int(rng() % 12);
    const T v = make(rng());
    switch (what) {
      case 0:
      case 1:
        a.push_back(v);
        b.push_back(v);
        break;
      case 2:
        if (!b.empty()) {
          a.pop_back();
          b.pop_back();
        }
        break;
      case 3: {
        const size_t at = b.empty() ? 0 : rng() % (b.size() + 1);
        a.insert(a.begin() + at, v);
        b.insert(b.begin() + std::ptrdiff_t(at), v);
        break;
      }
      case 4:
        if (!b.empty()) {
          const size_t at = rng() % b.size();
          a.erase(a.begin() + at);
          b.erase(b.begin() + std::ptrdiff_t(at));
        }
        break;
      case 5: {
        const size_t n = rng() % 6;
        if (!b.empty() && rng() % 2) {  // the fill value is one of its own elements
          a.resize(n + b.size(), a[0]);
          b.resize(n + b.size(), b[0]);
        } else {
          a.resize(n, v);
          b.resize(n, v);
        }
        break;
      }
      case 6: {  // a copy, then the original changed: independent
        SmallVec<T, N> c = a;
        std::vector<T> d = b;
        c.push_back(v);
        d.push_back(v);
        CHECK(std::equal(c.begin(), c.end(), d.begin(), d.end()));
        same();
        a = c;
        b = d;
        break;
      }
      case 7: {  // moved: the source is left empty and usable
        SmallVec<T, N> c = std::move(a);
        a = SmallVec<T, N>();
        CHECK(a.empty());
        a.push_back(v);
        a = std::move(c);
        break;
      }
      case 8:
        if (!b.empty()) {  // self-aliasing: insert its own element, and a range of itself
          a.insert(a.begin(), a.back());
          b.insert(b.begin(), b.back());
          a.insert(a.end(), a.begin(), a.begin() + 1);
          b.insert(b.end(), b.begin(), b.begin() + 1);
        }
        break;
      case 9:
        if (b.size() > 2) {  // erase a range
          a.erase(a.begin() + 1, a.end() - 1);
          b.erase(b.begin() + 1, b.end() - 1);
        }
        break;
      case 10:
        if (rng() % 8 == 0) {
          a.clear();
          b.clear();
        }
        break;
      case 11: {  // assign from a std::vector, and a range
        if (!b.empty() && rng() % 3 == 0) {  // assign(n, own element)
          const size_t n = 1 + rng() % 4;
          const T keep = b.back();
          a.assign(n, a.back());
          b.assign(n, keep);
          break;
        }
        std::vector<T> src(rng() % 5, v);
        a = SmallVec<T, N>(src);
        b = src;
        if (!src.empty()) {
          a.assign(src.begin(), src.begin() + 1);
          b.assign(src.begin(), src.begin() + 1);
        }
        break;
      }
    }
    same();
    if (!b.empty()) {
      CHECK(a.front() == b.front());
      CHECK(a.back() == b.back());
      CHECK(a.at(b.size() - 1) == b.back());
    }
    CHECK_THROWS_AS((void)a.at(b.size()), std::out_of_range);
  }
}

}  // namespace

TEST_CASE("ir::SmallVec behaves as std::vector: refs (one in place) and positions (two in place)") {
  for (uint32_t seed : {1u, 2u, 3u}) {
    against_vector<mk::ir::Ref, 1>(
        [](uint32_t x) {
          return mk::ir::Ref{int32_t(x % 7), mk::ir::Buf(x % 3), int32_t(x % 97), int32_t(1 + x % 4)};
        },
        seed);
    against_vector<int32_t, 2>([](uint32_t x) { return int32_t(x % 1000) - 500; }, seed);
  }
}

TEST_CASE("ir::SmallVec: in place up to N, then on the heap: equality, initializer lists") {
  SmallVec<int32_t, 2> p{4, 5};
  CHECK(p.capacity() == 2);
  p.push_back(6);
  CHECK(p.capacity() > 2);
  CHECK(p == SmallVec<int32_t, 2>{4, 5, 6});
  CHECK(!(p == SmallVec<int32_t, 2>{4, 5}));
  p = {7};
  CHECK(p.size() == 1);
  CHECK(p[0] == 7);
  mk::ir::Op op;
  op.srcs = {mk::ir::Ref{1, mk::ir::Buf::input, 2, 1}};
  op.dsts = {mk::ir::Ref{1, mk::ir::Buf::output, 3, 1}};
  op.pos = {0};
  const mk::ir::Op copy = op;  // no heap block for one ref and one position
  CHECK(copy.srcs.capacity() == 1);
  CHECK(copy.pos.capacity() == 2);
  CHECK(copy.srcs == op.srcs);
  CHECK(copy.count() == 1);
}
