// mkCommRegister / mkCommDeregister: user buffers mapped into every peer, so
// that calls on them run zero-copy plans (no staging through scratch).
//
// Each rank's registered buffer gets a row ("window") in its table; column p
// of row w on rank q is rank p's buffer of its window w as q's GPU sees it.
// At kernel entry a zero-copy plan announces (window, offset) of the call's
// buffers to every peer, which looks them up in its own table (abi.cuh).
//
//   ranks in other processes  registration is collective (like
//                             ncclCommWindowRegister): all ranks call it in the
//                             same order; buffers travel as CUDA IPC handles
//                             over the bootstrap and are opened by every peer.
//                             Any rank's failure fails it on every rank.
//   one process (mkCommInitAll, or ranks sharing a process)
//                             buffers are shared by address: peer access is
//                             enabled and the rank writes its column into
//                             every member's table; no other rank takes part.
#include <atomic>
#include <fmt/format.h>
#include <unistd.h>

#include <cstring>
#include <map>

#include "runtime/comm/comm.hpp"
#include "runtime/driver/cuda_driver.hpp"
#include "runtime/api/status.hpp"
#include "runtime/transport/transport.hpp"

namespace mk::rt {

namespace {

// IPC mappings are per process and context: two registrations of one peer
// allocation (two buffers in it, or two communicators) share one mapping.
struct Import {
  CUdeviceptr base = 0;
  int refs = 0;
};
std::mutex& import_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::pair<std::string, CUcontext>, Import>& imports() {
  static std::map<std::pair<std::string, CUcontext>, Import> m;
  return m;
}

CUdeviceptr open_import(const CUipcMemHandle& h, CUcontext ctx) {
  std::lock_guard<std::mutex> lock(import_mutex());
  auto key = std::make_pair(std::string(h.reserved, sizeof h.reserved), ctx);
  Import& im = imports()[key];
  if (im.refs == 0) {
    CUresult r = cu().cuIpcOpenMemHandle(&im.base, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    if (r != CUDA_SUCCESS) {
      imports().erase(key);
      fail(mkSystemError, "opening a peer's registered buffer (cuIpcOpenMemHandle): " + cu_error_string(r));
    }
  }
  ++im.refs;
  return im.base;
}

void close_import(CUdeviceptr base, CUcontext ctx) {
  std::lock_guard<std::mutex> lock(import_mutex());
  for (auto it = imports().begin(); it != imports().end(); ++it)
    if (it->first.second == ctx && it->second.base == base) {
      if (--it->second.refs == 0) {
        cu().cuIpcCloseMemHandle(base);
        imports().erase(it);
      }
      return;
    }
}

// What a rank tells the others when it registers (fixed layout, host order).
struct Announce {
  int32_t ok;
  int32_t window;
  int32_t max_windows;
  int32_t pad;
  uint64_t process;
  uint64_t address;  // this rank's buffer (valid in its own process)
  uint64_t size;
  uint64_t offset;   // buffer - allocation base
  CUipcMemHandle handle;
  char why[256];
};

// Writes entry (w, p) of `m`'s table: rank p's window w as `m` sees it.
void set_entry(Comm& m, int w, int p, CUdeviceptr base, int64_t bytes) {
  dev::ZcPeerWindow e{reinterpret_cast<char*>(base), bytes};
  CtxGuard g(m.ctx);
  const CUdeviceptr at = m.regs.windows + sizeof(e) * (size_t(w) * size_t(m.nranks) + size_t(p));
  MK_CU(cu().cuMemcpyHtoDAsync(at, &e, sizeof e, m.side_stream), "updating the registration table");
  MK_CU(cu().cuStreamSynchronize(m.side_stream), "updating the registration table");
}

int free_window(const Comm& c) {
  std::vector<bool> used(size_t(c.config.max_windows), false);
  for (const auto& [base, reg] : c.regs.by_base) used[size_t(reg.window)] = true;
  for (int w = 0; w < c.config.max_windows; ++w)
    if (!used[size_t(w)]) return w;
  return -1;
}

// Everything a rank can check alone; "" when fine. `same_process`: peers
// will reach the buffer by address (peer access), which works for cudaMalloc
// memory only (not stream-ordered pools or VMM allocations).
std::string local_check(Comm& c, void* buff, size_t size, void** handle, bool same_process) {
  if (!buff || !size || !handle) return "buff, size and handle must be non-zero";
  const uintptr_t b = reinterpret_cast<uintptr_t>(buff);
  for (const auto& [base, reg] : c.regs.by_base)
    if (b < base + reg.bytes && base < b + size)
      return fmt::format("[{:p}, +{}) overlaps a buffer registered before", buff, size);
  if (free_window(c) < 0)
    return fmt::format("{} buffers are registered already (MK_MAX_REGISTRATIONS)", c.config.max_windows);
  CtxGuard g(c.ctx);
  CUdeviceptr base = 0;
  size_t alloc = 0;
  CUresult r = cu().cuMemGetAddressRange(&base, &alloc, CUdeviceptr(b));
  if (r != CUDA_SUCCESS) return "buff is not GPU memory of this process (" + cu_error_string(r) + ")";
  if (b + size > base + alloc)
    return fmt::format("[{:p}, +{}) runs {} bytes past the end of its allocation", buff, size, b + size - (base + alloc));
  int ordinal = -1;
  r = cu().cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CUdeviceptr(b));
  if (r == CUDA_SUCCESS && ordinal != c.device)
    return fmt::format("buff lives on GPU {}, the communicator (rank {}) on GPU {}", ordinal, c.rank, c.device);
  // Memory that legacy IPC can share is exactly the memory peer access
  // reaches (pools and VMM allocations need their own access grants).
  CUipcMemHandle probe;
  if (same_process && cu().cuIpcGetMemHandle(&probe, base) != CUDA_SUCCESS)
    return "buff is not cudaMalloc / cuMemAlloc memory (a stream-ordered pool or a VMM allocation), which peers "
           "cannot reach by peer access";
  return "";
}

void enable_peer_access(CUcontext from, CUcontext to) {
  if (from == to) return;
  CtxGuard g(from);
  CUresult r = cu().cuCtxEnablePeerAccess(to, 0);
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
    fail(mkSystemError, "enabling peer access for a registered buffer: " + cu_error_string(r));
}

// Within one process: rank c's buffer of window w (0: none) goes into the
// table of every member of its clique (or its own, alone), and the members
// get peer access to it.
void publish_in_process(Comm& c, int w, CUdeviceptr base, int64_t bytes) {
  if (!c.clique) {
    set_entry(c, w, c.rank, base, bytes);
    return;
  }
  std::lock_guard<std::mutex> lock(c.clique->mu);
  for (Comm* m : c.clique->members)
    if (m) {
      if (base) enable_peer_access(m->ctx, c.ctx);  // m's kernels reach this buffer
      set_entry(*m, w, c.rank, base, bytes);
    }
}

void register_in_process(Comm& c, void* buff, size_t size, void** handle) {
  std::string why = local_check(c, buff, size, handle, c.nranks > 1);
  if (!why.empty()) fail(mkInvalidArgument, "mkCommRegister: " + why);
  const int w = free_window(c);
  const CUdeviceptr b = CUdeviceptr(reinterpret_cast<uintptr_t>(buff));
  publish_in_process(c, w, b, int64_t(size));
  Registration reg;
  reg.bytes = size;
  reg.window = w;
  reg.imports.assign(size_t(c.nranks), 0);
  c.regs.by_base[uintptr_t(b)] = std::move(reg);
}

// Every rank makes the same two all-gathers whatever happens locally: a
// failure is announced, never a reason to leave early.
void register_across_processes(Comm& c, void* buff, size_t size, void** handle) {
  Announce mine{};
  std::string why = local_check(c, buff, size, handle, false);
  CUdeviceptr base = 0;
  size_t alloc = 0;
  if (why.empty()) {
    CtxGuard g(c.ctx);
    cu().cuMemGetAddressRange(&base, &alloc, CUdeviceptr(reinterpret_cast<uintptr_t>(buff)));
    CUresult r = cu().cuIpcGetMemHandle(&mine.handle, base);
    if (r != CUDA_SUCCESS)
      why = "buff cannot be shared with other processes (cuIpcGetMemHandle: " + cu_error_string(r) +
            "); register memory from cudaMalloc / cuMemAlloc (not a stream-ordered pool or a VMM allocation)";
  }
  mine.ok = why.empty();
  mine.window = mine.ok ? free_window(c) : -1;
  mine.max_windows = c.config.max_windows;
  mine.process = process_token();
  mine.address = uint64_t(reinterpret_cast<uintptr_t>(buff));
  mine.size = size;
  mine.offset = uint64_t(reinterpret_cast<uintptr_t>(buff) - base);
  std::snprintf(mine.why, sizeof mine.why, "%s", why.c_str());
  auto gather = [&](const Announce& a) {
    auto blobs = c.boot->allgather(std::string(reinterpret_cast<const char*>(&a), sizeof a));
    std::vector<Announce> all(blobs.size());
    for (size_t p = 0; p < blobs.size(); ++p) {
      if (blobs[p].size() != sizeof(Announce)) fail(mkInternalError, "mkCommRegister: malformed exchange");
      std::memcpy(&all[p], blobs[p].data(), sizeof(Announce));
    }
    return all;
  };
  std::vector<Announce> all = gather(mine);
  for (int p = 0; p < c.nranks; ++p)
    if (!all[size_t(p)].ok)
      fail(p == c.rank ? mkInvalidArgument : mkInvalidUsage,
           fmt::format("mkCommRegister: rank {}: {} (registration is collective: no rank registered this buffer)", p,
                       all[size_t(p)].why));
  // Every rank keeps a row per window of every peer: the same limit everywhere
  // (decided from what all ranks announced, so all ranks decide alike).
  for (int p = 0; p < c.nranks; ++p)
    for (int q = 0; q < c.nranks; ++q)
      if (all[size_t(p)].window >= all[size_t(q)].max_windows)
        fail(mkInvalidUsage, fmt::format("mkCommRegister: rank {} has {} buffers registered but rank {} allows {} "
                                         "(MK_MAX_REGISTRATIONS must be the same on every rank)",
                                         p, all[size_t(p)].window + 1, q, all[size_t(q)].max_windows));
  // Open every peer's buffer; then agree that every rank managed to.
  Registration reg;
  reg.bytes = size;
  reg.window = mine.window;
  reg.imports.assign(size_t(c.nranks), 0);
  std::vector<CUdeviceptr> where(size_t(c.nranks), 0);
  Announce second{};
  second.ok = 1;
  try {
    CtxGuard g(c.ctx);
    for (int p = 0; p < c.nranks; ++p) {
      const Announce& a = all[size_t(p)];
      if (p == c.rank) {
        where[size_t(p)] = CUdeviceptr(a.address);
      } else if (a.process == process_token()) {  // another rank of this process: same address space
        CUcontext owner = nullptr;
        if (cu().cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, CUdeviceptr(a.address)) == CUDA_SUCCESS)
          enable_peer_access(c.ctx, owner);
        where[size_t(p)] = CUdeviceptr(a.address);
      } else {
        reg.imports[size_t(p)] = open_import(a.handle, c.ctx);
        where[size_t(p)] = reg.imports[size_t(p)] + CUdeviceptr(a.offset);
      }
    }
  } catch (const RtError& e) {
    second.ok = 0;
    std::snprintf(second.why, sizeof second.why, "%s", e.what());
  }
  std::vector<Announce> agreed = gather(second);
  for (int p = 0; p < c.nranks; ++p)
    if (!agreed[size_t(p)].ok) {
      for (int q = 0; q < c.nranks; ++q)
        if (reg.imports[size_t(q)]) close_import(reg.imports[size_t(q)], c.ctx);
      fail(mkSystemError, fmt::format("mkCommRegister: rank {}: {} (no rank registered this buffer)", p,
                                      agreed[size_t(p)].why));
    }
  try {
    for (int p = 0; p < c.nranks; ++p)
      set_entry(c, all[size_t(p)].window, p, where[size_t(p)], int64_t(all[size_t(p)].size));
  } catch (...) {
    for (int p = 0; p < c.nranks; ++p) {
      if (reg.imports[size_t(p)]) close_import(reg.imports[size_t(p)], c.ctx);
      try {
        set_entry(c, all[size_t(p)].window, p, 0, 0);
      } catch (...) {
      }
    }
    throw;
  }
  c.regs.by_base[uintptr_t(mine.address)] = std::move(reg);
}

}  // namespace

void comm_register(Comm& c, void* buff, size_t size, void** handle) {
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.boot && c.nranks > 1)
    register_across_processes(c, buff, size, handle);
  else
    register_in_process(c, buff, size, handle);
  // "rg" | n << 4: never 0, never reused, never a user address.
  static std::atomic<uint64_t> next{1};
  const uintptr_t h = (uintptr_t(0x7267) << 48) | (uintptr_t(next.fetch_add(1)) << 4);
  c.regs.by_handle[h] = reinterpret_cast<uintptr_t>(buff);
  *handle = reinterpret_cast<void*>(h);
}

void comm_deregister(Comm& c, void* handle) {
  std::unique_lock<std::mutex> lock(c.mu);
  const uintptr_t h = reinterpret_cast<uintptr_t>(handle);
  auto find = [&] {
    auto b = c.regs.by_handle.find(h);
    return b == c.regs.by_handle.end() ? c.regs.by_base.end() : c.regs.by_base.find(b->second);
  };
  auto it = find();
  const bool known = it != c.regs.by_base.end();
  const int w = known ? it->second.window : -1;
  // The calls that use the buffer must have completed: this communicator's
  // kernels (not the whole device), waited for without holding the lock.
  auto drain = [&] {
    lock.unlock();
    const bool idle = c.wait_idle(c.config.timeout_ns == 0 ? -1 : int64_t(c.config.timeout_ns / 1000000) + 5000);
    lock.lock();
    if (!idle) fail(mkRemoteError, "mkCommDeregister: kernels that may use the buffer did not finish");
    it = find();  // another thread may have changed the table
    if (it == c.regs.by_base.end()) fail(mkInvalidUsage, "mkCommDeregister: the handle was deregistered meanwhile");
  };
  if (c.boot && c.nranks > 1) {
    // Collective: every peer drops its mapping of this rank's window.
    auto blobs = c.boot->allgather(std::string(reinterpret_cast<const char*>(&w), sizeof w));
    for (int p = 0; p < c.nranks; ++p) {
      int32_t pw = -1;
      if (blobs[size_t(p)].size() == sizeof pw) std::memcpy(&pw, blobs[size_t(p)].data(), sizeof pw);
      if (pw < 0) {
        if (p == c.rank) fail(mkInvalidArgument, "mkCommDeregister: handle was not registered");
        fail(mkInvalidUsage, fmt::format("mkCommDeregister: rank {} passed a handle it never registered "
                                         "(deregistration is collective)",
                                         p));
      }
    }
    drain();
    for (int p = 0; p < c.nranks; ++p) {
      int32_t pw = -1;
      std::memcpy(&pw, blobs[size_t(p)].data(), sizeof pw);
      set_entry(c, pw, p, 0, 0);
    }
    for (int p = 0; p < c.nranks; ++p)
      if (it->second.imports[size_t(p)]) close_import(it->second.imports[size_t(p)], c.ctx);
  } else {
    if (!known) fail(mkInvalidArgument, "mkCommDeregister: handle was not registered");
    drain();
    publish_in_process(c, w, 0, 0);
  }
  c.regs.by_base.erase(it);
  c.regs.by_handle.erase(h);
}

void release_registrations(Comm& c) {
  for (auto& [base, reg] : c.regs.by_base)
    for (CUdeviceptr im : reg.imports)
      if (im) close_import(im, c.ctx);
  c.regs.by_base.clear();
  c.regs.by_handle.clear();
  if (c.clique) {
    std::lock_guard<std::mutex> lock(c.clique->mu);
    for (Comm*& m : c.clique->members)
      if (m == &c) m = nullptr;
  }
}

}  // namespace mk::rt
