// The fake driver itself: it must react like the real one where the runtime
// relies on it.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/runtime/fake.hpp"

using mkt::cu;

namespace {

// A minimal 64-bit ELF header of machine EM_CUDA, followed by `names`.
std::string cuda_elf(const std::string& names) {
  std::string img(64, '\0');
  img[0] = 0x7f, img[1] = 'E', img[2] = 'L', img[3] = 'F';
  img[4] = 2;  // ELFCLASS64
  img[5] = 1;  // little endian
  img[18] = char(190);  // EM_CUDA
  const uint64_t shoff = 64;
  const uint16_t shentsize = 1, shnum = uint16_t(names.size());
  std::memcpy(&img[40], &shoff, 8);
  std::memcpy(&img[58], &shentsize, 2);
  std::memcpy(&img[60], &shnum, 2);
  return img + names;
}

}  // namespace

TEST_CASE("fake: cuModuleLoadData refuses what is not a CUDA ELF, functions are found by name") {
  MKT_REQUIRE_FAKE();
  mkt::Device dev(0);
  CUmodule m = nullptr;
  const char junk[] = "this is not a cubin, just some text that is long enough for an ELF header..............";
  CHECK(cu().cuModuleLoadData(&m, junk) == CUDA_ERROR_INVALID_IMAGE);
  std::string x86 = cuda_elf(std::string("kern\0", 5));
  x86[18] = 62;  // EM_X86_64
  CHECK(cu().cuModuleLoadData(&m, x86.data()) == CUDA_ERROR_INVALID_IMAGE);
  const std::string img = cuda_elf(std::string("mk_kern\0other\0", 14));
  REQUIRE(cu().cuModuleLoadData(&m, img.data()) == CUDA_SUCCESS);
  CUfunction f = nullptr;
  CHECK(cu().cuModuleGetFunction(&f, m, "mk_kern") == CUDA_SUCCESS);
  CHECK(cu().cuModuleGetFunction(&f, m, "mk_ker") == CUDA_ERROR_NOT_FOUND);  // a prefix is not a name
  CHECK(cu().cuModuleGetFunction(&f, m, "absent") == CUDA_ERROR_NOT_FOUND);
  CHECK(cu().cuModuleUnload(m) == CUDA_SUCCESS);
  CHECK(cu().cuModuleUnload(m) == CUDA_ERROR_INVALID_HANDLE);
}

TEST_CASE("fake: pointer attributes for device, host and malloc memory") {
  MKT_REQUIRE_FAKE();
  mkt::Device dev(1);
  mkt::Buffer b(dev, 1000);
  unsigned type = 0;
  int ordinal = -1;
  CHECK(cu().cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, b.p + 10) == CUDA_SUCCESS);
  CHECK(type == CU_MEMORYTYPE_DEVICE);
  CHECK(cu().cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, b.p) == CUDA_SUCCESS);
  CHECK(ordinal == 1);
  CUdeviceptr base = 0;
  size_t size = 0;
  CHECK(cu().cuMemGetAddressRange(&base, &size, b.p + 999) == CUDA_SUCCESS);
  CHECK(base == b.p);
  CHECK(size == 1000);
  CHECK(cu().cuMemGetAddressRange(&base, &size, b.p + 1000) == CUDA_ERROR_INVALID_VALUE);
  void* host = nullptr;
  REQUIRE(cu().cuMemHostAlloc(&host, 256, CU_MEMHOSTALLOC_DEVICEMAP) == CUDA_SUCCESS);
  CHECK(cu().cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CUdeviceptr(uintptr_t(host))) ==
        CUDA_SUCCESS);
  CHECK(type == CU_MEMORYTYPE_HOST);
  CUdeviceptr dp = 0;
  CHECK(cu().cuMemHostGetDevicePointer(&dp, host, 0) == CUDA_SUCCESS);
  CHECK(dp == CUdeviceptr(uintptr_t(host)));
  CHECK(cu().cuMemFreeHost(host) == CUDA_SUCCESS);
  CHECK(cu().cuMemFreeHost(host) == CUDA_ERROR_INVALID_VALUE);  // double free
  std::vector<char> plain(64);
  CHECK(cu().cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CUdeviceptr(uintptr_t(plain.data()))) ==
        CUDA_ERROR_INVALID_VALUE);
  CHECK(cu().cuMemFree(CUdeviceptr(uintptr_t(plain.data()))) == CUDA_ERROR_INVALID_VALUE);
  // Several at once: unknown memory is not an error there (as documented).
  CUpointer_attribute attrs[2] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_RANGE_SIZE};
  void* data[2] = {&type, &size};
  CHECK(MKT_FN(cuPointerGetAttributes)(2, attrs, data, b.p + 1) == CUDA_SUCCESS);
  CHECK(type == CU_MEMORYTYPE_DEVICE);
  CHECK(size == 1000);
  CHECK(MKT_FN(cuPointerGetAttributes)(2, attrs, data, CUdeviceptr(uintptr_t(plain.data()))) == CUDA_SUCCESS);
  CHECK(type == 0);
}

TEST_CASE("fake: cuMemAlloc inside a global-mode capture fails and invalidates it, relaxed mode allows it") {
  MKT_REQUIRE_FAKE();
  mkt::Device dev(0);
  mkt::Buffer b(dev, 64);
  CUdeviceptr p = 0;
  CUgraph g = nullptr;
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  REQUIRE(MKT_FN(cuStreamBeginCapture)(dev.stream, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  CHECK(cu().cuMemAlloc(&p, 64) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CHECK(cu().cuStreamIsCapturing(dev.stream, &st) == CUDA_SUCCESS);
  CHECK(st == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  CHECK(MKT_FN(cuStreamEndCapture)(dev.stream, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CHECK(g == nullptr);
  CHECK(cu().cuMemAlloc(&p, 64) == CUDA_SUCCESS);  // no capture any more
  CHECK(cu().cuMemFree(p) == CUDA_SUCCESS);

  // Relaxed thread mode: allowed; an async memset is recorded, not run.
  REQUIRE(cu().cuMemsetD8(b.p, 1, 64) == CUDA_SUCCESS);
  REQUIRE(MKT_FN(cuStreamBeginCapture)(dev.stream, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  CHECK(cu().cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS);
  CHECK(mode == CU_STREAM_CAPTURE_MODE_GLOBAL);
  CHECK(cu().cuMemAlloc(&p, 64) == CUDA_SUCCESS);
  CHECK(cu().cuMemFree(p) == CUDA_SUCCESS);
  CHECK(cu().cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS);
  CHECK(cu().cuMemsetD8Async(b.p, 7, 64, dev.stream) == CUDA_SUCCESS);
  CHECK(static_cast<unsigned char*>(b.ptr())[0] == 1);
  REQUIRE(MKT_FN(cuStreamEndCapture)(dev.stream, &g) == CUDA_SUCCESS);
  CUgraphExec x = nullptr;
  REQUIRE(MKT_FN(cuGraphInstantiate)(&x, g, 0) == CUDA_SUCCESS);
  CHECK(MKT_FN(cuGraphLaunch)(x, dev.stream) == CUDA_SUCCESS);
  CHECK(static_cast<unsigned char*>(b.ptr())[63] == 7);
  CHECK(MKT_FN(cuGraphExecDestroy)(x) == CUDA_SUCCESS);
  CHECK(MKT_FN(cuGraphDestroy)(g) == CUDA_SUCCESS);

  // A capture begun in relaxed mode forbids nothing; syncing it still fails.
  REQUIRE(MKT_FN(cuStreamBeginCapture)(dev.stream, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
  CHECK(cu().cuMemAlloc(&p, 64) == CUDA_SUCCESS);
  CHECK(cu().cuMemFree(p) == CUDA_SUCCESS);
  CHECK(cu().cuStreamSynchronize(dev.stream) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CHECK(MKT_FN(cuStreamEndCapture)(dev.stream, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
}

TEST_CASE("fake: a launch with the communicator's abort word raised stops at entry: kErrStopped into errors[0], code last, host told") {
  MKT_REQUIRE_FAKE();
  mkt::Device dev(0);
  const std::string img = cuda_elf(std::string("k\0", 2));
  CUmodule m = nullptr;
  CUfunction f = nullptr;
  REQUIRE(cu().cuModuleLoadData(&m, img.data()) == CUDA_SUCCESS);
  REQUIRE(cu().cuModuleGetFunction(&f, m, "k") == CUDA_SUCCESS);
  void* host = nullptr;
  REQUIRE(cu().cuMemHostAlloc(&host, 4096, CU_MEMHOSTALLOC_DEVICEMAP) == CUDA_SUCCESS);
  std::memset(host, 0, 4096);
  auto* rec = static_cast<mk::dev::ErrorRecord*>(host);
  auto* host_words = reinterpret_cast<int32_t*>(static_cast<char*>(host) + 2048);
  // The arena's flag part: the comm-wide abort word at 0, this plan's region at +256.
  auto* flags = reinterpret_cast<uint64_t*>(static_cast<char*>(host) + 3072);
  uint64_t* regions[6] = {};
  regions[5] = flags + 32;
  mk::dev::Args a{};
  a.rank = 5;
  a.errors = rec;
  a.host_abort = host_words;
  a.flags = regions;
  a.flag_offset = 256;
  void* params[] = {&a};
  // A host pointer for the region table would not do on a GPU; the fake reads
  // only memory it gave out.
  void* table = nullptr;
  REQUIRE(cu().cuMemHostAlloc(&table, sizeof regions, CU_MEMHOSTALLOC_DEVICEMAP) == CUDA_SUCCESS);
  std::memcpy(table, regions, sizeof regions);
  a.flags = static_cast<uint64_t* const*>(table);
  CHECK(cu().cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, dev.stream, params, nullptr) == CUDA_SUCCESS);
  CHECK(rec->code == 0);
  host_words[0] = 1;  // the host abort word alone is read in waits, not at entry
  CHECK(cu().cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, dev.stream, params, nullptr) == CUDA_SUCCESS);
  CHECK(rec->code == 0);
  flags[0] = 1;  // the communicator's abort word
  CHECK(cu().cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, dev.stream, params, nullptr) == CUDA_SUCCESS);
  CHECK(rec->code == mk::dev::kErrStopped);
  CHECK(rec->slot == mk::dev::kStoppedAtEntry);
  CHECK(rec->rank == 5);
  CHECK(host_words[1] == 1);  // the host sees it at its next call
  CHECK(cu().cuMemFreeHost(table) == CUDA_SUCCESS);
  // Bad handles are errors, not crashes.
  CHECK(cu().cuLaunchKernel(reinterpret_cast<CUfunction>(&a), 1, 1, 1, 32, 1, 1, 0, dev.stream, params, nullptr) ==
        CUDA_ERROR_INVALID_HANDLE);
  CHECK(cu().cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, reinterpret_cast<CUstream>(&a), params, nullptr) ==
        CUDA_ERROR_INVALID_HANDLE);
  CHECK(cu().cuLaunchKernel(f, 1, 1, 1, 2048, 1, 1, 0, dev.stream, params, nullptr) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cu().cuStreamDestroy(reinterpret_cast<CUstream>(&a)) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(cu().cuEventDestroy(reinterpret_cast<CUevent>(&a)) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(cu().cuMemFreeHost(host) == CUDA_SUCCESS);
  CHECK(cu().cuModuleUnload(m) == CUDA_SUCCESS);
  CHECK(cu().cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, dev.stream, params, nullptr) == CUDA_ERROR_INVALID_HANDLE);
}

TEST_CASE("fake: VMM memory exported as a POSIX fd and imported maps the same bytes, access needs cuMemSetAccess") {
  MKT_REQUIRE_FAKE();
  mkt::Device dev(0);
  const mkfake_counts before = mkt::counts();
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t g = 0;
  REQUIRE(cu().cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) == CUDA_SUCCESS);
  CUmemGenericAllocationHandle h = 0, h2 = 0;
  CHECK(cu().cuMemCreate(&h, g + 1, &prop, 0) == CUDA_ERROR_INVALID_VALUE);  // not a granularity multiple
  REQUIRE(cu().cuMemCreate(&h, g, &prop, 0) == CUDA_SUCCESS);
  int fd = -1;
  REQUIRE(cu().cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) == CUDA_SUCCESS);
  REQUIRE(cu().cuMemImportFromShareableHandle(&h2, reinterpret_cast<void*>(intptr_t(fd)),
                                              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == CUDA_SUCCESS);
  ::close(fd);
  CUdeviceptr a = 0, b = 0;
  REQUIRE(cu().cuMemAddressReserve(&a, g, g, 0, 0) == CUDA_SUCCESS);
  REQUIRE(cu().cuMemAddressReserve(&b, g, g, 0, 0) == CUDA_SUCCESS);
  REQUIRE(cu().cuMemMap(a, g, 0, h, 0) == CUDA_SUCCESS);
  REQUIRE(cu().cuMemMap(b, g, 0, h2, 0) == CUDA_SUCCESS);
  CHECK(cu().cuMemsetD8(a, 0x3c, 16) == CUDA_ERROR_INVALID_VALUE);  // no access granted yet
  CUmemAccessDesc acc{};
  acc.location = prop.location;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  REQUIRE(cu().cuMemSetAccess(a, g, &acc, 1) == CUDA_SUCCESS);
  REQUIRE(cu().cuMemSetAccess(b, g, &acc, 1) == CUDA_SUCCESS);
  CHECK(cu().cuMemsetD8(a + 100, 0x3c, 16) == CUDA_SUCCESS);
  unsigned char got[16] = {};
  CHECK(cu().cuMemcpyDtoH(got, b + 100, 16) == CUDA_SUCCESS);
  CHECK(got[0] == 0x3c);
  CHECK(got[15] == 0x3c);
  CHECK(cu().cuMemAddressFree(a, g) == CUDA_ERROR_INVALID_VALUE);  // still mapped
  for (CUdeviceptr p : {a, b}) {
    CHECK(cu().cuMemUnmap(p, g) == CUDA_SUCCESS);
    CHECK(cu().cuMemAddressFree(p, g) == CUDA_SUCCESS);
  }
  CHECK(cu().cuMemRelease(h) == CUDA_SUCCESS);
  CHECK(cu().cuMemRelease(h2) == CUDA_SUCCESS);
  CHECK(cu().cuMemRelease(h2) == CUDA_ERROR_INVALID_VALUE);
  const std::string leaked = mkt::leaks(before, mkt::counts());
  CHECK_MESSAGE(leaked.empty(), leaked);
}

TEST_CASE("fake: cuInit comes first, and contexts follow retain counts") {
  MKT_REQUIRE_FAKE();
  int n = 0;
  CHECK(cu().cuDeviceGetCount(&n) == CUDA_SUCCESS);  // the runtime called cuInit
  CUcontext c = nullptr;
  CHECK(cu().cuDevicePrimaryCtxRelease(3) == CUDA_ERROR_INVALID_CONTEXT);  // never retained
  CHECK(cu().cuDevicePrimaryCtxRetain(&c, n) == CUDA_ERROR_INVALID_DEVICE);
  CHECK(cu().cuCtxSetCurrent(reinterpret_cast<CUcontext>(&n)) == CUDA_ERROR_INVALID_CONTEXT);
  CHECK(cu().cuCtxSetCurrent(nullptr) == CUDA_SUCCESS);
  CUdevice d = 0;
  CHECK(cu().cuCtxGetDevice(&d) == CUDA_ERROR_INVALID_CONTEXT);
  CUuuid u0{}, u1{};
  CHECK(cu().cuDeviceGetUuid(&u0, 0) == CUDA_SUCCESS);
  CHECK(cu().cuDeviceGetUuid(&u1, 1) == CUDA_SUCCESS);
  CHECK(std::memcmp(u0.bytes, u1.bytes, 16) != 0);
}
