// The communicator: identity, symmetric memory and transport, the plan cache
// and registrations, and its lifecycle.
//
// Life of a collective call (runtime/launch/enqueue.cpp):
//   acquire a reference (runtime/api/handles.cpp) -> validate arguments -> find
//   the plan instance for (collective, dtype, op, size bucket) (created on
//   first use: JIT or MK_PLAN_DIR, module load, scratch/flag regions, peer
//   pointer tables) -> fill mk::dev::Args -> cuLaunchKernel on the caller's
//   stream. From the second call of a bucket on: a hash lookup and one
//   launch, no allocation, no I/O, no sync.
//
// Lifetime: handles.cpp owns every communicator through a shared_ptr; each
// API call holds a reference for its duration, so mkCommAbort/mkCommDestroy
// from another thread never frees memory a call still uses (the last
// reference frees it). Errors are sticky (check_usable).
#pragma once

#include <cuda.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "compiler/codegen/codegen.hpp"
#include "compiler/compile.hpp"
#include "compiler/plan/plan.hpp"
#include "mk.h"
#include "mk/composite.hpp"
#include "mk/types.hpp"
#include "runtime/bootstrap/bootstrap.hpp"
#include "runtime/memory/memory.hpp"
#include "runtime/proxy/proxy.hpp"
#include "runtime/topology/machine.hpp"
#include "runtime/transport/net/net.hpp"
#include "runtime/transport/transport.hpp"
#include "templates/abi.cuh"

namespace mk::rt {

struct PlanInstance;
struct Choice;

// Scratch, flags and step counters of a kernel. Kernels lowered from the same
// schedule to the same structure (blocks, slots, depth, tiles) share one set,
// whatever their dtype and op: their launches then continue one step
// sequence, exactly like launches of one kernel with different sizes, so the
// flag protocol that protects scratch reuse between launches holds across
// them too. This bounds symmetric memory by the number of schedules in use,
// not by dtype x op x bucket.
struct Resources {
  std::string key;
  int32_t grid = 0;
  int64_t scratch_offset = 0;  // in the arena, same on every rank
  int64_t flag_offset = 0;     // from the arena's base (the comm-wide abort word)
  CUdeviceptr scratch_ptrs = 0;  // device array [nranks]
  CUdeviceptr flag_ptrs = 0;     // device array [nranks]
  CUdeviceptr seq = 0;           // device array [grid]
  // Plans with network operations: the kernel's dev::NetTable (Args::net)
  // and the connections' device views it points to; 0 otherwise.
  CUdeviceptr net_table = 0;
  CUdeviceptr net_conns = 0;
  dev::ErrorRecord* errors = nullptr;  // host-mapped [grid]
  CUdeviceptr errors_dev = 0;
  std::atomic<const PlanInstance*> last{nullptr};  // the kernel launched last (for error reports)
  ~Resources();  // frees what was allocated (a half-built set too)
};

// The copy-engine path's memory on this rank for one tile size
// (runtime/launch/ce.hpp): counters and peers' words in the flag part, a slot per
// (sending rank, slot) in the scratch part, and device tables of peers'
// words. Allocated like Resources, in call order (so at the same offsets on
// every rank).
struct CeState {
  int64_t tile = 0;
  int64_t flag_offset = 0;     // from the flag part's base: dev::kCeWords x nranks words
  int64_t scratch_offset = 0;  // from the scratch part's base: ce::scratch_bytes(nranks, tile)
  CUdeviceptr tables = 0;      // [3][nranks] pointers: peers' ready words, peers' consumed words, abort words
  Resources* res = nullptr;    // error records [2] (send side, receive side); owned by PlanCache::resources
  ~CeState();                  // frees the tables
};

// Resource sets a group's repeated calls of one plan take in turn: the
// plan's own, then up to three copies (Comm::resource_copy).
inline constexpr int kResourceCopies = 4;

struct PlanInstance {
  std::shared_ptr<const plan::Plan> plan;
  const plan::Kernel* kernel = nullptr;
  CUmodule module = nullptr;
  CUfunction fn = nullptr;
  // A fused plan's epilogue kernel (<kernel>_epi, templates/fused.cuh), for
  // calls of many rows; null otherwise.
  CUfunction fn_epi = nullptr;
  Resources* res = nullptr;
  // Copies of `res` for a group's repeated calls, [k] for copy k (k >= 1):
  // made, or refused (null), on first use (Comm::resource_copy).
  Resources* copies[kResourceCopies] = {};
  bool copy_tried[kResourceCopies] = {};
  bool rooted = false;
  // A copy-engine schedule: `fn` is the communicator's mk_ce_sync, `plan`
  // describes the schedule only (one kernel entry, proto "ce", no cubin).
  CeState* ce = nullptr;
  ~PlanInstance();  // unloads the module
};

// A group kernel (codegen group_source): consecutive calls of one
// mkGroupStart/End on this communicator in one launch (runtime/launch/enqueue.cpp).
// fn null: it could not be built or would not fit the GPU (`why`); the calls
// are then launched one by one.
struct GroupKernel {
  CUmodule module = nullptr;
  CUfunction fn = nullptr;
  std::string name;
  std::string why;
  ~GroupKernel();  // unloads the module
};

// A buffer registered with mkCommRegister: its row in the zero-copy window
// table, and what this rank opened to map the peers' buffers of that row.
struct Registration {
  size_t bytes = 0;
  int window = -1;
  std::vector<CUdeviceptr> imports;  // per peer: IPC mapping to close (0: none)
};

// Communicators of one process created together (mkCommInitAll): they share
// user buffers by address (peer access), without IPC, and split together.
class Comm;
struct Clique {
  std::mutex mu;
  std::vector<Comm*> members;  // by rank; null once destroyed
};

struct CommConfig {
  int64_t scratch_bytes;  // symmetric scratch per rank
  int64_t flag_bytes;
  uint64_t timeout_ns;
  int32_t max_windows;  // registered buffers at a time (MK_MAX_REGISTRATIONS)
  // From mkConfig_t (NCCL's ncclConfig_t fields).
  bool blocking = true;
  int32_t cga_cluster_size = 0, min_ctas = 0, max_ctas = 0, split_share = 0;
  std::string net_name, comm_name;
  int32_t span_nodes = MK_SPAN_NODES_FAIL;  // mkConfig_t::spanNodes
  std::string schedules;  // mkConfig_t::schedules: the communicator's own schedule files (runtime/plans/schedules.hpp)
};
CommConfig comm_config_from_env();
// Applies a user mkConfig_t (NULL: nothing) on top of `c`; throws RtError for
// a wrong magic/version/size or a value out of range.
void apply_user_config(CommConfig* c, const mkConfig_t* user);

// Host-mapped words shared by the host and this rank's kernels.
struct HostFlags {
  volatile int32_t abort;      // host -> kernels: mkCommAbort (read in every bounded wait)
  volatile int32_t error;      // kernels -> host: an error record was written (sticky errors)
  uint64_t one;                // 1: the source of the abort-word copies
  uint8_t pad[48];
};
static_assert(sizeof(HostFlags) == 64, "one cache line");

// The plan instances of a communicator and the memory their kernels use.
// Guarded by Comm::mu, except `resources`, which also has res_mu so that
// mkCommGetAsyncError can scan error records without waiting for a JIT.
struct PlanCache {
  std::unordered_map<std::string, PlanInstance*> instances;
  struct Range {
    int64_t lo, hi;  // inclusive, hi -1 unbounded
    PlanInstance* inst;
  };
  static constexpr size_t kSlots = size_t(kNumCollectives) * kNumDTypes * kNumRedOps;
  std::vector<Range> fast[2][kSlots];  // [zero-copy][collective, dtype, op]
  // Fused calls (never zero-copy): "fusion|slot" -> ranges; composites'
  // stages that name their schedule: "fusion|slot|schedule".
  std::unordered_map<std::string, std::vector<Range>> fused;
  std::vector<std::unique_ptr<PlanInstance>> owned;
  // Group kernels by the group's shape (its calls' instances and lanes), and
  // how often each shape was seen (MK_GROUP_FUSE=auto compiles on the second).
  std::unordered_map<std::string, std::unique_ptr<GroupKernel>> groups;
  std::unordered_map<std::string, int> group_seen;
  // Composites built for this communicator's rank count, by name
  // (mkCompositeRun; runtime/launch/composite.cpp).
  std::map<std::string, std::shared_ptr<const dsl::Composite>> composites;
  // Schedules (with their knobs) whose PreMulSum plans the compiler refused
  // (verify_prologue): why, so that other sizes fall back without lowering again.
  std::map<std::string, std::string> premul_refused;
  // The same for fused plans (verify_epilogue): "fusion|schedule|knobs" -> why.
  std::map<std::string, std::string> fusion_refused;
  std::mutex res_mu;
  std::vector<std::unique_ptr<Resources>> resources;
  // This communicator's part of the arena (offsets from its base): all of it,
  // or for a child that shares its parent's memory (splitShare) the region
  // the parent ceded. The first kFlagReserve bytes of the flag part hold the
  // communicator-wide abort word.
  static constexpr int64_t kFlagReserve = 256;
  int64_t flag_base = 0, flag_end = 0, scratch_base = 0, scratch_end = 0;
  // Bump allocation in the flag and scratch parts, from their bases.
  int64_t scratch_used = 0, flags_used = kFlagReserve;
};

// A part of a communicator's arena ceded to the children of a split that
// share it (offsets from the arena base; the same on every rank).
struct SharedRegion {
  int64_t flag_lo = 0, flag_hi = 0, scratch_lo = 0, scratch_hi = 0;
  bool operator==(const SharedRegion&) const = default;
};

// What a child of mkCommSplit with splitShare takes from its parent on this
// rank: the arena and the transport that maps the peers' arenas (held, so
// that they outlive the parent if need be), the peers' arena bases by the
// child's ranks, and the region ceded to it.
struct ParentMemory {
  std::shared_ptr<Arena> arena;
  std::shared_ptr<Transport> transport;
  std::vector<CUdeviceptr> peer_base;  // by child rank
  SharedRegion region;
};

// Zero-copy registrations. Guarded by Comm::mu.
struct Registrations {
  std::map<uintptr_t, Registration> by_base;
  // mkCommRegister's handles: never-reused tokens (not the buffer's address:
  // a handle deregistered once fails forever, even when the same buffer is
  // registered again), to the buffer's base.
  std::map<uintptr_t, uintptr_t> by_handle;
  // Window table [max_windows][nranks] of dev::ZcPeerWindow: row w, column p
  // is rank p's buffer of window w as mapped on this GPU.
  CUdeviceptr windows = 0;
};

enum class CommState : int { initializing, ready, failed, finalized };

// A communicator is made of the parts below, each with its own invariants;
// Comm (further down) joins them with the plan cache, the registrations and
// the PreMulSum ops (their fields keep their names: the parts are bases).

// Who this rank is and on what machine. Set by init (comm_init_rank,
// comm_init_all) before the communicator is published as ready; constant
// afterwards, so read without a lock.
struct CommIdentity {
  int nranks = 0;
  int rank = 0;
  int device = 0;  // CUDA ordinal in this process
  CUdevice cudev = 0;
  CUcontext ctx = nullptr;
  int arch = 0;  // e.g. 90
  int sms = 0;
  int colocated = 1;  // ranks of this communicator on this GPU (they must all fit at once)
  int nodes = 1;      // nodes its ranks sit on (host name + boot id, or MK_HOST_ID): the same on every rank
  // Where every rank sits (runtime/topology/machine.hpp), the same on every
  // rank, and what plans are compiled for (its topology(); set unless
  // bootstrap-only).
  Machine machine;
  topology::Topology topo;
  // Spans nodes and was made with spanNodes = MK_SPAN_NODES_BOOTSTRAP: a
  // bootstrap and nothing else (no transport, no plans; check_serves).
  bool bootstrap_only = false;
  CommConfig config{};
};

// How this rank reaches its peers and their memory. Built by init; the
// pointers are constant until release. `transport` reaches every peer
// (one per communicator in this build; none when bootstrap-only);
// `peer_base[r]` is rank r's arena as this GPU addresses it.
struct CommPeers {
  std::unique_ptr<Bootstrap> boot;  // null for mkCommInitAll and single-rank comms
  // Shared with the ranks of this process that address it (p2p), so that a
  // peer's abort word write or a running kernel never lands in memory freed
  // by this rank's destroy: the arena goes with its last user.
  std::shared_ptr<Arena> arena = std::make_shared<Arena>();
  std::shared_ptr<Transport> transport;  // shared with children that share this memory (splitShare)
  // Every rank's arena base as this GPU addresses it; 0 for a rank no
  // memory transport reaches (none in this build: such communicators are
  // bootstrap-only; in part 2 the network's peers, reached by puts, never by
  // address). Tables of peers' addresses hold 0 for them (peer_at).
  std::vector<CUdeviceptr> peer_base;
  // Rank r's arena address `offset`, or 0 when no memory transport reaches r.
  CUdeviceptr peer_at(int r, int64_t offset) const {
    const CUdeviceptr b = peer_base[size_t(r)];
    return b ? b + CUdeviceptr(offset) : 0;
  }
  HostFlags* host = nullptr;           // host-mapped: the host abort word kernels read, their error word
  CUdeviceptr host_dev = 0;
  CUstream side_stream = nullptr;  // table updates and abort words, never behind user work
  // Ranks on other nodes (MK_NET): the network transport and the proxy that
  // carries the kernels' puts and signals to them (runtime/proxy/proxy.hpp);
  // null when memory reaches every peer. The proxy goes before the nets.
  // nets: in order of preference (MK_NET=auto: verbs, or null on a rank
  // without an RDMA device, then socket); one for the other settings.
  bool spans_network = false;
  // MK_HOST_ID's node name for this rank when it names nodes, resolved by
  // the rank of the communicator made from the environment (a list names one
  // per rank of that one); communicators made from it (split, shrink)
  // inherit it, whatever their size and numbering.
  std::optional<std::string> node_name;
  std::vector<std::unique_ptr<net::Net>> nets;
  std::unique_ptr<Proxy> proxy;
};

// The order of this communicator's eager kernels: every launch is on a
// stream of this GPU and, when its stream differs from the last one, after
// `done_event` of the last launch. Guarded by Comm::mu.
struct CommOrdering {
  unsigned long long last_stream_id = 0;  // cuStreamGetId of the last eager launch's stream
  CUstream checked_stream = nullptr;  // last stream seen to belong to this GPU
  bool used = false;     // a kernel was launched eagerly (done_event is recorded)
  CUevent done_event = nullptr;  // recorded after every eager launch
};

// The copy-engine path's host state (runtime/launch/ce.hpp), made on the
// first copy-engine call and released with the communicator. Guarded by
// Comm::mu; `ce_issuing` keeps a group's step-by-step issue of one call
// from interleaving with another call.
struct CopyEngines {
  CUmodule ce_module = nullptr;  // mk_ce_sync, loaded on the first copy-engine call
  CUfunction ce_fn = nullptr;
  // mk_ce_reduce per dtype x op (reduce-scatter and all-reduce), loaded on
  // first use; modules unloaded at release.
  std::map<int, std::pair<CUmodule, CUfunction>> ce_reduce;
  std::vector<std::unique_ptr<CeState>> ce_states;  // one per tile size in use
  // Receive-side streams: the first one not capturing a graph serves a call
  // (a capture holds the stream it joined until it ends).
  struct CeStream {
    CUstream stream;
    CUstream joined_from;  // the caller's stream it was last forked from
  };
  std::vector<CeStream> ce_streams;
  CUevent ce_fork = nullptr, ce_join = nullptr;
  // A group is issuing a copy-engine call of this communicator step by step
  // (runtime/launch/enqueue.cpp): another call must not interleave with it.
  bool ce_issuing = false;
};

// Lifecycle, errors and abort, in one place; lock-free except the two
// messages. Invariants: `state` goes initializing -> ready or failed, and
// ready -> finalized, never back; `async_error` is set once (the first
// error wins, with its message) and never cleared; `aborted` implies
// `closing`; `boot_cancel` is raised by an abort and ends any bootstrap wait
// (during init too). The words kernels read (the host abort word in
// CommPeers::host, the comm-wide abort word at the arena's base) are raised
// by Comm::raise_abort from these.
class CommLife {
 public:
  std::atomic<int> state{int(CommState::initializing)};
  std::atomic<int> async_error{mkSuccess};  // sticky: set once, never cleared
  std::atomic<bool> aborted{false};
  std::atomic<bool> closing{false};  // destroy or abort started
  std::atomic<int> splits_running{0};  // nonblocking mkCommSplit of this communicator still running
  // Calls of other threads inside get_plan (compiling, or waiting for a
  // compile): mkCommAbort does not wait for them; they see `closing` when the
  // compile ends, fail, and drop their reference (the last frees).
  std::atomic<int> compiling{0};
  BootstrapCancel boot_cancel;  // abort ends bootstrap waits, also during init (outlives CommPeers::boot: see Comm)

  // Records a sticky error (first one wins).
  void set_error(mkResult_t code, const std::string& msg);
  std::string error_message() const;
  // The last call's error message (mkGetLastError), not sticky.
  void set_last_error(const std::string& msg);
  std::string last_error() const;

 private:
  mutable std::mutex err_mu;  // the two strings below
  std::string async_message_;
  std::string last_error_;
};

// CommLife is the first base, so destroyed last: its boot_cancel outlives
// CommPeers::boot, whose destructor unregisters from it.
class Comm : public CommLife, public CommIdentity, public CommPeers, public CommOrdering, public CopyEngines {
 public:
  std::mutex mu;  // guards plans, regs, the ordering fields, pointer checks and the copy-engine state
  PlanCache plans;
  Registrations regs;
  std::map<uintptr_t, std::pair<size_t, int>> pointer_cache;  // allocation base -> (size, device ordinal)
  // PreMulSum ops (mkRedOpCreatePreMulSum; under mu), by handle. Handles
  // come from one process-wide counter from mkNumOps up and are never reused:
  // a destroyed op, or one of another communicator, is never live here.
  struct PreMul {
    DType dtype = DType::fp32;
    uint64_t value = 0;          // mkScalarHostImmediate: the scalar's bytes (low bytes)
    const void* ptr = nullptr;   // mkScalarDevice: where kernels read it
  };
  std::map<int, PreMul> premuls;
  // The live PreMulSum op with handle `op`, or null (a built-in op, a freed
  // or foreign handle). Caller holds mu.
  PreMul* premul(int op) {
    auto it = premuls.find(op);
    return it == premuls.end() ? nullptr : &it->second;
  }
  std::shared_ptr<Clique> clique;  // mkCommInitAll; null otherwise

  Comm() = default;
  ~Comm();  // waits (bounded) for this communicator's kernels, then frees
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  // Fails (RtError) when the communicator cannot take a call: aborted, an
  // error recorded (by a kernel, a peer or the host), not initialised yet, or
  // finalized. Cheap: atomics and one host-mapped word.
  void check_usable(const char* api);
  // check_usable, and fails (mkInvalidUsage) on a bootstrap-only
  // communicator: for what needs a transport (collectives, registration,
  // prewarm, PreMulSum ops).
  void check_serves(const char* api);
  // Scans kernel error records; returns the first failure (and makes it
  // sticky). Thread-safe; never waits for a call in progress.
  mkResult_t poll_async_error();

  // Raises the comm-wide abort word on every rank and this rank's host abort
  // word: running kernels everywhere stop within microseconds, later ones at
  // entry; and interrupts a bootstrap wait. Bounded; best effort (a peer may
  // be gone). Safe while a nonblocking init is still running.
  void raise_abort();
  // raise_abort without interrupting the bootstrap: what the network proxy
  // does when a connection fails (the bootstrap fails by itself, naming the
  // rank, if that rank left; a rank still in a bootstrap exchange finishes it).
  void stop_kernels();
  // Waits until this communicator's kernels are done, at most `bound_ms`
  // (<0: no bound). False if the bound passed.
  bool wait_idle(int64_t bound_ms);

  // splitShare: the region a child sharing this communicator's memory would
  // get (the upper half of what is still free), and giving it up for good
  // (later plans of this communicator allocate below it). Every rank of the
  // parent cedes the same region at the same split, so offsets stay
  // symmetric. cede throws if the region is no longer free.
  SharedRegion propose_shared_region();
  void cede(const SharedRegion& r);
  bool arena_shared() const;  // a splitShare child: its memory is part of its parent's

  // The instance already serving this call, or null. `zc`: the call's
  // buffers are registered (a zero-copy plan if the schedule has one).
  // Caller holds `mu`.
  // `fusion`: a fused call's fusion (include/mk/fusion.hpp); empty: none.
  PlanInstance* find(Collective coll, DType dtype, RedOp op, int64_t bytes, bool zc, const std::string& fusion = {},
                     const std::string& schedule = {});
  // The instance for a call, created on first use. Works inside stream
  // capture: nothing is enqueued on the caller's stream. Caller holds `mu`.
  // `schedule`: the one a composite's stage names ("": the selection tables').
  PlanInstance& instance(Collective coll, DType dtype, RedOp op, int64_t bytes, bool zc,
                         const std::string& fusion = {}, const std::string& schedule = {});
  // The kernel arguments of one call of `inst` (tile chosen for this count).
  // Zero-copy plans also get the call's windows and offsets (`zc`).
  struct ZcCall {
    int32_t in_window = -1, out_window = -1;
    int64_t in_offset = 0, out_offset = 0, in_bytes = 0, out_bytes = 0;
    uint64_t call_sig = 0;  // collective | dtype << 8 | op << 16 | root << 32
  };
  // The group kernel of shape `key` running `members` (`threads` per block,
  // `grid` blocks in all), built and loaded on first use; a failure is kept
  // in GroupKernel::why (and logged with MK_DEBUG). Caller holds `mu`.
  GroupKernel& group_kernel(const std::string& key, const std::vector<codegen::GroupMember>& members,
                            int32_t threads, int64_t grid);
  // `res`: the resources the call uses (a copy, resource_copy); null: inst.res.
  dev::Args args(const PlanInstance& inst, const void* input, void* output, int64_t count, int32_t root,
                 int32_t elem_size, const ZcCall& zc, const Resources* res = nullptr) const;
  // Copy `copy` (1..) of inst's resources (scratch, flags, step counters,
  // error records) for a group's repeated calls of one plan, allocated on
  // first use like the originals (in call order, so at the same offsets on
  // every rank). Null when the arena's scratch or flag memory would be more
  // than half used after it (the same answer on every rank: the rest stays
  // for plans); throws when an allocation fails. Caller holds `mu`.
  Resources* resource_copy(PlanInstance& inst, int copy);
  // Thread blocks per kernel at most: maxCTAs, and for ranks sharing a GPU
  // their share of its SMs (0: no cap). Plans are compiled for it.
  int32_t grid_cap() const;
  int32_t config_cap() const;  // maxCTAs alone (0: none)

 private:
  PlanInstance& create_instance(Collective coll, DType dtype, RedOp op, int64_t bytes, bool zc, int64_t* lo,
                                int64_t* hi, const std::string& fusion, const std::string& schedule);
  // The resources for kernel `k` of `p`: shared with structurally equal
  // kernels, else allocated (tables initialised on the side stream).
  Resources& resources_for(const plan::Plan& p, const plan::Kernel& k);
  Resources* find_resources(const std::string& key);  // null: none of that key yet
  // Allocates the resources of `key` for kernel `k` (flag and scratch
  // regions, tables, step counters, error records) and keeps them.
  // Network plans: the kernel's connection table (Args::net), its
  // connections made through the proxy. Caller holds `mu`.
  // `rooted`: the plan runs relabelled by root (connections for every root).
  void make_net_table(Resources& res, const plan::Kernel& k, bool rooted);
  Resources& new_resources(const std::string& key, const plan::Kernel& k, bool rooted);
  Resources* make_resource_copy(const PlanInstance& inst, int copy);  // resource_copy, uncached
  // Where the next flag and scratch regions of `flag_bytes` and
  // `scratch_bytes` go: after what is in use, 256-byte aligned (offsets from
  // the flag and scratch parts' bases; the same on every rank, which
  // allocates in the same order). Throws when they do not fit, naming `who`
  // (with `detail` after its byte count) and saying what to raise or lower
  // (`remedy`). Takes nothing: commit_regions does, once the rest is built.
  struct Regions {
    int64_t flag_offset = 0, scratch_offset = 0, flag_bytes = 0, scratch_bytes = 0;
  };
  Regions next_regions(int64_t flag_bytes, int64_t scratch_bytes) const;  // where, without the check
  Regions place_regions(int64_t flag_bytes, int64_t scratch_bytes, const std::string& who, const std::string& detail,
                        const std::string& remedy) const;
  void commit_regions(const Regions& r);
  // `res`'s error records: `res.grid` of them, host-mapped, zeroed.
  void alloc_error_records(Resources& res);
  // A copy-engine schedule's instance (runtime/launch/ce.cpp).
  PlanInstance& create_ce_instance(Collective coll, DType dtype, RedOp op, const Choice& choice, int64_t* lo,
                                   int64_t* hi);
  void release();
  void abandon();  // gives up ownership of everything kernels may still touch
};

// Registration (runtime/memory/register.cpp): collective over the ranks of other
// processes (their buffers are opened through CUDA IPC), local within a
// clique. Throw RtError.
void comm_register(Comm& c, void* buff, size_t size, void** handle);
void comm_deregister(Comm& c, void* handle);
void release_registrations(Comm& c);

// Creation (runtime/comm/comm.cpp). init_rank fills a Comm that handles.cpp may
// already have published (so that abort can reach a nonblocking init), with
// its config set. `shared`: the child of a split uses this part of its
// parent's memory instead of an arena of its own.
void comm_init_rank(Comm& c, int nranks, const mkUniqueId& id, int rank, int device,
                    const ParentMemory* shared = nullptr);
// Fills `comms` (made by the caller, configs set) as the ranks of one
// process on `devices`, by rank; `shared` (null, or one per rank) as above.
void comm_init_all(const std::vector<std::shared_ptr<Comm>>& comms, const std::vector<int>& devices,
                   const std::vector<ParentMemory>* shared = nullptr);
std::vector<std::shared_ptr<Comm>> comm_init_all(int ndev, const int* devlist, const CommConfig& cfg);
// The CUDA device current on the calling thread (cudaSetDevice), 0 if none.
int current_device();

// The schedule the runtime uses for a call, and the byte range over which the
// same choice holds: MK_ALGO overrides, else the default table
// (runtime/plans/select.cpp).
struct Choice {
  std::string schedule;
  int64_t lo = 0, hi = -1;  // inclusive; hi -1: unbounded
  std::string tune;         // protocol knobs of the table entry (MK_TUNE syntax), applied after MK_TUNE
};
// `zero_copy`: every buffer of the call is registered (peers' buffers are
// read and written in place).
// `topo`: the communicator's machine (Comm::topo); `nranks`: one NVLink node.
Choice choose_schedule(Collective coll, const topology::Topology& topo, int64_t bytes, bool zero_copy = false);
inline Choice choose_schedule(Collective coll, int nranks, int64_t bytes, bool zero_copy = false) {
  return choose_schedule(coll, topology::single(nranks), bytes, zero_copy);
}

// Marks the calling thread as inside a compile for `c` (a fusion check, a
// plan): mkCommAbort does not wait for it (Comm::compiling).
struct CompileScope {
  std::atomic<int>& n;
  explicit CompileScope(Comm& c) : n(c.compiling) { n.fetch_add(1); }
  ~CompileScope() { n.fetch_sub(1); }
  CompileScope(const CompileScope&) = delete;
  CompileScope& operator=(const CompileScope&) = delete;
};

// Plans shared by all communicators of the process (runtime/plans/plans.cpp).
// `max_grid`: thread blocks per kernel at most (mkConfig_t.maxCTAs; 0: no cap).
// `rank` >= 0: a plan whose kernels run on that rank (a compiled one holds
// only that rank's class; a process with several ranks gets one plan per
// class); -1: a plan for every rank.
// `tune`: the selection entry's knobs (Choice::tune), applied after MK_TUNE.
// `topo`: what the plan is lowered for (the communicator's machine). A plan
// for one node is built as before topologies were known, whatever the link
// inside the node (plain_topology: the same code, key and shipped plans;
// lowering does not read the link, selection does); any other topology is
// part of the schedule, so of the plan's cache key and its plan.json.
// `nranks`: one NVLink node.
bool plain_topology(const topology::Topology& t);
std::shared_ptr<const plan::Plan> get_plan(const std::string& schedule, Collective coll,
                                           const topology::Topology& topo, DType dtype, RedOp op, int arch,
                                           bool zero_copy, int32_t max_grid = 0, int32_t rank = -1,
                                           const std::string& tune = "", const std::string& fusion = "");
inline std::shared_ptr<const plan::Plan> get_plan(const std::string& schedule, Collective coll, int nranks,
                                                  DType dtype, RedOp op, int arch, bool zero_copy,
                                                  int32_t max_grid = 0, int32_t rank = -1,
                                                  const std::string& tune = "", const std::string& fusion = "") {
  return get_plan(schedule, coll, topology::single(nranks), dtype, op, arch, zero_copy, max_grid, rank, tune, fusion);
}

// Compiles get_plan has started in this process and the most that ran at
// once (ranks of one process whose plans differ compile together); `reset`
// zeroes both (tests).
struct PlanCompiles {
  int64_t started = 0;
  int peak_at_once = 0;
};
PlanCompiles plan_compiles(bool reset = false);

// The element type a plan of `coll` is compiled for: the call's for
// collectives that reduce; for those that only move data (all-gather,
// broadcast, all-to-all) one type per element size (uint8, fp16, uint32,
// uint64), so that one plan serves every type of that size (bf16 and fp16,
// fp32 and int32, ...). Not bytes for every type: a byte plan ran all-gather
// and all-to-all 1.6-1.9x slower at 512 KiB on the one-GPU proxy (s23).
// enqueue's call_args counts in the plan's elements.
DType kernel_dtype(Collective coll, DType dtype);
// The options get_plan compiles with (MK_TUNE, then `tune`), for `mkc
// prebuild` and mkCommPrewarm to compile exactly what a communicator would
// ask for.
compiler::CompileOptions plan_options(Collective coll, DType dtype, RedOp op, int arch, bool zero_copy,
                                      int32_t max_grid, int32_t rank, const std::string& tune = "",
                                      const std::string& fusion = "");
// Every (schedule, knobs) choose_schedule may pick for `coll` at `nranks`
// for unregistered buffers, over all sizes: the compiled ones, or (with
// `copy_engine`) the copy-engine ones, which compile no plan.
std::vector<Choice> schedules_for(Collective coll, const topology::Topology& topo, bool copy_engine = false);
inline std::vector<Choice> schedules_for(Collective coll, int nranks, bool copy_engine = false) {
  return schedules_for(coll, topology::single(nranks), copy_engine);
}

}  // namespace mk::rt
