// Vector clocks over thread-block chains, projected onto a block of chains,
// with a memory budget. Shared by insert_sync and verify_sync.
//
// Ops of one (rank, thread block) form a chain, totally ordered by program
// order; every other ordering is an edge between chains. Op a happens before
// op b exactly when clock(b)[chain(a)] >= pos(a), where clock(b)[c] is the
// latest position of chain c that reaches b (positions are 1-based, 0 is
// none) and clock(b) is the entrywise max over b's predecessors plus b's own
// position. A clock has one entry per chain, so a schedule of n ops and C
// chains would need n x C entries to keep every clock (1024 ranks: ~270k ops
// x ~10k chains, gigabytes). Two things bound it:
//
//  - A clock is kept only while something still reads it (each snapshot has a
//    use count; a chain's running clock lives in a slot of its own).
//  - Max and compare are per entry, so the computation restricted to chains
//    [lo, hi) is exact for those entries. A pass computes one block of
//    entries and answers the queries about those chains; enough passes cover
//    every chain. The work over all passes is the same as one full pass; only
//    the walk over the ops repeats. The block width comes from the budget and
//    the most clocks alive at once, found by a first pass with width 0.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace mk::verify {

// Bytes of clock memory a pass may use, by default.
inline constexpr size_t kClockBudget = size_t(256) << 20;

// dst[i] = max(dst[i], src[i]) for i < w (a multiple of 16); compiled for
// AVX2 and for the baseline, picked at run time (the join is the hot loop).
void join_clocks(int16_t* dst, const int16_t* src, size_t w);
void join_clocks(int32_t* dst, const int32_t* src, size_t w);

// Slots of `width` entries: one running clock per chain, plus snapshots that
// are allocated and released by use count.
template <class T>
class ClockPool {
 public:
  // `snapshots`: how many may be alive at once (reserved up front: growing a
  // store of hundreds of megabytes copies and faults it in again).
  ClockPool(size_t lo, size_t width, size_t nchains, size_t snapshots = 0) : lo_(lo), w_(width), nchains_(nchains) {
    store_.reserve((nchains + snapshots) * w_);
    store_.assign(nchains * w_, 0);
    uses_.reserve(snapshots);
  }
  // Starts the next block of chains, keeping the memory (faulting in a few
  // hundred megabytes again per block costs more than the block's work).
  void restart(size_t lo) {
    lo_ = lo;
    store_.resize(nchains_ * w_);
    std::fill(store_.begin(), store_.end(), T(0));
    uses_.clear();
    free_.clear();
  }
  size_t lo() const { return lo_; }
  size_t width() const { return w_; }
  bool covers(size_t chain) const { return chain >= lo_ && chain < lo_ + w_; }

  T* running(size_t chain) { return store_.data() + chain * w_; }
  // A snapshot slot holding a copy of `src` (a clock of this pool); `uses`
  // reads release it. Pointers into the pool are invalid afterwards.
  int32_t snapshot(const T* src, int32_t uses) {
    // `src` may point into the store, which may move below: keep its offset.
    const size_t from = size_t(src - store_.data());
    int32_t slot;
    if (!free_.empty()) {
      slot = free_.back();
      free_.pop_back();
    } else {
      slot = int32_t(uses_.size());
      uses_.push_back(0);
      store_.resize(store_.size() + w_, 0);
    }
    uses_[size_t(slot)] = uses;
    std::copy_n(store_.data() + from, w_, at(slot));
    live_ = std::max(live_, uses_.size() - free_.size());
    return slot;
  }
  T* at(int32_t slot) { return store_.data() + (nchains_ + size_t(slot)) * w_; }
  // One read of a snapshot: dst = max(dst, snapshot); the last read frees it.
  void join_from(T* dst, int32_t slot) {
    join(dst, at(slot), w_);
    if (--uses_[size_t(slot)] == 0) free_.push_back(slot);
  }
  // A read that only drops a use (the value is not needed).
  void drop(int32_t slot) {
    if (--uses_[size_t(slot)] == 0) free_.push_back(slot);
  }
  void set_own(T* clock, size_t chain, T pos) {
    if (covers(chain)) clock[chain - lo_] = pos;
  }
  bool has(const T* clock, size_t chain, T pos) const { return clock[chain - lo_] >= pos; }
  size_t max_snapshots() const { return live_; }

  static void join(T* dst, const T* src, size_t w) { join_clocks(dst, src, w); }

 private:
  size_t lo_, w_, nchains_;
  std::vector<T> store_;
  std::vector<int32_t> uses_;
  std::vector<int32_t> free_;
  size_t live_ = 0;
};

// The entry type for chains of up to `longest` ops.
template <class F>
void with_entry_type(size_t longest, F&& f) {
  if (longest < 0x7fff)
    f(int16_t{});
  else
    f(int32_t{});
}

// Runs `pass(pool)` once with width 0 (to count the snapshots alive at once)
// and then once per block of chains, each block as wide as `budget` bytes
// allow (a multiple of 16, at least 16).
template <class T, class Pass>
void for_each_chain_block(size_t nchains, size_t budget, Pass&& pass) {
  size_t live = 0;
  {
    ClockPool<T> dry(0, 0, nchains);
    pass(dry);
    live = dry.max_snapshots();
  }
  const size_t slots = live + nchains;
  size_t width = budget / (slots * sizeof(T));
  width = std::max<size_t>(16, width / 16 * 16);
  width = std::min(width, (nchains + 15) / 16 * 16);
  ClockPool<T> pool(0, width, nchains, live);
  for (size_t lo = 0; lo < nchains; lo += width) {
    if (lo) pool.restart(lo);
    pass(pool);
  }
}

}  // namespace mk::verify
