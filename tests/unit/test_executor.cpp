// The CPU reference executor (compiler/verify/executor) and the reference it
// checks against (compiler/verify/reference).
//
//  1. The reference is right: results computed here independently (wrapping
//     integer arithmetic, float64 sums, element conversions decoded from the
//     bit patterns by code written here) are accepted, and slightly wrong ones
//     rejected.
//  2. The executor agrees with the reference for every dtype and op, counts
//     0, 1, 7, odd and multi-tile (forced small tiles), in place and out of
//     place, rooted collectives with every root, several launches.
//  3. The executor is not a no-op: broken lowered schedules give wrong results
//     or a simulated deadlock.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "compiler/pipeline.hpp"
#include "compiler/verify/executor.hpp"
#include "compiler/verify/reference.hpp"
#include "compiler/verify/typed.hpp"
#include "compiler/verify/verify.hpp"
#include "mk/dsl.hpp"
#include "support.hpp"
#include "templates/dtype.cuh"

using namespace mk;
using mkt::catch_error;
using mkt::contains;

namespace {

// ---- independent element decoding (from the bit layouts, not templates/) ----

double ldexp_d(double m, int e) { return std::ldexp(m, e); }

// Decodes an IEEE-like binary float with `eb` exponent and `mb` mantissa bits.
// `fn`: e4m3 "finite" flavour (no inf; only all-ones mantissa at the top
// exponent is NaN).
double decode_float(uint32_t bits, int eb, int mb, bool fn) {
  const int bias = (1 << (eb - 1)) - 1;
  const uint32_t sign = (bits >> (eb + mb)) & 1u;
  const uint32_t e = (bits >> mb) & ((1u << eb) - 1u);
  const uint32_t m = bits & ((1u << mb) - 1u);
  double v;
  if (e == (1u << eb) - 1u && !fn) {
    v = m == 0 ? INFINITY : NAN;
  } else if (e == (1u << eb) - 1u && fn && m == (1u << mb) - 1u) {
    v = NAN;
  } else if (e == 0) {
    v = ldexp_d(double(m), 1 - bias - mb);
  } else {
    v = ldexp_d(double(m + (1u << mb)), int(e) - bias - mb);
  }
  return sign ? -v : v;
}

double decode(DType t, const uint8_t* p) {
  switch (t) {
    case DType::int8: return double(*reinterpret_cast<const int8_t*>(p));
    case DType::uint8: return double(*p);
    case DType::int32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return double(v);
    }
    case DType::uint32: {
      uint32_t v;
      std::memcpy(&v, p, 4);
      return double(v);
    }
    case DType::int64: {
      int64_t v;
      std::memcpy(&v, p, 8);
      return double(v);
    }
    case DType::uint64: {
      uint64_t v;
      std::memcpy(&v, p, 8);
      return double(v);
    }
    case DType::fp16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      return decode_float(b, 5, 10, false);
    }
    case DType::bf16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      return decode_float(b, 8, 7, false);
    }
    case DType::fp32: {
      float f;
      std::memcpy(&f, p, 4);
      return double(f);
    }
    case DType::fp64: {
      double d;
      std::memcpy(&d, p, 8);
      return d;
    }
    case DType::fp8e4m3: return decode_float(*p, 4, 3, true);
    case DType::fp8e5m2: return decode_float(*p, 5, 2, false);
  }
  return NAN;
}

struct Narrow {
  DType t;
  int eb, mb;
  bool fn;
  int bits;
};
const Narrow kNarrow[] = {{DType::fp16, 5, 10, false, 16},
                          {DType::bf16, 8, 7, false, 16},
                          {DType::fp8e4m3, 4, 3, true, 8},
                          {DType::fp8e5m2, 5, 2, false, 8}};

// Round-to-nearest-even by search over every finite code (independent of the
// bit tricks in templates/dtype.cuh). `sat`: overflow gives the largest finite
// value (fp8) instead of infinity (fp16, bf16).
uint32_t encode_nearest(const Narrow& n, double x, bool sat) {
  static std::map<int, std::vector<std::pair<double, uint32_t>>> tables;  // positive finite codes, sorted
  auto& tab = tables[int(n.t)];
  if (tab.empty()) {
    const uint32_t half = 1u << (n.bits - 1);
    for (uint32_t c = 0; c < half; ++c) {
      double v = decode_float(c, n.eb, n.mb, n.fn);
      if (std::isfinite(v)) tab.push_back({v, c});
    }
    std::sort(tab.begin(), tab.end());
  }
  const uint32_t sign = std::signbit(x) ? 1u << (n.bits - 1) : 0u;
  const double a = std::fabs(x);
  const auto& top = tab.back();
  if (a >= top.first) {
    // beyond the largest finite value: it rounds to inf once past max + ulp/2
    const double ulp = top.first - tab[tab.size() - 2].first;
    if (sat || a < top.first + ulp / 2) return sign | top.second;
    return sign | (((1u << n.eb) - 1u) << n.mb);  // inf
  }
  auto it = std::lower_bound(tab.begin(), tab.end(), std::make_pair(a, 0u));
  if (it->first == a) return sign | it->second;
  auto lo = it - 1;
  const double dlo = a - lo->first, dhi = it->first - a;
  if (dlo < dhi) return sign | lo->second;
  if (dhi < dlo) return sign | it->second;
  return sign | ((lo->second & 1u) == 0 ? lo->second : it->second);  // tie: even mantissa
}

std::vector<uint8_t> input_of(const verify::DataSpec& d, int rank, int64_t n) {
  std::vector<uint8_t> v(size_t(n) * dtype_size(d.dtype));
  verify::fill_input(d, rank, 0, n, v.data());
  return v;
}

template <typename T>
T elem(const std::vector<uint8_t>& v, int64_t i) {
  T x;
  std::memcpy(&x, v.data() + size_t(i) * sizeof(T), sizeof(T));
  return x;
}

template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

verify::CheckResult check(Collective c, const verify::DataSpec& d, int n, int root, int64_t count, int rank,
                          const std::vector<uint8_t>& out) {
  return verify::check_output(c, d, n, root, count, rank, out.data(), int64_t(out.size() / dtype_size(d.dtype)));
}

}  // namespace

// ---- 1. the reference ----------------------------------------------------------

TEST_CASE("reference: element conversions match an independent decoder for every code") {
  for (const auto& n : kNarrow) {
    CAPTURE(name(n.t));
    int bad = 0;
    for (uint32_t c = 0; c < (1u << n.bits); ++c) {
      double mine = decode_float(c, n.eb, n.mb, n.fn);
      double theirs = 0;
      if (n.t == DType::fp16) theirs = dev::to_float(dev::f16{uint16_t(c)});
      if (n.t == DType::bf16) theirs = dev::to_float(dev::bf16{uint16_t(c)});
      if (n.t == DType::fp8e4m3) theirs = dev::to_float(dev::f8e4m3{uint8_t(c)});
      if (n.t == DType::fp8e5m2) theirs = dev::to_float(dev::f8e5m2{uint8_t(c)});
      bool same = (std::isnan(mine) && std::isnan(theirs)) || mine == theirs;
      if (!same && bad++ < 5) FAIL_CHECK("code " << c << ": decoded " << mine << ", templates say " << theirs);
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("reference: float -> narrow conversions round to nearest even (fp8 saturates)") {
  std::mt19937_64 rng(7);
  for (const auto& n : kNarrow) {
    CAPTURE(name(n.t));
    const bool sat = n.t == DType::fp8e4m3 || n.t == DType::fp8e5m2;
    std::vector<float> xs = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, 3.0f, 448.0f, 464.0f, 480.0f, 1e6f, -1e6f,
                             57344.0f, 61440.0f, 65504.0f, 65519.0f, 65520.0f, 1e-3f, 1e-6f, 3e-5f, -2.5e-3f};
    // every midpoint between neighbouring codes, and just around it
    for (uint32_t c = 0; c + 1 < (1u << (n.bits - 1)); c += (n.bits == 16 ? 37 : 1)) {
      double a = decode_float(c, n.eb, n.mb, n.fn), b = decode_float(c + 1, n.eb, n.mb, n.fn);
      if (!std::isfinite(a) || !std::isfinite(b)) continue;
      float mid = float((a + b) / 2);
      xs.push_back(mid);
      xs.push_back(std::nextafter(mid, 0.0f));
      xs.push_back(std::nextafter(mid, INFINITY));
      xs.push_back(-mid);
    }
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    for (int i = 0; i < 20000; ++i) xs.push_back(u(rng) * std::ldexp(1.0f, int(rng() % 40) - 30));
    int bad = 0;
    for (float x : xs) {
      if (n.t == DType::bf16 && std::fabs(x) < 1e-30f) continue;  // bf16 subnormals: float subnormal inputs
      uint32_t want = encode_nearest(n, double(x), sat);
      uint32_t got = 0;
      if (n.t == DType::fp16) got = dev::from_float<dev::f16>(x).bits;
      if (n.t == DType::bf16) got = dev::from_float<dev::bf16>(x).bits;
      if (n.t == DType::fp8e4m3) got = dev::from_float<dev::f8e4m3>(x).bits;
      if (n.t == DType::fp8e5m2) got = dev::from_float<dev::f8e5m2>(x).bits;
      // -0 and +0 both fine for values that round to zero
      if (got != want && !(decode_float(got, n.eb, n.mb, n.fn) == 0 && decode_float(want, n.eb, n.mb, n.fn) == 0))
        if (bad++ < 5) FAIL_CHECK("x=" << x << " (" << std::hexfloat << x << std::defaultfloat << "): got code " << got
                                        << " want " << want);
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("reference: test data differ per rank, element, launch and seed, and are never all zero") {
  for (DType t : all_dtypes()) {
    for (RedOp op : {RedOp::sum, RedOp::prod}) {
      CAPTURE(name(t));
      CAPTURE(name(op));
      verify::DataSpec d{t, op, 3, 0};
      const int64_t n = 256;
      auto a = input_of(d, 0, n), b = input_of(d, 1, n);
      auto a_again = input_of(d, 0, n);
      CHECK(a == a_again);  // deterministic
      CHECK(a != b);
      d.launch = 1;
      CHECK(input_of(d, 0, n) != a);
      d.launch = 0;
      d.seed = 4;
      CHECK(input_of(d, 0, n) != a);
      d.seed = 3;
      // partial fills agree with full fills (tools regenerate slices)
      std::vector<uint8_t> part(size_t(10) * dtype_size(t));
      verify::fill_input(d, 0, 100, 10, part.data());
      CHECK(std::equal(part.begin(), part.end(), a.begin() + 100 * std::ptrdiff_t(dtype_size(t))));
      int zeros = 0, distinct_pairs = 0;
      std::vector<double> vals;
      for (int64_t i = 0; i < n; ++i) {
        double x = decode(t, a.data() + size_t(i) * dtype_size(t));
        double y = decode(t, b.data() + size_t(i) * dtype_size(t));
        zeros += x == 0;
        distinct_pairs += x != y;
        vals.push_back(x);
        CHECK(std::isfinite(x));
        if (dtype_is_float(t) && op == RedOp::sum) CHECK(std::fabs(x) <= 1.0);
        if (dtype_is_float(t) && op == RedOp::prod)
          CHECK((std::fabs(x) == 1.0 || std::fabs(x) == 2.0 || std::fabs(x) == 0.5));
      }
      std::sort(vals.begin(), vals.end());
      const auto uniq = std::unique(vals.begin(), vals.end()) - vals.begin();
      CHECK(zeros < n / 8);
      if (dtype_is_float(t) && op == RedOp::prod) {
        // by design: +-1, and +-2 or +-0.5 at every 8th (rank + element)
        CHECK(uniq == 6);
        CHECK(distinct_pairs > n / 4);
      } else {
        CHECK(distinct_pairs > n / 2);
        CHECK(uniq > (dtype_size(t) == 1 ? 16 : 100));
      }
    }
  }
}

TEST_CASE("reference: int32 sum over 2 ranks, computed by hand") {
  const verify::DataSpec d{DType::int32, RedOp::sum, 11, 0};
  const int64_t count = 64;
  auto a = input_of(d, 0, count), b = input_of(d, 1, count);
  std::vector<int32_t> want(count);
  int wraps = 0;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t exact = int64_t(elem<int32_t>(a, i)) + elem<int32_t>(b, i);
    want[size_t(i)] = int32_t(uint32_t(elem<int32_t>(a, i)) + uint32_t(elem<int32_t>(b, i)));  // wraps, as NCCL
    wraps += exact != want[size_t(i)];
  }
  CHECK(wraps > 0);  // random 32-bit values overflow often: the test exercises wrapping
  for (int rank : {0, 1}) {
    auto r = check(Collective::allreduce, d, 2, 0, count, rank, bytes_of(want));
    CHECK(r.mismatches == 0);
    CHECK(r.max_err == 0);
  }
  auto off = want;
  off[17] += 1;
  auto r = check(Collective::allreduce, d, 2, 0, count, 1, bytes_of(off));
  CHECK(r.mismatches == 1);
  CHECK(contains(r.first_bad, "rank 1 element 17"));
  // a saturating sum is not what NCCL computes
  auto sat = want;
  int changed = 0;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t exact = int64_t(elem<int32_t>(a, i)) + elem<int32_t>(b, i);
    if (exact != want[size_t(i)]) {
      sat[size_t(i)] = exact > 0 ? INT32_MAX : INT32_MIN;
      ++changed;
    }
  }
  CHECK(check(Collective::allreduce, d, 2, 0, count, 0, bytes_of(sat)).mismatches == changed);
}

TEST_CASE("reference: integer ops wrap, avg truncates toward zero, min/max exact") {
  const int64_t count = 200;
  const int n = 3;
  auto run = [&](DType t, RedOp op, auto tag) {
    using T = decltype(tag);
    using U = std::make_unsigned_t<T>;
    CAPTURE(name(t));
    CAPTURE(name(op));
    const verify::DataSpec d{t, op, 5, 1};
    std::vector<std::vector<uint8_t>> in;
    for (int q = 0; q < n; ++q) in.push_back(input_of(d, q, count));
    std::vector<T> want(count);
    int negative_avg_inexact = 0;
    for (int64_t i = 0; i < count; ++i) {
      U acc = U(elem<T>(in[0], i));
      T best = elem<T>(in[0], i);
      for (int q = 1; q < n; ++q) {
        T x = elem<T>(in[size_t(q)], i);
        if (op == RedOp::prod)
          acc = U(acc * U(x));
        else
          acc = U(acc + U(x));
        best = op == RedOp::max ? std::max(best, x) : std::min(best, x);
      }
      T v = T(acc);
      if (op == RedOp::avg) {
        // C++ integer division truncates toward zero
        T q = T(v / T(n));
        negative_avg_inexact += v < 0 && v % T(n) != 0;
        v = q;
      }
      if (op == RedOp::max || op == RedOp::min) v = best;
      want[size_t(i)] = v;
    }
    for (int rank = 0; rank < n; ++rank) CHECK(check(Collective::allreduce, d, n, 0, count, rank, bytes_of(want)).mismatches == 0);
    if (op == RedOp::avg && std::is_signed_v<T>) {
      CHECK(negative_avg_inexact > 0);
      // flooring (rounding toward -inf) would be wrong for those elements
      auto floor_div = want;
      for (int64_t i = 0; i < count; ++i) {
        U acc = 0;
        for (int q = 0; q < n; ++q) acc = U(acc + U(elem<T>(in[size_t(q)], i)));
        T v = T(acc);
        if (v < 0 && v % T(n) != 0) floor_div[size_t(i)] = T(v / T(n) - 1);
      }
      CHECK(check(Collective::allreduce, d, n, 0, count, 0, bytes_of(floor_div)).mismatches == negative_avg_inexact);
    }
    auto wrong = want;
    wrong[5] = T(wrong[5] ^ T(1));
    CHECK(check(Collective::allreduce, d, n, 0, count, 2, bytes_of(wrong)).mismatches == 1);
  };
  for (RedOp op : all_redops()) {
    run(DType::int8, op, int8_t{});
    run(DType::uint8, op, uint8_t{});
    run(DType::int32, op, int32_t{});
    run(DType::uint32, op, uint32_t{});
    run(DType::int64, op, int64_t{});
    run(DType::uint64, op, uint64_t{});
  }
}

TEST_CASE("reference: float ops in float64 with a tolerance that rejects real errors") {
  const int64_t count = 128;
  for (const Narrow& nw : kNarrow) {
    for (RedOp op : all_redops()) {
      for (int n : {2, 5}) {
        CAPTURE(name(nw.t));
        CAPTURE(name(op));
        CAPTURE(n);
        const verify::DataSpec d{nw.t, op, 9, 0};
        const size_t es = dtype_size(nw.t);
        std::vector<std::vector<uint8_t>> in;
        for (int q = 0; q < n; ++q) in.push_back(input_of(d, q, count));
        std::vector<uint8_t> out(size_t(count) * es), bad(out.size());
        int wrong_expected = 0;
        for (int64_t i = 0; i < count; ++i) {
          double acc = decode(nw.t, in[0].data() + size_t(i) * es);
          double mag = std::fabs(acc);
          for (int q = 1; q < n; ++q) {
            double x = decode(nw.t, in[size_t(q)].data() + size_t(i) * es);
            mag += std::fabs(x);
            if (op == RedOp::sum || op == RedOp::avg) acc += x;
            if (op == RedOp::prod) acc *= x;
            if (op == RedOp::max) acc = std::max(acc, x);
            if (op == RedOp::min) acc = std::min(acc, x);
          }
          if (op == RedOp::avg) acc /= n;
          const bool sat = nw.t == DType::fp8e4m3 || nw.t == DType::fp8e5m2;
          uint32_t code = encode_nearest(nw, acc, sat);
          std::memcpy(out.data() + size_t(i) * es, &code, es);  // little endian: low bytes
          // a clearly wrong value: off by more than twice the magnitude of the inputs
          uint32_t wrong = encode_nearest(nw, acc + 2 * mag + 1, sat);
          std::memcpy(bad.data() + size_t(i) * es, &wrong, es);
          ++wrong_expected;
        }
        auto r = check(Collective::allreduce, d, n, 0, count, 0, out);
        CHECK_MESSAGE(r.mismatches == 0, r.first_bad);
        CHECK(check(Collective::allreduce, d, n, 0, count, 0, bad).mismatches == wrong_expected);
      }
    }
  }
  // fp32/fp64: exact-ish results accepted, one part in 1e3 rejected, NaN rejected
  for (DType t : {DType::fp32, DType::fp64}) {
    CAPTURE(name(t));
    const verify::DataSpec d{t, RedOp::sum, 2, 0};
    const int n = 4;
    std::vector<double> exact(count, 0.0);
    for (int q = 0; q < n; ++q) {
      auto v = input_of(d, q, count);
      for (int64_t i = 0; i < count; ++i) exact[size_t(i)] += decode(t, v.data() + size_t(i) * dtype_size(t));
    }
    auto pack = [&](const std::vector<double>& v) {
      if (t == DType::fp64) return bytes_of(v);
      std::vector<float> f(v.begin(), v.end());
      return bytes_of(f);
    };
    CHECK(check(Collective::allreduce, d, n, 0, count, 3, pack(exact)).mismatches == 0);
    auto off = exact;
    off[3] += 1e-3 * std::max(1.0, std::fabs(off[3]));
    CHECK(check(Collective::allreduce, d, n, 0, count, 3, pack(off)).mismatches == 1);
    auto nan = exact;
    nan[9] = NAN;
    auto r = check(Collective::allreduce, d, n, 0, count, 3, pack(nan));
    CHECK(r.mismatches == 1);
    CHECK(contains(r.first_bad, "element 9"));
  }
}

// Regression: with dense random data a float64 error bound for fp8 sums
// (2(n+1)u*sum|x|) is wider than the values, so wrong outputs passed. With the
// rank count in the DataSpec, narrow-float sums use data whose sums are exact
// and are checked exactly.
TEST_CASE("reference: an fp8 sum of all zeros is rejected") {
  const int64_t count = 256;
  for (auto [t, n] : {std::pair{DType::fp8e5m2, 3}, std::pair{DType::fp8e4m3, 8}}) {
    CAPTURE(name(t));
    CAPTURE(n);
    const verify::DataSpec d{t, RedOp::sum, 1, 0, n};
    std::vector<uint8_t> zeros(size_t(count), 0);
    auto r = check(Collective::allreduce, d, n, 0, count, 0, zeros);
    CHECK(r.mismatches > count / 4);
    // likewise a result that lacks rank 0's contribution
    std::vector<uint8_t> partial(static_cast<size_t>(count));
    const Narrow& nw = t == DType::fp8e5m2 ? kNarrow[3] : kNarrow[2];
    std::vector<std::vector<uint8_t>> in;
    for (int q = 0; q < n; ++q) in.push_back(input_of(d, q, count));
    for (int64_t i = 0; i < count; ++i) {
      double acc = 0;
      for (int q = 1; q < n; ++q) acc += decode(t, in[size_t(q)].data() + i);
      partial[size_t(i)] = uint8_t(encode_nearest(nw, acc, true));
    }
    CHECK(check(Collective::allreduce, d, n, 0, count, 0, partial).mismatches > count / 8);
  }
}

TEST_CASE("reference: which input element lands where, for every collective") {
  const int n = 3;
  const int64_t count = 5;
  const verify::DataSpec d{DType::int64, RedOp::sum, 21, 0};
  std::vector<std::vector<int64_t>> in(n);
  for (int q = 0; q < n; ++q) {
    in[size_t(q)].resize(size_t(count * n));
    verify::fill_input(d, q, 0, count * n, in[size_t(q)].data());
  }
  auto sum_at = [&](int64_t i) {
    uint64_t s = 0;
    for (int q = 0; q < n; ++q) s += uint64_t(in[size_t(q)][size_t(i)]);
    return int64_t(s);
  };
  CHECK(verify::input_elems(Collective::allgather, n, count) == count);
  CHECK(verify::output_elems(Collective::allgather, n, count) == count * n);
  CHECK(verify::input_elems(Collective::reducescatter, n, count) == count * n);
  CHECK(verify::output_elems(Collective::reducescatter, n, count) == count);
  CHECK(verify::input_elems(Collective::alltoall, n, count) == count * n);
  CHECK(verify::output_elems(Collective::alltoall, n, count) == count * n);
  CHECK(verify::output_elems(Collective::broadcast, n, count) == count);
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    std::vector<int64_t> ag, rs, a2a, bc, rd, ar;
    for (int q = 0; q < n; ++q)
      for (int64_t e = 0; e < count; ++e) ag.push_back(in[size_t(q)][size_t(e)]);  // block q from rank q
    for (int64_t e = 0; e < count; ++e) rs.push_back(sum_at(r * count + e));        // block r, summed
    for (int q = 0; q < n; ++q)
      for (int64_t e = 0; e < count; ++e) a2a.push_back(in[size_t(q)][size_t(r * count + e)]);  // q's block r
    for (int64_t e = 0; e < count; ++e) bc.push_back(in[2][size_t(e)]);  // root 2's data
    for (int64_t e = 0; e < count; ++e) rd.push_back(sum_at(e));
    ar = rd;
    CHECK(check(Collective::allgather, d, n, 0, count, r, bytes_of(ag)).mismatches == 0);
    CHECK(check(Collective::reducescatter, d, n, 0, count, r, bytes_of(rs)).mismatches == 0);
    CHECK(check(Collective::alltoall, d, n, 0, count, r, bytes_of(a2a)).mismatches == 0);
    CHECK(check(Collective::broadcast, d, n, 2, count, r, bytes_of(bc)).mismatches == 0);
    CHECK(check(Collective::reduce, d, n, 1, count, r, bytes_of(rd)).mismatches == 0);
    CHECK(check(Collective::allreduce, d, n, 0, count, r, bytes_of(ar)).mismatches == 0);
    // and the neighbouring mistakes are caught
    std::swap(ag[0], ag[size_t(count)]);
    CHECK(check(Collective::allgather, d, n, 0, count, r, bytes_of(ag)).mismatches == 2);
    CHECK(check(Collective::broadcast, d, n, 1, count, r, bytes_of(bc)).mismatches == count);  // wrong root
    CHECK(check(Collective::alltoall, d, n, 0, count, (r + 1) % n, bytes_of(a2a)).mismatches > 0);
  }
}

// ---- 2. executor vs reference --------------------------------------------------

namespace {

struct Lowered {
  compiler::Lowered l;
  const ir::Schedule& for_bytes(int64_t bytes) const {
    for (size_t i = 0; i < l.buckets.size(); ++i)
      if (bytes >= l.buckets[i].min_bytes && (l.buckets[i].max_bytes < 0 || bytes <= l.buckets[i].max_bytes))
        return l.variants[i];
    return l.variants.back();
  }
};

// `max_tile`: the largest tile a bucket may use (0: the default, 256 KiB).
// Scratch is sized by it and the executor allocates (and poisons) all of it
// per run, so the big matrices below use 4 KiB tiles to stay fast.
Lowered lower_builtin(const std::string& name, int n, int64_t max_tile = 0) {
  const auto* info = dsl::find_schedule(name);
  REQUIRE(info != nullptr);
  compiler::LowerOptions o;
  if (max_tile > 0) o.proto.max_tile_bytes = max_tile;
  return {compiler::lower(dsl::build(*info, n), o)};
}

std::string sim_fail(const verify::SimResult& r) {
  return r.first_bad + " (mismatches " + std::to_string(r.mismatches) + ")";
}

}  // namespace

TEST_CASE("executor: every dtype and op on every reducing schedule, counts 0 1 7 odd, both modes") {
  const std::vector<std::string> names = {"allreduce.ring",      "allreduce.one_shot", "allreduce.two_shot",
                                          "reducescatter.direct", "reducescatter.ring", "reduce.direct"};
  std::map<std::string, Lowered> lowered;
  for (const auto& s : names) lowered.emplace(s, lower_builtin(s, 3, 4096));
  int64_t runs = 0;
  for (DType t : all_dtypes())
    for (RedOp op : all_redops())
      for (const auto& s : names)
        for (int64_t count : {0, 1, 7, 1001})
          for (bool inplace : {false, true}) {
            verify::SimOptions o;
            o.dtype = t;
            o.op = op;
            o.count = count;
            o.inplace = inplace;
            o.launches = 2;
            o.seed = uint64_t(count * 31 + int(t) * 7 + int(op));
            o.root = s == "reduce.direct" ? int32_t(count % 3) : 0;
            const auto& v = lowered.at(s).for_bytes(count * int64_t(dtype_size(t)));
            auto r = verify::simulate(v, o);
            if (!r.ok) {
              CAPTURE(name(t));
              CAPTURE(name(op));
              CAPTURE(s);
              CAPTURE(count);
              CAPTURE(inplace);
              FAIL_CHECK(sim_fail(r));
            }
            if (count > 0 && r.ops_run == 0) FAIL_CHECK("nothing ran for " << s << " count " << count);
            ++runs;
          }
  CHECK(runs == 12 * 5 * 6 * 4 * 2);
}

TEST_CASE("executor: multi-tile runs with forced small tiles, both protocols, several launches") {
  // 4 ranks; tiles of 16..256 bytes make up to hundreds of steps, which
  // exercises scratch rotation (depth), flag epochs and partial last tiles.
  const std::vector<std::string> names = {"allreduce.ring", "allreduce.two_shot", "reducescatter.ring",
                                          "reduce.direct",  "allgather.ring",     "broadcast.direct",
                                          "alltoall.direct", "allreduce.one_shot", "reducescatter.direct",
                                          "allgather.direct"};
  const DType dtypes[] = {DType::fp32, DType::bf16, DType::int8, DType::fp64, DType::fp8e5m2, DType::uint64};
  int k = 0;
  for (const auto& s : names) {
    auto lw = lower_builtin(s, 4, 4096);
    for (size_t vi = 0; vi < lw.l.variants.size(); ++vi) {
      const auto& v = lw.l.variants[vi];
      const bool reduces = collective_reduces(v.coll);
      for (int64_t tile : {16, 48, 256}) {
        for (int rep = 0; rep < 4; ++rep, ++k) {
          verify::SimOptions o;
          o.dtype = dtypes[k % 6];
          o.op = reduces ? all_redops()[size_t(k % 5)] : RedOp::sum;
          o.count = 3001;
          o.tile_bytes = tile;
          o.launches = 3;
          o.inplace = v.coll != Collective::alltoall && rep % 2 == 1;
          o.root = (v.coll == Collective::reduce || v.coll == Collective::broadcast) ? 3 : 0;
          o.seed = uint64_t(k);
          auto r = verify::simulate(v, o);
          CAPTURE(s);
          CAPTURE(vi);
          CAPTURE(name(o.dtype));
          CAPTURE(name(o.op));
          CAPTURE(tile);
          CAPTURE(o.inplace);
          CHECK_MESSAGE(r.ok, sim_fail(r));
          // the forced tile is what ran: ceil(chunk / (tile * instances)) steps
          const int64_t es = int64_t(dtype_size(o.dtype));
          const int64_t vec = 16 / es;
          const int64_t chunk = (o.count + v.chunks - 1) / v.chunks;
          const int64_t chunk_len = (chunk + vec - 1) / vec * vec;
          const int64_t tiles = (chunk_len + tile / es - 1) / (tile / es);
          CHECK(r.steps == (tiles + v.instances - 1) / v.instances);
        }
      }
    }
  }
}

TEST_CASE("executor: rooted collectives for every root") {
  int k = 0;
  for (const char* s : {"reduce.direct", "broadcast.direct"}) {
    for (int n : {1, 2, 3, 5}) {
      auto lw = lower_builtin(s, n, 4096);
      for (int root = 0; root < n; ++root)
        for (bool inplace : {false, true})
          for (const auto& v : lw.l.variants)
            for (RedOp op : std::string(s) == "reduce.direct" ? all_redops() : std::vector<RedOp>{RedOp::sum}) {
            ++k;
            verify::SimOptions o;
            o.dtype = all_dtypes()[size_t(k % kNumDTypes)];
            o.op = op;
            o.count = 777;
            o.root = root;
            o.inplace = inplace;
            o.seed = uint64_t(root * 13 + n);
            auto r = verify::simulate(v, o);
            CAPTURE(s);
            CAPTURE(n);
            CAPTURE(root);
            CAPTURE(name(o.dtype));
            CAPTURE(name(o.op));
            CHECK_MESSAGE(r.ok, sim_fail(r));
          }
    }
  }
}

TEST_CASE("executor: non-reducing collectives move every dtype's bits exactly") {
  for (const char* s : {"allgather.ring", "allgather.direct", "alltoall.direct", "broadcast.direct"}) {
    auto lw = lower_builtin(s, 3, 4096);
    for (DType t : all_dtypes())
      for (int64_t count : {1, 13, 4099}) {
        verify::SimOptions o;
        o.dtype = t;
        o.count = count;
        o.root = std::string(s) == "broadcast.direct" ? 1 : 0;
        o.inplace = std::string(s) != "alltoall.direct" && count != 13;
        auto r = verify::simulate(lw.for_bytes(count * int64_t(dtype_size(t))), o);
        CAPTURE(s);
        CAPTURE(name(t));
        CAPTURE(count);
        CHECK_MESSAGE(r.ok, sim_fail(r));
        CHECK(r.max_err == 0);
      }
  }
}

TEST_CASE("executor: option errors") {
  auto lw = lower_builtin("allreduce.ring", 2, 4096);
  const auto& v = lw.l.variants.back();
  verify::SimOptions o;
  o.count = -1;
  CHECK(catch_error([&] { verify::simulate(v, o); }).id == "mk.cli.E011");
  o.count = 5;
  o.root = 1;  // only rooted collectives take a root
  CHECK(catch_error([&] { verify::simulate(v, o); }).id == "mk.cli.E011");
  auto b = lower_builtin("broadcast.direct", 2);
  o.root = 2;
  CHECK(catch_error([&] { verify::simulate(b.l.variants.back(), o); }).id == "mk.cli.E011");
  o.root = -1;
  CHECK(catch_error([&] { verify::simulate(b.l.variants.back(), o); }).id == "mk.cli.E011");
  auto a2a = lower_builtin("alltoall.direct", 2);
  o.root = 0;
  o.inplace = true;
  CHECK(catch_error([&] { verify::simulate(a2a.l.variants.back(), o); }).id == "mk.cli.E013");
  // count 0: nothing to do, and nothing goes wrong
  o.inplace = false;
  o.count = 0;
  auto r = verify::simulate(v, o);
  CHECK(r.ok);
  CHECK(r.steps == 0);
}

// ---- 3. the executor catches broken schedules ---------------------------------

namespace {

size_t find_op(const ir::Schedule& s, const std::function<bool(const ir::Op&)>& f) {
  for (size_t i = 0; i < s.ops.size(); ++i)
    if (f(s.ops[i])) return i;
  FAIL("no such op");
  return 0;
}

}  // namespace

TEST_CASE("executor: a data op removed from a lowered schedule gives a wrong result") {
  auto lw = lower_builtin("allreduce.ring", 3, 4096);
  for (const auto& v : lw.l.variants) {
    verify::SimOptions o;
    o.count = 999;
    CHECK(verify::simulate(v, o).ok);  // control
    // drop the copy that writes some output chunk (an all-gather hop); its
    // signal stays, so nothing deadlocks, the output chunk just stays poisoned
    ir::Schedule b = v;
    size_t i = find_op(b, [](const ir::Op& op) {
      return op.kind == ir::OpKind::copy && op.dsts.size() == 1 && op.dsts[0].buf == ir::Buf::output;
    });
    b.ops[i].kind = ir::OpKind::nop;
    auto r = verify::simulate(b, o);
    CHECK_FALSE(r.ok);
    CHECK(r.mismatches >= 999 / 3 - 16);
    CHECK(contains(r.first_bad, "launch 0 rank "));
  }
}

TEST_CASE("executor: a wrong source chunk or a missing final scaling gives a wrong result") {
  auto lw = lower_builtin("allreduce.two_shot", 3, 4096);
  const auto& v = lw.l.variants.back();
  verify::SimOptions o;
  o.count = 600;
  o.op = RedOp::avg;
  CHECK(verify::simulate(v, o).ok);
  // avg without the final 1/n
  {
    ir::Schedule b = v;
    size_t i = find_op(b, [](const ir::Op& op) { return op.final; });
    b.ops[i].final = false;
    auto r = verify::simulate(b, o);
    CHECK_FALSE(r.ok);
    CHECK(r.max_err > 0.01);
  }
  // a reduction reading its own input twice (positions still agree)
  {
    ir::Schedule b = v;
    size_t i = find_op(b, [](const ir::Op& op) { return op.kind == ir::OpKind::reduce && op.srcs.size() >= 2; });
    b.ops[i].srcs[1] = b.ops[i].srcs[0];
    o.op = RedOp::sum;
    o.dtype = DType::int32;
    auto r = verify::simulate(b, o);
    CHECK_FALSE(r.ok);
    CHECK(r.mismatches > 0);
  }
}

TEST_CASE("executor: a missing signal deadlocks the simulation (mk.verify.E005)") {
  auto lw = lower_builtin("allreduce.ring", 3, 4096);
  ir::Schedule b = lw.l.variants.back();
  size_t i = find_op(b, [](const ir::Op& op) { return op.kind == ir::OpKind::signal; });
  const int peer = b.ops[i].peer, slot = b.ops[i].slot;
  b.ops.erase(b.ops.begin() + std::ptrdiff_t(i));
  verify::SimOptions o;
  o.count = 500;
  auto c = catch_error([&] { verify::simulate(b, o); });
  CHECK(c.id == "mk.verify.E005");
  CHECK(contains(c.message, "simulated run deadlocked"));
  CHECK(contains(c.message, "thread block(s) waiting"));
  CHECK(contains(c.message, " instance "));
  CHECK(contains(c.message, "blocked at %"));
  CHECK(contains(c.message, "wait slot"));
  (void)peer;
  (void)slot;
}

TEST_CASE("executor: a dropped scratch-reuse wait corrupts data under some interleaving") {
  // One rank, two thread blocks: tb 0 fills a scratch slot, tb 1 drains it into
  // the output. With the wait that keeps tb 0 from refilling the slot before
  // tb 1 read it (iter -depth), every seed is right; without it, some
  // interleavings overwrite data before it is read.
  auto make = [](bool with_reuse_wait) {
    ir::Schedule s;
    s.name = "hand.fill_drain";
    s.coll = Collective::allreduce;
    s.nranks = 1;
    s.scratch = 1;
    s.tbs = 2;
    s.slots = 2;
    s.depth = 1;
    s.tile_bytes = 64;
    s.staged = s.synced = true;
    auto data = [](int id, int tb, ir::Ref src, ir::Ref dst) {
      ir::Op op;
      op.id = id;
      op.kind = ir::OpKind::copy;
      op.rank = 0;
      op.tb = tb;
      op.srcs = {src};
      op.dsts = {dst};
      op.pos = {0};
      return op;
    };
    auto sync = [](int id, ir::OpKind k, int tb, int slot, int iter) {
      ir::Op op;
      op.id = id;
      op.kind = k;
      op.rank = 0;
      op.tb = tb;
      op.peer = 0;
      op.slot = slot;
      op.iter = iter;
      return op;
    };
    if (with_reuse_wait) s.ops.push_back(sync(10, ir::OpKind::wait, 0, 1, -1));
    s.ops.push_back(data(0, 0, {0, ir::Buf::input, 0, 1}, {0, ir::Buf::scratch, 0, 1}));
    s.ops.push_back(sync(11, ir::OpKind::signal, 0, 0, 0));
    s.ops.push_back(sync(12, ir::OpKind::wait, 1, 0, 0));
    s.ops.push_back(data(1, 1, {0, ir::Buf::scratch, 0, 1}, {0, ir::Buf::output, 0, 1}));
    if (with_reuse_wait) s.ops.push_back(sync(13, ir::OpKind::signal, 1, 1, 0));
    return s;
  };
  verify::SimOptions o;
  o.count = 64 * 16;  // fp32, 16 elements a tile: 64 steps
  o.tile_bytes = 64;
  int bad_seeds = 0;
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    o.seed = seed;
    auto good = verify::simulate(make(true), o);
    CHECK_MESSAGE(good.ok, good.first_bad);
    CHECK(good.steps == 64);
    bad_seeds += !verify::simulate(make(false), o).ok;
  }
  CHECK(bad_seeds > 0);
}

TEST_CASE("executor: dropping a wait from a built-in schedule is caught by simulation") {
  // For each iter-0 wait of the simple variant of allreduce.ring (4 ranks):
  // dropping it (and its then unused signal) must be visible to some seed.
  auto lw = lower_builtin("allreduce.ring", 4, 4096);
  const ir::Schedule& v = lw.l.variants.back();
  int waits = 0, caught = 0;
  for (size_t k = 0; k < v.ops.size(); ++k) {
    if (v.ops[k].kind != ir::OpKind::wait || v.ops[k].iter != 0) continue;
    ++waits;
    ir::Schedule b = v;
    const ir::Op w = b.ops[k];
    b.ops.erase(b.ops.begin() + std::ptrdiff_t(k));
    bool others = false;
    for (const auto& op : b.ops) others = others || (op.kind == ir::OpKind::wait && op.rank == w.rank && op.slot == w.slot);
    if (!others)
      for (size_t j = 0; j < b.ops.size(); ++j)
        if (b.ops[j].kind == ir::OpKind::signal && b.ops[j].peer == w.rank && b.ops[j].slot == w.slot) {
          b.ops.erase(b.ops.begin() + std::ptrdiff_t(j));
          break;
        }
    bool found = false;
    for (uint64_t seed = 1; seed <= 12 && !found; ++seed) {
      verify::SimOptions o;
      o.count = 4 * 64;
      o.tile_bytes = 16;
      o.launches = 1;
      o.seed = seed;
      auto c = catch_error([&] { found = !verify::simulate(b, o).ok; });
      found = found || c.id == "mk.verify.E005";
    }
    caught += found;
  }
  CHECK(waits > 4);
  CHECK(caught == waits);
}

TEST_CASE("executor: schedules with arbitrary executing ranks and thread blocks still compute the collective") {
  // Which rank executes an op and on which block does not change what a
  // schedule means; the compiler must keep the result right whatever the
  // author picks (pull instead of push, pinned blocks, shared blocks).
  std::mt19937 rng(12345);
  for (const auto& info : dsl::registered_schedules()) {
    for (int n : {2, 3, 4, 5}) {
      for (int variant = 0; variant < 8; ++variant) {
        ir::Schedule s = dsl::build(info, n);
        for (auto& op : s.ops) {
          std::vector<int32_t> ranks;
          for (const auto* l : {&op.srcs, &op.dsts})
            for (const auto& r : *l) ranks.push_back(r.rank);
          op.rank = ranks[rng() % ranks.size()];
          op.tb = int32_t(rng() % 5) - 1;  // -1 (compiler's choice) or 0..3
        }
        CAPTURE(info.name);
        CAPTURE(n);
        CAPTURE(variant);
        compiler::LowerOptions lo;
        lo.proto.max_tile_bytes = 4096;
        compiler::Lowered l;
        auto c = catch_error([&] { l = compiler::lower(s, lo); });
        REQUIRE_MESSAGE(!c, c.what);
        for (const auto& v : l.variants)
          for (DType t : {DType::fp32, DType::int32}) {
            verify::SimOptions o;
            o.dtype = t;
            o.count = 1001;
            o.inplace = info.coll != Collective::alltoall && t == DType::int32;
            o.seed = uint64_t(variant + 1);
            auto r = verify::simulate(v, o);
            CHECK_MESSAGE(r.ok, sim_fail(r));
          }
      }
    }
  }
}

// ---- random valid schedules ----------------------------------------------------

namespace {

// A random but correct all-reduce: for every chunk position, a random
// reduction chain over the ranks in random order (accumulating in scratch on
// random ranks, in place or into new slots, the last step possibly straight
// into an output), then the result copied to every rank's output from random
// sources. Random executing ranks and thread blocks; scratch slots are reused
// by later chunks once free.
ir::Schedule random_allreduce(std::mt19937& rng, int n, int k) {
  auto pick = [&](int m) { return int(rng() % uint32_t(m)); };
  dsl::Program p(Collective::allreduce, n, 0, "random.allreduce");
  p.chunks(k);
  p.instances(1 + pick(3));
  std::vector<std::vector<int>> free_slots(static_cast<size_t>(n));
  std::vector<int> next_slot(static_cast<size_t>(n), 0);
  auto new_slot = [&](int r) {
    auto& f = free_slots[size_t(r)];
    if (!f.empty() && pick(2)) {
      int s = f.back();
      f.pop_back();
      return s;
    }
    return next_slot[size_t(r)]++;
  };
  auto exec = [&]() {
    dsl::Exec e;
    if (pick(3)) e.on = pick(n);
    if (pick(3) == 0) e.tb = pick(4);
    return e;
  };
  for (int c = 0; c < k; ++c) {
    std::vector<int> order(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) order[size_t(i)] = i;
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<std::pair<int, int>> used;  // scratch (rank, slot) of this chunk
    dsl::Chunk acc = p.input(order[0], c);
    if (n > 1 && pick(2)) {
      int r = pick(n), s = new_slot(r);
      used.push_back({r, s});
      p.copy(p.scratch(r, s), acc, exec());
      acc = p.scratch(r, s);
    }
    std::vector<bool> out_written(static_cast<size_t>(n), false);
    for (int i = 1; i < n; ++i) {
      dsl::Chunk x = p.input(order[size_t(i)], c);
      dsl::Chunk dst;
      const int how = pick(3);
      if (i == n - 1 && how == 0) {
        int r = pick(n);
        dst = p.output(r, c);
        out_written[size_t(r)] = true;
      } else if (how == 1 && acc.buf == dsl::Buf::scratch) {
        dst = acc;  // accumulate in place
      } else {
        int r = pick(n), s = new_slot(r);
        used.push_back({r, s});
        dst = p.scratch(r, s);
      }
      std::vector<dsl::Chunk> srcs = pick(2) ? std::vector<dsl::Chunk>{acc, x} : std::vector<dsl::Chunk>{x, acc};
      p.reduce(dst, srcs, exec());
      acc = dst;
    }
    std::vector<dsl::Chunk> have{acc};
    std::vector<int> targets;
    for (int r = 0; r < n; ++r)
      if (!out_written[size_t(r)]) targets.push_back(r);
    std::shuffle(targets.begin(), targets.end(), rng);
    for (size_t t = 0; t < targets.size();) {
      const dsl::Chunk src = have[size_t(pick(int(have.size())))];
      // one destination, or several at once (read once, write many)
      const size_t m = std::min(targets.size() - t, size_t(1 + (pick(3) == 0 ? pick(3) : 0)));
      std::vector<dsl::Chunk> dsts;
      for (size_t j = 0; j < m; ++j) dsts.push_back(p.output(targets[t + j], c));
      p.copy(dsts, src, exec());
      for (const auto& d : dsts) have.push_back(d);
      t += m;
    }
    for (auto [r, s] : used)
      if (std::find(free_slots[size_t(r)].begin(), free_slots[size_t(r)].end(), s) == free_slots[size_t(r)].end())
        free_slots[size_t(r)].push_back(s);
  }
  return std::move(p.ir());
}

}  // namespace

TEST_CASE("executor: random valid all-reduce schedules verify, lower and simulate correctly") {
  // MKT_FUZZ_ITERS / MKT_FUZZ_SEED run more (or other) random schedules.
  const char* it_env = std::getenv("MKT_FUZZ_ITERS");
  const char* seed_env = std::getenv("MKT_FUZZ_SEED");
  const int iters = it_env ? std::atoi(it_env) : 60;
  std::mt19937 rng(seed_env ? uint32_t(std::atoi(seed_env)) : 2024u);
  int tried = 0;
  for (int iter = 0; iter < iters; ++iter) {
    const int n = 1 + int(rng() % 5);
    const int k = 1 + int(rng() % 4);
    ir::Schedule s = random_allreduce(rng, n, k);
    CAPTURE(iter);
    CAPTURE(n);
    CAPTURE(k);
    INFO(ir::print(s));
    auto c = catch_error([&] { verify::verify_semantics(s); });
    REQUIRE_MESSAGE(!c, c.what);
    compiler::LowerOptions lo;
    lo.proto.max_tile_bytes = 4096;
    lo.max_tbs = 1 + int(rng() % 6);
    compiler::Lowered l;
    c = catch_error([&] { l = compiler::lower(s, lo); });
    REQUIRE_MESSAGE(!c, c.what);
    for (const auto& v : l.variants) {
      struct Run {
        DType t;
        RedOp op;
        int64_t count, tile;
        bool inplace;
      };
      for (Run run : {Run{DType::fp32, RedOp::sum, 1001, 0, false}, Run{DType::int32, RedOp::avg, 777, 0, true},
                      Run{DType::bf16, RedOp::max, 3000, 32, iter % 2 == 0}}) {
        verify::SimOptions o;
        o.dtype = run.t;
        o.op = run.op;
        o.count = run.count;
        o.tile_bytes = run.tile;
        o.inplace = run.inplace;
        o.launches = 2;
        o.seed = uint64_t(iter + 1);
        verify::SimResult r;
        c = catch_error([&] { r = verify::simulate(v, o); });
        CAPTURE(name(run.t));
        CAPTURE(name(run.op));
        CAPTURE(run.inplace);
        CHECK_MESSAGE(!c, c.what);
        CHECK_MESSAGE(r.ok, sim_fail(r));
        ++tried;
      }
    }
  }
  CHECK(tried >= 3 * iters);
}

TEST_CASE("reference: the parallel fill and check agree with the serial ones, first mismatch by element order") {
  const int64_t n = (int64_t(1) << 20) + 4099;  // above the threshold, not a multiple of the thread count
  verify::DataSpec d{DType::bf16, RedOp::sum, 5, 0, 2};
  std::vector<uint8_t> serial(size_t(n) * 2), par(size_t(n) * 2);
  verify::fill_input(d, 1, 0, n, serial.data());
  verify::fill_input_parallel(d, 1, n, par.data(), 3);
  CHECK(serial == par);
  // rank 0 of a 2-rank all-gather of count n/2: its output is [rank 0 input | rank 1 input]
  const int64_t count = n / 2;
  std::vector<uint8_t> out(size_t(2 * count) * 2);
  verify::fill_input(d, 0, 0, count, out.data());
  verify::fill_input(d, 1, 0, count, out.data() + size_t(count) * 2);
  auto ok = verify::check_output_parallel(Collective::allgather, d, 2, 0, count, 0, out.data(), 2 * count, 3);
  CHECK(ok.mismatches == 0);
  out[size_t(count + 7) * 2] ^= 0x40;  // in the second half (another thread's range)
  out[size_t(5) * 2] ^= 0x40;          // and earlier, in the first range
  auto bad = verify::check_output_parallel(Collective::allgather, d, 2, 0, count, 0, out.data(), 2 * count, 3);
  auto ref = verify::check_output(Collective::allgather, d, 2, 0, count, 0, out.data(), 2 * count);
  CHECK(bad.mismatches == 2);
  CHECK(bad.mismatches == ref.mismatches);
  CHECK(bad.first_bad == ref.first_bad);
  CHECK(mkt::contains(bad.first_bad, "element 5:"));
}

namespace {
template <typename C, typename U>
U bits_of(C x) {
  U u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
template <typename C, typename U, int K>
void check_minmax_bitwise(const std::vector<U>& patterns) {
  auto val = [](U u) {
    C x;
    std::memcpy(&x, &u, sizeof x);
    return x;
  };
  auto f = [](C a, C b) { return mk::dev::red_apply<K, C>(a, b); };
  for (U a : patterns)
    for (U b : patterns) {
      CAPTURE(a);
      CAPTURE(b);
      CHECK(bits_of<C, U>(f(val(a), val(b))) == bits_of<C, U>(f(val(b), val(a))));
      for (U c : patterns)
        CHECK(bits_of<C, U>(f(f(val(a), val(b)), val(c))) == bits_of<C, U>(f(val(a), f(val(b), val(c)))));
    }
}
}  // namespace

TEST_CASE("reduce: float max and min are commutative and associative bit for bit (zeros of two signs, NaNs)") {
  // +0, -0, 1, -1, +inf, -inf, the smallest subnormal, NaNs of several payloads and signs
  const std::vector<uint32_t> f = {0x00000000u, 0x80000000u, 0x3f800000u, 0xbf800000u, 0x7f800000u,
                                   0xff800000u, 0x00000001u, 0x7fc00000u, 0x7fc00001u, 0xffc00000u};
  check_minmax_bitwise<float, uint32_t, dev::kRedMax>(f);
  check_minmax_bitwise<float, uint32_t, dev::kRedMin>(f);
  const std::vector<uint64_t> d = {0, 0x8000000000000000ull, 0x3ff0000000000000ull, 0x7ff8000000000000ull,
                                   0x7ff8000000000001ull, 0xfff8000000000000ull, 0x7ff0000000000000ull};
  check_minmax_bitwise<double, uint64_t, dev::kRedMax>(d);
  check_minmax_bitwise<double, uint64_t, dev::kRedMin>(d);
  // what they compute: NaNs are ignored (as fmaxf, NCCL's max), +0 is the larger zero
  CHECK(std::signbit(dev::red_apply<dev::kRedMax, float>(-0.0f, 0.0f)) == false);
  CHECK(std::signbit(dev::red_apply<dev::kRedMin, float>(0.0f, -0.0f)) == true);
  CHECK(dev::red_apply<dev::kRedMax, float>(NAN, 1.0f) == 1.0f);
  CHECK(dev::red_apply<dev::kRedMin, float>(-2.0f, NAN) == -2.0f);
  CHECK(std::isnan(dev::red_apply<dev::kRedMax, float>(NAN, NAN)));
  CHECK(dev::red_apply<dev::kRedMax, float>(2.0f, 3.0f) == 3.0f);
  CHECK(dev::red_apply<dev::kRedMin, double>(2.0, 3.0) == 2.0);
}

TEST_CASE("executor: ranks that take max and min over their sources in different orders get the same bits") {
  // Each rank reduces its own input first: max(x0, x1) on rank 0, max(x1, x0)
  // on rank 1. Zeros of two signs and NaNs made the order show in the bits.
  mk::dsl::Program p(Collective::allreduce, 2, 0, "test.own_first");
  p.reduce(p.scratch(0, 0), {p.input(0, 0), p.input(1, 0)});
  p.reduce(p.scratch(1, 0), {p.input(1, 0), p.input(0, 0)});
  for (int r = 0; r < 2; ++r) p.copy(p.output(r, 0), p.scratch(r, 0));
  const compiler::Lowered l = compiler::lower(p.ir(), {});
  // the proof's model: a + b and b + a are one tree (every op commutative bit
  // for bit); the simulation below checks that max and min live up to it
  CHECK(verify::nondeterminism(l.variants.back()).empty());
  const std::vector<float> x0 = {0.0f, -0.0f, NAN, 1.0f, -0.0f, NAN, 5.0f};
  const std::vector<float> x1 = {-0.0f, 0.0f, 2.0f, NAN, -0.0f, NAN, 5.0f};
  for (RedOp op : {RedOp::max, RedOp::min})
    for (DType t : {DType::fp32, DType::bf16}) {
      CAPTURE(name(op));
      CAPTURE(name(t));
      verify::SimIO io;
      for (const auto* x : {&x0, &x1}) {
        std::vector<uint8_t> b(x->size() * dtype_size(t));
        for (size_t i = 0; i < x->size(); ++i)
          verify::dispatch_dtype(t, [&]<typename T>() {
            const T v = dev::Compute<T>::store(typename dev::Compute<T>::type((*x)[i]));
            std::memcpy(b.data() + i * sizeof(T), &v, sizeof(T));
            return 0;
          });
        io.in.push_back(b);
      }
      verify::SimOptions so;
      so.dtype = t;
      so.op = op;
      so.count = int64_t(x0.size());
      so.launches = 1;
      so.io = &io;
      REQUIRE(verify::simulate(l.variants.back(), so).ok);
      CHECK(io.out[0] == io.out[1]);
    }
}
