#include "tests/runtime/fake.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <sstream>
#include <thread>

namespace mkt {

Driver driver() {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!h) h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) return Driver::missing;
  auto is_fake = reinterpret_cast<int (*)()>(dlsym(h, "mkfake_is_fake"));
  return is_fake && is_fake() == 1 ? Driver::fake : Driver::real;
}

bool use_fake() {
  switch (driver()) {
    case Driver::fake: return true;
    case Driver::real:
      MESSAGE("SKIPPED: libcuda.so.1 is a real NVIDIA driver, not the fake; these tests only run against "
              "build/tests/fake_cuda/libcuda.so.1");
      return false;
    case Driver::missing:
      FAIL_CHECK("no libcuda.so.1 at all: run through ctest, or set "
                 "LD_LIBRARY_PATH=<build>/tests/fake_cuda");
      return false;
  }
  return false;
}

mkfake_counts counts() {
  mkfake_counts c{};
  require_fn<decltype(mkfake_get_counts)>("mkfake_get_counts")(&c);
  return c;
}

mkfake_launch last_launch() {
  mkfake_launch l{};
  REQUIRE(require_fn<decltype(mkfake_last_launch)>("mkfake_last_launch")(&l) == 1);
  return l;
}

std::string leaks(const mkfake_counts& a, const mkfake_counts& b) {
  std::ostringstream o;
  auto cmp = [&](const char* what, int64_t x, int64_t y) {
    if (x != y) o << what << " " << x << " -> " << y << "; ";
  };
  cmp("device allocations", a.device_allocs, b.device_allocs);
  cmp("host allocations", a.host_allocs, b.host_allocs);
  cmp("VMM handles", a.vmm_handles, b.vmm_handles);
  cmp("VMM mappings", a.vmm_mappings, b.vmm_mappings);
  cmp("reserved ranges", a.reserved_ranges, b.reserved_ranges);
  cmp("IPC opens", a.ipc_opens, b.ipc_opens);
  cmp("modules", a.modules, b.modules);
  cmp("streams", a.streams, b.streams);
  cmp("events", a.events, b.events);
  cmp("graphs", a.graphs, b.graphs);
  cmp("context retains", a.ctx_retains, b.ctx_retains);
  return o.str();
}

Device::Device(int d) : device(d) {
  REQUIRE(cu().cuDevicePrimaryCtxRetain(&ctx, d) == CUDA_SUCCESS);
  REQUIRE(cu().cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
  REQUIRE(cu().cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
}

Device::~Device() {
  cu().cuCtxSetCurrent(ctx);
  cu().cuStreamDestroy(stream);
  cu().cuCtxSetCurrent(nullptr);
  cu().cuDevicePrimaryCtxRelease(device);
}

Buffer::Buffer(const Device& d, size_t n) : ctx(d.ctx), bytes(n) {
  mk::rt::CtxGuard g(ctx);
  REQUIRE(cu().cuMemAlloc(&p, n) == CUDA_SUCCESS);
}

Buffer::~Buffer() {
  mk::rt::CtxGuard g(ctx);
  cu().cuMemFree(p);
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

double bound_ms(double ms) { return std::getenv("MKT_SLOW") ? ms * 30 : ms; }

mkComm_t one_rank() {
  mkUniqueId id;
  REQUIRE(mkGetUniqueId(&id) == mkSuccess);
  mkComm_t comm = nullptr;
  REQUIRE_MESSAGE(mkCommInitRank(&comm, 1, id, 0) == mkSuccess, mkGetLastError(nullptr));
  return comm;
}

mkResult_t settle(mkComm_t comm, double ms) {
  mkResult_t e = mkInProgress;
  const auto t0 = std::chrono::steady_clock::now();
  while (e == mkInProgress && ms_since(t0) < bound_ms(ms)) {
    REQUIRE(mkCommGetAsyncError(comm, &e) == mkSuccess);
    if (e == mkInProgress) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return e;
}

void launch_hung(mkComm_t comm, CUstream stream, void* buf) {
  auto hang = require_fn<decltype(mkfake_hang)>("mkfake_hang");
  hang(1);
  const mkResult_t r = mkAllReduce(buf, buf, 64, mkFloat32, mkSum, comm, stream);
  hang(0);
  REQUIRE_MESSAGE(r == mkSuccess, mkGetLastError(comm));
}

}  // namespace mkt
