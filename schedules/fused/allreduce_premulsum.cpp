// PreMulSum as a fusion prologue: every rank's input times that rank's own
// scalar, then the sum (NCCL's ncclRedOpCreatePreMulSum with a host scalar):
//
//   out = sum over ranks r of  round(x_r * scale_r)
//
// A prologue runs on each element of a rank's input as the kernel reads it,
// before it is sent or added (include/mk/fusion.hpp); its result is rounded
// to the dtype, so every rank adds the same terms. Copy this file to write
// your own prologue (clip, fake-quantise, cast): the same kernels run it,
// and the compiler proves that each input element goes through it exactly
// once. mKernel's own PreMulSum op (mkRedOpCreatePreMulSum, which the NCCL
// ABI library serves) computes the same bits when the scale is exactly a
// value of the dtype (1/8, 0.75, 3 in bf16): that op takes its scalar in the
// dtype, as NCCL does, while this prologue multiplies by the double it is
// given, rounded to the compute type (float; double for fp64), so a scale
// such as 0.1 can differ in the last bit of bf16 or fp16. The op may also
// read its scalar from device memory; this file is the form a researcher
// extends.
#include <mk/fusion.hpp>

#include <cmath>

MK_PROLOGUE(premulsum,
  struct Pro {
    // scalar 0: this rank's factor
    template <class Q>
    MK_DEV static typename Q::C in(const Q& q, typename Q::C x) {
      return x * q.scalar(0);
    }
  };
)

MK_PROLOGUE_FUSION(premulsum, "allreduce.premulsum",
                   "each rank's input times its own scalar `scale` (a prologue), then the sum", ({"scale"}));

// Its float64 reference: x * scale, rounded once in the compute type and
// once to the dtype. `mkc verify --fusion allreduce.premulsum` compares the
// prologue with it.
static mk::dsl::PrologueRef premulsum_reference(double x, const double* s, mk::DType t) {
  const double v = x * s[0];
  const double compute = t == mk::DType::fp64 ? std::ldexp(1.0, -53) : std::ldexp(1.0, -24);
  const double dtype = t == mk::DType::bf16 ? std::ldexp(1.0, -8) : t == mk::DType::fp16 ? std::ldexp(1.0, -11) : compute;
  const double subnormal = t == mk::DType::fp16 ? std::ldexp(1.0, -25) : 1e-300;  // half fp16's smallest step
  return {v, (compute + dtype) * std::fabs(v) + subnormal};
}
MK_PROLOGUE_REFERENCE("allreduce.premulsum", premulsum_reference);
