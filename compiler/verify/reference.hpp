// Test data and the float64 / exact-integer reference for every collective.
//
// Inputs are a deterministic hash of (seed, launch, rank, element), so any
// tool (the CPU executor, the GPU tests, the benchmark) can regenerate them
// and check an output without storing every rank's input. Values differ per
// rank and per element and are never all zero:
//   fp32/fp64, sum/avg/min/max  uniform in [-1, 1], rounded to the dtype
//   fp16/bf16/fp8, sum/avg      (when nranks is given) +-0.5 or +-1 from the
//                               ranks q with (q + element) % ceil(n/3) == 0,
//                               0 from the others: every partial sum is exact
//                               in the dtype, so sums must match exactly (a
//                               float64 bound would be wider than the values);
//                               with DataSpec::inexact, uniform in [-1, 1]
//                               instead (partial sums round: what shows ranks
//                               that round at different points, E015)
//   fp16/bf16/fp8, min/max      uniform in [-1, 1], rounded to the dtype
//   floats, prod                +-1, with +-2 or +-0.5 at every 8th (rank+element)
//                               (products are exact powers of two, no overflow)
//   integers                    uniformly random bits (sum/prod wrap, as on GPU)
#pragma once

#include <cstdint>
#include <string>

#include "mk/types.hpp"

namespace mk::verify {

struct DataSpec {
  DType dtype = DType::fp32;
  RedOp op = RedOp::sum;
  uint64_t seed = 1;
  int32_t launch = 0;
  int32_t nranks = 0;  // 0: dense data (exact narrow-float sums need the rank count)
  // Narrow-float sums and averages on data whose partial sums round (checked
  // against a float64 bound); off: data whose every partial sum is exact.
  bool inexact = false;
};

// PreMulSum (RedOp::premulsum) multiplies each rank's input by that rank's
// scalar; the tests' scalar of rank `rank`, exact in every dtype: floats
// 1 + (rank % 4) / 4, integers rank + 2. The data is the sum op's; outputs
// are checked against the scaled sum (a float64 bound, integers exactly with
// wrap-around).
double prescale_of(DType t, int32_t rank);

// Writes `n` elements of rank `rank`'s input, starting at element `first`.
void fill_input(const DataSpec& d, int32_t rank, int64_t first, int64_t n, void* dst);

struct CheckResult {
  int64_t mismatches = 0;
  double max_err = 0;
  double max_tol = 0;
  std::string first_bad;
};

// Compares rank `rank`'s output (host copy, `out_elems` elements) with the
// reference for `coll` over `nranks` ranks of `count` elements each.
CheckResult check_output(Collective coll, const DataSpec& d, int32_t nranks, int32_t root,
                         int64_t count, int32_t rank, const void* out, int64_t out_elems);

// The same for output elements [first, first + n) only; `out` points at
// element `first`. Ranges can be checked in parallel.
CheckResult check_output_range(Collective coll, const DataSpec& d, int32_t nranks, int32_t root,
                               int64_t count, int32_t rank, int64_t first, const void* out, int64_t n);

// The same two on `threads` threads (0: one per core) over contiguous ranges,
// for GiB-sized buffers; below a million elements they run on the caller's
// thread. The check reports the first mismatch by element order.
void fill_input_parallel(const DataSpec& d, int32_t rank, int64_t n, void* dst, unsigned threads = 0);
CheckResult check_output_parallel(Collective coll, const DataSpec& d, int32_t nranks, int32_t root, int64_t count,
                                  int32_t rank, const void* out, int64_t out_elems, unsigned threads = 0);

// The unit roundoff of a floating-point dtype (2^-24 for fp32); 0 for integers.
double unit_roundoff(DType t);

// Elements in each rank's input / output buffer for a collective of `count`.
int64_t input_elems(Collective c, int32_t nranks, int64_t count);
int64_t output_elems(Collective c, int32_t nranks, int64_t count);

}  // namespace mk::verify
