#include "runtime/comm.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>

#include "runtime/cuda_driver.hpp"
#include "runtime/env.hpp"
#include "runtime/ipc.hpp"
#include "runtime/status.hpp"
#include "templates/layout.cuh"

namespace mk::rt {

namespace {

uint64_t process_token() {
  static const uint64_t t = [] {
    std::random_device rd;
    return (uint64_t(rd()) << 32) ^ rd() ^ uint64_t(::getpid());
  }();
  return t;
}

struct RankInfo {
  char host[64];
  char boot_id[40];
  uint64_t token;
  int64_t pid;
  int32_t device;
  int32_t arch;
  uint8_t uuid[16];
  uint64_t arena_base;
  uint64_t arena_size;
};

std::string read_boot_id() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string s;
  std::getline(f, s);
  return s;
}

void setup_device(Comm& c, int device) {
  const Driver& d = cu();
  int count = 0;
  MK_CU(d.cuDeviceGetCount(&count), "counting GPUs");
  if (device < 0 || device >= count)
    fail(mkInvalidArgument, fmt::format("device {} does not exist (this process sees {} GPU(s))", device, count));
  c.device = device;
  MK_CU(d.cuDeviceGet(&c.cudev, device), "cuDeviceGet");
  MK_CU(d.cuDevicePrimaryCtxRetain(&c.ctx, c.cudev), "retaining the device's primary context");
  int major = 0, minor = 0;
  d.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, c.cudev);
  d.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, c.cudev);
  d.cuDeviceGetAttribute(&c.sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, c.cudev);
  c.arch = major * 10 + minor;
  if (c.arch < 70)
    fail(mkSystemError, fmt::format("GPU {} has compute capability {}.{}; mKernel needs 7.0 or newer", device, major, minor));
}

void setup_memory(Comm& c) {
  const Driver& d = cu();
  CtxGuard g(c.ctx);
  c.arena.allocate(c.cudev, size_t(c.config.flag_bytes + c.config.scratch_bytes));
  MK_CU(d.cuEventCreate(&c.order_event, CU_EVENT_DISABLE_TIMING), "creating an event");
  void* host = nullptr;
  MK_CU(d.cuMemHostAlloc(&host, 64, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE), "allocating the abort flag");
  std::memset(host, 0, 64);
  c.host_abort = static_cast<volatile int32_t*>(host);
  MK_CU(d.cuMemHostGetDevicePointer(&c.host_abort_dev, host, 0), "mapping the abort flag");
  const size_t table = sizeof(dev::ZcPeerWindow) * size_t(c.config.max_windows) * size_t(c.nranks);
  MK_CU(d.cuMemAlloc(&c.windows, table), "allocating the registration table");
  MK_CU(d.cuMemsetD8(c.windows, 0, table), "clearing the registration table");
  MK_CU(d.cuStreamCreate(&c.side_stream, CU_STREAM_NON_BLOCKING), "creating a stream");
}

void check_peer_access(CUdevice a, CUdevice b) {
  if (a == b) return;
  int can = 0;
  MK_CU(cu().cuDeviceCanAccessPeer(&can, a, b), "cuDeviceCanAccessPeer");
  if (!can)
    fail(mkSystemError, fmt::format("GPUs {} and {} cannot access each other's memory (no NVLink or PCIe peer "
                                    "access); mKernel's intra-node transport needs peer access",
                                    a, b));
}

}  // namespace

CommConfig comm_config_from_env() {
  CommConfig c;
  c.scratch_bytes = env::scratch_bytes();
  c.flag_bytes = env::flag_bytes();
  c.timeout_ns = uint64_t(env::timeout_ms()) * 1000000ull;
  c.max_windows = env::max_registrations();
  if (c.max_windows < 1 || c.max_windows > (1 << 20))
    fail(mkInvalidArgument, "MK_MAX_REGISTRATIONS must be in 1..1048576");
  if (c.scratch_bytes < (1 << 20)) fail(mkInvalidArgument, "MK_SCRATCH_BYTES must be at least 1 MiB");
  if (c.flag_bytes < 4096) fail(mkInvalidArgument, "MK_FLAG_BYTES must be at least 4096");
  return c;
}

Comm* comm_init_rank(int nranks, const mkUniqueId& id, int rank) {
  if (nranks < 1) fail(mkInvalidArgument, fmt::format("nranks must be >= 1, got {}", nranks));
  if (rank < 0 || rank >= nranks) fail(mkInvalidArgument, fmt::format("rank {} is outside 0..{}", rank, nranks - 1));
  const Driver& d = cu();
  auto c = std::make_unique<Comm>();
  c->nranks = nranks;
  c->rank = rank;
  c->config = comm_config_from_env();
  // The caller's current device (cudaSetDevice), as NCCL does.
  CUcontext cur = nullptr;
  int device = 0;
  if (d.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur) {
    CUdevice dev = 0;
    MK_CU(d.cuCtxGetDevice(&dev), "cuCtxGetDevice");
    device = int(dev);
  }
  setup_device(*c, device);
  if (nranks > 1) c->boot = std::make_unique<Bootstrap>(id, nranks, rank);
  setup_memory(*c);

  RankInfo me{};
  char host[64] = {};
  ::gethostname(host, sizeof host - 1);
  std::memcpy(me.host, host, sizeof me.host);
  std::string boot = read_boot_id();
  std::strncpy(me.boot_id, boot.c_str(), sizeof me.boot_id - 1);
  me.token = process_token();
  me.pid = ::getpid();
  me.device = c->device;
  me.arch = c->arch;
  CUuuid uuid{};
  d.cuDeviceGetUuid(&uuid, c->cudev);
  std::memcpy(me.uuid, uuid.bytes, 16);
  me.arena_base = c->arena.base();
  me.arena_size = c->arena.size();

  std::vector<RankInfo> all(static_cast<size_t>(nranks));
  if (nranks == 1) {
    all[0] = me;
  } else {
    auto blobs = c->boot->allgather(std::string(reinterpret_cast<const char*>(&me), sizeof me));
    for (int r = 0; r < nranks; ++r) {
      if (blobs[size_t(r)].size() != sizeof(RankInfo))
        fail(mkInternalError, "rank " + std::to_string(r) + " runs a different mKernel version");
      std::memcpy(&all[size_t(r)], blobs[size_t(r)].data(), sizeof(RankInfo));
    }
  }
  for (int r = 0; r < nranks; ++r) {
    const RankInfo& p = all[size_t(r)];
    if (std::strncmp(p.host, me.host, sizeof me.host) != 0 || std::strncmp(p.boot_id, me.boot_id, sizeof me.boot_id) != 0)
      fail(mkInvalidUsage, fmt::format("rank {} runs on host '{}' and rank {} on '{}': communicators spanning nodes "
                                       "need the network transport, which this build does not include yet",
                                       rank, me.host, r, p.host));
    if (p.arena_size != me.arena_size)
      fail(mkInvalidUsage, fmt::format("ranks disagree on the symmetric memory size ({} vs {} bytes): set "
                                       "MK_SCRATCH_BYTES and MK_FLAG_BYTES alike on every rank",
                                       me.arena_size, p.arena_size));
  }
  // Peers in this process reach our arena through its own address: grant
  // their devices access. Peers in other processes import our handle.
  c->peer_base.assign(size_t(nranks), 0);
  std::vector<CUdevice> local_devices;
  int remote = 0;
  for (int r = 0; r < nranks; ++r) {
    const RankInfo& p = all[size_t(r)];
    if (p.token == me.token) {
      c->peer_base[size_t(r)] = p.arena_base;
      if (p.device != me.device) {
        check_peer_access(c->cudev, CUdevice(p.device));
        local_devices.push_back(CUdevice(p.device));
      }
    } else {
      ++remote;
    }
  }
  {
    CtxGuard g(c->ctx);
    c->arena.grant(local_devices);
  }
  if (remote > 0) {
    const std::string prefix = "mkernel-" + nonce_hex(c->boot->id()) + "-";
    int fd = c->arena.export_fd();
    FdServer server(prefix + std::to_string(rank), fd, remote, bootstrap_timeout_ms());
    CtxGuard g(c->ctx);
    for (int r = 0; r < nranks; ++r) {
      if (all[size_t(r)].token == me.token) continue;
      int peer_fd = fetch_fd(prefix + std::to_string(r), bootstrap_timeout_ms());
      auto m = std::make_unique<PeerMapping>();
      m->map(peer_fd, all[size_t(r)].arena_size, c->cudev);
      c->peer_base[size_t(r)] = m->base();
      c->mappings.push_back(std::move(m));
    }
    server.wait();
    ::close(fd);
  }
  if (c->boot) c->boot->barrier();  // every grant and mapping done before any kernel runs
  debug_log(fmt::format("rank {}/{} on GPU {} (sm_{}), {} peer(s) in other processes", rank, nranks, c->device,
                        c->arch, remote));
  return c.release();
}

std::vector<Comm*> comm_init_all(int ndev, const int* devlist) {
  if (ndev < 1) fail(mkInvalidArgument, fmt::format("ndev must be >= 1, got {}", ndev));
  const Driver& d = cu();
  (void)d;
  std::vector<std::unique_ptr<Comm>> comms;
  for (int r = 0; r < ndev; ++r) {
    auto c = std::make_unique<Comm>();
    c->nranks = ndev;
    c->rank = r;
    c->config = comm_config_from_env();
    setup_device(*c, devlist ? devlist[r] : r);
    setup_memory(*c);
    comms.push_back(std::move(c));
  }
  std::vector<CUdevice> devices;
  for (auto& c : comms) devices.push_back(c->cudev);
  for (auto& a : comms)
    for (auto& b : comms) check_peer_access(a->cudev, b->cudev);
  for (auto& c : comms) {
    CtxGuard g(c->ctx);
    c->arena.grant(devices);
  }
  std::vector<Comm*> out;
  auto clique = std::make_shared<Clique>();
  for (auto& c : comms) clique->members.push_back(c.get());
  for (auto& c : comms) {
    c->clique = clique;
    c->peer_base.resize(size_t(ndev));
    for (int r = 0; r < ndev; ++r) c->peer_base[size_t(r)] = comms[size_t(r)]->arena.base();
  }
  for (auto& c : comms) out.push_back(c.release());
  return out;
}

// ---- plan instances ---------------------------------------------------------

PlanInstance* Comm::find(Collective coll, DType dtype, RedOp op, int64_t bytes, bool zc) {
  for (const Range& r : fast[zc][(size_t(coll) * 12 + size_t(dtype)) * 5 + size_t(op)])
    if (bytes >= r.lo && (r.hi < 0 || bytes <= r.hi)) return r.inst;
  return nullptr;
}

PlanInstance& Comm::instance(Collective coll, DType dtype, RedOp op, int64_t bytes, bool zc, CUstream stream) {
  if (PlanInstance* p = find(coll, dtype, op, bytes, zc)) return *p;
  int64_t lo = 0, hi = -1;
  PlanInstance& inst = create_instance(coll, dtype, op, bytes, zc, stream, &lo, &hi);
  fast[zc][(size_t(coll) * 12 + size_t(dtype)) * 5 + size_t(op)].push_back({lo, hi, &inst});
  return inst;
}

PlanInstance& Comm::create_instance(Collective coll, DType dtype, RedOp op, int64_t bytes, bool zc, CUstream stream,
                                    int64_t* lo, int64_t* hi) {
  const Choice choice = choose_schedule(coll, nranks, bytes);
  const std::string& schedule = choice.schedule;
  auto plan = get_plan(schedule, coll, nranks, dtype, op, arch, zc);
  const plan::Kernel* k = plan::select(*plan, bytes);
  if (!k)
    fail(mkInternalError, fmt::format("plan {} has no kernel for {} bytes", plan->schedule, bytes));
  *lo = std::max(choice.lo, k->min_bytes);
  *hi = choice.hi < 0 ? k->max_bytes : (k->max_bytes < 0 ? choice.hi : std::min(choice.hi, k->max_bytes));
  // One instance per (plan, kernel): hash of the identifying strings.
  std::hash<std::string> h;
  const uint64_t key = h(plan->schedule + "|" + std::string(name(dtype)) + "|" + std::string(name(op)) + "|" +
                         std::to_string(plan->nranks) + "|" + k->name + (plan->zero_copy ? "|zc" : ""));
  if (auto it = instances.find(key); it != instances.end()) return *it->second;

  const Driver& d = cu();
  CtxGuard g(ctx);
  auto inst = std::make_unique<PlanInstance>();
  inst->plan = plan;
  inst->kernel = k;
  inst->rooted = coll == Collective::broadcast || coll == Collective::reduce;
  MK_CU(d.cuModuleLoadData(&inst->module, k->cubin.data()), "loading the kernel of plan " + plan->schedule);
  MK_CU(d.cuModuleGetFunction(&inst->fn, inst->module, k->name.c_str()), "finding kernel " + k->name);
  // With lazy module loading (the CUDA 12+ default) the first launch would
  // load the code, which may wait for running kernels: ours wait for peers,
  // so load now, before any kernel of this call is launched.
  if (d.cuFuncLoad) MK_CU(d.cuFuncLoad(inst->fn), "loading kernel " + k->name);
  int per_sm = 0;
  d.cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, inst->fn, k->threads, 0);
  if (int64_t(per_sm) * sms < k->grid)
    fail(mkInvalidUsage, fmt::format("kernel {} needs {} co-resident blocks of {} threads, but GPU {} holds {}",
                                     k->name, k->grid, k->threads, device, per_sm * sms));
  inst->res = &resources_for(*plan, *k, stream);
  debug_log(fmt::format("rank {}: plan {} kernel {} ready (grid {}x{}, scratch {} B at +{}, flags at +{})", rank,
                        plan->schedule, k->name, k->grid, k->threads, k->scratch_bytes, inst->res->scratch_offset,
                        inst->res->flag_offset));
  PlanInstance* raw = inst.get();
  owned.push_back(std::move(inst));
  instances[key] = raw;
  return *raw;
}

Resources& Comm::resources_for(const plan::Plan& p, const plan::Kernel& k, CUstream stream) {
  // Everything that shapes the flag protocol and the scratch layout.
  // (The compiler version too: another one may place synchronisation elsewhere.)
  const std::string key = plan::resource_key(p, k);
  for (auto& r : resources)
    if (r->key == key) return *r;
  const Driver& d = cu();
  auto res = std::make_unique<Resources>();
  res->key = key;
  res->grid = k.grid;
  // Regions, allocated in call order: identical on every rank because every
  // rank makes the same calls in the same order (as NCCL requires).
  const int64_t align = 256;
  res->flag_offset = (flags_used + align - 1) / align * align;
  res->scratch_offset = (scratch_used + align - 1) / align * align;
  if (res->flag_offset + k.flag_bytes > config.flag_bytes)
    fail(mkSystemError, fmt::format("flag memory exhausted ({} bytes); raise MK_FLAG_BYTES", config.flag_bytes));
  if (res->scratch_offset + k.scratch_bytes > config.scratch_bytes)
    fail(mkSystemError, fmt::format("symmetric scratch exhausted: plan {} needs {} more bytes, {} of {} are in use; "
                                    "raise MK_SCRATCH_BYTES (on every rank)",
                                    k.name, k.scratch_bytes, scratch_used, config.scratch_bytes));
  std::vector<CUdeviceptr> sp(static_cast<size_t>(nranks)), fp(static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; ++r) {
    fp[size_t(r)] = peer_base[size_t(r)] + CUdeviceptr(res->flag_offset);
    sp[size_t(r)] = peer_base[size_t(r)] + CUdeviceptr(config.flag_bytes + res->scratch_offset);
  }
  Resources* raw = res.get();
  resources.push_back(std::move(res));  // owned from here on: freed on any failure below
  MK_CU(d.cuMemAlloc(&raw->scratch_ptrs, sizeof(CUdeviceptr) * size_t(nranks)), "allocating a plan table");
  MK_CU(d.cuMemAlloc(&raw->flag_ptrs, sizeof(CUdeviceptr) * size_t(nranks)), "allocating a plan table");
  MK_CU(d.cuMemAlloc(&raw->seq, sizeof(uint64_t) * size_t(k.grid)), "allocating step counters");
  // Initialised on the caller's stream, so the kernel that follows sees them
  // without any host synchronisation (which could wait for a peer's kernel
  // that this very thread has yet to launch). Pageable sources are staged
  // before the call returns, so the host vectors may go.
  MK_CU(d.cuMemcpyHtoDAsync(raw->scratch_ptrs, sp.data(), sizeof(CUdeviceptr) * size_t(nranks), stream),
        "copying a plan table");
  MK_CU(d.cuMemcpyHtoDAsync(raw->flag_ptrs, fp.data(), sizeof(CUdeviceptr) * size_t(nranks), stream),
        "copying a plan table");
  MK_CU(d.cuMemsetD8Async(raw->seq, 0, sizeof(uint64_t) * size_t(k.grid), stream), "zeroing step counters");
  void* host = nullptr;
  MK_CU(d.cuMemHostAlloc(&host, sizeof(dev::ErrorRecord) * size_t(k.grid),
                         CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE),
        "allocating error records");
  std::memset(host, 0, sizeof(dev::ErrorRecord) * size_t(k.grid));
  raw->errors = static_cast<dev::ErrorRecord*>(host);
  MK_CU(d.cuMemHostGetDevicePointer(&raw->errors_dev, host, 0), "mapping error records");
  flags_used = raw->flag_offset + k.flag_bytes;
  scratch_used = raw->scratch_offset + k.scratch_bytes;
  return *raw;
}

dev::Args Comm::args(const PlanInstance& inst, const void* input, void* output, int64_t count, int32_t root,
                     int32_t elem_size, const ZcCall& zc) const {
  const plan::Kernel& k = *inst.kernel;
  dev::Args a{};
  a.input = input;
  a.output = output;
  a.count = count;
  a.tile_bytes = dev::pick_tile_bytes(count, inst.plan->chunks, k.instances, elem_size, k.max_tile_bytes);
  a.rank = rank;
  a.root = inst.rooted ? root : 0;
  a.scratch = reinterpret_cast<char* const*>(inst.res->scratch_ptrs);
  a.flags = reinterpret_cast<uint64_t* const*>(inst.res->flag_ptrs);
  a.seq = reinterpret_cast<uint64_t*>(inst.res->seq);
  a.errors = reinterpret_cast<dev::ErrorRecord*>(inst.res->errors_dev);
  a.host_abort = reinterpret_cast<const volatile int32_t*>(host_abort_dev);
  a.timeout_ns = config.timeout_ns;
  if (inst.plan->zero_copy) {
    a.windows = reinterpret_cast<const dev::ZcPeerWindow*>(windows);
    a.max_windows = config.max_windows;
    a.in_window = zc.in_window;
    a.out_window = zc.out_window;
    a.in_offset = zc.in_offset;
    a.out_offset = zc.out_offset;
    a.in_bytes = zc.in_bytes;
    a.out_bytes = zc.out_bytes;
    a.call_sig = zc.call_sig;
  }
  return a;
}

mkResult_t Comm::poll_async_error() {
  if (async_error.load() != mkSuccess) return mkResult_t(async_error.load());
  std::lock_guard<std::mutex> lock(mu);
  const dev::ErrorRecord* found = nullptr;
  const PlanInstance* where = nullptr;
  for (auto& res : resources)
    for (int b = 0; b < res->grid; ++b) {
      const volatile dev::ErrorRecord& e = res->errors[b];
      int32_t code = e.code;
      if (code == 0) continue;
      if (!found || (found->code == dev::kErrStopped && code != dev::kErrStopped)) {
        found = const_cast<const dev::ErrorRecord*>(&res->errors[b]);
        where = res->last;
      }
    }
  if (!found) return mkSuccess;
  const dev::ErrorRecord& e = *found;
  std::string what;
  const std::string who = fmt::format("thread block {} (instance {})", e.tb, e.instance);
  const char* zc_rule =
      "; with registered buffers every rank must pass registered buffers to the same call (or none), as with NCCL";
  if (e.code == dev::kErrWaitTimeout && e.slot == -1)
    what = fmt::format("{} waited {:.0f} ms at kernel entry for rank {} to announce its buffers (zero-copy){}", who,
                       double(e.waited_ns) / 1e6, e.peer, zc_rule);
  else if (e.code == dev::kErrWaitTimeout && e.slot == -2)
    what = fmt::format("{} waited {:.0f} ms at kernel exit for rank {} to finish with this rank's buffers (zero-copy)",
                       who, double(e.waited_ns) / 1e6, e.peer);
  else if (e.code == dev::kErrWaitTimeout)
    what = fmt::format("{} waited {:.0f} ms at step {} for flag slot {} from rank {} (have {}, want {})", who,
                       double(e.waited_ns) / 1e6, e.step, e.slot, e.peer, e.have, e.want);
  else if (e.code == dev::kErrLLTimeout)
    what = fmt::format("{} waited {:.0f} ms at step {} for data in LL scratch (source {})", who,
                       double(e.waited_ns) / 1e6, e.step, e.slot);
  else if (e.code == dev::kErrZcMismatch && e.slot == dev::kZcCall)
    what = fmt::format("rank {} made a different call (collective {}, dtype {}, op {}, root {}) than this rank "
                       "(collective {}, dtype {}, op {}, root {}) (zero-copy); nothing was touched",
                       e.peer, e.have & 0xff, (e.have >> 8) & 0xff, (e.have >> 16) & 0xff, e.have >> 32,
                       e.want & 0xff, (e.want >> 8) & 0xff, (e.want >> 16) & 0xff, e.want >> 32);
  else if (e.code == dev::kErrZcMismatch && e.slot == dev::kZcCount)
    what = fmt::format("rank {} called with count {}, this rank with {} (zero-copy); every rank must pass the same "
                       "count",
                       e.peer, e.have, e.want);
  else if (e.code == dev::kErrZcMismatch && e.slot == dev::kZcWindow)
    what = fmt::format("rank {} named registered buffer #{}, which this rank has not mapped{}", e.peer, e.have,
                       zc_rule);
  else if (e.code == dev::kErrZcMismatch)
    what = fmt::format("rank {}'s buffer ends {} bytes into its registered buffer of {} bytes (beyond its end); "
                       "this rank did not touch it",
                       e.peer, e.have, e.want);
  else
    what = fmt::format("{} stopped at step {} because another rank or the host aborted", who, e.step);
  async_message = fmt::format(
      "rank {}: collective {} ({}) did not complete: {}. A peer process may have died or stalled "
      "(watchdog: MK_TIMEOUT_MS). The communicator is unusable; call mkCommAbort.",
      rank, where ? where->plan->schedule : "?", where ? where->kernel->name : "?", what);
  const mkResult_t code = e.code == dev::kErrZcMismatch ? mkInvalidUsage : mkRemoteError;
  async_error.store(code);
  return code;
}

void Comm::release_instances() {
  const Driver& d = cu();
  for (auto& inst : owned)
    if (inst->module) d.cuModuleUnload(inst->module);
  for (auto& res : resources) {
    if (res->scratch_ptrs) d.cuMemFree(res->scratch_ptrs);
    if (res->flag_ptrs) d.cuMemFree(res->flag_ptrs);
    if (res->seq) d.cuMemFree(res->seq);
    if (res->errors) d.cuMemFreeHost(res->errors);
  }
  owned.clear();
  resources.clear();
  instances.clear();
}

Comm::~Comm() {
  magic = 0;
  try {
    CtxGuard g(ctx);
    release_registrations(*this);
    release_instances();
    if (windows) cu().cuMemFree(windows);
    if (side_stream) cu().cuStreamDestroy(side_stream);
    if (host_abort) cu().cuMemFreeHost(const_cast<int32_t*>(host_abort));
    if (order_event) cu().cuEventDestroy(order_event);
    mappings.clear();
    arena.release();
  } catch (...) {
  }
  // arena released by its destructor; then the context reference.
  if (ctx) {
    try {
      cu().cuDevicePrimaryCtxRelease(cudev);
    } catch (...) {
    }
  }
}

}  // namespace mk::rt
