// What a generated kernel runs on. The generated source defines a plan
// traits struct P (element type, reduction, sizes) and per-(class, thread
// block) functions that call the members of Ctx<P> below:
//
//   c.wait_all({{slot, iter, peer, op}, ...})   acquire flags (sync.cuh's bounded spin)
//   c.signal_all({{peer, slot}, ...})           release flags
//   c.copy / c.reduce / c.reduce_final          one tile of one op (`op`: its id in the
//     ({srcs}, {dsts}, pos, op)                 plan's IR, for error reports), then the
//                                               barrier before the block's next op
//   c.copy_pass / c.reduce_pass / ...           the same in a one-pass kernel: no barrier
//   c.op_wide<RED, FINAL>(refs, ns, nd, pos, op) an op of many operands, in a loop
//   c.op_gpass<RED, FINAL>({srcs}, {dsts}, ...)  a one-pass op whose operands come
//                                               from the rank's table row
//
// The data primitives live in one header per protocol: prims_simple.cuh,
// prims_ll.cuh and prims_lamport.cuh (one-pass LL kernels of floats of at
// most 4 bytes, P::kLamport); zero-copy entry and exit in zero_copy.cuh;
// every wait goes through sync.cuh's one bounded spin.
#pragma once
#include "abi.cuh"
#include "layout.cuh"
#include "net.cuh"
#include "prims.cuh"
#include "prims_lamport.cuh"
#include "prims_ll.cuh"
#include "prims_simple.cuh"
#include "ref.cuh"
#include "sync.cuh"
#include "zero_copy.cuh"

namespace mk {
namespace dev {

struct WaitSpec {
  int32_t slot;
  int32_t iter;  // 0, or -depth: the signal of that many steps ago
  int32_t peer;  // relative rank expected to signal (for the error report)
  int32_t op;    // the IR op (of the plan's representative rank) the wait comes before; -1: none
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
  uint64_t net_seq;  // network plans: the FIFO entry thread 0 reserved for the block's put
};

// Writes block `bid`'s error record (the code last, so that the host never
// reads half a record), tells the host, and raises every rank's abort word
// (`abort_of(q)`): every waiting block of every rank then stops. Ctx::fail
// (through fail_record) and chain_barrier report through it.
template <class AbortOf>
MK_DEV void record_failure(ErrorRecord& e, int32_t rank, volatile int32_t* host_abort, int32_t nranks,
                           AbortOf abort_of, int32_t code, int32_t instance, int32_t tb, int32_t slot, int32_t peer,
                           int32_t op, uint64_t step, uint64_t have, uint64_t want, uint64_t waited) {
  e.rank = rank;
  e.instance = instance;
  e.tb = tb;
  e.slot = slot;
  e.peer = peer;
  e.op = op;
  e.step = step;
  e.have = have;
  e.want = want;
  e.waited_ns = waited;
  __threadfence_system();
  *reinterpret_cast<volatile int32_t*>(&e.code) = code;
  __threadfence_system();
  if (host_abort) host_abort[1] = 1;  // the host sees it at its next call
  for (int32_t q = 0; q < nranks; ++q)
    if (uint64_t* w = abort_of(q)) st_release_sys(w, 1);  // null: a rank on another node (its proxy learns)
}

// Ctx::fail's work: the first failing thread of the block writes the record
// (the root cause's code, kErrStopped where this rank or the host had
// already stopped), any later one only raises the abort words. Out of line,
// and given values rather than the context's address: inlined, this path
// was copied into every wait and poll of a kernel (a 64-rank all-gather:
// 1.2 MB of machine code, 11.8 s of nvcc; 0.2 MB and 1.8 s out of line),
// while a pointer to the context would keep an inlined kernel's context in
// local memory instead of registers. `fl`: every rank's flag region (the
// block's shared copy).
template <int N>
__device__ __noinline__ void fail_record(ErrorRecord* errors, volatile int32_t* host_abort, uint64_t* const* fl,
                                        int64_t flag_offset, int* claim, int32_t rank, int32_t bid, int32_t code,
                                        int32_t instance, int32_t tb, int32_t slot, int32_t peer, int32_t op,
                                        uint64_t step, uint64_t have, uint64_t want, uint64_t waited) {
  auto abort_of = [&](int32_t q) {
    return fl[q] ? reinterpret_cast<uint64_t*>(reinterpret_cast<char*>(fl[q]) - flag_offset) : nullptr;
  };
  const bool root_cause =
      *reinterpret_cast<const volatile uint64_t*>(abort_of(rank)) == 0 && !(host_abort && *host_abort != 0);
  if (atomicCAS(claim, 0, 1) == 0)
    record_failure(errors[bid], rank, host_abort, N, abort_of, root_cause ? code : int32_t(kErrStopped), instance, tb,
                   slot, peer, op, step, have, want, waited);
  else  // tell every rank (and every block here) to stop waiting
    for (int q = 0; q < N; ++q)
      if (uint64_t* w = abort_of(q)) st_release_sys(w, 1);
}

// A rank's row of its class's table, in registers: what a one-pass
// kernel's thread-block function reads first (codegen), so that the row's
// loads overlap the ops before the first that needs it instead of sitting
// in that op's dependency chain. (Meant to remove the generic one-shot's
// 1-3 us over the per-rank paths on the one-GPU proxy; it changed nothing
// measurable there, s22 run 3: that cost lies elsewhere.)
template <int W>
struct Row {
  int v[W];
  MK_DEV explicit Row(const int* p) {
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] = p[k];
  }
  MK_DEV int operator[](int k) const { return v[k]; }
};

// P: plan traits from the generated source.
template <class P>
struct Ctx {
  using Plan = P;
  using T = typename P::T;
  using Comb = Combine<T, P::kRed, P::kRanks, typename PreOf<P>::type>;
  using C = typename Comb::C;
  static constexpr int N = P::kRanks;
  static constexpr int NT = P::kThreads;
  static constexpr int VE = 16 / int(sizeof(T));
  // LL packets carry 8 data bytes in 16; Lamport packets and plain data 16.
  static constexpr int64_t kSlotBytes = P::kMaxTileBytes * (P::kLL && !P::kLamport ? 2 : 1);
  // The word after the flag slots: fused kernels' tail barrier (fused.cuh).
  static constexpr int64_t kTailWord = int64_t(P::kInstances) * P::kSlots;
  static_assert(P::kMaxTileBytes % 16 == 0, "tiles are whole 16-byte vectors");
  static_assert(NT % 32 == 0, "blocks are whole warps");
  static_assert(!P::kLamport || (P::kLL && P::kOnePass && P::kWide == 0),
                "Lamport packets are for one-pass kernels (which have no wide ops)");

  const Args& a;
  Shared<N>& sh;
  int32_t rank, vrank, inst, tb;
  // This block's index among the kernel's blocks and their number: blockIdx.x
  // and gridDim.x, except in a group kernel (several collectives side by
  // side in one launch, codegen group_source), where each collective's
  // blocks count from 0.
  int32_t bid, nbid;
  uint64_t base;
  int64_t step, tile;
  Layout L;
  int aborted;
  C prescale;  // PreMulSum kernels: this rank's scalar (Args::prescale)

  MK_DEV Ctx(const Args& args, Shared<N>& s, int32_t block, int32_t blocks) : a(args), sh(s), bid(block), nbid(blocks) {
    rank = a.rank;
    vrank = P::kRooted ? (rank - a.root + N) % N : rank;
    inst = bid / P::kTbs;
    tb = bid % P::kTbs;
    for (int i = threadIdx.x; i < N; i += NT) {
      sh.sc[i] = a.scratch[i];
      sh.fl[i] = a.flags[i];
    }
    if (threadIdx.x == 0) {
      sh.claim = 0;
      // Issued next to the step-counter load below, so the two latencies overlap.
      sh.stop = int(*reinterpret_cast<const volatile uint64_t*>(comm_abort(a.flags[rank], a.flag_offset)) != 0);
    }
    base = a.seq[bid];
    L = make_layout(a.count, P::kChunks, a.tile_bytes, P::kInstances, int32_t(sizeof(T)));
    step = 0;
    tile = inst;
    aborted = 0;
    prescale = C(1);
    if constexpr (P::kRed == kRedPreMulSum) {
      T v;
      if (a.prescale_ptr) {
        v = ld_elem(static_cast<const T*>(a.prescale_ptr));
      } else {
        // the low bytes (little-endian)
        if constexpr (sizeof(T) == 1)
          v = bitcast<T>(uint8_t(a.prescale));
        else if constexpr (sizeof(T) == 2)
          v = bitcast<T>(uint16_t(a.prescale));
        else if constexpr (sizeof(T) == 4)
          v = bitcast<T>(uint32_t(a.prescale));
        else
          v = bitcast<T>(uint64_t(a.prescale));
      }
      prescale = Compute<T>::load(v);
    }
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
    if (threadIdx.x == 0) a.seq[bid] = base + uint64_t(L.steps);
  }

  // ---- zero-copy entry and exit (zero_copy.cuh) -------------------------------
  MK_DEV bool zc_enter() { return dev::zc_enter(*this); }
  MK_DEV void zc_exit() { dev::zc_exit(*this); }

  // ---- failure -------------------------------------------------------------
  MK_DEV bool stop_requested(uint64_t t0) const {
    if (*reinterpret_cast<const volatile uint64_t*>(abort_word(rank)) != 0) return true;
    if (a.host_abort && *a.host_abort != 0) return true;
    return a.timeout_ns != 0 && globaltimer() - t0 > a.timeout_ns;
  }
  MK_DEV void fail(int32_t code, int32_t slot, int32_t peer_rank, int32_t op, uint64_t have, uint64_t want,
                   uint64_t waited) {
    aborted = 1;
    fail_record<N>(a.errors, a.host_abort, sh.fl, a.flag_offset, &sh.claim, rank, bid, code, inst, tb, slot, peer_rank,
                   op, uint64_t(step), have, want, waited);
  }

  // ---- synchronisation -------------------------------------------------------
  MK_DEV void spin(const WaitSpec& w) {
    const int64_t target = int64_t(value()) + w.iter;
    if (target <= 0) return;
    const uint64_t* f = sh.fl[rank] + int64_t(inst) * P::kSlots + w.slot;
    uint64_t have = 0, t0 = 0;
    if (bounded_spin([&] { return (have = ld_acquire_sys(f)) >= uint64_t(target); },
                     [&](uint64_t since) { return stop_requested(since); }, &t0))
      return;
    fail(kErrWaitTimeout, w.slot, peer(w.peer), w.op, have, uint64_t(target), globaltimer() - t0);
  }
  // Thread i spins on wait i; then the whole block proceeds together.
  template <int CNT>
  MK_DEV bool wait_all(const WaitSpec (&w)[CNT]) {
    static_assert(CNT <= NT, "more waits than threads");
    if (int(threadIdx.x) < CNT) spin(w[threadIdx.x]);
    return !__syncthreads_or(aborted);
  }
  // After the block's writes: thread i releases flag i.
  // A signal to a rank on another node (no flag pointer: network plans)
  // goes through the block's connection to it, by thread 0 in order, after
  // the block's puts to that rank (templates/net.cuh).
  template <int CNT>
  MK_DEV void signal_all(const SignalSpec (&s)[CNT]) {
    static_assert(CNT <= NT, "more signals than threads");
    __syncthreads();
    if (int(threadIdx.x) < CNT) {
      uint64_t* f = sh.fl[peer(s[threadIdx.x].peer)];
      if (!P::kNet || f) st_release_sys(f + int64_t(inst) * P::kSlots + s[threadIdx.x].slot, value());
    }
    if constexpr (P::kNet) {
      if (threadIdx.x == 0)
        for (int k = 0; k < CNT && !aborted; ++k)
          if (!sh.fl[peer(s[k].peer)]) net_signal(peer(s[k].peer), s[k].slot);
    }
  }

  // ---- network (plans with puts: P::kNet) ---------------------------------
  // Thread 0: this block's connection to rank p, with a free FIFO entry
  // reserved (its sequence number in *seq); null after a failure.
  // Out of line: NVRTC 13.0 crashed (about one compile in four, inside
  // nvrtcCompileProgram) when this spin and its failure report were inlined
  // into signal_all's loop; a wait that rarely spins loses nothing by a call.
  __device__ __noinline__ const NetConnDev* net_reserve(int32_t p, int32_t op, uint64_t* seq) {
    const NetTable* nt = static_cast<const NetTable*>(a.net);
    const NetConnDev* cn = nt ? net_conns(nt)[(int64_t(inst) * P::kTbs + tb) * N + p] : nullptr;
    if (!cn) {
      fail(kErrNoConn, -1, p, op, 0, 0, 0);
      return nullptr;
    }
    const uint64_t s = net_next(*cn);
    uint64_t t0 = 0;
    if (!bounded_spin([&] { return net_free(*cn, s); }, [&](uint64_t since) { return stop_requested(since); }, &t0)) {
      fail(kErrWaitTimeout, kNetFifoSlot, p, op, net_load(cn->done), s, globaltimer() - t0);
      return nullptr;
    }
    *seq = s;
    return cn;
  }
  MK_DEV void net_signal(int32_t p, int32_t slot) {
    uint64_t seq = 0;
    if (const NetConnDev* cn = net_reserve(p, -1, &seq)) {
      const NetTable* nt = static_cast<const NetTable*>(a.net);
      net_commit(*cn, seq, kNetSignal, value(),
                 uint32_t(nt->flag_off / 8 + int64_t(inst) * P::kSlots + slot));
    }
  }
  // A put: the block copies (or reduces) the tile into the reserved entry's
  // staging area, then thread 0 commits it for the proxy.
  template <int NS, bool RED, bool FINAL, bool GEN>
  MK_DEV void net_put(const uint64_t (&s)[NS], uint64_t d, int32_t p, int32_t pcode, int32_t op, unsigned sll) {
    static_assert(!P::kLL, "network plans use the simple protocol");
    const NetConnDev* cn = nullptr;
    if (threadIdx.x == 0) {
      uint64_t seq = 0;
      cn = net_reserve(p, op, &seq);
      sh.net_seq = seq;
    }
    if (__syncthreads_or(aborted)) return;
    const NetTable* nt = static_cast<const NetTable*>(a.net);
    cn = net_conns(nt)[(int64_t(inst) * P::kTbs + tb) * N + p];
    const uint64_t seq = sh.net_seq;
    T* src[NS];
    T* dst[1] = {reinterpret_cast<T*>(net_data(*cn, seq))};
    typename Comb::Pro pro = make_pro();
#pragma unroll
    for (int i = 0; i < NS; ++i) {
      src[i] = decode(s[i]);
      if (int(s[i] & 3u) == kRefIn) pro.mask |= 1u << i;
    }
    const int64_t n = len(decode_pos(pcode));
    prim<NS, 1, RED, FINAL, GEN>(src, dst, n, op, pro, sll, 0u);
    __syncthreads();
    if (threadIdx.x == 0) {
      const int64_t off = nt->scratch_off + scratch_offset(kSlotBytes, P::kScratch, P::kDepth, inst,
                                                           int64_t(base) + step, int32_t(d >> 32));
      net_commit(*cn, seq, kNetPut, uint64_t(off), uint32_t(n > 0 ? n * int64_t(sizeof(T)) : 0));
    }
  }
  MK_DEV bool barrier() { return !__syncthreads_or(aborted); }

  // ---- data --------------------------------------------------------------
  // One tile: dst[d][0..n) := combine(src[0][0..n), ..., src[NS-1][0..n)).
  // sll/dll: bit masks of sources/destinations in LL (or Lamport) format:
  // the generated code's constants (its SLL/DLL template arguments), or, in
  // a generic op, computed from the operands (the same for every thread).
  // `pro`: which sources the PreMulSum prologue scales (prims.cuh).
  template <int NS, int ND, bool RED, bool FINAL, bool GEN = false>
  MK_DEV void prim(T* const (&src)[NS], T* const (&dst)[ND], int64_t n, int32_t op, const typename Comb::Pro& pro,
                   unsigned sll, unsigned dll) {
    static_assert(NS >= 1 && ND >= 1, "an op reads and writes something");
    static_assert(RED || NS == 1, "a copy has one source");
    if (n <= 0) return;
    if constexpr (P::kLamport)
      lamport_tile<Ctx, NS, ND, RED, FINAL, GEN>(*this, src, dst, n, op, pro, sll, dll);
    else if constexpr (P::kLL)
      ll_tile<Ctx, NS, ND, RED, FINAL, GEN>(*this, src, dst, n, op, pro, sll, dll);
    else
      simple_tile<Ctx, NS, ND, RED, FINAL>(src, dst, n, pro);
  }

  // The prologue's state for one op: PreMulSum's scalar, or a fusion
  // prologue's scalars (the call's, Args::epi_scalars); sources marked by
  // the caller.
  MK_DEV typename Comb::Pro make_pro() const {
    typename Comb::Pro p{prescale, 0u, nullptr, {C(0), C(0), C(0), C(0)}};
    if constexpr (Comb::kUser)
#pragma unroll
      for (int k = 0; k < 4; ++k) p.s[k] = C(a.epi_scalars[k]);
    return p;
  }

  // Decodes an op's operands and runs its tile. The prologue scales the
  // sources that are this rank's input: only owners touch user buffers in
  // the plans a PreMulSum kernel is built from (the compiler proves it,
  // verify_prologue), so an input operand is this rank's own.
  template <int NS, int ND, bool RED, bool FINAL, bool GEN = false>
  MK_DEV void run_op(const uint64_t (&s)[NS], const uint64_t (&d)[ND], int32_t pcode, int32_t op, unsigned sll,
                     unsigned dll) {
    static_assert(!(Comb::kPre && P::kZeroCopy), "kernels with a prologue read only their own input");
    if constexpr (P::kNet) {  // a put: a destination in the scratch of a rank on another node
      if (ND == 1 && int(d[0] & 3u) == kRefScratch) {
        const int32_t p = peer(int32_t((d[0] >> 4) & 0xfffu));
        if (!sh.sc[p]) return net_put<NS, RED, FINAL, GEN>(s, d[0], p, pcode, op, sll);
      }
    }
    T* src[NS];
    T* dst[ND];
    typename Comb::Pro pro = make_pro();
#pragma unroll
    for (int i = 0; i < NS; ++i) {
      src[i] = decode(s[i]);
      if (int(s[i] & 3u) == kRefIn) pro.mask |= 1u << i;
    }
#pragma unroll
    for (int i = 0; i < ND; ++i) dst[i] = decode(d[i]);
    prim<NS, ND, RED, FINAL, GEN>(src, dst, len(decode_pos(pcode)), op, pro, sll, dll);
  }

  // One op of the schedule, then the barrier that orders it before the
  // block's next op: inlined in kernels of few statements (P::kInlineOps),
  // else called, so that a kernel of many ops stays small. False: the
  // collective aborted.
  template <bool RED, bool FINAL, unsigned SLL, unsigned DLL, int NS, int ND>
  MK_DEV bool op(const uint64_t (&s)[NS], const uint64_t (&d)[ND], int32_t pcode, int32_t op) {
    if constexpr (P::kInlineOps) {
      run_op<NS, ND, RED, FINAL>(s, d, pcode, op, SLL, DLL);
      return barrier();
    } else {
      return op_called<RED, FINAL, SLL, DLL>(s, d, pcode, op);
    }
  }
  template <bool RED, bool FINAL, unsigned SLL, unsigned DLL, int NS, int ND>
  __device__ __noinline__ bool op_called(const uint64_t (&s)[NS], const uint64_t (&d)[ND], int32_t pcode, int32_t op) {
    run_op<NS, ND, RED, FINAL>(s, d, pcode, op, SLL, DLL);
    return barrier();
  }
  // An op of a one-pass kernel (passes/one_pass.cpp): inlined, and no
  // barrier after it (each thread's units are its own in every op).
  template <bool RED, bool FINAL, unsigned SLL, unsigned DLL, int NS, int ND>
  MK_DEV bool op_pass(const uint64_t (&s)[NS], const uint64_t (&d)[ND], int32_t pcode, int32_t op) {
    run_op<NS, ND, RED, FINAL>(s, d, pcode, op, SLL, DLL);
    return !aborted;
  }
  // A generic op of a one-pass kernel (codegen: a reduce whose sources'
  // kinds differ between the ranks of one class, one_shot's own input at its
  // own place in the fixed rank order): its operands are numbers of the
  // rank's table row, so its LL (Lamport) masks come from them, as in
  // op_wide: an operand is in LL format exactly when it is scratch. NS and
  // ND stay constants, so the tile is the unrolled primitive, with one
  // warp-uniform branch per operand instead of one code path per rank.
  template <bool RED, bool FINAL, int NS, int ND>
  MK_DEV bool op_gpass(const uint64_t (&s)[NS], const uint64_t (&d)[ND], int32_t pcode, int32_t op) {
    static_assert(P::kOnePass, "generic unrolled ops are for one-pass kernels (others use op_wide)");
    unsigned sll = 0, dll = 0;
    if constexpr (P::kLL) {
#pragma unroll
      for (int i = 0; i < NS; ++i)
        if (int(s[i] & 3u) == kRefScratch) sll |= 1u << i;
#pragma unroll
      for (int i = 0; i < ND; ++i)
        if (int(d[i] & 3u) == kRefScratch) dll |= 1u << i;
    }
    run_op<NS, ND, RED, FINAL, true>(s, d, pcode, op, sll, dll);
    return !aborted;
  }

  // What generated code calls: named forms of op and op_pass.
#define MK_NAMED_OP(name, red, fin)                                                                           \
  template <unsigned SLL = 0u, unsigned DLL = 0u, int NS, int ND>                                             \
  MK_DEV bool name(const uint64_t (&s)[NS], const uint64_t (&d)[ND], int32_t pcode, int32_t id) {             \
    return op<red, fin, SLL, DLL>(s, d, pcode, id);                                                           \
  }                                                                                                           \
  template <unsigned SLL = 0u, unsigned DLL = 0u, int NS, int ND>                                             \
  MK_DEV bool name##_pass(const uint64_t (&s)[NS], const uint64_t (&d)[ND], int32_t pcode, int32_t id) {      \
    return op_pass<red, fin, SLL, DLL>(s, d, pcode, id);                                                      \
  }
  MK_NAMED_OP(copy, false, false)
  MK_NAMED_OP(reduce, true, false)
  MK_NAMED_OP(reduce_final, true, true)
#undef MK_NAMED_OP

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
  MK_DEV uint32_t* wide_in() {  // kernels with a prologue: which operands are this rank's input
    __shared__ uint32_t m[(Comb::kPre && P::kWide > 0 ? P::kWide : 1) / 32 + 1];
    return m;
  }

  template <bool RED, bool FINAL>
  __device__ __noinline__ bool op_wide(const uint64_t* r, int ns, int nd, int32_t pcode, int32_t op) {
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
    typename Comb::Pro pro = make_pro();
    if constexpr (Comb::kPre) {
      uint32_t* in = wide_in();
      for (int w = threadIdx.x; w * 32 < nr; w += NT) {
        uint32_t m = 0;
        for (int i = w * 32; i < nr && i < w * 32 + 32; ++i)
          if (int(r[i] & 3u) == kRefIn) m |= 1u << (i - w * 32);
        in[w] = m;
      }
      pro.wide = in;
    }
    __syncthreads();
    const int64_t n = len(decode_pos(pcode));
    if (n > 0) {
      if constexpr (P::kLL)
        ll_wide<Ctx, RED, FINAL>(*this, p, ll, ns, nd, n, op, pro);
      else
        simple_wide<Ctx, RED, FINAL>(p, ns, nd, n, pro);
    }
    return barrier();  // also: no thread rewrites p/ll while another reads them
  }
};

// Group kernels (codegen group_source): collectives that share scratch,
// flags and step counters run one after another on the same blocks. Between
// two of them every block of the earlier one has finished on this rank, as
// between two launches: each block arrives on the plan's tail word (the word
// after its flag slots; fused.cuh tail_barrier counts the same way: arrivals
// in the low 32 bits, a generation in the high 32, the last arrival resets
// both in one atomic) and waits for the last. False: the communicator is
// stopping (an abort, a failure here or on a peer, or this barrier timed out,
// which it records as kErrWaitTimeout at kChainBarrierSlot): the block runs
// no further collective of the chain, so the first failure's record stays.
template <class P>
MK_DEV bool chain_barrier(const Args& a, int32_t bid, int32_t nbid) {
  __shared__ int stop;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint64_t* const flags = a.flags[a.rank];
    uint64_t* const w = flags + int64_t(P::kInstances) * P::kSlots;
    auto abort_of = [&](int32_t q) {
      return a.flags[q] ? reinterpret_cast<uint64_t*>(reinterpret_cast<char*>(a.flags[q]) - a.flag_offset) : nullptr;
    };
    // The device abort word only (mkCommAbort copies the host's flag into
    // it): host-mapped reads from every block queue on PCIe, about a
    // microsecond each (fused.cuh learned the same).
    auto stopping = [&] { return *reinterpret_cast<const volatile uint64_t*>(abort_of(a.rank)) != 0; };
    __threadfence();  // this block's stores before its arrival
    const uint64_t old = atomicAdd(reinterpret_cast<unsigned long long*>(w), 1ull);
    const uint64_t gen = old >> 32;
    if ((old & 0xffffffffull) == uint64_t(nbid) - 1) {
      atomicAdd(reinterpret_cast<unsigned long long*>(w), (1ull << 32) - uint64_t(nbid));
    } else {
      uint64_t have = 0, t0 = 0;
      const bool ok = bounded_spin([&] { return ((have = ld_acquire_sys(w)) >> 32) != gen; },
                                   [&](uint64_t since) {
                                     return stopping() || (a.timeout_ns != 0 && globaltimer() - since > a.timeout_ns);
                                   },
                                   &t0);
      // A lane's block beyond this plan's grid (a larger member follows)
      // has no record of its own: it stops the ranks without one.
      if (!ok && !stopping()) {
        if (bid < P::kTbs * P::kInstances)
          record_failure(a.errors[bid], a.rank, a.host_abort, P::kRanks, abort_of, int32_t(kErrWaitTimeout),
                         bid / P::kTbs, bid % P::kTbs,
                         kChainBarrierSlot, a.rank, -1, 0, have & 0xffffffffull, uint64_t(nbid),
                         globaltimer() - t0);
        else
          for (int32_t q = 0; q < P::kRanks; ++q) st_release_sys(abort_of(q), 1);
      }
    }
    __threadfence();
    stop = int(stopping());
  }
  __syncthreads();
  return !stop;
}

}  // namespace dev
}  // namespace mk
