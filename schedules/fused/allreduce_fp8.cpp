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
