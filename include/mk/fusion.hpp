// Fused prologues and epilogues: your element-wise or row-wise work,
// compiled into the collective's kernel.
//
// An epilogue is a small device function over one row of the collective's
// final output (all-reduce: every element of the receive buffer). It runs
// once per row, inside the same kernel, after every element of the rank's
// output holds its final value and before the kernel returns; one thread
// block owns a row, so a row function may reduce over the row (RMSNorm,
// LayerNorm, per-row quantisation scales). The runtime launches it through
// mkAllReduceFused (mk.h), naming the fusion and passing its operands and
// scalars.
//
// Write it once, in a schedule file (a .cpp that `mkc --plugin` and
// MK_SCHEDULES load, as schedules are):
//
//   MK_EPILOGUE(my_scale,
//     struct Epi {
//       template <class R>
//       MK_DEV static void row(R& r) {
//         for (int i = r.first(); i < r.n; i += r.step())
//           r.set_out(i, r.out(i) * r.scalar(0));
//       }
//     };
//   )
//   MK_FUSION(my_scale, "my.scale", "out *= s", {}, {"s"}, mk::dsl::RowMode::any);
//
// The code between MK_EPILOGUE's parentheses is compiled twice: by NVRTC
// into the kernel, and by the host compiler into the schedule file, where
// the simulator runs it on the CPU with the same interface (one thread per
// row) and the fusion checker (`mkc verify --fusion NAME`, also run before a
// fusion's first use) runs each row on several threads with accessors that
// record every access (compiler/verify/fusion_check.hpp says what it
// refuses). It must be plain C++ of that interface, without preprocessor
// lines; `R` is the row context:
//
//   r.n, r.row              the row's length and index (row `row` of the output)
//   r.first(), r.step()     this thread's first element and stride in the row
//   r.out(i), r.set_out(i,v)   the collective's final output (its dtype)
//   r.ld(k, i), r.st(k, i, v)  operand k (FusionInfo::operands) at element i of
//                              its shape: elem -> [row * n + i], col -> [i],
//                              row -> [row] (i ignored)
//   r.scalar(k)             scalar k of the call (mkFusion_t::scalars)
//   r.round(v)              v rounded to the collective's dtype (as a store would)
//   R::V, r.vec(), r.nv()   vectors: when r.vec(), the row is nv() vectors of V
//   r.out_v(v, x), r.set_out_v(v, x), r.ld_v(k, v, x), r.st_v(k, v, x)
//                           elements v*V .. v*V+V-1 at once (x: C[R::V]; a per-row
//                           operand: ld_v gives its value in every lane, st_v
//                           stores x[0]); the
//                           device moves 16 bytes of the collective's dtype a
//                           time. Rows the call's sizes or alignment do not let
//                           move as vectors have vec() false: write the element
//                           path too (the built-ins show how).
//   r.sum(x), r.max(x)      block-wide reductions: every thread of the block
//                           must call them, with its partial value
//   r.rsqrt(x), r.abs(x)    math in the compute type
//   typename R::C           the compute type: float (fp16, bf16, fp32), double (fp64)
//
// Values move as the compute type: loads convert from the operand's dtype,
// stores round to it (round to nearest even; fp8 saturates).
//
// A prologue is a device function over one element of a rank's own input,
// applied as the kernel reads it, before the element is sent or reduced
// (scale, clip, cast, fake-quantise): the all-reduce then combines the
// prologue's results. It sees the call's scalars (each rank passes its own,
// as PreMulSum's factor), and its result is rounded to the collective's
// dtype, as storing it would, so every rank adds the very same terms:
//
//   MK_PROLOGUE(my_clip,
//     struct Pro {
//       template <class Q>
//       MK_DEV static typename Q::C in(const Q& q, typename Q::C x) {
//         return x < -q.scalar(0) ? -q.scalar(0) : (x > q.scalar(0) ? q.scalar(0) : x);
//       }
//     };
//   )
//   MK_PROLOGUE_FUSION(my_clip, "my.clip_sum", "sum of inputs clipped to [-c, c]", ({"c"}));
//
// `Q` gives q.scalar(k), q.abs(x), q.rsqrt(x) and the compute type Q::C.
// The compiler proves (verify_prologue) that in the kernel it runs in, the
// prologue runs exactly once on every input element, on its owner's rank,
// before any use of it. A fusion may have both: MK_FUSION_PRE(pro, epi, ...)
// registers a prologue and an epilogue under one name (they share the
// call's scalars).
#pragma once

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "mk/types.hpp"

#ifndef MK_DEV
#define MK_DEV inline
#endif

namespace mk::dsl {
// The fusion interface's version: plugins built against another one fail to
// load (an undefined symbol) instead of handing the registry structs of
// another layout. .cpp plugins are rebuilt when this header changes.
inline namespace fusion_abi_v2 {

// Where an operand's element i of row `row` lives.
enum class Shape : int32_t {
  elem = 0,  // one element per output element: [row * n + i] (a residual, a second output)
  col = 1,   // one per position in the row: [i] (a weight, a bias)
  row = 2,   // one per row: [row] (a per-row scale)
};

// The dtype of an operand: `same` (the collective's) or a fixed one.
struct OperandInfo {
  std::string name;  // "residual"
  Shape shape = Shape::elem;
  bool output = false;        // written by the epilogue
  bool same_dtype = true;     // the collective's dtype
  DType dtype = DType::fp32;  // when !same_dtype
};

// How rows are formed.
enum class RowMode : int32_t {
  given = 0,  // the call gives the row length (mkFusion_t::row): RMSNorm's hidden size
  any = 1,    // element-wise: any split works; the runtime picks the rows
};

namespace fusion_detail {
struct HostRowBase;
using HostFn = void (*)(HostRowBase&);
// A prologue on the host: x in the compute type's range, the call's scalars.
struct PreCheck;
using PreFn = double (*)(double x, const double* scalars, PreCheck* check);
}  // namespace fusion_detail

struct FusionRef;
// A fusion's float64 reference (MK_FUSION_REFERENCE): written independently
// of its device code, it says what each output element should hold and how
// far from that the dtype's rounding may take it.
using FusionRefFn = void (*)(FusionRef&);
// The same for a prologue (MK_PROLOGUE_REFERENCE): its value for input x (a
// value of the dtype) with these scalars, and a tolerance.
struct PrologueRef {
  double value = 0, tol = 0;
};
using PrologueRefFn = PrologueRef (*)(double x, const double* scalars, DType dtype);

struct FusionInfo {
  std::string name;  // "allreduce.rmsnorm"
  std::string doc;
  std::vector<OperandInfo> operands;  // at most kMaxOperands
  std::vector<std::string> scalars;   // at most kMaxScalars
  RowMode rows = RowMode::given;
  int32_t max_row = 16384;  // longest row the epilogue serves (RowMode::given)
  std::vector<DType> dtypes = {DType::fp16, DType::bf16, DType::fp32};
  std::string source;  // the device code (MK_EPILOGUE), defining struct Epi; empty: no epilogue
  // The same code compiled for the host: [fp16, bf16, fp32, fp64] (simulation
  // and checking), with the device's vector width for each (8, 8, 4, 2).
  fusion_detail::HostFn host[4] = {nullptr, nullptr, nullptr, nullptr};
  // The prologue (MK_PROLOGUE), defining struct Pro; empty: none. Its host
  // code in the compute type of [fp16, bf16, fp32, fp64].
  std::string pre_source;
  fusion_detail::PreFn pre_host[4] = {nullptr, nullptr, nullptr, nullptr};
  std::string file;
  int line = 0;            // the registration (MK_FUSION...)
  int epilogue_line = 0;   // MK_EPILOGUE's line in `file`, when known
  int prologue_line = 0;   // MK_PROLOGUE's
  // The float64 references, where declared: MK_FUSION_REFERENCE and
  // MK_PROLOGUE_REFERENCE in the fusion's own file (`file`) attach them; a
  // fusion of the same name from another file (a replacement) gets none.
  FusionRefFn reference = nullptr;
  PrologueRefFn prologue_reference = nullptr;
};
constexpr int kMaxOperands = 6;
constexpr int kMaxScalars = 4;

// Adds a fusion to the process-wide registry (the same name again replaces
// it, as schedules do). find_fusion throws mk.dsl.E009 for a malformed one;
// the entry it returns is never changed or freed (a replacement is a new
// entry), so it may be read without a lock while plugins load.
// find_fusion also checks the fusion's code on the CPU before it is first
// returned (verify::check_fusion, cached per registration) and throws its
// mk.verify.E020-E022 error for code that touches memory it may not, races
// between threads or gives results that depend on the path the kernel takes.
bool register_fusion(const FusionInfo& info);
std::vector<FusionInfo> registered_fusions();
const FusionInfo* find_fusion(const std::string& name);
// find_fusion for calls of one dtype: checks the code on that dtype only (a
// third of the work for a fusion of three dtypes; the first fused call and
// `mkc compile --fusion` wait for it). mk.cli.E013 for a dtype it does not serve.
const FusionInfo* find_fusion(const std::string& name, DType dtype);
// find_fusion without the check (the checker itself, `mkc list`).
const FusionInfo* find_fusion_unchecked(const std::string& name);
// How many registrations were made so far, and the names registered after
// `mark` of them (what loading a plugin added).
size_t fusion_registrations();
std::vector<std::string> fusions_registered_since(size_t mark);

// Declares `fn` the float64 reference of the fusion named `name` registered
// from `file` (before or after it is registered; a later declaration
// replaces an earlier one). The macros pass their own __FILE__.
bool register_fusion_reference(const std::string& name, FusionRefFn fn, const std::string& file);
bool register_prologue_reference(const std::string& name, PrologueRefFn fn, const std::string& file);

// What a reference sees and fills: one rank's epilogue input and operands as
// the call gives them (every value as a double of its dtype), and per output
// element the value it should hold and a tolerance. Elements it says nothing
// about are not compared.
struct FusionRef {
  DType dtype = DType::fp32;  // the collective's
  int64_t count = 0, row = 0;  // elements, and the row length (the last row may be shorter)
  int64_t rows() const { return row > 0 ? (count + row - 1) / row : 0; }
  // The collective's result (the epilogue's input), element i.
  double out(int64_t i) const { return out_in[i]; }
  // Operand k at index i of its own shape: elem [0, count), col [0, row), row [0, rows()).
  double operand(int k, int64_t i) const { return ops_in[k][i]; }
  double scalar(int k) const { return unsigned(k) < unsigned(kMaxScalars) ? scalars[k] : 0.0; }
  // The dtype's unit roundoff (2^-8 for bf16), and operand k's.
  double unit_roundoff() const;
  double unit_roundoff(int k) const;
  // The dtype's smallest positive (subnormal) value: near zero, rounding
  // errs by up to half of it whatever the relative bound says.
  double smallest() const;
  // What the output (the receive buffer) and output operand k should hold.
  // An index outside the buffer throws std::out_of_range (the checker reports
  // it as the reference's mistake).
  void want_out(int64_t i, double value, double tol) { set(0, i, value, tol); }
  void want_operand(int k, int64_t i, double value, double tol) {
    if (k < 0 || k >= kMaxOperands) throw std::out_of_range("FusionRef::want_operand: no operand " + std::to_string(k));
    set(k + 1, i, value, tol);
  }

  // Filled by the checker.
  const FusionInfo* fusion = nullptr;
  const double* out_in = nullptr;
  const double* ops_in[kMaxOperands] = {};
  double scalars[kMaxScalars] = {};
  std::vector<double> want[kMaxOperands + 1], tol_of[kMaxOperands + 1];  // NaN tolerance: not compared

 private:
  void set(int j, int64_t i, double value, double tol) {
    if (i < 0 || size_t(i) >= want[j].size())
      throw std::out_of_range("FusionRef: index " + std::to_string(i) + " outside " +
                              (j == 0 ? std::string("the output") : "operand " + std::to_string(j - 1)) + " (0.." +
                              std::to_string(int64_t(want[j].size()) - 1) + ")");
    want[j][size_t(i)] = value;
    tol_of[j][size_t(i)] = tol;
  }
};


// ---- the host row context (simulation and checking) ----------------------------

namespace fusion_detail {
// The checker's side of the host row context (compiler/verify/fusion_check.cpp):
// with one attached, every access goes through it, bounds-checked and
// recorded per thread and phase, and block-wide reductions wait for every
// simulated thread of the row. `what`: kOut for the output, else operand k.
constexpr int kOut = -2147483647 - 1;  // INT_MIN: no operand index (a negative k is refused as such)
struct RowCheck {
  virtual double load(const HostRowBase& r, int what, int64_t i, const char* call) = 0;
  virtual void store(const HostRowBase& r, int what, int64_t i, double v, const char* call) = 0;
  // Whether vector v may be accessed (the row is vectorised and v < nv()).
  virtual bool vector(const HostRowBase& r, int v, const char* call) = 0;
  virtual double scalar(const HostRowBase& r, int k) = 0;
  virtual double reduce(const HostRowBase& r, double x, bool max) = 0;

 protected:
  ~RowCheck() = default;
};

// Type-erased operand access for the host: the simulator gives every operand
// as float64 storage plus the dtype its stores round to.
struct HostRowBase {
  int32_t n = 0;
  int64_t row = 0;
  int64_t stride_ = 0;     // the length full rows have (element operands: [row * stride_ + i])
  double* out_ = nullptr;  // the row's output (row * stride_ already applied)
  DType out_dtype = DType::fp32;
  double* ops_[kMaxOperands] = {};  // operand bases (shape not yet applied)
  Shape shape_[kMaxOperands] = {};
  DType dtype_[kMaxOperands] = {};
  double scalars_[kMaxScalars] = {};
  // Checking: the checker, this simulated thread and the block's thread
  // count, and the vector path (-1: even rows take it where the length
  // allows, as the simulator does; 0: never; 1: wherever the length allows).
  RowCheck* check_ = nullptr;
  int tid_ = 0, nt_ = 1;
  int vec_mode_ = -1;
};
double host_round(double v, DType t);  // rounds v to t's precision (exactly as a store would)

template <class CT, int VW = 4>
struct HostRow : HostRowBase {
  using C = CT;
  // The device's vector width for the dtype (16 bytes); even rows take the
  // vector path, odd rows the element path, so that both are simulated.
  static constexpr int V = VW;
  int first() const { return tid_; }
  int step() const { return nt_; }
  bool vec() const { return n % V == 0 && (vec_mode_ < 0 ? (row & 1) == 0 : vec_mode_ == 1); }
  int nv() const { return n / V; }
  C round(C v) const { return C(host_round(double(v), out_dtype)); }
  C out(int i) const {
    if (check_) return C(check_->load(*this, kOut, i, "r.out(i)"));
    return C(out_[i]);
  }
  void set_out(int i, C v) {
    if (check_) return check_->store(*this, kOut, i, host_round(double(v), out_dtype), "r.set_out(i, v)");
    out_[i] = host_round(double(v), out_dtype);
  }
  void out_v(int v, C (&x)[V]) const {
    if (check_ && !check_->vector(*this, v, "r.out_v(v, x)")) return zero(x);
    for (int j = 0; j < V; ++j) x[j] = out(v * V + j);
  }
  void set_out_v(int v, const C (&x)[V]) {
    if (check_ && !check_->vector(*this, v, "r.set_out_v(v, x)")) return;
    for (int j = 0; j < V; ++j) set_out(v * V + j, x[j]);
  }
  void ld_v(int k, int v, C (&x)[V]) const {
    if (check_ && !check_->vector(*this, v, "r.ld_v(k, v, x)")) return zero(x);
    for (int j = 0; j < V; ++j) x[j] = ld(k, v * V + j);  // a per-row operand: its value in every lane
  }
  void st_v(int k, int v, const C (&x)[V]) {
    if (check_ && !check_->vector(*this, v, "r.st_v(k, v, x)")) return;
    if (unsigned(k) < unsigned(kMaxOperands) && shape_[k] == Shape::row) {  // one value per row: x[0], as the device stores it
      st(k, 0, x[0]);
      return;
    }
    for (int j = 0; j < V; ++j) st(k, v * V + j, x[j]);
  }
  double* at(int k, int i) const {
    switch (shape_[k]) {
      case Shape::elem: return ops_[k] + row * stride_ + i;
      case Shape::col: return ops_[k] + i;
      default: return ops_[k] + row;
    }
  }
  C ld(int k, int i) const {
    if (check_) return C(check_->load(*this, k, i, "r.ld(k, i)"));
    return C(*at(k, i));
  }
  void st(int k, int i, C v) {
    if (check_) {
      const DType t = unsigned(k) < unsigned(kMaxOperands) ? dtype_[k] : out_dtype;
      return check_->store(*this, k, i, host_round(double(v), t), "r.st(k, i, v)");
    }
    *at(k, i) = host_round(double(v), dtype_[k]);
  }
  C scalar(int k) const {
    if (check_) return C(check_->scalar(*this, k));
    return unsigned(k) < unsigned(kMaxScalars) ? C(scalars_[k]) : C(0);
  }
  C sum(C x) const { return check_ ? C(check_->reduce(*this, double(x), false)) : x; }
  C max(C x) const { return check_ ? C(check_->reduce(*this, double(x), true)) : x; }
  C rsqrt(C x) const { return C(1) / std::sqrt(x); }
  C abs(C x) const { return x < C(0) ? -x : x; }

 private:
  static void zero(C (&x)[V]) {
    for (int j = 0; j < V; ++j) x[j] = C(0);
  }
};
}  // namespace fusion_detail

namespace fusion_detail {
// The checker's side of a prologue's context: the scalars it asks for.
struct PreCheck {
  virtual double scalar(int k) = 0;

 protected:
  ~PreCheck() = default;
};
// The prologue's context on the host (the device's is templates/prims.cuh
// Prologue): the call's scalars in the compute type.
template <class CT>
struct HostPre {
  using C = CT;
  const double* s;
  PreCheck* check = nullptr;
  C scalar(int k) const {
    if (check) return C(check->scalar(k));
    return unsigned(k) < unsigned(kMaxScalars) ? C(s[k]) : C(0);
  }
  C abs(C x) const { return x < C(0) ? -x : x; }
  C rsqrt(C x) const { return C(1) / std::sqrt(x); }
};
}  // namespace fusion_detail

// Fusion `f`'s prologue on the host, on one element x of a rank's input (a
// value of `dtype`), with that rank's scalars: computed in the dtype's
// compute type and rounded to the dtype, as the kernel does; `exact`: in
// double, unrounded (the float64 reference of the same code). Throws
// mk.cli.E013 for a fusion without a prologue or host code for the dtype.
double run_prologue_host(const FusionInfo& f, DType dtype, double x, const double* scalars, bool exact = false);

// Runs fusion `f`'s host code on one rank's output: `count` elements in rows
// of `row` (the last may be shorter), every buffer as doubles. `out` and the
// operands hold values of their dtypes (the collective's `dtype`, or the
// operand's own) and every store rounds to them, computing in the dtype's
// compute type, as the kernel does. `exact`: compute in double and round
// nothing (the float64 reference of the same code). operands[k] must hold
// what operand k's shape needs (count, row or rows elements).
void run_fusion_host(const FusionInfo& f, DType dtype, int64_t count, int64_t row, double* out,
                     double* const* operands, const double* scalars, bool exact = false);

#define MK_FUSION_CAT2(a, b) a##b
#define MK_FUSION_CAT(a, b) MK_FUSION_CAT2(a, b)

// Registers the FusionInfo `f` that SETUP fills (the macros below), at load.
#define MK_FUSION_REGISTER_(...)                                                                   \
  static const bool MK_FUSION_CAT(mk_fusion_registered_, __LINE__) = [] {                          \
    ::mk::dsl::FusionInfo f;                                                                        \
    __VA_ARGS__                                                                                     \
    f.file = __FILE__;                                                                              \
    f.line = __LINE__;                                                                              \
    return ::mk::dsl::register_fusion(f);                                                           \
  }()

// MK_EPILOGUE(ident, code): `code` defines `struct Epi` with
// `template <class R> MK_DEV static void row(R& r)`.
#define MK_EPILOGUE(IDENT, ...)                                                                    \
  namespace mk_epilogue_##IDENT {                                                                  \
  __VA_ARGS__                                                                                      \
  template <class CT, int V>                                                                       \
  void host(::mk::dsl::fusion_detail::HostRowBase& b) {                                            \
    ::mk::dsl::fusion_detail::HostRow<CT, V> r;                                                    \
    static_cast<::mk::dsl::fusion_detail::HostRowBase&>(r) = b;                                    \
    Epi::row(r);                                                                                   \
  }                                                                                                \
  static const char* const source = #__VA_ARGS__;                                                  \
  static const int line = __LINE__;                                                                \
  }

// MK_PROLOGUE(ident, code): `code` defines `struct Pro` with
// `template <class Q> MK_DEV static typename Q::C in(const Q& q, typename Q::C x)`.
#define MK_PROLOGUE(IDENT, ...)                                                                    \
  namespace mk_prologue_##IDENT {                                                                  \
  __VA_ARGS__                                                                                      \
  template <class CT>                                                                              \
  double host(double x, const double* s, ::mk::dsl::fusion_detail::PreCheck* c) {                  \
    const ::mk::dsl::fusion_detail::HostPre<CT> q{s, c};                                           \
    return double(Pro::in(q, CT(x)));                                                              \
  }                                                                                                \
  static const char* const source = #__VA_ARGS__;                                                  \
  static const int line = __LINE__;                                                                \
  }

#define MK_FUSION_SET_PROLOGUE(f, IDENT)                                                           \
  (f).pre_source = mk_prologue_##IDENT::source;                                                    \
  (f).prologue_line = mk_prologue_##IDENT::line;                                                   \
  (f).pre_host[0] = &mk_prologue_##IDENT::host<float>;                                             \
  (f).pre_host[1] = &mk_prologue_##IDENT::host<float>;                                             \
  (f).pre_host[2] = &mk_prologue_##IDENT::host<float>;                                             \
  (f).pre_host[3] = &mk_prologue_##IDENT::host<double>

// MK_PROLOGUE_FUSION(ident, "name", "doc", ({"scalar", ...})): a fusion that is
// a prologue only (fp16, bf16, fp32; no operands, no rows).
#define MK_PROLOGUE_FUSION(IDENT, NAME, DOC, SCALARS)                                              \
  MK_FUSION_REGISTER_(f.name = NAME; f.doc = DOC; f.scalars = std::vector<std::string> SCALARS;           \
                      f.rows = ::mk::dsl::RowMode::any; MK_FUSION_SET_PROLOGUE(f, IDENT);)

// MK_FUSION(ident, "name", "doc", ({operands}), ({"scalar", ...}), RowMode): fp16,
// bf16 and fp32, rows up to 16384. Other settings (FusionInfo::dtypes,
// max_row): fill a FusionInfo as this macro does and call register_fusion.
#define MK_FUSION(IDENT, NAME, DOC, OPERANDS, SCALARS, ROWS)                                      \
  MK_FUSION_REGISTER_(f.name = NAME; f.doc = DOC; f.operands = std::vector<::mk::dsl::OperandInfo> OPERANDS; \
                      f.scalars = std::vector<std::string> SCALARS; f.rows = ROWS;                        \
                      MK_FUSION_SET_EPILOGUE(f, IDENT);)

#define MK_FUSION_SET_EPILOGUE(f, IDENT)                                                           \
  (f).source = mk_epilogue_##IDENT::source;                                                        \
  (f).epilogue_line = mk_epilogue_##IDENT::line;                                                   \
  (f).host[0] = &mk_epilogue_##IDENT::host<float, 8>;                                              \
  (f).host[1] = &mk_epilogue_##IDENT::host<float, 8>;                                              \
  (f).host[2] = &mk_epilogue_##IDENT::host<float, 4>;                                              \
  (f).host[3] = &mk_epilogue_##IDENT::host<double, 2>

// MK_FUSION_PRE(pro, epi, "name", "doc", ({operands}), ({"scalar", ...}), RowMode):
// MK_FUSION with the prologue `pro` (MK_PROLOGUE) as well.
#define MK_FUSION_PRE(PRO, IDENT, NAME, DOC, OPERANDS, SCALARS, ROWS)                             \
  MK_FUSION_REGISTER_(f.name = NAME; f.doc = DOC; f.operands = std::vector<::mk::dsl::OperandInfo> OPERANDS; \
                      f.scalars = std::vector<std::string> SCALARS; f.rows = ROWS;                        \
                      MK_FUSION_SET_EPILOGUE(f, IDENT); MK_FUSION_SET_PROLOGUE(f, PRO);)

// MK_FUSION_REFERENCE("name", fn): declares fn (void fn(mk::dsl::FusionRef&))
// the float64 reference of fusion "name" registered in the same file (a
// replacement of "name" from another file does not inherit it);
// MK_PROLOGUE_REFERENCE("name", fn)
// (mk::dsl::PrologueRef fn(double x, const double* scalars, mk::DType)) that
// of its prologue. The checker compares the fusion's host code with them.
#define MK_FUSION_REFERENCE(NAME, FN)                                                              \
  static const bool MK_FUSION_CAT(mk_fusion_reference_, __LINE__) =                                \
      ::mk::dsl::register_fusion_reference(NAME, FN, __FILE__)
#define MK_PROLOGUE_REFERENCE(NAME, FN)                                                            \
  static const bool MK_FUSION_CAT(mk_prologue_reference_, __LINE__) =                              \
      ::mk::dsl::register_prologue_reference(NAME, FN, __FILE__)

}  // inline namespace fusion_abi_v2
}  // namespace mk::dsl
