// Helpers for the runtime tests against the fake driver (tests/fake_cuda).
#pragma once

#include <doctest/doctest.h>

#include <chrono>
#include <string>

#include "mk.h"
#include "runtime/driver/cuda_driver.hpp"
#include "tests/fake_cuda/fake_cuda.h"

namespace mkt {

#define MKT_STR2(x) #x
#define MKT_STR(x) MKT_STR2(x)
// A driver function of the fake by its cuda.h name (versioned symbol):
// MKT_FN(cuStreamBeginCapture)(stream, mode)
#define MKT_FN(name) (*::mkt::require_fn<decltype(::name)>(MKT_STR(name)))

// How the libcuda.so.1 this process loads relates to the fake.
enum class Driver { fake, real, missing };
Driver driver();

// Starts every test: true with the fake; otherwise the test says why and
// skips (a real driver: never run these on a GPU host), or fails (no driver
// at all: run through ctest, which sets LD_LIBRARY_PATH).
bool use_fake();
#define MKT_REQUIRE_FAKE() \
  if (!::mkt::use_fake()) return

template <typename F>
F* require_fn(const char* name) {
  F* f = mkfake_fn<F>(name);
  if (!f) FAIL("the fake libcuda.so.1 lacks " << name);
  return f;
}

mkfake_counts counts();
mkfake_launch last_launch();
// Every live count of `a` equals `b` (launches aside); names the differences.
std::string leaks(const mkfake_counts& before, const mkfake_counts& after);

// Milliseconds since t0.
double ms_since(std::chrono::steady_clock::time_point t0);
// A bound on how long a call may take: generous, and much more so under
// valgrind (MKT_SLOW, set by the memcheck run), where threads crawl.
double bound_ms(double ms);
// A one-rank communicator on the current device (REQUIREd to succeed).
mkComm_t one_rank();
// Polls mkCommGetAsyncError until `comm` is no longer in progress or
// bound_ms(ms) passed; returns the last state.
mkResult_t settle(mkComm_t comm, double ms = 10000);

// A 64-float all-reduce on `buf` whose kernel stays "running" (mkfake_hang)
// until the communicator's abort word is raised or mkfake_release().
void launch_hung(mkComm_t comm, CUstream stream, void* buf);

// The runtime's driver table (the fake, loaded by the runtime).
inline const mk::rt::Driver& cu() { return mk::rt::cu(); }

// The primary context of `device`, retained and made current; released by
// the destructor.
class Device {
 public:
  explicit Device(int device);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  CUcontext ctx = nullptr;
  CUstream stream = nullptr;  // a non-blocking stream of this device
  int device = 0;
};

// A cuMemAlloc buffer freed by the destructor (in its device's context).
struct Buffer {
  Buffer(const Device& d, size_t bytes);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* ptr() const { return reinterpret_cast<void*>(static_cast<uintptr_t>(p)); }
  CUcontext ctx;
  CUdeviceptr p = 0;
  size_t bytes;
};

}  // namespace mkt
