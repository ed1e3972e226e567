#include "compiler/verify/reference.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "compiler/verify/typed.hpp"
#include "templates/reduce.cuh"

namespace mk::verify {
namespace {

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t hash(const DataSpec& d, int32_t rank, int64_t elem) {
  return mix(mix(mix(d.seed * 1000003u + uint64_t(d.launch)) ^ uint64_t(rank) * 0x632be59bd9b4e019ull) ^
             uint64_t(elem));
}

bool narrow_float(DType t) {
  return t == DType::fp16 || t == DType::bf16 || t == DType::fp8e4m3 || t == DType::fp8e5m2;
}

// Sums of these are exact in every narrow dtype (see the header).
bool exact_sums(const DataSpec& d) {
  return narrow_float(d.dtype) && (d.op == RedOp::sum || d.op == RedOp::avg) && d.nranks > 0 && !d.inexact;
}

template <typename T>
T prescale_elem(DType t, int32_t rank) {
  return Typed<T>::from_double(prescale_of(t, rank));
}

double float_value(const DataSpec& d, int32_t rank, int64_t elem) {
  uint64_t h = hash(d, rank, elem);
  if (d.op == RedOp::prod) {
    double sign = (h & 1) ? -1.0 : 1.0;
    if ((uint64_t(rank) + uint64_t(elem)) % 8 == 0) return sign * (((h >> 1) & 1) ? 2.0 : 0.5);
    return sign;
  }
  if (exact_sums(d)) {
    const uint64_t m = uint64_t((d.nranks + 2) / 3);
    if ((uint64_t(rank) + uint64_t(elem)) % m != 0) return 0.0;
    return ((h & 1) ? -1.0 : 1.0) * (((h >> 1) & 1) ? 1.0 : 0.5);
  }
  double u = double(h >> 11) * 0x1.0p-53;
  return 2.0 * u - 1.0;
}

double smallest_subnormal(DType t) {
  switch (t) {
    case DType::fp64: return 4.9e-324;
    case DType::fp32: return 0x1.0p-149;
    case DType::fp16: return 0x1.0p-24;
    case DType::bf16: return 0x1.0p-133;
    case DType::fp8e4m3: return 0x1.0p-9;
    case DType::fp8e5m2: return 0x1.0p-16;
    default: return 0;
  }
}

template <typename T>
T make_elem(const DataSpec& d, int32_t rank, int64_t elem) {
  if constexpr (Typed<T>::is_int) {
    return T(hash(d, rank, elem));
  } else {
    return Typed<T>::from_double(float_value(d, rank, elem));
  }
}

struct Contrib {
  int32_t rank;
  int64_t elem;
};

// The input elements that produce output element `e` of `rank`, into `v`
// (cleared first; callers reuse it, so a large check allocates once).
void sources(Collective c, int32_t nranks, int32_t root, int64_t count, int32_t rank, int64_t e,
             std::vector<Contrib>& v) {
  v.clear();
  const int64_t block = count > 0 ? e / count : 0, offset = count > 0 ? e % count : e;
  const BlockSource src = output_source(c, root, rank, int(block));
  const int64_t elem = int64_t(src.in_block) * count + offset;
  if (src.from != BlockSource::kAllRanks) {
    v.push_back({src.from, elem});
    return;
  }
  for (int32_t q = 0; q < nranks; ++q) v.push_back({q, elem});
}

template <typename T>
CheckResult check_typed(Collective coll, const DataSpec& d, int32_t nranks, int32_t root,
                        int64_t count, int32_t rank, int64_t first, const void* out, int64_t n) {
  CheckResult res;
  const T* o = static_cast<const T*>(out) - first;
  const bool reduces = collective_reduces(coll);
  std::vector<Contrib> src;
  src.reserve(size_t(std::max(nranks, 1)));
  for (int64_t e = first; e < first + n; ++e) {
    sources(coll, nranks, root, count, rank, e, src);
    const T got = o[e];
    bool bad = false;
    double err = 0, tol = 0, want_d = 0, got_d = Typed<T>::to_double(got);
    if constexpr (Typed<T>::is_int) {
      using C = T;
      auto term = [&](const Contrib& c) {
        const C x = make_elem<T>(d, c.rank, c.elem);
        return d.op == RedOp::premulsum && reduces ? mk::dev::red_pre<C>(x, prescale_elem<T>(d.dtype, c.rank)) : x;
      };
      C acc = term(src[0]);
      if (reduces) {
        for (size_t k = 1; k < src.size(); ++k)
          acc = dispatch_red(d.op, [&]<int K>() {
            return mk::dev::red_apply<K, C>(acc, term(src[k]));
          });
        if (d.op == RedOp::avg) acc = mk::dev::red_finalize<mk::dev::kRedAvg, C>(acc, nranks);
      }
      bad = acc != got;
      want_d = double(acc);
      err = bad ? std::fabs(double(acc) - double(got)) : 0;
      if (bad && err == 0) err = 1;  // 64-bit values too close for doubles
    } else {
      auto term = [&](const Contrib& c) {
        const double x = Typed<T>::to_double(make_elem<T>(d, c.rank, c.elem));
        return d.op == RedOp::premulsum && reduces ? x * prescale_of(d.dtype, c.rank) : x;
      };
      double acc = term(src[0]);
      double mag = std::fabs(acc);
      if (reduces) {
        for (size_t k = 1; k < src.size(); ++k) {
          double x = term(src[k]);
          mag += std::fabs(x);
          switch (d.op) {
            case RedOp::sum:
            case RedOp::avg:
            case RedOp::premulsum: acc += x; break;
            case RedOp::prod: acc *= x; break;
            case RedOp::max: acc = std::max(acc, x); break;
            case RedOp::min: acc = std::min(acc, x); break;
          }
        }
      }
      const double u = unit_roundoff(d.dtype);
      if (reduces && (d.op == RedOp::sum || d.op == RedOp::avg || d.op == RedOp::premulsum)) {
        // exact data: the sum is exact; avg rounds once (scaling by 1/n in the
        // compute type, then to the dtype)
        tol = exact_sums(d) ? 0 : 2.0 * (nranks + 1) * u * mag;
        if (d.op == RedOp::avg) {
          acc /= nranks;
          tol = tol / nranks + 2 * u * std::fabs(acc);
        }
      } else if (reduces && d.op == RedOp::prod) {
        tol = 2 * u * std::fabs(acc);
      }
      if (tol > 0) tol += smallest_subnormal(d.dtype);
      if (exact_sums(d) && d.op == RedOp::avg) tol += smallest_subnormal(d.dtype);
      want_d = acc;
      err = std::fabs(got_d - acc);
      bad = !(err <= tol);  // NaN fails
    }
    if (!std::isnan(err) && err > res.max_err) {
      res.max_err = err;
      res.max_tol = tol;
    }
    if (bad) {
      if (res.mismatches == 0)
        res.first_bad = fmt::format("rank {} element {}: got {} want {} (tolerance {:.3g})", rank, e,
                                    got_d, want_d, tol);
      ++res.mismatches;
      if (std::isnan(err)) res.max_err = NAN;
    }
  }
  return res;
}

}  // namespace

double unit_roundoff(DType t) {
  switch (t) {
    case DType::fp64: return 0x1.0p-53;
    case DType::fp32: return 0x1.0p-24;
    case DType::fp16: return 0x1.0p-11;
    case DType::bf16: return 0x1.0p-8;
    case DType::fp8e4m3: return 0x1.0p-4;
    case DType::fp8e5m2: return 0x1.0p-3;
    default: return 0;
  }
}

double prescale_of(DType t, int32_t rank) {
  return dtype_is_float(t) ? 1.0 + double(rank % 4) / 4.0 : double(rank + 2);
}

int64_t input_elems(Collective c, int32_t nranks, int64_t count) { return input_blocks(c, nranks) * count; }
int64_t output_elems(Collective c, int32_t nranks, int64_t count) { return output_blocks(c, nranks) * count; }

void fill_input(const DataSpec& d, int32_t rank, int64_t first, int64_t n, void* dst) {
  dispatch_dtype(d.dtype, [&]<typename T>() {
    T* p = static_cast<T*>(dst);
    for (int64_t i = 0; i < n; ++i) p[i] = make_elem<T>(d, rank, first + i);
  });
}

CheckResult check_output(Collective coll, const DataSpec& d, int32_t nranks, int32_t root,
                         int64_t count, int32_t rank, const void* out, int64_t out_elems) {
  return check_output_range(coll, d, nranks, root, count, rank, 0, out, out_elems);
}

CheckResult check_output_range(Collective coll, const DataSpec& d, int32_t nranks, int32_t root,
                               int64_t count, int32_t rank, int64_t first, const void* out, int64_t n) {
  return dispatch_dtype(d.dtype, [&]<typename T>() {
    return check_typed<T>(coll, d, nranks, root, count, rank, first, out, n);
  });
}

namespace {

// f(lo, hi) over contiguous ranges of [0, n), one thread each.
template <class F>
void for_ranges(int64_t n, unsigned threads, F f) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  if (n < (int64_t(1) << 20)) threads = 1;
  const int64_t per = std::max<int64_t>(1, (n + threads - 1) / threads);
  std::vector<std::thread> pool;
  for (int64_t lo = per; lo < n; lo += per) pool.emplace_back([&f, lo, hi = std::min(n, lo + per)] { f(lo, hi); });
  f(0, std::min(n, per));
  for (auto& t : pool) t.join();
}

}  // namespace

void fill_input_parallel(const DataSpec& d, int32_t rank, int64_t n, void* dst, unsigned threads) {
  const size_t es = dtype_size(d.dtype);
  for_ranges(n, threads, [&](int64_t lo, int64_t hi) {
    fill_input(d, rank, lo, hi - lo, static_cast<char*>(dst) + size_t(lo) * es);
  });
}

CheckResult check_output_parallel(Collective coll, const DataSpec& d, int32_t nranks, int32_t root, int64_t count,
                                  int32_t rank, const void* out, int64_t out_elems, unsigned threads) {
  const size_t es = dtype_size(d.dtype);
  std::vector<std::pair<int64_t, CheckResult>> parts;
  std::mutex mu;
  for_ranges(out_elems, threads, [&](int64_t lo, int64_t hi) {
    CheckResult r = check_output_range(coll, d, nranks, root, count, rank, lo,
                                       static_cast<const char*>(out) + size_t(lo) * es, hi - lo);
    std::lock_guard<std::mutex> g(mu);
    parts.emplace_back(lo, std::move(r));
  });
  std::sort(parts.begin(), parts.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  CheckResult all;
  for (auto& [lo, r] : parts) {
    if (r.mismatches && all.mismatches == 0) all.first_bad = r.first_bad;
    all.mismatches += r.mismatches;
    if (r.max_err > all.max_err || std::isnan(r.max_err)) {
      all.max_err = r.max_err;
      all.max_tol = r.max_tol;
    }
  }
  return all;
}

}  // namespace mk::verify
