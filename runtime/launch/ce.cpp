// The copy-engine protocol as data (ce.hpp). The order below is the issue
// order; the fake driver runs it as one sequence per process, which is why a
// slot is reused three tiles later, not two (see program()).
#include "runtime/launch/ce.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "compiler/jit/jit.hpp"
#include "compiler/passes/passes.hpp"
#include "mk/dsl.hpp"
#include "runtime/comm/comm.hpp"
#include "runtime/driver/cuda_driver.hpp"
#include "runtime/comm/env.hpp"
#include "runtime/api/status.hpp"
#include "templates/copy_engine.cuh"

namespace mk::rt {
namespace ce {

bool supports(Collective coll) {
  return coll == Collective::allgather || coll == Collective::alltoall || coll == Collective::broadcast ||
         coll == Collective::reducescatter || coll == Collective::allreduce;
}

std::string sync_source() { return "#define MK_CE_KERNEL 1\n#include \"copy_engine.cuh\"\n"; }

std::string reduce_source(DType dt, RedOp op, std::string* name) {
  *name = fmt::format("mk_ce_reduce_{}_{}", mk::name(dt), mk::name(op));
  return fmt::format("#define MK_CE_REDUCE_T {}\n#define MK_CE_REDUCE_K {}\n#define MK_CE_REDUCE_NAME {}\n"
                     "#include \"copy_engine.cuh\"\n",
                     dtype_device_name(dt), int(op), *name);
}

int64_t default_tile(int32_t nranks) {
  const int64_t mib = int64_t(1) << 20;
  const int64_t per = (int64_t(64) << 20) / (int64_t(std::max(nranks, 1)) * kSlots) / mib * mib;
  return std::clamp(per, mib, 16 * mib);
}

int64_t scratch_bytes(int32_t nranks, int64_t tile) { return int64_t(nranks) * kSlots * tile; }

int64_t slot_offset(int32_t from, int32_t slot, int64_t tile) { return (int64_t(from) * kSlots + slot) * tile; }

std::vector<int32_t> peers(Collective coll, int32_t nranks, int32_t rank, int32_t root, int side) {
  std::vector<int32_t> v;
  if (coll == Collective::broadcast) {
    if (side == 0 && rank == root)
      for (int32_t d = 1; d < nranks; ++d) v.push_back((rank + d) % nranks);
    if (side == 1 && rank != root) v.push_back(root);
    return v;
  }
  // The others: everyone, starting from the next rank (so that at each
  // moment the ranks write to different peers).
  for (int32_t d = 1; d < nranks; ++d) v.push_back(side == 0 ? (rank + d) % nranks : (rank - d + nranks) % nranks);
  return v;
}

int64_t chunk_offset(int64_t count, int32_t nranks, int32_t q, int32_t elem) {
  const int64_t per = (count + nranks - 1) / nranks;
  return std::min(count, per * q) * elem;
}

namespace {

// A region of this rank's buffers and its length.
struct Block {
  Loc loc;
  int64_t bytes = 0;
};

// One phase: tiles through peers' scratch, each received tile copied out
// (`reduce` false) or all of them reduced with this rank's own block into
// `red_dst` (`reduce` true).
struct Phase {
  std::vector<int32_t> to, from;
  std::vector<Block> send;  // [peer]: what goes to each peer of `to`
  std::vector<Block> recv;  // [peer]: where each peer of `from`'s data goes (copy phases)
  bool own_copy = false;    // copy phases: own_src -> own_dst first
  Block own_src, own_dst;
  bool reduce = false;
  Block red_own, red_dst;   // reduce phases: this rank's contribution and the result
  int32_t only = -1;        // receive-side syncs: one peer (broadcast's root)
};

void emit(std::vector<Op>& ops, int32_t& step, const Shape& s, const Phase& ph) {
  const int64_t T = std::max<int64_t>(1, s.tile);
  int64_t longest = ph.reduce ? ph.red_dst.bytes : 0;
  for (int32_t p : ph.to) longest = std::max(longest, ph.send[size_t(p)].bytes);
  for (int32_t q : ph.from) longest = std::max(longest, ph.recv[size_t(q)].bytes);
  if (ph.own_copy) longest = std::max(longest, ph.own_dst.bytes);
  if (longest <= 0) return;
  const int32_t tiles = int32_t((longest + T - 1) / T);
  auto add = [&](Op o) {
    o.step = step;
    ops.push_back(o);
  };
  auto sync = [&](int8_t stream, bool bump, bool wait, int64_t delta, int32_t tile) {
    Op o;
    o.kind = Op::sync;
    o.stream = stream;
    o.bump = bump;
    o.wait = wait;
    o.delta = delta;
    o.tile = tile;
    if (stream == 1) o.only = ph.only;
    add(o);
  };
  auto copy = [&](int8_t stream, Loc dst, Loc src, int64_t bytes) {
    if (bytes <= 0) return;
    Op o;
    o.kind = Op::copy;
    o.stream = stream;
    o.dst = dst;
    o.src = src;
    o.bytes = bytes;
    add(o);
  };
  auto at = [](Loc l, int64_t off) {
    l.offset += off;
    return l;
  };
  auto part = [&](int64_t bytes, int32_t t) { return std::clamp<int64_t>(bytes - int64_t(t) * T, 0, T); };
  const int32_t first = step;
  // Slots restart at 0 in every phase: first, every tile shipped before must
  // have been consumed.
  if (!ph.to.empty()) sync(0, false, true, 0, 0);
  // The rank's own block, on the receive stream (next to the first tiles).
  if (ph.own_copy) copy(1, ph.own_dst.loc, ph.own_src.loc, ph.own_dst.bytes);
  for (int32_t t = 0; t < tiles; ++t) {
    const int32_t slot = t % kSlots;
    step = first + 2 * t + 1;
    if (!ph.to.empty()) {
      for (int32_t p : ph.to)
        copy(0, {Loc::scratch, p, slot_offset(s.rank, slot, T)}, at(ph.send[size_t(p)].loc, int64_t(t) * T),
             part(ph.send[size_t(p)].bytes, t));
      // Tile t shipped. Before tile t+1 goes into slot (t+1) % kSlots, its
      // previous tile (t+1-kSlots) must have been consumed: shipped is
      // now t+1 (plus earlier calls), so consumed >= shipped + 1 - kSlots.
      const bool reuse = t + 1 < tiles && t + 1 >= kSlots;
      sync(0, true, reuse, 1 - kSlots, t);
    }
    step = first + 2 * t + 2;
    // Tile t-1 consumed (from the second tile on); tile t there?
    if (!ph.from.empty()) sync(1, t > 0, true, 1, t);
    if (ph.reduce || !ph.from.empty()) {
      // (A reduction with no peer, one rank, still writes its output.)
      if (ph.reduce) {
        Op o;
        o.kind = Op::reduce;
        o.stream = 1;
        o.dst = at(ph.red_dst.loc, int64_t(t) * T);
        o.src = at(ph.red_own.loc, int64_t(t) * T);
        o.bytes = part(ph.red_dst.bytes, t);
        o.slot = slot;
        o.tile = t;
        if (o.bytes > 0) add(o);
      } else {
        for (int32_t q : ph.from)
          copy(1, at(ph.recv[size_t(q)].loc, int64_t(t) * T), {Loc::scratch, s.rank, slot_offset(q, slot, T)},
               part(ph.recv[size_t(q)].bytes, t));
      }
    }
  }
  step = first + 2 * tiles + 1;
  if (!ph.from.empty()) sync(1, true, false, 0, tiles - 1);  // the last tile consumed
  ++step;
}

}  // namespace

std::vector<Op> program(const Shape& s, int32_t* steps) {
  std::vector<Op> ops;
  if (steps) *steps = 0;
  const int64_t B = s.bytes;
  if (B <= 0) return ops;
  const int32_t n = s.nranks, r = s.rank;
  int32_t step = 0;
  Phase ph;
  ph.send.resize(size_t(n));
  ph.recv.resize(size_t(n));
  auto in = [](int64_t off) { return Loc{Loc::input, 0, off}; };
  auto out = [](int64_t off) { return Loc{Loc::output, 0, off}; };
  switch (s.coll) {
    case Collective::allgather:
    case Collective::alltoall:
    case Collective::broadcast: {
      const bool a2a = s.coll == Collective::alltoall, bc = s.coll == Collective::broadcast;
      ph.to = peers(s.coll, n, r, s.root, 0);
      ph.from = peers(s.coll, n, r, s.root, 1);
      for (int32_t p = 0; p < n; ++p) {
        ph.send[size_t(p)] = {in(a2a ? int64_t(p) * B : 0), B};
        ph.recv[size_t(p)] = {out(bc ? 0 : int64_t(p) * B), B};
      }
      ph.own_copy = (bc ? r == s.root : true) && !s.in_place;
      ph.own_src = {in(a2a ? int64_t(r) * B : 0), B};
      ph.own_dst = {out(bc ? 0 : int64_t(r) * B), B};
      if (bc) ph.only = s.root;
      emit(ops, step, s, ph);
      break;
    }
    case Collective::reducescatter: {
      ph.to = peers(s.coll, n, r, 0, 0);
      ph.from = peers(s.coll, n, r, 0, 1);
      for (int32_t p = 0; p < n; ++p) ph.send[size_t(p)] = {in(int64_t(p) * B), B};
      ph.reduce = true;
      ph.red_own = {in(int64_t(r) * B), B};
      ph.red_dst = {out(0), B};
      emit(ops, step, s, ph);
      break;
    }
    case Collective::allreduce: {
      // Reduce-scatter of chunk q to rank q, into the output; then, once this
      // rank's chunk is final (both streams meet), an all-gather of the
      // chunks in place in the output.
      const int32_t es = std::max<int32_t>(1, s.elem);
      const int64_t count = B / es;
      auto off = [&](int32_t q) { return chunk_offset(count, n, q, es); };
      auto len = [&](int32_t q) { return off(q + 1) - off(q); };
      ph.to = peers(s.coll, n, r, 0, 0);
      ph.from = peers(s.coll, n, r, 0, 1);
      for (int32_t p = 0; p < n; ++p) ph.send[size_t(p)] = {in(off(p)), len(p)};
      ph.reduce = true;
      ph.red_own = {in(off(r)), len(r)};
      ph.red_dst = {out(off(r)), len(r)};
      emit(ops, step, s, ph);
      Op j;
      j.kind = Op::join;
      j.step = step++;
      ops.push_back(j);
      Phase ag;
      ag.to = ph.to;
      ag.from = ph.from;
      ag.send.resize(size_t(n));
      ag.recv.resize(size_t(n));
      for (int32_t p = 0; p < n; ++p) {
        ag.send[size_t(p)] = {out(off(r)), len(r)};
        ag.recv[size_t(p)] = {out(off(p)), len(p)};
      }
      emit(ops, step, s, ag);
      break;
    }
    default:
      break;
  }
  if (steps) *steps = step;  // the same on every rank, whatever its role
  return ops;
}

// ---- the runtime side ----------------------------------------------------------

namespace {

// Where `l` is for this call on this rank.
CUdeviceptr address(const Comm& c, const CeState& st, const Loc& l, const void* input, void* output) {
  switch (l.space) {
    case Loc::input: return reinterpret_cast<CUdeviceptr>(input) + CUdeviceptr(l.offset);
    case Loc::output: return reinterpret_cast<CUdeviceptr>(output) + CUdeviceptr(l.offset);
    case Loc::scratch: break;
  }
  return c.peer_at(l.rank, c.plans.scratch_base + st.scratch_offset + l.offset);
}

// The words of rank `r`'s copy-engine region (as this GPU maps it).
CUdeviceptr words(const Comm& c, const CeState& st, int32_t r, int32_t row) {
  return c.peer_at(r, c.plans.flag_base + st.flag_offset + int64_t(row) * c.nranks * int64_t(sizeof(uint64_t)));
}

// A stream for the receive side: one that already joined the capture the
// caller's stream is in (it stays in it until the capture ends: a stream
// joined from `user` and still capturing is in user's current capture), else
// one that is not capturing, else a new one.
CUstream receive_stream(Comm& c, CUstream user, bool capturing) {
  const Driver& d = cu();
  CopyEngines::CeStream* idle = nullptr;
  for (CopyEngines::CeStream& x : c.ce_streams) {
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    MK_CU(d.cuStreamIsCapturing(x.stream, &st), "querying a copy-engine stream");
    if (st == CU_STREAM_CAPTURE_STATUS_ACTIVE && capturing && x.joined_from == user)
      return x.stream;
    if (st == CU_STREAM_CAPTURE_STATUS_NONE && !idle) idle = &x;
  }
  if (!idle) {
    CUstream s = nullptr;
    CtxGuard g(c.ctx);  // the caller's current context may be another GPU's (one thread driving several)
    MK_CU(d.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "creating a copy-engine stream");
    c.ce_streams.push_back({s, nullptr});
    idle = &c.ce_streams.back();
  }
  idle->joined_from = user;
  return idle->stream;
}

// mk_ce_sync, compiled (NVRTC, cached) and loaded once per communicator.
void load_kernel(Comm& c) {
  if (c.ce_fn) return;
  if (c.ce_module) {  // a failed earlier attempt
    cu().cuModuleUnload(c.ce_module);
    c.ce_module = nullptr;
  }
  const Driver& d = cu();
  jit::CompileResult r;
  try {
    r = jit::compile(sync_source(), "mk_ce_sync", c.arch);
  } catch (const Error& e) {
    fail(mkSystemError, std::string("compiling the copy-engine kernel: ") + e.what());
  }
  CUmodule m = nullptr;
  MK_CU(d.cuModuleLoadData(&m, r.cubin.data()), "loading the copy-engine kernel");
  CUfunction f = nullptr;
  if (CUresult e = d.cuModuleGetFunction(&f, m, "mk_ce_sync"); e != CUDA_SUCCESS) {
    d.cuModuleUnload(m);
    fail(mkSystemError, "finding the copy-engine kernel: " + cu_error_string(e));
  }
  c.ce_module = m;  // owned from here (released with the communicator)
  if (d.cuFuncLoad) MK_CU(d.cuFuncLoad(f), "loading the copy-engine kernel");
  if (!c.ce_fork) MK_CU(d.cuEventCreate(&c.ce_fork, CU_EVENT_DISABLE_TIMING), "creating an event");
  if (!c.ce_join) MK_CU(d.cuEventCreate(&c.ce_join, CU_EVENT_DISABLE_TIMING), "creating an event");
  c.ce_fn = f;
}

// mk_ce_reduce for (dtype, op), compiled and loaded on first use.
CUfunction reduce_kernel(Comm& c, DType dt, RedOp op) {
  const int key = int(dt) * kNumRedOps + int(op);
  if (auto it = c.ce_reduce.find(key); it != c.ce_reduce.end()) return it->second.second;
  const Driver& d = cu();
  std::string fn;
  const std::string src = reduce_source(dt, op, &fn);
  jit::CompileResult r;
  try {
    r = jit::compile(src, fn, c.arch);
  } catch (const Error& e) {
    fail(mkSystemError, std::string("compiling the copy-engine reduce kernel: ") + e.what());
  }
  CtxGuard g(c.ctx);
  CUmodule m = nullptr;
  MK_CU(d.cuModuleLoadData(&m, r.cubin.data()), "loading the copy-engine reduce kernel");
  CUfunction f = nullptr;
  if (CUresult e = d.cuModuleGetFunction(&f, m, fn.c_str()); e != CUDA_SUCCESS) {
    d.cuModuleUnload(m);
    fail(mkSystemError, "finding the copy-engine reduce kernel: " + cu_error_string(e));
  }
  if (d.cuFuncLoad)
    if (CUresult e = d.cuFuncLoad(f); e != CUDA_SUCCESS) {
      d.cuModuleUnload(m);
      fail(mkSystemError, "loading the copy-engine reduce kernel: " + cu_error_string(e));
    }
  c.ce_reduce[key] = {m, f};
  return f;
}

}  // namespace

Issue::Issue(Comm& c, PlanInstance& inst, Collective coll, DType dt, RedOp op, int32_t root, int64_t bytes,
             const void* input, void* output, CUstream stream, bool capturing)
    : c_(c), inst_(inst), coll_(coll), input_(input), output_(output), stream_(stream), capturing_(capturing) {
  Shape s;
  s.coll = coll;
  s.nranks = c.nranks;
  s.rank = c.rank;
  s.root = coll == Collective::broadcast ? root : 0;
  s.bytes = bytes;
  s.tile = inst.ce->tile;
  s.elem = int32_t(dtype_size(dt));
  if (collective_reduces(coll)) {
    auto it = c.ce_reduce.find(int(dt) * kNumRedOps + int(op));
    if (it == c.ce_reduce.end()) fail(mkInternalError, "the copy-engine reduce kernel was not loaded with its instance");
    reduce_ = it->second.second;
  }
  const auto in = reinterpret_cast<uintptr_t>(input), out = reinterpret_cast<uintptr_t>(output);
  s.in_place = coll == Collective::allgather   ? in == out + uintptr_t(c.rank) * uintptr_t(bytes)
               : coll == Collective::broadcast ? in == out
                                               : false;  // (reduce phases read and write element by element)
  ops_ = program(s, &steps_);
}

void Issue::issue(const Op& o) {
  const Driver& d = cu();
  const CeState& st = *inst_.ce;
  const int32_t n = c_.nranks;
  CUstream on = o.stream == 0 ? stream_ : recv_;
  if (o.kind == Op::join) {
    MK_CU(d.cuEventRecord(c_.ce_join, recv_), "joining the copy-engine streams");
    MK_CU(d.cuStreamWaitEvent(stream_, c_.ce_join, 0), "joining the copy-engine streams");
    MK_CU(d.cuEventRecord(c_.ce_fork, stream_), "forking the copy-engine streams");
    MK_CU(d.cuStreamWaitEvent(recv_, c_.ce_fork, 0), "forking the copy-engine streams");
    return;
  }
  if (o.kind == Op::reduce) {
    dev::CeReduceArgs a{};
    a.dst = reinterpret_cast<char*>(address(c_, st, o.dst, input_, output_));
    a.own = reinterpret_cast<const char*>(address(c_, st, o.src, input_, output_));
    a.scratch = reinterpret_cast<const char*>(address(c_, st, Loc{Loc::scratch, c_.rank, 0}, input_, output_));
    a.bytes = o.bytes;
    a.slot_bytes = st.tile;
    a.rank = c_.rank;
    a.nranks = n;
    a.slot = o.slot;
    a.slots = kSlots;
    // 16 bytes a thread, up to 4 blocks an SM (the kernel strides over the rest).
    const unsigned grid = unsigned(std::clamp<int64_t>((o.bytes / 16 + 255) / 256, 1, 4 * int64_t(c_.sms)));
    void* params[] = {&a};
    if (CUresult r = d.cuLaunchKernel(reduce_, grid, 1, 1, 256, 1, 1, 0, on, params, nullptr); r != CUDA_SUCCESS)
      fail(mkUnhandledCudaError, "launching the copy-engine reduce kernel: " + cu_error_string(r));
    return;
  }
  if (o.kind == Op::copy) {
    MK_CU(d.cuMemcpyDtoDAsync(address(c_, st, o.dst, input_, output_), address(c_, st, o.src, input_, output_),
                              size_t(o.bytes), on),
          "issuing a copy-engine transfer");
    return;
  }
  dev::CeSyncArgs a{};
  a.counters = reinterpret_cast<uint64_t*>(words(c_, st, c_.rank, o.stream == 0 ? dev::kCeShipped : dev::kCeTaken));
  a.signal = reinterpret_cast<uint64_t* const*>(st.tables + CUdeviceptr(o.stream) * CUdeviceptr(n) * sizeof(void*));
  a.watch = reinterpret_cast<const uint64_t*>(words(c_, st, c_.rank, o.stream == 0 ? dev::kCeConsumed : dev::kCeReady));
  a.abort_words = reinterpret_cast<uint64_t* const*>(st.tables + 2 * CUdeviceptr(n) * sizeof(void*));
  a.error = reinterpret_cast<dev::ErrorRecord*>(st.res->errors_dev) + o.stream;
  a.host_abort = reinterpret_cast<volatile int32_t*>(c_.host_dev);
  a.timeout_ns = c_.config.timeout_ns;
  a.delta = o.delta;
  a.rank = c_.rank;
  a.nranks = n;
  a.only = o.only;
  a.bump = o.bump;
  a.wait = o.wait;
  a.side = o.stream;
  a.tile = o.tile;
  void* params[] = {&a};
  if (CUresult r = d.cuLaunchKernel(c_.ce_fn, 1, 1, 1, 32, 1, 1, 0, on, params, nullptr); r != CUDA_SUCCESS)
    fail(mkUnhandledCudaError, "launching the copy-engine kernel: " + cu_error_string(r));
}

bool Issue::step() {
  if (step_ >= steps_) return false;
  const Driver& d = cu();
  try {
    if (step_ < 0) {
      recv_ = receive_stream(c_, stream_, capturing_);
      MK_CU(d.cuEventRecord(c_.ce_fork, stream_), "forking the copy-engine streams");
      MK_CU(d.cuStreamWaitEvent(recv_, c_.ce_fork, 0), "forking the copy-engine streams");
      step_ = 0;
    }
    for (; next_ < ops_.size() && ops_[next_].step == step_; ++next_, ++issued_) issue(ops_[next_]);
    if (++step_ < steps_) return true;
    MK_CU(d.cuEventRecord(c_.ce_join, recv_), "joining the copy-engine streams");
    MK_CU(d.cuStreamWaitEvent(stream_, c_.ce_join, 0), "joining the copy-engine streams");
    return false;
  } catch (const RtError& e) {
    step_ = steps_;  // nothing more of this call
    // Peers wait for the rest of this rank's program: stop them, for good.
    if (issued_ > 0) {
      c_.set_error(e.code(), fmt::format("{}: the copy-engine transfer was issued only in part ({} of {} operations): "
                                         "{}; the communicator is unusable, call mkCommAbort",
                                         api_name(coll_), issued_, ops_.size(), e.what()));
      c_.raise_abort();
    }
    // What was issued on the receive stream joins the caller's stream, so
    // that the completion event the caller records covers it (destroy waits
    // for that before freeing what the copies use). Best effort.
    if (recv_) {
      d.cuEventRecord(c_.ce_join, recv_);
      d.cuStreamWaitEvent(stream_, c_.ce_join, 0);
    }
    throw;
  }
}

}  // namespace ce

CeState::~CeState() {
  try {
    if (tables) cu().cuMemFree(tables);
  } catch (...) {
  }
}

PlanInstance& Comm::create_ce_instance(Collective coll, DType dtype, RedOp op, const Choice& choice, int64_t* lo,
                                       int64_t* hi) {
  if (!ce::supports(coll))
    fail(mkInvalidUsage, fmt::format("schedule {} runs on copy engines, which do not serve {}", choice.schedule,
                                     name(coll)));
  // Everything a call will need is loaded here, under the instance's relaxed
  // capture mode (a first call inside graph capture), never while issuing.
  ce::load_kernel(*this);
  if (collective_reduces(coll)) ce::reduce_kernel(*this, dtype, op);
  passes::ProtocolOptions o;
  env::apply_tune(&o);
  if (!choice.tune.empty()) env::apply_tune(choice.tune, &o);
  const int64_t tile = o.ce_tile_bytes > 0 ? o.ce_tile_bytes : ce::default_tile(nranks);
  *lo = choice.lo;
  *hi = choice.hi;
  const std::string key = fmt::format("ce|{}|{}", choice.schedule, tile);
  if (auto it = plans.instances.find(key); it != plans.instances.end()) return *it->second;
  const Driver& d = cu();
  CeState* st = nullptr;
  for (auto& x : ce_states)
    if (x->tile == tile) st = x.get();
  if (!st) {
    // Built completely before it is published (see resources_for).
    auto fresh = std::make_unique<CeState>();
    fresh->tile = tile;
    auto res = std::make_unique<Resources>();
    res->key = fmt::format("copy-engine|{}", tile);
    res->grid = 2;
    const int64_t scratch = ce::scratch_bytes(nranks, tile);
    const Regions at = place_regions(int64_t(dev::kCeWords) * nranks * int64_t(sizeof(uint64_t)), scratch,
                                     "the copy-engine path",
                                     fmt::format(" ({} ranks x {} slots x tile {})", nranks, ce::kSlots, tile),
                                     "raise MK_SCRATCH_BYTES or lower MK_TUNE=ce_tile");
    fresh->flag_offset = at.flag_offset;
    fresh->scratch_offset = at.scratch_offset;
    std::vector<CUdeviceptr> t(size_t(3 * nranks));
    for (int32_t p = 0; p < nranks; ++p) {
      auto word = [&](int32_t row) {
        return peer_at(p, plans.flag_base + fresh->flag_offset + (int64_t(row) * nranks + rank) * 8);
      };
      t[size_t(p)] = word(dev::kCeReady);                // p's word of what this rank shipped
      t[size_t(nranks + p)] = word(dev::kCeConsumed);    // p's word of what this rank consumed
      t[size_t(2 * nranks + p)] = peer_at(p, plans.flag_base);  // p's abort word
    }
    MK_CU(d.cuMemAlloc(&fresh->tables, sizeof(CUdeviceptr) * t.size()), "allocating the copy-engine tables");
    MK_CU(d.cuMemcpyHtoDAsync(fresh->tables, t.data(), sizeof(CUdeviceptr) * t.size(), side_stream),
          "copying the copy-engine tables");
    MK_CU(d.cuStreamSynchronize(side_stream), "initialising the copy-engine tables");
    alloc_error_records(*res);
    commit_regions(at);
    fresh->res = res.get();
    {
      std::lock_guard<std::mutex> lock(plans.res_mu);
      plans.resources.push_back(std::move(res));
    }
    st = fresh.get();
    ce_states.push_back(std::move(fresh));
    debug_log(fmt::format("rank {}: copy-engine path ready (tile {} B, scratch {} B at +{}, flags at +{})", rank, tile,
                          scratch, st->scratch_offset, st->flag_offset));
  }
  auto plan = std::make_shared<plan::Plan>();
  plan->schedule = choice.schedule;
  plan->coll = coll;
  plan->nranks = nranks;
  plan->arch = arch;
  plan::Kernel k;
  k.name = "mk_ce_sync";
  k.proto = "ce";
  k.max_tile_bytes = tile;
  k.grid = 1;
  k.threads = 32;
  plan->kernels.push_back(std::move(k));
  auto inst = std::make_unique<PlanInstance>();
  inst->plan = plan;
  inst->kernel = &plan->kernels.front();
  inst->fn = ce_fn;
  inst->res = st->res;
  inst->rooted = collective_rooted(coll);
  inst->ce = st;
  PlanInstance* raw = inst.get();
  plans.owned.push_back(std::move(inst));
  plans.instances[key] = raw;
  return *raw;
}

}  // namespace mk::rt
