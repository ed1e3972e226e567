// The fake libcuda.so.1: see fake_cuda.h for the model. Every entry point is
// an extern "C" definition of the name cuda.h declares, so the versioned
// symbols (cuMemAlloc -> cuMemAlloc_v2) come out exactly as the runtime
// dlsym()s them. One global mutex guards all state; waits poll without it.
#include "tests/fake_cuda/fake_cuda.h"
#include "templates/copy_engine.cuh"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr size_t kGranularity = 2u << 20;
constexpr size_t kDeviceMemory = size_t(80) << 30;

// ---- objects -----------------------------------------------------------------

struct Ctx {
  int device = 0;
  int retains = 0;
  std::set<Ctx*> peers;  // peer access enabled from this context
};

struct Run;
using Runs = std::vector<std::shared_ptr<Run>>;

struct Function;
struct Stream;

// Work recorded by a capture (and replayed by a graph launch).
struct Op {
  enum Kind { copy, set, launch, host_fn } kind;
  uintptr_t dst = 0;
  const void* src = nullptr;
  unsigned char value = 0;
  size_t bytes = 0;
  Function* fn = nullptr;
  std::string fn_name;
  int device = 0;
  unsigned grid[3] = {}, block[3] = {};
  mk::dev::Args args{};
  std::vector<mk::dev::Args> group;  // a group kernel (mk_group_*): every member's (args: the first)
  bool ce = false;            // mk_ce_sync: `ce_args` instead of `args`
  mk::dev::CeSyncArgs ce_args{};
  bool ce_reduce = false;     // mk_ce_reduce_<dtype>_<op>: `red_args`
  mk::dev::CeReduceArgs red_args{};
  bool pdl = false;  // launched with programmatic stream serialisation
  CUhostFn host = nullptr;
  void* user = nullptr;
};

struct Capture {
  uint64_t id = 0;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  std::thread::id owner;
  bool invalidated = false;
  Stream* origin = nullptr;
  std::vector<Op> ops;
};

struct Stream {
  Ctx* ctx = nullptr;
  unsigned long long id = 0;  // cuStreamGetId: unique for the process's life (given on first ask)
  unsigned flags = 0;
  int priority = 0;
  std::shared_ptr<Capture> cap;
  Runs pending;  // hung launches
};

struct Event {
  Ctx* ctx = nullptr;
  unsigned flags = 0;
  Runs waits;                   // launches the event waits for
  std::weak_ptr<Capture> cap;   // recorded inside this capture
};

struct Module {
  Ctx* ctx = nullptr;
  std::string image;
  std::vector<Function*> functions;
};

struct Function {
  Module* module = nullptr;
  std::string name;
};

struct Graph {
  std::vector<Op> ops;
};

// A launch that stays running (mkfake_hang).
struct Run {
  mk::dev::Args args{};
  bool released = false;
  bool done = false;
};

enum class Kind { device, host, vmm, ipc };

struct Region {
  size_t size = 0;
  Kind kind = Kind::device;
  int device = 0;
  Ctx* ctx = nullptr;
  std::string shm;  // device allocations: the shm object's name
  pid_t owner = 0;  // the process that created `shm`
  bool accessible = true;  // VMM mappings: cuMemSetAccess done
};

struct VmmHandle {
  int fd = -1;
  size_t size = 0;
  int device = 0;
  unsigned handle_types = 0;
};

// What the IPC handle's 64 bytes hold.
struct IpcPayload {
  char magic[4];
  int32_t pid;
  uint64_t size;
  char name[48];
};
static_assert(sizeof(IpcPayload) <= CU_IPC_HANDLE_SIZE);

struct FailRule {
  int nth = 0;
  CUresult code = CUDA_ERROR_OUT_OF_MEMORY;
};

struct State {
  std::mutex mu;
  bool initialized = false;
  int ndev = 4, arch = 90, sms = 132, blocks_per_sm = 2;
  std::vector<std::unique_ptr<Ctx>> ctxs;
  std::map<uintptr_t, Region> regions;  // by base address
  std::map<uintptr_t, size_t> reserved;
  std::map<uint64_t, VmmHandle> vmm;
  uint64_t next_vmm = 1;
  std::set<Stream*> streams;
  std::vector<std::unique_ptr<Stream>> default_streams;  // per device: NULL / legacy / per-thread
  std::set<Event*> events;
  std::set<Module*> modules;
  std::set<Function*> functions;
  std::set<Graph*> graphs;
  std::set<Graph*> execs;
  std::set<std::shared_ptr<Capture>> captures;  // active ones
  uint64_t next_capture = 1;
  std::map<std::string, FailRule> fail;
  std::map<std::string, int> calls;
  int64_t launches = 0;
  int64_t stream_waits = 0;
  mkfake_launch last{};
  bool have_last = false;
  int inject_left = 0;
  mk::dev::ErrorRecord inject{};
  bool hang = false;
  Runs running;
  uint64_t shm_counter = 0;
};

State& S() {
  static State* s = new State;  // never destroyed: the exit handler still uses it
  return *s;
}

thread_local std::vector<Ctx*> t_ctx;  // context stack; back() is current
thread_local CUstreamCaptureMode t_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

Ctx* current() { return t_ctx.empty() ? nullptr : t_ctx.back(); }

int env_int(const char* name, int dflt) {
  const char* e = std::getenv(name);
  return e && *e ? std::atoi(e) : dflt;
}

// MKFAKE_FAIL="fn:N[:code],..."
void parse_fail_env(State& s) {
  const char* e = std::getenv("MKFAKE_FAIL");
  if (!e) return;
  std::string all(e), item;
  for (size_t at = 0; at <= all.size();) {
    size_t comma = all.find(',', at);
    item = all.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    at = comma == std::string::npos ? all.size() + 1 : comma + 1;
    size_t c1 = item.find(':');
    if (c1 == std::string::npos) continue;
    size_t c2 = item.find(':', c1 + 1);
    FailRule r;
    r.nth = std::atoi(item.substr(c1 + 1).c_str());
    if (c2 != std::string::npos) r.code = CUresult(std::atoi(item.substr(c2 + 1).c_str()));
    if (r.nth > 0) s.fail[item.substr(0, c1)] = r;
  }
}

void unlink_own_shm() {
  State& s = S();
  for (auto& [base, r] : s.regions)
    if (!r.shm.empty() && r.owner == ::getpid()) shm_unlink(r.shm.c_str());
}

void atfork_prepare() { S().mu.lock(); }
void atfork_release() { S().mu.unlock(); }

// Called first by every entry point (mutex held): counts the call, applies an
// injected failure, and checks cuInit was called.
CUresult enter(const char* fn, bool needs_init = true) {
  State& s = S();
  int n = ++s.calls[fn];
  if (auto it = s.fail.find(fn); it != s.fail.end() && it->second.nth == n) return it->second.code;
  if (needs_init && !s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  return CUDA_SUCCESS;
}

#define FAKE_ENTER(fn)                        \
  std::unique_lock<std::mutex> lock_(S().mu); \
  State& s = S();                             \
  (void)s;                                    \
  if (CUresult r_ = enter(fn)) return r_

bool valid_device(int d) { return d >= 0 && d < S().ndev; }

Ctx* find_ctx(CUcontext c) {
  for (auto& x : S().ctxs)
    if (reinterpret_cast<CUcontext>(x.get()) == c) return x.get();
  return nullptr;
}

bool special(CUstream h) { return reinterpret_cast<uintptr_t>(h) <= 2; }

// The stream object of a handle (NULL, legacy and per-thread resolve through
// the current context); null when unknown.
Stream* find_stream(CUstream h) {
  State& s = S();
  if (special(h)) {
    Ctx* c = current();
    return c ? s.default_streams[size_t(c->device)].get() : nullptr;
  }
  Stream* p = reinterpret_cast<Stream*>(h);
  return s.streams.count(p) ? p : nullptr;
}

// The region containing [p, p+n), or null.
Region* find_region(uintptr_t p, size_t n = 1, uintptr_t* base = nullptr) {
  auto& m = S().regions;
  auto it = m.upper_bound(p);
  if (it == m.begin()) return nullptr;
  --it;
  if (p < it->first || p + std::max<size_t>(n, 1) > it->first + it->second.size) return nullptr;
  if (base) *base = it->first;
  return &it->second;
}

// Device-visible memory the fake can touch: known and accessible.
bool device_range_ok(uintptr_t p, size_t n) {
  Region* r = find_region(p, n);
  return r && r->accessible;
}

// ---- capture rules -------------------------------------------------------------

void invalidate(Capture& c) { c.invalidated = true; }

// An unsafe call (allocation, synchronous copy, sync, module load): refused
// while a capture forbids it on this thread (the CUDA capture mode rules).
CUresult unsafe_call() {
  if (t_mode == CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_SUCCESS;
  bool forbidden = false;
  const auto me = std::this_thread::get_id();
  for (auto& c : S().captures) {
    const bool mine = c->owner == me && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED;
    const bool global = t_mode == CU_STREAM_CAPTURE_MODE_GLOBAL && c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
    if (mine || global) {
      invalidate(*c);
      forbidden = true;
    }
  }
  return forbidden ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

// ---- kernels -------------------------------------------------------------------

// The communicator's abort word of this rank (abi.cuh: Args::flag_offset
// bytes before this plan's flag region), or null when the args do not lead to
// one the driver gave out.
uint64_t* comm_abort_word(const mk::dev::Args& a) {
  const uintptr_t flags = reinterpret_cast<uintptr_t>(a.flags);
  if (!flags || a.rank < 0 || !device_range_ok(flags + sizeof(void*) * size_t(a.rank), sizeof(void*))) return nullptr;
  const uintptr_t region = reinterpret_cast<const uintptr_t*>(flags)[a.rank];
  if (a.flag_offset < 0 || region < uintptr_t(a.flag_offset)) return nullptr;
  const uintptr_t w = region - uintptr_t(a.flag_offset);
  return device_range_ok(w, sizeof(uint64_t)) ? reinterpret_cast<uint64_t*>(w) : nullptr;
}

void write_record(const mk::dev::Args& a, const mk::dev::ErrorRecord& rec) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(a.errors);
  if (!p || !device_range_ok(p, sizeof rec)) return;  // a real kernel would fault; nothing to write to
  auto* e = reinterpret_cast<mk::dev::ErrorRecord*>(p);
  mk::dev::ErrorRecord body = rec;
  const int32_t code = body.code;
  body.code = 0;
  std::memcpy(reinterpret_cast<char*>(e) + sizeof(int32_t), reinterpret_cast<const char*>(&body) + sizeof(int32_t),
              sizeof body - sizeof(int32_t));
  __atomic_store_n(&e->code, code, __ATOMIC_RELEASE);
  // The kernel then tells its host (host_abort[1]) and stops every kernel of
  // the communicator on this rank (the comm-wide abort word).
  const uintptr_t h = reinterpret_cast<uintptr_t>(a.host_abort);
  if (h && device_range_ok(h, 2 * sizeof(int32_t))) __atomic_store_n(reinterpret_cast<int32_t*>(h) + 1, 1, __ATOMIC_RELEASE);
  if (uint64_t* w = comm_abort_word(a)) __atomic_store_n(w, uint64_t(1), __ATOMIC_RELEASE);
}

void write_stopped(const mk::dev::Args& a) {
  mk::dev::ErrorRecord rec{};
  rec.code = mk::dev::kErrStopped;
  rec.rank = a.rank;
  rec.peer = -1;
  rec.op = -1;
  write_record(a, rec);
}

bool abort_set(const mk::dev::Args& a) {
  if (const uint64_t* w = comm_abort_word(a); w && __atomic_load_n(w, __ATOMIC_ACQUIRE) != 0) return true;
  const uintptr_t p = reinterpret_cast<uintptr_t>(a.host_abort);
  if (!p || !device_range_ok(p, sizeof(int32_t))) return false;
  return __atomic_load_n(reinterpret_cast<const int32_t*>(p), __ATOMIC_ACQUIRE) != 0;
}

// At entry a kernel checks only the communicator's abort word (abi.cuh).
bool stopped_at_entry(const mk::dev::Args& a) {
  const uint64_t* w = comm_abort_word(a);
  return w && __atomic_load_n(w, __ATOMIC_ACQUIRE) != 0;
}

bool finished(Run& r) {
  if (r.done) return true;
  if (r.released) {
    r.done = true;
  } else if (abort_set(r.args)) {
    write_stopped(r.args);
    r.done = true;
  }
  return r.done;
}

bool all_finished(Runs& runs) {
  runs.erase(std::remove_if(runs.begin(), runs.end(), [](auto& r) { return finished(*r); }), runs.end());
  return runs.empty();
}

// Blocks until every run in `runs` ended, polling every 100 us without the lock.
void wait_runs(std::unique_lock<std::mutex>& lock, Runs runs) {
  while (!all_finished(runs)) {
    lock.unlock();
    ::usleep(100);
    lock.lock();
  }
}

// Executes a launch: the device contract of templates/abi.cuh.
void run_launch(const Op& op, Stream* stream, CUstream handle) {
  State& s = S();
  ++s.launches;
  s.last = mkfake_launch{};
  std::copy(op.grid, op.grid + 3, s.last.grid);
  std::copy(op.block, op.block + 3, s.last.block);
  s.last.stream = handle;
  s.last.device = op.device;
  std::snprintf(s.last.function, sizeof s.last.function, "%s", op.fn_name.c_str());
  s.last.args = op.args;
  s.last.pdl = op.pdl ? 1 : 0;
  s.last.members = int(op.group.size());
  std::copy(op.group.begin(), op.group.end(), s.last.member);
  s.have_last = true;
  // A group kernel keeps the contract for each member (its own records).
  const std::vector<mk::dev::Args> one{op.args};
  const std::vector<mk::dev::Args>& each = op.group.empty() ? one : op.group;
  if (s.inject_left > 0) {
    --s.inject_left;
    write_record(op.args, s.inject);
    return;
  }
  for (const mk::dev::Args& a : each) {
    if (stopped_at_entry(a)) {
      mk::dev::ErrorRecord rec{};
      rec.code = mk::dev::kErrStopped;
      rec.rank = a.rank;
      rec.slot = mk::dev::kStoppedAtEntry;
      rec.peer = -1;
      rec.op = -1;
      write_record(a, rec);
    } else if (s.hang) {
      auto r = std::make_shared<Run>();
      r->args = a;
      stream->pending.push_back(r);
      s.running.push_back(r);
    }
  }
}

void apply_mem(const Op& op) {
  if (op.kind == Op::copy) {
    // Overlapping ranges are undefined for the driver's copies: a caller bug.
    const uintptr_t d = op.dst, src = reinterpret_cast<uintptr_t>(op.src);
    if (op.bytes && d < src + op.bytes && src < d + op.bytes && d != src) {
      std::fprintf(stderr, "fake libcuda: a copy of %zu bytes between overlapping ranges (%#lx <- %#lx)\n", op.bytes,
                   (unsigned long)d, (unsigned long)src);
      std::abort();
    }
    std::memcpy(reinterpret_cast<void*>(op.dst), op.src, op.bytes);
  }
  if (op.kind == Op::set) std::memset(reinterpret_cast<void*>(op.dst), op.value, op.bytes);
}

// mk_ce_sync (templates/copy_engine.cuh), run at once: signals, then polls
// its words without the lock (peers are other processes or threads) until
// they hold, the communicator aborts or the timeout passes.
void run_ce_sync(std::unique_lock<std::mutex>& lock, const mk::dev::CeSyncArgs& a) {
  State& s = S();
  ++s.launches;
  s.last = mkfake_launch{};
  s.last.grid[0] = s.last.block[0] = 1;
  std::snprintf(s.last.function, sizeof s.last.function, "%s", "mk_ce_sync");
  s.have_last = true;
  const size_t tables = sizeof(void*) * size_t(a.nranks > 0 ? a.nranks : 0);
  if (a.nranks <= 0 || a.rank < 0 || a.rank >= a.nranks || !device_range_ok(uintptr_t(a.abort_words), tables) ||
      !device_range_ok(uintptr_t(a.signal), tables) || !device_range_ok(uintptr_t(a.counters), 8 * size_t(a.nranks)) ||
      !device_range_ok(uintptr_t(a.watch), 8 * size_t(a.nranks)) || !device_range_ok(uintptr_t(a.error), 64))
    return;  // a real kernel would fault
  auto abort_word = [&](int q) { return a.abort_words[q]; };
  const auto started = std::chrono::steady_clock::now();
  auto record = [&](int32_t code, int32_t peer, uint64_t have, uint64_t want, int32_t slot) {
    mk::dev::ErrorRecord& e = *a.error;
    const bool root_cause = __atomic_load_n(abort_word(a.rank), __ATOMIC_ACQUIRE) == 0 &&
                            !(a.host_abort && __atomic_load_n(a.host_abort, __ATOMIC_ACQUIRE) != 0);
    if (__atomic_load_n(&e.code, __ATOMIC_ACQUIRE) == 0) {
      e.rank = a.rank;
      e.instance = a.side;
      e.slot = slot;
      e.peer = peer;
      e.op = -1;
      e.step = a.tile;
      e.have = have;
      e.want = want;
      e.waited_ns = uint64_t(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - started).count());
      __atomic_store_n(&e.code, root_cause ? code : int32_t(mk::dev::kErrStopped), __ATOMIC_RELEASE);
      if (a.host_abort) __atomic_store_n(const_cast<int32_t*>(a.host_abort) + 1, 1, __ATOMIC_RELEASE);
    }
    for (int q = 0; q < a.nranks; ++q) __atomic_store_n(abort_word(q), uint64_t(1), __ATOMIC_RELEASE);
  };
  if (__atomic_load_n(abort_word(a.rank), __ATOMIC_ACQUIRE) != 0) {
    record(mk::dev::kErrStopped, -1, 0, 0, mk::dev::kStoppedAtEntry);
    return;
  }
  auto mine = [&](int p) { return p != a.rank && (a.only < 0 || p == a.only); };
  if (a.bump)
    for (int p = 0; p < a.nranks; ++p)
      if (mine(p)) {
        const uint64_t c = ++a.counters[p];
        __atomic_store_n(a.signal[p], c, __ATOMIC_RELEASE);
      }
  if (!a.wait) return;
  for (int p = 0; p < a.nranks; ++p) {
    if (!mine(p)) continue;
    const int64_t target = int64_t(a.counters[p]) + a.delta;
    if (target <= 0) continue;
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      const uint64_t have = __atomic_load_n(a.watch + p, __ATOMIC_ACQUIRE);
      if (have >= uint64_t(target)) break;
      const bool aborted = __atomic_load_n(abort_word(a.rank), __ATOMIC_ACQUIRE) != 0 ||
                           (a.host_abort && __atomic_load_n(a.host_abort, __ATOMIC_ACQUIRE) != 0);
      const bool late = a.timeout_ns != 0 &&
                        uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
                                     .count()) > a.timeout_ns;
      if (aborted || late) {
        record(mk::dev::kErrWaitTimeout, p, have, uint64_t(target), a.tile);
        return;
      }
      lock.unlock();
      ::usleep(50);
      lock.lock();
    }
  }
}

// mk_ce_reduce_<dtype>_<op>: dst := finalize(fold in rank order), with the
// reduction steps the kernel uses (templates/reduce.cuh compiles on the host
// too: two's-complement integer wrap-around, narrow floats in float).
template <typename T, int K>
void ce_reduce_as(const mk::dev::CeReduceArgs& a) {
  using C = typename mk::dev::Compute<T>::type;
  const int64_t n = a.bytes / int64_t(sizeof(T));
  for (int64_t i = 0; i < n; ++i) {
    C acc{};
    for (int q = 0; q < a.nranks; ++q) {
      const char* base = q == a.rank ? a.own : a.scratch + (int64_t(q) * a.slots + a.slot) * a.slot_bytes;
      T v;
      std::memcpy(&v, base + i * int64_t(sizeof(T)), sizeof v);
      const C c = mk::dev::Compute<T>::load(v);
      acc = q == 0 ? c : mk::dev::red_apply<K, C>(acc, c);
    }
    const T out = mk::dev::Compute<T>::store(mk::dev::red_finalize<K, C>(acc, a.nranks));
    std::memcpy(a.dst + i * int64_t(sizeof(T)), &out, sizeof out);
  }
}

template <typename T>
void ce_reduce_op(const mk::dev::CeReduceArgs& a, const std::string& op) {
  if (op == "sum") ce_reduce_as<T, mk::dev::kRedSum>(a);
  else if (op == "prod") ce_reduce_as<T, mk::dev::kRedProd>(a);
  else if (op == "max") ce_reduce_as<T, mk::dev::kRedMax>(a);
  else if (op == "min") ce_reduce_as<T, mk::dev::kRedMin>(a);
  else if (op == "avg") ce_reduce_as<T, mk::dev::kRedAvg>(a);
}

void run_ce_reduce(const std::string& fn, const mk::dev::CeReduceArgs& a) {
  State& s = S();
  ++s.launches;
  s.last = mkfake_launch{};
  std::snprintf(s.last.function, sizeof s.last.function, "%s", fn.c_str());
  s.have_last = true;
  if (a.nranks <= 0 || !device_range_ok(uintptr_t(a.dst), size_t(a.bytes)) ||
      !device_range_ok(uintptr_t(a.own), size_t(a.bytes)))
    return;  // a real kernel would fault
  const std::string rest = fn.substr(std::strlen("mk_ce_reduce_"));
  const std::string dt = rest.substr(0, rest.find('_')), op = rest.substr(rest.find('_') + 1);
  if (dt == "int8") ce_reduce_op<int8_t>(a, op);
  else if (dt == "uint8") ce_reduce_op<uint8_t>(a, op);
  else if (dt == "int32") ce_reduce_op<int32_t>(a, op);
  else if (dt == "uint32") ce_reduce_op<uint32_t>(a, op);
  else if (dt == "int64") ce_reduce_op<int64_t>(a, op);
  else if (dt == "uint64") ce_reduce_op<uint64_t>(a, op);
  else if (dt == "fp16") ce_reduce_op<mk::dev::f16>(a, op);
  else if (dt == "bf16") ce_reduce_op<mk::dev::bf16>(a, op);
  else if (dt == "fp32") ce_reduce_op<float>(a, op);
  else if (dt == "fp64") ce_reduce_op<double>(a, op);
  else if (dt == "fp8e4m3") ce_reduce_op<mk::dev::f8e4m3>(a, op);
  else if (dt == "fp8e5m2") ce_reduce_op<mk::dev::f8e5m2>(a, op);
}

// Host functions are collected (they run later, without the lock).
void run_ops(std::unique_lock<std::mutex>& lock, const std::vector<Op>& ops, Stream* stream, CUstream handle,
             std::vector<Op>* host_fns) {
  for (const Op& op : ops) {
    if (op.kind == Op::launch && op.ce) run_ce_sync(lock, op.ce_args);
    else if (op.kind == Op::launch && op.ce_reduce) run_ce_reduce(op.fn_name, op.red_args);
    else if (op.kind == Op::launch) run_launch(op, stream, handle);
    else if (op.kind == Op::host_fn) host_fns->push_back(op);
    else apply_mem(op);
  }
}

// Host functions run without the lock (they may call the driver).
void call_host_fns(std::unique_lock<std::mutex>& lock, const std::vector<Op>& fns) {
  if (fns.empty()) return;
  lock.unlock();
  for (const Op& op : fns) op.host(op.user);
  lock.lock();
}

// Executes `op` on `stream`, or records it when the stream is capturing.
void submit(std::unique_lock<std::mutex>& lock, Stream* stream, CUstream handle, Op op) {
  if (stream->cap) {
    stream->cap->ops.push_back(std::move(op));
    return;
  }
  std::vector<Op> fns;
  run_ops(lock, {op}, stream, handle, &fns);
  call_host_fns(lock, fns);
}

// ---- memory ----------------------------------------------------------------------

std::string new_shm_name() {
  return "/mkfake-" + std::to_string(::getpid()) + "-" + std::to_string(++S().shm_counter);
}

}  // namespace

// ============================================================================
extern "C" {

// ---- control API -------------------------------------------------------------

int mkfake_is_fake(void) { return 1; }

void mkfake_get_counts(mkfake_counts* out) {
  if (!out) return;
  std::lock_guard<std::mutex> lock(S().mu);
  State& s = S();
  mkfake_counts c{};
  for (auto& [base, r] : s.regions) {
    c.device_allocs += r.kind == Kind::device;
    c.host_allocs += r.kind == Kind::host;
    c.vmm_mappings += r.kind == Kind::vmm;
    c.ipc_opens += r.kind == Kind::ipc;
  }
  c.vmm_handles = int64_t(s.vmm.size());
  c.reserved_ranges = int64_t(s.reserved.size());
  c.modules = int64_t(s.modules.size());
  c.streams = int64_t(s.streams.size());
  c.events = int64_t(s.events.size());
  c.graphs = int64_t(s.graphs.size() + s.execs.size());
  for (auto& x : s.ctxs) c.ctx_retains += x->retains;
  c.launches = s.launches;
  c.stream_waits = s.stream_waits;
  *out = c;
}

int mkfake_last_launch(mkfake_launch* out) {
  std::lock_guard<std::mutex> lock(S().mu);
  if (!out || !S().have_last) return 0;
  *out = S().last;
  return 1;
}

int mkfake_fail(const char* fn, int nth, int code) {
  std::lock_guard<std::mutex> lock(S().mu);
  State& s = S();
  s.calls.clear();
  if (!fn) {
    s.fail.clear();
    return 0;
  }
  if (nth < 0) return -1;
  if (nth == 0) {
    s.fail.erase(fn);
    return 0;
  }
  s.fail[fn] = FailRule{nth, code ? CUresult(code) : CUDA_ERROR_OUT_OF_MEMORY};
  return 0;
}

void mkfake_inject_record(int launches, const mk::dev::ErrorRecord* record) {
  std::lock_guard<std::mutex> lock(S().mu);
  S().inject_left = record ? std::max(0, launches) : 0;
  if (record) S().inject = *record;
}

void mkfake_hang(int on) {
  std::lock_guard<std::mutex> lock(S().mu);
  S().hang = on != 0;
}

void mkfake_set_limits(int sms, int blocks_per_sm) {
  std::lock_guard<std::mutex> lock(S().mu);
  S().sms = sms > 0 ? sms : env_int("MKFAKE_SMS", 132);
  S().blocks_per_sm = blocks_per_sm > 0 ? blocks_per_sm : env_int("MKFAKE_BLOCKS_PER_SM", 2);
}

void mkfake_release(void) {
  std::lock_guard<std::mutex> lock(S().mu);
  for (auto& r : S().running) r->released = true;
  S().running.clear();
}

int mkfake_running(void) {
  std::lock_guard<std::mutex> lock(S().mu);
  all_finished(S().running);
  return int(S().running.size());
}

// ---- initialisation, errors, devices -----------------------------------------

CUresult cuInit(unsigned int flags) {
  std::unique_lock<std::mutex> lock_(S().mu);
  State& s = S();
  if (CUresult r = enter("cuInit", false)) return r;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (s.initialized) return CUDA_SUCCESS;
  s.ndev = std::max(0, env_int("MKFAKE_DEVICES", 4));
  s.arch = env_int("MKFAKE_ARCH", 90);
  s.sms = env_int("MKFAKE_SMS", 132);
  s.blocks_per_sm = env_int("MKFAKE_BLOCKS_PER_SM", 2);
  parse_fail_env(s);
  for (int d = 0; d < s.ndev; ++d) {
    auto c = std::make_unique<Ctx>();
    c->device = d;
    s.ctxs.push_back(std::move(c));
    auto st = std::make_unique<Stream>();
    st->ctx = s.ctxs.back().get();
    s.default_streams.push_back(std::move(st));
  }
  s.initialized = true;
  std::atexit(unlink_own_shm);
  pthread_atfork(atfork_prepare, atfork_release, atfork_release);
  return CUDA_SUCCESS;
}

// Private driver interfaces (NVRTC asks for them when it finds a driver):
// none here, which callers must and do handle.
CUresult cuGetExportTable(const void** table, const CUuuid* id) {
  if (!table || !id) return CUDA_ERROR_INVALID_VALUE;
  *table = nullptr;
  return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuDriverGetVersion(int* v) {
  if (!v) return CUDA_ERROR_INVALID_VALUE;
  *v = CUDA_VERSION;
  return CUDA_SUCCESS;
}

#define MKFAKE_ERRORS(X)                                                              \
  X(CUDA_SUCCESS, "no error")                                                         \
  X(CUDA_ERROR_INVALID_VALUE, "invalid argument")                                     \
  X(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")                                        \
  X(CUDA_ERROR_NOT_INITIALIZED, "initialization error")                               \
  X(CUDA_ERROR_DEINITIALIZED, "driver shutting down")                                 \
  X(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected")                       \
  X(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal")                              \
  X(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid")                       \
  X(CUDA_ERROR_INVALID_CONTEXT, "invalid device context")                             \
  X(CUDA_ERROR_CONTEXT_ALREADY_IN_USE, "context already in use")                      \
  X(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "peer access is already enabled")         \
  X(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "peer access has not been enabled")           \
  X(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle")                             \
  X(CUDA_ERROR_NOT_FOUND, "named symbol not found")                                   \
  X(CUDA_ERROR_NOT_READY, "device not ready")                                         \
  X(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered")           \
  X(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "too many resources requested for launch")    \
  X(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure")                           \
  X(CUDA_ERROR_NOT_PERMITTED, "operation not permitted")                              \
  X(CUDA_ERROR_NOT_SUPPORTED, "operation not supported")                              \
  X(CUDA_ERROR_ALREADY_MAPPED, "resource already mapped")                             \
  X(CUDA_ERROR_NOT_MAPPED, "resource not mapped")                              \
  X(CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state") \
  X(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "operation not permitted when stream is capturing") \
  X(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "operation failed due to a previous error during capture") \
  X(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "attempt to terminate a thread-local capture sequence from another thread") \
  X(CUDA_ERROR_UNKNOWN, "unknown error")

CUresult cuGetErrorString(CUresult error, const char** str) {
  if (!str) return CUDA_ERROR_INVALID_VALUE;
#define MKFAKE_ERR_STR(code, text) \
  if (error == code) {             \
    *str = text;                   \
    return CUDA_SUCCESS;           \
  }
  MKFAKE_ERRORS(MKFAKE_ERR_STR)
#undef MKFAKE_ERR_STR
  *str = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorName(CUresult error, const char** str) {
  if (!str) return CUDA_ERROR_INVALID_VALUE;
#define MKFAKE_ERR_NAME(code, text) \
  if (error == code) {              \
    *str = #code;                   \
    return CUDA_SUCCESS;            \
  }
  MKFAKE_ERRORS(MKFAKE_ERR_NAME)
#undef MKFAKE_ERR_NAME
  *str = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuDeviceGetCount(int* count) {
  FAKE_ENTER("cuDeviceGetCount");
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  *count = s.ndev;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* dev, int ordinal) {
  FAKE_ENTER("cuDeviceGet");
  if (!dev) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *dev = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  FAKE_ENTER("cuDeviceGetAttribute");
  if (!pi) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
  switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *pi = s.arch / 10; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *pi = s.arch % 10; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *pi = s.sms; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *pi = 2048; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *pi = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *pi = 49152; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *pi = 232448; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *pi = 0x10 + dev; break;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: *pi = 1; break;
    default: *pi = 0; break;
  }
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  FAKE_ENTER("cuDeviceGetName");
  if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(name, size_t(len), "mKernel fake GPU %d (sm_%d)", int(dev), s.arch);
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  FAKE_ENTER("cuDeviceGetUuid");
  if (!uuid) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::memset(uuid->bytes, 0, sizeof uuid->bytes);
  std::memcpy(uuid->bytes, "mkfakegpu", 9);
  uuid->bytes[15] = char(dev);
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetPCIBusId(char* bus, int len, CUdevice dev) {
  FAKE_ENTER("cuDeviceGetPCIBusId");
  if (!bus || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(bus, size_t(len), "0000:%02x:00.0", 0x10 + int(dev));
  return CUDA_SUCCESS;
}

// MKFAKE_LINK: how the fake GPUs of one process are linked: "nvlink" (the
// default: peer access with native atomics), "pcie" (peer access without
// them), "none" (no peer access).
std::string fake_link() {
  const char* e = std::getenv("MKFAKE_LINK");
  return e && *e ? e : "nvlink";
}

CUresult cuDeviceCanAccessPeer(int* can, CUdevice dev, CUdevice peer) {
  FAKE_ENTER("cuDeviceCanAccessPeer");
  if (!can) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev) || !valid_device(peer)) return CUDA_ERROR_INVALID_DEVICE;
  *can = dev != peer && fake_link() != "none";  // as the real driver: a device is not its own peer
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetP2PAttribute(int* value, CUdevice_P2PAttribute attr, CUdevice src, CUdevice dst) {
  FAKE_ENTER("cuDeviceGetP2PAttribute");
  if (!value) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(src) || !valid_device(dst) || src == dst) return CUDA_ERROR_INVALID_DEVICE;
  const std::string link = fake_link();
  switch (attr) {
    case CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED: *value = link != "none"; break;
    case CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED: *value = link == "nvlink"; break;
    case CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK: *value = link == "nvlink" ? 0 : 1; break;
    default: *value = 0; break;
  }
  return CUDA_SUCCESS;
}

// ---- contexts ------------------------------------------------------------------

CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  FAKE_ENTER("cuDevicePrimaryCtxRetain");
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  Ctx* c = s.ctxs[size_t(dev)].get();
  ++c->retains;
  *pctx = reinterpret_cast<CUcontext>(c);
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  FAKE_ENTER("cuDevicePrimaryCtxRelease");
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  Ctx* c = s.ctxs[size_t(dev)].get();
  if (c->retains == 0) return CUDA_ERROR_INVALID_CONTEXT;
  --c->retains;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  FAKE_ENTER("cuDevicePrimaryCtxGetState");
  if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *flags = 0;
  *active = s.ctxs[size_t(dev)]->retains > 0;
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  FAKE_ENTER("cuCtxSetCurrent");
  Ctx* c = nullptr;
  if (ctx && !(c = find_ctx(ctx))) return CUDA_ERROR_INVALID_CONTEXT;
  if (t_ctx.empty()) {
    if (c) t_ctx.push_back(c);
  } else if (c) {
    t_ctx.back() = c;
  } else {
    t_ctx.pop_back();
  }
  return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext* pctx) {
  FAKE_ENTER("cuCtxGetCurrent");
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  *pctx = reinterpret_cast<CUcontext>(current());
  return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent(CUcontext ctx) {
  FAKE_ENTER("cuCtxPushCurrent");
  Ctx* c = find_ctx(ctx);
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  t_ctx.push_back(c);
  return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent(CUcontext* pctx) {
  FAKE_ENTER("cuCtxPopCurrent");
  if (t_ctx.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (pctx) *pctx = reinterpret_cast<CUcontext>(t_ctx.back());
  t_ctx.pop_back();
  return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice* dev) {
  FAKE_ENTER("cuCtxGetDevice");
  if (!dev) return CUDA_ERROR_INVALID_VALUE;
  Ctx* c = current();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  *dev = c->device;
  return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) {
  FAKE_ENTER("cuCtxSynchronize");
  Ctx* c = current();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  if (CUresult r = unsafe_call()) return r;
  Runs runs = s.default_streams[size_t(c->device)]->pending;
  for (Stream* st : s.streams)
    if (st->ctx == c) runs.insert(runs.end(), st->pending.begin(), st->pending.end());
  wait_runs(lock_, runs);
  return CUDA_SUCCESS;
}

CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
  FAKE_ENTER("cuCtxEnablePeerAccess");
  Ctx* c = current();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  Ctx* p = find_ctx(peer);
  if (!p) return CUDA_ERROR_INVALID_CONTEXT;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (p == c) return CUDA_ERROR_INVALID_DEVICE;
  if (!c->peers.insert(p).second) return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
  return CUDA_SUCCESS;
}

// ---- streams and events -----------------------------------------------------------

}  // extern "C"

namespace {

CUresult create_stream(CUstream* ph, unsigned int flags, int priority) {
  if (!ph || (flags & ~unsigned(CU_STREAM_NON_BLOCKING))) return CUDA_ERROR_INVALID_VALUE;
  Ctx* c = current();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  auto* st = new Stream;
  st->ctx = c;
  st->flags = flags;
  st->priority = std::clamp(priority, -5, 0);
  S().streams.insert(st);
  *ph = reinterpret_cast<CUstream>(st);
  return CUDA_SUCCESS;
}

}  // namespace

extern "C" {

CUresult cuStreamCreateWithPriority(CUstream* ph, unsigned int flags, int priority) {
  FAKE_ENTER("cuStreamCreateWithPriority");
  return create_stream(ph, flags, priority);
}

CUresult cuStreamCreate(CUstream* ph, unsigned int flags) {
  FAKE_ENTER("cuStreamCreate");
  return create_stream(ph, flags, 0);
}

CUresult cuStreamDestroy(CUstream h) {
  FAKE_ENTER("cuStreamDestroy");
  Stream* st = special(h) ? nullptr : find_stream(h);
  if (!st) return CUDA_ERROR_INVALID_HANDLE;
  if (st->cap) {  // destroying a capturing stream ends (and invalidates) its capture
    invalidate(*st->cap);
    s.captures.erase(st->cap);
  }
  s.streams.erase(st);
  delete st;  // its hung launches keep running (held by s.running and events)
  return CUDA_SUCCESS;
}

CUresult cuStreamGetCtx(CUstream h, CUcontext* pctx) {
  FAKE_ENTER("cuStreamGetCtx");
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  Stream* st = find_stream(h);
  if (!st) return special(h) ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_INVALID_HANDLE;
  *pctx = reinterpret_cast<CUcontext>(st->ctx);
  return CUDA_SUCCESS;
}

CUresult cuStreamGetId(CUstream h, unsigned long long* id) {
  FAKE_ENTER("cuStreamGetId");
  if (!id) return CUDA_ERROR_INVALID_VALUE;
  Stream* st = find_stream(h);
  if (!st) return special(h) ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_INVALID_HANDLE;
  static unsigned long long next = 0;
  if (!st->id) st->id = ++next;
  *id = st->id;
  return CUDA_SUCCESS;
}

CUresult cuStreamQuery(CUstream h) {
  FAKE_ENTER("cuStreamQuery");
  Stream* st = find_stream(h);
  if (!st) return special(h) ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_INVALID_HANDLE;
  if (st->cap) {
    invalidate(*st->cap);
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  return all_finished(st->pending) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuStreamSynchronize(CUstream h) {
  FAKE_ENTER("cuStreamSynchronize");
  Stream* st = find_stream(h);
  if (!st) return special(h) ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_INVALID_HANDLE;
  if (st->cap) {
    invalidate(*st->cap);
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  if (CUresult r = unsafe_call()) return r;
  wait_runs(lock_, st->pending);
  return CUDA_SUCCESS;
}

CUresult cuEventCreate(CUevent* ph, unsigned int flags) {
  FAKE_ENTER("cuEventCreate");
  if (!ph) return CUDA_ERROR_INVALID_VALUE;
  Ctx* c = current();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  auto* e = new Event;
  e->ctx = c;
  e->flags = flags;
  s.events.insert(e);
  *ph = reinterpret_cast<CUevent>(e);
  return CUDA_SUCCESS;
}

CUresult cuEventDestroy(CUevent h) {
  FAKE_ENTER("cuEventDestroy");
  Event* e = reinterpret_cast<Event*>(h);
  if (!s.events.erase(e)) return CUDA_ERROR_INVALID_HANDLE;
  delete e;
  return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent h, CUstream hs) {
  FAKE_ENTER("cuEventRecord");
  Event* e = reinterpret_cast<Event*>(h);
  if (!s.events.count(e)) return CUDA_ERROR_INVALID_HANDLE;
  Stream* st = find_stream(hs);
  if (!st) return CUDA_ERROR_INVALID_HANDLE;
  if (st->ctx != e->ctx) return CUDA_ERROR_INVALID_HANDLE;
  e->cap = st->cap;
  e->waits = st->cap ? Runs{} : st->pending;
  return CUDA_SUCCESS;
}

CUresult cuEventQuery(CUevent h) {
  FAKE_ENTER("cuEventQuery");
  Event* e = reinterpret_cast<Event*>(h);
  if (!s.events.count(e)) return CUDA_ERROR_INVALID_HANDLE;
  return all_finished(e->waits) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuEventSynchronize(CUevent h) {
  FAKE_ENTER("cuEventSynchronize");
  Event* e = reinterpret_cast<Event*>(h);
  if (!s.events.count(e)) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult r = unsafe_call()) return r;
  wait_runs(lock_, e->waits);
  return CUDA_SUCCESS;
}

CUresult cuStreamWaitEvent(CUstream hs, CUevent h, unsigned int flags) {
  FAKE_ENTER("cuStreamWaitEvent");
  ++s.stream_waits;
  Stream* st = find_stream(hs);
  if (!st) return CUDA_ERROR_INVALID_HANDLE;
  Event* e = reinterpret_cast<Event*>(h);
  if (!s.events.count(e)) return CUDA_ERROR_INVALID_HANDLE;
  if (auto cap = e->cap.lock(); cap && s.captures.count(cap)) {
    if (!st->cap) st->cap = cap;  // the stream joins the capture, as in CUDA
  } else if (!st->cap) {
    st->pending.insert(st->pending.end(), e->waits.begin(), e->waits.end());
  }
  return CUDA_SUCCESS;
}

CUresult cuLaunchHostFunc(CUstream hs, CUhostFn fn, void* user) {
  FAKE_ENTER("cuLaunchHostFunc");
  Stream* st = find_stream(hs);
  if (!st) return CUDA_ERROR_INVALID_HANDLE;
  if (!fn) return CUDA_ERROR_INVALID_VALUE;
  Op op;
  op.kind = Op::host_fn;
  op.host = fn;
  op.user = user;
  submit(lock_, st, hs, op);
  return CUDA_SUCCESS;
}

// ---- capture and graphs ------------------------------------------------------------

CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  FAKE_ENTER("cuThreadExchangeStreamCaptureMode");
  if (!mode || *mode < CU_STREAM_CAPTURE_MODE_GLOBAL || *mode > CU_STREAM_CAPTURE_MODE_RELAXED)
    return CUDA_ERROR_INVALID_VALUE;
  std::swap(*mode, t_mode);
  return CUDA_SUCCESS;
}

CUresult cuStreamBeginCapture(CUstream hs, CUstreamCaptureMode mode) {
  FAKE_ENTER("cuStreamBeginCapture");
  if (special(hs)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;  // the legacy stream cannot be captured
  Stream* st = find_stream(hs);
  if (!st) return CUDA_ERROR_INVALID_HANDLE;
  if (mode < CU_STREAM_CAPTURE_MODE_GLOBAL || mode > CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_ERROR_INVALID_VALUE;
  if (st->cap) return CUDA_ERROR_ILLEGAL_STATE;
  auto cap = std::make_shared<Capture>();
  cap->id = s.next_capture++;
  cap->mode = mode;
  cap->owner = std::this_thread::get_id();
  cap->origin = st;
  st->cap = cap;
  s.captures.insert(cap);
  return CUDA_SUCCESS;
}

CUresult cuStreamEndCapture(CUstream hs, CUgraph* graph) {
  FAKE_ENTER("cuStreamEndCapture");
  if (!graph) return CUDA_ERROR_INVALID_VALUE;
  Stream* st = find_stream(hs);
  if (!st) return CUDA_ERROR_INVALID_HANDLE;
  auto cap = st->cap;
  if (!cap || cap->origin != st) return CUDA_ERROR_ILLEGAL_STATE;
  if (cap->mode != CU_STREAM_CAPTURE_MODE_RELAXED && cap->owner != std::this_thread::get_id())
    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  for (Stream* x : s.streams)
    if (x->cap == cap) x->cap.reset();
  s.captures.erase(cap);
  *graph = nullptr;
  if (cap->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  auto* g = new Graph;
  g->ops = std::move(cap->ops);
  s.graphs.insert(g);
  *graph = reinterpret_cast<CUgraph>(g);
  return CUDA_SUCCESS;
}

CUresult cuStreamIsCapturing(CUstream hs, CUstreamCaptureStatus* status) {
  FAKE_ENTER("cuStreamIsCapturing");
  if (!status) return CUDA_ERROR_INVALID_VALUE;
  Stream* st = find_stream(hs);
  if (!st) return special(hs) ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_INVALID_HANDLE;
  *status = !st->cap                ? CU_STREAM_CAPTURE_STATUS_NONE
            : st->cap->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                   : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  return CUDA_SUCCESS;
}

CUresult cuStreamGetCaptureInfo(CUstream hs, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                                const CUgraphNode** deps, const CUgraphEdgeData** edges, size_t* ndeps) {
  FAKE_ENTER("cuStreamGetCaptureInfo");
  if (!status) return CUDA_ERROR_INVALID_VALUE;
  Stream* st = find_stream(hs);
  if (!st) return special(hs) ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_INVALID_HANDLE;
  *status = !st->cap                ? CU_STREAM_CAPTURE_STATUS_NONE
            : st->cap->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                   : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  if (id) *id = st->cap ? st->cap->id : 0;
  if (graph) *graph = nullptr;  // the graph under construction is not exposed
  if (deps) *deps = nullptr;
  if (edges) *edges = nullptr;
  if (ndeps) *ndeps = 0;
  return CUDA_SUCCESS;
}

CUresult cuGraphDestroy(CUgraph h) {
  FAKE_ENTER("cuGraphDestroy");
  Graph* g = reinterpret_cast<Graph*>(h);
  if (!s.graphs.erase(g)) return CUDA_ERROR_INVALID_VALUE;
  delete g;
  return CUDA_SUCCESS;
}

CUresult cuGraphInstantiate(CUgraphExec* exec, CUgraph h, unsigned long long flags) {
  FAKE_ENTER("cuGraphInstantiate");
  if (!exec) return CUDA_ERROR_INVALID_VALUE;
  Graph* g = reinterpret_cast<Graph*>(h);
  if (!s.graphs.count(g)) return CUDA_ERROR_INVALID_VALUE;
  for (const Op& op : g->ops)
    if (op.kind == Op::launch && !s.functions.count(op.fn)) return CUDA_ERROR_INVALID_HANDLE;  // module unloaded
  auto* x = new Graph(*g);
  s.execs.insert(x);
  *exec = reinterpret_cast<CUgraphExec>(x);
  return CUDA_SUCCESS;
}

CUresult cuGraphLaunch(CUgraphExec h, CUstream hs) {
  FAKE_ENTER("cuGraphLaunch");
  Graph* x = reinterpret_cast<Graph*>(h);
  if (!s.execs.count(x)) return CUDA_ERROR_INVALID_VALUE;
  Stream* st = find_stream(hs);
  if (!st) return CUDA_ERROR_INVALID_HANDLE;
  if (st->cap) {  // launched into another capture: its work joins that capture
    st->cap->ops.insert(st->cap->ops.end(), x->ops.begin(), x->ops.end());
    return CUDA_SUCCESS;
  }
  for (const Op& op : x->ops)
    if (op.kind == Op::launch && !s.functions.count(op.fn)) return CUDA_ERROR_INVALID_HANDLE;
  std::vector<Op> fns;
  run_ops(lock_, x->ops, st, hs, &fns);
  call_host_fns(lock_, fns);
  return CUDA_SUCCESS;
}

CUresult cuGraphExecDestroy(CUgraphExec h) {
  FAKE_ENTER("cuGraphExecDestroy");
  Graph* x = reinterpret_cast<Graph*>(h);
  if (!s.execs.erase(x)) return CUDA_ERROR_INVALID_VALUE;
  delete x;
  return CUDA_SUCCESS;
}

// ---- linear memory -------------------------------------------------------------------

CUresult cuMemAlloc(CUdeviceptr* dptr, size_t bytes) {
  FAKE_ENTER("cuMemAlloc");
  if (!dptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  Ctx* c = current();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  if (CUresult r = unsafe_call()) return r;
  // A name left behind by a killed process whose pid came back is taken:
  // try the next one.
  std::string name;
  int fd = -1;
  for (int tries = 0; tries < 1000 && fd < 0; ++tries) {
    name = new_shm_name();
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  void* p = MAP_FAILED;
  if (::ftruncate(fd, off_t(bytes)) == 0) p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(name.c_str());
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  Region r;
  r.size = bytes;
  r.kind = Kind::device;
  r.device = c->device;
  r.ctx = c;
  r.shm = name;
  r.owner = ::getpid();
  s.regions[reinterpret_cast<uintptr_t>(p)] = r;
  *dptr = CUdeviceptr(reinterpret_cast<uintptr_t>(p));
  return CUDA_SUCCESS;
}

CUresult cuMemFree(CUdeviceptr dptr) {
  FAKE_ENTER("cuMemFree");
  if (dptr == 0) return CUDA_SUCCESS;
  if (CUresult r = unsafe_call()) return r;
  auto it = s.regions.find(uintptr_t(dptr));
  if (it == s.regions.end() || it->second.kind != Kind::device) return CUDA_ERROR_INVALID_VALUE;
  ::munmap(reinterpret_cast<void*>(it->first), it->second.size);
  if (it->second.owner == ::getpid()) shm_unlink(it->second.shm.c_str());
  s.regions.erase(it);
  return CUDA_SUCCESS;
}

CUresult cuMemHostAlloc(void** pp, size_t bytes, unsigned int flags) {
  FAKE_ENTER("cuMemHostAlloc");
  if (!pp || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  if (flags & ~unsigned(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED))
    return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = unsafe_call()) return r;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  Region r;
  r.size = bytes;
  r.kind = Kind::host;
  r.device = current() ? current()->device : 0;
  r.ctx = current();
  s.regions[reinterpret_cast<uintptr_t>(p)] = r;
  *pp = p;
  return CUDA_SUCCESS;
}

CUresult cuMemHostGetDevicePointer(CUdeviceptr* dptr, void* p, unsigned int flags) {
  FAKE_ENTER("cuMemHostGetDevicePointer");
  if (!dptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Region* r = find_region(reinterpret_cast<uintptr_t>(p));
  if (!r || r->kind != Kind::host) return CUDA_ERROR_INVALID_VALUE;
  *dptr = CUdeviceptr(reinterpret_cast<uintptr_t>(p));
  return CUDA_SUCCESS;
}

CUresult cuMemFreeHost(void* p) {
  FAKE_ENTER("cuMemFreeHost");
  if (CUresult r = unsafe_call()) return r;
  auto it = s.regions.find(reinterpret_cast<uintptr_t>(p));
  if (it == s.regions.end() || it->second.kind != Kind::host) return CUDA_ERROR_INVALID_VALUE;
  ::munmap(p, it->second.size);
  s.regions.erase(it);
  return CUDA_SUCCESS;
}

CUresult cuMemGetInfo(size_t* free_bytes, size_t* total) {
  FAKE_ENTER("cuMemGetInfo");
  if (!free_bytes || !total) return CUDA_ERROR_INVALID_VALUE;
  Ctx* c = current();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  size_t used = 0;
  for (auto& [base, r] : s.regions)
    if (r.kind == Kind::device && r.device == c->device) used += r.size;
  for (auto& [h, v] : s.vmm)
    if (v.device == c->device) used += v.size;
  *total = kDeviceMemory;
  *free_bytes = used < kDeviceMemory ? kDeviceMemory - used : 0;
  return CUDA_SUCCESS;
}

CUresult cuMemGetAddressRange(CUdeviceptr* base, size_t* size, CUdeviceptr dptr) {
  FAKE_ENTER("cuMemGetAddressRange");
  uintptr_t b = 0;
  Region* r = find_region(uintptr_t(dptr), 1, &b);
  if (!r || r->kind == Kind::host) return CUDA_ERROR_INVALID_VALUE;
  if (base) *base = CUdeviceptr(b);
  if (size) *size = r->size;
  return CUDA_SUCCESS;
}

}  // extern "C"

namespace {

// One pointer attribute of a known region; false: attribute not modelled.
bool pointer_attribute(void* data, CUpointer_attribute a, uintptr_t p, uintptr_t base, const Region& r) {
  const bool host = r.kind == Kind::host;
  switch (a) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: *static_cast<CUcontext*>(data) = reinterpret_cast<CUcontext>(r.ctx); break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<unsigned*>(data) = host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
      break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *static_cast<CUdeviceptr*>(data) = CUdeviceptr(p); break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER: *static_cast<void**>(data) = host ? reinterpret_cast<void*>(p) : nullptr; break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *static_cast<int*>(data) = 0; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *static_cast<int*>(data) = r.device; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *static_cast<CUdeviceptr*>(data) = CUdeviceptr(base); break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *static_cast<size_t*>(data) = r.size; break;
    case CU_POINTER_ATTRIBUTE_MAPPED: *static_cast<int*>(data) = 1; break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: *static_cast<int*>(data) = r.kind == Kind::device; break;
    default: return false;
  }
  return true;
}

// Zero of the attribute's type (cuPointerGetAttributes on unknown memory).
void zero_attribute(void* data, CUpointer_attribute a) {
  switch (a) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: *static_cast<CUcontext*>(data) = nullptr; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *static_cast<CUdeviceptr*>(data) = 0; break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER: *static_cast<void**>(data) = nullptr; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *static_cast<size_t*>(data) = 0; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *static_cast<int*>(data) = -2; break;
    default: *static_cast<unsigned*>(data) = 0; break;
  }
}

}  // namespace

extern "C" {

CUresult cuPointerGetAttribute(void* data, CUpointer_attribute a, CUdeviceptr ptr) {
  FAKE_ENTER("cuPointerGetAttribute");
  if (!data) return CUDA_ERROR_INVALID_VALUE;
  uintptr_t base = 0;
  Region* r = find_region(uintptr_t(ptr), 1, &base);
  if (!r) return CUDA_ERROR_INVALID_VALUE;  // what the driver answers for malloc memory
  return pointer_attribute(data, a, uintptr_t(ptr), base, *r) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute* attrs, void** data, CUdeviceptr ptr) {
  FAKE_ENTER("cuPointerGetAttributes");
  if (!attrs || !data) return CUDA_ERROR_INVALID_VALUE;
  uintptr_t base = 0;
  Region* r = find_region(uintptr_t(ptr), 1, &base);
  for (unsigned i = 0; i < n; ++i) {
    if (!data[i]) return CUDA_ERROR_INVALID_VALUE;
    if (!r || !pointer_attribute(data[i], attrs[i], uintptr_t(ptr), base, *r)) zero_attribute(data[i], attrs[i]);
  }
  return CUDA_SUCCESS;
}

// ---- copies and memsets -------------------------------------------------------------------

}  // extern "C"

namespace {

CUresult copy_or_set(std::unique_lock<std::mutex>& lock, Op op, CUstream hs, bool sync) {
  if (!device_range_ok(op.dst, op.bytes) || (op.kind == Op::copy && !op.src)) return CUDA_ERROR_INVALID_VALUE;
  if (sync) {
    if (CUresult r = unsafe_call()) return r;
    apply_mem(op);
    return CUDA_SUCCESS;
  }
  Stream* st = find_stream(hs);
  if (!st) return CUDA_ERROR_INVALID_HANDLE;
  submit(lock, st, hs, op);
  return CUDA_SUCCESS;
}

Op copy_op(uintptr_t dst, const void* src, size_t n) {
  Op op;
  op.kind = Op::copy;
  op.dst = dst;
  op.src = src;
  op.bytes = n;
  return op;
}

Op set_op(uintptr_t dst, unsigned char v, size_t n) {
  Op op;
  op.kind = Op::set;
  op.dst = dst;
  op.value = v;
  op.bytes = n;
  return op;
}

}  // namespace

extern "C" {

CUresult cuMemcpyHtoD(CUdeviceptr dst, const void* src, size_t n) {
  FAKE_ENTER("cuMemcpyHtoD");
  return copy_or_set(lock_, copy_op(uintptr_t(dst), src, n), nullptr, true);
}

CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t n, CUstream hs) {
  FAKE_ENTER("cuMemcpyHtoDAsync");
  return copy_or_set(lock_, copy_op(uintptr_t(dst), src, n), hs, false);
}

CUresult cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream hs) {
  FAKE_ENTER("cuMemcpyDtoDAsync");
  if (!device_range_ok(uintptr_t(src), n)) return CUDA_ERROR_INVALID_VALUE;
  return copy_or_set(lock_, copy_op(uintptr_t(dst), reinterpret_cast<const void*>(uintptr_t(src)), n), hs, false);
}

CUresult cuMemcpyDtoH(void* dst, CUdeviceptr src, size_t n) {
  FAKE_ENTER("cuMemcpyDtoH");
  if (!dst || !device_range_ok(uintptr_t(src), n)) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = unsafe_call()) return r;
  std::memcpy(dst, reinterpret_cast<const void*>(uintptr_t(src)), n);
  return CUDA_SUCCESS;
}

CUresult cuMemsetD8(CUdeviceptr dst, unsigned char v, size_t n) {
  FAKE_ENTER("cuMemsetD8");
  return copy_or_set(lock_, set_op(uintptr_t(dst), v, n), nullptr, true);
}

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream hs) {
  FAKE_ENTER("cuMemsetD8Async");
  return copy_or_set(lock_, set_op(uintptr_t(dst), v, n), hs, false);
}

// ---- virtual memory management --------------------------------------------------------------

CUresult cuMemGetAllocationGranularity(size_t* g, const CUmemAllocationProp* prop,
                                       CUmemAllocationGranularity_flags option) {
  FAKE_ENTER("cuMemGetAllocationGranularity");
  if (!g || !prop) return CUDA_ERROR_INVALID_VALUE;
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || !valid_device(prop->location.id))
    return CUDA_ERROR_INVALID_DEVICE;
  *g = kGranularity;
  return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                     unsigned long long flags) {
  FAKE_ENTER("cuMemCreate");
  if (!handle || !prop || size == 0 || size % kGranularity != 0 || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(prop->location.id)) return CUDA_ERROR_INVALID_DEVICE;
  if (CUresult r = unsafe_call()) return r;
  int fd = ::memfd_create("mkfake-vmm", MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  if (::ftruncate(fd, off_t(size)) != 0) {
    ::close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const uint64_t h = s.next_vmm++;
  s.vmm[h] = VmmHandle{fd, size, prop->location.id, unsigned(prop->requestedHandleTypes)};
  *handle = h;
  return CUDA_SUCCESS;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  FAKE_ENTER("cuMemRelease");
  auto it = s.vmm.find(handle);
  if (it == s.vmm.end()) return CUDA_ERROR_INVALID_VALUE;
  ::close(it->second.fd);  // mappings keep the memory alive, as in CUDA
  s.vmm.erase(it);
  return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
  FAKE_ENTER("cuMemAddressReserve");
  if (!ptr || size == 0 || size % kGranularity != 0 || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (alignment & (alignment - 1)) return CUDA_ERROR_INVALID_VALUE;
  const size_t align = std::max(alignment, kGranularity);
  void* p = ::mmap(nullptr, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  const uintptr_t raw = reinterpret_cast<uintptr_t>(p);
  const uintptr_t base = (raw + align - 1) / align * align;
  if (base > raw) ::munmap(p, base - raw);
  if (raw + size + align > base + size) ::munmap(reinterpret_cast<void*>(base + size), raw + size + align - base - size);
  s.reserved[base] = size;
  *ptr = CUdeviceptr(base);
  return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  FAKE_ENTER("cuMemAddressFree");
  auto it = s.reserved.find(uintptr_t(ptr));
  if (it == s.reserved.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  for (auto& [base, r] : s.regions)
    if (r.kind == Kind::vmm && base >= it->first && base < it->first + size) return CUDA_ERROR_INVALID_VALUE;
  ::munmap(reinterpret_cast<void*>(it->first), size);
  s.reserved.erase(it);
  return CUDA_SUCCESS;
}

}  // extern "C"

namespace {

bool inside_reservation(uintptr_t p, size_t n) {
  auto& m = S().reserved;
  auto it = m.upper_bound(p);
  if (it == m.begin()) return false;
  --it;
  return p >= it->first && p + n <= it->first + it->second;
}

}  // namespace

extern "C" {

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
  FAKE_ENTER("cuMemMap");
  const uintptr_t p = uintptr_t(ptr);
  if (flags != 0 || size == 0 || !inside_reservation(p, size)) return CUDA_ERROR_INVALID_VALUE;
  auto h = s.vmm.find(handle);
  if (h == s.vmm.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (offset + size > h->second.size || offset % kGranularity || p % kGranularity) return CUDA_ERROR_INVALID_VALUE;
  for (auto& [base, r] : s.regions)
    if (base < p + size && p < base + r.size) return CUDA_ERROR_ALREADY_MAPPED;
  // No access until cuMemSetAccess, as on the GPU.
  void* m = ::mmap(reinterpret_cast<void*>(p), size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->second.fd, off_t(offset));
  if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  Region r;
  r.size = size;
  r.kind = Kind::vmm;
  r.device = h->second.device;
  r.ctx = current();
  r.accessible = false;
  s.regions[p] = r;
  return CUDA_SUCCESS;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  FAKE_ENTER("cuMemUnmap");
  auto it = s.regions.find(uintptr_t(ptr));
  if (it == s.regions.end() || it->second.kind != Kind::vmm || it->second.size != size)
    return CUDA_ERROR_INVALID_VALUE;
  // Back to a PROT_NONE reservation.
  ::mmap(reinterpret_cast<void*>(it->first), size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
         -1, 0);
  s.regions.erase(it);
  return CUDA_SUCCESS;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  FAKE_ENTER("cuMemSetAccess");
  if (!desc || count == 0) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count; ++i)
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || !valid_device(desc[i].location.id))
      return CUDA_ERROR_INVALID_DEVICE;
  // The range must be covered by mappings without gaps.
  std::vector<std::pair<uintptr_t, Region*>> parts;
  for (uintptr_t at = uintptr_t(ptr), end = at + size; at < end;) {
    uintptr_t base = 0;
    Region* r = find_region(at, 1, &base);
    if (!r || r->kind != Kind::vmm || base != at || base + r->size > end) return CUDA_ERROR_INVALID_VALUE;
    parts.emplace_back(base, r);
    at = base + r->size;
  }
  int prot = PROT_NONE;
  for (size_t i = 0; i < count; ++i)
    if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) prot = PROT_READ | PROT_WRITE;
    else if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ && prot == PROT_NONE) prot = PROT_READ;
  for (auto& [base, r] : parts) {
    ::mprotect(reinterpret_cast<void*>(base), r->size, prot);
    r->accessible = prot == (PROT_READ | PROT_WRITE);
  }
  return CUDA_SUCCESS;
}

CUresult cuMemExportToShareableHandle(void* out, CUmemGenericAllocationHandle handle, CUmemAllocationHandleType type,
                                      unsigned long long flags) {
  FAKE_ENTER("cuMemExportToShareableHandle");
  if (!out || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  auto h = s.vmm.find(handle);
  if (h == s.vmm.end()) return CUDA_ERROR_INVALID_VALUE;
  if (!(h->second.handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) return CUDA_ERROR_INVALID_VALUE;
  int fd = ::dup(h->second.fd);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(out) = fd;
  return CUDA_SUCCESS;
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* os_handle,
                                        CUmemAllocationHandleType type) {
  FAKE_ENTER("cuMemImportFromShareableHandle");
  if (!handle) return CUDA_ERROR_INVALID_VALUE;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  const int fd = int(reinterpret_cast<intptr_t>(os_handle));
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0 || st.st_size <= 0) return CUDA_ERROR_INVALID_VALUE;
  int mine = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (mine < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  const uint64_t h = s.next_vmm++;
  s.vmm[h] = VmmHandle{mine, size_t(st.st_size), current() ? current()->device : 0,
                       unsigned(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)};
  *handle = h;
  return CUDA_SUCCESS;
}

// ---- legacy IPC -----------------------------------------------------------------------------------

CUresult cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr dptr) {
  FAKE_ENTER("cuIpcGetMemHandle");
  if (!handle) return CUDA_ERROR_INVALID_VALUE;
  auto it = s.regions.find(uintptr_t(dptr));
  // Only the base of a cuMemAlloc allocation (VMM memory cannot be shared this way).
  if (it == s.regions.end() || it->second.kind != Kind::device) return CUDA_ERROR_INVALID_VALUE;
  IpcPayload pl{};
  std::memcpy(pl.magic, "MKFK", 4);
  pl.pid = it->second.owner;
  pl.size = it->second.size;
  std::snprintf(pl.name, sizeof pl.name, "%s", it->second.shm.c_str());
  std::memset(handle->reserved, 0, sizeof handle->reserved);
  std::memcpy(handle->reserved, &pl, sizeof pl);
  return CUDA_SUCCESS;
}

CUresult cuIpcOpenMemHandle(CUdeviceptr* dptr, CUipcMemHandle handle, unsigned int flags) {
  FAKE_ENTER("cuIpcOpenMemHandle");
  if (!dptr || (flags & ~unsigned(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))) return CUDA_ERROR_INVALID_VALUE;
  Ctx* c = current();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  IpcPayload pl{};
  std::memcpy(&pl, handle.reserved, sizeof pl);
  pl.name[sizeof pl.name - 1] = 0;
  if (std::memcmp(pl.magic, "MKFK", 4) != 0 || pl.size == 0) return CUDA_ERROR_INVALID_VALUE;
  if (pl.pid == ::getpid()) return CUDA_ERROR_INVALID_CONTEXT;  // the driver refuses its own process's handles
  int fd = shm_open(pl.name, O_RDWR, 0);
  if (fd < 0) return CUDA_ERROR_INVALID_VALUE;  // freed by its owner
  void* p = ::mmap(nullptr, pl.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  Region r;
  r.size = pl.size;
  r.kind = Kind::ipc;
  r.device = c->device;
  r.ctx = c;
  s.regions[reinterpret_cast<uintptr_t>(p)] = r;
  *dptr = CUdeviceptr(reinterpret_cast<uintptr_t>(p));
  return CUDA_SUCCESS;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  FAKE_ENTER("cuIpcCloseMemHandle");
  auto it = s.regions.find(uintptr_t(dptr));
  if (it == s.regions.end() || it->second.kind != Kind::ipc) return CUDA_ERROR_INVALID_VALUE;
  ::munmap(reinterpret_cast<void*>(it->first), it->second.size);
  s.regions.erase(it);
  return CUDA_SUCCESS;
}

// ---- modules and launches -----------------------------------------------------------------------

CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  FAKE_ENTER("cuModuleLoadData");
  if (!module || !image) return CUDA_ERROR_INVALID_VALUE;
  Ctx* c = current();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  if (CUresult r = unsafe_call()) return r;
  const auto* b = static_cast<const unsigned char*>(image);
  // ELF magic, ELFCLASS64, e_machine EM_CUDA (190, little endian at offset 18).
  if (std::memcmp(b, "\x7f" "ELF", 4) != 0 || b[4] != 2 || (b[18] | b[19] << 8) != 190)
    return CUDA_ERROR_INVALID_IMAGE;
  uint64_t shoff = 0, phoff = 0;
  uint16_t phentsize = 0, phnum = 0, shentsize = 0, shnum = 0;
  std::memcpy(&phoff, b + 32, 8);
  std::memcpy(&shoff, b + 40, 8);
  std::memcpy(&phentsize, b + 54, 2);
  std::memcpy(&phnum, b + 56, 2);
  std::memcpy(&shentsize, b + 58, 2);
  std::memcpy(&shnum, b + 60, 2);
  const uint64_t size = std::max<uint64_t>({64, shoff + uint64_t(shentsize) * shnum, phoff + uint64_t(phentsize) * phnum});
  if (size > (uint64_t(1) << 31)) return CUDA_ERROR_INVALID_IMAGE;
  auto* m = new Module;
  m->ctx = c;
  m->image.assign(reinterpret_cast<const char*>(b), size_t(size));
  s.modules.insert(m);
  *module = reinterpret_cast<CUmodule>(m);
  return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule h) {
  FAKE_ENTER("cuModuleUnload");
  Module* m = reinterpret_cast<Module*>(h);
  if (!s.modules.erase(m)) return CUDA_ERROR_INVALID_HANDLE;
  for (Function* f : m->functions) {
    s.functions.erase(f);
    delete f;
  }
  delete m;
  return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction* fn, CUmodule h, const char* name) {
  FAKE_ENTER("cuModuleGetFunction");
  if (!fn || !name) return CUDA_ERROR_INVALID_VALUE;
  Module* m = reinterpret_cast<Module*>(h);
  if (!s.modules.count(m)) return CUDA_ERROR_INVALID_HANDLE;
  const std::string key(name, std::strlen(name) + 1);  // with its NUL
  if (m->image.find(key) == std::string::npos) return CUDA_ERROR_NOT_FOUND;
  for (Function* f : m->functions)
    if (f->name == name) {
      *fn = reinterpret_cast<CUfunction>(f);
      return CUDA_SUCCESS;
    }
  auto* f = new Function{m, name};
  m->functions.push_back(f);
  s.functions.insert(f);
  *fn = reinterpret_cast<CUfunction>(f);
  return CUDA_SUCCESS;
}

CUresult cuFuncLoad(CUfunction fn) {
  FAKE_ENTER("cuFuncLoad");
  return s.functions.count(reinterpret_cast<Function*>(fn)) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuFuncGetAttribute(int* pi, CUfunction_attribute attrib, CUfunction fn) {
  FAKE_ENTER("cuFuncGetAttribute");
  if (!pi) return CUDA_ERROR_INVALID_VALUE;
  if (!s.functions.count(reinterpret_cast<Function*>(fn))) return CUDA_ERROR_INVALID_HANDLE;
  switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *pi = 64; break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION:
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *pi = s.arch; break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *pi = 49152; break;
    case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES:
    case CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES:
    case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: *pi = 0; break;
    default:
      if (attrib < 0 || attrib >= CU_FUNC_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
      *pi = 0;
  }
  return CUDA_SUCCESS;
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, CUfunction fn, int block_size, size_t smem) {
  FAKE_ENTER("cuOccupancyMaxActiveBlocksPerMultiprocessor");
  if (!blocks) return CUDA_ERROR_INVALID_VALUE;
  if (!s.functions.count(reinterpret_cast<Function*>(fn))) return CUDA_ERROR_INVALID_HANDLE;
  *blocks = block_size > 0 && block_size <= 1024 ? s.blocks_per_sm : 0;
  return CUDA_SUCCESS;
}

static CUresult launch(std::unique_lock<std::mutex>& lock_, State& s, CUfunction fn, unsigned gx, unsigned gy,
                       unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned smem, CUstream hs, void** params,
                       void** extra, bool pdl);

CUresult cuLaunchKernel(CUfunction fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned smem, CUstream hs, void** params, void** extra) {
  FAKE_ENTER("cuLaunchKernel");
  return launch(lock_, s, fn, gx, gy, gz, bx, by, bz, smem, hs, params, extra, false);
}

// Attributes other than programmatic stream serialisation are refused (the
// runtime sets no other).
CUresult cuLaunchKernelEx(const CUlaunchConfig* cfg, CUfunction fn, void** params, void** extra) {
  FAKE_ENTER("cuLaunchKernelEx");
  if (!cfg || (cfg->numAttrs && !cfg->attrs)) return CUDA_ERROR_INVALID_VALUE;
  bool pdl = false;
  for (unsigned i = 0; i < cfg->numAttrs; ++i) {
    if (cfg->attrs[i].id != CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION) return CUDA_ERROR_INVALID_VALUE;
    pdl = cfg->attrs[i].value.programmaticStreamSerializationAllowed != 0;
  }
  return launch(lock_, s, fn, cfg->gridDimX, cfg->gridDimY, cfg->gridDimZ, cfg->blockDimX, cfg->blockDimY, cfg->blockDimZ,
                cfg->sharedMemBytes, cfg->hStream, params, extra, pdl);
}

static CUresult launch(std::unique_lock<std::mutex>& lock_, State& s, CUfunction fn, unsigned gx, unsigned gy,
                       unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned smem, CUstream hs, void** params,
                       void** extra, bool pdl) {
  Function* f = reinterpret_cast<Function*>(fn);
  if (!s.functions.count(f)) return CUDA_ERROR_INVALID_HANDLE;
  Stream* st = find_stream(hs);
  if (!st) return special(hs) ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_INVALID_HANDLE;
  if (st->ctx != f->module->ctx) return CUDA_ERROR_INVALID_HANDLE;  // the function lives in another context
  if (!gx || !gy || !gz || !bx || !by || !bz) return CUDA_ERROR_INVALID_VALUE;
  if (uint64_t(bx) * by * bz > 1024 || smem > 232448) return CUDA_ERROR_INVALID_VALUE;
  if (!params || !params[0] || extra) return CUDA_ERROR_INVALID_VALUE;  // mkernel kernels take one dev::Args
  Op op;
  op.kind = Op::launch;
  op.fn = f;
  op.fn_name = f->name;
  op.device = st->ctx->device;
  op.grid[0] = gx, op.grid[1] = gy, op.grid[2] = gz;
  op.block[0] = bx, op.block[1] = by, op.block[2] = bz;
  op.pdl = pdl;
  if (f->name == "mk_ce_sync") {
    op.ce = true;
    std::memcpy(&op.ce_args, params[0], sizeof op.ce_args);
  } else if (f->name.rfind("mk_ce_reduce_", 0) == 0) {
    op.ce_reduce = true;
    std::memcpy(&op.red_args, params[0], sizeof op.red_args);
  } else if (f->name.rfind("mk_group_", 0) == 0) {
    // mk::dev::GroupArgs: the member count, padding, then each member's Args
    int64_t n = 0;
    std::memcpy(&n, params[0], sizeof n);
    if (n < 1 || n > mk::dev::kMaxGroupMembers) return CUDA_ERROR_INVALID_VALUE;
    op.group.resize(size_t(n));
    std::memcpy(op.group.data(), static_cast<const char*>(params[0]) + 16, size_t(n) * sizeof(mk::dev::Args));
    op.args = op.group[0];
  } else {
    std::memcpy(&op.args, params[0], sizeof op.args);
  }
  submit(lock_, st, hs, op);
  return CUDA_SUCCESS;
}

}  // extern "C"
