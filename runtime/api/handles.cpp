#include "runtime/api/handles.hpp"

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "runtime/api/status.hpp"

namespace mk::rt {
namespace {

std::mutex& table_mutex() {
  static std::mutex m;
  return m;
}
std::unordered_map<uintptr_t, std::shared_ptr<Comm>>& table() {
  static auto* t = new std::unordered_map<uintptr_t, std::shared_ptr<Comm>>;  // outlives static destructors
  return *t;
}

// Handles are kTag | (n << 4) for n = 1, 2, ...: never 0, never reused (2^44
// communicators per process), above the 47-bit user address space of x86-64
// and aarch64 (a dereference faults), and recognisable in a debugger.
constexpr uintptr_t kTag = uintptr_t(0x6d6b) << 48;  // "mk"
std::atomic<uint64_t> next_id{1};

}  // namespace

mkComm_t publish(std::shared_ptr<Comm> c) {
  const uintptr_t h = kTag | (uintptr_t(next_id.fetch_add(1)) << 4);
  std::lock_guard<std::mutex> lock(table_mutex());
  table()[h] = std::move(c);
  return reinterpret_cast<mkComm_t>(h);
}

std::shared_ptr<Comm> acquire(mkComm_t h) {
  if (!h) fail(mkInvalidArgument, "the communicator is NULL");
  std::lock_guard<std::mutex> lock(table_mutex());
  auto it = table().find(reinterpret_cast<uintptr_t>(h));
  if (it == table().end())
    fail(mkInvalidArgument, "invalid communicator: destroyed, aborted, or not created by mkCommInit*");
  return it->second;
}

std::shared_ptr<Comm> retire(mkComm_t h) {
  std::lock_guard<std::mutex> lock(table_mutex());
  auto it = table().find(reinterpret_cast<uintptr_t>(h));
  if (it == table().end()) return nullptr;
  auto c = std::move(it->second);
  table().erase(it);
  return c;
}

bool wait_sole_owner(const std::shared_ptr<Comm>& c, int64_t bound_ms, bool unless_compiling) {
  // No new reference can appear once the handle is retired: references are
  // only taken from the table (and by calls already inside).
  const auto t0 = std::chrono::steady_clock::now();
  while (c.use_count() > 1) {
    // A caller may hold several references (its call and its pending work),
    // so compiling callers cannot be told apart by count: stop waiting; such
    // a call frees the communicator when it returns.
    if (unless_compiling && c->compiling.load() > 0) return false;
    if (bound_ms >= 0 && std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(bound_ms)) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  // What the other threads wrote before dropping their references happens
  // before the caller frees.
  std::atomic_thread_fence(std::memory_order_acquire);
  return true;
}

}  // namespace mk::rt
