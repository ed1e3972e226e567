#include "runtime/handles.hpp"

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "runtime/status.hpp"

namespace mk::rt {
namespace {

std::mutex& table_mutex() {
  static std::mutex m;
  return m;
}
std::unordered_map<const void*, std::shared_ptr<Comm>>& table() {
  static auto* t = new std::unordered_map<const void*, std::shared_ptr<Comm>>;  // outlives static destructors
  return *t;
}

}  // namespace

mkComm_t publish(std::shared_ptr<Comm> c) {
  auto h = reinterpret_cast<mkComm_t>(c.get());
  std::lock_guard<std::mutex> lock(table_mutex());
  table()[c.get()] = std::move(c);
  return h;
}

std::shared_ptr<Comm> acquire(mkComm_t h) {
  if (!h) fail(mkInvalidArgument, "the communicator is NULL");
  std::lock_guard<std::mutex> lock(table_mutex());
  auto it = table().find(h);
  if (it == table().end())
    fail(mkInvalidArgument, "invalid communicator: destroyed, aborted, or not created by mkCommInit*");
  return it->second;
}

std::shared_ptr<Comm> retire(mkComm_t h) {
  std::lock_guard<std::mutex> lock(table_mutex());
  auto it = table().find(h);
  if (it == table().end()) return nullptr;
  auto c = std::move(it->second);
  table().erase(it);
  return c;
}

bool wait_sole_owner(const std::shared_ptr<Comm>& c, int64_t bound_ms) {
  // No new reference can appear once the handle is retired: references are
  // only taken from the table (and by calls already inside).
  const auto t0 = std::chrono::steady_clock::now();
  while (c.use_count() > 1) {
    if (bound_ms >= 0 && std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(bound_ms)) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  // What the other threads wrote before dropping their references happens
  // before the caller frees.
  std::atomic_thread_fence(std::memory_order_acquire);
  return true;
}

}  // namespace mk::rt
