// mKernel's NCCL-compatible library: a libnccl.so.2 that existing NCCL
// programs load unchanged (LD_PRELOAD, or mkernel-run). It exports every
// function of NCCL 2.28's nccl.h under its nccl* and pnccl* names, runs on
// mKernel what mKernel runs (the six collectives, route.h), and forwards
// everything else to the real NCCL, loaded by absolute path on first need.
//
// It is preloaded into every process of a job, launchers and compilers
// included, so it depends on nothing but libc at link time (libstdc++ is
// linked in statically) and loads libmkernel.so.0 and the real NCCL only
// when a communicator needs them. docs/migrating-from-nccl.md is the user's
// side of this file.
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <algorithm>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "compiler/common/env_parse.hpp"
#include "mk.h"
#include "nccl.h"
#include "nccl/route.h"

#define MK_EXPORT __attribute__((visibility("default")))

using namespace mk_nccl;

// The device-API types of nccl_device/core.h, as the pointers they are passed by.
typedef struct ncclDevCommRequirements_opaque ncclDevCommRequirements_t;
typedef struct ncclDevComm_opaque ncclDevComm_t;

namespace {

// ---- messages ------------------------------------------------------------

thread_local char t_error[1024];  // the calling thread's last error from this library

// A diagnostic switch: 0 or 1; another value is off, with one warning
// (env_parse.hpp: this runs inside any call, which must not fail for it).
bool diagnostic(const char* name) {
  char prefix[64];
  snprintf(prefix, sizeof prefix, "mkernel-nccl[%d]:", int(getpid()));
  return mk::env_parse::diagnostic_flag(name, prefix);
}

bool debug_on() {
  static const bool on = diagnostic("MK_DEBUG");
  return on;
}

void debug(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void debug(const char* fmt, ...) {
  if (!debug_on()) return;
  char line[1200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fprintf(stderr, "mkernel-nccl[%d]: %s\n", int(getpid()), line);
}

ncclResult_t fail(ncclResult_t r, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
ncclResult_t fail(ncclResult_t r, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t_error, sizeof t_error, fmt, ap);
  va_end(ap);
  debug("error: %s", t_error);
  return r;
}

// ---- the two libraries ----------------------------------------------------

// libmkernel.so.0's C API.
struct Mk {
  decltype(&mkGetUniqueId) GetUniqueId;
  decltype(&mkCommInitRankConfig) CommInitRankConfig;
  decltype(&mkCommInitAll) CommInitAll;
  decltype(&mkCommSplit) CommSplit;
  decltype(&mkCommFinalize) CommFinalize;
  decltype(&mkCommDestroy) CommDestroy;
  decltype(&mkCommAbort) CommAbort;
  decltype(&mkCommGetAsyncError) CommGetAsyncError;
  decltype(&mkCommCount) CommCount;
  decltype(&mkCommCuDevice) CommCuDevice;
  decltype(&mkCommUserRank) CommUserRank;
  decltype(&mkCommRegister) CommRegister;
  decltype(&mkCommDeregister) CommDeregister;
  decltype(&mkCommBootstrapBroadcast) CommBootstrapBroadcast;
  decltype(&mkCommNodeCount) CommNodeCount;
  decltype(&mkCommIsBootstrapOnly) CommIsBootstrapOnly;
  decltype(&mkCommShrink) CommShrink;
  decltype(&mkGetLastError) GetLastError;
  decltype(&mkAllReduce) AllReduce;
  decltype(&mkBroadcast) Broadcast;
  decltype(&mkReduce) Reduce;
  decltype(&mkAllGather) AllGather;
  decltype(&mkReduceScatter) ReduceScatter;
  decltype(&mkAllToAll) AllToAll;
  decltype(&mkGroupStart) GroupStart;
  decltype(&mkGroupEnd) GroupEnd;
  decltype(&mkRedOpCreatePreMulSum) RedOpCreatePreMulSum;
  decltype(&mkRedOpDestroy) RedOpDestroy;
};

// The real NCCL's functions this library forwards to.
struct Real {
  int version = 0;
  char path[PATH_MAX] = "";
  decltype(&ncclGetUniqueId) GetUniqueId;
  decltype(&ncclCommInitRank) CommInitRank;
  decltype(&ncclCommInitAll) CommInitAll;
  decltype(&ncclCommShrink) CommShrink;
  decltype(&ncclCommFinalize) CommFinalize;
  decltype(&ncclCommDestroy) CommDestroy;
  decltype(&ncclCommAbort) CommAbort;
  decltype(&ncclCommRevoke) CommRevoke;
  decltype(&ncclCommGetAsyncError) CommGetAsyncError;
  decltype(&ncclCommCount) CommCount;
  decltype(&ncclCommCuDevice) CommCuDevice;
  decltype(&ncclCommUserRank) CommUserRank;
  decltype(&ncclGetLastError) GetLastError;
  decltype(&ncclResetDebugInit) ResetDebugInit;
  decltype(&ncclCommWindowRegister) CommWindowRegister;
  decltype(&ncclCommWindowDeregister) CommWindowDeregister;
  decltype(&ncclRedOpCreatePreMulSum) RedOpCreatePreMulSum;
  decltype(&ncclRedOpDestroy) RedOpDestroy;
  decltype(&ncclAllReduce) AllReduce;
  decltype(&ncclBroadcast) Broadcast;
  decltype(&ncclReduce) Reduce;
  decltype(&ncclAllGather) AllGather;
  decltype(&ncclReduceScatter) ReduceScatter;
  decltype(&ncclAlltoAll) AlltoAll;
  decltype(&ncclGather) Gather;
  decltype(&ncclScatter) Scatter;
  decltype(&ncclSend) Send;
  decltype(&ncclRecv) Recv;
  decltype(&ncclGroupStart) GroupStart;
  decltype(&ncclGroupEnd) GroupEnd;
  decltype(&ncclGroupSimulateEnd) GroupSimulateEnd;
  ncclResult_t (*DevCommCreate)(ncclComm_t, const ncclDevCommRequirements_t*, ncclDevComm_t*);
  ncclResult_t (*DevCommDestroy)(ncclComm_t, const ncclDevComm_t*);
};

std::mutex g_load_mu;
Mk g_mk;
std::atomic<bool> g_mk_loaded{false};  // g_mk is written before it is set (release)
char g_mk_error[1024] = "";
Real g_real;
std::atomic<int> g_real_state{0};  // 0 not tried, 1 loaded, -1 failed (g_real_error says why); g_real before it
char g_real_error[2048] = "";

// The directory this library was loaded from.
bool own_dir(char* out, size_t cap) {
  Dl_info info;
  if (!dladdr(reinterpret_cast<void*>(&own_dir), &info) || !info.dli_fname) return false;
  char path[PATH_MAX];
  if (!realpath(info.dli_fname, path)) snprintf(path, sizeof path, "%s", info.dli_fname);
  char* slash = strrchr(path, '/');
  if (!slash) return false;
  *slash = 0;
  snprintf(out, cap, "%s", path);
  return true;
}

template <class F>
bool sym(void* h, const char* name, F* f) {
  *f = reinterpret_cast<F>(dlsym(h, name));
  return *f != nullptr;
}

// libmkernel.so.0: MK_LIBMKERNEL, else next to this library's install
// place (lib/mkernel/nccl/ -> lib/) or build place (build/nccl/ -> build/).
bool load_mk_locked() {
  if (g_mk_loaded) return true;
  char tried[1024] = "";
  char candidates[3][PATH_MAX];
  int n = 0;
  const char* env = getenv("MK_LIBMKERNEL");
  if (env && *env) {
    snprintf(candidates[n++], PATH_MAX, "%s", env);
  } else {
    char dir[PATH_MAX];
    if (own_dir(dir, sizeof dir)) {
      snprintf(candidates[n++], PATH_MAX, "%s/../../libmkernel.so.0", dir);
      snprintf(candidates[n++], PATH_MAX, "%s/../libmkernel.so.0", dir);
    }
  }
  void* h = nullptr;
  for (int i = 0; i < n && !h; ++i) {
    h = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const size_t at = strlen(tried);
      snprintf(tried + at, sizeof tried - at, "%s%s (%s)", at ? "; " : "", candidates[i], dlerror());
    }
  }
  if (!h) {
    snprintf(g_mk_error, sizeof g_mk_error, "libmkernel.so.0 could not be loaded: %s%s", tried[0] ? tried : "no candidate",
             env ? "" : " (set MK_LIBMKERNEL to its path)");
    return false;
  }
  Mk m{};
  bool ok = sym(h, "mkGetUniqueId", &m.GetUniqueId) && sym(h, "mkCommInitRankConfig", &m.CommInitRankConfig) &&
            sym(h, "mkCommInitAll", &m.CommInitAll) && sym(h, "mkCommSplit", &m.CommSplit) &&
            sym(h, "mkCommFinalize", &m.CommFinalize) && sym(h, "mkCommDestroy", &m.CommDestroy) &&
            sym(h, "mkCommAbort", &m.CommAbort) && sym(h, "mkCommGetAsyncError", &m.CommGetAsyncError) &&
            sym(h, "mkCommCount", &m.CommCount) && sym(h, "mkCommCuDevice", &m.CommCuDevice) &&
            sym(h, "mkCommUserRank", &m.CommUserRank) && sym(h, "mkCommRegister", &m.CommRegister) &&
            sym(h, "mkCommDeregister", &m.CommDeregister) &&
            sym(h, "mkCommBootstrapBroadcast", &m.CommBootstrapBroadcast) &&
            sym(h, "mkCommNodeCount", &m.CommNodeCount) && sym(h, "mkCommIsBootstrapOnly", &m.CommIsBootstrapOnly) && sym(h, "mkCommShrink", &m.CommShrink) &&
            sym(h, "mkGetLastError", &m.GetLastError) && sym(h, "mkAllReduce", &m.AllReduce) &&
            sym(h, "mkBroadcast", &m.Broadcast) && sym(h, "mkReduce", &m.Reduce) &&
            sym(h, "mkAllGather", &m.AllGather) && sym(h, "mkReduceScatter", &m.ReduceScatter) &&
            sym(h, "mkAllToAll", &m.AllToAll) && sym(h, "mkGroupStart", &m.GroupStart) &&
            sym(h, "mkGroupEnd", &m.GroupEnd) && sym(h, "mkRedOpCreatePreMulSum", &m.RedOpCreatePreMulSum) &&
            sym(h, "mkRedOpDestroy", &m.RedOpDestroy);
  if (!ok) {
    snprintf(g_mk_error, sizeof g_mk_error, "libmkernel.so.0 lacks a function this library needs (%s): an older mKernel?",
             dlerror());
    dlclose(h);
    return false;
  }
  g_mk = m;
  g_mk_loaded.store(true, std::memory_order_release);
  return true;
}

ncclResult_t need_mk() {
  std::lock_guard<std::mutex> g(g_load_mu);
  if (load_mk_locked()) return ncclSuccess;
  return fail(ncclSystemError, "%s", g_mk_error);
}

// The directory of a loaded libtorch_cuda.so, if any: the torch wheel's NCCL
// is at <site-packages>/nvidia/nccl/lib, two levels above torch/lib.
int find_torch(struct dl_phdr_info* info, size_t, void* out) {
  const char* name = info->dlpi_name;
  if (!name || !strstr(name, "/libtorch_cuda.so")) return 0;
  snprintf(static_cast<char*>(out), PATH_MAX, "%s", name);
  char* slash = strrchr(static_cast<char*>(out), '/');
  if (slash) *slash = 0;
  return 1;
}

// The real NCCL, by absolute path only (a bare name would find this library
// again): MK_NCCL_LIB (and nothing else when it is set), the torch wheel's,
// then the system's. RTLD_DEEPBIND: NCCL's calls to its own API stay inside it.
bool load_real_locked() {
  if (const int st = g_real_state.load(std::memory_order_acquire)) return st > 0;
  char candidates[6][PATH_MAX];
  int n = 0;
  const char* env = getenv("MK_NCCL_LIB");
  if (env && *env) {
    snprintf(candidates[n++], PATH_MAX, "%s", env);
  } else {
    char torch[PATH_MAX] = "";
    if (dl_iterate_phdr(find_torch, torch) && torch[0])
      snprintf(candidates[n++], PATH_MAX, "%s/../../nvidia/nccl/lib/libnccl.so.2", torch);
    for (const char* p : {"/usr/lib/x86_64-linux-gnu/libnccl.so.2", "/usr/local/cuda/lib64/libnccl.so.2",
                          "/usr/lib64/libnccl.so.2", "/usr/lib/libnccl.so.2"})
      snprintf(candidates[n++], PATH_MAX, "%s", p);
  }
  char self[PATH_MAX] = "";
  own_dir(self, sizeof self);
  char tried[1536] = "";
  void* h = nullptr;
  for (int i = 0; i < n && !h; ++i) {
    char real_path[PATH_MAX];
    if (!realpath(candidates[i], real_path)) {
      const size_t at = strlen(tried);
      snprintf(tried + at, sizeof tried - at, "%s%s (not found)", at ? "; " : "", candidates[i]);
      continue;
    }
    h = dlopen(real_path, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (!h) {
      const size_t at = strlen(tried);
      snprintf(tried + at, sizeof tried - at, "%s%s (%s)", at ? "; " : "", candidates[i], dlerror());
      continue;
    }
    void* theirs = dlsym(h, "pncclGetVersion");
    if (!theirs || theirs == reinterpret_cast<void*>(&pncclGetVersion)) {  // this library again, or not NCCL
      const size_t at = strlen(tried);
      snprintf(tried + at, sizeof tried - at, "%s%s (%s)", at ? "; " : "", candidates[i],
               theirs ? "that is mKernel's NCCL library itself" : "not an NCCL library");
      dlclose(h);
      h = nullptr;
      continue;
    }
    snprintf(g_real.path, sizeof g_real.path, "%s", real_path);
  }
  if (!h) {
    snprintf(g_real_error, sizeof g_real_error, "the real NCCL could not be loaded: %s%s", tried,
             env && *env ? "" : " (set MK_NCCL_LIB to the absolute path of NCCL's libnccl.so.2)");
    g_real_state = -1;
    return false;
  }
  Real r = g_real;
  bool ok = sym(h, "ncclGetUniqueId", &r.GetUniqueId) && sym(h, "ncclCommInitRank", &r.CommInitRank) &&
            sym(h, "ncclCommInitAll", &r.CommInitAll) && sym(h, "ncclCommFinalize", &r.CommFinalize) &&
            sym(h, "ncclCommDestroy", &r.CommDestroy) && sym(h, "ncclCommAbort", &r.CommAbort) &&
            sym(h, "ncclCommGetAsyncError", &r.CommGetAsyncError) && sym(h, "ncclGetLastError", &r.GetLastError) &&
            sym(h, "ncclCommCount", &r.CommCount) && sym(h, "ncclCommCuDevice", &r.CommCuDevice) &&
            sym(h, "ncclCommUserRank", &r.CommUserRank) &&
            sym(h, "ncclAllReduce", &r.AllReduce) && sym(h, "ncclBroadcast", &r.Broadcast) &&
            sym(h, "ncclReduce", &r.Reduce) && sym(h, "ncclAllGather", &r.AllGather) &&
            sym(h, "ncclReduceScatter", &r.ReduceScatter) && sym(h, "ncclSend", &r.Send) &&
            sym(h, "ncclRecv", &r.Recv) && sym(h, "ncclGroupStart", &r.GroupStart) &&
            sym(h, "ncclGroupEnd", &r.GroupEnd);
  decltype(&ncclGetVersion) version = nullptr;
  ok = ok && sym(h, "ncclGetVersion", &version);
  if (!ok) {
    snprintf(g_real_error, sizeof g_real_error, "%s is not a usable NCCL: it lacks %s", g_real.path, dlerror());
    g_real_state = -1;
    return false;
  }
  // Newer functions: absent in older NCCLs (a call needing one then fails clearly).
  sym(h, "ncclCommShrink", &r.CommShrink);
  sym(h, "ncclCommRevoke", &r.CommRevoke);
  sym(h, "ncclResetDebugInit", &r.ResetDebugInit);
  sym(h, "ncclCommWindowRegister", &r.CommWindowRegister);
  sym(h, "ncclCommWindowDeregister", &r.CommWindowDeregister);
  sym(h, "ncclRedOpCreatePreMulSum", &r.RedOpCreatePreMulSum);
  sym(h, "ncclRedOpDestroy", &r.RedOpDestroy);
  sym(h, "ncclAlltoAll", &r.AlltoAll);
  sym(h, "ncclGather", &r.Gather);
  sym(h, "ncclScatter", &r.Scatter);
  sym(h, "ncclGroupSimulateEnd", &r.GroupSimulateEnd);
  sym(h, "ncclDevCommCreate", &r.DevCommCreate);
  sym(h, "ncclDevCommDestroy", &r.DevCommDestroy);
  if (version(&r.version) != ncclSuccess) r.version = 0;
  g_real = r;
  g_real_state.store(1, std::memory_order_release);
  debug("real NCCL %d loaded from %s", r.version, r.path);
  return true;
}

// A forwarded call's result, with NCCL's message as this library's last error.
ncclResult_t forwarded(ncclResult_t r, const char* api, ncclComm_t real) {
  if (r != ncclSuccess && r != ncclInProgress) return fail(r, "%s (NCCL): %s", api, g_real.GetLastError(real));
  return r;
}

ncclResult_t need_real(const char* why) {
  std::lock_guard<std::mutex> g(g_load_mu);
  if (load_real_locked()) return ncclSuccess;
  return fail(ncclSystemError, "%s needs the real NCCL, but %s", why, g_real_error);
}

// ---- statistics (MK_NCCL_STATS=1) -----------------------------------------

std::atomic<unsigned long long> g_count[kOther + 1][2];  // [collective][0 mKernel, 1 NCCL]
std::atomic<unsigned long long> g_whole{0};  // communicators NCCL runs whole (they span nodes)

void print_stats() {
  fprintf(stderr, "mkernel-nccl[%d]: calls by library\n  %-14s %10s %10s\n", int(getpid()), "call", "mKernel", "NCCL");
  for (int c = 0; c <= kOther; ++c) {
    const unsigned long long a = g_count[c][0].load(), b = g_count[c][1].load();
    if (a || b) fprintf(stderr, "  %-14s %10llu %10llu\n", coll_name(c), a, b);
  }
  if (const unsigned long long w = g_whole.load())
    fprintf(stderr, "  communicators spanning nodes, run by NCCL whole: %llu\n", w);
}

void stats_at_exit() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (diagnostic("MK_NCCL_STATS")) atexit(print_stats);
  });
}

void count(int coll, bool nccl) {
  stats_at_exit();
  g_count[coll][nccl ? 1 : 0].fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

// ---- communicators ----------------------------------------------------------

// ncclComm_t as this library hands it out. Never freed (another thread may
// still be inside a call on it when one destroys it; each is ~100 bytes):
// destroy releases both libraries' communicators and marks it dead.
struct Clique;
struct ncclComm {
  static constexpr uint32_t kMagic = 0x6d6b6e63;  // "mknc"
  uint32_t magic = kMagic;
  mkComm_t mk = nullptr;  // null: a communicator only NCCL runs (ncclCommShrink's)
  std::atomic<ncclComm_t> real{nullptr};  // published once made (an abort from another thread reads it)
  int nranks = 0, rank = 0;
  unsigned fallback = 0;  // MK_NCCL_FALLBACK at init
  // The caller asked for a nonblocking communicator (config.blocking = 0).
  // Not mKernel's setting: an init inside a group runs nonblocking there
  // whatever the caller asked. A split without a config inherits this.
  bool nonblocking = false;
  // NCCL runs every call (mKernel's communicator is bootstrap-only: its ranks
  // span nodes): -1 not known yet (a nonblocking init still runs), 0 no, 1 yes.
  std::atomic<int> whole{-1};
  std::atomic<int> nodes{0};  // its ranks' nodes (0: not asked yet)
  Clique* clique = nullptr;  // ranks made together by ncclCommInitAll
  std::atomic<bool> dead{false}, revoked{false};
  std::mutex mu;  // creating `real`, and `premuls`
  // PreMulSum ops (ncclRedOpCreatePreMulSum): handle ncclNumOps + index.
  // mKernel's op serves calls mKernel runs; NCCL's is made on the first call
  // that goes to NCCL (from the scalar kept here).
  struct PreMul {
    bool live = false;
    ncclDataType_t dtype = ncclFloat32;
    ncclScalarResidence_t residence = ncclScalarHostImmediate;
    alignas(8) unsigned char value[8] = {};  // host-immediate: the scalar's bytes
    void* ptr = nullptr;                     // device residence: the caller's pointer
    int mk = -1;                             // mKernel's op; -1: none (an NCCL-only communicator)
    bool has_real = false;
    ncclRedOp_t real = ncclSum;
    // Calls of open groups that use it (they run at ncclGroupEnd): a destroy
    // meanwhile only marks it; the last of them frees it and its slot.
    int pending = 0;
    bool destroyed = false;
  };
  std::vector<PreMul> premuls;
  // The slot of handle `op` (live or not), or null when there is none. Caller holds mu.
  PreMul* premul_slot(int op) {
    const int64_t i = int64_t(op) - int64_t(ncclNumOps);
    return i >= 0 && i < int64_t(premuls.size()) ? &premuls[size_t(i)] : nullptr;
  }
};

struct Clique {
  std::mutex mu;
  std::vector<ncclComm*> members;
  std::vector<int> devices;
};

namespace {

ncclResult_t check_comm(ncclComm_t c, const char* api) {
  if (!c) return fail(ncclInvalidArgument, "%s: comm is NULL", api);
  if (c->magic != ncclComm::kMagic)
    return fail(ncclInvalidArgument, "%s: comm is not a communicator of mKernel's NCCL library", api);
  if (c->dead.load()) return fail(ncclInvalidUsage, "%s: the communicator was destroyed", api);
  return ncclSuccess;
}

// The settings a communicator is made with, read strictly at its init: a
// value that is not accepted fails the init, naming the variable, its value
// and what it accepts.
ncclResult_t read_fallback(unsigned* mask) {
  char bad[64];
  const char* v = getenv("MK_NCCL_FALLBACK");
  if (!parse_fallback(v, mask, bad, sizeof bad))
    return fail(ncclInvalidArgument,
                "MK_NCCL_FALLBACK='%.200s' names '%s'; expected a comma-separated list of allreduce, broadcast, "
                "reduce, allgather, reducescatter, alltoall (lower case, no spaces or empty items), or all or none "
                "alone (unset or empty: none)",
                v, bad);
  return ncclSuccess;
}

// MK_NCCL_EAGER: 0 or 1 (unset or empty: 0).
ncclResult_t read_eager(bool* eager) {
  *eager = false;
  const char* v = getenv("MK_NCCL_EAGER");
  if (v && *v && !mk::env_parse::parse_bool(v, eager))
    return fail(ncclInvalidArgument, "MK_NCCL_EAGER='%.200s': expected 0 or 1 (unset or empty: 0)", v);
  return ncclSuccess;
}

// Size and rank from mKernel, once its communicator is ready (made
// nonblocking, in a group, or by a split); false while it is not.
bool learn_size(ncclComm_t c) {
  int n = 0, r = 0;
  if (!c->mk || g_mk.CommCount(c->mk, &n) != mkSuccess || g_mk.CommUserRank(c->mk, &r) != mkSuccess) return false;
  c->nranks = n;
  c->rank = r;
  return true;
}

struct Cuda {
  int (*MemAlloc)(unsigned long long*, size_t) = nullptr;
  int (*MemFree)(unsigned long long) = nullptr;
  int (*GetErrorString)(int, const char**) = nullptr;
  // making a rank's GPU current on a thread of its own (ensure_real_all)
  int (*DeviceGet)(int*, int) = nullptr;
  int (*PrimaryCtxRetain)(void**, int) = nullptr;
  int (*CtxSetCurrent)(void*) = nullptr;
  bool tried = false, ok = false;
};
Cuda g_cuda;
bool load_cuda() {
  std::lock_guard<std::mutex> g(g_load_mu);
  if (g_cuda.tried) return g_cuda.ok;
  g_cuda.tried = true;
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  g_cuda.ok = h && sym(h, "cuMemAlloc_v2", &g_cuda.MemAlloc) && sym(h, "cuMemFree_v2", &g_cuda.MemFree);
  if (h) {
    sym(h, "cuGetErrorString", &g_cuda.GetErrorString);
    sym(h, "cuDeviceGet", &g_cuda.DeviceGet);
    sym(h, "cuDevicePrimaryCtxRetain", &g_cuda.PrimaryCtxRetain);
    sym(h, "cuCtxSetCurrent", &g_cuda.CtxSetCurrent);
  }
  return g_cuda.ok;
}
// Whether NCCL runs every call of `c`: mKernel made it bootstrap-only
// because its ranks span nodes (init asks for that with spanNodes). Every
// rank learns the same answer from the same exchanged facts, so a
// communicator is NCCL's on all its ranks or on none. Unknown until its init
// is done (then a call goes to mKernel, which says the init still runs).
bool nccl_whole(ncclComm_t c) {
  int w = c->whole.load();
  if (w >= 0 || !c->mk) return w == 1;
  int only = 0, nodes = 0;
  if (g_mk.CommIsBootstrapOnly(c->mk, &only) != mkSuccess) return false;
  int expected = -1;
  if (c->whole.compare_exchange_strong(expected, only ? 1 : 0) && only) {
    stats_at_exit();
    g_whole.fetch_add(1);
    g_mk.CommNodeCount(c->mk, &nodes);
    debug("comm %p rank %d/%d: its ranks span %d nodes: NCCL runs it whole (MK_NET is not set)",
          static_cast<void*>(c), c->rank, c->nranks, nodes);
  }
  return c->whole.load() == 1;
}

// The real NCCL communicator of `c`, created the first time one is needed.
// Collective like the call that needs it: routing is a function of what
// every rank passes, so every rank gets here at the same call. Ranks made
// together by ncclCommInitAll get theirs together (one ncclCommInitAll);
// others share the unique id through mKernel's bootstrap.
ncclResult_t ensure_real(ncclComm_t c, const char* why) {
  if (c->real) return ncclSuccess;
  if (c->dead.load()) return fail(ncclInvalidUsage, "%s: the communicator was destroyed", why);
  if (c->mk && c->nranks == 0 && !learn_size(c))  // made nonblocking or in a group
    return fail(ncclInvalidUsage, "%s: the communicator is not ready yet: %s", why, g_mk.GetLastError(c->mk));
  if (ncclResult_t r = need_real(why)) {
    // Its peers are about to wait for this rank in the id broadcast below:
    // mKernel's communicator is aborted, so that they fail now, naming this
    // rank, instead of at the bootstrap timeout. The handle stays valid
    // (destroy and abort work; every later call fails).
    if (c->mk && c->nranks > 1 && !c->clique) {
      std::lock_guard<std::mutex> g(c->mu);
      if (c->mk && !c->real) {
        debug("comm %p rank %d/%d: no real NCCL here (%s); aborting mKernel's communicator so that its peers stop "
              "waiting for this rank",
              static_cast<void*>(c), c->rank, c->nranks, g_real_error);
        g_mk.CommAbort(c->mk);
        c->mk = nullptr;  // later calls go to NCCL, and fail as this one does
      }
    }
    return r;
  }
  if (c->clique) {
    Clique& q = *c->clique;
    std::lock_guard<std::mutex> g(q.mu);
    if (c->real) return ncclSuccess;
    std::vector<ncclComm_t> reals(q.members.size());
    ncclResult_t r = g_real.CommInitAll(reals.data(), int(reals.size()), q.devices.data());
    if (r != ncclSuccess)
      return fail(r, "%s: the real NCCL's ncclCommInitAll for the fallback failed: %s", why, g_real.GetLastError(nullptr));
    for (size_t i = 0; i < reals.size(); ++i) q.members[i]->real = reals[i];
    return ncclSuccess;
  }
  std::lock_guard<std::mutex> g(c->mu);
  if (c->real) return ncclSuccess;
  // Rank 0 makes the id and sends it with whether that worked, so that a
  // failure there fails every rank instead of leaving them waiting.
  struct {
    int32_t ok;
    ncclUniqueId id;
  } msg;
  memset(&msg, 0, sizeof msg);
  if (c->rank == 0) msg.ok = g_real.GetUniqueId(&msg.id) == ncclSuccess;
  if (c->nranks > 1) {
    const mkResult_t b = g_mk.CommBootstrapBroadcast(c->mk, &msg, sizeof msg, 0);
    if (b != mkSuccess)
      return fail(ncclResult_t(b), "%s: sharing the NCCL unique id failed: %s", why, g_mk.GetLastError(c->mk));
  }
  if (!msg.ok)
    return fail(ncclSystemError, "%s: rank 0's real NCCL could not make a unique id: %s", why,
                c->rank == 0 ? g_real.GetLastError(nullptr) : "see rank 0's ncclGetLastError");
  const ncclUniqueId& id = msg.id;
  ncclComm_t real = nullptr;
  ncclResult_t r = g_real.CommInitRank(&real, c->nranks, id, c->rank);
  if (r != ncclSuccess)
    return fail(r, "%s: the real NCCL's ncclCommInitRank for the fallback failed: %s", why, g_real.GetLastError(nullptr));
  c->real = real;
  debug("comm %p rank %d/%d: real NCCL communicator created for %s", static_cast<void*>(c), c->rank, c->nranks, why);
  return ncclSuccess;
}

ncclComm_t new_comm(mkComm_t mk, unsigned fallback) {
  ncclComm* c = new ncclComm;
  c->mk = mk;
  c->fallback = fallback;
  learn_size(c);
  return c;
}

// A communicator whose init may still run (nonblocking): its size and rank
// come from the arguments.
ncclComm_t new_comm(mkComm_t mk, unsigned fallback, int nranks, int rank) {
  ncclComm* c = new ncclComm;
  c->mk = mk;
  c->fallback = fallback;
  c->nranks = nranks;
  c->rank = rank;
  return c;
}

// The real NCCL communicators of several communicators at once. Each one's
// creation is collective over its own ranks (the id goes through mKernel's
// bootstrap, then ncclCommInitRank), so ranks of one thread (a group that
// made several ranks, one process per node) each get a thread of their own,
// with their GPU's primary context current, and are joined; one at a time
// they would wait for each other. Ranks made by ncclCommInitAll get theirs
// together (one ncclCommInitAll).
ncclResult_t ensure_real_all(const std::vector<ncclComm_t>& comms, const char* why) {
  std::vector<ncclComm_t> todo;
  for (ncclComm_t c : comms)
    if (!c->real && std::find(todo.begin(), todo.end(), c) == todo.end()) todo.push_back(c);
  size_t threaded = 0;
  for (ncclComm_t c : todo) threaded += c->clique == nullptr;
  if (threaded <= 1) {
    for (ncclComm_t c : todo)
      if (ncclResult_t r = ensure_real(c, why)) return r;
    return ncclSuccess;
  }
  for (ncclComm_t c : todo)
    if (c->clique)
      if (ncclResult_t r = ensure_real(c, why)) return r;
  load_cuda();
  struct Out {
    ncclResult_t r = ncclSuccess;
    std::string error;
  };
  std::vector<Out> out(todo.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < todo.size(); ++i) {
    ncclComm_t c = todo[i];
    if (c->clique) continue;
    threads.emplace_back([c, why, &out, i] {
      int ordinal = -1, dev = 0;
      void* ctx = nullptr;
      if (g_cuda.DeviceGet && g_cuda.PrimaryCtxRetain && g_cuda.CtxSetCurrent && c->mk &&
          g_mk.CommCuDevice(c->mk, &ordinal) == mkSuccess && g_cuda.DeviceGet(&dev, ordinal) == 0 &&
          g_cuda.PrimaryCtxRetain(&ctx, dev) == 0)
        g_cuda.CtxSetCurrent(ctx);  // NCCL's communicator is made on the rank's GPU (retained for it)
      out[i].r = ensure_real(c, why);
      if (out[i].r != ncclSuccess) out[i].error = t_error;
    });
  }
  for (auto& t : threads) t.join();
  for (const Out& o : out)
    if (o.r != ncclSuccess) return fail(o.r, "%s", o.error.c_str());
  return ncclSuccess;
}

// ---- calls, and groups of them ---------------------------------------------

struct Call {
  int coll;  // Coll, or kOther with `what` naming it
  const char* what;
  const void* send;
  void* recv;
  size_t count;
  ncclDataType_t dtype;
  ncclRedOp_t op;
  int root;  // root or peer
  ncclComm_t comm;
  cudaStream_t stream;
  // A PreMulSum op, resolved when the call is made (the caller may destroy
  // the op right after): mKernel's handle (-1: none) and NCCL's.
  bool premul = false;
  int mk_op = -1;
  ncclRedOp_t real_op = ncclSum;
  bool held = false;  // counted in its PreMul's `pending` (a group call)
};

thread_local int t_depth = 0;
thread_local std::vector<Call>* t_pending = nullptr;
thread_local bool t_mk_group = false;                // mkGroupStart was called for the open group
thread_local std::vector<ncclComm_t>* t_inits = nullptr;  // inits of the open group, done at its end

// The nodes `c`'s ranks sit on (asked once, after its init).
int nodes_of(ncclComm_t c) {
  int n = c->nodes.load();
  if (n > 0 || !c->mk) return n;
  if (g_mk.CommNodeCount(c->mk, &n) != mkSuccess || n < 1) return 0;
  c->nodes.store(n);
  return n;
}

bool routes_to_mk(const Call& k) {
  if (k.premul && k.mk_op < 0) return false;
  if ((k.coll == kBroadcast || k.coll == kReduce) && k.comm->mk && !nccl_whole(k.comm) &&
      !mk_runs_root(k.coll, k.root, k.comm->nranks, nodes_of(k.comm)))
    return false;
  // a PreMulSum call routes as a sum would (mKernel runs both alike)
  return k.coll < kNumMk && k.comm->mk && !nccl_whole(k.comm) &&
         mk_runs(k.coll, int(k.dtype), k.premul ? int(ncclSum) : int(k.op), k.count, k.comm->nranks, false,
                 k.comm->fallback);
}

ncclResult_t run_mk(const Call& k) {
  count(k.coll, false);
  debug("%s count=%zu dtype=%d op=%d comm=%p -> mKernel", coll_name(k.coll), k.count, int(k.dtype), int(k.op),
        static_cast<void*>(k.comm));
  const mkDataType_t t = mkDataType_t(k.dtype);
  const mkRedOp_t o = mkRedOp_t(k.premul ? k.mk_op : int(k.op));
  mkComm_t m = k.comm->mk;
  mkResult_t r = mkInternalError;
  switch (k.coll) {
    case kAllReduce: r = g_mk.AllReduce(k.send, k.recv, k.count, t, o, m, k.stream); break;
    case kBroadcast: r = g_mk.Broadcast(k.send, k.recv, k.count, t, k.root, m, k.stream); break;
    case kReduce: r = g_mk.Reduce(k.send, k.recv, k.count, t, o, k.root, m, k.stream); break;
    case kAllGather: r = g_mk.AllGather(k.send, k.recv, k.count, t, m, k.stream); break;
    case kReduceScatter: r = g_mk.ReduceScatter(k.send, k.recv, k.count, t, o, m, k.stream); break;
    case kAlltoAll: r = g_mk.AllToAll(k.send, k.recv, k.count, t, m, k.stream); break;
    default: break;
  }
  if (r != mkSuccess) fail(ncclResult_t(r), "%s", g_mk.GetLastError(m));
  return ncclResult_t(r);
}

ncclResult_t run_real(const Call& k) {
  const char* name = k.coll < kNumMk ? coll_name(k.coll) : k.what;
  if (ncclResult_t r = ensure_real(k.comm, name)) return r;
  count(k.coll, true);
  debug("%s count=%zu dtype=%d op=%d comm=%p -> NCCL", name, k.count, int(k.dtype), int(k.op),
        static_cast<void*>(k.comm));
  ncclComm_t c = k.comm->real;
  ncclResult_t r = ncclInternalError;
  switch (k.coll) {
    case kAllReduce: r = g_real.AllReduce(k.send, k.recv, k.count, k.dtype, k.real_op, c, k.stream); break;
    case kBroadcast: r = g_real.Broadcast(k.send, k.recv, k.count, k.dtype, k.root, c, k.stream); break;
    case kReduce: r = g_real.Reduce(k.send, k.recv, k.count, k.dtype, k.real_op, k.root, c, k.stream); break;
    case kAllGather: r = g_real.AllGather(k.send, k.recv, k.count, k.dtype, c, k.stream); break;
    case kReduceScatter: r = g_real.ReduceScatter(k.send, k.recv, k.count, k.dtype, k.real_op, c, k.stream); break;
    case kAlltoAll:
      if (!g_real.AlltoAll) return fail(ncclInvalidUsage, "ncclAlltoAll: the real NCCL (%s) has no ncclAlltoAll", g_real.path);
      r = g_real.AlltoAll(k.send, k.recv, k.count, k.dtype, c, k.stream);
      break;
    default:
      if (strcmp(k.what, "send") == 0) r = g_real.Send(k.send, k.count, k.dtype, k.root, c, k.stream);
      else if (strcmp(k.what, "recv") == 0) r = g_real.Recv(k.recv, k.count, k.dtype, k.root, c, k.stream);
      else if (strcmp(k.what, "gather") == 0 && g_real.Gather)
        r = g_real.Gather(k.send, k.recv, k.count, k.dtype, k.root, c, k.stream);
      else if (strcmp(k.what, "scatter") == 0 && g_real.Scatter)
        r = g_real.Scatter(k.send, k.recv, k.count, k.dtype, k.root, c, k.stream);
      else
        return fail(ncclInvalidUsage, "%s: the real NCCL (%s) does not have it", k.what, g_real.path);
  }
  if (r != ncclSuccess) fail(r, "%s (NCCL): %s", name, g_real.GetLastError(c));
  return r;
}

// A group call keeps its PreMulSum op alive until ncclGroupEnd has issued it:
// the caller may destroy (and create another op in the same slot) first.
ncclResult_t hold_premul(Call& k) {
  if (t_depth == 0) return ncclSuccess;
  std::lock_guard<std::mutex> g(k.comm->mu);
  ncclComm::PreMul* e = k.comm->premul_slot(int(k.op));
  if (!e || !e->live || e->mk != k.mk_op)  // destroyed (and made again) by another thread meanwhile
    return fail(ncclInvalidArgument, "reduction op %d was destroyed while this call used it", int(k.op));
  ++e->pending;
  k.held = true;
  return ncclSuccess;
}

// Frees what a destroyed op still held for `k`, once no group call needs it.
void free_premul(const ncclComm::PreMul& m, ncclComm_t comm) {
  if (comm->dead.load()) return;  // destroyed meanwhile: its ops went with it
  if (m.mk >= 0 && comm->mk) g_mk.RedOpDestroy(mkRedOp_t(m.mk), comm->mk);
  if (m.has_real && g_real.RedOpDestroy && comm->real) g_real.RedOpDestroy(m.real, comm->real);
}

void release_premul(const Call& k) {
  if (!k.held) return;
  ncclComm::PreMul done;
  {
    std::lock_guard<std::mutex> g(k.comm->mu);
    ncclComm::PreMul& e = *k.comm->premul_slot(int(k.op));  // held: the slot is still this op's
    if (--e.pending > 0 || !e.destroyed) return;
    done = e;
    e = ncclComm::PreMul{};
  }
  free_premul(done, k.comm);
}

// A PreMulSum call's ops: mKernel's, and NCCL's when NCCL runs the call
// (made from the kept scalar on first use).
ncclResult_t resolve_premul(Call& k, const char* api) {
  ncclComm* c = k.comm;
  ncclComm::PreMul m;
  {
    std::lock_guard<std::mutex> g(c->mu);
    const ncclComm::PreMul* e = c->premul_slot(int(k.op));
    if (!e || !e->live)
      return fail(ncclInvalidArgument, "%s: reduction op %d is neither a built-in ncclRedOp_t nor a PreMulSum op of "
                  "this communicator (destroyed, or created on another communicator?)", api, int(k.op));
    m = *e;
  }
  k.premul = true;
  k.mk_op = m.mk;
  if (routes_to_mk(k)) return hold_premul(k);
  if (!m.has_real) {
    if (ncclResult_t r = ensure_real(c, api)) return r;
    if (!g_real.RedOpCreatePreMulSum)
      return fail(ncclInvalidUsage, "%s: the real NCCL (%s) lacks ncclRedOpCreatePreMulSum", api, g_real.path);
    void* scalar = m.residence == ncclScalarDevice ? m.ptr : static_cast<void*>(m.value);
    ncclRedOp_t real = ncclSum;
    if (ncclResult_t r = forwarded(g_real.RedOpCreatePreMulSum(&real, scalar, m.dtype, m.residence, c->real),
                                   "ncclRedOpCreatePreMulSum", c->real))
      return r;
    std::lock_guard<std::mutex> g(c->mu);
    ncclComm::PreMul& e = *c->premul_slot(int(k.op));  // slots are never removed
    e.has_real = true;
    e.real = real;
    m = e;
  }
  k.real_op = m.real;
  return hold_premul(k);
}

// Bytes of each ncclDataType_t (ncclInt8 .. ncclFloat8e5m2).
constexpr size_t kTypeSize[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
static_assert(ncclNumTypes == 12, "a new ncclDataType_t: give its size here and a route in route.h");

// What NCCL checks before a call runs (its ArgsCheck), checked here before
// the call goes to either library: a datatype, reduction op, root or peer
// out of range is ncclInvalidArgument with NCCL's reason as the last error,
// never a value the real NCCL or mKernel is handed to make sense of.
// PreMulSum handles (>= ncclNumOps) are checked against this communicator's
// ops by resolve_premul. A root is checked once the rank count is known (a
// nonblocking init may still run: the library that runs the call checks it).
ncclResult_t check_args(const Call& k, const char* api) {
  if (int(k.dtype) < 0 || int(k.dtype) >= int(ncclNumTypes))
    return fail(ncclInvalidArgument, "%s: invalid type %d (an ncclDataType_t is 0..%d)", api, int(k.dtype),
                int(ncclNumTypes) - 1);
  if (coll_reduces(k.coll) && int(k.op) < 0)  // ncclMaxRedOp is INT_MAX
    return fail(ncclInvalidArgument,
                "%s: invalid reduction operation %d (ncclSum..ncclAvg, or an op from ncclRedOpCreatePreMulSum)", api,
                int(k.op));
  const int n = k.comm->nranks;
  const bool p2p = k.coll == kOther && (strcmp(k.what, "send") == 0 || strcmp(k.what, "recv") == 0);
  if (n > 0 && (k.root < 0 || k.root >= n))
    return fail(ncclInvalidArgument, "%s: invalid %s %d (it should be in the 0..%d range)", api, p2p ? "peer" : "root",
                k.root, n - 1);
  // A count whose bytes (all ranks' for a gathered or scattered buffer)
  // do not fit in size_t describes no buffer.
  const bool per_rank = k.coll == kAllGather || k.coll == kReduceScatter || k.coll == kAlltoAll ||
                        (k.coll == kOther && !p2p);
  const size_t parts = per_rank && n > 0 ? size_t(n) : 1;
  if (k.count > SIZE_MAX / kTypeSize[int(k.dtype)] / parts)
    return fail(ncclInvalidArgument, "%s: count %zu of %zu-byte elements%s is more bytes than size_t holds", api,
                k.count, kTypeSize[int(k.dtype)], parts > 1 ? " per rank" : "");
  return ncclSuccess;
}

// One call: at once, or kept for ncclGroupEnd inside a group.
ncclResult_t submit(const Call& given, const char* api) {
  Call k = given;
  if (ncclResult_t r = check_comm(k.comm, api)) return r;
  if (k.comm->revoked.load()) return fail(ncclInvalidUsage, "%s: the communicator was revoked", api);
  if (ncclResult_t r = check_args(k, api)) return r;
  k.real_op = k.op;
  if (k.coll < kNumMk && coll_reduces(k.coll) && int(k.op) >= int(ncclNumOps))
    if (ncclResult_t r = resolve_premul(k, api)) return r;
  if (t_depth > 0) {
    if (!t_pending) t_pending = new std::vector<Call>;
    t_pending->push_back(k);
    return ncclSuccess;
  }
  return routes_to_mk(k) ? run_mk(k) : run_real(k);
}

}  // namespace

// ---- the exported API -------------------------------------------------------
// Each function is defined under its pnccl* name; the nccl* name is a weak
// alias of it, as in NCCL's own library.
#define MK_ALIAS(ret, name, ...) \
  extern "C" MK_EXPORT __attribute__((weak, alias("p" #name))) ret name(__VA_ARGS__);

extern "C" {

MK_EXPORT ncclResult_t pncclGetVersion(int* version) {
  if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  std::lock_guard<std::mutex> g(g_load_mu);
  // Callers gate features on the version: the real NCCL's where there is one.
  *version = load_real_locked() && g_real.version ? g_real.version : NCCL_VERSION_CODE;
  return ncclSuccess;
}

MK_EXPORT ncclResult_t pncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (!uniqueId) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  if (ncclResult_t r = need_mk()) return r;
  static_assert(sizeof(ncclUniqueId) == sizeof(mkUniqueId), "unique ids differ in size");
  const mkResult_t r = g_mk.GetUniqueId(reinterpret_cast<mkUniqueId*>(uniqueId));
  if (r != mkSuccess) return fail(ncclResult_t(r), "ncclGetUniqueId: %s", g_mk.GetLastError(nullptr));
  return ncclSuccess;
}

// NCCL's config and mKernel's have the same layout and rules (mk.h); this
// checks what NCCL checks before handing it on.
static ncclResult_t check_config(const ncclConfig_t* config, const char* api) {
  if (!config) return ncclSuccess;
  if (config->magic != 0xcafebeef)
    return fail(ncclInvalidArgument, "%s: config.magic is %#x, not 0xcafebeef: initialise it with NCCL_CONFIG_INITIALIZER",
                api, config->magic);
  if (config->size < offsetof(ncclConfig_t, blocking))
    return fail(ncclInvalidArgument, "%s: config.size %zu is too small", api, config->size);
  return ncclSuccess;
}

// What the caller's config says of blocking; nothing for NULL, a struct too
// short to hold it, or NCCL_CONFIG_UNDEF_INT (another value is passed on as
// it is: mKernel refuses one that is not 0 or 1).
static std::optional<int> config_blocking(const ncclConfig_t* config) {
  if (!config || config->size <= offsetof(ncclConfig_t, blocking) || config->blocking == NCCL_CONFIG_UNDEF_INT)
    return std::nullopt;
  return config->blocking;
}

// mKernel's copy of an NCCL config: the fields the two share (NCCL 2.28's,
// up to nvlinkCentricSched), never more. Later NCCL versions append their own
// fields where mkConfig_t has mKernel's (`schedules`): reading an NCCL 2.29
// config as an mkConfig_t would take its graphUsageMode for a pointer.
static const mkConfig_t* to_mk_config(const ncclConfig_t* config, mkConfig_t* local) {
  if (!config) return nullptr;
  constexpr size_t shared = offsetof(mkConfig_t, schedules);
  memcpy(local, config, config->size < shared ? config->size : shared);
  local->size = sizeof *local;
  local->schedules = nullptr;
  return local;
}

static ncclResult_t init_rank(ncclComm_t* comm, int nranks, const ncclUniqueId& id, int rank, ncclConfig_t* config,
                              const char* api) {
  if (!comm) return fail(ncclInvalidArgument, "%s: comm is NULL", api);
  *comm = nullptr;
  if (ncclResult_t r = check_config(config, api)) return r;
  unsigned fallback = 0;
  if (ncclResult_t r = read_fallback(&fallback)) return r;
  bool eager = false;
  if (ncclResult_t r = read_eager(&eager)) return r;
  if (ncclResult_t r = need_mk()) return r;
  mkComm_t m = nullptr;
  mkUniqueId mid;
  memcpy(&mid, &id, sizeof mid);
  // Inside a group, as NCCL does, a blocking init completes at ncclGroupEnd:
  // one thread may create several ranks' communicators that meet each other
  // (single-process multi-GPU programs). mKernel runs it as a nonblocking
  // init, which ncclGroupEnd waits for.
  mkConfig_t local = MK_CONFIG_INITIALIZER;
  to_mk_config(config, &local);
  // A communicator spanning nodes is made bootstrap-only, and NCCL runs it
  // whole (nccl_whole); the program never sees mKernel's refusal.
  local.spanNodes = MK_SPAN_NODES_BOOTSTRAP;
  const mkConfig_t* cfg = &local;
  const std::optional<int> blocking = config_blocking(config);
  const bool deferred = t_depth > 0 && (!blocking || *blocking == 1);
  if (deferred) local.blocking = 0;
  const mkResult_t r = g_mk.CommInitRankConfig(&m, nranks, mid, rank, cfg);
  if (r != mkSuccess && r != mkInProgress) return fail(ncclResult_t(r), "%s: %s", api, g_mk.GetLastError(m));
  *comm = new_comm(m, fallback, nranks, rank);
  (*comm)->nonblocking = blocking == 0;
  debug("%s: rank %d of %d -> mKernel communicator %p%s", api, rank, nranks, static_cast<void*>(*comm),
        deferred ? " (completes at ncclGroupEnd)" : "");
  if (deferred) {
    if (!t_inits) t_inits = new std::vector<ncclComm_t>;
    t_inits->push_back(*comm);
    return ncclSuccess;
  }
  // MK_NCCL_EAGER=1: NCCL's communicator now, with mKernel's (a program whose
  // first NCCL call is a send between some ranks needs it: made later, at
  // that call, it would wait for ranks that never make it).
  if (r == mkSuccess && eager)
    if (ncclResult_t e = ensure_real(*comm, "MK_NCCL_EAGER")) return e;
  // NCCL's communicator of one that spans nodes: now, while every rank is in
  // its init (a first call that is a send between some ranks could not make it).
  if (r == mkSuccess && nccl_whole(*comm))
    if (ncclResult_t e = ensure_real(*comm, api)) {
      // the caller gets no communicator, as with any failed init (ensure_real
      // aborted mKernel's already where this rank has no real NCCL)
      if ((*comm)->mk) g_mk.CommDestroy((*comm)->mk);
      (*comm)->mk = nullptr;
      (*comm)->dead = true;
      *comm = nullptr;
      return e;
    }
  return ncclResult_t(r);
}

MK_EXPORT ncclResult_t pncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return init_rank(comm, nranks, commId, rank, nullptr, "ncclCommInitRank");
}

MK_EXPORT ncclResult_t pncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                               ncclConfig_t* config) {
  return init_rank(comm, nranks, commId, rank, config, "ncclCommInitRankConfig");
}

// Every rank passes the same ids; mKernel's bootstrap needs one of them.
MK_EXPORT ncclResult_t pncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                                 ncclUniqueId* commIds, ncclConfig_t* config) {
  if (nId < 1 || !commIds) return fail(ncclInvalidArgument, "ncclCommInitRankScalable: no unique ids (nId %d)", nId);
  return init_rank(newcomm, nranks, commIds[0], myrank, config, "ncclCommInitRankScalable");
}

MK_EXPORT ncclResult_t pncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist) {
  if (!comm) return fail(ncclInvalidArgument, "ncclCommInitAll: comm is NULL");
  if (ndev < 1) return fail(ncclInvalidArgument, "ncclCommInitAll: ndev %d is not positive", ndev);
  unsigned fallback = 0;
  if (ncclResult_t r = read_fallback(&fallback)) return r;
  if (ncclResult_t r = need_mk()) return r;
  std::vector<mkComm_t> ms(size_t(ndev), nullptr);
  const mkResult_t r = g_mk.CommInitAll(ms.data(), ndev, devlist);
  if (r != mkSuccess) return fail(ncclResult_t(r), "ncclCommInitAll: %s", g_mk.GetLastError(nullptr));
  Clique* q = new Clique;
  for (int i = 0; i < ndev; ++i) {
    ncclComm_t c = new_comm(ms[size_t(i)], fallback);
    c->clique = q;
    q->members.push_back(c);
    q->devices.push_back(devlist ? devlist[i] : i);
    comm[i] = c;
  }
  return ncclSuccess;
}

MK_EXPORT ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  if (ncclResult_t r = check_comm(comm, "ncclCommSplit")) return r;
  if (!newcomm) return fail(ncclInvalidArgument, "ncclCommSplit: newcomm is NULL");
  *newcomm = nullptr;
  if (ncclResult_t r = check_config(config, "ncclCommSplit")) return r;
  if (!comm->mk) return fail(ncclInvalidUsage, "ncclCommSplit: a communicator from ncclCommShrink cannot be split here");
  mkComm_t child = nullptr;
  mkConfig_t local = MK_CONFIG_INITIALIZER;
  to_mk_config(config, &local);
  // Blocking as the caller asked (mKernel's parent may run nonblocking only
  // because it was made in a group): in a group, a blocking split completes
  // at ncclGroupEnd, as NCCL's does.
  const std::optional<int> blocking = config_blocking(config);
  const bool nonblocking = blocking ? *blocking == 0 : comm->nonblocking;
  local.blocking = nonblocking ? 0 : 1;
  const mkResult_t r = g_mk.CommSplit(comm->mk, color, key, &child, &local);
  if (r != mkSuccess && r != mkInProgress) return fail(ncclResult_t(r), "ncclCommSplit: %s", g_mk.GetLastError(comm->mk));
  if (child) {
    // Size and rank are known once the split is done; a nonblocking child
    // answers ncclCommCount/UserRank through mKernel.
    *newcomm = r == mkSuccess ? new_comm(child, comm->fallback) : new_comm(child, comm->fallback, 0, 0);
    (*newcomm)->nonblocking = nonblocking;
    // A child spanning nodes (bootstrap-only, as its parent was made) gets
    // NCCL's communicator now, while its ranks are in the split together;
    // one split in a group, at ncclGroupEnd (with the group's inits).
    if (t_depth > 0) {
      if (!t_inits) t_inits = new std::vector<ncclComm_t>;
      t_inits->push_back(*newcomm);
    } else if (r == mkSuccess && nccl_whole(*newcomm)) {
      if (ncclResult_t e = ensure_real(*newcomm, "ncclCommSplit")) return e;
    }
  }
  return ncclResult_t(r);
}

// A communicator mKernel runs shrinks on mKernel (mkCommShrink: only the
// remaining ranks talk); one NCCL runs whole shrinks in NCCL.
MK_EXPORT ncclResult_t pncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                                       ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  if (ncclResult_t r = check_comm(comm, "ncclCommShrink")) return r;
  if (!newcomm) return fail(ncclInvalidArgument, "ncclCommShrink: newcomm is NULL");
  *newcomm = nullptr;
  if (ncclResult_t r = check_config(config, "ncclCommShrink")) return r;
  if (comm->mk && !nccl_whole(comm)) {
    mkConfig_t local = MK_CONFIG_INITIALIZER;
    to_mk_config(config, &local);
    local.blocking = 1;  // mkCommShrink is blocking
    if (shrinkFlags == NCCL_SHRINK_ABORT && comm->real) {  // a hung fallback call of the parent stops too
      g_real.CommAbort(comm->real);
      comm->real = nullptr;
    }
    mkComm_t child = nullptr;
    const mkResult_t r =
        g_mk.CommShrink(comm->mk, excludeRanksList, excludeRanksCount, &child, &local, shrinkFlags);
    if (r != mkSuccess) return fail(ncclResult_t(r), "ncclCommShrink: %s", g_mk.GetLastError(comm->mk));
    *newcomm = new_comm(child, comm->fallback);
    (*newcomm)->nonblocking = false;
    return ncclSuccess;
  }
  if (ncclResult_t r = ensure_real(comm, "ncclCommShrink")) return r;
  if (!g_real.CommShrink) return fail(ncclInvalidUsage, "ncclCommShrink: the real NCCL (%s) has no ncclCommShrink", g_real.path);
  ncclComm_t child = nullptr;
  ncclResult_t r = g_real.CommShrink(comm->real, excludeRanksList, excludeRanksCount, &child, config, shrinkFlags);
  if (r != ncclSuccess && r != ncclInProgress) return fail(r, "ncclCommShrink (NCCL): %s", g_real.GetLastError(comm->real));
  if (child) {
    ncclComm_t c = new_comm(nullptr, kFallbackAll);
    c->real = child;
    *newcomm = c;
  }
  return r;
}

MK_EXPORT ncclResult_t pncclCommFinalize(ncclComm_t comm) {
  if (ncclResult_t r = check_comm(comm, "ncclCommFinalize")) return r;
  ncclResult_t r = ncclSuccess;
  if (comm->mk) r = ncclResult_t(g_mk.CommFinalize(comm->mk));
  if (r != ncclSuccess) return fail(r, "ncclCommFinalize: %s", g_mk.GetLastError(comm->mk));
  if (comm->real) r = forwarded(g_real.CommFinalize(comm->real), "ncclCommFinalize", comm->real);
  return r;
}

static ncclResult_t close_comm(ncclComm_t comm, bool abort, const char* api) {
  if (!comm) return ncclSuccess;  // as NCCL: destroying or aborting NULL does nothing
  if (comm->magic != ncclComm::kMagic) return fail(ncclInvalidArgument, "%s: comm is not a communicator of mKernel's NCCL library", api);
  if (comm->dead.exchange(true)) return fail(ncclInvalidUsage, "%s: the communicator was already destroyed", api);
  ncclResult_t r = ncclSuccess;
  if (comm->mk) {
    const mkResult_t m = abort ? g_mk.CommAbort(comm->mk) : g_mk.CommDestroy(comm->mk);
    if (m != mkSuccess) r = fail(ncclResult_t(m), "%s: %s", api, g_mk.GetLastError(nullptr));
  }
  if (ncclComm_t real = comm->real.load()) {
    const ncclResult_t n = abort ? g_real.CommAbort(real) : g_real.CommDestroy(real);
    if (n != ncclSuccess && r == ncclSuccess) r = fail(n, "%s (NCCL): %s", api, g_real.GetLastError(nullptr));
  }
  return r;
}

MK_EXPORT ncclResult_t pncclCommDestroy(ncclComm_t comm) { return close_comm(comm, false, "ncclCommDestroy"); }
MK_EXPORT ncclResult_t pncclCommAbort(ncclComm_t comm) { return close_comm(comm, true, "ncclCommAbort"); }

MK_EXPORT ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  if (ncclResult_t r = check_comm(comm, "ncclCommRevoke")) return r;
  if (revokeFlags != NCCL_REVOKE_DEFAULT)
    return fail(ncclInvalidArgument, "ncclCommRevoke: revokeFlags %d (must be NCCL_REVOKE_DEFAULT)", revokeFlags);
  comm->revoked.store(true);
  if (comm->real && g_real.CommRevoke) return forwarded(g_real.CommRevoke(comm->real, revokeFlags), "ncclCommRevoke", comm->real);
  return ncclSuccess;
}

MK_EXPORT ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (ncclResult_t r = check_comm(comm, "ncclCommGetAsyncError")) return r;
  if (!asyncError) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
  *asyncError = ncclSuccess;
  if (comm->mk) {
    mkResult_t m = mkSuccess;
    const mkResult_t r = g_mk.CommGetAsyncError(comm->mk, &m);
    if (r != mkSuccess) return fail(ncclResult_t(r), "ncclCommGetAsyncError: %s", g_mk.GetLastError(comm->mk));
    *asyncError = ncclResult_t(m);
    if (m == mkSuccess && comm->nranks == 0) learn_size(comm);  // a nonblocking init or split just finished
  }
  ncclComm_t real = comm->real;
  if (*asyncError == ncclSuccess && real) return g_real.CommGetAsyncError(real, asyncError);
  return ncclSuccess;
}

#define MK_QUERY(api, field, mkfn, realfn)                                                        \
  if (ncclResult_t r = check_comm(comm, api)) return r;                                           \
  if (!field) return fail(ncclInvalidArgument, "%s: " #field " is NULL", api);                     \
  if (comm->mk) {                                                                                 \
    const mkResult_t r = g_mk.mkfn(comm->mk, field);                                              \
    if (r != mkSuccess) return fail(ncclResult_t(r), "%s: %s", api, g_mk.GetLastError(comm->mk)); \
    return ncclSuccess;                                                                           \
  }                                                                                               \
  return realfn(comm->real, field);

MK_EXPORT ncclResult_t pncclCommCount(const ncclComm_t comm, int* count) {
  MK_QUERY("ncclCommCount", count, CommCount, g_real.CommCount)
}
MK_EXPORT ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int* device) {
  MK_QUERY("ncclCommCuDevice", device, CommCuDevice, g_real.CommCuDevice)
}
MK_EXPORT ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank) {
  MK_QUERY("ncclCommUserRank", rank, CommUserRank, g_real.CommUserRank)
}


// NCCL's registration is a local, optional hint (PyTorch's allocator hook
// registers each rank's segments in its own order); mKernel's is collective.
// So this records nothing and returns a handle ncclCommDeregister accepts:
// zero-copy through mKernel is mkCommRegister's, from mKernel's own API.
namespace {
int g_registered_token;
}
MK_EXPORT ncclResult_t pncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  if (ncclResult_t r = check_comm(comm, "ncclCommRegister")) return r;
  if (!handle) return fail(ncclInvalidArgument, "ncclCommRegister: handle is NULL");
  if (!buff || !size) return fail(ncclInvalidArgument, "ncclCommRegister: buff is NULL or size is 0");
  *handle = &g_registered_token;
  return ncclSuccess;
}

MK_EXPORT ncclResult_t pncclCommDeregister(const ncclComm_t comm, void* handle) {
  if (ncclResult_t r = check_comm(comm, "ncclCommDeregister")) return r;
  if (handle != &g_registered_token)
    return fail(ncclInvalidArgument, "ncclCommDeregister: handle is not one ncclCommRegister returned");
  return ncclSuccess;
}

// Symmetric windows are NCCL's (for its own kernels and device API): forwarded.
MK_EXPORT ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                               int winFlags) {
  if (ncclResult_t r = check_comm(comm, "ncclCommWindowRegister")) return r;
  if (ncclResult_t r = ensure_real(comm, "ncclCommWindowRegister")) return r;
  if (!g_real.CommWindowRegister) return fail(ncclInvalidUsage, "ncclCommWindowRegister: the real NCCL (%s) lacks it", g_real.path);
  return forwarded(g_real.CommWindowRegister(comm->real, buff, size, win, winFlags), "ncclCommWindowRegister", comm->real);
}

MK_EXPORT ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  if (ncclResult_t r = check_comm(comm, "ncclCommWindowDeregister")) return r;
  if (!comm->real || !g_real.CommWindowDeregister)
    return fail(ncclInvalidUsage, "ncclCommWindowDeregister: no window was registered on this communicator");
  return forwarded(g_real.CommWindowDeregister(comm->real, win), "ncclCommWindowDeregister", comm->real);
}

MK_EXPORT ncclResult_t pncclDevCommCreate(ncclComm_t comm, const ncclDevCommRequirements_t* reqs, ncclDevComm_t* out) {
  if (ncclResult_t r = check_comm(comm, "ncclDevCommCreate")) return r;
  if (ncclResult_t r = ensure_real(comm, "ncclDevCommCreate")) return r;
  if (!g_real.DevCommCreate) return fail(ncclInvalidUsage, "ncclDevCommCreate: the real NCCL (%s) lacks it", g_real.path);
  return forwarded(g_real.DevCommCreate(comm->real, reqs, out), "ncclDevCommCreate", comm->real);
}

MK_EXPORT ncclResult_t pncclDevCommDestroy(ncclComm_t comm, const ncclDevComm_t* devComm) {
  if (ncclResult_t r = check_comm(comm, "ncclDevCommDestroy")) return r;
  if (!comm->real || !g_real.DevCommDestroy)
    return fail(ncclInvalidUsage, "ncclDevCommDestroy: no device communicator was created on this communicator");
  return forwarded(g_real.DevCommDestroy(comm->real, devComm), "ncclDevCommDestroy", comm->real);
}

// Plain device memory (cuMemAlloc on the calling thread's current context),
// which mkCommRegister accepts; NCCL's own ncclMemAlloc returns VMM memory,
// which it does not.
namespace {
ncclResult_t cuda_fail(const char* api, int r) {
  const char* s = nullptr;
  if (g_cuda.GetErrorString) g_cuda.GetErrorString(r, &s);
  return fail(ncclUnhandledCudaError, "%s: CUDA error %d (%s)", api, r, s ? s : "unknown");
}
}  // namespace

MK_EXPORT ncclResult_t pncclMemAlloc(void** ptr, size_t size) {
  if (!ptr) return fail(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
  *ptr = nullptr;
  if (size == 0) return ncclSuccess;
  if (!load_cuda()) return fail(ncclSystemError, "ncclMemAlloc: the CUDA driver (libcuda.so.1) could not be loaded");
  unsigned long long p = 0;
  if (int r = g_cuda.MemAlloc(&p, size)) return cuda_fail("ncclMemAlloc", r);
  *ptr = reinterpret_cast<void*>(uintptr_t(p));
  return ncclSuccess;
}

MK_EXPORT ncclResult_t pncclMemFree(void* ptr) {
  if (!ptr) return ncclSuccess;
  if (!load_cuda()) return fail(ncclSystemError, "ncclMemFree: the CUDA driver (libcuda.so.1) could not be loaded");
  if (int r = g_cuda.MemFree(uintptr_t(ptr))) return cuda_fail("ncclMemFree", r);
  return ncclSuccess;
}

// PreMulSum ops: mKernel runs the collectives that use them (its kernel
// scales each rank's input as it reads it); a call that goes to NCCL (the
// fallback list, an NCCL-only communicator) uses an NCCL op made from the
// same scalar on first use. Handles are this library's: ncclNumOps + index.
MK_EXPORT ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                                 ncclScalarResidence_t residence, ncclComm_t comm) {
  const char* api = "ncclRedOpCreatePreMulSum";
  if (ncclResult_t r = check_comm(comm, api)) return r;
  if (!op) return fail(ncclInvalidArgument, "%s: op is NULL", api);
  if (!scalar) return fail(ncclInvalidArgument, "%s: scalar is NULL", api);
  if (int(datatype) < 0 || int(datatype) >= 12) return fail(ncclInvalidArgument, "%s: datatype %d is not an ncclDataType_t", api, int(datatype));
  if (residence != ncclScalarDevice && residence != ncclScalarHostImmediate)
    return fail(ncclInvalidArgument, "%s: residence %d is neither ncclScalarDevice nor ncclScalarHostImmediate", api, int(residence));
  ncclComm::PreMul m;
  m.live = true;
  m.dtype = datatype;
  m.residence = residence;
  if (residence == ncclScalarHostImmediate) {
    memcpy(m.value, scalar, kTypeSize[int(datatype)]);
  } else {
    m.ptr = scalar;
  }
  if (comm->mk && !nccl_whole(comm)) {
    mkRedOp_t mop = mkSum;
    const mkResult_t r = g_mk.RedOpCreatePreMulSum(&mop, residence == ncclScalarDevice ? scalar : m.value,
                                                   mkDataType_t(datatype), mkScalarResidence_t(residence), comm->mk);
    // A scalar mKernel does not take (device residence in memory it does not
    // serve, e.g. pinned host memory) is NCCL's to judge: its calls go there.
    if (r == mkSuccess) {
      m.mk = int(mop);
    } else {
      const std::string why = g_mk.GetLastError(comm->mk);
      if (need_real(api) != ncclSuccess) return fail(ncclResult_t(r), "%s", why.c_str());  // nobody else to ask
      debug("ncclRedOpCreatePreMulSum: mKernel refused the scalar (%s); calls with this op go to NCCL", why.c_str());
    }
  }
  std::lock_guard<std::mutex> g(comm->mu);
  size_t i = 0;
  while (i < comm->premuls.size() && (comm->premuls[i].live || comm->premuls[i].destroyed)) ++i;
  if (i == comm->premuls.size())
    comm->premuls.push_back(m);
  else
    comm->premuls[i] = m;
  *op = ncclRedOp_t(int(ncclNumOps) + int(i));
  return ncclSuccess;
}

MK_EXPORT ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  const char* api = "ncclRedOpDestroy";
  if (ncclResult_t r = check_comm(comm, api)) return r;
  ncclComm::PreMul m;
  {
    std::lock_guard<std::mutex> g(comm->mu);
    ncclComm::PreMul* e = comm->premul_slot(int(op));
    if (!e || !e->live)
      return fail(ncclInvalidArgument, "%s: op %d is not a live PreMulSum op of this communicator", api, int(op));
    m = *e;
    if (m.pending > 0) {  // group calls still use it: the last of them frees it (release_premul)
      e->live = false;
      e->destroyed = true;
      return ncclSuccess;
    }
    *e = ncclComm::PreMul{};
  }
  if (m.mk >= 0 && comm->mk) {
    const mkResult_t r = g_mk.RedOpDestroy(mkRedOp_t(m.mk), comm->mk);
    if (r != mkSuccess) return fail(ncclResult_t(r), "%s", g_mk.GetLastError(comm->mk));
  }
  if (m.has_real && g_real.RedOpDestroy) return forwarded(g_real.RedOpDestroy(m.real, comm->real), api, comm->real);
  return ncclSuccess;
}

static Call call(int coll, const char* what, const void* send, void* recv, size_t count, ncclDataType_t dtype,
                 ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return Call{coll, what, send, recv, count, dtype, op, root, comm, stream};
}

MK_EXPORT ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                      ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return submit(call(kAllReduce, "allreduce", sendbuff, recvbuff, count, datatype, op, 0, comm, stream), "ncclAllReduce");
}
MK_EXPORT ncclResult_t pncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                      int root, ncclComm_t comm, cudaStream_t stream) {
  return submit(call(kBroadcast, "broadcast", sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream),
                "ncclBroadcast");
}
MK_EXPORT ncclResult_t pncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                                  cudaStream_t stream) {
  return submit(call(kBroadcast, "broadcast", buff, buff, count, datatype, ncclSum, root, comm, stream), "ncclBcast");
}
MK_EXPORT ncclResult_t pncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                   ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return submit(call(kReduce, "reduce", sendbuff, recvbuff, count, datatype, op, root, comm, stream), "ncclReduce");
}
MK_EXPORT ncclResult_t pncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                                      ncclComm_t comm, cudaStream_t stream) {
  return submit(call(kAllGather, "allgather", sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream),
                "ncclAllGather");
}
MK_EXPORT ncclResult_t pncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                          ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                          cudaStream_t stream) {
  return submit(call(kReduceScatter, "reducescatter", sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream),
                "ncclReduceScatter");
}
MK_EXPORT ncclResult_t pncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                     ncclComm_t comm, cudaStream_t stream) {
  return submit(call(kAlltoAll, "alltoall", sendbuff, recvbuff, count, datatype, ncclSum, 0, comm, stream),
                "ncclAlltoAll");
}
MK_EXPORT ncclResult_t pncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                   int root, ncclComm_t comm, cudaStream_t stream) {
  return submit(call(kOther, "gather", sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream), "ncclGather");
}
MK_EXPORT ncclResult_t pncclScatter(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                    int root, ncclComm_t comm, cudaStream_t stream) {
  return submit(call(kOther, "scatter", sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream),
                "ncclScatter");
}
MK_EXPORT ncclResult_t pncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                                 ncclComm_t comm, cudaStream_t stream) {
  return submit(call(kOther, "send", sendbuff, nullptr, count, datatype, ncclSum, peer, comm, stream), "ncclSend");
}
MK_EXPORT ncclResult_t pncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                                 cudaStream_t stream) {
  return submit(call(kOther, "recv", nullptr, recvbuff, count, datatype, ncclSum, peer, comm, stream), "ncclRecv");
}

// Groups. mKernel's group opens with the outermost ncclGroupStart (so that
// inits and splits inside it are grouped as NCCL groups them); calls are
// kept until the outermost ncclGroupEnd, which issues mKernel's part, then
// NCCL's (end_group).
MK_EXPORT ncclResult_t pncclGroupStart() {
  if (t_depth++ == 0) {
    if (!t_pending) t_pending = new std::vector<Call>;
    t_pending->clear();
    std::lock_guard<std::mutex> g(g_load_mu);
    t_mk_group = load_mk_locked() && g_mk.GroupStart() == mkSuccess;
  }
  return ncclSuccess;
}

// The group's inits: wait until each is done (mKernel's bootstrap timeout
// bounds it); the first failure is the group's.
static ncclResult_t finish_inits() {
  if (!t_inits) return ncclSuccess;
  std::vector<ncclComm_t> inits;
  inits.swap(*t_inits);
  ncclResult_t first = ncclSuccess;
  std::vector<ncclComm_t> whole;  // communicators spanning nodes: NCCL's, made together below
  for (ncclComm_t c : inits) {
    mkResult_t st = mkInProgress;
    while (st == mkInProgress) {
      if (g_mk.CommGetAsyncError(c->mk, &st) != mkSuccess) st = mkInternalError;
      if (st == mkInProgress) usleep(200);
    }
    if (st == mkSuccess) {
      learn_size(c);
      if (nccl_whole(c)) whole.push_back(c);
    } else if (first == ncclSuccess) {
      first = fail(ncclResult_t(st), "ncclGroupEnd: rank %d's ncclCommInitRank in the group failed: %s", c->rank,
                   g_mk.GetLastError(c->mk));
    }
  }
  if (first == ncclSuccess && !whole.empty()) first = ensure_real_all(whole, "ncclGroupEnd");
  return first;
}

static ncclResult_t end_group(ncclSimInfo_t* sim) {
  if (t_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd: no ncclGroupStart is open");
  if (--t_depth > 0) return ncclSuccess;
  std::vector<Call> calls;
  calls.swap(*t_pending);
  struct Release {  // on every way out: the group's hold on its PreMulSum ops
    const std::vector<Call>& calls;
    ~Release() {
      for (const Call& k : calls) release_premul(k);
    }
  } release{calls};
  const bool mk_open = t_mk_group;
  t_mk_group = false;
  if (ncclResult_t r = finish_inits()) {
    if (mk_open) g_mk.GroupEnd();
    return r;
  }
  // Each call goes where it would outside a group (route.h: the same on
  // every rank); then every rank issues mKernel's part of the group before
  // NCCL's. mKernel's part holds collectives only, which every rank issues in
  // the same order, so it completes whatever NCCL's part holds (sends that
  // only some ranks make): no rank waits on NCCL while a peer waits on
  // mKernel.
  std::vector<Call> mine, theirs;
  for (const Call& k : calls) (routes_to_mk(k) ? mine : theirs).push_back(k);
  if (sim) {  // nothing runs; NCCL's estimate of its part
    if (mk_open) g_mk.GroupEnd();
    sim->estimatedTime = NCCL_UNDEF_FLOAT;
    if (theirs.empty() || need_real("ncclGroupSimulateEnd") != ncclSuccess || !g_real.GroupSimulateEnd)
      return ncclSuccess;
    for (const Call& k : theirs)
      if (ncclResult_t r = ensure_real(k.comm, "ncclGroupSimulateEnd")) return r;
    g_real.GroupStart();
    for (const Call& k : theirs) run_real(k);
    return forwarded(g_real.GroupSimulateEnd(sim), "ncclGroupSimulateEnd", nullptr);
  }
  ncclResult_t first = ncclSuccess;
  for (const Call& k : mine) {
    const ncclResult_t r = run_mk(k);
    if (r != ncclSuccess && first == ncclSuccess) first = r;
  }
  if (mk_open) {  // all or nothing: a failed call launches none of mKernel's part
    const mkResult_t e = g_mk.GroupEnd();
    if (first == ncclSuccess && e != mkSuccess && e != mkInProgress)
      first = fail(ncclResult_t(e), "ncclGroupEnd: %s", g_mk.GetLastError(nullptr));
  }
  if (first != ncclSuccess || theirs.empty()) return first;
  {
    std::vector<ncclComm_t> comms;
    for (const Call& k : theirs) comms.push_back(k.comm);
    if (ncclResult_t r = ensure_real_all(comms, "a call mKernel does not run")) return r;
  }
  g_real.GroupStart();
  for (const Call& k : theirs) {
    const ncclResult_t r = run_real(k);
    if (r != ncclSuccess && first == ncclSuccess) first = r;
  }
  const ncclResult_t e = forwarded(g_real.GroupEnd(), "ncclGroupEnd", nullptr);
  return first != ncclSuccess ? first : e;
}

MK_EXPORT ncclResult_t pncclGroupEnd() { return end_group(nullptr); }

MK_EXPORT ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  if (!simInfo) return fail(ncclInvalidArgument, "ncclGroupSimulateEnd: simInfo is NULL");
  return end_group(simInfo);
}

MK_EXPORT const char* pncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with MK_DEBUG=1 for details)";
    case ncclSystemError: return "unhandled system error (run with MK_DEBUG=1 for details)";
    case ncclInternalError: return "internal error - please report this issue to the mKernel developers";
    case ncclInvalidArgument: return "invalid argument (run with MK_DEBUG=1 for details)";
    case ncclInvalidUsage: return "invalid usage (run with MK_DEBUG=1 for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

// This library's last error on this thread, else mKernel's, else NCCL's.
MK_EXPORT const char* pncclGetLastError(ncclComm_t comm) {
  if (t_error[0]) return t_error;
  const bool ours = comm && comm->magic == ncclComm::kMagic && !comm->dead.load();
  if (g_mk_loaded) {
    const char* m = g_mk.GetLastError(ours ? comm->mk : nullptr);
    if (m && *m) return m;
  }
  if (g_real_state.load(std::memory_order_acquire) > 0) {
    const char* n = g_real.GetLastError(ours ? comm->real.load() : nullptr);
    if (n && *n) return n;
  }
  return "";
}

MK_EXPORT void pncclResetDebugInit() {
  if (g_real_state.load(std::memory_order_acquire) > 0 && g_real.ResetDebugInit) g_real.ResetDebugInit();
}

}  // extern "C"

// The nccl* names.
MK_ALIAS(ncclResult_t, ncclGetVersion, int*)
MK_ALIAS(ncclResult_t, ncclGetUniqueId, ncclUniqueId*)
MK_ALIAS(ncclResult_t, ncclCommInitRank, ncclComm_t*, int, ncclUniqueId, int)
MK_ALIAS(ncclResult_t, ncclCommInitRankConfig, ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*)
MK_ALIAS(ncclResult_t, ncclCommInitRankScalable, ncclComm_t*, int, int, int, ncclUniqueId*, ncclConfig_t*)
MK_ALIAS(ncclResult_t, ncclCommInitAll, ncclComm_t*, int, const int*)
MK_ALIAS(ncclResult_t, ncclCommSplit, ncclComm_t, int, int, ncclComm_t*, ncclConfig_t*)
MK_ALIAS(ncclResult_t, ncclCommShrink, ncclComm_t, int*, int, ncclComm_t*, ncclConfig_t*, int)
MK_ALIAS(ncclResult_t, ncclCommFinalize, ncclComm_t)
MK_ALIAS(ncclResult_t, ncclCommDestroy, ncclComm_t)
MK_ALIAS(ncclResult_t, ncclCommAbort, ncclComm_t)
MK_ALIAS(ncclResult_t, ncclCommRevoke, ncclComm_t, int)
MK_ALIAS(ncclResult_t, ncclCommGetAsyncError, ncclComm_t, ncclResult_t*)
MK_ALIAS(ncclResult_t, ncclCommCount, const ncclComm_t, int*)
MK_ALIAS(ncclResult_t, ncclCommCuDevice, const ncclComm_t, int*)
MK_ALIAS(ncclResult_t, ncclCommUserRank, const ncclComm_t, int*)
MK_ALIAS(ncclResult_t, ncclCommRegister, const ncclComm_t, void*, size_t, void**)
MK_ALIAS(ncclResult_t, ncclCommDeregister, const ncclComm_t, void*)
MK_ALIAS(ncclResult_t, ncclCommWindowRegister, ncclComm_t, void*, size_t, ncclWindow_t*, int)
MK_ALIAS(ncclResult_t, ncclCommWindowDeregister, ncclComm_t, ncclWindow_t)
MK_ALIAS(ncclResult_t, ncclDevCommCreate, ncclComm_t, const ncclDevCommRequirements_t*, ncclDevComm_t*)
MK_ALIAS(ncclResult_t, ncclDevCommDestroy, ncclComm_t, const ncclDevComm_t*)
MK_ALIAS(ncclResult_t, ncclMemAlloc, void**, size_t)
MK_ALIAS(ncclResult_t, ncclMemFree, void*)
MK_ALIAS(ncclResult_t, ncclRedOpCreatePreMulSum, ncclRedOp_t*, void*, ncclDataType_t, ncclScalarResidence_t, ncclComm_t)
MK_ALIAS(ncclResult_t, ncclRedOpDestroy, ncclRedOp_t, ncclComm_t)
MK_ALIAS(ncclResult_t, ncclAllReduce, const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t)
MK_ALIAS(ncclResult_t, ncclBroadcast, const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)
MK_ALIAS(ncclResult_t, ncclBcast, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)
MK_ALIAS(ncclResult_t, ncclReduce, const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t)
MK_ALIAS(ncclResult_t, ncclAllGather, const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t)
MK_ALIAS(ncclResult_t, ncclReduceScatter, const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t)
MK_ALIAS(ncclResult_t, ncclAlltoAll, const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t)
MK_ALIAS(ncclResult_t, ncclGather, const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)
MK_ALIAS(ncclResult_t, ncclScatter, const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)
MK_ALIAS(ncclResult_t, ncclSend, const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)
MK_ALIAS(ncclResult_t, ncclRecv, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)
MK_ALIAS(ncclResult_t, ncclGroupStart, void)
MK_ALIAS(ncclResult_t, ncclGroupEnd, void)
MK_ALIAS(ncclResult_t, ncclGroupSimulateEnd, ncclSimInfo_t*)
MK_ALIAS(const char*, ncclGetErrorString, ncclResult_t)
MK_ALIAS(const char*, ncclGetLastError, ncclComm_t)
MK_ALIAS(void, ncclResetDebugInit, void)
