// Independent jobs on several cores: side_by_side for the compiler's two size
// buckets (sync and proof in the pipeline, code generation: seconds each at
// 1024 ranks), work_queue for many plans (mkc prebuild, mkCommPrewarm).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <system_error>
#include <thread>
#include <vector>

namespace mk {

// Runs f(0) .. f(n - 1): f(0) and f(1) side by side where the machine has a
// second core and a thread can be started (else one after the other), the
// rest after them. Then rethrows the first failure in index order, whichever
// finished first. The calls must not share mutable state.
template <class F>
void side_by_side(size_t n, F&& f) {
  std::vector<std::exception_ptr> failed(n);
  auto run = [&](size_t k) {
    try {
      f(k);
    } catch (...) {
      failed[k] = std::current_exception();
    }
  };
  std::thread other;
  if (n > 1 && std::thread::hardware_concurrency() > 1) try {
      other = std::thread(run, size_t(1));
    } catch (const std::system_error&) {  // no thread to be had: one after the other
    }
  const bool two = other.joinable();
  run(0);
  if (two) other.join();
  for (size_t k = two ? 2 : 1; k < n; ++k) run(k);
  for (const auto& e : failed)
    if (e) std::rethrow_exception(e);
}

// Runs f(0) .. f(n - 1) on up to `workers` threads, the caller's included,
// each taking the next index until none is left. A thread that cannot be
// started (a process or thread limit) leaves its share to the others. f must
// not throw: it records its own failures.
template <class F>
void work_queue(size_t n, size_t workers, F&& f) {
  std::atomic<size_t> next{0};
  auto run = [&] {
    for (size_t i; (i = next++) < n;) f(i);
  };
  std::vector<std::thread> pool;
  try {
    for (size_t w = 1; w < std::min(n, workers); ++w) pool.emplace_back(run);
  } catch (const std::system_error&) {
  }
  run();
  for (auto& t : pool) t.join();
}

}  // namespace mk
