// Two independent jobs on two cores: the compiler's size buckets (sync and
// proof in the pipeline, code generation) each take seconds at 1024 ranks.
#pragma once

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

}  // namespace mk
