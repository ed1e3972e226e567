// All-reduce with fp8 (e4m3) output quantisation and a scale per row:
//
//   scale[row] = max(|allreduce(x)| over the row) / 448   (1 for an all-zero row; at
//                least the smallest normal float)
//   q          = fp8e4m3(allreduce(x) / scale[row])        (saturating)
//
// The all-reduce's receive buffer keeps the full-precision result; `q` and
// `scales` (fp32, one per row) are what a following fp8 GEMM reads
// (dequantise: q * scale).
#include <mk/fusion.hpp>

#include <algorithm>
#include <cmath>

MK_EPILOGUE(fp8_rows,
  struct Epi {
    // operands: 0 q (per element, fp8e4m3, written), 1 scales (per row, fp32, written)
    template <class R>
    MK_DEV static void row(R& r) {
      using C = typename R::C;
      constexpr int V = R::V;
      C m = C(0);
      if (r.vec()) {
        for (int v = r.first(); v < r.nv(); v += r.step()) {
          C x[V];
          r.out_v(v, x);
          for (int j = 0; j < V; ++j) m = r.abs(x[j]) > m ? r.abs(x[j]) : m;
        }
      } else {
        for (int i = r.first(); i < r.n; i += r.step()) m = r.abs(r.out(i)) > m ? r.abs(r.out(i)) : m;
      }
      const C amax = r.max(m);
      // at least the smallest normal float: 1 / scale stays finite (a
      // subnormal scale would turn zeros into NaN)
      const C tiny = C(1.17549435e-38f);
      const C scale = amax > C(0) ? (amax / C(448) > tiny ? amax / C(448) : tiny) : C(1);
      if (r.first() == 0) r.st(1, 0, scale);
      const C inv = C(1) / scale;
      if (r.vec()) {
        for (int v = r.first(); v < r.nv(); v += r.step()) {
          C x[V];
          r.out_v(v, x);
          for (int j = 0; j < V; ++j) x[j] = x[j] * inv;
          r.st_v(0, v, x);
        }
      } else {
        for (int i = r.first(); i < r.n; i += r.step()) r.st(0, i, r.out(i) * inv);
      }
    }
  };
)

MK_FUSION(fp8_rows, "allreduce.fp8_rows",
          "all-reduce, then e4m3 quantisation with one fp32 scale per row of `row` elements (q, scales)",
          ({{"q", mk::dsl::Shape::elem, true, false, mk::DType::fp8e4m3},
            {"scales", mk::dsl::Shape::row, true, false, mk::DType::fp32}}),
          ({}), mk::dsl::RowMode::given);

// Its float64 reference, from the formula above: `mkc verify --fusion
// allreduce.fp8_rows` compares the epilogue with it. The scale is computed in
// float (one rounding); q rounds to e4m3 (3 mantissa bits: half an ulp is
// 2^-4 relative, 2^-10 among subnormals) after a float multiply by 1/scale.
static void fp8_rows_reference(mk::dsl::FusionRef& r) {
  const double f = std::ldexp(1.0, -24), tiny = std::ldexp(1.0, -126);
  for (int64_t row = 0; row < r.rows(); ++row) {
    const int64_t base = row * r.row, n = std::min(r.row, r.count - base);
    double amax = 0;
    for (int64_t j = 0; j < n; ++j) amax = std::max(amax, std::fabs(r.out(base + j)));
    const double scale = amax > 0 ? std::max(amax / 448.0, tiny) : 1.0;
    r.want_operand(1, row, scale, 2 * f * scale);
    for (int64_t j = 0; j < n; ++j) {
      const double q = std::min(448.0, std::max(-448.0, r.out(base + j) / scale));
      r.want_operand(0, base + j, q, std::fabs(q) * (std::ldexp(1.0, -4) + 4 * f) + std::ldexp(1.0, -10));
    }
  }
}
MK_FUSION_REFERENCE("allreduce.fp8_rows", fp8_rows_reference);
