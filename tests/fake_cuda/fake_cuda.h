// The fake CUDA driver (tests/fake_cuda/fake_cuda.cpp, built as
// build/tests/fake_cuda/libcuda.so.1): lets the real host runtime run on a
// machine without a GPU, across processes. Tests reach it through
// LD_LIBRARY_PATH; it is never linked into anything and never installed.
//
// Model (real-driver semantics wherever cheap; bad handles give real error
// codes, never a crash):
//   devices     MKFAKE_DEVICES (4) devices of compute capability MKFAKE_ARCH
//               (90) with MKFAKE_SMS (132) SMs; occupancy answers
//               MKFAKE_BLOCKS_PER_SM (2). VMM and POSIX-fd handles supported,
//               every pair can access peers, distinct UUIDs. cuInit first,
//               else CUDA_ERROR_NOT_INITIALIZED.
//   contexts    one primary context per device with a retain count; the
//               current context is per thread (a stack for push/pop).
//   memory      host memory. cuMemAlloc: a POSIX shm object mapped MAP_SHARED,
//               whose name goes into the IPC handle; cuIpcOpenMemHandle in
//               another process maps the same bytes (the creating process may
//               not open its own handle: CUDA_ERROR_INVALID_CONTEXT). VMM:
//               cuMemCreate is a memfd (granularity 2 MiB), cuMemAddressReserve
//               a PROT_NONE range, cuMemMap maps the memfd there without access
//               and cuMemSetAccess grants it; exported POSIX fds are dups of
//               the memfd, so processes really share arenas. A registry answers
//               cuMemGetAddressRange / cuPointerGetAttribute(s); addresses the
//               driver never gave out: CUDA_ERROR_INVALID_VALUE
//               (cuPointerGetAttributes, as documented, succeeds with zeros).
//   work        copies and memsets happen at once (host memcpy), except on a
//               capturing stream, where they are recorded and run at
//               cuGraphLaunch. Stream capture follows the real mode rules: an
//               unsafe call (allocation, sync copy, module load, sync, ...)
//               while a capture forbids it fails with
//               CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates it.
//   modules     cuModuleLoadData takes only a 64-bit ELF of machine EM_CUDA
//               (190), else CUDA_ERROR_INVALID_IMAGE; a function exists when
//               its NUL-terminated name occurs in the image.
//   launches    counted; the last one's grid, block, stream and first
//               parameter (an mk::dev::Args) are kept. The kernel emulates the
//               device contract of templates/abi.cuh: when the communicator's
//               abort word (Args::flag_offset before its flag region) is set
//               at launch it writes a kErrStopped record (slot
//               kStoppedAtEntry) into errors[0] (fields first, code last);
//               every record it writes also sets host_abort[1] and that abort
//               word. Controls below inject error records and "hung" kernels
//               (these also end on *host_abort != 0).
//   failures    MKFAKE_FAIL="cuMemCreate:2,cuModuleLoadData:1:200": the N-th
//               call (1-based, per process) of that function fails with
//               CUDA_ERROR_OUT_OF_MEMORY or the given numeric code.
// Only sequential stream semantics are modelled: work after a hung kernel on
// the same stream still runs at once.
#pragma once

#include <cuda.h>
#include <dlfcn.h>

#include <cstddef>
#include <cstdint>

#include "templates/abi.cuh"

extern "C" {

// Live objects (created minus destroyed) and the launches so far.
struct mkfake_counts {
  int64_t device_allocs;    // cuMemAlloc
  int64_t host_allocs;      // cuMemHostAlloc
  int64_t vmm_handles;      // cuMemCreate + cuMemImportFromShareableHandle - cuMemRelease
  int64_t vmm_mappings;     // cuMemMap - cuMemUnmap
  int64_t reserved_ranges;  // cuMemAddressReserve - cuMemAddressFree
  int64_t ipc_opens;        // cuIpcOpenMemHandle - cuIpcCloseMemHandle
  int64_t modules;
  int64_t streams;
  int64_t events;
  int64_t graphs;       // graphs and executable graphs
  int64_t ctx_retains;  // primary context retains minus releases, all devices
  int64_t launches;     // total kernel launches executed (graph replays too)
  int64_t stream_waits;  // total cuStreamWaitEvent calls
};

// What the last executed launch looked like.
struct mkfake_launch {
  unsigned grid[3];
  unsigned block[3];
  CUstream stream;
  int device;
  char function[128];
  mk::dev::Args args;  // a copy of the first kernel parameter (a group kernel's: its first member's)
  int pdl;             // 1: launched with programmatic stream serialisation (cuLaunchKernelEx)
  // A group kernel (mk_group_*, mk::dev::GroupArgs): its members' arguments;
  // 0 members for any other kernel.
  int members;
  mk::dev::Args member[mk::dev::kMaxGroupMembers];
};

// 1: this libcuda.so.1 is the fake.
int mkfake_is_fake(void);
void mkfake_get_counts(mkfake_counts* out);
// 0 when no launch happened yet.
int mkfake_last_launch(mkfake_launch* out);
// The `nth` call from now (1-based) of `fn` (e.g. "cuMemCreate") fails with
// `code` (0: CUDA_ERROR_OUT_OF_MEMORY); nth 0 removes the rule; fn NULL
// removes every rule. Resets every call counter. Returns 0, -1 on bad input.
int mkfake_fail(const char* fn, int nth, int code);
// The next `launches` launches write `*record` into args.errors[0] instead of
// running (launches 0: stop).
void mkfake_inject_record(int launches, const mk::dev::ErrorRecord* record);
// While on, launches stay running until *args.host_abort becomes non-zero
// (then they write kErrStopped) or mkfake_release(); meanwhile their stream
// and events recorded after them are not ready and synchronisation blocks.
void mkfake_hang(int on);
// SMs per device and blocks per SM that occupancy answers from now on (0:
// the environment's values again).
void mkfake_set_limits(int sms, int blocks_per_sm);
// Ends every running launch (without an error record).
void mkfake_release(void);
// Launches still running.
int mkfake_running(void);
}

// A control function of the loaded fake, or null when libcuda.so.1 is absent
// or is not the fake: mkfake_fn<decltype(mkfake_get_counts)>("mkfake_get_counts").
template <typename F>
inline F* mkfake_fn(const char* name) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!h) h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  return h ? reinterpret_cast<F*>(dlsym(h, name)) : nullptr;
}
