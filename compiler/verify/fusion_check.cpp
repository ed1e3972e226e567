// The fusion checker (fusion_check.hpp): a fusion's host code run on rows of
// several lengths by several simulated threads, every access checked.
//
// The simulated threads of a row are OS threads that take turns (a baton):
// thread 0 runs until its first block-wide reduction or its end, then thread
// 1, and so on; when every thread waits at the reduction (or has ended), the
// reduction's value is computed in thread order and they go on in the same
// order. Only one runs at a time, so the run is deterministic and the
// checker's bookkeeping needs no lock per access; the threads exist only to
// give each simulated thread its own stack between reductions.
#include "compiler/verify/fusion_check.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "compiler/verify/executor.hpp"
#include "compiler/verify/fused_ref.hpp"
#include "compiler/verify/reference.hpp"
#include "mk/error.hpp"

namespace mk::verify {
namespace {

using dsl::FusionInfo;
using dsl::OperandInfo;
using dsl::Shape;
using dsl::fusion_detail::HostRowBase;
using dsl::fusion_detail::kOut;

constexpr int kMaxOps = dsl::kMaxOperands;

int host_slot(DType t) {
  switch (t) {
    case DType::fp16: return 0;
    case DType::bf16: return 1;
    case DType::fp32: return 2;
    case DType::fp64: return 3;
    default: return -1;
  }
}

// A thread of the simulated block stops at the first problem: the accessor
// that finds it throws this through the user's code.
struct Abort {};

struct Problem {
  ErrId id;
  std::string what;
};

const char* ordinal_suffix(int64_t k) {
  if (k % 100 >= 11 && k % 100 <= 13) return "th";
  return k % 10 == 1 ? "st" : k % 10 == 2 ? "nd" : k % 10 == 3 ? "rd" : "th";
}

// Every buffer of one run, as doubles of their dtypes.
struct Buffers {
  std::vector<double> out;
  std::vector<double> ops[kMaxOps];
  int alias[kMaxOps] = {-1, -1, -1, -1, -1, -1};  // operand k stored in operand alias[k]'s buffer
  std::vector<double>& storage(int k) { return alias[k] >= 0 ? ops[alias[k]] : ops[k]; }
};

// One row at a time, by `nt` simulated threads.
class Block final : public dsl::fusion_detail::RowCheck {
 public:
  Block(const FusionInfo& f, DType t, int nt, const std::vector<double>& scalars, Buffers& b)
      : f_(f), t_(t), nt_(nt), b_(b) {
    nops_ = int(f.operands.size());
    for (size_t k = 0; k < scalars.size() && k < size_t(dsl::kMaxScalars); ++k) scalars_[k] = scalars[k];
    // Storages another thread may write: the output, and every operand an
    // output operand is stored in (an input aliased by an output counts).
    writable_[0] = true;
    for (int k = 0; k < nops_; ++k)
      if (f.operands[size_t(k)].output) writable_[1 + root(k)] = true;
  }

  // Runs every row of `count` elements in rows of `row`; vec_mode as
  // HostRowBase::vec_mode_. Returns the first problem, if any.
  std::optional<Problem> run(dsl::fusion_detail::HostFn fn, int64_t count, int64_t row, int vec_mode) {
    for (int64_t r = 0; r * row < count && !problem_; ++r) run_row(fn, count, row, r, vec_mode);
    return problem_;
  }
  int64_t accesses() const { return accesses_; }
  int64_t rows() const { return rows_; }

  // ---- RowCheck ----------------------------------------------------------
  double load(const HostRowBase& r, int what, int64_t i, const char* call) override {
    const Loc l = locate(r, what, i, call, false);
    return l.storage < 0 ? b_.out[size_t(l.index)] : b_.storage(l.storage)[size_t(l.index)];
  }
  void store(const HostRowBase& r, int what, int64_t i, double v, const char* call) override {
    const Loc l = locate(r, what, i, call, true);
    (l.storage < 0 ? b_.out[size_t(l.index)] : b_.storage(l.storage)[size_t(l.index)]) = v;
  }
  bool vector(const HostRowBase& r, int v, const char* call) override {
    enter(r);
    const int V = vwidth();
    const bool vec = r.vec_mode_ == 1 && r.n % V == 0;
    if (!vec)
      fail(ErrId::verify_E020, r,
           fmt::format("{} on a row the kernel moves element by element (r.vec() is false: the row's {} element(s) "
                       "are {}a multiple of the vector width {}, or the call's buffers are not aligned to it); "
                       "test r.vec() and keep an element path",
                       call, r.n, r.n % V == 0 ? "" : "not ", V));
    if (v < 0 || v >= r.n / V)
      fail(ErrId::verify_E020, r,
           fmt::format("{} with v = {}, outside the row's vectors 0..r.nv()-1 = 0..{}", call, v, r.n / V - 1));
    return true;
  }
  double scalar(const HostRowBase& r, int k) override {
    enter(r);
    if (k < 0 || k >= int(f_.scalars.size()))
      fail(ErrId::verify_E020, r,
           fmt::format("r.scalar({}): the fusion declares {} scalar(s){}; an undeclared one is 0 in the kernel", k,
                       f_.scalars.size(), scalar_names()));
    return scalars_[k];
  }
  double reduce(const HostRowBase& r, double x, bool max) override {
    enter(r);
    std::unique_lock<std::mutex> g(mu_);
    const int t = r.tid_;
    state_[size_t(t)] = kWaiting;
    partial_[size_t(t)] = x;
    is_max_[size_t(t)] = max;
    pass_turn(t);
    cv_.wait(g, [&] { return turn_ == t; });
    if (problem_) throw Abort{};
    ++phase_[size_t(t)];
    return result_;
  }

 private:
  enum State { kReady, kWaiting, kDone };
  struct Loc {
    int storage;  // -1: the output, else an operand's storage
    int64_t index;
  };

  int vwidth() const { return 16 / int(dtype_size(t_)); }
  int root(int k) const { return b_.alias[k] >= 0 ? b_.alias[k] : k; }
  std::string scalar_names() const {
    std::string s;
    for (const auto& n : f_.scalars) s += (s.empty() ? " (" : ", ") + n;
    return s.empty() ? s : s + ")";
  }
  std::string operand_name(int k) const {
    const OperandInfo& o = f_.operands[size_t(k)];
    return fmt::format("operand {} ({}, per {}{})", k, o.name,
                       o.shape == Shape::elem ? "element" : o.shape == Shape::col ? "column" : "row",
                       o.output ? ", written" : ", an input");
  }

  // Every access first: the budget (code that never ends), the count.
  void enter(const HostRowBase& r) {
    if (problem_) throw Abort{};
    ++accesses_;
    if (++used_[size_t(r.tid_)] > budget_)
      fail(ErrId::verify_E020, r,
           fmt::format("thread {} made more than {} accesses in a row of {} element(s): the code does not end (or "
                       "does far more work per element than any row needs)",
                       r.tid_, budget_, r.n));
  }

  [[noreturn]] void fail(ErrId id, const HostRowBase& r, const std::string& what) {
    if (!problem_)
      problem_ = Problem{id, fmt::format("row {} of {} element(s), thread {} of {}: {}", r.row, r.n, r.tid_, nt_, what)};
    throw Abort{};
  }

  Loc locate(const HostRowBase& r, int what, int64_t i, const char* call, bool write) {
    enter(r);
    Loc l{-1, 0};
    if (what == kOut) {
      if (i < 0 || i >= r.n)
        fail(ErrId::verify_E020, r,
             fmt::format("{} with i = {}, outside the row's elements 0..{} (every block owns one row; element {} "
                         "is another row's, or past the receive buffer)",
                         call, i, r.n - 1, i));
      l.index = r.row * r.stride_ + i;
    } else {
      if (what < 0 || what >= nops_)
        fail(ErrId::verify_E020, r,
             fmt::format("{} names operand {}, but the fusion declares {} operand(s) (0..{})", call, what, nops_,
                         nops_ - 1));
      const OperandInfo& o = f_.operands[size_t(what)];
      if (write && !o.output)
        fail(ErrId::verify_E020, r,
             fmt::format("{} writes {}: the epilogue may write only the output and the operands it declares as "
                         "outputs ({} is the caller's, {})",
                         call, operand_name(what), o.name,
                         o.shape == Shape::elem ? "read-only" : "shared by every row's block"));
      if (o.shape == Shape::row) {
        l.index = r.row;
      } else {
        if (i < 0 || i >= r.n)
          fail(ErrId::verify_E020, r,
               fmt::format("{} with i = {} on {}, outside the row's elements 0..{}", call, i, operand_name(what),
                           r.n - 1));
        l.index = o.shape == Shape::elem ? r.row * r.stride_ + i : i;
      }
      l.storage = what;
    }
    const int s = l.storage < 0 ? 0 : 1 + root(l.storage);
    if (writable_[s]) record(r, s, l.index, write, call, what);
    return l;
  }

  // Two threads of the row, one writing, in one phase: a race on the device.
  // Every access of a phase runs before any of the next (the baton), so a
  // location needs only what its current phase saw: its writer, and its
  // reader (or "several").
  void record(const HostRowBase& r, int s, int64_t index, bool write, const char* call, int what) {
    std::vector<Seen>& seen = seen_[s];
    if (size_t(index) >= seen.size()) seen.resize(size_t(index) + 1);
    Seen& x = seen[size_t(index)];
    const int64_t ph = phase_[size_t(r.tid_)];
    if (x.row != r.row || x.phase != ph) x = Seen{r.row, ph, -1, -1, -1, nullptr, nullptr};
    const int t = r.tid_;
    auto race = [&](int other, bool other_writes, const char* other_call) {
      fail(ErrId::verify_E021, r,
           fmt::format("{} {} {}, which {} {} ({}) after the same block-wide reduction (the {} of the row): the "
                       "kernel's threads run in no defined order, so one may see the other's old or new value; put a "
                       "block-wide reduction (r.sum, r.max) between them or give the element one thread",
                       call, write ? "writes" : "reads",
                       fmt::format("{}[{}]", what == kOut ? std::string("out") : f_.operands[size_t(what)].name, index),
                       fmt::format("thread {}", other),
                       other_writes ? "writes" : "read", other_call,
                       ph == 0 ? std::string("start") : fmt::format("{}{} reduction", ph, ordinal_suffix(ph))));
    };
    if (x.writer >= 0 && x.writer != t) race(x.writer, true, x.wcall);
    if (write) {
      // a reader other than this thread (two distinct readers are kept, so
      // one of them is another thread whenever any is)
      const int other = x.reader >= 0 && x.reader != t ? x.reader : x.reader2 >= 0 && x.reader2 != t ? x.reader2 : -1;
      if (other >= 0) race(other, false, x.rcall);
      x.writer = t;
      x.wcall = call;
    } else {
      if (x.reader < 0)
        x.reader = t;
      else if (x.reader != t && x.reader2 < 0)
        x.reader2 = t;
      x.rcall = call;
    }
  }

  // Hands the turn to the next thread of this round, or completes the round.
  // Called with mu_ held.
  void pass_turn(int from) {
    for (int u = from + 1; u < nt_; ++u)
      if (state_[size_t(u)] == kReady) {
        turn_ = u;
        cv_.notify_all();
        return;
      }
    // Every thread waits at the reduction or has ended.
    int waiting = 0, done = 0;
    for (int u = 0; u < nt_; ++u) (state_[size_t(u)] == kWaiting ? waiting : done) += 1;
    if (waiting > 0 && !problem_) {
      int first = -1;
      for (int u = 0; u < nt_; ++u)
        if (state_[size_t(u)] == kWaiting) {
          if (first < 0) first = u;
          if (is_max_[size_t(u)] != is_max_[size_t(first)] && !problem_)
            problem_ = Problem{ErrId::verify_E021,
                               fmt::format("row {}: thread {} calls r.{} where thread {} calls r.{} (the {}{} block-wide "
                                           "reduction): every thread of the block must call the same reductions in "
                                           "the same order",
                                           row_, u, is_max_[size_t(u)] ? "max" : "sum", first,
                                           is_max_[size_t(first)] ? "max" : "sum", phase_[size_t(first)] + 1,
                                           ordinal_suffix(phase_[size_t(first)] + 1))};
        }
      if (done > 0 && !problem_) {
        int ended = 0;
        while (state_[size_t(ended)] != kDone) ++ended;
        problem_ = Problem{ErrId::verify_E021,
                           fmt::format("row {}: thread {} ends after {} block-wide reduction(s) while thread {} calls a "
                                       "{}{}: every thread of the block must call r.sum and r.max (they wait for all "
                                       "of them; the kernel would hang)",
                                       row_, ended, phase_[size_t(ended)], first, phase_[size_t(first)] + 1,
                                       ordinal_suffix(phase_[size_t(first)] + 1))};
      }
      // in thread order: the same value every time
      double acc = partial_[size_t(first)];
      for (int u = first + 1; u < nt_; ++u)
        if (state_[size_t(u)] == kWaiting)
          acc = is_max_[size_t(first)] ? (partial_[size_t(u)] > acc ? partial_[size_t(u)] : acc) : acc + partial_[size_t(u)];
      result_ = acc;
    }
    for (int u = 0; u < nt_; ++u)
      if (state_[size_t(u)] == kWaiting) state_[size_t(u)] = kReady;
    turn_ = -1;
    for (int u = 0; u < nt_; ++u)
      if (state_[size_t(u)] == kReady) {
        turn_ = u;
        break;
      }
    cv_.notify_all();
  }

  void run_row(dsl::fusion_detail::HostFn fn, int64_t count, int64_t row, int64_t r, int vec_mode) {
    ++rows_;
    row_ = r;
    HostRowBase base;
    base.n = int32_t(std::min(row, count - r * row));
    base.row = r;
    base.stride_ = row;
    base.out_ = b_.out.data() + r * row;  // not dereferenced while checking: every access goes through load/store
    base.out_dtype = t_;
    for (int k = 0; k < nops_; ++k) {
      const OperandInfo& o = f_.operands[size_t(k)];
      base.ops_[k] = b_.storage(k).data();
      base.shape_[k] = o.shape;
      base.dtype_[k] = o.same_dtype ? t_ : o.dtype;
    }
    for (int k = 0; k < dsl::kMaxScalars; ++k) base.scalars_[k] = scalars_[k];
    base.check_ = this;
    base.nt_ = nt_;
    base.vec_mode_ = vec_mode;
    budget_ = 64 * (int64_t(base.n) + 64) + 4096;
    state_.assign(size_t(nt_), kReady);
    phase_.assign(size_t(nt_), 0);
    partial_.assign(size_t(nt_), 0);
    is_max_.assign(size_t(nt_), false);
    used_.assign(size_t(nt_), 0);
    turn_ = 0;
    std::vector<std::thread> threads;
    for (int t = 0; t < nt_; ++t)
      threads.emplace_back([this, fn, base, t]() mutable {
        {
          std::unique_lock<std::mutex> g(mu_);
          cv_.wait(g, [&] { return turn_ == t; });
        }
        base.tid_ = t;
        if (!problem_) {
          try {
            fn(base);
          } catch (const Abort&) {
          } catch (const std::exception& e) {
            if (!problem_)
              problem_ = Problem{ErrId::verify_E020, fmt::format("row {}, thread {}: the code threw: {}", row_, t, e.what())};
          } catch (...) {
            if (!problem_) problem_ = Problem{ErrId::verify_E020, fmt::format("row {}, thread {}: the code threw", row_, t)};
          }
        }
        std::unique_lock<std::mutex> g(mu_);
        state_[size_t(t)] = kDone;
        pass_turn(t);
      });
    for (auto& th : threads) th.join();
  }

  struct Seen {  // one location's accesses in the current phase of a row
    int64_t row = -1, phase = -1;
    int writer = -1, reader = -1, reader2 = -1;  // thread ids (-1: none): the writer, two distinct readers
    const char *wcall = nullptr, *rcall = nullptr;
  };

  const FusionInfo& f_;
  DType t_;
  int nt_, nops_ = 0;
  Buffers& b_;
  double scalars_[dsl::kMaxScalars] = {};
  bool writable_[1 + kMaxOps] = {};
  std::vector<Seen> seen_[1 + kMaxOps];  // per storage (0: the output), per element
  std::optional<Problem> problem_;
  int64_t accesses_ = 0, rows_ = 0, row_ = 0, budget_ = 0;
  // the baton
  std::mutex mu_;
  std::condition_variable cv_;
  int turn_ = 0;
  std::vector<State> state_;
  std::vector<int64_t> phase_, used_;
  std::vector<double> partial_;
  std::vector<bool> is_max_;
  double result_ = 0;
};

// ---- data and comparisons ---------------------------------------------------

DType operand_dtype(const OperandInfo& o, DType t) { return o.same_dtype ? t : o.dtype; }

int64_t operand_size(const OperandInfo& o, int64_t count, int64_t row) {
  return o.shape == Shape::elem ? count : o.shape == Shape::col ? row : (count + row - 1) / row;
}

// Fresh buffers: the output and input operands hold values of their dtypes
// that differ per element; output operands hold NaN (what nothing wrote).
Buffers make_buffers(const FusionInfo& f, DType t, int64_t count, int64_t row, uint64_t seed) {
  Buffers b;
  b.out.resize(size_t(count));
  for (int64_t i = 0; i < count; ++i) b.out[size_t(i)] = fused::value(seed, 1000, i, t);
  for (size_t k = 0; k < f.operands.size(); ++k) {
    const OperandInfo& o = f.operands[k];
    auto& v = b.ops[k];
    v.resize(size_t(operand_size(o, count, row)));
    const DType ot = operand_dtype(o, t);
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = o.output ? std::nan("") : dtype_is_float(ot) ? fused::value(seed, 2000 + k, int64_t(i), ot) : double(i % 7);
  }
  return b;
}

bool same_bits(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::memcmp(&a, &b, sizeof a) == 0;
}

std::string num(double v) { return fmt::format("{:.9g}", v); }

// The first element whose bits differ between two runs' results ("" if none).
std::string first_difference(const FusionInfo& f, Buffers& a, Buffers& b, int64_t row, const char* a_is,
                             const char* b_is) {
  auto at = [&](const std::string& name, const std::vector<double>& x, const std::vector<double>& y,
                bool per_elem) -> std::string {
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (!same_bits(x[i], y[i]))
        return fmt::format("{}[{}]{} is {} {} and {} {}", name, i,
                           per_elem ? fmt::format(" (row {})", int64_t(i) / row) : std::string(), num(x[i]), a_is,
                           num(y[i]), b_is);
    return {};
  };
  if (auto d = at("out", a.out, b.out, true); !d.empty()) return d;
  for (size_t k = 0; k < f.operands.size(); ++k) {
    if (!f.operands[k].output) continue;
    if (auto d = at(f.operands[k].name, a.storage(int(k)), b.storage(int(k)), f.operands[k].shape == Shape::elem);
        !d.empty())
      return d;
  }
  return {};
}

struct Checker {
  const FusionInfo& f;
  FusionCheckOptions o;
  FusionCheckReport rep;
  bool aliased = false;  // ran with an output operand stored in an input's buffer

  SrcLoc loc(bool prologue) const {
    SrcLoc l;
    l.file = f.file;
    l.line = uint32_t(prologue ? (f.prologue_line ? f.prologue_line : f.line)
                               : (f.epilogue_line ? f.epilogue_line : f.line));
    return l;
  }
  [[noreturn]] void refuse(ErrId id, DType t, const std::string& what, bool prologue = false) const {
    throw Error(id,
                fmt::format("fusion {} ({} {}): {}", f.name, name(t), prologue ? "prologue" : "epilogue", what),
                loc(prologue),
                id == ErrId::verify_E022
                    ? "every rank must get the same bits whatever path its buffers take; compute each output the same "
                      "way on the vector and the element path (schedules/fused/allreduce_rmsnorm.cpp shows how)"
                    : "keep every access inside the row (0..r.n-1, vectors 0..r.nv()-1) and the declared operands "
                      "and scalars; `mkc verify --fusion NAME` repeats this check");
  }

  // One run of the epilogue; refuses on a problem.
  void run(DType t, Buffers& b, int64_t count, int64_t row, int vec_mode) {
    Block blk(f, t, o.threads, o.scalars, b);
    const auto p = blk.run(f.host[host_slot(t)], count, row, vec_mode);
    rep.rows += blk.rows();
    rep.accesses += blk.accesses();
    if (p)
      refuse(p->id, t,
             fmt::format("{} ({} elements in rows of {}, {})", p->what, count, row,
                         vec_mode == 1 ? "vector path where the row allows it" : "element path"));
  }

  void compare_reference(DType t, const Buffers& in, Buffers& got, int64_t count, int64_t row) {
    if (!f.reference) return;
    dsl::FusionRef ref;
    ref.fusion = &f;
    ref.dtype = t;
    ref.count = count;
    ref.row = row;
    ref.out_in = in.out.data();
    for (size_t k = 0; k < f.operands.size(); ++k) ref.ops_in[k] = in.ops[k].data();
    for (size_t k = 0; k < o.scalars.size() && k < size_t(dsl::kMaxScalars); ++k) ref.scalars[k] = o.scalars[k];
    ref.want[0].assign(size_t(count), 0.0);
    ref.tol_of[0].assign(size_t(count), std::nan(""));
    for (size_t k = 0; k < f.operands.size(); ++k) {
      ref.want[k + 1].assign(in.ops[k].size(), 0.0);
      ref.tol_of[k + 1].assign(in.ops[k].size(), std::nan(""));
    }
    f.reference(ref);
    rep.reference = true;
    auto cmp = [&](const std::string& name, const std::vector<double>& g, size_t j) {
      for (size_t i = 0; i < g.size() && i < ref.want[j].size(); ++i) {
        const double tol = ref.tol_of[j][i];
        if (std::isnan(tol)) continue;
        const double err = std::fabs(g[i] - ref.want[j][i]);
        if (err > rep.max_err || std::isnan(err)) {
          rep.max_err = err;
          rep.max_tol = tol;
        }
        if (!(err <= tol))
          refuse(ErrId::verify_E022, t,
                 fmt::format("{}[{}] is {}, its float64 reference (MK_FUSION_REFERENCE) says {} within {} ({} "
                             "elements in rows of {})",
                             name, i, num(g[i]), num(ref.want[j][i]), num(tol), count, row));
      }
    };
    cmp("out", got.out, 0);
    for (size_t k = 0; k < f.operands.size(); ++k)
      if (f.operands[k].output) cmp(f.operands[k].name, got.storage(int(k)), k + 1);
  }

  std::vector<int64_t> lengths(DType t, int64_t any_count) const {
    const int64_t V = 16 / int64_t(dtype_size(t)), NT = o.threads;
    std::vector<int64_t> c = {1, 7, V - 1, V, V + 1, 2 * NT * V + V, 3 * NT * V - 1};
    if (f.rows == dsl::RowMode::given)
      c.push_back(f.max_row);
    else
      c.push_back(any_count);
    std::vector<int64_t> out;
    const int64_t top = f.rows == dsl::RowMode::any ? any_count : f.max_row;
    for (int64_t n : c)
      if (n >= 1 && n <= top && std::find(out.begin(), out.end(), n) == out.end())
        out.push_back(n);
    std::sort(out.begin(), out.end());
    return out;
  }

  void epilogue(DType t) {
    const int64_t V = 16 / int64_t(dtype_size(t));
    const int64_t any_count = 3 * o.threads * V + 5;  // element-wise: one buffer, split every way
    std::optional<Buffers> first_any;
    int64_t first_row = 0;
    const auto lens = lengths(t, any_count);
    if (rep.lengths.empty()) rep.lengths = lens;
    for (int64_t row : lens) {
      // a few rows (one of the longest: it is about the bounds, not the rows)
      const int64_t count = f.rows == dsl::RowMode::any ? any_count : row * (row <= 64 ? 3 : row < 4096 ? 2 : 1);
      const Buffers init = make_buffers(f, t, count, row, o.seed);
      Buffers a = init;
      run(t, a, count, row, 1);
      if (row % V == 0) {
        Buffers e = init;
        run(t, e, count, row, 0);
        if (auto d = first_difference(f, a, e, row, "on the vector path", "on the element path"); !d.empty())
          refuse(ErrId::verify_E022, t,
                 fmt::format("{} ({} elements in rows of {}): ranks whose buffers differ in alignment take different "
                             "paths and would get different results",
                             d, count, row));
      }
      // An output operand may be exactly an input one where the runtime
      // allows it (elements of one dtype: residual_out == residual).
      for (size_t k = 0; k < f.operands.size(); ++k)
        for (size_t j = 0; j < f.operands.size(); ++j) {
          const OperandInfo &ok = f.operands[k], &oj = f.operands[j];
          if (!ok.output || oj.output || ok.shape != Shape::elem || oj.shape != Shape::elem ||
              operand_dtype(ok, t) != operand_dtype(oj, t))
            continue;
          aliased = true;
          Buffers c = init;
          c.alias[k] = int(j);
          run(t, c, count, row, 1);
          // compare: the aliased storage holds operand k's results
          Buffers view = c;
          view.alias[k] = -1;
          view.ops[k] = c.ops[j];
          if (auto d = first_difference(f, a, view, row, "with separate buffers",
                                        fmt::format("with {} the same buffer as {}", ok.name, oj.name).c_str());
              !d.empty())
            refuse(ErrId::verify_E022, t,
                   fmt::format("{} ({} elements in rows of {}): the runtime lets {} be {} (updated in place); read "
                               "{} at an element before writing {} there, in the same thread",
                               d, count, row, ok.name, oj.name, oj.name, ok.name));
        }
      compare_reference(t, init, a, count, row);
      if (f.rows == dsl::RowMode::any) {
        if (!first_any) {
          first_any = a;
          first_row = row;
        } else if (auto d = first_difference(f, *first_any, a, row, fmt::format("in rows of {}", first_row).c_str(),
                                             fmt::format("in rows of {}", row).c_str());
                   !d.empty()) {
          refuse(ErrId::verify_E022, t,
                 fmt::format("{}: an element-wise fusion (RowMode::any) must not depend on the row length, which the "
                             "runtime picks",
                             d));
        }
      }
    }
  }

  // A prologue's context on the host: its scalars, checked.
  struct PreScalars final : dsl::fusion_detail::PreCheck {
    const Checker* c;
    DType t;
    double x;
    const double* s;
    double scalar(int k) override {
      if (k < 0 || k >= int(c->f.scalars.size()))
        c->refuse(ErrId::verify_E020, t,
                  fmt::format("q.scalar({}) (input {}): the fusion declares {} scalar(s); an undeclared one is 0 in "
                              "the kernel",
                              k, num(x), c->f.scalars.size()),
                  true);
      return s[k];
    }
  };

  void prologue(DType t) {
    const auto fn = f.pre_host[host_slot(t)];
    std::vector<double> xs = {0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -3.0, 0.125, 1e-3, -7.5};
    for (int i = 0; i < 53; ++i) xs.push_back(4.0 * fused::value(o.seed, 3000, i, t));
    const auto pref = dsl::find_prologue_reference(f.name);
    for (double& x : xs) {
      x = dsl::fusion_detail::host_round(x, t);
      PreScalars chk;
      chk.c = this;
      chk.t = t;
      chk.x = x;
      chk.s = o.scalars.data();
      double y1 = 0, y2 = 0;
      try {
        y1 = dsl::fusion_detail::host_round(fn(x, o.scalars.data(), &chk), t);
        y2 = dsl::fusion_detail::host_round(fn(x, o.scalars.data(), &chk), t);
      } catch (const Error&) {
        throw;
      } catch (const std::exception& e) {
        refuse(ErrId::verify_E020, t, fmt::format("input {}: the code threw: {}", num(x), e.what()), true);
      }
      ++rep.values;
      if (!same_bits(y1, y2))
        refuse(ErrId::verify_E022, t,
               fmt::format("input {} gives {} and then {}: the prologue keeps state between calls, so ranks (and "
                           "elements) would not get the same terms",
                           num(x), num(y1), num(y2)),
               true);
      if (pref) {
        const dsl::PrologueRef r = pref(x, o.scalars.data(), t);
        rep.reference = true;
        const double err = std::fabs(y1 - r.value);
        if (err > rep.max_err) rep.max_err = err, rep.max_tol = r.tol;
        if (!(err <= r.tol))
          refuse(ErrId::verify_E022, t,
                 fmt::format("input {} gives {}, its float64 reference (MK_PROLOGUE_REFERENCE) says {} within {}",
                             num(x), num(y1), num(r.value), num(r.tol)),
                 true);
      }
    }
  }
};

}  // namespace

FusionCheckReport check_fusion(const FusionInfo& f, const FusionCheckOptions& opt) {
  Checker c{f, opt, {}, false};
  if (c.o.threads < 1 || c.o.threads > 64)
    throw Error(ErrId::cli_E011, fmt::format("fusion check: {} threads; 1..64", c.o.threads));
  if (c.o.dtypes.empty()) c.o.dtypes = f.dtypes;
  if (c.o.scalars.empty()) c.o.scalars = {0.5, 0.75, 1.0, 1.25};
  c.o.scalars.resize(size_t(dsl::kMaxScalars), 0.0);
  // only the declared scalars reach the kernel (the rest 0), as in the runtime
  for (size_t k = f.scalars.size(); k < c.o.scalars.size(); ++k) c.o.scalars[k] = 0.0;
  for (DType t : c.o.dtypes) {
    if (host_slot(t) < 0 || std::find(f.dtypes.begin(), f.dtypes.end(), t) == f.dtypes.end())
      throw Error(ErrId::cli_E013, fmt::format("fusion {} does not serve {}", f.name, name(t)));
    if (!f.pre_source.empty()) {
      if (!f.pre_host[host_slot(t)]) throw Error(ErrId::cli_E013, fmt::format("fusion {}: no host code", f.name));
      c.prologue(t);
    }
    if (!f.source.empty()) {
      if (!f.host[host_slot(t)]) throw Error(ErrId::cli_E013, fmt::format("fusion {}: no host code", f.name));
      c.epilogue(t);
    }
  }
  std::string dts;
  for (DType t : c.o.dtypes) dts += (dts.empty() ? "" : ", ") + std::string(name(t));
  std::string lens;
  for (int64_t n : c.rep.lengths) lens += (lens.empty() ? "" : ", ") + std::to_string(n);
  std::string s;
  if (!f.pre_source.empty())
    s += fmt::format("prologue on {} values of each of {}: only declared scalars, the same bits on every call", c.rep.values / int64_t(c.o.dtypes.size()), dts);
  if (!f.source.empty()) {
    if (!s.empty()) s += "; ";
    s += fmt::format(
        "epilogue on {}: {} rows ({}) of lengths {} by {} threads each, {} accesses: every access inside its row, "
        "operands and scalars, writes only to the output and output operands, no two threads on one element "
        "unordered, block-wide reductions called evenly; the same bits on the vector and element paths{}{}",
        dts, c.rep.rows, f.rows == dsl::RowMode::any ? "element-wise" : "rows given by the call", lens, c.o.threads,
        c.rep.accesses, f.rows == dsl::RowMode::any ? " and for every row length" : "",
        c.aliased ? " and with an output operand the same buffer as an input where the runtime allows it" : "");
  }
  s += c.rep.reference ? fmt::format("; within its float64 reference (largest error {:.3g}, tolerance there {:.3g})",
                                     c.rep.max_err, c.rep.max_tol)
                       : "; no float64 reference declared (MK_FUSION_REFERENCE)";
  c.rep.summary = s;
  return c.rep;
}

void check_fusion_once(const FusionInfo& f) {
  static std::mutex mu;
  static std::map<const FusionInfo*, std::optional<Error>> done;
  std::lock_guard<std::mutex> g(mu);  // one check at a time (each starts a few threads)
  auto it = done.find(&f);
  if (it == done.end()) {
    std::optional<Error> e;
    try {
      check_fusion(f);
    } catch (const Error& x) {
      e = x;
    }
    it = done.emplace(&f, std::move(e)).first;
  }
  if (it->second) throw *it->second;
}

FusionSimResult simulate_fusion(const ir::Schedule& lowered, const FusionInfo& f, const FusionSimOptions& o) {
  FusionSimResult res;
  const int n = lowered.nranks;
  const DType t = o.dtype;
  if (lowered.coll != Collective::allreduce)
    throw Error(ErrId::cli_E013, fmt::format("fusion {} runs on all-reduce outputs; {} is a {}", f.name, lowered.name,
                                             name(lowered.coll)));
  if (std::find(f.dtypes.begin(), f.dtypes.end(), t) == f.dtypes.end() || host_slot(t) < 0)
    throw Error(ErrId::cli_E013, fmt::format("fusion {} does not serve {}", f.name, name(t)));
  int64_t row = o.row;
  if (row == 0 && f.rows == dsl::RowMode::any) row = 4096;
  if (!f.source.empty()) {
    if (row < 1 || (f.rows == dsl::RowMode::given && row > f.max_row))
      throw Error(ErrId::cli_E011, fmt::format("fusion {} needs a row length (--row) in 1..{}", f.name, f.max_row));
    if (f.rows == dsl::RowMode::given && o.count % row != 0)
      throw Error(ErrId::cli_E011, fmt::format("count {} is not a whole number of rows of {}", o.count, row));
  }
  std::vector<std::vector<double>> sc = o.scalars;
  if (sc.empty())
    for (int r = 0; r < n; ++r) {
      std::vector<double> v;
      for (int k = 0; k < dsl::kMaxScalars; ++k)
        v.push_back(f.source.empty() ? 0.5 + 0.25 * ((r + k) % 4) : 0.5 + 0.25 * k);
      sc.push_back(v);
    }
  if (int(sc.size()) != n) throw Error(ErrId::cli_E011, "simulate_fusion: one scalar list per rank");
  for (auto& v : sc) {
    v.resize(size_t(dsl::kMaxScalars), 0.0);
    for (size_t k = f.scalars.size(); k < v.size(); ++k) v[k] = 0.0;  // only the declared ones reach the kernel
  }
  // 1. the collective, with the prologue
  std::vector<std::vector<double>> in(static_cast<size_t>(n));
  SimIO io;
  for (int r = 0; r < n; ++r) {
    in[size_t(r)].resize(size_t(o.count));
    for (int64_t i = 0; i < o.count; ++i) in[size_t(r)][size_t(i)] = fused::value(o.seed, uint64_t(r), i, t);
    const auto b = fused::encode(in[size_t(r)], t);
    io.in.emplace_back(b.begin(), b.end());
  }
  SimOptions so;
  so.dtype = t;
  so.count = o.count;
  so.inplace = o.inplace;
  so.launches = 1;
  so.seed = o.seed;
  so.io = &io;
  if (!f.pre_source.empty()) {
    so.prologue = &f;
    so.pre_scalars = sc;
  }
  const SimResult sr = simulate(lowered, so);
  if (!sr.ok) {
    res.first_bad = "the simulated collective: " + (sr.first_bad.empty() ? sr.first_diff : sr.first_bad);
    return res;
  }
  std::vector<std::vector<double>> out(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    out[size_t(r)] = fused::decode(std::vector<char>(io.out[size_t(r)].begin(), io.out[size_t(r)].end()), t);
  const double u = unit_roundoff(t);
  for (int64_t i = 0; i < o.count; ++i) {
    double want = 0, mag = 0, terms = 0;
    for (int r = 0; r < n; ++r) {
      const double x = in[size_t(r)][size_t(i)];
      const double y = f.pre_source.empty() ? x : dsl::run_prologue_host(f, t, x, sc[size_t(r)].data(), true);
      want += y;
      mag += std::fabs(y);
      terms += std::fabs(y);
    }
    // the sum's roundings, plus each term's rounding to the dtype (and in the
    // compute type) where a prologue computed it
    const double tol = 2.0 * (n + 1) * u * mag + (f.pre_source.empty() ? 0 : 2 * u * terms) + 1e-30;
    for (int r = 0; r < n; ++r) {
      const double err = std::fabs(out[size_t(r)][size_t(i)] - want);
      ++res.checked;
      if (err > res.max_err || std::isnan(err)) res.max_err = err, res.max_tol = tol;
      if (!(err <= tol) && res.first_bad.empty())
        res.first_bad = fmt::format("rank {} element {}: the all-reduce{} gives {}, float64 says {} within {}", r, i,
                                    f.pre_source.empty() ? "" : " of the prologue's values", num(out[size_t(r)][size_t(i)]),
                                    num(want), num(tol));
      if (r > 0 && !same_bits(out[size_t(r)][size_t(i)], out[0][size_t(i)]) && res.first_bad.empty())
        res.first_bad = fmt::format("rank {} element {}: {} where rank 0 has {} (ranks differ bit-wise)", r, i,
                                    num(out[size_t(r)][size_t(i)]), num(out[0][size_t(i)]));
    }
  }
  if (f.source.empty() || !res.first_bad.empty()) return res;
  // 2. the epilogue on every rank's output, operands shared by the ranks
  const Buffers shared = make_buffers(f, t, o.count, row, o.seed + 17);
  std::vector<Buffers> after(static_cast<size_t>(n), shared);
  for (int r = 0; r < n; ++r) {
    Buffers& b = after[size_t(r)];
    b.out = out[size_t(r)];
    double* ops[kMaxOps] = {};
    for (size_t k = 0; k < f.operands.size(); ++k) ops[k] = b.ops[k].data();
    dsl::run_fusion_host(f, t, o.count, row, b.out.data(), ops, sc[size_t(r)].data());
    if (r > 0)
      if (auto d = first_difference(f, after[0], b, row, "on rank 0", fmt::format("on rank {}", r).c_str()); !d.empty()) {
        res.first_bad = fmt::format("the epilogue: {} (ranks differ bit-wise)", d);
        res.bad_id = ErrId::verify_E022;
        return res;
      }
    if (!f.reference) continue;
    res.reference = true;
    dsl::FusionRef ref;
    ref.fusion = &f;
    ref.dtype = t;
    ref.count = o.count;
    ref.row = row;
    ref.out_in = out[size_t(r)].data();
    for (size_t k = 0; k < f.operands.size(); ++k) ref.ops_in[k] = shared.ops[k].data();
    for (int k = 0; k < dsl::kMaxScalars; ++k) ref.scalars[k] = sc[size_t(r)][size_t(k)];
    ref.want[0].assign(size_t(o.count), 0.0);
    ref.tol_of[0].assign(size_t(o.count), std::nan(""));
    for (size_t k = 0; k < f.operands.size(); ++k) {
      ref.want[k + 1].assign(shared.ops[k].size(), 0.0);
      ref.tol_of[k + 1].assign(shared.ops[k].size(), std::nan(""));
    }
    f.reference(ref);
    auto cmp = [&](const std::string& what, const std::vector<double>& g, size_t j) {
      for (size_t i = 0; i < g.size() && i < ref.want[j].size() && res.first_bad.empty(); ++i) {
        const double tol = ref.tol_of[j][i];
        if (std::isnan(tol)) continue;
        const double err = std::fabs(g[i] - ref.want[j][i]);
        if (err > res.ref_max_err || std::isnan(err)) res.ref_max_err = err, res.ref_max_tol = tol;
        if (!(err <= tol)) {
          res.first_bad = fmt::format("rank {} {}[{}]: the epilogue gives {}, its float64 reference says {} within {}",
                                      r, what, i, num(g[i]), num(ref.want[j][i]), num(tol));
          res.bad_id = ErrId::verify_E022;
        }
      }
    };
    cmp("out", b.out, 0);
    for (size_t k = 0; k < f.operands.size(); ++k)
      if (f.operands[k].output) cmp(f.operands[k].name, b.ops[k], k + 1);
    if (!res.first_bad.empty()) return res;
  }
  return res;
}

}  // namespace mk::verify
