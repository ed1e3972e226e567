#include "runtime/driver/cuda_driver.hpp"

#include <dlfcn.h>

#include <mutex>

#include "runtime/api/status.hpp"

namespace mk::rt {
namespace {

#define MK_STR2(x) #x
#define MK_STR(x) MK_STR2(x)

struct Loaded {
  Driver d;
  std::string error;
  bool ok = false;
};

Loaded& loaded() {
  static Loaded l;
  static std::once_flag once;
  std::call_once(once, [] {
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      l.error = std::string("no NVIDIA driver: dlopen(libcuda.so.1) failed: ") + dlerror();
      return;
    }
#define MK_CU_LOAD(name)                                                                  \
  l.d.name = reinterpret_cast<decltype(&::name)>(dlsym(h, MK_STR(name)));                 \
  if (!l.d.name) {                                                                        \
    l.error = std::string("libcuda.so.1 lacks ") + MK_STR(name) + " (driver too old?)"; \
    return;                                                                               \
  }
    MK_CU_FUNCS(MK_CU_LOAD)
#undef MK_CU_LOAD
    l.d.cuFuncLoad = reinterpret_cast<CUresult (*)(CUfunction)>(dlsym(h, "cuFuncLoad"));
    l.d.cuLaunchKernelEx = reinterpret_cast<CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**)>(
        dlsym(h, "cuLaunchKernelEx"));
    CUresult r = l.d.cuInit(0);
    if (r != CUDA_SUCCESS) {
      const char* s = nullptr;
      l.d.cuGetErrorString(r, &s);
      l.error = std::string("cuInit failed: ") + (s ? s : "unknown error");
      return;
    }
    l.ok = true;
  });
  return l;
}

}  // namespace

const Driver& cu() {
  Loaded& l = loaded();
  if (!l.ok) throw RtError(mkSystemError, l.error);
  return l.d;
}

bool cuda_available(std::string* why) {
  Loaded& l = loaded();
  if (!l.ok) {
    if (why) *why = l.error;
    return false;
  }
  int n = 0;
  if (l.d.cuDeviceGetCount(&n) != CUDA_SUCCESS || n == 0) {
    if (why) *why = "the NVIDIA driver reports no GPU";
    return false;
  }
  return true;
}

std::string cu_error_string(CUresult r) {
  Loaded& l = loaded();
  const char* name = nullptr;
  const char* desc = nullptr;
  if (l.d.cuGetErrorName) l.d.cuGetErrorName(r, &name);
  if (l.d.cuGetErrorString) l.d.cuGetErrorString(r, &desc);
  return std::string(name ? name : "CUDA error " + std::to_string(int(r))) + " (" + (desc ? desc : "?") + ")";
}

}  // namespace mk::rt
