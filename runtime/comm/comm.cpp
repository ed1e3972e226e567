#include "runtime/comm/comm.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include "compiler/codegen/codegen.hpp"
#include "compiler/jit/jit.hpp"
#include "mk/dsl.hpp"
#include "mk/fusion.hpp"
#include "runtime/driver/cuda_driver.hpp"
#include "runtime/comm/env.hpp"
#include "runtime/plans/schedules.hpp"
#include "runtime/plans/select.hpp"
#include "runtime/api/status.hpp"
#include "templates/net.cuh"
#include "templates/layout.cuh"

namespace mk::rt {

namespace {

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

// This rank's symmetric memory (a new arena, or the part of the parent's a
// splitShare child uses) and its host-side objects.
void setup_memory(Comm& c, const ParentMemory* shared) {
  const Driver& d = cu();
  CtxGuard g(c.ctx);
  if (shared) {
    c.arena = shared->arena;
    c.plans.flag_base = shared->region.flag_lo;
    c.plans.flag_end = shared->region.flag_hi;
    c.plans.scratch_base = shared->region.scratch_lo;
    c.plans.scratch_end = shared->region.scratch_hi;
  } else {
    c.arena->allocate(c.cudev, size_t(c.config.flag_bytes + c.config.scratch_bytes), size_t(c.config.flag_bytes));
    publish_arena(c.arena);
    c.plans.flag_base = 0;
    c.plans.flag_end = c.config.flag_bytes;
    c.plans.scratch_base = c.config.flag_bytes;
    c.plans.scratch_end = c.config.flag_bytes + c.config.scratch_bytes;
  }
  MK_CU(d.cuEventCreate(&c.done_event, CU_EVENT_DISABLE_TIMING), "creating an event");
  void* host = nullptr;
  MK_CU(d.cuMemHostAlloc(&host, sizeof(HostFlags), CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE),
        "allocating the host flags");
  std::memset(host, 0, sizeof(HostFlags));
  c.host = static_cast<HostFlags*>(host);
  c.host->one = 1;
  MK_CU(d.cuMemHostGetDevicePointer(&c.host_dev, host, 0), "mapping the host flags");
  const size_t table = sizeof(dev::ZcPeerWindow) * size_t(c.config.max_windows) * size_t(c.nranks);
  MK_CU(d.cuMemAlloc(&c.regs.windows, table), "allocating the registration table");
  MK_CU(d.cuMemsetD8(c.regs.windows, 0, table), "clearing the registration table");
  MK_CU(d.cuStreamCreate(&c.side_stream, CU_STREAM_NON_BLOCKING), "creating a stream");
}

// The boot id of a rank whose node is named by MK_HOST_ID.
constexpr const char* kHostIdBoot = "MK_HOST_ID";

RankInfo local_info(Comm& c) {
  RankInfo me{};
  if (!c.node_name) {  // a communicator made from the environment (children inherit theirs)
    try {
      c.node_name = env::host_id(c.rank, c.nranks);
    } catch (const RtError&) {
      // a bad MK_HOST_ID fails init on every rank (settings_of, in the exchange of settings)
    }
  }
  const std::optional<std::string>& id = c.node_name;
  if (id) {
    std::strncpy(me.host, id->c_str(), sizeof me.host - 1);
    std::strncpy(me.boot_id, kHostIdBoot, sizeof me.boot_id - 1);
  } else {
    char host[64] = {};
    ::gethostname(host, sizeof host - 1);
    std::memcpy(me.host, host, sizeof me.host);
    std::string boot = read_boot_id();
    std::strncpy(me.boot_id, boot.c_str(), sizeof me.boot_id - 1);
  }
  me.token = process_token();
  me.pid = ::getpid();
  me.device = c.device;
  me.arch = c.arch;
  CUuuid uuid{};
  cu().cuDeviceGetUuid(&uuid, c.cudev);
  std::memcpy(me.uuid, uuid.bytes, 16);
  fill_machine_info(me, c.cudev);
  me.arena_base = c.arena->base();
  me.arena_size = c.arena->size();
  return me;
}

// Checks what every rank must agree on; counts the ranks on this GPU and the
// nodes. Each peer gets the first transport that reaches it
// (choose_transports); a communicator with a rank none reaches (ranks on
// several nodes without MK_NET) fails init on every rank, or,
// with spanNodes = MK_SPAN_NODES_BOOTSTRAP, becomes bootstrap-only on every
// rank: decided from `all`, which every rank has alike, never from a
// rank-local fact. Returns the transport that reaches every peer (null when
// bootstrap-only): one per communicator in this build.
std::unique_ptr<Transport> check_peers(Comm& c, const std::vector<RankInfo>& all) {
  const RankInfo& me = all[size_t(c.rank)];
  c.colocated = 0;
  c.machine = machine_of(all);
  c.nodes = c.machine.nodes;
  if (debug_enabled() && c.rank == 0) debug_log(fmt::format("rank {}/{}: {}", c.rank, c.nranks, c.machine.describe()));
  for (int r = 0; r < c.nranks; ++r) {
    const RankInfo& p = all[size_t(r)];
    if (p.arena_size != me.arena_size)
      fail(mkInvalidUsage, fmt::format("ranks disagree on the symmetric memory size ({} vs {} bytes): set "
                                       "MK_SCRATCH_BYTES and MK_FLAG_BYTES alike on every rank",
                                       me.arena_size, p.arena_size));
    if (same_node(p, me) && std::memcmp(p.uuid, me.uuid, 16) == 0) ++c.colocated;
  }
  auto transports = make_transports();
  const Reach reach = choose_transports(transports, all, c.rank);
  if (reach.a < 0) {
    const int t = reach.by_peer[0];
    for (int r = 0; r < c.nranks; ++r)
      if (reach.by_peer[size_t(r)] != t)
        fail(mkInternalError, fmt::format("rank {} and rank 0 are reached by different transports; this build runs "
                                          "one transport per communicator",
                                          r));
    c.topo = c.machine.topology();
    return std::move(transports[size_t(t)]);
  }
  // The network (MK_NET, agreed by every rank): memory reaches the ranks of
  // this node, the proxy the others. Schedules number ranks node by node;
  // the permutation for other placements is not applied yet.
  if (!env::net_transport().empty()) {
    c.topo = c.machine.topology();  // unequal nodes: an error naming two of them
    if (!c.machine.node_major())
      fail(mkInvalidUsage, fmt::format("MK_NET={}: the ranks are not placed node by node (rank r on node r / {}), "
                                       "which plans across nodes need for now; launch ranks node-major (torchrun "
                                       "and Slurm's block distribution do)",
                                       env::net_transport(), c.machine.ranks_per_node()));
    c.spans_network = true;
    return std::move(transports[0]);  // p2p: the ranks of this node
  }
  const RankInfo& a = all[size_t(reach.a)];
  const RankInfo& b = all[size_t(reach.b)];
  const bool named = std::strncmp(a.boot_id, kHostIdBoot, sizeof a.boot_id) == 0 ||
                     std::strncmp(b.boot_id, kHostIdBoot, sizeof b.boot_id) == 0;
  if (c.config.span_nodes == MK_SPAN_NODES_BOOTSTRAP) {
    c.bootstrap_only = true;
    debug_log(fmt::format("rank {}/{}: the ranks sit on {} nodes and no transport of this build reaches rank {} "
                          "('{:.64}') from rank {} ('{:.64}'{}): bootstrap-only communicator (spanNodes), no "
                          "collectives on mKernel",
                          c.rank, c.nranks, c.nodes, reach.b, b.host, reach.a, a.host, named ? ", MK_HOST_ID" : ""));
    return nullptr;
  }
  fail(mkInvalidUsage, fmt::format("the ranks sit on {} nodes: rank {} runs on host '{:.64}' and rank {} on "
                                   "'{:.64}'{}, and memory (p2p) reaches one node: set MK_NET=socket (or verbs, or "
                                   "MK_NET_PLUGIN=...) alike on every rank for the network transport "
                                   "(docs/multi-node.md); without it the NCCL-compatible library and mkernel.torch "
                                   "hand such communicators to NCCL, and with the C API config spanNodes = "
                                   "MK_SPAN_NODES_BOOTSTRAP gives a bootstrap-only communicator",
                                   c.nodes, reach.a, a.host, reach.b, b.host, named ? " (MK_HOST_ID)" : ""));
}

// The settings of a communicator: its user schedules are loaded first
// (MK_SCHEDULES, then its config's list), so that MK_ALGO and MK_SELECT_FILE
// can name them, and proved for its rank count after. Throws RtError.
std::vector<std::pair<std::string, std::string>> settings_of(const CommConfig& cfg, int nranks,
                                                             bool node_inherited = false) {
  // a bad MK_HOST_ID (not agreed: it differs between nodes by design); a
  // list must name one node per rank unless the node comes from the parent
  if (node_inherited)
    (void)env::host_id();
  else
    (void)env::host_id(0, nranks);
  env_schedules();
  const std::string own = config_schedules(cfg.schedules);
  auto s = env::plan_shaping_settings();
  s.emplace_back("the communicator's schedules (config)", own);
  s.emplace_back("the communicator's spanNodes (config)", std::to_string(cfg.span_nodes));
  s.emplace_back("the user schedules it can run (name@IR hash)", prove_user_schedules(cfg.schedules, nranks));
  return s;
}

// Settings that shape plans or memory layout must be the same on every rank
// (settings_of): every rank sees every rank's values, so every rank fails
// alike, naming the setting and the ranks.
void agree_on_settings(Comm& c) {
  // A rank whose settings do not parse says so in the exchange (every rank
  // then fails with its message instead of waiting for it).
  std::vector<std::pair<std::string, std::string>> mine;
  std::string blob;
  try {
    mine = settings_of(c.config, c.nranks, c.node_name.has_value());
    for (const auto& [k, v] : mine) blob += k + '\n' + v + '\n';
  } catch (const std::exception& e) {
    blob = std::string("!") + e.what();
  }
  const auto all = c.boot->allgather(blob);
  for (int r = 0; r < c.nranks; ++r)
    if (!all[size_t(r)].empty() && all[size_t(r)][0] == '!')
      fail(r == c.rank ? mkInvalidArgument : mkInvalidUsage,
           fmt::format("rank {}: {}", r, all[size_t(r)].substr(1)));
  for (int r = 0; r < c.nranks; ++r) {
    if (all[size_t(r)] == blob) continue;
    // Name the first setting that differs.
    std::vector<std::string> lines;
    size_t at = 0;
    for (size_t nl; (nl = all[size_t(r)].find('\n', at)) != std::string::npos; at = nl + 1)
      lines.push_back(all[size_t(r)].substr(at, nl - at));
    for (size_t i = 0; i < mine.size(); ++i) {
      const std::string theirs = 2 * i + 1 < lines.size() ? lines[2 * i + 1] : "?";
      if (2 * i < lines.size() && lines[2 * i] == mine[i].first && theirs == mine[i].second) continue;
      const std::string shown_mine = mine[i].second.empty() ? "(unset)" : "'" + mine[i].second + "'";
      const std::string shown_theirs = theirs.empty() ? "(unset)" : "'" + theirs + "'";
      fail(mkInvalidUsage, fmt::format("ranks disagree on {}: rank {} has {}, rank {} has {}; settings that shape "
                                       "plans or memory must be the same on every rank",
                                       mine[i].first, std::min(c.rank, r), c.rank < r ? shown_mine : shown_theirs,
                                       std::max(c.rank, r), c.rank < r ? shown_theirs : shown_mine));
    }
    fail(mkInvalidUsage, fmt::format("rank {} runs a different mKernel version (its settings cannot be compared)", r));
  }
}

// The network transport and the proxy: every rank listens, learns every
// rank's handle through the bootstrap, and connects lazily when a plan
// needs a connection (Comm::new_resources).
void start_network(Comm& c) {
  const std::string kind = env::net_transport();
  std::string why_not_verbs;
  if (kind == "socket") {
    c.nets.push_back(net::make_socket_net(net::socket_options_from_env()));
  } else if (kind == "verbs") {
    c.nets.push_back(net::make_verbs_net(net::verbs_options_from_env()));
  } else if (kind == "auto") {
    // verbs where this host has an RDMA device (a connection uses it when
    // both ends do), the socket transport for every other connection
    try {
      c.nets.push_back(net::make_verbs_net(net::verbs_options_from_env()));
      if (c.nets.back()->devices() < 1) throw RtError(mkSystemError, "verbs transport: no device");
    } catch (const RtError& e) {
      if (e.code() != mkSystemError) throw;  // bad settings stay errors
      why_not_verbs = e.what();
      c.nets.clear();
      c.nets.push_back(nullptr);
    }
    c.nets.push_back(net::make_socket_net(net::socket_options_from_env()));
  } else {
    c.nets.push_back(net::load_nccl_plugin(*env::raw("MK_NET_PLUGIN")));
  }
  for (const auto& n : c.nets)
    if (n && n->devices() < 1) fail(mkSystemError, "MK_NET=" + kind + ": the transport has no device");
  ProxyConfig pc;
  pc.rank = c.rank;
  pc.nranks = c.nranks;
  pc.ctx = c.ctx;
  pc.arena = c.arena->base();
  pc.arena_bytes = c.arena->size();
  pc.flag_bytes = uint64_t(std::min<int64_t>(c.config.flag_bytes, int64_t(c.arena->size())));
  pc.entries = uint32_t(env::net_depth());
  pc.max_put_bytes = uint64_t(16) << 20;  // bounds a peer's puts (each connection announces its own largest)
  pc.timeout_ms = int64_t(c.config.timeout_ns / 1000000);
  pc.abort_word = &c.host->abort;
  // A failed connection aborts the communicator: this node's ranks learn it
  // through their abort words, the other nodes' as this rank's connections close.
  pc.on_failure = [comm = &c] { comm->stop_kernels(); };
  std::vector<net::Net*> nets;
  for (const auto& n : c.nets) nets.push_back(n.get());
  c.proxy = std::make_unique<Proxy>(nets, 0, pc);
  std::string names;
  for (const auto& n : c.nets) names += std::string(names.empty() ? "" : ", ") + (n ? n->name() : "(none)");
  debug_log(fmt::format("rank {}/{}: ranks on {} nodes: MK_NET={} ({}{}) for the ranks of other nodes, through the "
                        "network proxy",
                        c.rank, c.nranks, c.nodes, kind, names,
                        why_not_verbs.empty() ? "" : "; no verbs on this rank: " + why_not_verbs));
  if (!c.boot) return;  // ranks of one process (comm_init_all): it hands the handles round
  const auto& mine = c.proxy->handles();
  std::string blob;
  for (const net::Handle& h : mine) blob.append(reinterpret_cast<const char*>(h.bytes), net::kHandleBytes);
  const auto all = c.boot->allgather(blob);
  std::vector<std::vector<net::Handle>> handles(all.size(), std::vector<net::Handle>(mine.size()));
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].size() != blob.size()) fail(mkRemoteError, fmt::format("rank {} sent no network handle", r));
    for (size_t k = 0; k < mine.size(); ++k)
      std::memcpy(handles[r][k].bytes, all[r].data() + k * net::kHandleBytes, net::kHandleBytes);
  }
  c.proxy->set_peer_handles(std::move(handles));
}

void connect(Comm& c, const std::vector<RankInfo>& all, const ParentMemory* shared) {
  std::unique_ptr<Transport> transport = check_peers(c, all);
  if (c.bootstrap_only) {  // no transport: nothing runs on it but the bootstrap
    if (!shared) c.arena->release();  // its symmetric memory goes back now (nobody mapped it)
    return;
  }
  if (!c.config.net_name.empty() && c.config.net_name != "p2p")
    fail(mkInvalidArgument, fmt::format("config netName '{}' is not a transport of this build (p2p)", c.config.net_name));
  if (shared) {  // the parent's transport already reaches every peer of its node
    if (shared->peer_base.size() != size_t(c.nranks)) fail(mkInternalError, "splitShare: peer table of the wrong size");
    c.transport = shared->transport;
    c.peer_base = shared->peer_base;
    if (c.spans_network) start_network(c);
    return;
  }
  c.transport = std::move(transport);  // reaches every peer (check_peers)
  TransportSetup s;
  s.rank = c.rank;
  s.nranks = c.nranks;
  s.cudev = c.cudev;
  s.ctx = c.ctx;
  s.arena = c.arena;
  s.all = &all;
  s.boot = c.boot.get();
  s.timeout_ms = bootstrap_timeout_ms();
  c.transport->connect(s);
  c.peer_base.resize(size_t(c.nranks));
  for (int r = 0; r < c.nranks; ++r)  // 0: a rank on another node (the proxy reaches it)
    c.peer_base[size_t(r)] = c.transport->can_reach(all[size_t(c.rank)], all[size_t(r)]) ? c.transport->peer_base(r) : 0;
  if (c.spans_network) start_network(c);
}

}  // namespace

CommConfig comm_config_from_env() {
  CommConfig c;
  c.scratch_bytes = env::scratch_bytes();  // each strictly parsed and range-checked (env.hpp)
  c.flag_bytes = env::flag_bytes();
  c.timeout_ns = uint64_t(env::timeout_ms()) * 1000000ull;
  c.max_windows = env::max_registrations();
  return c;
}

void apply_user_config(CommConfig* c, const mkConfig_t* user) {
  if (!user) return;
  // Read only the bytes the caller's struct has (an older header may be shorter).
  if (user->size < offsetof(mkConfig_t, blocking) || user->size > (1u << 16))
    fail(mkInvalidArgument, fmt::format("config: size {} is not a mkConfig_t (initialise it with "
                                        "MK_CONFIG_INITIALIZER)",
                                        user->size));
  mkConfig_t u = MK_CONFIG_INITIALIZER;
  std::memcpy(&u, user, std::min(user->size, sizeof u));
  if (u.magic != MK_CONFIG_MAGIC)
    fail(mkInvalidArgument, fmt::format("config: magic {:#x} is wrong (initialise it with MK_CONFIG_INITIALIZER)",
                                        u.magic));
  if (u.version < 100 || u.version > 10000000u)
    fail(mkInvalidArgument, fmt::format("config: version {} is not a version code", u.version));
  auto field = [](int v, const char* name, int lo, int hi, int dflt) {
    if (v == MK_CONFIG_UNDEF_INT) return dflt;
    if (v < lo || v > hi) fail(mkInvalidArgument, fmt::format("config: {} = {} is outside {}..{}", name, v, lo, hi));
    return v;
  };
  c->blocking = field(u.blocking, "blocking", 0, 1, 1) == 1;
  c->cga_cluster_size = field(u.cgaClusterSize, "cgaClusterSize", 0, 8, 0);
  c->min_ctas = field(u.minCTAs, "minCTAs", 1, 65536, 1);
  c->max_ctas = field(u.maxCTAs, "maxCTAs", 1, 65536, 65536);
  if (c->min_ctas > c->max_ctas)
    fail(mkInvalidArgument, fmt::format("config: minCTAs {} > maxCTAs {}", c->min_ctas, c->max_ctas));
  c->split_share = field(u.splitShare, "splitShare", 0, 1, 0);
  // Fields NCCL defines that only need to be valid here.
  if (u.size >= offsetof(mkConfig_t, commName) + sizeof(const char*)) {
    field(u.trafficClass, "trafficClass", 0, 255, 0);
    if (u.commName) {  // read no further than the limit: the caller's string may be longer, or unterminated
      const size_t n = strnlen(u.commName, 129);
      if (n > 128) fail(mkInvalidArgument, "config: commName is longer than 128 characters; give at most 128");
      c->comm_name = std::string(u.commName, n);
    }
  }
  if (u.netName) {  // as commName: bounded read, refused (not cut) past the limit
    const size_t n = strnlen(u.netName, 65);
    if (n > 64) fail(mkInvalidArgument, "config: netName is longer than 64 characters (the transports are \"p2p\")");
    c->net_name = std::string(u.netName, n);
  }
  if (u.size >= offsetof(mkConfig_t, spanNodes) + sizeof(int))
    c->span_nodes = field(u.spanNodes, "spanNodes", MK_SPAN_NODES_FAIL, MK_SPAN_NODES_BOOTSTRAP, c->span_nodes);
  if (u.size >= offsetof(mkConfig_t, schedules) + sizeof(const char*) && u.schedules) {
    const size_t n = strnlen(u.schedules, 65537);
    if (n > 65536) fail(mkInvalidArgument, "config: schedules is longer than 65536 characters");
    c->schedules = std::string(u.schedules, n);
  }
}

int current_device() {
  const Driver& d = cu();
  CUcontext cur = nullptr;
  if (d.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur) {
    CUdevice dev = 0;
    MK_CU(d.cuCtxGetDevice(&dev), "cuCtxGetDevice");
    return int(dev);
  }
  return 0;
}

void comm_init_rank(Comm& c, int nranks, const mkUniqueId& id, int rank, int device, const ParentMemory* shared) {
  if (nranks < 1) fail(mkInvalidArgument, fmt::format("nranks must be >= 1, got {}", nranks));
  if (rank < 0 || rank >= nranks) fail(mkInvalidArgument, fmt::format("rank {} is outside 0..{}", rank, nranks - 1));
  c.nranks = nranks;
  c.rank = rank;
  setup_device(c, device);
  if (nranks > 1) {
    c.boot = std::make_unique<Bootstrap>(id, nranks, rank, &c.boot_cancel);
  }
  if (c.closing.load()) fail(mkInvalidUsage, "the communicator was aborted during init");
  setup_memory(c, shared);

  RankInfo me = local_info(c);
  std::vector<RankInfo> all(static_cast<size_t>(nranks));
  if (nranks == 1) {
    all[0] = me;
  } else {
    auto blobs = c.boot->allgather(std::string(reinterpret_cast<const char*>(&me), sizeof me));
    for (int r = 0; r < nranks; ++r) {
      if (blobs[size_t(r)].size() != sizeof(RankInfo))
        fail(mkInvalidUsage, "rank " + std::to_string(r) + " runs a different mKernel version");
      std::memcpy(&all[size_t(r)], blobs[size_t(r)].data(), sizeof(RankInfo));
    }
  }
  if (c.boot)
    agree_on_settings(c);
  else
    settings_of(c.config, c.nranks, c.node_name.has_value());  // loads and proves its schedules; nobody to compare with
  connect(c, all, shared);
  if (c.boot) c.boot->barrier();  // every grant and mapping done before any kernel runs
  if (!c.bootstrap_only)
    debug_log(fmt::format("rank {}/{} on GPU {} (sm_{}), {} peer(s) in other processes, {} rank(s) on this GPU",
                          rank, nranks, c.device, c.arch, c.transport->remote_peers(), c.colocated));
}

void comm_init_all(const std::vector<std::shared_ptr<Comm>>& comms, const std::vector<int>& devices,
                   const std::vector<ParentMemory>* shared) {
  const int n = int(comms.size());
  // One process: the environment is the same for every rank, each rank's
  // config (a split's children) may not be.
  for (int r = 1; r < n; ++r)
    if (comms[size_t(r)]->config.schedules != comms[0]->config.schedules)
      fail(mkInvalidUsage, fmt::format("ranks disagree on the communicator's schedules (config): rank 0 has '{}', rank "
                                       "{} has '{}'; every rank must give the same list",
                                       comms[0]->config.schedules, r, comms[size_t(r)]->config.schedules));
  if (n > 0) settings_of(comms[0]->config, n, comms[0]->node_name.has_value());
  for (int r = 0; r < n; ++r) {
    Comm& c = *comms[size_t(r)];
    c.nranks = n;
    c.rank = r;
    setup_device(c, devices[size_t(r)]);
    setup_memory(c, shared ? &(*shared)[size_t(r)] : nullptr);
  }
  std::vector<RankInfo> all;
  for (auto& c : comms) all.push_back(local_info(*c));
  for (int r = 0; r < n; ++r) connect(*comms[size_t(r)], all, shared ? &(*shared)[size_t(r)] : nullptr);
  if (n > 0 && comms[0]->spans_network) {  // ranks of one process on several nodes (MK_HOST_ID=a,b,...)
    std::vector<std::vector<net::Handle>> handles;
    for (auto& c : comms) handles.push_back(c->proxy->handles());
    for (auto& c : comms) c->proxy->set_peer_handles(handles);
  }
  auto clique = std::make_shared<Clique>();
  for (auto& c : comms) clique->members.push_back(c.get());
  for (auto& c : comms) {
    c->clique = clique;
    c->state.store(int(CommState::ready));
  }
}

std::vector<std::shared_ptr<Comm>> comm_init_all(int ndev, const int* devlist, const CommConfig& cfg) {
  if (ndev < 1) fail(mkInvalidArgument, fmt::format("ndev must be >= 1, got {}", ndev));
  std::vector<std::shared_ptr<Comm>> comms;
  std::vector<int> devices;
  for (int r = 0; r < ndev; ++r) {
    comms.push_back(std::make_shared<Comm>());
    comms.back()->config = cfg;
    devices.push_back(devlist ? devlist[r] : r);
  }
  comm_init_all(comms, devices, nullptr);
  return comms;
}

// ---- lifecycle and errors ---------------------------------------------------

void CommLife::set_error(mkResult_t code, const std::string& msg) {
  std::lock_guard<std::mutex> lock(err_mu);
  if (async_error.load() != mkSuccess) return;
  async_message_ = msg;
  async_error.store(code);
}

std::string CommLife::error_message() const {
  std::lock_guard<std::mutex> lock(err_mu);
  return async_message_;
}

void CommLife::set_last_error(const std::string& msg) {
  std::lock_guard<std::mutex> lock(err_mu);
  last_error_ = msg;
}

std::string CommLife::last_error() const {
  std::lock_guard<std::mutex> lock(err_mu);
  return last_error_;
}

void Comm::check_usable(const char* api) {
  const int s = state.load();
  if (s == int(CommState::initializing))
    fail(mkInvalidUsage, fmt::format("{}: the communicator is still being initialised (nonblocking init): wait until "
                                     "mkCommGetAsyncError returns mkSuccess",
                                     api));
  if (aborted.load() || closing.load())
    fail(mkInvalidUsage, std::string(api) + ": the communicator was aborted or is being destroyed");
  if (async_error.load() == mkSuccess && host && host->error != 0) poll_async_error();
  if (const int e = async_error.load(); e != mkSuccess) fail(mkResult_t(e), std::string(api) + ": " + error_message());
  if (s == int(CommState::finalized))
    fail(mkInvalidUsage, std::string(api) + ": the communicator was finalized; only mkCommDestroy is allowed");
  if (splits_running.load() != 0)
    fail(mkInvalidUsage, fmt::format("{}: a nonblocking mkCommSplit of this communicator is still running: wait until "
                                     "mkCommGetAsyncError of this communicator returns mkSuccess",
                                     api));
}

void Comm::check_serves(const char* api) {
  check_usable(api);
  if (bootstrap_only)
    fail(mkInvalidUsage, fmt::format("{}: the communicator spans {} nodes and is bootstrap-only (config spanNodes): "
                                     "it runs nothing on mKernel (with MK_NET set alike on every rank it would be a full "
                                     "communicator)",
                                     api, nodes));
}

mkResult_t Comm::poll_async_error() {
  if (const int e = async_error.load(); e != mkSuccess) return mkResult_t(e);
  if (state.load() == int(CommState::initializing)) return mkInProgress;
  if (splits_running.load() != 0) return mkInProgress;
  dev::ErrorRecord found{};
  const PlanInstance* where = nullptr;
  {
    std::lock_guard<std::mutex> lock(plans.res_mu);
    for (auto& res : plans.resources)
      for (int b = 0; b < res->grid; ++b) {
        const volatile dev::ErrorRecord& e = res->errors[b];
        const int32_t code = e.code;
        if (code == 0) continue;
        if (found.code == 0 || (found.code == dev::kErrStopped && code != dev::kErrStopped)) {
          std::atomic_thread_fence(std::memory_order_acquire);  // the fields were written before the code
          std::memcpy(&found, const_cast<const dev::ErrorRecord*>(&res->errors[b]), sizeof found);
          found.code = code;
          where = res->last.load();
        }
      }
  }
  // The proxy's failure names the peer and what broke: it comes first
  // (the kernels' records then only say that they were stopped).
  if (proxy) {
    if (const std::string pe = proxy->error(); !pe.empty()) {
      set_error(mkRemoteError, fmt::format("{}. The communicator is unusable; call mkCommAbort.", pe));
      return mkResult_t(async_error.load());
    }
  }
  if (found.code == 0) return mkSuccess;
  const dev::ErrorRecord& e = found;
  std::string what;
  const std::string who = fmt::format("thread block {} (instance {})", e.tb, e.instance);
  const char* zc_rule =
      "; with registered buffers every rank must pass registered buffers to the same call (or none), as with NCCL";
  const bool ce = where && where->ce;
  if (ce && e.code == dev::kErrWaitTimeout)
    what = fmt::format("the copy-engine transfer's {} side waited {:.0f} ms at tile {} for rank {} to {} (have {}, "
                       "want {})",
                       e.instance == 0 ? "send" : "receive", double(e.waited_ns) / 1e6, e.step, e.peer,
                       e.instance == 0 ? "copy out an earlier tile" : "deliver the tile", e.have, e.want);
  else if (ce && e.slot == dev::kStoppedAtEntry)
    what = "the copy-engine transfer did not start: the communicator had already been aborted (by this rank, a peer, "
           "or a failed collective elsewhere)";
  else if (ce)
    what = fmt::format("the copy-engine transfer stopped at tile {} because another rank or the host aborted", e.step);
  else if (e.code == dev::kErrWaitTimeout && e.slot == -1)
    what = fmt::format("{} waited {:.0f} ms at kernel entry for rank {} to announce its buffers (zero-copy){}", who,
                       double(e.waited_ns) / 1e6, e.peer, zc_rule);
  else if (e.code == dev::kErrWaitTimeout && e.slot == -2)
    what = fmt::format("{} waited {:.0f} ms at kernel exit for rank {} to finish with this rank's buffers (zero-copy)",
                       who, double(e.waited_ns) / 1e6, e.peer);
  else if (e.code == dev::kErrWaitTimeout && e.slot == dev::kChainBarrierSlot)
    what = fmt::format("{} waited {:.0f} ms in a group kernel for this rank's other thread blocks to finish the "
                       "previous collective on them ({} of {} arrived)",
                       who, double(e.waited_ns) / 1e6, e.have, e.want);
  else if (e.code == dev::kErrWaitTimeout && e.slot == dev::kTailBarrierSlot)
    what = fmt::format("{} waited {:.0f} ms before the fused epilogue for this rank's other thread blocks to finish "
                       "the collective ({} of {} arrived)",
                       who, double(e.waited_ns) / 1e6, e.have, e.want);
  else if (e.code == dev::kErrWaitTimeout)
    what = fmt::format("{} waited {:.0f} ms at step {} for flag slot {} from rank {} (have {}, want {})", who,
                       double(e.waited_ns) / 1e6, e.step, e.slot, e.peer, e.have, e.want);
  else if (e.code == dev::kErrLLTimeout)
    what = fmt::format("{} waited {:.0f} ms at step {} for packets in scratch (source {}, LL or Lamport)", who,
                       double(e.waited_ns) / 1e6, e.step, e.slot);
  else if (e.code == dev::kErrWaitTimeout && e.slot == dev::kNetFifoSlot)
    what = fmt::format("{} waited {:.0f} ms at step {} for the network proxy to take a put or signal to rank {} "
                       "(entries done {}, wanted {})",
                       who, double(e.waited_ns) / 1e6, e.step, e.peer, e.have, e.want);
  else if (e.code == dev::kErrNoConn)
    what = fmt::format("{} has no network connection to rank {} (a plan and its connection tables disagree)", who,
                       e.peer);
  else if (e.code == dev::kErrOnePassSteps)
    what = fmt::format("{} is a one-pass kernel (one step per launch) but this call needs {} steps: the plan's size "
                       "range does not match its kernel (a damaged or edited plan?); nothing was touched",
                       who, e.have);
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
  else if (e.slot == dev::kStoppedAtEntry)
    what = fmt::format("{} did not start: the communicator had already been aborted (by this rank, a peer, or a "
                       "failed collective elsewhere)",
                       who);
  else
    what = fmt::format("{} stopped at step {} because another rank or the host aborted", who, e.step);
  // The op the block was at, as the generated source's comment names it
  // (with the DSL line), for the plan's representative rank.
  if (e.op >= 0 && where) {
    if (const std::string op = codegen::op_comment(where->kernel->source, e.op); !op.empty())
      what += fmt::format(", at op `{}` (as written for this rank's class)", op);
  }
  const std::string msg = fmt::format(
      "rank {}: collective {} ({}) did not complete: {}. A peer process may have died, stalled or aborted "
      "(watchdog: MK_TIMEOUT_MS). The communicator is unusable; call mkCommAbort.",
      rank, where ? where->plan->schedule : "?", where ? where->kernel->name : "?", what);
  set_error(e.code == dev::kErrZcMismatch || e.code == dev::kErrOnePassSteps ? mkInvalidUsage : mkRemoteError, msg);
  return mkResult_t(async_error.load());
}

void Comm::raise_abort() {
  boot_cancel.cancel();  // a call or init blocked in the bootstrap returns now
  stop_kernels();
}

void Comm::stop_kernels() {
  // While a nonblocking init runs, its thread owns the fields below (it
  // stops at its next check of `closing`).
  if (state.load() == int(CommState::initializing)) return;
  if (host) host->abort = 1;  // this rank's kernels, at their next bounded-wait check
  // Ranks on other nodes learn it when their proxies see the connections close.
  if (proxy) proxy->abort();
  if (!side_stream || peer_base.empty()) return;
  // The comm-wide abort word of every rank (in its arena's flag part):
  // peers' kernels stop too, and every later launch there stops at entry.
  // On the side stream: never behind user work, bounded.
  try {
    CtxGuard g(ctx);
    for (CUdeviceptr b : peer_base)
      if (b) cu().cuMemcpyHtoDAsync(b + CUdeviceptr(plans.flag_base), &host->one, sizeof(uint64_t), side_stream);
    const auto t0 = std::chrono::steady_clock::now();
    while (cu().cuStreamQuery(side_stream) == CUDA_ERROR_NOT_READY &&
           std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2))
      std::this_thread::sleep_for(std::chrono::microseconds(100));
  } catch (...) {
  }
}

bool Comm::wait_idle(int64_t bound_ms) {
  std::lock_guard<std::mutex> lock(mu);
  if (!used || !done_event) return true;
  const Driver& d = cu();
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    const CUresult r = d.cuEventQuery(done_event);
    if (r != CUDA_ERROR_NOT_READY) return true;  // done, or the context is gone
    if (bound_ms >= 0 && std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(bound_ms)) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

bool Comm::arena_shared() const { return plans.flag_base != 0; }

SharedRegion Comm::propose_shared_region() {
  std::lock_guard<std::mutex> lock(mu);
  // The upper half of what is free in each part, 256-byte aligned; the
  // parent keeps the lower half (and what it already uses).
  auto upper_half = [](int64_t used_end, int64_t end) {
    const int64_t lo = (used_end + (end - used_end) / 2 + 255) / 256 * 256;
    return std::min(lo, end);
  };
  SharedRegion r;
  r.flag_hi = plans.flag_end;
  r.flag_lo = upper_half(plans.flag_base + plans.flags_used, plans.flag_end);
  r.scratch_hi = plans.scratch_end;
  r.scratch_lo = upper_half(plans.scratch_base + plans.scratch_used, plans.scratch_end);
  return r;
}

void Comm::cede(const SharedRegion& r) {
  std::lock_guard<std::mutex> lock(mu);
  if (r.flag_hi != plans.flag_end || r.scratch_hi != plans.scratch_end ||
      r.flag_lo < plans.flag_base + plans.flags_used || r.scratch_lo < plans.scratch_base + plans.scratch_used)
    fail(mkInvalidUsage, "mkCommSplit (splitShare): the parent communicator allocated memory during the split; do "
                         "not use a communicator while it is being split");
  plans.flag_end = r.flag_lo;
  plans.scratch_end = r.scratch_lo;
}

// ---- plan instances ---------------------------------------------------------

namespace {
size_t fast_slot(Collective coll, DType dtype, RedOp op) {
  return (size_t(coll) * kNumDTypes + size_t(dtype)) * kNumRedOps + size_t(op);
}

// Unused capture mode for the calling thread during instance creation: the
// JIT, module loads and allocations are then allowed while a graph is being
// captured (what NCCL does on a first call inside capture).
class RelaxedCapture {
 public:
  RelaxedCapture() { cu().cuThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCapture() { cu().cuThreadExchangeStreamCaptureMode(&mode_); }

 private:
  CUstreamCaptureMode mode_ = CU_STREAM_CAPTURE_MODE_RELAXED;
};
}  // namespace

namespace {
// PlanCache::fused's key of a fused call or a stage that names its schedule.
std::string special_key(const std::string& fusion, size_t slot, const std::string& schedule) {
  return schedule.empty() ? fusion + "|" + std::to_string(slot) : fusion + "|" + std::to_string(slot) + "|" + schedule;
}
}  // namespace

PlanInstance* Comm::find(Collective coll, DType dtype, RedOp op, int64_t bytes, bool zc, const std::string& fusion,
                         const std::string& schedule) {
  const std::vector<PlanCache::Range>* ranges = &plans.fast[zc][fast_slot(coll, dtype, op)];
  if (!fusion.empty() || !schedule.empty()) {
    auto it = plans.fused.find(special_key(fusion, fast_slot(coll, dtype, op), schedule));
    if (it == plans.fused.end()) return nullptr;
    ranges = &it->second;
  }
  for (const PlanCache::Range& r : *ranges)
    if (bytes >= r.lo && (r.hi < 0 || bytes <= r.hi)) return r.inst;
  return nullptr;
}

PlanInstance& Comm::instance(Collective coll, DType dtype, RedOp op, int64_t bytes, bool zc, const std::string& fusion,
                             const std::string& schedule) {
  if (PlanInstance* p = find(coll, dtype, op, bytes, zc, fusion, schedule)) return *p;
  int64_t lo = 0, hi = -1;
  RelaxedCapture relaxed;
  CtxGuard g(ctx);
  PlanInstance& inst = create_instance(coll, dtype, op, bytes, zc, &lo, &hi, fusion, schedule);
  if (fusion.empty() && schedule.empty())
    plans.fast[zc][fast_slot(coll, dtype, op)].push_back({lo, hi, &inst});
  else
    plans.fused[special_key(fusion, fast_slot(coll, dtype, op), schedule)].push_back({lo, hi, &inst});
  return inst;
}

int32_t Comm::config_cap() const { return config.max_ctas > 0 && config.max_ctas < 65536 ? config.max_ctas : 0; }

int32_t Comm::grid_cap() const {
  int32_t cap = config_cap();
  // Ranks sharing a GPU wait for each other's blocks, so all of them must be
  // resident at once: without a smaller maxCTAs of its own, each rank gets
  // an equal share of the SMs (one block of up to 512 threads per SM;
  // create_instance still refuses a kernel that does not fit).
  if (colocated > 1 && sms > 0) {
    const int32_t share = std::max(1, sms / colocated);
    cap = cap > 0 ? std::min(cap, share) : share;
  }
  return cap;
}

PlanInstance& Comm::create_instance(Collective coll, DType dtype, RedOp op, int64_t bytes, bool zc, int64_t* lo,
                                    int64_t* hi, const std::string& fusion, const std::string& schedule) {
  if (topo.nranks() != nranks)
    fail(mkInternalError, fmt::format("the communicator's topology {} does not have its {} ranks", topo.name(), nranks));
  Choice choice = schedule.empty() ? choose_schedule(coll, topo, bytes, zc) : Choice{schedule, 0, -1, ""};
  const dsl::ScheduleInfo* info = dsl::find_schedule(choice.schedule);
  const int32_t max_grid = grid_cap();
  std::shared_ptr<const plan::Plan> plan;
  // A compile takes seconds; an abort meanwhile does not wait for it.
  const CompileScope compiling_now(*this);
  if (op == RedOp::premulsum || !fusion.empty()) {
    // Only a kernel that reads its own rank's input can scale it, and only
    // one whose rank's buffers nothing else touches can run a fused
    // epilogue in its tail: the copy engines cannot do either, and the
    // compiler refuses schedules whose kernels would not scale every input
    // once or see every output final (ScheduleRefused). Those calls take the
    // built-in table's schedule instead (staged, proved for both; above the
    // table's rank counts the ring, or reduce.direct), the same on every
    // rank.
    const char* what = fusion.empty() ? "PreMulSum" : "fused";
    auto builtin = [&](const std::string& why) {
      const SelectEntry* e = lookup(builtin_select(), coll, topo, bytes, false);
      Choice next = e ? Choice{e->schedule, e->min_bytes, e->max_bytes, e->tune}
                      : Choice{coll == Collective::reduce ? "reduce.direct" : std::string(name(coll)) + ".ring", 0,
                               -1, ""};
      if (next.schedule == choice.schedule) fail(mkInvalidUsage, why);
      debug_log(fmt::format("rank {}: {} {} of {} bytes: {}; using {}", rank, what, name(coll), bytes, why,
                            next.schedule));
      // the sizes both ranges hold: other sizes look again (their own choice may serve)
      next.lo = std::max(next.lo, choice.lo);
      next.hi = next.hi < 0 ? choice.hi : choice.hi < 0 ? next.hi : std::min(next.hi, choice.hi);
      choice = next;
    };
    auto& refused = fusion.empty() ? plans.premul_refused : plans.fusion_refused;
    const std::string refused_key = fmt::format("{}|{}|{}|{}", fusion, name(op), choice.schedule, choice.tune);
    if (info && info->copy_engine)
      builtin(choice.schedule + " moves data with copy engines, which run no " +
              (fusion.empty() ? std::string("prologue") : std::string("fusion code")));
    else if (auto it = refused.find(refused_key); it != refused.end())
      builtin(it->second);  // refused before: not lowered again
    try {
      plan = get_plan(choice.schedule, coll, topo, dtype, op, arch, zc, max_grid, rank, choice.tune, fusion);
    } catch (const ScheduleRefused& e) {
      refused.emplace(refused_key, e.what());
      builtin(e.what());
      plan = get_plan(choice.schedule, coll, topo, dtype, op, arch, zc, max_grid, rank, choice.tune, fusion);
    }
  } else {
    if (info && info->copy_engine) return create_ce_instance(coll, dtype, op, choice, lo, hi);
    plan = get_plan(choice.schedule, coll, topo, dtype, op, arch, zc, max_grid, rank, choice.tune);
  }
  if (closing.load()) fail(mkInvalidUsage, "the communicator was destroyed or aborted while its plan was compiled");
  const plan::Kernel* k = plan::select(*plan, bytes);
  if (!k) fail(mkInternalError, fmt::format("plan {} has no kernel for {} bytes", plan->schedule, bytes));
  if (max_grid > 0 && k->grid > max_grid) {
    if (max_grid != config_cap())
      fail(mkInvalidUsage, fmt::format("kernel {} of plan {} uses {} thread blocks ({} per instance), more than this "
                                       "rank's share of the GPU's SMs ({}: {} rank(s) of this communicator share GPU "
                                       "{}, and their kernels must all be resident at once); use fewer ranks per GPU",
                                       k->name, plan->schedule, k->grid, k->tbs, max_grid, colocated, device));
    fail(mkInvalidUsage, fmt::format("kernel {} of plan {} uses {} thread blocks ({} per instance), more than the "
                                     "config's maxCTAs {}; raise maxCTAs to at least {}{}",
                                     k->name, plan->schedule, k->grid, k->tbs, max_grid, k->tbs,
                                     k->instances > 1 ? " (a plan from MK_PLAN_DIR: recompile it with fewer instances)"
                                                      : ""));
  }
  *lo = std::max(choice.lo, k->min_bytes);
  *hi = choice.hi < 0 ? k->max_bytes : (k->max_bytes < 0 ? choice.hi : std::min(choice.hi, k->max_bytes));
  // One instance per (plan, kernel): the entry's knobs make another plan of
  // the same schedule whose kernels have the same names.
  const std::string key = fmt::format("{}|{}|{}|{}|{}|{}|{}|{}", plan->schedule, name(plan->dtype), name(plan->op),
                                      plan->nranks, k->name, plan->zero_copy, choice.tune, plan->fusion);
  if (auto it = plans.instances.find(key); it != plans.instances.end()) return *it->second;

  const Driver& d = cu();
  auto inst = std::make_unique<PlanInstance>();  // unloads its module if anything below fails
  inst->plan = plan;
  inst->kernel = k;
  inst->rooted = collective_rooted(coll);
  MK_CU(d.cuModuleLoadData(&inst->module, k->cubin.data()), "loading the kernel of plan " + plan->schedule);
  MK_CU(d.cuModuleGetFunction(&inst->fn, inst->module, k->name.c_str()), "finding kernel " + k->name);
  // With lazy module loading (the CUDA 12+ default) the first launch would
  // load the code, which may wait for running kernels: ours wait for peers,
  // so load now, before any kernel of this call is launched.
  if (d.cuFuncLoad) MK_CU(d.cuFuncLoad(inst->fn), "loading kernel " + k->name);
  // A fusion with an epilogue: its kernel for calls of many rows (a fusion
  // that is a prologue only has none). Asked of the registry, not probed in
  // the module: a failed cuModuleGetFunction is an API error to
  // compute-sanitizer. Registry entries never change (a plugin's
  // re-registration is a new entry), and a plan serves only the version of
  // the fusion it was compiled from.
  const dsl::FusionInfo* fi =
      plan->fusion.empty() ? nullptr : dsl::find_fusion(plan->fusion.substr(0, plan->fusion.find('@')), plan->dtype);
  // The registration checked is the code compiled: a plugin that registered
  // the name again after the plan was made gets its own plan on the next call.
  if (fi && compiler::fusion_identity(*fi) != plan->fusion)
    fail(mkInvalidUsage, fmt::format("fusion {} was registered again while its plan was made ({} is now {}); call again",
                                     fi->name, plan->fusion, compiler::fusion_identity(*fi)));
  if (fi && !fi->source.empty()) {
    const std::string epi = k->name + "_epi";
    MK_CU(d.cuModuleGetFunction(&inst->fn_epi, inst->module, epi.c_str()), "finding the epilogue kernel " + epi);
    if (d.cuFuncLoad) MK_CU(d.cuFuncLoad(inst->fn_epi), "loading kernel " + epi);
  }
  // Every block of every kernel of the ranks sharing this GPU must be
  // resident at once (they wait for each other): check before launching.
  int per_sm = 0;
  MK_CU(d.cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, inst->fn, k->threads, 0), "querying occupancy");
  const int64_t capacity = int64_t(per_sm) * sms;
  if (int64_t(k->grid) * colocated > capacity)
    fail(mkInvalidUsage,
         fmt::format("kernel {} needs {} co-resident blocks of {} threads per rank and {} rank(s) of this "
                     "communicator share GPU {}, which holds {} such blocks: the kernels would wait for each other "
                     "forever. Use fewer ranks per GPU, or smaller grids (config maxCTAs, or "
                     "MK_TUNE=simple_instances=N,ll_instances=N)",
                     k->name, k->grid, k->threads, colocated, device, capacity));
  inst->res = &resources_for(*plan, *k);
  debug_log(fmt::format("rank {}: plan {} kernel {} ready (grid {}x{}, scratch {} B at +{}, flags at +{})", rank,
                        plan->schedule, k->name, k->grid, k->threads, k->scratch_bytes, inst->res->scratch_offset,
                        inst->res->flag_offset));
  PlanInstance* raw = inst.get();
  plans.owned.push_back(std::move(inst));
  plans.instances[key] = raw;
  return *raw;
}

Comm::Regions Comm::next_regions(int64_t flag_bytes, int64_t scratch_bytes) const {
  // Regions, allocated in call order: identical on every rank because every
  // rank makes the same calls in the same order (as NCCL requires).
  // Flag offsets count from the abort word (the flag part's base), scratch
  // offsets from the scratch part's base.
  const int64_t align = 256;
  Regions r;
  r.flag_offset = (plans.flags_used + align - 1) / align * align;
  r.scratch_offset = (plans.scratch_used + align - 1) / align * align;
  r.flag_bytes = flag_bytes;
  r.scratch_bytes = scratch_bytes;
  return r;
}

Comm::Regions Comm::place_regions(int64_t flag_bytes, int64_t scratch_bytes, const std::string& who,
                                  const std::string& detail, const std::string& remedy) const {
  const Regions r = next_regions(flag_bytes, scratch_bytes);
  const int64_t flag_size = plans.flag_end - plans.flag_base, scratch_size = plans.scratch_end - plans.scratch_base;
  const char* share_hint = arena_shared() ? " (this communicator shares its parent's memory: splitShare gave it part "
                                            "of the parent's free scratch; raise it there or split without splitShare)"
                                          : "";
  if (r.flag_offset + flag_bytes > flag_size)
    fail(mkSystemError, fmt::format("flag memory exhausted ({} bytes); raise MK_FLAG_BYTES (on every rank){}",
                                    flag_size, share_hint));
  if (r.scratch_offset + scratch_bytes > scratch_size)
    fail(mkSystemError, fmt::format("symmetric scratch exhausted: {} needs {} more bytes{}, {} of {} are in use; {} "
                                    "(on every rank){}",
                                    who, scratch_bytes, detail, plans.scratch_used, scratch_size, remedy, share_hint));
  return r;
}

void Comm::commit_regions(const Regions& r) {
  plans.flags_used = r.flag_offset + r.flag_bytes;
  plans.scratch_used = r.scratch_offset + r.scratch_bytes;
}

void Comm::alloc_error_records(Resources& res) {
  const Driver& d = cu();
  const size_t bytes = sizeof(dev::ErrorRecord) * size_t(res.grid);
  void* host_rec = nullptr;
  MK_CU(d.cuMemHostAlloc(&host_rec, bytes, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE),
        "allocating error records");
  std::memset(host_rec, 0, bytes);
  res.errors = static_cast<dev::ErrorRecord*>(host_rec);
  MK_CU(d.cuMemHostGetDevicePointer(&res.errors_dev, host_rec, 0), "mapping error records");
}

Resources* Comm::resource_copy(PlanInstance& inst, int copy) {
  MK_CHECK(copy > 0 && copy < kResourceCopies && inst.kernel && !inst.ce, "resource_copy: copy out of range");
  // Answered once per instance and copy (the key below costs a plan's
  // serialisation): a refusal stays, as the arena only fills, alike on
  // every rank.
  if (inst.copy_tried[copy]) return inst.copies[copy];
  inst.copies[copy] = make_resource_copy(inst, copy);
  inst.copy_tried[copy] = true;
  return inst.copies[copy];
}

Resources* Comm::make_resource_copy(const PlanInstance& inst, int copy) {
  const plan::Kernel& k = *inst.kernel;
  const std::string key = plan::resource_key(*inst.plan, k) + fmt::format("#copy{}", copy);
  if (Resources* made = find_resources(key)) return made;  // by another instance of one layout
  // Copies are a speed-up, plans are not optional: half of the arena stays
  // for plans of later calls.
  const Regions at = next_regions(k.flag_bytes, k.scratch_bytes);
  if (at.flag_offset + at.flag_bytes > (plans.flag_end - plans.flag_base) / 2 ||
      at.scratch_offset + at.scratch_bytes > (plans.scratch_end - plans.scratch_base) / 2)
    return nullptr;
  RelaxedCapture relaxed;  // as for a first use inside stream capture (instance)
  CtxGuard g(ctx);
  return &new_resources(key, k, collective_rooted(inst.plan->coll));
}

Resources* Comm::find_resources(const std::string& key) {
  std::lock_guard<std::mutex> lock(plans.res_mu);
  for (auto& r : plans.resources)
    if (r->key == key) return r.get();
  return nullptr;
}

Resources& Comm::resources_for(const plan::Plan& p, const plan::Kernel& k) {
  // Everything that shapes the flag protocol and the scratch layout.
  // (The compiler version too: another one may place synchronisation elsewhere.)
  const std::string key = plan::resource_key(p, k);
  if (Resources* r = find_resources(key)) return *r;
  return new_resources(key, k, collective_rooted(p.coll));
}

Resources& Comm::new_resources(const std::string& key, const plan::Kernel& k, bool rooted) {
  const Driver& d = cu();
  // Built completely before it is published: a failure part-way (a GPU full
  // because a framework's caching allocator holds it) frees what was taken
  // and leaves nothing behind, so a retry allocates again.
  auto res = std::make_unique<Resources>();
  res->key = key;
  res->grid = k.grid;
  const Regions at = place_regions(k.flag_bytes, k.scratch_bytes, "plan " + k.name, "", "raise MK_SCRATCH_BYTES");
  res->flag_offset = at.flag_offset;
  res->scratch_offset = at.scratch_offset;
  std::vector<CUdeviceptr> sp(static_cast<size_t>(nranks)), fp(static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; ++r) {
    fp[size_t(r)] = peer_at(r, plans.flag_base + res->flag_offset);
    sp[size_t(r)] = peer_at(r, plans.scratch_base + res->scratch_offset);
  }
  const std::vector<uint64_t> zeros(size_t(k.grid), 0);
  MK_CU(d.cuMemAlloc(&res->scratch_ptrs, sizeof(CUdeviceptr) * size_t(nranks)), "allocating a plan table");
  MK_CU(d.cuMemAlloc(&res->flag_ptrs, sizeof(CUdeviceptr) * size_t(nranks)), "allocating a plan table");
  MK_CU(d.cuMemAlloc(&res->seq, sizeof(uint64_t) * size_t(k.grid)), "allocating step counters");
  // Initialised by copies on the side stream, waited for here: nothing goes
  // on the caller's stream (which may be capturing a graph), and copies need
  // no SMs (a memset kernel could wait behind peers' spinning kernels).
  MK_CU(d.cuMemcpyHtoDAsync(res->scratch_ptrs, sp.data(), sizeof(CUdeviceptr) * size_t(nranks), side_stream),
        "copying a plan table");
  MK_CU(d.cuMemcpyHtoDAsync(res->flag_ptrs, fp.data(), sizeof(CUdeviceptr) * size_t(nranks), side_stream),
        "copying a plan table");
  MK_CU(d.cuMemcpyHtoDAsync(res->seq, zeros.data(), sizeof(uint64_t) * size_t(k.grid), side_stream),
        "zeroing step counters");
  MK_CU(d.cuStreamSynchronize(side_stream), "initialising plan tables");
  if (!k.net.empty()) make_net_table(*res, k, rooted);
  alloc_error_records(*res);
  commit_regions(at);
  Resources* raw = res.get();
  std::lock_guard<std::mutex> lock(plans.res_mu);
  plans.resources.push_back(std::move(res));
  return *raw;
}

void Comm::make_net_table(Resources& res, const plan::Kernel& k, bool rooted) {
  if (!proxy)
    fail(mkInvalidUsage, fmt::format("plan kernel {} moves data between nodes, but this communicator has no network "
                                     "transport (MK_NET)",
                                     k.name));
  const Driver& d = cu();
  const int64_t slots = int64_t(k.instances) * k.tbs * nranks;
  // This rank's connections by (block, actual peer). A rooted plan is built
  // for root 0 and runs relabelled (rank r plays r - root), so its table
  // holds what this rank needs under every root; one (block, peer) is one
  // connection whatever the root (launches on one resource set are ordered).
  std::map<std::pair<int32_t, int32_t>, bool> mine;  // (tb, peer) -> puts
  for (int32_t root = 0; root < (rooted ? nranks : 1); ++root)
    for (const plan::Kernel::NetConn& nc : k.net) {
      if ((nc.rank + root) % nranks != rank) continue;
      bool& puts = mine[{nc.tb, (nc.peer + root) % nranks}];
      puts = puts || nc.puts;
    }
  std::vector<dev::NetConnDev> views;
  std::vector<std::pair<int64_t, size_t>> where;  // table slot -> view index
  for (const auto& [at, puts] : mine)
    for (int32_t i = 0; i < k.instances; ++i) {
      const int32_t block = i * k.tbs + at.first;
      views.push_back(proxy->add_send(block, at.second, puts ? uint64_t(k.max_tile_bytes) : 0));
      where.emplace_back(int64_t(block) * nranks + at.second, views.size() - 1);
    }
  std::vector<char> table(dev::net_table_bytes(slots), 0);
  auto* t = reinterpret_cast<dev::NetTable*>(table.data());
  t->scratch_off = plans.scratch_base + res.scratch_offset;
  t->flag_off = plans.flag_base + res.flag_offset;
  if (!views.empty())
    MK_CU(d.cuMemAlloc(&res.net_conns, sizeof(dev::NetConnDev) * views.size()), "allocating network connections");
  for (const auto& [slot, v] : where)
    dev::net_conns(t)[slot] = reinterpret_cast<const dev::NetConnDev*>(res.net_conns + v * sizeof(dev::NetConnDev));
  MK_CU(d.cuMemAlloc(&res.net_table, table.size()), "allocating a network table");
  if (!views.empty())
    MK_CU(d.cuMemcpyHtoDAsync(res.net_conns, views.data(), sizeof(dev::NetConnDev) * views.size(), side_stream),
          "copying network connections");
  MK_CU(d.cuMemcpyHtoDAsync(res.net_table, table.data(), table.size(), side_stream), "copying a network table");
  MK_CU(d.cuStreamSynchronize(side_stream), "initialising network tables");
}

dev::Args Comm::args(const PlanInstance& inst, const void* input, void* output, int64_t count, int32_t root,
                     int32_t elem_size, const ZcCall& zc, const Resources* res) const {
  if (!res) res = inst.res;
  const plan::Kernel& k = *inst.kernel;
  dev::Args a{};
  a.input = input;
  a.output = output;
  a.count = count;
  a.tile_bytes = dev::pick_tile_bytes(count, inst.plan->chunks, k.instances, elem_size, k.max_tile_bytes);
  a.rank = rank;
  a.root = inst.rooted ? root : 0;
  a.scratch = reinterpret_cast<char* const*>(res->scratch_ptrs);
  a.flags = reinterpret_cast<uint64_t* const*>(res->flag_ptrs);
  a.seq = reinterpret_cast<uint64_t*>(res->seq);
  a.errors = reinterpret_cast<dev::ErrorRecord*>(res->errors_dev);
  a.host_abort = reinterpret_cast<volatile int32_t*>(host_dev);
  a.timeout_ns = config.timeout_ns;
  a.flag_offset = res->flag_offset;
  a.net = reinterpret_cast<const void*>(res->net_table);
  if (inst.plan->zero_copy) {
    a.windows = reinterpret_cast<const dev::ZcPeerWindow*>(regs.windows);
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

Resources::~Resources() {
  try {
    const Driver& d = cu();
    if (scratch_ptrs) d.cuMemFree(scratch_ptrs);
    if (flag_ptrs) d.cuMemFree(flag_ptrs);
    if (seq) d.cuMemFree(seq);
    if (net_table) d.cuMemFree(net_table);
    if (net_conns) d.cuMemFree(net_conns);
    if (errors) d.cuMemFreeHost(errors);
  } catch (...) {
  }
}

GroupKernel& Comm::group_kernel(const std::string& key, const std::vector<codegen::GroupMember>& members,
                                int32_t threads, int64_t grid) {
  std::unique_ptr<GroupKernel>& slot = plans.groups[key];
  if (slot) return *slot;
  auto g = std::make_unique<GroupKernel>();
  try {
    RelaxedCapture relaxed;
    CtxGuard guard(ctx);
    // named by its code (the cubin cache is keyed by the source anyway):
    // rendered once, then the kernel's declaration takes the name
    std::string src = codegen::group_source(members, threads, "mk_group");
    g->name = "mk_group_" + jit::hash_hex(src).substr(0, 16);
    const std::string decl = " mk_group(const __grid_constant__";
    const size_t at = src.find(decl);
    MK_CHECK(at != std::string::npos, "group_source: no kernel declaration");
    src.replace(at, decl.size(), " " + g->name + "(const __grid_constant__");
    const jit::CompileResult r = jit::compile(src, g->name, arch);
    const Driver& d = cu();
    MK_CU(d.cuModuleLoadData(&g->module, r.cubin.data()), "loading group kernel " + g->name);
    MK_CU(d.cuModuleGetFunction(&g->fn, g->module, g->name.c_str()), "finding group kernel " + g->name);
    if (d.cuFuncLoad) MK_CU(d.cuFuncLoad(g->fn), "loading group kernel " + g->name);
    int per_sm = 0;
    MK_CU(d.cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, g->fn, threads, 0), "querying occupancy");
    if (grid * colocated > int64_t(per_sm) * sms) {
      g->fn = nullptr;
      g->why = fmt::format("its {} blocks of {} threads per rank ({} rank(s) on this GPU) would not all be resident "
                           "at once ({} per SM x {} SMs)",
                           grid, threads, colocated, per_sm, sms);
    }
  } catch (const std::exception& e) {
    g->fn = nullptr;
    g->why = e.what();
  }
  if (g->fn)
    debug_log(fmt::format("rank {}: group kernel {} ready: {} calls, {} blocks of {} threads", rank, g->name,
                          members.size(), grid, threads));
  else
    debug_log(fmt::format("rank {}: a group of {} calls runs as one launch per call: {}", rank, members.size(), g->why));
  slot = std::move(g);
  return *slot;
}

GroupKernel::~GroupKernel() {
  try {
    if (module) cu().cuModuleUnload(module);
  } catch (...) {
  }
}

PlanInstance::~PlanInstance() {
  try {
    if (module) cu().cuModuleUnload(module);
  } catch (...) {
  }
}

void Comm::release() {
  CtxGuard g(ctx);
  // The proxy first (our kernels are done): what they committed goes out,
  // each connection ends with a goodbye (a peer's proxy then takes its close
  // as the end, not a failure), and its thread stops before the memory it
  // writes (host flags, arena) goes.
  if (proxy) {
    proxy->finish(2000);
    proxy.reset();
  }
  nets.clear();
  release_registrations(*this);
  plans.instances.clear();
  for (auto& f : plans.fast)
    for (auto& v : f) v.clear();
  plans.owned.clear();
  plans.groups.clear();
  ce_states.clear();
  {
    std::lock_guard<std::mutex> lock(plans.res_mu);
    plans.resources.clear();
  }
  const Driver& d = cu();
  if (ce_module) d.cuModuleUnload(ce_module);
  for (auto& [key, mf] : ce_reduce) d.cuModuleUnload(mf.first);
  ce_reduce.clear();
  for (const CeStream& s : ce_streams) d.cuStreamDestroy(s.stream);
  if (ce_fork) d.cuEventDestroy(ce_fork);
  if (ce_join) d.cuEventDestroy(ce_join);
  ce_module = nullptr;
  ce_fn = nullptr;
  ce_streams.clear();
  ce_fork = ce_join = nullptr;
  if (regs.windows) d.cuMemFree(regs.windows);
  if (side_stream) d.cuStreamDestroy(side_stream);
  if (host) d.cuMemFreeHost(host);
  if (done_event) d.cuEventDestroy(done_event);
  regs.windows = 0;
  side_stream = nullptr;
  host = nullptr;
  done_event = nullptr;
  transport.reset();
  arena.reset();
}

void Comm::abandon() {
  if (clique) {
    std::lock_guard<std::mutex> lock(clique->mu);
    for (Comm*& m : clique->members)
      if (m == this) m = nullptr;
  }
  for (auto& i : plans.owned) (void)i.release();
  for (auto& [key, g] : plans.groups) (void)g.release();
  for (auto& x : ce_states) (void)x.release();
  {
    std::lock_guard<std::mutex> lock(plans.res_mu);
    for (auto& r : plans.resources) (void)r.release();
  }
  // Leaked on purpose (a kernel may still use what they map); children that
  // share this memory keep their own references. The proxy's FIFOs too: its
  // thread stops, its memory stays.
  if (proxy) {
    proxy->abort();
    (void)proxy.release();
    for (auto& n : nets) (void)n.release();
  }
  new std::shared_ptr<Transport>(std::move(transport));
  new std::shared_ptr<Arena>(std::move(arena));
}

Comm::~Comm() {
  if (!ctx) return;  // init failed before the device was set up
  try {
    // Our kernels end by themselves (or by the watchdog, or at once after an
    // abort). Memory they may still touch is never freed: past the bound it
    // is leaked instead (a stream stuck behind foreign work).
    const int64_t bound = aborted.load() ? 5000
                          : config.timeout_ns == 0 ? -1
                                                   : int64_t(config.timeout_ns / 1000000) + 5000;
    if (wait_idle(bound)) {
      release();
    } else {
      debug_log(fmt::format("rank {}: kernels still running after {} ms; leaking the communicator's GPU memory "
                            "rather than freeing memory in use",
                            rank, bound));
      abandon();
      return;
    }
    cu().cuDevicePrimaryCtxRelease(cudev);
  } catch (...) {
  }
}

}  // namespace mk::rt
