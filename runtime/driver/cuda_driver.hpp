// The CUDA driver API, opened lazily with dlopen("libcuda.so.1"): binaries
// link no CUDA library, load on machines without a GPU, and fail with a clear
// error only when a GPU is actually needed. The function table is filled with
// the versioned symbols cuda.h maps each name to (cuMemAlloc -> cuMemAlloc_v2).
#pragma once

#include <cuda.h>

#include <string>

namespace mk::rt {

#define MK_CU_FUNCS(X)                 \
  X(cuInit)                            \
  X(cuDriverGetVersion)                \
  X(cuGetErrorString)                  \
  X(cuGetErrorName)                    \
  X(cuDeviceGet)                       \
  X(cuDeviceGetCount)                  \
  X(cuDeviceGetAttribute)              \
  X(cuDeviceGetName)                   \
  X(cuDeviceGetUuid)                   \
  X(cuDeviceCanAccessPeer)             \
  X(cuDeviceGetP2PAttribute)           \
  X(cuDeviceGetPCIBusId)               \
  X(cuDevicePrimaryCtxRetain)          \
  X(cuDevicePrimaryCtxRelease)         \
  X(cuCtxSetCurrent)                   \
  X(cuCtxGetCurrent)                   \
  X(cuCtxGetDevice)                    \
  X(cuCtxSynchronize)                  \
  X(cuStreamGetCtx)                    \
  X(cuStreamSynchronize)               \
  X(cuStreamQuery)                     \
  X(cuStreamGetId)                     \
  X(cuStreamIsCapturing)               \
  X(cuThreadExchangeStreamCaptureMode) \
  X(cuMemAlloc)                        \
  X(cuMemFree)                         \
  X(cuMemcpyHtoD)                      \
  X(cuMemcpyDtoH)                      \
  X(cuMemsetD8)                        \
  X(cuMemHostAlloc)                    \
  X(cuMemHostGetDevicePointer)         \
  X(cuMemFreeHost)                     \
  X(cuMemGetAddressRange)              \
  X(cuPointerGetAttribute)             \
  X(cuPointerGetAttributes)            \
  X(cuEventQuery)                      \
  X(cuMemGetAllocationGranularity)     \
  X(cuMemCreate)                       \
  X(cuMemRelease)                      \
  X(cuMemAddressReserve)               \
  X(cuMemAddressFree)                  \
  X(cuMemMap)                          \
  X(cuMemUnmap)                        \
  X(cuMemSetAccess)                    \
  X(cuMemExportToShareableHandle)      \
  X(cuMemImportFromShareableHandle)    \
  X(cuModuleLoadData)                  \
  X(cuModuleUnload)                    \
  X(cuModuleGetFunction)               \
  X(cuFuncGetAttribute)                \
  X(cuOccupancyMaxActiveBlocksPerMultiprocessor) \
  X(cuLaunchKernel)                    \
  X(cuEventCreate)                     \
  X(cuStreamCreate)                    \
  X(cuStreamDestroy)                   \
  X(cuMemsetD8Async)                   \
  X(cuMemcpyHtoDAsync)                 \
  X(cuMemcpyDtoDAsync)                 \
  X(cuEventDestroy)                    \
  X(cuEventRecord)                     \
  X(cuStreamWaitEvent)                 \
  X(cuIpcGetMemHandle)                 \
  X(cuIpcOpenMemHandle)                \
  X(cuIpcCloseMemHandle)               \
  X(cuCtxEnablePeerAccess)

struct Driver {
#define MK_CU_FIELD(name) decltype(&::name) name = nullptr;
  MK_CU_FUNCS(MK_CU_FIELD)
#undef MK_CU_FIELD
  // Optional (newer drivers): forces a lazily loaded kernel to load now.
  CUresult (*cuFuncLoad)(CUfunction) = nullptr;
  // Optional (CUDA 12+): launches with attributes (programmatic dependent launch).
  CUresult (*cuLaunchKernelEx)(const CUlaunchConfig*, CUfunction, void**, void**) = nullptr;
};

// The loaded driver, cuInit done. Throws mk::Error (runtime) when the driver
// is missing: "no NVIDIA driver (libcuda.so.1) on this machine".
const Driver& cu();
// True when a usable driver with at least one device is present (no throw).
bool cuda_available(std::string* why = nullptr);

// "CUDA_ERROR_INVALID_VALUE (invalid argument)"
std::string cu_error_string(CUresult r);

// Makes `ctx` current for a scope and restores the previous one.
class CtxGuard {
 public:
  explicit CtxGuard(CUcontext ctx) {
    cu().cuCtxGetCurrent(&prev_);
    if (prev_ != ctx) {
      cu().cuCtxSetCurrent(ctx);
      switched_ = true;
    }
  }
  ~CtxGuard() {
    if (switched_) cu().cuCtxSetCurrent(prev_);
  }
  CtxGuard(const CtxGuard&) = delete;
  CtxGuard& operator=(const CtxGuard&) = delete;

 private:
  CUcontext prev_ = nullptr;
  bool switched_ = false;
};

}  // namespace mk::rt
