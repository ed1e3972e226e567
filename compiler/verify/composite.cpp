#include "compiler/verify/composite.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "compiler/verify/executor.hpp"
#include "compiler/verify/reference.hpp"
#include "compiler/verify/typed.hpp"

namespace mk::verify {
namespace {

// One buffer of one rank: its bytes as the simulated kernels leave them, the
// float64 reference, and how far a correct run may be from it.
struct Buf {
  std::vector<uint8_t> bytes;
  std::vector<double> ref, bound, mag;  // mag: sum of |contributions| (for the next reduction's bound)
};

double load(DType t, const uint8_t* p) {
  return dispatch_dtype(t, [&]<typename T>() {
    T v;
    std::memcpy(&v, p, sizeof v);
    return Typed<T>::to_double(v);
  });
}

double rounded(DType t, double v) {
  return dispatch_dtype(t, [&]<typename T>() { return Typed<T>::to_double(Typed<T>::from_double(v)); });
}

}  // namespace

CompositeSimResult simulate_composite(const dsl::Composite& c, const std::vector<const ir::Schedule*>& lowered,
                                      DType dtype, RedOp op, int64_t count, uint64_t seed) {
  if (dtype != DType::fp16 && dtype != DType::bf16 && dtype != DType::fp32 && dtype != DType::fp64)
    throw Error(ErrId::cli_E011, fmt::format("a composite simulates with fp16, bf16, fp32 or fp64, not {}", name(dtype)),
                {}, "simulate a stage's schedule alone (mkc simulate) for other dtypes");
  if (op != RedOp::sum && op != RedOp::avg && op != RedOp::min && op != RedOp::max)
    throw Error(ErrId::cli_E011, fmt::format("a composite simulates with sum, avg, min or max, not {}", name(op)));
  if (count < 0) throw Error(ErrId::cli_E011, "count must be >= 0");
  MK_CHECK(lowered.size() == c.stages().size(), "simulate_composite: a lowered schedule per stage");
  const int n = c.ranks();
  const int64_t es = int64_t(dtype_size(dtype));
  const double u = unit_roundoff(dtype);
  // every buffer of every rank: the generated data of its own seed
  std::vector<std::vector<Buf>> bufs(c.buffers().size(), std::vector<Buf>(size_t(n)));
  for (size_t b = 0; b < bufs.size(); ++b) {
    const int64_t elems = c.buffer_elems(int(b), count);
    for (int r = 0; r < n; ++r) {
      Buf& x = bufs[b][size_t(r)];
      x.bytes.resize(size_t(elems * es));
      fill_input(DataSpec{dtype, op, seed * 1000 + b, 0, n}, r, 0, elems, x.bytes.data());
      x.ref.resize(size_t(elems));
      x.bound.assign(size_t(elems), 0.0);
      x.mag.resize(size_t(elems));
      for (int64_t e = 0; e < elems; ++e) {
        x.ref[size_t(e)] = load(dtype, x.bytes.data() + e * es);
        x.mag[size_t(e)] = std::fabs(x.ref[size_t(e)]);
      }
    }
  }
  for (size_t i = 0; i < c.stages().size(); ++i) {
    const dsl::Stage& st = c.stages()[i];
    const ir::Schedule& s = *lowered[i];
    MK_CHECK(s.coll == st.coll && s.nranks == n, "simulate_composite: a stage's schedule of another collective");
    const int64_t ie = input_elems(st.coll, n, count), oe = output_elems(st.coll, n, count);
    // the kernels: inputs are the buffers' current bytes
    SimIO io;
    io.in.resize(size_t(n));
    for (int r = 0; r < n; ++r)
      if (has_input(st.coll, r, st.root)) {
        const auto& src = bufs[size_t(st.in)][size_t(r)].bytes;
        io.in[size_t(r)].assign(src.begin(), src.begin() + ie * es);
      }
    SimOptions so;
    so.dtype = dtype;
    so.op = op;
    so.count = count;
    so.inplace = st.in == st.out;
    so.root = st.root;
    so.launches = 1;
    so.seed = seed + i;
    so.io = &io;
    simulate(s, so);
    // the reference: what NCCL defines, from the reference of the inputs
    std::vector<std::vector<double>> ref(static_cast<size_t>(n)), bound(static_cast<size_t>(n)), mag(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      if (!has_output(st.coll, r, st.root)) continue;
      ref[size_t(r)].resize(size_t(oe));
      bound[size_t(r)].resize(size_t(oe));
      mag[size_t(r)].resize(size_t(oe));
      for (int64_t e = 0; e < oe; ++e) {
        const BlockSource src = output_source(st.coll, st.root, r, int(e / std::max<int64_t>(count, 1)));
        const int64_t at = src.in_block * count + e % std::max<int64_t>(count, 1);
        double v = 0, bd = 0, mg = 0;
        if (src.from != BlockSource::kAllRanks) {
          const Buf& from = bufs[size_t(st.in)][size_t(src.from)];
          v = from.ref[size_t(at)];
          bd = from.bound[size_t(at)];
          mg = from.mag[size_t(at)];
        } else {
          for (int q = 0; q < n; ++q) {
            const Buf& from = bufs[size_t(st.in)][size_t(q)];
            const double x = from.ref[size_t(at)];
            if (q == 0) v = x;
            else if (op == RedOp::min) v = std::min(v, x);
            else if (op == RedOp::max) v = std::max(v, x);
            else v += x;
            bd = op == RedOp::min || op == RedOp::max ? std::max(bd, from.bound[size_t(at)]) : bd + from.bound[size_t(at)];
            mg += from.mag[size_t(at)];
          }
          if (op == RedOp::sum || op == RedOp::avg) bd += double(n - 1) * u * mg;  // the partial sums' rounding
          if (op == RedOp::avg) {
            v /= n;
            bd /= n;
            mg /= n;
          }
        }
        const double stored = rounded(dtype, v);
        ref[size_t(r)][size_t(e)] = v;
        bound[size_t(r)][size_t(e)] = bd + std::fabs(stored - v) + u * std::fabs(v);
        mag[size_t(r)][size_t(e)] = op == RedOp::min || op == RedOp::max ? std::fabs(v) : mg;
      }
    }
    // the kernels' outputs and the reference become the output buffer's
    for (int r = 0; r < n; ++r) {
      if (!has_output(st.coll, r, st.root)) continue;
      Buf& to = bufs[size_t(st.out)][size_t(r)];
      const std::vector<uint8_t>& got = io.out.at(size_t(r));
      MK_CHECK(int64_t(got.size()) >= oe * es, "simulate_composite: an output of the wrong size");
      std::memcpy(to.bytes.data(), got.data(), size_t(oe * es));
      for (int64_t e = 0; e < oe; ++e) {
        to.ref[size_t(e)] = ref[size_t(r)][size_t(e)];
        to.bound[size_t(e)] = bound[size_t(r)][size_t(e)];
        to.mag[size_t(e)] = mag[size_t(r)][size_t(e)];
      }
    }
  }
  CompositeSimResult res;
  for (size_t b = 0; b < bufs.size(); ++b)
    for (int r = 0; r < n; ++r) {
      const Buf& x = bufs[b][size_t(r)];
      for (size_t e = 0; e < x.ref.size(); ++e) {
        const double got = load(dtype, x.bytes.data() + int64_t(e) * es);
        const double err = std::fabs(got - x.ref[e]);
        ++res.checked;
        if (!(err <= x.bound[e])) {  // NaN too
          if (res.mismatches++ == 0)
            res.first_bad = fmt::format("buffer {} rank {} element {}: got {} want {} (bound {})", c.buffers()[b], r,
                                        e, got, x.ref[e], x.bound[e]);
        }
        if (err > res.max_err || std::isnan(err)) res.max_err = err;
      }
    }
  res.ok = res.mismatches == 0;
  for (auto& b : bufs) {
    res.buffers.emplace_back();
    for (auto& x : b) res.buffers.back().push_back(std::move(x.bytes));
  }
  return res;
}

}  // namespace mk::verify
