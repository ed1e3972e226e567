// Validation -> plan lookup -> launch -> groups. The hot path takes one lock
// (the communicator's) and, from the second call of a size bucket on, does a
// table lookup and one cuLaunchKernel.
#include "runtime/launch/enqueue.hpp"

#include <fmt/format.h>

#include <functional>
#include <map>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "compiler/verify/fusion_check.hpp"
#include "mk/fusion.hpp"
#include "runtime/launch/ce.hpp"
#include "runtime/comm/comm.hpp"
#include "runtime/driver/cuda_driver.hpp"
#include "runtime/comm/env.hpp"
#include "runtime/api/handles.hpp"
#include "runtime/plans/select.hpp"
#include "runtime/api/status.hpp"

namespace mk::rt {

const char* api_name_of(Collective c) { return api_name(c).data(); }

namespace {

bool overlaps(uintptr_t a, size_t an, uintptr_t b, size_t bn) { return an && bn && a < b + bn && b < a + an; }

// The registered buffer that address `p` lies in: its window, and p's offset
// in it; -1 when p lies in none. A range that starts in one and runs past its
// end is a count mismatch.
int check_registered(const Comm& c, const void* p, size_t bytes, const char* what, const char* api, int64_t* offset) {
  const uintptr_t x = reinterpret_cast<uintptr_t>(p);
  auto it = c.regs.by_base.upper_bound(x);
  if (it == c.regs.by_base.begin()) return -1;
  --it;
  const uintptr_t end = it->first + it->second.bytes;
  if (x >= end) return -1;
  if (x + bytes > end)
    fail(mkInvalidArgument, fmt::format("{}: {} needs {} bytes at {:p}, but the registered buffer it lies in ends "
                                        "{} bytes after it (count mismatch)",
                                        api, what, bytes, p, end - x));
  *offset = int64_t(x - it->first);
  return it->second.window;
}

// MK_ZERO_COPY=0: registered buffers still go through scratch (for comparisons).
bool zero_copy_enabled() {
  static const bool on = env::zero_copy();
  return on;
}

// Zero-copy pays an entry and an exit barrier (two flag round trips) to save
// the staging copies. Where it pays is the selection tables' registered
// entries (runtime/plans/select.hpp; built in: from 4 MiB, measured on 2 x H200,
// bench/results/2026-11-30-h200x2-bf16-registered.md); MK_ZERO_COPY_MIN_BYTES,
// when set, decides instead (the larger buffer's bytes, as in the benchmark).
// Every rank computes the same choice.
bool zero_copy_pays(Collective coll, const topology::Topology& topo, int64_t bytes, int64_t larger_buffer) {
  static const bool forced = env::raw("MK_ZERO_COPY_MIN_BYTES").has_value();
  static const int64_t min_bytes = env::zero_copy_min_bytes();
  if (forced) return larger_buffer >= min_bytes;
  return lookup(registered_table(coll, topo), coll, topo, bytes, true) != nullptr;
}

// MK_PDL=0: plain launches even for kernels that allow programmatic
// dependent launch (plan::Kernel::pdl).
bool pdl_enabled() {
  static const bool on = env::pdl();
  return on;
}

// A validated call, ready to launch. Queued in a group it keeps only a weak
// reference: a destroy or abort from any thread is not held up by a group
// that is still open (mkGroupEnd then fails).
struct Pending {
  Call k;
  std::shared_ptr<Comm> c;
  CUstream stream;
  DType dt;
  RedOp op;
  int64_t bytes;         // per rank: count * element size
  size_t in_bytes;       // the send buffer (nranks x bytes for reduce-scatter, all-to-all)
  size_t out_bytes;      // the receive buffer (nranks x bytes for all-gather, all-to-all)
  bool need_send;        // broadcast: only the root's send buffer is read
  bool need_recv;        // reduce: only the root's receive buffer is written
  bool zc = false;       // every buffer of the call is registered: zero-copy plan
  Comm::ZcCall zcc;
  std::weak_ptr<Comm> weak;  // instead of `c` while queued in a group
  uint64_t prescale = 0;     // op premulsum: the scalar (Args::prescale, prescale_ptr)
  const void* prescale_ptr = nullptr;
  // A fused call (mkAllReduceFused): the fusion's name and the call's
  // operands (sizes in bytes), scalars and row length (Args::epi_*).
  std::string fusion;
  const void* epi_ops[dsl::kMaxOperands] = {};
  size_t epi_bytes[dsl::kMaxOperands] = {};
  double epi_scalars[dsl::kMaxScalars] = {};
  int64_t epi_row = 0;
  std::string schedule;  // a composite's stage: the schedule it names ("" : the tables')
  // A copy of the plan's resources for a group's repeated calls of one plan
  // (Comm::resource_copy); null: the plan instance's own.
  Resources* res = nullptr;
};

Resources* res_of(const Pending& p, const PlanInstance& inst) { return p.res ? p.res : inst.res; }

struct GroupState {
  int depth = 0;
  std::vector<Pending> pending;
  std::vector<std::function<void()>> deferred;  // splits started inside the group
  bool fuse = false;  // group_fuse_all
  mkResult_t failed = mkSuccess;
  std::string why;
};
thread_local GroupState t_group;

bool special_stream(CUstream s) {
  // NULL, cudaStreamLegacy (0x1), cudaStreamPerThread (0x2): resolved through
  // the current context.
  return reinterpret_cast<uintptr_t>(s) <= 2;
}

// A fused call's fusion, operands, scalars and rows; fills p's fusion
// fields. Checks what needs no driver (device memory: check_locked).
void validate_fusion(Pending& p) {
  const char* api = "mkAllReduceFused";
  const mkFusion_t& f = *p.k.fusion;
  if (!f.name || !*f.name) fail(mkInvalidArgument, fmt::format("{}: fusion->name is NULL or empty", api));
  const size_t name_len = strnlen(f.name, 129);
  if (name_len > 128) fail(mkInvalidArgument, fmt::format("{}: fusion->name is longer than 128 characters", api));
  const std::string fname(f.name, name_len);
  const dsl::FusionInfo* info = nullptr;
  try {
    info = dsl::find_fusion_unchecked(fname);  // mk.dsl.E009 for a malformed one
  } catch (const Error& e) {
    fail(mkInvalidArgument, fmt::format("{}: {}", api, e.what()));
  }
  if (!info) {
    std::string names;
    for (const auto& x : dsl::registered_fusions()) names += (names.empty() ? "" : ", ") + x.name;
    fail(mkInvalidArgument, fmt::format("{}: unknown fusion '{}' (known: {}); a fusion of your own is registered with "
                                        "MK_FUSION in a schedule file named by MK_SCHEDULES",
                                        api, fname, names.empty() ? "none" : names));
  }
  if (std::find(info->dtypes.begin(), info->dtypes.end(), p.dt) == info->dtypes.end()) {
    std::string ok;
    for (DType t : info->dtypes) ok += (ok.empty() ? "" : ", ") + std::string(name(t));
    fail(mkInvalidArgument, fmt::format("{}: fusion {} does not serve {} (it serves {})", api, fname, name(p.dt), ok));
  }
  try {
    // The first call of a dtype checks the fusion's code on that dtype (verify::check_fusion_once).
    const CompileScope checking(*p.c);  // an abort does not wait for it
    (void)dsl::find_fusion(fname, p.dt);
  } catch (const Error& e) {
    fail(mkInvalidArgument, fmt::format("{}: {}", api, e.what()));
  }
  p.c->check_usable(api);  // aborted meanwhile
  if (p.op == RedOp::premulsum && !info->pre_source.empty())
    fail(mkInvalidArgument, fmt::format("{}: fusion {} has a prologue, and a PreMulSum op is one too (the scaling): "
                                        "pass mkSum and scale in the fusion's prologue",
                                        api, fname));
  const int64_t count = int64_t(p.k.count);
  int64_t row = f.row;
  if (info->rows == dsl::RowMode::any) {
    if (row < 0) fail(mkInvalidArgument, fmt::format("{}: fusion->row {} is negative", api, row));
    if (row == 0) row = 4096;  // element-wise: any split works
    row = std::min<int64_t>(row, int64_t(1) << 20);
  } else {
    if (row < 1 || row > info->max_row)
      fail(mkInvalidArgument, fmt::format("{}: fusion {} needs fusion->row (elements per row) in 1..{}, not {}", api,
                                          fname, info->max_row, row));
    if (count % row != 0)
      fail(mkInvalidArgument, fmt::format("{}: count {} is not a whole number of rows of {} elements (fusion {})", api,
                                          count, row, fname));
  }
  if (count == 0) {
    p.fusion = fname;
    return;
  }
  const int64_t rows = (count + row - 1) / row;
  const size_t nops = info->operands.size();
  for (size_t k = 0; k < size_t(MK_FUSION_MAX_OPERANDS); ++k) {
    const void* ptr = f.operands[k];
    if (k >= nops) {
      if (ptr)
        fail(mkInvalidArgument, fmt::format("{}: fusion->operands[{}] is set, but fusion {} takes {} operand(s)", api,
                                            k, fname, nops));
      continue;
    }
    const dsl::OperandInfo& o = info->operands[k];
    const DType t = o.same_dtype ? p.dt : o.dtype;
    const size_t es = dtype_size(t);
    const int64_t n = o.shape == dsl::Shape::elem ? count : o.shape == dsl::Shape::col ? row : rows;
    if (!ptr)
      fail(mkInvalidArgument, fmt::format("{}: fusion->operands[{}] ({} of fusion {}) is NULL", api, k, o.name, fname));
    if (reinterpret_cast<uintptr_t>(ptr) % es != 0)
      fail(mkInvalidArgument, fmt::format("{}: fusion->operands[{}] ({}) {:p} is not aligned to its {}-byte type {}",
                                          api, k, o.name, ptr, es, name(t)));
    p.epi_ops[k] = ptr;
    p.epi_bytes[k] = size_t(n) * es;
  }
  // Outputs must not overlap the collective's buffers (its kernel reads and
  // writes them before the epilogue), and no operand may overlap recvbuff
  // (the epilogue rewrites it); an output may overlap another operand only
  // exactly (residual_out == residual: the same elements, read before written).
  const uintptr_t sp = reinterpret_cast<uintptr_t>(p.k.send), rp = reinterpret_cast<uintptr_t>(p.k.recv);
  std::vector<std::pair<int, int>> aliased;  // (output, input) passed as one buffer
  for (size_t k = 0; k < nops; ++k) {
    const uintptr_t x = reinterpret_cast<uintptr_t>(p.epi_ops[k]);
    const dsl::OperandInfo& o = info->operands[k];
    if (overlaps(x, p.epi_bytes[k], rp, p.out_bytes) || (o.output && overlaps(x, p.epi_bytes[k], sp, p.in_bytes)))
      fail(mkInvalidArgument, fmt::format("{}: fusion->operands[{}] ({}) overlaps {}", api, k, o.name,
                                          overlaps(x, p.epi_bytes[k], rp, p.out_bytes) ? "recvbuff" : "sendbuff"));
    if (!o.output) continue;
    for (size_t j = 0; j < nops; ++j) {
      if (j == k) continue;
      const uintptr_t y = reinterpret_cast<uintptr_t>(p.epi_ops[j]);
      const dsl::OperandInfo& q = info->operands[j];
      const bool exact = x == y && p.epi_bytes[k] == p.epi_bytes[j] && o.shape == dsl::Shape::elem && o.shape == q.shape &&
                         (o.same_dtype ? p.dt : o.dtype) == (q.same_dtype ? p.dt : q.dtype) && !q.output;
      if (!exact && overlaps(x, p.epi_bytes[k], y, p.epi_bytes[j]))
        fail(mkInvalidArgument, fmt::format("{}: fusion->operands[{}] ({}, written) overlaps operands[{}] ({}) without "
                                            "being the same buffer",
                                            api, k, o.name, j, q.name));
      if (exact) aliased.emplace_back(int(k), int(j));
    }
  }
  // The same buffer for an output and an input only where the fusion's code
  // gives the same results that way: the checker ran it so.
  if (!aliased.empty()) {
    std::string why;
    try {
      why = verify::alias_refusal(*info, aliased, p.dt);
    } catch (const Error& e) {
      fail(mkInvalidArgument, fmt::format("{}: {}", api, e.what()));
    }
    if (!why.empty()) {
      std::string pairs;
      for (auto [k, j] : aliased)
        pairs += fmt::format("{}operands[{}] ({}) is operands[{}] ({})", pairs.empty() ? "" : ", ", k,
                             info->operands[size_t(k)].name, j, info->operands[size_t(j)].name);
      fail(mkInvalidArgument, fmt::format("{}: {}, which fusion {}'s code does not allow: {}; pass separate buffers",
                                          api, pairs, fname, why));
    }
  }
  // The declared scalars; the rest are 0 on the device as in the simulator
  // (dsl::run_prologue_host), whatever the caller left in the struct.
  for (size_t j = 0; j < size_t(MK_FUSION_MAX_SCALARS); ++j)
    p.epi_scalars[j] = j < info->scalars.size() ? f.scalars[j] : 0.0;
  p.epi_row = row;
  p.fusion = fname;
}

// Everything that can be checked without the GPU: done at call time, also
// inside a group, so that errors point at the offending call.
Pending validate(const Call& k, std::shared_ptr<Comm> cp, cudaStream_t stream) {
  Comm* c = cp.get();
  const char* api = api_name_of(k.coll);
  c->check_serves(api);
  if (k.dtype < 0 || k.dtype >= mkNumTypes)
    fail(mkInvalidArgument, fmt::format("{}: datatype {} is not an mkDataType_t", api, k.dtype));
  const bool reduces = collective_reduces(k.coll);
  if (reduces && k.op < 0)
    fail(mkInvalidArgument, fmt::format("{}: reduction op {} is not an mkRedOp_t", api, k.op));
  // mkNumOps and above: a PreMulSum handle, looked up under the lock (check_locked).
  const bool rooted = collective_rooted(k.coll);
  if (rooted && (k.root < 0 || k.root >= c->nranks))
    fail(mkInvalidArgument, fmt::format("{}: root {} is not a rank of {}", api, k.root, c->nranks));
  // Rooted plans are built for root 0 and run relabelled (rank r plays r -
  // root); across nodes that keeps the machine's shape only for a root on a
  // node's first GPU (a shift by whole nodes). Other roots would need plans
  // of their own (not built yet): refused here rather than failing in the kernel.
  if (rooted && c->spans_network && c->topo.gpus_per_node > 1 && k.root % c->topo.gpus_per_node != 0)
    fail(mkInvalidUsage, fmt::format("{}: root {} across nodes: this build runs rooted collectives on a communicator "
                                     "spanning nodes only with a root on a node's first rank (a multiple of {}, "
                                     "the ranks per node)",
                                     api, k.root, c->topo.gpus_per_node));
  const DType dt = DType(k.dtype);
  const size_t es = dtype_size(dt);
  if (k.count > size_t(INT64_MAX) / es / size_t(c->nranks))
    fail(mkInvalidArgument, fmt::format("{}: count {} is too large", api, k.count));
  const size_t bytes = k.count * es;
  Pending p{};
  p.k = k;
  p.c = std::move(cp);
  p.stream = reinterpret_cast<CUstream>(stream);
  p.dt = dt;
  p.op = reduces ? (k.op >= mkNumOps ? RedOp::premulsum : RedOp(k.op)) : RedOp::sum;
  p.bytes = int64_t(bytes);
  p.in_bytes = size_t(input_blocks(k.coll, p.c->nranks)) * bytes;
  p.out_bytes = size_t(output_blocks(k.coll, p.c->nranks)) * bytes;
  p.need_send = has_input(k.coll, p.c->rank, k.root);
  p.need_recv = has_output(k.coll, p.c->rank, k.root);
  if (k.fusion) validate_fusion(p);  // count 0 too: a bad fusion is an error, its operands are not read
  if (k.count == 0) return p;
  const size_t in_bytes = p.in_bytes, out_bytes = p.out_bytes;
  const bool need_send = p.need_send, need_recv = p.need_recv;
  auto check_ptr = [&](const void* ptr, const char* what) {
    if (!ptr) fail(mkInvalidArgument, fmt::format("{}: {} is NULL (count {})", api, what, k.count));
    if (reinterpret_cast<uintptr_t>(ptr) % es != 0)
      fail(mkInvalidArgument, fmt::format("{}: {} {:p} is not aligned to its {}-byte element type {}", api, what, ptr,
                                          es, name(dt)));
  };
  if (need_send) check_ptr(k.send, "sendbuff");
  if (need_recv) check_ptr(k.recv, "recvbuff");
  if (need_send && need_recv) {
    const uintptr_t sp = reinterpret_cast<uintptr_t>(k.send), rp = reinterpret_cast<uintptr_t>(k.recv);
    const bool inplace = is_inplace_call(k.coll, sp, rp, c->rank, bytes);
    if (inplace_rule(k.coll) == InPlace::unsupported && sp == rp)
      fail(mkInvalidArgument, fmt::format("{}: in-place (sendbuff == recvbuff) is not supported", api));
    if (!inplace && overlaps(sp, in_bytes, rp, out_bytes))
      fail(mkInvalidArgument, fmt::format("{}: sendbuff and recvbuff overlap without being in-place (in-place "
                                          "means {})",
                                          api, inplace_condition(k.coll)));
  }
  return p;
}

// The buffer [ptr, ptr+bytes) must be memory of the communicator's GPU (or
// managed memory). Asked of the driver once per allocation: framework caching
// allocators hand out addresses inside a few big allocations. Caller holds
// c.mu.
void check_device_memory(Comm& c, const void* ptr, size_t bytes, const char* what, const char* api) {
  const uintptr_t x = reinterpret_cast<uintptr_t>(ptr);
  auto it = c.pointer_cache.upper_bound(x);
  if (it != c.pointer_cache.begin()) {
    --it;
    if (x >= it->first && x + bytes <= it->first + it->second.first && it->second.second == c.device) return;
  }
  CUmemorytype type = CUmemorytype(0);
  int ordinal = -1;
  CUdeviceptr start = 0;
  size_t size = 0;
  int managed = 0;
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                 CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                 CU_POINTER_ATTRIBUTE_IS_MANAGED};
  void* data[] = {&type, &ordinal, &start, &size, &managed};
  const CUresult r = cu().cuPointerGetAttributes(5, attrs, data, CUdeviceptr(x));
  if (r != CUDA_SUCCESS || type == 0)
    fail(mkInvalidArgument, fmt::format("{}: {} {:p} is not GPU memory (host memory from malloc/new? pass memory "
                                        "from cudaMalloc or a framework's GPU allocator)",
                                        api, what, ptr));
  if (type == CU_MEMORYTYPE_HOST && !managed)
    fail(mkInvalidArgument, fmt::format("{}: {} {:p} is pinned host memory (cudaMallocHost); collectives need GPU "
                                        "memory of the communicator's GPU",
                                        api, what, ptr));
  if (!managed && ordinal != c.device)
    fail(mkInvalidArgument, fmt::format("{}: {} {:p} is memory of GPU {}, but the communicator (rank {}) runs on GPU "
                                        "{}",
                                        api, what, ptr, ordinal, c.rank, c.device));
  if (size && x + bytes > uintptr_t(start) + size)
    fail(mkInvalidArgument, fmt::format("{}: {} needs {} bytes at {:p}, but its allocation ends {} bytes after it "
                                        "(count too large for the buffer?)",
                                        api, what, bytes, ptr, uintptr_t(start) + size - x));
  if (size) c.pointer_cache[uintptr_t(start)] = {size, managed ? c.device : ordinal};
}

}  // namespace

void check_scalar_pointer(Comm& c, const void* ptr, size_t bytes, const char* api) {
  if (reinterpret_cast<uintptr_t>(ptr) % bytes != 0)
    fail(mkInvalidArgument, fmt::format("{}: the device scalar {:p} is not aligned to its {}-byte type", api, ptr, bytes));
  std::lock_guard<std::mutex> lock(c.mu);
  check_device_memory(c, ptr, bytes, "the device scalar", api);
}

namespace {

// A PreMulSum call's op: live on this communicator, of the call's dtype; its
// scalar is taken now (a call keeps it, whatever happens to the op later).
// Caller holds c->mu.
void resolve_premul_locked(Pending& p) {
  if (p.op != RedOp::premulsum) return;
  Comm* c = p.c.get();
  const char* api = api_name_of(p.k.coll);
  const Comm::PreMul* found = c->premul(p.k.op);
  if (!found)
    fail(mkInvalidArgument, fmt::format("{}: reduction op {} is neither a built-in mkRedOp_t nor a PreMulSum op of "
                                        "this communicator (destroyed, or created on another communicator?)",
                                        api, p.k.op));
  const Comm::PreMul& m = *found;
  if (m.dtype != p.dt)
    fail(mkInvalidArgument, fmt::format("{}: PreMulSum op {} was created for {}, but the call's datatype is {}", api,
                                        p.k.op, name(m.dtype), name(p.dt)));
  p.prescale = m.value;
  p.prescale_ptr = m.ptr;
}

// The checks that read communicator state; caller holds c->mu.
void check_locked(Pending& p) {
  Comm* c = p.c.get();
  const Call& k = p.k;
  const char* api = api_name_of(k.coll);
  resolve_premul_locked(p);
  if (p.need_send) check_device_memory(*c, k.send, p.in_bytes, "sendbuff", api);
  if (p.need_recv) check_device_memory(*c, k.recv, p.out_bytes, "recvbuff", api);
  for (size_t j = 0; j < size_t(dsl::kMaxOperands); ++j)
    if (p.epi_ops[j])
      check_device_memory(*c, p.epi_ops[j], p.epi_bytes[j], fmt::format("fusion->operands[{}]", j).c_str(), api);
  // Zero-copy kernels read peers' inputs, whose scalars only their owners
  // have: PreMulSum calls always go through scratch.
  // Fused calls neither: the epilogue needs every peer out of this rank's buffers.
  if (!c->regs.by_base.empty() && p.op != RedOp::premulsum && p.fusion.empty()) {
    Comm::ZcCall z;
    bool all = true;  // every buffer of the call is registered
    if (p.need_send)
      all &= (z.in_window = check_registered(*c, k.send, p.in_bytes, "sendbuff", api, &z.in_offset)) >= 0;
    if (p.need_recv)
      all &= (z.out_window = check_registered(*c, k.recv, p.out_bytes, "recvbuff", api, &z.out_offset)) >= 0;
    if (all && zero_copy_enabled() &&
        zero_copy_pays(k.coll, c->topo, p.bytes, int64_t(std::max(p.in_bytes, p.out_bytes)))) {
      z.in_bytes = int64_t(p.in_bytes);
      z.out_bytes = int64_t(p.out_bytes);
      z.call_sig = uint64_t(k.coll) | uint64_t(p.dt) << 8 | uint64_t(p.op) << 16 |
                   uint64_t(uint32_t(collective_rooted(k.coll) ? k.root : 0)) << 32;
      p.zc = true;
      p.zcc = z;
    }
  }
  // The stream must belong to the communicator's GPU (checked once per stream).
  if (p.stream != c->checked_stream || special_stream(p.stream)) {
    std::unique_ptr<CtxGuard> g;
    if (special_stream(p.stream)) g = std::make_unique<CtxGuard>(c->ctx);
    CUcontext sctx = nullptr;
    CUresult r = cu().cuStreamGetCtx(p.stream, &sctx);
    if (r != CUDA_SUCCESS) fail(mkInvalidArgument, std::string(api) + ": invalid stream: " + cu_error_string(r));
    if (sctx != c->ctx) {
      CUdevice sd = -1;
      CUcontext keep = nullptr;
      cu().cuCtxGetCurrent(&keep);
      cu().cuCtxSetCurrent(sctx);
      cu().cuCtxGetDevice(&sd);
      cu().cuCtxSetCurrent(keep);
      fail(mkInvalidArgument, fmt::format("{}: the stream belongs to GPU {}, the communicator (rank {}) to GPU {}",
                                          api, int(sd), c->rank, c->device));
    }
    if (!special_stream(p.stream)) c->checked_stream = p.stream;
  }
}

// Finds (or, first time, creates) the plan instance. Creation loads code and
// allocates, never on the caller's stream, so it also works on the first call
// inside graph capture. It must happen before any kernel of the same group is
// launched. Caller holds c->mu.
PlanInstance& resolve_locked(Pending& p) {
  return p.c->instance(p.k.coll, p.dt, p.op, p.bytes, p.zc, p.fusion, p.schedule);
}

// What every launch does first: refuse a closing communicator, order this
// communicator's work across streams. Returns whether the stream is eager
// (not capturing) and its id. Caller holds c->mu.
struct LaunchStart {
  bool eager = true;
  unsigned long long sid = 0;
};
LaunchStart start_locked(Pending& p) {
  Comm& c = *p.c;
  const char* api = api_name_of(p.k.coll);
  if (c.closing.load()) fail(mkInvalidUsage, std::string(api) + ": the communicator was aborted or destroyed");
  if (c.ce_issuing)
    fail(mkInvalidUsage, fmt::format("{}: another thread's mkGroupEnd is still issuing a copy-engine call of this "
                                     "communicator; calls on one communicator must not race (as with NCCL)",
                                     api));
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  MK_CU(cu().cuStreamIsCapturing(p.stream, &capture), std::string(api) + ": querying the stream's capture status");
  LaunchStart ls;
  ls.eager = capture == CU_STREAM_CAPTURE_STATUS_NONE;
  // One communicator's kernels must not overlap: a launch on another stream
  // waits for the previous one (done_event is valid even if that stream is
  // gone). Streams are told apart by their id, not their handle:
  // cudaStreamPerThread names another stream on every thread, and a
  // destroyed stream's handle may come back for a new stream.
  if (ls.eager) MK_CU(cu().cuStreamGetId(p.stream, &ls.sid), std::string(api) + ": querying the stream");
  if (ls.eager && c.used && ls.sid != c.last_stream_id)
    MK_CU(cu().cuStreamWaitEvent(p.stream, c.done_event, 0), "ordering streams");
  return ls;
}

// What every launch does last. Caller holds c->mu.
void finish_locked(Pending& p, PlanInstance& inst, const LaunchStart& ls) {
  Comm& c = *p.c;
  res_of(p, inst)->last.store(&inst);
  if (ls.eager) {
    // Destroy, finalize and deregistration wait for this event, not for the
    // whole device.
    MK_CU(cu().cuEventRecord(c.done_event, p.stream), std::string(api_name_of(p.k.coll)) + ": recording completion");
    c.last_stream_id = ls.sid;
    c.used = true;
  }
}

std::unique_ptr<ce::Issue> ce_issue(Pending& p, PlanInstance& inst, const LaunchStart& ls) {
  return std::make_unique<ce::Issue>(*p.c, inst, p.k.coll, p.dt, p.op, p.k.root, p.bytes, p.k.send, p.k.recv,
                                     p.stream, !ls.eager);
}

// One call's kernel arguments. Caller holds p.c->mu.
dev::Args call_args(const Pending& p, const PlanInstance& inst) {
  // Counted in the plan's elements: a collective that only moves data runs
  // its element size's plan (kernel_dtype) or one compiled for the call's
  // own type (MK_PLAN_DIR), of the call's element size either way.
  const size_t es = dtype_size(inst.plan->dtype);
  MK_CHECK(size_t(p.bytes) % es == 0, "a plan whose element does not divide the call's bytes");
  dev::Args a = p.c->args(inst, p.k.send, p.k.recv, int64_t(size_t(p.bytes) / es), p.k.root, int32_t(es), p.zcc, p.res);
  a.prescale = p.prescale;
  a.prescale_ptr = p.prescale_ptr;
  for (int j = 0; j < dsl::kMaxOperands; ++j) a.epi_ops[j] = p.epi_ops[j];
  for (int j = 0; j < dsl::kMaxScalars; ++j) a.epi_scalars[j] = p.epi_scalars[j];
  a.epi_row = p.epi_row;
  return a;
}

// Launches `fn` with the one parameter at `param`; `pdl`: the kernel allows
// programmatic dependent launch (plan::Kernel::pdl).
void launch_kernel(CUfunction fn, unsigned grid, unsigned threads, CUstream stream, void* param, bool pdl,
                   const char* api) {
  void* params[] = {param};
  CUresult r;
  if (pdl && pdl_enabled() && cu().cuLaunchKernelEx) {
    // Programmatic dependent launch: the kernel may be scheduled as soon as
    // the previous kernel of the stream has let its blocks go; it waits for
    // that kernel's completion (griddepcontrol.wait) before touching memory.
    CUlaunchAttribute attr{};
    attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    CUlaunchConfig cfg{};
    cfg.gridDimX = grid;
    cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = threads;
    cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.sharedMemBytes = 0;
    cfg.hStream = stream;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    r = cu().cuLaunchKernelEx(&cfg, fn, params, nullptr);
  } else {
    r = cu().cuLaunchKernel(fn, grid, 1, 1, threads, 1, 1, 0, stream, params, nullptr);
  }
  if (r != CUDA_SUCCESS) fail(mkUnhandledCudaError, std::string(api) + ": kernel launch failed: " + cu_error_string(r));
}

// Caller holds c->mu.
void launch_locked(Pending& p, PlanInstance& inst) {
  Comm& c = *p.c;
  const char* api = api_name_of(p.k.coll);
  std::unique_ptr<CtxGuard> g;
  if (special_stream(p.stream)) g = std::make_unique<CtxGuard>(c.ctx);
  const LaunchStart ls = start_locked(p);
  if (inst.ce) {
    auto issue = ce_issue(p, inst, ls);
    try {
      while (issue->step()) {
      }
    } catch (...) {
      try {
        finish_locked(p, inst, ls);  // the completion event covers what was issued
      } catch (...) {
      }
      throw;
    }
    finish_locked(p, inst, ls);
    return;
  }
  const plan::Kernel& kern = *inst.kernel;
  dev::Args a = call_args(p, inst);
  // A fused call of many rows: the collective kernel skips its tail and the
  // plan's epilogue kernel, on every SM, follows it (the collective's grid is
  // sized for the collective; its tail pays off while each of its blocks has
  // a row or two). MK_FUSED_EPILOGUE=tail|kernel forces one (measurements).
  bool epi_kernel = false;
  int64_t rows = 0;
  if (!p.fusion.empty()) {
    rows = (int64_t(p.k.count) + p.epi_row - 1) / p.epi_row;
    static const std::string mode = env::raw("MK_FUSED_EPILOGUE").value_or("auto");
    if (mode != "auto" && mode != "tail" && mode != "kernel")
      fail(mkInvalidUsage, fmt::format("{}: MK_FUSED_EPILOGUE={} is not auto, tail or kernel", api, mode));
    epi_kernel = inst.fn_epi && (mode == "kernel" || (mode != "tail" && rows > 2 * int64_t(kern.grid)));
    a.epi_mode = epi_kernel ? 1 : 0;
  }
  auto go = [&](CUfunction fn, unsigned grid, unsigned threads) {
    launch_kernel(fn, grid, threads, p.stream, &a, kern.pdl, api);
  };
  go(inst.fn, unsigned(kern.grid), unsigned(kern.threads));
  if (epi_kernel) {
    // up to 4 blocks per SM; each takes rows grid apart
    const int64_t cap = int64_t(std::max(c.sms, 1)) * 4;
    try {
      go(inst.fn_epi, unsigned(std::min(rows, cap)), unsigned(kern.threads));
    } catch (...) {
      try {
        finish_locked(p, inst, ls);  // the completion event covers the collective launched
      } catch (...) {
      }
      throw;
    }
  }
  finish_locked(p, inst, ls);
}

}  // namespace

void enqueue(const Call& k, mkComm_t comm, cudaStream_t stream) {
  std::shared_ptr<Comm> c = acquire(comm);
  Pending p = validate(k, c, stream);
  if (k.schedule && *k.schedule) {
    // A composite's stage runs the schedule it names, through scratch (the
    // zero-copy plans are the tables' registered entries).
    p.schedule = k.schedule;
    p.k.schedule = nullptr;
    p.zc = false;
    p.zcc = Comm::ZcCall{};
  }
  if (k.count == 0) {  // nothing to do, but a bad op handle is still an error
    std::lock_guard<std::mutex> lock(c->mu);
    resolve_premul_locked(p);
    return;
  }
  std::lock_guard<std::mutex> lock(c->mu);  // the one lock of the hot path
  check_locked(p);
  if (t_group.depth > 0) {
    p.weak = p.c;
    p.c.reset();
    t_group.pending.push_back(std::move(p));
    return;
  }
  PlanInstance& inst = resolve_locked(p);
  launch_locked(p, inst);
}

namespace {

// A run of a group's calls on one communicator launched as one group kernel
// (codegen group_source): calls [begin, end) of the communicator's calls.
struct FusedRun {
  size_t end = 0;
  GroupKernel* gk = nullptr;
  int64_t grid = 0;
  int32_t threads = 0;
};

// Whether call p can be part of a group kernel: a kernel of its own (not the
// copy engines), no fused epilogue (its tail barrier uses the word that
// chains calls), not zero-copy (its entry and exit speak with peers' whole
// kernels), and a source generated with a body function (plans of older
// mkc versions in MK_PLAN_DIR have none).
bool groupable(const Pending& p, const PlanInstance& inst) {
  return !inst.ce && p.fusion.empty() && !p.zc && !inst.plan->zero_copy && inst.kernel &&
         inst.kernel->source.find(inst.kernel->name + "_body(") != std::string::npos;
}

// [x, x+n) and [y, y+m) share a byte.
bool touch(const void* x, size_t n, const void* y, size_t m) {
  return x && y && n && m && overlaps(reinterpret_cast<uintptr_t>(x), n, reinterpret_cast<uintptr_t>(y), m);
}

// Calls a and b of a group may run at the same time: neither writes what the
// other reads or writes (one launch per call would order them).
bool independent(const Pending& a, const Pending& b) {
  const void* ai = a.need_send ? a.k.send : nullptr;
  const void* ao = a.need_recv ? a.k.recv : nullptr;
  const void* bi = b.need_send ? b.k.send : nullptr;
  const void* bo = b.need_recv ? b.k.recv : nullptr;
  return !touch(ao, a.out_bytes, bi, b.in_bytes) && !touch(ao, a.out_bytes, bo, b.out_bytes) &&
         !touch(bo, b.out_bytes, ai, a.in_bytes);
}

// Splits one communicator's calls of a group (`idx`, in group order) into
// runs that each become one group kernel, keyed by their first position.
// A run is consecutive calls: every rank then still completes the group's
// calls in an order compatible with the group's (calls of a run at once,
// runs in turn), whichever runs it fuses, so ranks need not agree on it.
// Calls that share scratch and flags (one plan's kernel, or kernels of one
// resource set), and calls that touch a buffer an earlier call of the run
// writes (or write one it reads), form a lane: they run one after another on
// the same blocks, in group order, as separate launches would. Lanes run side
// by side; a call with no room for a lane of its own joins the lane it
// widens least. A run ends where the next call would need more blocks than
// the rank may keep resident even so, where its stream or block size differs,
// where it would join two lanes at once, or at a call that cannot take part. `force`:
// fuse whatever MK_GROUP_FUSE says (mkCompositeRun). Caller holds c.mu.
std::map<size_t, FusedRun> plan_fusion(Comm& c, const std::vector<Pending>& calls,
                                       const std::vector<PlanInstance*>& inst, const std::vector<size_t>& idx,
                                       bool force) {
  std::map<size_t, FusedRun> out;
  const int mode = force ? 1 : env::group_fuse();  // read each time: tests change it
  if (mode == 0 || idx.size() < 2) return out;
  const int64_t cap = c.grid_cap() > 0 ? c.grid_cap() : c.sms > 0 ? c.sms : int64_t(1) << 30;
  size_t j = 0;
  while (j < idx.size()) {
    std::vector<int64_t> lane_grid;  // blocks of each lane: its largest member's
    std::vector<int32_t> lane_of;    // per call of the run
    int64_t grid = 0;
    size_t e = j;
    for (; e < idx.size(); ++e) {
      const Pending& p = calls[idx[e]];
      const PlanInstance& pi = *inst[idx[e]];
      if (!groupable(p, pi)) break;
      if (e > j) {
        const Pending& p0 = calls[idx[j]];
        if (p.stream != p0.stream || pi.kernel->threads != inst[idx[j]]->kernel->threads ||
            e - j == size_t(dev::kMaxGroupMembers))
          break;
      }
      int32_t lane = -1;  // the one lane this call must join, if any
      bool two = false;
      for (size_t q = j; q < e && !two; ++q) {
        const bool bound = res_of(calls[idx[q]], *inst[idx[q]]) == res_of(p, pi) || !independent(calls[idx[q]], p);
        if (!bound || lane == lane_of[q - j]) continue;
        two = lane >= 0;
        lane = lane_of[q - j];
      }
      if (two) break;
      if (lane < 0 && e > j && grid + pi.kernel->grid > cap) {
        // No room for a lane of its own: after the calls of the lane it
        // widens least (any lane keeps group order; a chain barrier instead
        // of a launch boundary).
        int64_t least = -1;
        for (size_t q = 0; q < lane_grid.size(); ++q) {
          const int64_t widen = std::max<int64_t>(0, pi.kernel->grid - lane_grid[q]);
          if (least < 0 || widen < least) least = widen, lane = int32_t(q);
        }
      }
      const int64_t more = lane < 0 ? pi.kernel->grid : std::max<int64_t>(0, pi.kernel->grid - lane_grid[size_t(lane)]);
      if (e > j && grid + more > cap) break;
      grid += more;
      if (lane < 0) {
        lane = int32_t(lane_grid.size());
        lane_grid.push_back(pi.kernel->grid);
      } else {
        lane_grid[size_t(lane)] += more;
      }
      lane_of.push_back(lane);
    }
    if (e == j) {  // a call that cannot take part
      ++j;
      continue;
    }
    if (e - j >= 2) {
      const int32_t threads = inst[idx[j]]->kernel->threads;
      std::string key = std::to_string(threads);
      std::vector<codegen::GroupMember> members;
      for (size_t q = j; q < e; ++q) {
        const PlanInstance& pi = *inst[idx[q]];
        key += fmt::format("|{}@{}", static_cast<const void*>(&pi), lane_of[q - j]);
        members.push_back({pi.kernel->source, pi.kernel->name, pi.kernel->grid, lane_of[q - j]});
      }
      auto seen = c.plans.group_seen.find(key);
      if (seen == c.plans.group_seen.end() && c.plans.group_seen.size() < 4096)
        seen = c.plans.group_seen.emplace(key, 0).first;
      const int times = seen == c.plans.group_seen.end() ? 1 : ++seen->second;
      if (mode == 1 || times >= 2) {
        GroupKernel& gk = c.group_kernel(key, members, threads, grid);
        if (gk.fn) out[j] = FusedRun{e, &gk, grid, threads};
      }
    }
    j = e;
  }
  return out;
}

// Launches calls idx[b, run.end) as one group kernel. Caller holds their
// communicator's mu.
void launch_group_locked(std::vector<Pending>& calls, const std::vector<PlanInstance*>& inst,
                         const std::vector<size_t>& idx, size_t b, const FusedRun& run) {
  Pending& p0 = calls[idx[b]];
  const char* api = "mkGroupEnd";
  std::unique_ptr<CtxGuard> g;
  if (special_stream(p0.stream)) g = std::make_unique<CtxGuard>(p0.c->ctx);
  const LaunchStart ls = start_locked(p0);
  const size_t n = run.end - b;
  std::vector<uint64_t> blob((dev::group_args_bytes(int(n)) + 7) / 8, 0);
  blob[0] = n;
  auto* a = reinterpret_cast<dev::Args*>(reinterpret_cast<char*>(blob.data()) + 16);
  bool pdl = true;
  for (size_t q = 0; q < n; ++q) {
    a[q] = call_args(calls[idx[b + q]], *inst[idx[b + q]]);
    pdl = pdl && inst[idx[b + q]]->kernel->pdl;
  }
  try {
    launch_kernel(run.gk->fn, unsigned(run.grid), unsigned(run.threads), p0.stream, blob.data(), pdl, api);
  } catch (...) {
    try {
      finish_locked(p0, *inst[idx[b]], ls);
    } catch (...) {
    }
    throw;
  }
  for (size_t q = 0; q + 1 < n; ++q) res_of(calls[idx[b + q]], *inst[idx[b + q]])->last.store(inst[idx[b + q]]);
  finish_locked(calls[idx[run.end - 1]], *inst[idx[run.end - 1]], ls);
}

}  // namespace

void group_start() { ++t_group.depth; }

void group_fuse_all() {
  if (t_group.depth > 0) t_group.fuse = true;
}

bool group_open() { return t_group.depth > 0; }

void group_defer(std::function<void()> wait) { t_group.deferred.push_back(std::move(wait)); }

void group_fail(mkResult_t code, const std::string& why) {
  if (t_group.depth > 0 && t_group.failed == mkSuccess) {
    t_group.failed = code;
    t_group.why = why;
  }
}

// The plan instances of a group's `missing` calls (a first call compiles
// and loads: up to seconds). Calls of different communicators (ranks of one
// process driven by one thread, as an ncclGroupStart/End loop over GPUs does)
// are resolved side by side, each communicator's in group order on one
// worker: every rank's plan (a one-pass kernel has one per rank) compiles at
// once, not one after another. The first failure in group order is thrown,
// after every worker has returned.
void resolve_all(std::vector<Pending>& calls, const std::vector<size_t>& missing, std::vector<PlanInstance*>& inst) {
  std::vector<std::vector<size_t>> by_comm;  // in order of first appearance
  {
    std::map<const Comm*, size_t> slot;
    for (size_t i : missing) {
      auto [it, fresh] = slot.emplace(calls[i].c.get(), by_comm.size());
      if (fresh) by_comm.emplace_back();
      by_comm[it->second].push_back(i);
    }
  }
  std::vector<std::exception_ptr> error(calls.size());
  auto work = [&](const std::vector<size_t>& mine) {
    for (size_t i : mine) {
      try {
        Pending& p = calls[i];
        p.c->check_usable(api_name_of(p.k.coll));
        std::lock_guard<std::mutex> lock(p.c->mu);
        inst[i] = &resolve_locked(p);
      } catch (...) {
        error[i] = std::current_exception();
        return;  // this communicator's later calls are not tried
      }
    }
  };
  if (by_comm.size() <= 1) {
    for (const auto& mine : by_comm) work(mine);
  } else {
    const size_t nworkers =
        std::min(by_comm.size(), size_t(std::max(2u, std::min(std::thread::hardware_concurrency(), 64u))));
    std::atomic<size_t> next{0};
    std::vector<std::thread> workers;
    workers.reserve(nworkers);
    auto loop = [&] {
      for (size_t k; (k = next.fetch_add(1)) < by_comm.size();) work(by_comm[k]);
    };
    try {
      for (size_t w = 1; w < nworkers; ++w) workers.emplace_back(loop);
    } catch (...) {
      // no more threads: the ones made (and this one) take the rest
    }
    loop();
    for (auto& t : workers) t.join();
  }
  for (size_t i : missing)
    if (error[i]) std::rethrow_exception(error[i]);
}

void group_end() {
  if (t_group.depth == 0) fail(mkInvalidUsage, "mkGroupEnd without mkGroupStart");
  if (--t_group.depth > 0) return;
  const bool fuse = std::exchange(t_group.fuse, false);
  std::vector<Pending> calls;
  calls.swap(t_group.pending);
  std::vector<std::function<void()>> deferred;
  deferred.swap(t_group.deferred);
  mkResult_t failed = std::exchange(t_group.failed, mkSuccess);
  std::string why = std::move(t_group.why);
  // Splits of the group first (every one, even after a failure: they run on
  // other threads and must end before the group does).
  for (auto& wait : deferred) {
    try {
      wait();
    } catch (const RtError& e) {
      if (failed == mkSuccess) {
        failed = e.code();
        why = e.what();
      }
    }
  }
  if (failed != mkSuccess)
    fail(failed, fmt::format("mkGroupEnd: a call of the group failed, so none of its {} other call(s) was launched: {}",
                             calls.size(), why));
  // First every plan instance (code loads and allocations may wait for
  // running kernels), then every launch: kernels of one group wait for
  // each other, so none may be launched before all can be.
  for (auto& p : calls) {
    p.c = p.weak.lock();
    if (!p.c || p.c->closing.load())
      fail(mkInvalidUsage, fmt::format("mkGroupEnd: a communicator of the group was destroyed or aborted before "
                                       "mkGroupEnd; none of the group's {} call(s) was launched",
                                       calls.size()));
  }
  std::vector<PlanInstance*> inst(calls.size(), nullptr);
  std::vector<size_t> missing;  // calls whose plan instance does not exist yet
  for (size_t i = 0; i < calls.size(); ++i) {
    Pending& p = calls[i];
    p.c->check_usable(api_name_of(p.k.coll));
    std::lock_guard<std::mutex> lock(p.c->mu);
    inst[i] = p.c->find(p.k.coll, p.dt, p.op, p.bytes, p.zc, p.fusion, p.schedule);
    if (!inst[i]) missing.push_back(i);
  }
  resolve_all(calls, missing, inst);
  // A group's repeated calls of one plan take copies of its resources in
  // turn (copy k of the k-th call, modulo kResourceCopies): a group kernel
  // then runs them side by side instead of one after another. Chosen by
  // position in the group, whether or not this rank fuses anything, so every
  // rank uses the same copy for the same call.
  {
    std::map<std::pair<const Comm*, const Resources*>, int> seen;
    for (size_t i = 0; i < calls.size(); ++i) {
      Pending& p = calls[i];
      PlanInstance& pi = *inst[i];
      if (pi.ce || !pi.kernel || !pi.res || p.zc || pi.plan->zero_copy || !p.fusion.empty()) continue;
      const int copy = seen[{p.c.get(), pi.res}]++ % kResourceCopies;
      if (copy == 0) continue;
      std::lock_guard<std::mutex> lock(p.c->mu);
      p.res = p.c->resource_copy(pi, copy);
    }
  }
  for (auto& p : calls) p.c->check_usable(api_name_of(p.k.coll));
  // In group order per communicator; across communicators in turn, one step
  // at a time: a kernel is one step, a copy-engine call (ce::Issue) one per
  // tile and side. A driver that runs work as it is enqueued (the tests'
  // fake) then never waits for a peer's work that was not issued yet.
  struct Lane {
    std::vector<size_t> calls;
    size_t next = 0;
    std::unique_ptr<ce::Issue> ce;
    LaunchStart ls;
    std::map<size_t, FusedRun> fused;  // group kernels, by the position of their first call
  };
  std::vector<Lane> lanes;
  // A lane in the middle of a copy-engine call marks its communicator (so
  // that no other thread's call interleaves) until the call is issued or fails.
  auto end_lane_call = [&](Lane& lane, bool ok) {
    Pending& p = calls[lane.calls[lane.next]];
    p.c->ce_issuing = false;
    if (!ok) {
      try {
        finish_locked(p, *inst[lane.calls[lane.next]], lane.ls);
      } catch (...) {
      }
    }
  };
  {
    std::vector<Comm*> order;
    for (size_t i = 0; i < calls.size(); ++i) {
      auto it = std::find(order.begin(), order.end(), calls[i].c.get());
      if (it == order.end()) {
        order.push_back(calls[i].c.get());
        lanes.emplace_back();
        it = order.end() - 1;
      }
      lanes[size_t(it - order.begin())].calls.push_back(i);
    }
  }
  for (Lane& lane : lanes) {
    Comm& c = *calls[lane.calls[0]].c;
    std::lock_guard<std::mutex> lock(c.mu);
    lane.fused = plan_fusion(c, calls, inst, lane.calls, fuse);
  }
  size_t launched = 0;  // calls issued completely
  bool any = false;      // anything issued (peers may wait for the rest)
  try {
    for (bool busy = true; busy;) {
      busy = false;
      for (Lane& lane : lanes) {
        if (lane.next == lane.calls.size()) continue;
        busy = true;
        Pending& p = calls[lane.calls[lane.next]];
        PlanInstance& pi = *inst[lane.calls[lane.next]];
        std::lock_guard<std::mutex> lock(p.c->mu);
        if (auto f = lane.fused.find(lane.next); f != lane.fused.end()) {
          any = true;
          launch_group_locked(calls, inst, lane.calls, lane.next, f->second);
          launched += f->second.end - lane.next;
          lane.next = f->second.end;
          continue;
        }
        if (!pi.ce) {
          launch_locked(p, pi);
          any = true;
          ++launched;
          ++lane.next;
          continue;
        }
        std::unique_ptr<CtxGuard> g;
        if (special_stream(p.stream)) g = std::make_unique<CtxGuard>(p.c->ctx);
        if (!lane.ce) {
          lane.ls = start_locked(p);
          lane.ce = ce_issue(p, pi, lane.ls);
          p.c->ce_issuing = true;
        }
        any = true;
        bool more = false;
        try {
          more = lane.ce->step();
        } catch (...) {
          end_lane_call(lane, false);
          lane.ce.reset();
          throw;
        }
        if (more) continue;
        end_lane_call(lane, true);
        finish_locked(p, pi, lane.ls);
        lane.ce.reset();
        ++launched;
        ++lane.next;
      }
    }
  } catch (const RtError& e) {
    // Lanes in the middle of a copy-engine call: free their communicators.
    for (Lane& lane : lanes)
      if (lane.ce) {
        std::lock_guard<std::mutex> lock(calls[lane.calls[lane.next]].c->mu);
        end_lane_call(lane, false);
      }
    // Part of the group runs and waits for the rest, which never comes: stop
    // it now, on every communicator of the group, and make that sticky.
    if (any)
      for (auto& p : calls) {
        p.c->set_error(e.code(), fmt::format("mkGroupEnd launched {} of the group's {} calls, then failed: {}; the "
                                             "communicator is unusable, call mkCommAbort",
                                             launched, calls.size(), e.what()));
        p.c->raise_abort();
      }
    throw;
  }
}

}  // namespace mk::rt
