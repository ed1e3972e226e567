// Everything a generated kernel needs. The generated source defines a plan
// traits struct P (element type, reduction, sizes) and per-(class, thread
// block) functions that call the members of Ctx<P> below:
//
//   c.wait_all({{slot, iter, peer, op}, ...})    acquire flags (bounded spin)
//   c.signal_all({{peer, slot}, ...})            release flags
//   c.template prim<NS, ND, RED, FINAL, SLL, DLL>(srcs, dsts, n)
//                                                one tile: read NS sources,
//                                                combine, write ND destinations
//
// One generic primitive, templated on what varies; the wrappers are one line.
#pragma once
#include "abi.cuh"
#include "dtype.cuh"
#include "epilogue.cuh"
#include "layout.cuh"
#include "ll.cuh"
#include "reduce.cuh"
#include "ref.cuh"
#include "vec.cuh"

namespace mk {
namespace dev {

template <typename T>
MK_DEV T ld_elem(const T* p) {
  static_assert(sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8,
                "element size must be 1, 2, 4 or 8 bytes");
  if constexpr (sizeof(T) == 1) {
    uint16_t v;
    asm volatile("ld.global.cg.u8 %0, [%1];" : "=h"(v) : "l"(p));
    return bitcast<T>(uint8_t(v));
  } else if constexpr (sizeof(T) == 2) {
    uint16_t v;
    asm volatile("ld.global.cg.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return bitcast<T>(v);
  } else if constexpr (sizeof(T) == 4) {
    uint32_t v;
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return bitcast<T>(v);
  } else {
    uint64_t v;
    asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(v) : "l"(p));
    return bitcast<T>(v);
  }
}

template <typename T>
MK_DEV void st_elem(T* p, T x) {
  if constexpr (sizeof(T) == 1) {
    asm volatile("st.global.u8 [%0], %1;" ::"l"(p), "h"(uint16_t(bitcast<uint8_t>(x))) : "memory");
  } else if constexpr (sizeof(T) == 2) {
    asm volatile("st.global.u16 [%0], %1;" ::"l"(p), "h"(bitcast<uint16_t>(x)) : "memory");
  } else if constexpr (sizeof(T) == 4) {
    asm volatile("st.global.u32 [%0], %1;" ::"l"(p), "r"(bitcast<uint32_t>(x)) : "memory");
  } else {
    asm volatile("st.global.u64 [%0], %1;" ::"l"(p), "l"(bitcast<uint64_t>(x)) : "memory");
  }
}

struct WaitSpec {
  int32_t slot;
  int32_t iter;  // 0, or -depth: the signal of that many steps ago
  int32_t peer;  // relative rank expected to signal (for the error report)
};
struct SignalSpec {
  int32_t peer;  // relative rank
  int32_t slot;
};

template <int N>
struct Shared {
  char* sc[N];
  uint64_t* fl[N];
  char* zin[N];   // zero-copy: every rank's input and output, mapped here
  char* zout[N];
  int claim;  // first failing thread of the block writes the error record
  int stop;   // the communicator was aborted before this launch
  int last;   // zero-copy: this block is the launch's last to finish
};

// P: plan traits from the generated source.
template <class P>
struct Ctx {
  using T = typename P::T;
  using C = typename Compute<T>::type;
  static constexpr int N = P::kRanks;
  static constexpr int NT = P::kThreads;
  static constexpr int VE = 16 / int(sizeof(T));
  static constexpr int64_t kSlotBytes = P::kMaxTileBytes * (P::kLL ? 2 : 1);
  static constexpr int64_t kAbortWord = int64_t(P::kInstances) * P::kSlots;
  static_assert(P::kMaxTileBytes % 16 == 0, "tiles are whole 16-byte vectors");
  static_assert(NT % 32 == 0, "blocks are whole warps");

  const Args& a;
  Shared<N>& sh;
  int32_t rank, vrank, inst, tb;
  uint64_t base;
  int64_t step, tile;
  Layout L;
  int aborted;

  MK_DEV Ctx(const Args& args, Shared<N>& s) : a(args), sh(s) {
    rank = a.rank;
    vrank = P::kRooted ? (rank - a.root + N) % N : rank;
    inst = int32_t(blockIdx.x) / P::kTbs;
    tb = int32_t(blockIdx.x) % P::kTbs;
    for (int i = threadIdx.x; i < N; i += NT) {
      sh.sc[i] = a.scratch[i];
      sh.fl[i] = a.flags[i];
    }
    if (threadIdx.x == 0) {
      sh.claim = 0;
      // Issued next to the step-counter load below, so the two latencies overlap.
      sh.stop = int(*reinterpret_cast<const volatile uint64_t*>(comm_abort(a.flags[rank], a.flag_offset)) != 0);
    }
    base = a.seq[blockIdx.x];
    L = make_layout(a.count, P::kChunks, a.tile_bytes, P::kInstances, int32_t(sizeof(T)));
    step = 0;
    tile = inst;
    aborted = 0;
    __syncthreads();
    // A communicator that was aborted (here, on a peer, or by a failed
    // collective) runs nothing: launches and graph replays after an error
    // fail instead of computing garbage.
    if (sh.stop) {
      if (threadIdx.x == 0) fail(kErrStopped, kStoppedAtEntry, -1, -1, 0, 0, 0);
      L.steps = 0;
    }
    // A one-pass kernel (no flags: launches order its scratch reuse) is only
    // correct at one step per launch; every rank sees the same count, so
    // every rank stops here alike.
    if (P::kOnePass && L.steps > 1) {
      if (threadIdx.x == 0) fail(kErrOnePassSteps, -1, -1, -1, uint64_t(L.steps), 1, 0);
      L.steps = 0;
    }
  }
  MK_DEV static uint64_t* comm_abort(uint64_t* flags, int64_t flag_offset) {
    return reinterpret_cast<uint64_t*>(reinterpret_cast<char*>(flags) - flag_offset);
  }
  MK_DEV uint64_t* abort_word(int32_t r) const { return comm_abort(sh.fl[r], a.flag_offset); }

  // ---- addressing --------------------------------------------------------
  MK_DEV int32_t peer(int32_t d) const { return (rank + d) % N; }
  MK_DEV int32_t blk(int32_t off) const { return (vrank + off) % N; }
  MK_DEV int32_t rpos(int32_t off) const { return (vrank * P::kPosRot + off) % P::kChunks; }
  MK_DEV uint64_t value() const { return base + uint64_t(step) + 1; }
  MK_DEV T* in(int32_t index) const {
    return const_cast<T*>(static_cast<const T*>(a.input)) + data_offset(L, index, tile);
  }
  MK_DEV T* out(int32_t index) const { return static_cast<T*>(a.output) + data_offset(L, index, tile); }
  // Zero-copy: rank peer(d)'s user buffers.
  MK_DEV T* peer_in(int32_t d, int32_t index) const {
    return reinterpret_cast<T*>(sh.zin[peer(d)]) + data_offset(L, index, tile);
  }
  MK_DEV T* peer_out(int32_t d, int32_t index) const {
    return reinterpret_cast<T*>(sh.zout[peer(d)]) + data_offset(L, index, tile);
  }
  MK_DEV T* scr(int32_t d, int32_t slot) const {
    return reinterpret_cast<T*>(sh.sc[peer(d)] + scratch_offset(kSlotBytes, P::kScratch, P::kDepth, inst,
                                                                int64_t(base) + step, slot));
  }
  MK_DEV int64_t len(int32_t pos) const { return tile_elems(L, pos, tile); }
  MK_DEV int32_t decode_pos(int32_t code) const {
    return (code & 0x40000000) ? rpos(code & 0x3fffffff) : code;
  }
  MK_DEV T* decode(uint64_t r) const {
    const int kind = int(r & 3u);
    const int32_t hi = int32_t(r >> 32);
    if (kind == kRefScratch) return scr(int32_t((r >> 4) & 0xfffu), hi);
    int32_t block = int32_t((r >> 16) & 0xffffu);
    if (r & 4u) block = blk(block);
    const int32_t pos = (r & 8u) ? rpos(hi) : hi;
    const int32_t index = block * P::kChunks + pos;
    if constexpr (P::kZeroCopy) {
      const int32_t d = int32_t((r >> 4) & 0xfffu);
      return kind == kRefIn ? peer_in(d, index) : peer_out(d, index);
    } else {
      return kind == kRefIn ? in(index) : out(index);
    }
  }
  MK_DEV bool next() {
    ++step;
    tile += P::kInstances;
    return step < L.steps;
  }
  MK_DEV void finish() {
    if (threadIdx.x == 0) a.seq[blockIdx.x] = base + uint64_t(L.steps);
  }

  // ---- zero-copy entry and exit ------------------------------------------------
  // Flag words after the abort word (abi.cuh zc_words): mailboxes, exit flags,
  // epoch, finished-block counter.
  static constexpr int64_t kZcBase = kAbortWord + 1;
  MK_DEV uint64_t* zc(int32_t r) const { return sh.fl[r] + kZcBase; }
  MK_DEV uint64_t* zc_epoch() const { return zc(rank) + 9 * N; }
  MK_DEV uint64_t* zc_done() const { return zc(rank) + 9 * N + 1; }

  // Bounded wait for *f >= want; false (and the abort raised) on timeout.
  MK_DEV bool zc_spin(const uint64_t* f, uint64_t want, int32_t what, int32_t from) {
    uint64_t have = ld_acquire_sys(f);
    if (have >= want) return true;
    const uint64_t t0 = globaltimer();
    for (uint32_t spins = 1;; ++spins) {
      have = ld_acquire_sys(f);
      if (have >= want) return true;
      if ((spins & 1023u) == 0 && stop_requested(t0)) {
        fail(kErrWaitTimeout, what, from, -1, have, want, globaltimer() - t0);
        return false;
      }
    }
  }

  // Every block: announce this rank's buffers (block 0 writes every peer's
  // mailbox), then wait for every peer's announcement of this launch, check
  // it against this call and map its buffers. A peer's announcement also
  // means its kernel has started: its stream has produced its input and
  // released its output. False: the collective aborted.
  MK_DEV bool zc_enter() {
    const uint64_t E = *reinterpret_cast<volatile uint64_t*>(zc_epoch()) + 1;
    if (blockIdx.x == 0)
      for (int q = threadIdx.x; q < N; q += NT) {
        if (q == rank) continue;
        uint64_t* box = zc(q) + 8 * rank;
        box[1] = uint64_t(uint32_t(a.in_window)) | (uint64_t(uint32_t(a.out_window)) << 32);
        box[2] = uint64_t(a.in_offset);
        box[3] = uint64_t(a.out_offset);
        box[4] = uint64_t(a.count);
        box[5] = a.call_sig;
        st_release_sys(box, E);
      }
    for (int q = threadIdx.x; q < N; q += NT) {
      if (q == rank) {
        sh.zin[q] = const_cast<char*>(static_cast<const char*>(a.input));
        sh.zout[q] = static_cast<char*>(a.output);
        continue;
      }
      const uint64_t* box = zc(rank) + 8 * q;
      if (!zc_spin(box, E, -1, q)) break;
      const volatile uint64_t* vb = box;
      const int32_t win[2] = {int32_t(uint32_t(vb[1])), int32_t(uint32_t(vb[1] >> 32))};
      const int64_t off[2] = {int64_t(vb[2]), int64_t(vb[3])};
      const int64_t bytes[2] = {a.in_bytes, a.out_bytes};
      const int64_t count = int64_t(vb[4]);
      char* ptr[2] = {nullptr, nullptr};
      if (vb[5] != a.call_sig) {  // another collective, dtype, op or root: its buffers mean something else
        fail(kErrZcMismatch, kZcCall, q, -1, vb[5], a.call_sig, 0);
        break;
      }
      if (count != a.count) {
        fail(kErrZcMismatch, kZcCount, q, -1, uint64_t(count), uint64_t(a.count), 0);
        break;
      }
      for (int k = 0; k < 2; ++k) {
        if (win[k] < 0) continue;
        const ZcPeerWindow* w = win[k] < a.max_windows ? a.windows + int64_t(win[k]) * N + q : nullptr;
        if (!w || !w->base) {
          fail(kErrZcMismatch, kZcWindow, q, -1, uint64_t(win[k]), 0, 0);
          break;
        }
        if (off[k] < 0 || off[k] + bytes[k] > w->bytes) {
          fail(kErrZcMismatch, kZcBounds, q, -1, uint64_t(off[k] + bytes[k]), uint64_t(w->bytes), 0);
          break;
        }
        ptr[k] = w->base + off[k];
      }
      sh.zin[q] = ptr[0];
      sh.zout[q] = ptr[1];
    }
    return !__syncthreads_or(aborted);
  }

  // Every block after its last step: the launch's last block on this rank
  // tells every peer "done with your buffers" and waits until every peer has
  // said the same, so no rank returns while a peer may still read or write
  // its buffers. Then it advances the epoch for the next launch.
  MK_DEV void zc_exit() {
    const uint64_t E = *reinterpret_cast<volatile uint64_t*>(zc_epoch()) + 1;
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence_system();  // this block's peer writes, before it is counted
      sh.last = atomicAdd(reinterpret_cast<unsigned long long*>(zc_done()), 1ull) == gridDim.x - 1;
    }
    __syncthreads();
    if (!sh.last) return;
    __threadfence_system();
    for (int q = threadIdx.x; q < N; q += NT)
      if (q != rank) st_release_sys(zc(q) + 8 * N + rank, E);
    for (int q = threadIdx.x; q < N; q += NT)
      if (q != rank && !zc_spin(zc(rank) + 8 * N + q, E, -2, q)) break;
    __syncthreads();
    if (threadIdx.x == 0) {
      *zc_done() = 0;
      *reinterpret_cast<volatile uint64_t*>(zc_epoch()) = E;
    }
  }

  // ---- failure -------------------------------------------------------------
  MK_DEV bool stop_requested(uint64_t t0) const {
    if (*reinterpret_cast<const volatile uint64_t*>(abort_word(rank)) != 0) return true;
    if (a.host_abort && *a.host_abort != 0) return true;
    return a.timeout_ns != 0 && globaltimer() - t0 > a.timeout_ns;
  }
  MK_DEV void fail(int32_t code, int32_t slot, int32_t peer_rank, int32_t op, uint64_t have, uint64_t want,
                   uint64_t waited) {
    aborted = 1;
    const bool root_cause = *reinterpret_cast<const volatile uint64_t*>(abort_word(rank)) == 0 &&
                            !(a.host_abort && *a.host_abort != 0);
    if (atomicCAS(&sh.claim, 0, 1) == 0) {
      ErrorRecord& e = a.errors[blockIdx.x];
      e.rank = rank;
      e.instance = inst;
      e.tb = tb;
      e.slot = slot;
      e.peer = peer_rank;
      e.op = op;
      e.step = step;
      e.have = have;
      e.want = want;
      e.waited_ns = waited;
      __threadfence_system();
      *reinterpret_cast<volatile int32_t*>(&e.code) = root_cause ? code : int32_t(kErrStopped);
      __threadfence_system();
      if (a.host_abort) a.host_abort[1] = 1;  // the host sees it at its next call
    }
    // Tell every rank (and every block here) to stop waiting.
    for (int q = 0; q < N; ++q) st_release_sys(abort_word(q), 1);
  }

  // ---- synchronisation -------------------------------------------------------
  __device__ __noinline__ void spin(const WaitSpec& w) {
    const int64_t target = int64_t(value()) + w.iter;
    if (target <= 0) return;
    const uint64_t* f = sh.fl[rank] + int64_t(inst) * P::kSlots + w.slot;
    uint64_t have = ld_acquire_sys(f);
    if (have >= uint64_t(target)) return;
    const uint64_t t0 = globaltimer();
    for (uint32_t spins = 1;; ++spins) {
      have = ld_acquire_sys(f);
      if (have >= uint64_t(target)) return;
      if ((spins & 1023u) == 0 && stop_requested(t0)) {
        fail(kErrWaitTimeout, w.slot, peer(w.peer), -1, have, uint64_t(target), globaltimer() - t0);
        return;
      }
    }
  }
  // Thread i spins on wait i; then the whole block proceeds together.
  template <int CNT>
  MK_DEV bool wait_all(const WaitSpec (&w)[CNT]) {
    static_assert(CNT <= NT, "more waits than threads");
    if (int(threadIdx.x) < CNT) spin(w[threadIdx.x]);
    return !__syncthreads_or(aborted);
  }
  // After the block's writes: thread i releases flag i.
  template <int CNT>
  MK_DEV void signal_all(const SignalSpec (&s)[CNT]) {
    static_assert(CNT <= NT, "more signals than threads");
    __syncthreads();
    if (int(threadIdx.x) < CNT)
      st_release_sys(sh.fl[peer(s[threadIdx.x].peer)] + int64_t(inst) * P::kSlots + s[threadIdx.x].slot,
                     value());
  }
  MK_DEV bool barrier() { return !__syncthreads_or(aborted); }

  // ---- data --------------------------------------------------------------
  // acc := load(0) op load(1) op ... op load(ns - 1), left to right in the
  // compute type, finalised if FINAL. NS > 0: that many sources, unrolled;
  // NS == 0: `ns` sources in a loop (wide reduces). Both fold in the same
  // order, so a reduce gives the same bits on either path.
  template <int NS, bool FINAL, typename V, int E, typename Load>
  MK_DEV static void fold(int ns, Load load, V& out) {
    union U {
      V v;
      T e[E];
    };
    U u;
    u.v = load(0);
    C acc[E];
#pragma unroll
    for (int i = 0; i < E; ++i) acc[i] = Compute<T>::load(u.e[i]);
    auto add = [&](int s) {
      U w;
      w.v = load(s);
#pragma unroll
      for (int i = 0; i < E; ++i) acc[i] = red_apply<P::kRed, C>(acc[i], Compute<T>::load(w.e[i]));
    };
    if constexpr (NS > 0) {
#pragma unroll
      for (int s = 1; s < NS; ++s) add(s);
    } else {
      // never unrolled, even where NVVM propagates a constant `ns` into op_wide
#pragma unroll 1
      for (int s = 1; s < ns; ++s) add(s);
    }
#pragma unroll
    for (int i = 0; i < E; ++i) {
      C x = acc[i];
      if constexpr (FINAL) x = NoEpilogue::apply(red_finalize<P::kRed, C>(x, N));
      u.e[i] = Compute<T>::store(x);
    }
    out = u.v;
  }

  template <int NS, bool RED, bool FINAL, typename V, int E>
  MK_DEV static void combine(const V (&v)[NS], V& out) {
    if constexpr (!RED)
      out = v[0];
    else
      fold<NS, FINAL, V, E>(NS, [&](int s) { return v[s]; }, out);
  }

  // One tile: dst[d][0..n) := combine(src[0][0..n), ..., src[NS-1][0..n)).
  // SLL/DLL: bit masks of sources/destinations in LL format (LL plans only).
  template <int NS, int ND, bool RED, bool FINAL, unsigned SLL, unsigned DLL>
  MK_DEV void prim(T* const (&src)[NS], T* const (&dst)[ND], int64_t n) {
    static_assert(NS >= 1 && ND >= 1, "an op reads and writes something");
    static_assert(RED || NS == 1, "a copy has one source");
    if (n <= 0) return;
    if constexpr (P::kLL)
      prim_ll<NS, ND, RED, FINAL, SLL, DLL>(src, dst, n);
    else
      prim_simple<NS, ND, RED, FINAL>(src, dst, n);
  }

  // One op of the schedule: decode operands, run the tile, then the barrier
  // that orders it before the block's next op. False: the collective aborted.
  template <int NS, int ND, bool RED, bool FINAL, unsigned SLL, unsigned DLL>
  __device__ __noinline__ bool op(const uint64_t (&s)[NS], const uint64_t (&d)[ND], int32_t pcode) {
    run_op<NS, ND, RED, FINAL, SLL, DLL>(s, d, pcode);
    return barrier();
  }
  // An op of a one-pass kernel (passes/one_pass.cpp): inlined, and no
  // barrier after it (each thread's units are its own in every op).
  template <int NS, int ND, bool RED, bool FINAL, unsigned SLL, unsigned DLL>
  MK_DEV bool op_pass(const uint64_t (&s)[NS], const uint64_t (&d)[ND], int32_t pcode) {
    run_op<NS, ND, RED, FINAL, SLL, DLL>(s, d, pcode);
    return !aborted;
  }
  template <int NS, int ND, bool RED, bool FINAL, unsigned SLL, unsigned DLL>
  MK_DEV void run_op(const uint64_t (&s)[NS], const uint64_t (&d)[ND], int32_t pcode) {
    T* src[NS];
    T* dst[ND];
#pragma unroll
    for (int i = 0; i < NS; ++i) src[i] = decode(s[i]);
#pragma unroll
    for (int i = 0; i < ND; ++i) dst[i] = decode(d[i]);
    prim<NS, ND, RED, FINAL, SLL, DLL>(src, dst, len(decode_pos(pcode)));
  }

  // ---- wide ops -----------------------------------------------------------
  // An op of many operands (codegen: more than 8 sources or destinations, or
  // a reduce whose sources' kinds differ between the ranks of one class)
  // takes them as a runtime list, sources then destinations, and loops over
  // them, so NVRTC compiles one small body whatever their number. The decoded
  // pointers live in shared memory (one array per kernel of P::kWide entries:
  // the plan's widest op). In LL plans an operand is in LL format exactly when
  // it is scratch, as the code generator's SLL/DLL masks say for other ops.
  MK_DEV T** wide_ptrs() {
    __shared__ T* p[P::kWide > 0 ? P::kWide : 1];
    return p;
  }
  MK_DEV uint32_t* wide_ll() {
    __shared__ uint32_t m[(P::kWide > 0 ? P::kWide : 1) / 32 + 1];
    return m;
  }
  MK_DEV static bool bit(const uint32_t* m, int i) { return (m[i / 32] >> (i % 32)) & 1u; }

  template <bool RED, bool FINAL>
  __device__ __noinline__ bool op_wide(const uint64_t* r, int ns, int nd, int32_t pcode) {
    T** p = wide_ptrs();
    uint32_t* ll = wide_ll();
    const int nr = ns + nd;
    for (int i = threadIdx.x; i < nr; i += NT) p[i] = decode(r[i]);
    if constexpr (P::kLL)
      for (int w = threadIdx.x; w * 32 < nr; w += NT) {
        uint32_t m = 0;
        for (int i = w * 32; i < nr && i < w * 32 + 32; ++i)
          if (int(r[i] & 3u) == kRefScratch) m |= 1u << (i - w * 32);
        ll[w] = m;
      }
    __syncthreads();
    const int64_t n = len(decode_pos(pcode));
    if (n > 0) {
      if constexpr (P::kLL)
        wide_ll_tile<RED, FINAL>(p, ll, ns, nd, n);
      else
        wide_simple<RED, FINAL>(p, ns, nd, n);
    }
    return barrier();  // also: no thread rewrites p/ll while another reads them
  }

  // The combined value of `ns` sources: a copy's one source as it is, a
  // reduce's folded (fold above: the unrolled ops' order).
  template <bool RED, bool FINAL, typename V, int E, typename Load>
  MK_DEV static void gather(int ns, Load load, V& out) {
    if constexpr (RED)
      fold<0, FINAL, V, E>(ns, load, out);
    else
      out = load(0);
  }

  // p: ns sources then nd destinations. A copy onto its own source (in-place)
  // writes nothing there, as in prim_simple.
  template <bool RED, bool FINAL>
  MK_DEV void wide_simple(T* const* p, int ns, int nd, int64_t n) {
    uintptr_t bits = 0;
#pragma unroll 1
    for (int k = 0; k < ns + nd; ++k) bits |= uintptr_t(p[k]);
    const int64_t nvec = (bits & 15) == 0 ? n / VE : 0;
    for (int64_t i = threadIdx.x; i < nvec; i += NT) {
      V16 r;
      gather<RED, FINAL, V16, VE>(ns, [&](int s) { return ld_cg16(p[s] + i * VE); }, r);
#pragma unroll 1
      for (int d = ns; d < ns + nd; ++d)
        if (RED || p[d] != p[0]) st16(p[d] + i * VE, r);
    }
    for (int64_t e = nvec * VE + threadIdx.x; e < n; e += NT) {
      T r;
      gather<RED, FINAL, T, 1>(ns, [&](int s) { return ld_elem(p[s] + e); }, r);
#pragma unroll 1
      for (int d = ns; d < ns + nd; ++d)
        if (RED || p[d] != p[0]) st_elem(p[d] + e, r);
    }
  }

  template <bool RED, bool FINAL>
  MK_DEV void wide_ll_tile(T* const* p, const uint32_t* ll, int ns, int nd, int64_t n) {
    const int64_t nbytes = n * int64_t(sizeof(T));
    const int64_t units = (nbytes + 7) / 8;
    const uint32_t flag = uint32_t(value());
    for (int64_t u = threadIdx.x; u < units; u += NT) {
      const int bytes = int(min64(8, nbytes - u * 8));
      V8 r;
      gather<RED, FINAL, V8, 8 / int(sizeof(T))>(
          ns, [&](int s) { return bit(ll, s) ? ll_read(p[s], u, s) : unit_load(p[s], u, bytes); }, r);
      if (aborted) return;
#pragma unroll 1
      for (int d = ns; d < ns + nd; ++d) {
        if (bit(ll, d))
          ll_store(reinterpret_cast<char*>(p[d]) + u * 16, r, flag);
        else if (RED || bit(ll, 0) || p[d] != p[0])
          unit_store(p[d], u, bytes, r);
      }
    }
  }

  // The streaming loop: each thread keeps P::kLoads 16-byte loads in flight
  // (over all sources: U = kLoads / NS vectors of each), issued as a batch,
  // then combines and stores them. With P::kPipeline the next batch's loads
  // are issued before this batch's stores (twice the registers): no thread
  // waits a full load latency between batches. The source order is the
  // memory order: loads and stores may alias (in-place), so the compiler
  // keeps them as written.
  template <int NS, int ND, bool RED, bool FINAL>
  MK_DEV void prim_simple(T* const (&src)[NS], T* const (&dst)[ND], int64_t n) {
    unsigned skip = 0;  // in-place: a copy onto its own source does nothing
    if constexpr (!RED) {
#pragma unroll
      for (int d = 0; d < ND; ++d)
        if (dst[d] == src[0]) skip |= 1u << d;
      if (skip == (1u << ND) - 1u) return;
    }
    uintptr_t bits = 0;
#pragma unroll
    for (int s = 0; s < NS; ++s) bits |= uintptr_t(src[s]);
#pragma unroll
    for (int d = 0; d < ND; ++d) bits |= uintptr_t(dst[d]);
    const int64_t nvec = (bits & 15) == 0 ? n / VE : 0;
    constexpr int U = P::kLoads / NS > 0 ? P::kLoads / NS : 1;
    constexpr int64_t B = int64_t(U) * NT;  // vectors per batch of the block
    auto load = [&](V16 (&v)[U][NS], int64_t at) {
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int s = 0; s < NS; ++s) v[u][s] = ld_cg16(src[s] + (at + int64_t(u) * NT) * VE);
    };
    auto store = [&](const V16 (&v)[U][NS], int64_t at) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        V16 r;
        combine<NS, RED, FINAL, V16, VE>(v[u], r);
#pragma unroll
        for (int d = 0; d < ND; ++d)
          if (!(skip >> d & 1u)) st16(dst[d] + (at + int64_t(u) * NT) * VE, r);
      }
    };
    int64_t i = threadIdx.x;
    const int64_t full = nvec / B * B;  // vectors in whole batches
    if constexpr (P::kPipeline) {
      if (i < full) {
        V16 a[U][NS], b[U][NS];
        load(a, i);
        for (;;) {
          const bool more = i + B < full;  // (batches are whole: i + B < full iff the next one is)
          if (more) load(b, i + B);
          store(a, i);
          i += B;
          if (!more) break;
          const bool again = i + B < full;
          if (again) load(a, i + B);
          store(b, i);
          i += B;
          if (!again) break;
        }
      }
    } else {
      for (; i < full; i += B) {
        V16 a[U][NS];
        load(a, i);
        store(a, i);
      }
    }
    for (; i < nvec; i += NT) {
      V16 v[NS];
#pragma unroll
      for (int s = 0; s < NS; ++s) v[s] = ld_cg16(src[s] + i * VE);
      V16 r;
      combine<NS, RED, FINAL, V16, VE>(v, r);
#pragma unroll
      for (int d = 0; d < ND; ++d)
        if (!(skip >> d & 1u)) st16(dst[d] + i * VE, r);
    }
    for (int64_t e = nvec * VE + threadIdx.x; e < n; e += NT) {
      T v[NS];
#pragma unroll
      for (int s = 0; s < NS; ++s) v[s] = ld_elem(src[s] + e);
      T r;
      combine<NS, RED, FINAL, T, 1>(v, r);
#pragma unroll
      for (int d = 0; d < ND; ++d)
        if (!(skip >> d & 1u)) st_elem(dst[d] + e, r);
    }
  }

  // LL: 8 data bytes per 16-byte packet; units of 8 bytes of the tile.
  MK_DEV V8 ll_read(const T* packets, int64_t unit, int32_t slot_hint) {
    const char* p = reinterpret_cast<const char*>(packets) + unit * 16;
    const uint32_t flag = uint32_t(value());
    V8 v;
    if (ll_try_load(p, flag, &v)) return v;
    const uint64_t t0 = globaltimer();
    for (uint32_t spins = 1;; ++spins) {
      if (ll_try_load(p, flag, &v)) return v;
      if ((spins & 1023u) == 0 && (aborted || stop_requested(t0))) {
        if (!aborted) fail(kErrLLTimeout, slot_hint, -1, -1, 0, flag, globaltimer() - t0);
        v.x = v.y = 0;
        return v;
      }
    }
  }
  MK_DEV static V8 unit_load(const T* p, int64_t unit, int bytes) {
    const char* b = reinterpret_cast<const char*>(p) + unit * 8;
    if (bytes == 8 && (uintptr_t(b) & 7) == 0) return ld_cg8(b);
    union {
      V8 v;
      T e[8 / sizeof(T)];
    } u;
    u.v.x = u.v.y = 0;
    const T* q = reinterpret_cast<const T*>(b);
    for (int k = 0; k < bytes / int(sizeof(T)); ++k) u.e[k] = ld_elem(q + k);
    return u.v;
  }
  MK_DEV static void unit_store(T* p, int64_t unit, int bytes, V8 v) {
    char* b = reinterpret_cast<char*>(p) + unit * 8;
    if (bytes == 8 && (uintptr_t(b) & 7) == 0) {
      st8(b, v);
      return;
    }
    union {
      V8 v;
      T e[8 / sizeof(T)];
    } u;
    u.v = v;
    T* q = reinterpret_cast<T*>(b);
    for (int k = 0; k < bytes / int(sizeof(T)); ++k) st_elem(q + k, u.e[k]);
  }

  template <int NS, int ND, bool RED, bool FINAL, unsigned SLL, unsigned DLL>
  MK_DEV void prim_ll(T* const (&src)[NS], T* const (&dst)[ND], int64_t n) {
    unsigned skip = 0;
    if constexpr (!RED) {
#pragma unroll
      for (int d = 0; d < ND; ++d)
        if (!(DLL >> d & 1u) && !(SLL & 1u) && dst[d] == src[0]) skip |= 1u << d;
    }
    const int64_t nbytes = n * int64_t(sizeof(T));
    const int64_t units = (nbytes + 7) / 8;
    const uint32_t flag = uint32_t(value());
    for (int64_t u = threadIdx.x; u < units; u += NT) {
      const int bytes = int(min64(8, nbytes - u * 8));
      // Every source's load issued back to back, then the LL packets not
      // there yet polled one by one.
      V8 v[NS];
      V16 pk[NS];
#pragma unroll
      for (int s = 0; s < NS; ++s)
        if (SLL >> s & 1u)
          pk[s] = ld_volatile16(reinterpret_cast<const char*>(src[s]) + u * 16);
        else
          v[s] = unit_load(src[s], u, bytes);
#pragma unroll
      for (int s = 0; s < NS; ++s)
        if (SLL >> s & 1u) {
          if (pk[s].y == flag && pk[s].w == flag) {
            v[s].x = pk[s].x;
            v[s].y = pk[s].z;
          } else {
            v[s] = ll_read(src[s], u, s);
          }
        }
      if (aborted) return;
      V8 r;
      combine<NS, RED, FINAL, V8, 8 / int(sizeof(T))>(v, r);
#pragma unroll
      for (int d = 0; d < ND; ++d) {
        if (skip >> d & 1u) continue;
        if (DLL >> d & 1u)
          ll_store(reinterpret_cast<char*>(dst[d]) + u * 16, r, flag);
        else
          unit_store(dst[d], u, bytes, r);
      }
    }
  }
};

}  // namespace dev
}  // namespace mk
