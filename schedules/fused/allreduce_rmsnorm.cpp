// All-reduce + residual add + RMSNorm, fused into the all-reduce kernel
// (copy this file to write your own fusion; include/mk/fusion.hpp explains
// the interface):
//
//   residual_out = allreduce(x) + residual            (rounded to the dtype)
//   out          = residual_out * rsqrt(mean(residual_out^2) + eps) * weight
//
// per row of `hidden` elements: what TensorRT-LLM and FlashInfer hand-write
// for tensor-parallel transformer layers. `out` is the all-reduce's receive
// buffer; residual_out may be the residual itself (updated in place). The
// norm reads residual_out as stored, as `torch.nn.functional.rms_norm(x +
// residual)` does. Rows whose sizes and buffers allow it move 16 bytes at a
// time (r.vec()); the element path visits the same elements per thread in
// the same order, so every rank gets the same bits whichever path it takes.
#include <mk/fusion.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

MK_EPILOGUE(rmsnorm,
  struct Epi {
    // operands: 0 residual (per element), 1 residual_out (per element, written),
    // 2 weight (per column); scalar 0: eps
    template <class R>
    MK_DEV static void row(R& r) {
      using C = typename R::C;
      constexpr int V = R::V;
      C ss = C(0);
      // pass 1: residual_out = out + residual (as stored), and its sum of squares
      if (r.vec()) {
        for (int v = r.first(); v < r.nv(); v += r.step()) {
          C x[V], res[V];
          r.out_v(v, x);
          r.ld_v(0, v, res);
          for (int j = 0; j < V; ++j) {
            x[j] = r.round(x[j] + res[j]);
            ss += x[j] * x[j];
          }
          r.st_v(1, v, x);
        }
      } else {
        // the same elements per thread, in the same order, as the vector
        // path: the sum is the same bits whichever path a rank takes
        for (int v = r.first(); v * V < r.n; v += r.step())
          for (int i = v * V; i < v * V + V && i < r.n; ++i) {
            const C x = r.round(r.out(i) + r.ld(0, i));
            ss += x * x;
            r.st(1, i, x);
          }
      }
      const C inv = r.rsqrt(r.sum(ss) / C(r.n) + r.scalar(0));
      // pass 2: out = residual_out * inv * weight
      if (r.vec()) {
        for (int v = r.first(); v < r.nv(); v += r.step()) {
          C x[V], w[V];
          r.ld_v(1, v, x);
          r.ld_v(2, v, w);
          for (int j = 0; j < V; ++j) x[j] = x[j] * inv * w[j];
          r.set_out_v(v, x);
        }
      } else {
        for (int i = r.first(); i < r.n; i += r.step()) r.set_out(i, r.ld(1, i) * inv * r.ld(2, i));
      }
    }
  };
)

MK_FUSION(rmsnorm, "allreduce.rmsnorm",
          "all-reduce, then residual add (residual_out) and RMSNorm with weight per row of `row` elements (out)",
          ({{"residual", mk::dsl::Shape::elem, false},
            {"residual_out", mk::dsl::Shape::elem, true},
            {"weight", mk::dsl::Shape::col, false}}),
          ({"eps"}), mk::dsl::RowMode::given);

// Its float64 reference, written from the formula above and not from the
// code: `mkc verify --fusion allreduce.rmsnorm` (and the check before first
// use) compares the epilogue's results with it. Tolerances: residual_out is
// rounded to the dtype once (after a float add); the norm sums `row` squares
// in float and reads residual_out as stored; near zero, a store errs by up to
// the dtype's smallest step.
static void rmsnorm_reference(mk::dsl::FusionRef& r) {
  const double u = r.unit_roundoff(), f = std::ldexp(1.0, -24), eps = r.scalar(0);
  for (int64_t row = 0; row < r.rows(); ++row) {
    const int64_t base = row * r.row, n = std::min(r.row, r.count - base);
    std::vector<double> ro(static_cast<size_t>(n));
    double ss = 0;
    for (int64_t j = 0; j < n; ++j) {
      ro[size_t(j)] = r.out(base + j) + r.operand(0, base + j);
      ss += ro[size_t(j)] * ro[size_t(j)];
    }
    const double inv = 1.0 / std::sqrt(ss / double(n) + eps);
    for (int64_t j = 0; j < n; ++j) {
      const double x = ro[size_t(j)], w = r.operand(2, j), want = x * inv * w;
      const double err_ro = (u + f) * std::fabs(x) + r.smallest();
      r.want_operand(1, base + j, x, err_ro);
      r.want_out(base + j, want,
                 (4 * u + double(n) * f / 2 + 8 * f) * std::fabs(want) + 2 * err_ro * inv * std::fabs(w) + r.smallest());
    }
  }
}
MK_FUSION_REFERENCE("allreduce.rmsnorm", rmsnorm_reference);
