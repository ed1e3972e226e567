// The communicator: ranks, device, symmetric memory, plan instances.
//
// Life of a collective call (runtime/api.cpp):
//   validate arguments -> find the plan instance for (collective, dtype, op,
//   size bucket) (created on first use: JIT or MK_PLAN_DIR, module load,
//   scratch/flag regions, peer pointer tables) -> fill mk::dev::Args ->
//   cuLaunchKernel on the caller's stream. From the second call of a bucket
//   on: a hash lookup and one launch, no allocation, no I/O, no sync.
#pragma once

#include <cuda.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "compiler/plan/plan.hpp"
#include "mk.h"
#include "mk/types.hpp"
#include "runtime/bootstrap.hpp"
#include "runtime/memory.hpp"
#include "templates/abi.cuh"

namespace mk::rt {

struct PlanInstance;

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
  int64_t flag_offset = 0;
  CUdeviceptr scratch_ptrs = 0;  // device array [nranks]
  CUdeviceptr flag_ptrs = 0;     // device array [nranks]
  CUdeviceptr seq = 0;           // device array [grid]
  dev::ErrorRecord* errors = nullptr;  // host-mapped [grid]
  CUdeviceptr errors_dev = 0;
  const PlanInstance* last = nullptr;  // the kernel launched last (for error reports)
};

struct PlanInstance {
  std::shared_ptr<const plan::Plan> plan;
  const plan::Kernel* kernel = nullptr;
  CUmodule module = nullptr;
  CUfunction fn = nullptr;
  Resources* res = nullptr;
  bool rooted = false;
};

// A buffer registered with mkCommRegister: its row in the zero-copy window
// table, and what this rank opened to map the peers' buffers of that row.
struct Registration {
  size_t bytes = 0;
  int window = -1;
  std::vector<CUdeviceptr> imports;  // per peer: IPC mapping to close (0: none)
};

// Communicators of one process created together (mkCommInitAll): they share
// user buffers by address (peer access), without IPC.
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
};
CommConfig comm_config_from_env();

class Comm {
 public:
  int nranks = 0;
  int rank = 0;
  int device = 0;  // CUDA ordinal in this process
  CUdevice cudev = 0;
  CUcontext ctx = nullptr;
  int arch = 0;  // e.g. 90
  int sms = 0;
  CommConfig config{};

  std::unique_ptr<Bootstrap> boot;  // null for mkCommInitAll and single-rank comms
  Arena arena;
  std::vector<std::unique_ptr<PeerMapping>> mappings;  // peers in other processes
  std::vector<CUdeviceptr> peer_base;                  // arena base of every rank, in this process

  volatile int32_t* host_abort = nullptr;  // host-mapped, read by kernels
  CUdeviceptr host_abort_dev = 0;
  // Calls of one communicator run one after another even across streams.
  CUstream last_stream = nullptr;
  CUstream checked_stream = nullptr;  // last stream seen to belong to this GPU
  bool used = false;
  CUevent order_event = nullptr;

  std::mutex mu;  // guards plan instance creation and the fields below
  std::unordered_map<uint64_t, PlanInstance*> instances;
  // Fast path: per (collective, dtype, op), byte ranges already resolved.
  struct Range {
    int64_t lo, hi;  // inclusive, hi -1 unbounded
    PlanInstance* inst;
  };
  std::vector<Range> fast[2][6 * 12 * 5];  // [zero-copy] ...
  std::vector<std::unique_ptr<PlanInstance>> owned;
  std::vector<std::unique_ptr<Resources>> resources;
  int64_t scratch_used = 0, flags_used = 0;
  std::map<uintptr_t, Registration> registered;  // by base address
  // Zero-copy window table [max_windows][nranks] of dev::ZcPeerWindow: row w,
  // column p is rank p's buffer of window w as mapped on this GPU.
  CUdeviceptr windows = 0;
  CUstream side_stream = nullptr;  // table updates, never behind user work
  std::shared_ptr<Clique> clique;  // mkCommInitAll; null otherwise

  std::atomic<int> async_error{mkSuccess};
  std::string async_message;
  std::string last_error;
  std::atomic<bool> aborted{false};
  uint32_t magic = kMagic;
  static constexpr uint32_t kMagic = 0x6d6b436d;  // "mkCm"

  ~Comm();

  // The instance already serving this call, or null. `zc`: the call's
  // buffers are registered (a zero-copy plan if the schedule has one).
  // Caller holds `mu`.
  PlanInstance* find(Collective coll, DType dtype, RedOp op, int64_t bytes, bool zc);
  // The instance for a call, created on first use (its device-side tables
  // are initialised on `stream`, ahead of the kernel). Caller holds `mu`.
  PlanInstance& instance(Collective coll, DType dtype, RedOp op, int64_t bytes, bool zc, CUstream stream);
  PlanInstance& create_instance(Collective coll, DType dtype, RedOp op, int64_t bytes, bool zc, CUstream stream,
                                int64_t* lo, int64_t* hi);
  // The resources for kernel `k` of `p`: shared with structurally equal
  // kernels, else allocated (tables initialised on `stream`).
  Resources& resources_for(const plan::Plan& p, const plan::Kernel& k, CUstream stream);
  // The kernel arguments of one call of `inst` (tile chosen for this count).
  // Zero-copy plans also get the call's windows and offsets (`zc`).
  struct ZcCall {
    int32_t in_window = -1, out_window = -1;
    int64_t in_offset = 0, out_offset = 0, in_bytes = 0, out_bytes = 0;
    uint64_t call_sig = 0;  // collective | dtype << 8 | op << 16 | root << 32
  };
  dev::Args args(const PlanInstance& inst, const void* input, void* output, int64_t count, int32_t root,
                 int32_t elem_size, const ZcCall& zc) const;
  // Scans kernel error records; returns the first failure (and remembers it).
  mkResult_t poll_async_error();
  void release_instances();
};

// Registration (runtime/register.cpp): collective over the ranks of other
// processes (their buffers are opened through CUDA IPC), local within a
// clique. Throw RtError.
void comm_register(Comm& c, void* buff, size_t size, void** handle);
void comm_deregister(Comm& c, void* handle);
void release_registrations(Comm& c);

// Creation (runtime/comm.cpp).
Comm* comm_init_rank(int nranks, const mkUniqueId& id, int rank);
std::vector<Comm*> comm_init_all(int ndev, const int* devlist);

// The schedule the runtime uses for a call, and the byte range over which the
// same choice holds: MK_ALGO overrides, else the default table
// (runtime/select.cpp).
struct Choice {
  std::string schedule;
  int64_t lo = 0, hi = -1;  // inclusive; hi -1: unbounded
};
Choice choose_schedule(Collective coll, int nranks, int64_t bytes);

// Plans shared by all communicators of the process (runtime/plans.cpp).
std::shared_ptr<const plan::Plan> get_plan(const std::string& schedule, Collective coll, int nranks, DType dtype,
                                           RedOp op, int arch, bool zero_copy);

}  // namespace mk::rt
