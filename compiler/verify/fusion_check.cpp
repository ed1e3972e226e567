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
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
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

// Threads for the simulated ones, made once per check (512 threads for each
// row of the kernels' block sizes cost more than the rows): worker i runs
// the job given to it, then waits for the next.
class Pool {
 public:
  explicit Pool(int n) : jobs_(size_t(n)), cvs_(size_t(n)) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this, i] { loop(i); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> g(mu_);
      quit_ = true;
    }
    for (auto& cv : cvs_) cv.notify_all();
    for (auto& t : threads_) t.join();
  }
  int size() const { return int(threads_.size()); }
  void give(int i, std::function<void()> job) {
    std::lock_guard<std::mutex> g(mu_);
    jobs_[size_t(i)] = std::move(job);
    ++pending_;
    cvs_[size_t(i)].notify_one();
  }
  // Until every job given has returned.
  void wait_idle() {
    std::unique_lock<std::mutex> g(mu_);
    idle_cv_.wait(g, [&] { return pending_ == 0; });
  }
  // A job that never returns: the pool is left to it (leaked, its threads detached).
  void abandon() {
    for (auto& t : threads_) t.detach();
  }

 private:
  void loop(int i) {
    std::unique_lock<std::mutex> g(mu_);
    for (;;) {
      cvs_[size_t(i)].wait(g, [&] { return quit_ || jobs_[size_t(i)]; });
      if (!jobs_[size_t(i)]) return;  // quit
      std::function<void()> job = std::move(jobs_[size_t(i)]);
      jobs_[size_t(i)] = nullptr;
      g.unlock();
      job();
      job = nullptr;  // what it captured goes before it counts as done
      g.lock();
      if (--pending_ == 0) idle_cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::vector<std::function<void()>> jobs_;
  std::vector<std::condition_variable> cvs_;
  std::condition_variable idle_cv_;
  std::vector<std::thread> threads_;
  int pending_ = 0;
  bool quit_ = false;
};

// One row at a time, by `nt` simulated threads (the pool's first nt).
// Heap-allocated: a row whose threads do not end by the deadline leaves them
// (and this object, and the pool) behind.
class Block final : public dsl::fusion_detail::RowCheck {
 public:
  // `deadline`: how long one row may run before the checker gives up on it
  // (a correct row takes milliseconds).
  Block(const FusionInfo& f, DType t, int nt, const std::vector<double>& scalars, Buffers& b,
        std::chrono::milliseconds deadline, Pool& pool)
      : f_(f), t_(t), nt_(nt), b_(b), deadline_(deadline), pool_(pool), cvs_(size_t(nt)) {
    nops_ = int(f.operands.size());
    for (size_t k = 0; k < scalars.size() && k < size_t(dsl::kMaxScalars); ++k) scalars_[k] = scalars[k];
    // Storages another thread may write: the output, and every operand an
    // output operand is stored in (an input aliased by an output counts).
    writable_[0] = true;
    for (int k = 0; k < nops_; ++k)
      if (f.operands[size_t(k)].output) writable_[1 + root(k)] = true;
    for (int k = 0; k < nops_; ++k)
      if (f.operands[size_t(k)].output) written_[k].assign(b_.storage(k).size(), 0);
  }

  // Runs every row of `count` elements in rows of `row`; vec_mode as
  // HostRowBase::vec_mode_. The first problem, if any; *stuck: a row did
  // not end by the deadline (the caller must leak this object).
  std::optional<Problem> run(dsl::fusion_detail::HostFn fn, int64_t count, int64_t row, int vec_mode, bool* stuck) {
    for (int64_t r = 0; r * row < count && !problem(); ++r)
      if (!run_row(fn, count, row, r, vec_mode)) {
        *stuck = true;
        break;
      }
    return problem();
  }
  int64_t accesses() const { return accesses_; }
  int64_t rows() const { return rows_; }
  // Whether every element of output operand k was stored (its first unwritten index, or -1).
  int64_t unwritten(int k) const {
    for (size_t i = 0; i < written_[k].size(); ++i)
      if (!written_[k][i]) return int64_t(i);
    return -1;
  }

  // ---- RowCheck ----------------------------------------------------------
  double load(const HostRowBase& r, int what, int64_t i, const char* call) override {
    const Loc l = locate(r, what, i, call, false);
    return l.storage < 0 ? b_.out[size_t(l.index)] : b_.storage(l.storage)[size_t(l.index)];
  }
  void store(const HostRowBase& r, int what, int64_t i, double v, const char* call) override {
    const Loc l = locate(r, what, i, call, true);
    if (l.storage >= 0) written_[l.storage][size_t(l.index)] = 1;
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
    cvs_[size_t(t)].wait(g, [&] { return turn_ == t || stop_.load(); });
    if (stop_.load()) throw Abort{};
    ++phase_[size_t(t)];
    return result_;
  }

 private:
  enum State { kReady, kWaiting, kDone };
  struct Loc {
    int storage;  // -1: the output, else an operand's storage
    int64_t index;
  };

  std::optional<Problem> problem() {
    std::lock_guard<std::mutex> g(mu_);
    return problem_;
  }
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
  // The buffer behind storage s (0: the output) as a message names it: with
  // an output stored in an input's buffer, both names.
  std::string storage_name(int s) const {
    if (s == 0) return "out";
    std::string n = f_.operands[size_t(s - 1)].name;
    for (int k = 0; k < nops_; ++k)
      if (b_.alias[k] == s - 1) n += fmt::format(" (the same buffer as {})", f_.operands[size_t(k)].name);
    return n;
  }

  // Every access first: stop after a problem, the budget (code that does not
  // end), the count.
  void enter(const HostRowBase& r) {
    if (stop_.load()) throw Abort{};
    ++accesses_;
    if (++used_[size_t(r.tid_)] > budget_)
      fail(ErrId::verify_E020, r,
           fmt::format("thread {} made more than {} accesses in a row of {} element(s): the code does not end (or "
                       "does far more work per element than any row needs)",
                       r.tid_, budget_, r.n));
  }

  void set_problem(Problem p) {
    std::lock_guard<std::mutex> g(mu_);
    if (!problem_) problem_ = std::move(p);
    stop_ = true;
  }
  [[noreturn]] void fail(ErrId id, const HostRowBase& r, const std::string& what) {
    set_problem(Problem{id, fmt::format("row {} of {} element(s), thread {} of {}: {}", r.row, r.n, r.tid_, nt_, what)});
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
    if (writable_[s]) record(r, s, l.index, write, call);
    return l;
  }

  // Two threads of the row, one writing, in one phase: a race on the device.
  // Every access of a phase runs before any of the next (the baton), so a
  // location needs only what its current phase saw: its writer, and two
  // distinct readers (so that one of them is another thread whenever any is).
  void record(const HostRowBase& r, int s, int64_t index, bool write, const char* call) {
    std::vector<Seen>& seen = seen_[s];
    if (size_t(index) >= seen.size()) seen.resize(size_t(index) + 1);
    Seen& x = seen[size_t(index)];
    const int64_t ph = phase_[size_t(r.tid_)];
    if (x.row != r.row || x.phase != ph) x = Seen{r.row, ph, -1, -1, -1, nullptr, nullptr};
    const int t = r.tid_;
    auto race = [&](int other, bool other_writes, const char* other_call) {
      fail(ErrId::verify_E021, r,
           fmt::format("{} {} {}[{}], which thread {} {} ({}) after the same block-wide reduction (the {} of the "
                       "row): the kernel's threads run in no defined order, so one may see the other's old or new "
                       "value",
                       call, write ? "writes" : "reads", storage_name(s), index, other,
                       other_writes ? "writes" : "read", other_call,
                       ph == 0 ? std::string("start") : fmt::format("{}{} reduction", ph, ordinal_suffix(ph))));
    };
    if (x.writer >= 0 && x.writer != t) race(x.writer, true, x.wcall);
    if (write) {
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
      if (state_[size_t(u)] == kReady) return give(u);
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
      if (problem_) stop_ = true;
      // in thread order: the same value every time
      double acc = partial_[size_t(first)];
      for (int u = first + 1; u < nt_; ++u)
        if (state_[size_t(u)] == kWaiting)
          acc = is_max_[size_t(first)] ? (partial_[size_t(u)] > acc ? partial_[size_t(u)] : acc) : acc + partial_[size_t(u)];
      result_ = acc;
    }
    for (int u = 0; u < nt_; ++u)
      if (state_[size_t(u)] == kWaiting) state_[size_t(u)] = kReady;
    for (int u = 0; u < nt_; ++u)
      if (state_[size_t(u)] == kReady) return give(u);
    turn_ = -1;  // every thread has ended
    done_cv_.notify_all();
  }
  // The turn to thread u: its job starts now (a thread is given to the pool
  // only when its turn first comes: 512 threads waking to wait again cost
  // more than the rows), or it goes on from its reduction.
  void give(int u) {
    turn_ = u;
    if (!started_[size_t(u)]) {
      started_[size_t(u)] = true;
      pool_.give(u, [this, u] { job(u); });
    } else {
      cvs_[size_t(u)].notify_one();
    }
  }
  void job(int t) {
    HostRowBase base = base_;
    base.tid_ = t;
    if (!stop_.load()) {
      try {
        fn_(base);
      } catch (const Abort&) {
      } catch (const std::exception& e) {
        set_problem(Problem{ErrId::verify_E020, fmt::format("row {}, thread {}: the code threw: {}", base.row, t,
                                                            e.what())});
      } catch (...) {
        set_problem(Problem{ErrId::verify_E020, fmt::format("row {}, thread {}: the code threw", base.row, t)});
      }
    }
    std::unique_lock<std::mutex> g(mu_);
    state_[size_t(t)] = kDone;
    if (stop_.load()) {  // threads not started never will; those at a reduction go
      for (int u = 0; u < nt_; ++u)
        if (!started_[size_t(u)]) state_[size_t(u)] = kDone;
      for (auto& cv : cvs_) cv.notify_all();
      bool all = true;
      for (State x : state_) all = all && x == kDone;
      if (all) {
        turn_ = -1;
        done_cv_.notify_all();
      }
      return;
    }
    pass_turn(t);
  }

  // One row; false when its threads did not end by the deadline (they are
  // left running, detached; the problem says so).
  bool run_row(dsl::fusion_detail::HostFn fn, int64_t count, int64_t row, int64_t r, int vec_mode) {
    ++rows_;
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
    // Every thread may touch every element of the row many times over (a
    // quadratic row is slow, not wrong); more is a loop that does not end.
    budget_ = 4 * (int64_t(base.n) + 64) * (int64_t(base.n) + 64) + 4096;
    {
      std::lock_guard<std::mutex> g(mu_);
      row_ = r;
      base_ = base;
      fn_ = fn;
      state_.assign(size_t(nt_), kReady);
      phase_.assign(size_t(nt_), 0);
      partial_.assign(size_t(nt_), 0);
      is_max_.assign(size_t(nt_), false);
      used_.assign(size_t(nt_), 0);
      started_.assign(size_t(nt_), false);
      give(0);
    }
    bool ended = false;
    {
      std::unique_lock<std::mutex> g(mu_);
      ended = done_cv_.wait_for(g, deadline_, [&] {
        for (State x : state_)
          if (x != kDone) return false;
        return true;
      });
      if (!ended) {
        int running = turn_;
        if (!problem_)
          problem_ = Problem{ErrId::verify_E020,
                             fmt::format("row {} of {} element(s), thread {} of {}: the row did not end within {} ms "
                                         "(a loop that never ends?)",
                                         r, base.n, running, nt_, deadline_.count())};
        stop_ = true;
        for (auto& cv : cvs_) cv.notify_all();
      }
    }
    if (ended) pool_.wait_idle();  // every job has returned: nothing refers to this row any more
    return ended;
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
  std::chrono::milliseconds deadline_;
  Pool& pool_;
  double scalars_[dsl::kMaxScalars] = {};
  bool writable_[1 + kMaxOps] = {};
  std::vector<Seen> seen_[1 + kMaxOps];          // per storage (0: the output), per element
  std::vector<uint8_t> written_[kMaxOps];        // per output operand, per element: stored?
  int64_t accesses_ = 0, rows_ = 0, budget_ = 0;  // the running thread's (the baton orders them)
  // the baton: mu_ guards what follows
  std::mutex mu_;
  std::vector<std::condition_variable> cvs_;  // one per thread: only the next one wakes
  std::condition_variable done_cv_;
  std::atomic<bool> stop_{false};
  std::optional<Problem> problem_;
  int64_t row_ = 0;
  int turn_ = 0;
  std::vector<State> state_;
  std::vector<bool> started_;
  HostRowBase base_;
  dsl::fusion_detail::HostFn fn_ = nullptr;
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
// that differ per element; output operands hold NaN.
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

// The kernels' block sizes: 256 threads (the LL protocol), 512 (simple).
constexpr int kDeviceThreads[] = {256, 512};

// What to do about each cause, in the error's hint.
const char* const kHintBounds =
    "keep every access inside the row (0..r.n-1, vectors 0..r.nv()-1, tested with r.vec()) and the declared operands "
    "and scalars; `mkc verify --fusion NAME` repeats this check";
const char* const kHintRace =
    "let each thread touch only its own elements between two block-wide reductions (r.sum, r.max), which every "
    "thread calls in the same order; write a per-row output from one thread after the reduction that computes it";
const char* const kHintPaths =
    "compute each output the same way on the vector and the element path (the same elements per thread, in the "
    "same order: schedules/fused/allreduce_rmsnorm.cpp shows how)";
const char* const kHintRowLength = "compute each element from its own values only, not from r.n or r.row";
const char* const kHintReference =
    "the code and its float64 reference (MK_FUSION_REFERENCE / MK_PROLOGUE_REFERENCE) disagree beyond the tolerance "
    "the reference gives: fix whichever is wrong";
const char* const kHintUnwritten = "store every element of each output operand (the caller's buffer keeps stale data)";
const char* const kHintState = "keep Pro::in a function of its input and the scalars alone (no static state)";

struct Checker {
  const FusionInfo& f;
  FusionCheckOptions o;
  FusionCheckReport rep;
  bool aliased = false;  // ran with an output operand stored in an input's buffer
  std::unique_ptr<Pool> pool;  // made on first use

  SrcLoc loc(bool prologue) const {
    SrcLoc l;
    l.file = f.file;
    l.line = uint32_t(prologue ? (f.prologue_line ? f.prologue_line : f.line)
                               : (f.epilogue_line ? f.epilogue_line : f.line));
    return l;
  }
  [[noreturn]] void refuse(ErrId id, DType t, const std::string& what, const char* hint, bool prologue = false) const {
    throw Error(id, fmt::format("fusion {} ({} {}): {}", f.name, name(t), prologue ? "prologue" : "epilogue", what),
                loc(prologue), hint);
  }
  static const char* hint_of(ErrId id) { return id == ErrId::verify_E021 ? kHintRace : kHintBounds; }

  // One run of the epilogue by `nt` threads: "" or the problem, as a message.
  std::optional<Problem> try_run(DType t, Buffers& b, int64_t count, int64_t row, int vec_mode, int nt,
                                 const std::vector<double>& scalars) {
    if (!pool || pool->size() < nt) pool = std::make_unique<Pool>(std::max(nt, kDeviceThreads[1]));
    auto* blk = new Block(f, t, nt, scalars, b, std::chrono::milliseconds(o.row_deadline_ms), *pool);
    bool stuck = false;
    auto p = blk->run(f.host[host_slot(t)], count, row, vec_mode, &stuck);
    if (stuck) {  // a job never returned: the pool and the block are left to it
      pool->abandon();
      (void)pool.release();
    }
    rep.rows += blk->rows();
    rep.accesses += blk->accesses();
    if (!p)
      for (size_t k = 0; k < f.operands.size(); ++k) {
        const OperandInfo& op = f.operands[k];
        if (!op.output || b.alias[k] >= 0) continue;
        if (const int64_t i = blk->unwritten(int(k)); i >= 0)
          p = Problem{ErrId::verify_E022,
                      fmt::format("{}[{}]{} is never written: an output operand's every element must be (the caller's "
                                  "buffer would keep what it held)",
                                  op.name, i,
                                  op.shape == Shape::elem ? fmt::format(" (row {})", i / row) : std::string())};
      }
    if (!stuck) delete blk;  // else its threads still run: left to them
    if (p)
      p->what = fmt::format("{} ({} elements in rows of {}, {} threads, {})", p->what, count, row, nt,
                            vec_mode == 1 ? "vector path where the row allows it" : "element path");
    return p;
  }
  void run(DType t, Buffers& b, int64_t count, int64_t row, int vec_mode, int nt, const std::vector<double>& scalars) {
    if (auto p = try_run(t, b, count, row, vec_mode, nt, scalars))
      refuse(p->id, t, p->what,
             p->id == ErrId::verify_E022 ? kHintUnwritten : hint_of(p->id));
  }

  void compare_reference(DType t, const Buffers& in, Buffers& got, int64_t count, int64_t row,
                         const std::vector<double>& scalars) {
    if (!f.reference) return;
    dsl::FusionRef ref;
    ref.fusion = &f;
    ref.dtype = t;
    ref.count = count;
    ref.row = row;
    ref.out_in = in.out.data();
    for (size_t k = 0; k < f.operands.size(); ++k) ref.ops_in[k] = in.ops[k].data();
    for (size_t k = 0; k < scalars.size() && k < size_t(dsl::kMaxScalars); ++k) ref.scalars[k] = scalars[k];
    ref.want[0].assign(size_t(count), 0.0);
    ref.tol_of[0].assign(size_t(count), std::nan(""));
    for (size_t k = 0; k < f.operands.size(); ++k) {
      ref.want[k + 1].assign(in.ops[k].size(), 0.0);
      ref.tol_of[k + 1].assign(in.ops[k].size(), std::nan(""));
    }
    try {
      f.reference(ref);
    } catch (const std::exception& e) {
      refuse(ErrId::verify_E022, t, fmt::format("its float64 reference (MK_FUSION_REFERENCE) threw: {}", e.what()),
             kHintReference);
    }
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
                             "elements in rows of {}, scalars {})",
                             name, i, num(g[i]), num(ref.want[j][i]), num(tol), count, row, scalar_list(scalars)),
                 kHintReference);
      }
    };
    cmp("out", got.out, 0);
    for (size_t k = 0; k < f.operands.size(); ++k)
      if (f.operands[k].output) cmp(f.operands[k].name, got.storage(int(k)), k + 1);
  }
  std::string scalar_list(const std::vector<double>& sc) const {
    std::string s;
    for (size_t k = 0; k < f.scalars.size() && k < sc.size(); ++k) s += (s.empty() ? "" : ", ") + num(sc[k]);
    return s.empty() ? "none" : s;
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

  // Output/input pairs the runtime may pass as one buffer (elements of one
  // dtype): each alone, then every pair that passed with distinct operands,
  // together. A pair whose results differ is not refused here: the runtime
  // refuses calls that alias it (alias_refusal), naming why.
  void aliases(DType t, const Buffers& init, Buffers& a, int64_t count, int64_t row) {
    std::vector<std::pair<int, int>> safe;
    for (size_t k = 0; k < f.operands.size(); ++k)
      for (size_t j = 0; j < f.operands.size(); ++j) {
        const OperandInfo &ok = f.operands[k], &oj = f.operands[j];
        if (!ok.output || oj.output || ok.shape != Shape::elem || oj.shape != Shape::elem ||
            operand_dtype(ok, t) != operand_dtype(oj, t))
          continue;
        aliased = true;
        AliasVerdict* v = verdict(int(k), int(j));
        if (!v->why.empty()) continue;  // refused for an earlier dtype or row
        v->why = alias_run(t, init, a, count, row, {{int(k), int(j)}});
        if (v->why.empty()) safe.emplace_back(int(k), int(j));
      }
    // several at once: distinct outputs stored in distinct inputs
    std::vector<std::pair<int, int>> together;
    for (const auto& p : safe)
      if (std::none_of(together.begin(), together.end(),
                       [&](const auto& q) { return q.first == p.first || q.second == p.second; }))
        together.push_back(p);
    if (together.size() > 1 && rep.aliases_together.empty())
      rep.aliases_together = alias_run(t, init, a, count, row, together);
  }
  AliasVerdict* verdict(int k, int j) {
    for (auto& v : rep.aliases)
      if (v.output == k && v.input == j) return &v;
    rep.aliases.push_back({k, j, ""});
    return &rep.aliases.back();
  }
  // Runs with these output operands stored in these inputs' buffers: "" when
  // every result has the bits of the run with separate buffers, else why not.
  std::string alias_run(DType t, const Buffers& init, Buffers& a, int64_t count, int64_t row,
                        const std::vector<std::pair<int, int>>& pairs) {
    Buffers c = init;
    std::string names;
    for (auto [k, j] : pairs) {
      c.alias[k] = j;
      names += fmt::format("{}{} the same buffer as {}", names.empty() ? "" : ", ", f.operands[size_t(k)].name,
                           f.operands[size_t(j)].name);
    }
    if (auto p = try_run(t, c, count, row, 1, o.threads, o.scalars))
      return fmt::format("with {}, fusion {} ({}): {}", names, f.name, name(t), p->what);
    Buffers view = c;
    for (auto [k, j] : pairs) {
      view.alias[k] = -1;
      view.ops[k] = c.ops[size_t(j)];
    }
    if (auto d = first_difference(f, a, view, row, "with separate buffers", ("with " + names).c_str()); !d.empty())
      return fmt::format("fusion {} ({}): {} ({} elements in rows of {}): its code reads an input at an element after "
                         "writing the output stored there",
                         f.name, name(t), d, count, row);
    return {};
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
      run(t, a, count, row, 1, o.threads, o.scalars);
      if (row % V == 0) {
        Buffers e = init;
        run(t, e, count, row, 0, o.threads, o.scalars);
        if (auto d = first_difference(f, a, e, row, "on the vector path", "on the element path"); !d.empty())
          refuse(ErrId::verify_E022, t,
                 fmt::format("{} ({} elements in rows of {}): ranks whose buffers differ in alignment take different "
                             "paths and would get different results",
                             d, count, row),
                 kHintPaths);
      }
      aliases(t, init, a, count, row);
      compare_reference(t, init, a, count, row, o.scalars);
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
                             d),
                 kHintRowLength);
        }
      }
    }
    // The device's block sizes (256 threads for the LL protocol's kernels,
    // 512 for the simple protocol's), on a short row and on one where every
    // thread has several vectors; and the second scalar set, against the
    // reference.
    for (int nt : kDeviceThreads) {
      // one row each: it is about the threads' strides (the threads take turns,
      // and 512 of them are the check's main cost)
      for (int64_t row : {2 * nt * V + V + 1, 2 * nt * V}) {
        if (f.rows == dsl::RowMode::given && row > f.max_row) continue;
        const int64_t count = row;
        const Buffers init = make_buffers(f, t, count, row, o.seed + 7);
        Buffers a = init;
        run(t, a, count, row, 1, nt, o.scalars);
        if (row % V == 0) {
          Buffers e = init;
          run(t, e, count, row, 0, nt, o.scalars);
          if (auto d = first_difference(f, a, e, row, "on the vector path", "on the element path"); !d.empty())
            refuse(ErrId::verify_E022, t,
                   fmt::format("{} ({} elements in rows of {}, {} threads): ranks whose buffers differ in alignment "
                               "take different paths and would get different results",
                               d, count, row, nt),
                   kHintPaths);
        }
        compare_reference(t, init, a, count, row, o.scalars);
      }
      rep.device_threads.push_back(nt);
    }
    {
      const int64_t row = std::min<int64_t>(f.rows == dsl::RowMode::any ? any_count : f.max_row, 2 * o.threads * V + 3);
      const int64_t count = 2 * row;
      const Buffers init = make_buffers(f, t, count, row, o.seed + 11);
      Buffers a = init;
      run(t, a, count, row, 1, o.threads, o.scalars2);
      compare_reference(t, init, a, count, row, o.scalars2);
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
                  kHintBounds, true);
      return s[k];
    }
  };

  void prologue(DType t, const std::vector<double>& scalars) {
    const auto fn = f.pre_host[host_slot(t)];
    std::vector<double> xs = {0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -3.0, 0.125, 1e-3, -7.5};
    for (int i = 0; i < 53; ++i) xs.push_back(4.0 * fused::value(o.seed, 3000, i, t));
    for (double& x : xs) {
      x = dsl::fusion_detail::host_round(x, t);
      PreScalars chk;
      chk.c = this;
      chk.t = t;
      chk.x = x;
      chk.s = scalars.data();
      double y1 = 0, y2 = 0;
      try {
        y1 = dsl::fusion_detail::host_round(fn(x, scalars.data(), &chk), t);
        y2 = dsl::fusion_detail::host_round(fn(x, scalars.data(), &chk), t);
      } catch (const Error&) {
        throw;
      } catch (const std::exception& e) {
        refuse(ErrId::verify_E020, t, fmt::format("input {}: the code threw: {}", num(x), e.what()), kHintBounds, true);
      }
      ++rep.values;
      if (!same_bits(y1, y2))
        refuse(ErrId::verify_E022, t,
               fmt::format("input {} gives {} and then {}: the prologue keeps state between calls, so ranks (and "
                           "elements) would not get the same terms",
                           num(x), num(y1), num(y2)),
               kHintState, true);
      if (f.prologue_reference) {
        const dsl::PrologueRef r = f.prologue_reference(x, scalars.data(), t);
        rep.reference = true;
        const double err = std::fabs(y1 - r.value);
        if (err > rep.max_err) rep.max_err = err, rep.max_tol = r.tol;
        if (!(err <= r.tol))
          refuse(ErrId::verify_E022, t,
                 fmt::format("input {} gives {}, its float64 reference (MK_PROLOGUE_REFERENCE) says {} within {} "
                             "(scalars {})",
                             num(x), num(y1), num(r.value), num(r.tol), scalar_list(scalars)),
                 kHintReference, true);
      }
    }
  }
};

// Only the declared scalars reach the kernel (the rest 0), as in the runtime.
std::vector<double> declared_scalars(const FusionInfo& f, std::vector<double> v) {
  v.resize(size_t(dsl::kMaxScalars), 0.0);
  for (size_t k = f.scalars.size(); k < v.size(); ++k) v[k] = 0.0;
  return v;
}

}  // namespace

FusionCheckReport check_fusion(const FusionInfo& f, const FusionCheckOptions& opt) {
  Checker c{f, opt, {}, false, nullptr};
  if (c.o.threads < 1 || c.o.threads > 64)
    throw Error(ErrId::cli_E011, fmt::format("fusion check: {} threads; 1..64", c.o.threads));
  if (c.o.dtypes.empty()) c.o.dtypes = f.dtypes;
  if (c.o.scalars.empty()) c.o.scalars = {0.5, 0.75, 1.0, 1.25};
  if (c.o.scalars2.empty()) c.o.scalars2 = {0.3, 1.7, 1e-3, 2.9};  // not powers of two
  c.o.scalars = declared_scalars(f, c.o.scalars);
  c.o.scalars2 = declared_scalars(f, c.o.scalars2);
  for (DType t : c.o.dtypes) {
    if (host_slot(t) < 0 || std::find(f.dtypes.begin(), f.dtypes.end(), t) == f.dtypes.end())
      throw Error(ErrId::cli_E013, fmt::format("fusion {} does not serve {}", f.name, name(t)));
    if (!f.pre_source.empty()) {
      if (!f.pre_host[host_slot(t)]) throw Error(ErrId::cli_E013, fmt::format("fusion {}: no host code", f.name));
      c.prologue(t, c.o.scalars);
      c.prologue(t, c.o.scalars2);
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
    s += fmt::format("prologue on {} values of each of {} with two sets of scalars: only declared scalars, the same "
                     "bits on every call",
                     c.rep.values / int64_t(2 * c.o.dtypes.size()), dts);
  if (!f.source.empty()) {
    if (!s.empty()) s += "; ";
    std::string unsafe;
    for (const auto& v : c.rep.aliases)
      if (!v.why.empty())
        unsafe += fmt::format("{}{} as {}", unsafe.empty() ? "" : ", ", f.operands[size_t(v.output)].name,
                              f.operands[size_t(v.input)].name);
    s += fmt::format(
        "epilogue on {}: {} rows ({}) of lengths {} by {} threads each, and rows by {} threads (the kernels' block "
        "sizes), {} accesses: every access inside its row, operands and scalars, writes only to the output and output "
        "operands, every output operand element written, no two threads on one element unordered, block-wide "
        "reductions called evenly; the same bits on the vector and element paths{}{}{}",
        dts, c.rep.rows, f.rows == dsl::RowMode::any ? "element-wise" : "rows given by the call", lens, c.o.threads,
        "256 and 512", c.rep.accesses, f.rows == dsl::RowMode::any ? " and for every row length" : "",
        c.aliased ? " and with an output operand the same buffer as an input where the runtime allows it" : "",
        unsafe.empty() ? "" : fmt::format(" (except {}: the runtime refuses calls that pass those as one buffer)", unsafe));
  }
  s += c.rep.reference ? fmt::format("; within its float64 reference (largest error {:.3g}, tolerance there {:.3g})",
                                     c.rep.max_err, c.rep.max_tol)
                       : "; no float64 reference declared (MK_FUSION_REFERENCE)";
  c.rep.summary = s;
  return c.rep;
}

namespace {
struct Verdict {
  std::optional<Error> error;
  FusionCheckReport report;
};
// One entry per registration and dtype checked; the entries are never
// removed, so a pointer into the map stays valid.
std::mutex& verdicts_mu() {
  static std::mutex m;
  return m;
}
std::map<std::pair<const FusionInfo*, DType>, Verdict>& verdicts() {
  static std::map<std::pair<const FusionInfo*, DType>, Verdict> v;
  return v;
}
const Verdict& verdict_of(const FusionInfo& f, DType t) {
  const std::pair<const FusionInfo*, DType> key{&f, t};
  {
    std::lock_guard<std::mutex> g(verdicts_mu());
    if (auto it = verdicts().find(key); it != verdicts().end()) return it->second;
  }
  // One check at a time (each starts threads); a second caller of the same
  // fusion and dtype waits here and finds the verdict.
  static std::mutex checking;
  std::lock_guard<std::mutex> one(checking);
  {
    std::lock_guard<std::mutex> g(verdicts_mu());
    if (auto it = verdicts().find(key); it != verdicts().end()) return it->second;
  }
  Verdict v;
  try {
    FusionCheckOptions o;
    o.dtypes = {t};
    v.report = check_fusion(f, o);
  } catch (const Error& x) {
    v.error = x;
  }
  std::lock_guard<std::mutex> g(verdicts_mu());
  return verdicts().emplace(key, std::move(v)).first->second;
}
// The dtypes a verdict covers: the one asked for, or every one served.
std::vector<DType> dtypes_of(const FusionInfo& f, std::optional<DType> dtype) {
  if (dtype) {
    if (std::find(f.dtypes.begin(), f.dtypes.end(), *dtype) == f.dtypes.end() || host_slot(*dtype) < 0)
      throw Error(ErrId::cli_E013, fmt::format("fusion {} does not serve {}", f.name, name(*dtype)));
    return {*dtype};
  }
  return f.dtypes;
}
}  // namespace

void check_fusion_once(const FusionInfo& f, std::optional<DType> dtype) {
  for (DType t : dtypes_of(f, dtype))
    if (const Verdict& v = verdict_of(f, t); v.error) throw *v.error;
}

std::string alias_refusal(const FusionInfo& f, const std::vector<std::pair<int, int>>& pairs,
                          std::optional<DType> dtype) {
  for (DType t : dtypes_of(f, dtype)) {
    const Verdict& v = verdict_of(f, t);
    if (v.error) throw *v.error;
    for (auto [k, j] : pairs) {
      const AliasVerdict* found = nullptr;
      for (const auto& a : v.report.aliases)
        if (a.output == k && a.input == j) found = &a;
      if (!found)
        return fmt::format("the checker did not run fusion {} with {} stored in {}", f.name,
                           f.operands[size_t(k)].name, f.operands[size_t(j)].name);
      if (!found->why.empty()) return found->why;
    }
    if (pairs.size() > 1 && !v.report.aliases_together.empty()) return v.report.aliases_together;
  }
  return {};
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
      if (r > 0 && !same_bits(out[size_t(r)][size_t(i)], out[0][size_t(i)])) {
        ++res.rank_diffs;
        if (!o.ranks_may_differ && res.first_bad.empty())
          res.first_bad = fmt::format("rank {} element {}: {} where rank 0 has {} (ranks differ bit-wise, although the "
                                      "verifier proves them bit-identical)",
                                      r, i, num(out[size_t(r)][size_t(i)]), num(out[0][size_t(i)]));
      }
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
    if (r > 0 && !o.ranks_may_differ)
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
