#include "runtime/memory/memory.hpp"

#include <unistd.h>

#include <algorithm>

#include "runtime/driver/cuda_driver.hpp"
#include "runtime/api/status.hpp"

namespace mk::rt {
namespace {

CUmemAllocationProp prop_for(CUdevice device) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = device;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return p;
}

void set_access(CUdeviceptr base, size_t size, const std::vector<CUdevice>& devices) {
  std::vector<CUmemAccessDesc> d(devices.size());
  for (size_t i = 0; i < devices.size(); ++i) {
    d[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d[i].location.id = devices[i];
    d[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  MK_CU(cu().cuMemSetAccess(base, size, d.data(), d.size()), "granting GPU access to symmetric memory");
}

}  // namespace

size_t arena_granularity(CUdevice device) {
  CUmemAllocationProp p = prop_for(device);
  size_t g = 0;
  MK_CU(cu().cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
        "querying the VMM granularity");
  return g ? g : (2u << 20);
}

namespace {

// Reserves address space for `size` bytes and maps `handle` there; on failure
// releases what it took (and the handle) and throws, saying `what`.
CUdeviceptr reserve_and_map(CUmemGenericAllocationHandle handle, size_t size, CUdevice device, const char* what) {
  const Driver& d = cu();
  CUdeviceptr base = 0;
  CUresult r = d.cuMemAddressReserve(&base, size, arena_granularity(device), 0, 0);
  if (r != CUDA_SUCCESS) {
    d.cuMemRelease(handle);
    MK_CU(r, std::string("reserving address space for ") + what);
  }
  r = d.cuMemMap(base, size, 0, handle, 0);
  if (r != CUDA_SUCCESS) {
    d.cuMemAddressFree(base, size);
    d.cuMemRelease(handle);
    MK_CU(r, std::string("mapping ") + what + " (can these GPUs reach each other over NVLink/PCIe P2P?)");
  }
  return base;
}

}  // namespace

void Arena::allocate(CUdevice device, size_t size, size_t zeroed) {
  const Driver& d = cu();
  int vmm = 0, fdh = 0;
  d.cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device);
  d.cuDeviceGetAttribute(&fdh, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, device);
  if (!vmm || !fdh)
    fail(mkSystemError, "GPU " + std::to_string(device) +
                            " does not support the CUDA virtual memory API with shareable handles; mKernel needs it "
                            "for symmetric memory");
  device_ = device;
  const size_t g = arena_granularity(device);
  size_ = (size + g - 1) / g * g;
  CUmemAllocationProp p = prop_for(device);
  MK_CU(d.cuMemCreate(&handle_, size_, &p, 0), "allocating " + std::to_string(size_) + " bytes of symmetric memory");
  try {
    base_ = reserve_and_map(handle_, size_, device, "symmetric memory");
  } catch (...) {
    handle_ = 0;
    throw;
  }
  set_access(base_, size_, {device});
  // Filled on a private stream and waited for: peers may signal into these
  // flags and write Lamport packets into this scratch as soon as setup ends.
  // Scratch regions are never handed out twice, so a Lamport kernel's slots
  // are all ones until it runs. (A context-wide sync could wait for kernels
  // of other communicators that wait for this very thread.)
  zeroed = std::min(zeroed, size_);
  CUstream s = nullptr;
  MK_CU(d.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "creating a setup stream");
  CUresult z = d.cuMemsetD8Async(base_, 0, zeroed, s);
  if (z == CUDA_SUCCESS && size_ > zeroed) z = d.cuMemsetD8Async(base_ + zeroed, 0xFF, size_ - zeroed, s);
  CUresult w = z == CUDA_SUCCESS ? d.cuStreamSynchronize(s) : z;
  d.cuStreamDestroy(s);
  MK_CU(w, "initialising symmetric memory");
}

void Arena::grant(const std::vector<CUdevice>& devices) {
  if (!base_ || devices.empty()) return;
  std::vector<CUdevice> all{device_};
  for (CUdevice x : devices)
    if (x != device_) all.push_back(x);
  set_access(base_, size_, all);
}

int Arena::export_fd() const {
  int fd = -1;
  MK_CU(cu().cuMemExportToShareableHandle(&fd, handle_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
        "exporting symmetric memory");
  return fd;
}

void Arena::release() {
  if (!base_) return;
  const Driver& d = cu();
  d.cuMemUnmap(base_, size_);
  d.cuMemAddressFree(base_, size_);
  d.cuMemRelease(handle_);  // freed once every peer's mapping is gone, too
  base_ = 0;
}

Arena::~Arena() {
  try {
    release();
  } catch (...) {
  }
}

void PeerMapping::map(int fd, size_t size, CUdevice device) {
  const Driver& d = cu();
  CUresult r = d.cuMemImportFromShareableHandle(&handle_, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  ::close(fd);
  MK_CU(r, "importing a peer's symmetric memory");
  size_ = size;
  try {
    base_ = reserve_and_map(handle_, size_, device, "a peer's memory");
  } catch (...) {
    handle_ = 0;
    throw;
  }
  set_access(base_, size_, {device});
}

PeerMapping::~PeerMapping() {
  if (!base_) return;
  const Driver& d = cu();
  d.cuMemUnmap(base_, size_);
  d.cuMemAddressFree(base_, size_);
  d.cuMemRelease(handle_);
}

}  // namespace mk::rt
