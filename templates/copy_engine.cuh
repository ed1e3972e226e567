// The copy-engine path's one kernel (runtime/launch/ce.hpp): copy engines move the
// data of an all-gather, all-to-all or broadcast tile by tile through peers'
// scratch, and between the copies this one-warp kernel signals and waits
// (a copy engine cannot wait for a peer, and a stream memory-op wait is
// neither bounded nor safe when streams share a hardware queue).
//
// Each rank keeps, per peer p, two monotonic counters of its own (tiles it
// shipped to p, tiles of p's it consumed) and two words p writes (tiles p
// shipped here, tiles of ours p consumed). Counters live in device memory,
// so launches and graph replays continue one sequence and need no reset; the
// copies' addresses are fixed per call, the counters are not.
#pragma once
#include "abi.cuh"
#include "reduce.cuh"
#include "sync.cuh"

namespace mk {
namespace dev {

// Per rank, in the communicator's flag part: [kCeWords * nranks] words.
enum CeWord : int32_t {
  kCeReady = 0,     // [p]: tiles p shipped into this rank's scratch (p writes)
  kCeConsumed = 1,  // [p]: tiles of this rank's p consumed from its scratch (p writes)
  kCeShipped = 2,   // [p]: tiles this rank shipped to p (this rank's send side)
  kCeTaken = 3,     // [p]: tiles of p's this rank consumed (this rank's receive side)
};
constexpr int32_t kCeWords = 4;

// One launch: for each peer p of `peers`, optionally bump the counter and
// write it to p's word (signal), then optionally wait until this rank's word
// from p reaches the counter plus `delta`.
struct CeSyncArgs {
  uint64_t* counters;            // [nranks] this side's counters (kCeShipped or kCeTaken row)
  uint64_t* const* signal;       // [nranks] the word each peer reads from this side (on the peer)
  const uint64_t* watch;         // [nranks] the words peers write for this side (here)
  uint64_t* const* abort_words;  // [nranks] every rank's communicator abort word
  ErrorRecord* error;            // this side's record (host-mapped)
  volatile int32_t* host_abort;  // as Args::host_abort
  uint64_t timeout_ns;           // 0: never
  int64_t delta;                 // wait until watch[p] >= counters[p] + delta (skipped when <= 0)
  int32_t rank;
  int32_t nranks;
  int32_t only;     // -1: every peer; else that one rank
  int32_t bump;     // 1: counters[p] += 1, then signal[p] := counters[p]
  int32_t wait;     // 1: wait as above
  int32_t side;     // 0: send side, 1: receive side (error reports)
  int32_t tile;     // the tile of the call (error reports)
  int32_t pad_;
};
static_assert(sizeof(CeSyncArgs) == 96, "CeSyncArgs is 96 bytes on host and device");

// The reduce kernel of reduce-scatter and all-reduce tiles: dst[i] :=
// finalize(src_0[i] op src_1[i] op ... op src_{n-1}[i]) in rank order, where
// this rank's source is `own` and peer q's is its slot in this rank's scratch
// (scratch + (q * slots + slot) * slot_bytes). Every rank reduces its own
// block (chunk) only, so every rank ends with the same bits.
struct CeReduceArgs {
  char* dst;
  const char* own;
  const char* scratch;  // this rank's copy-engine scratch
  int64_t bytes;        // this tile's (a whole number of elements)
  int64_t slot_bytes;   // the tile the scratch is laid out for
  int32_t rank;
  int32_t nranks;
  int32_t slot;
  int32_t slots;
};
static_assert(sizeof(CeReduceArgs) == 56, "CeReduceArgs is 56 bytes on host and device");

#if MK_DEVICE_CODE
template <typename T, int K>
MK_DEV typename Compute<T>::type ce_source(const CeReduceArgs& a, int q, int64_t i) {
  const T* src = q == a.rank ? reinterpret_cast<const T*>(a.own)
                             : reinterpret_cast<const T*>(a.scratch + (int64_t(q) * a.slots + a.slot) * a.slot_bytes);
  return Compute<T>::load(src[i]);
}

// 16 bytes a thread where every pointer allows it (scratch slots always do;
// the caller's buffers most often), element by element for the rest. The
// copies that wrote the slots finished before this kernel began.
template <typename T, int K>
MK_DEV void ce_reduce(const CeReduceArgs& a) {
  using C = typename Compute<T>::type;
  constexpr int E = int(16 / sizeof(T));
  const int64_t n = a.bytes / int64_t(sizeof(T));
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, stride = int64_t(gridDim.x) * blockDim.x;
  int64_t done = 0;
  const bool vec = ((reinterpret_cast<uintptr_t>(a.dst) | reinterpret_cast<uintptr_t>(a.own) |
                     reinterpret_cast<uintptr_t>(a.scratch) | uintptr_t(a.slot_bytes)) %
                    16) == 0;
  if (vec) {
    const int64_t nv = n / E;
    for (int64_t v = tid; v < nv; v += stride) {
      C acc[E];
#pragma unroll 4
      for (int q = 0; q < a.nranks; ++q) {
        const char* base =
            q == a.rank ? a.own : a.scratch + (int64_t(q) * a.slots + a.slot) * a.slot_bytes;
        const V16 x = *reinterpret_cast<const V16*>(base + v * 16);
        const T* t = reinterpret_cast<const T*>(&x);
#pragma unroll
        for (int e = 0; e < E; ++e) {
          const C c = Compute<T>::load(t[e]);
          acc[e] = q == 0 ? c : red_apply<K, C>(acc[e], c);
        }
      }
      V16 out;
      T* o = reinterpret_cast<T*>(&out);
#pragma unroll
      for (int e = 0; e < E; ++e) o[e] = Compute<T>::store(red_finalize<K, C>(acc[e], a.nranks));
      *reinterpret_cast<V16*>(a.dst + v * 16) = out;
    }
    done = nv * E;
  }
  for (int64_t i = done + tid; i < n; i += stride) {
    C acc = ce_source<T, K>(a, 0, i);
    for (int q = 1; q < a.nranks; ++q) acc = red_apply<K, C>(acc, ce_source<T, K>(a, q, i));
    reinterpret_cast<T*>(a.dst)[i] = Compute<T>::store(red_finalize<K, C>(acc, a.nranks));
  }
}
#endif

#if MK_DEVICE_CODE
// The first failing lane of the launch writes the record (unless an earlier
// launch already did), then tells every rank to stop.
MK_DEV void ce_fail(const CeSyncArgs& a, int* claim, int32_t code, int32_t peer, uint64_t have, uint64_t want,
                    uint64_t waited, int32_t slot) {
  const bool root_cause =
      ld_acquire_sys(a.abort_words[a.rank]) == 0 && !(a.host_abort && *a.host_abort != 0);
  if (atomicCAS(claim, 0, 1) == 0 && *reinterpret_cast<volatile int32_t*>(&a.error->code) == 0) {
    ErrorRecord& e = *a.error;
    e.rank = a.rank;
    e.instance = a.side;
    e.tb = 0;
    e.slot = slot;
    e.peer = peer;
    e.op = -1;
    e.step = a.tile;
    e.have = have;
    e.want = want;
    e.waited_ns = waited;
    __threadfence_system();
    *reinterpret_cast<volatile int32_t*>(&e.code) = root_cause ? code : int32_t(kErrStopped);
    __threadfence_system();
    if (a.host_abort) a.host_abort[1] = 1;
  }
  for (int q = 0; q < a.nranks; ++q) st_release_sys(a.abort_words[q], 1);
}

MK_DEV void ce_sync(const CeSyncArgs& a) {
  __shared__ int claim;
  if (threadIdx.x == 0) claim = 0;
  __syncthreads();
  // An aborted communicator signals nothing: peers stop at their own check.
  if (ld_acquire_sys(a.abort_words[a.rank]) != 0) {
    if (threadIdx.x == 0) ce_fail(a, &claim, kErrStopped, -1, 0, 0, 0, kStoppedAtEntry);
    return;
  }
  // The copies before this launch on its stream are complete; make their
  // writes visible to the peers before any signal.
  __threadfence_system();
  // All signals first, then the waits: a lane with several peers must not
  // hold a signal back behind a wait.
  for (int p = int(threadIdx.x); p < a.nranks; p += int(blockDim.x)) {
    if (p == a.rank || (a.only >= 0 && p != a.only) || !a.bump) continue;
    const uint64_t c = a.counters[p] + 1;
    a.counters[p] = c;
    st_release_sys(a.signal[p], c);
  }
  if (!a.wait) return;
  for (int p = int(threadIdx.x); p < a.nranks; p += int(blockDim.x)) {
    if (p == a.rank || (a.only >= 0 && p != a.only)) continue;
    const int64_t target = int64_t(a.counters[p]) + a.delta;
    if (target <= 0) continue;
    const uint64_t want = uint64_t(target);
    uint64_t have = 0, t0 = 0;
    const bool ok = bounded_spin(
        [&] { return (have = ld_acquire_sys(a.watch + p)) >= want; },
        [&](uint64_t since) {
          if (ld_acquire_sys(a.abort_words[a.rank]) != 0) return true;
          if (a.host_abort && *a.host_abort != 0) return true;
          return a.timeout_ns != 0 && globaltimer() - since > a.timeout_ns;
        },
        &t0);
    if (!ok) {
      ce_fail(a, &claim, kErrWaitTimeout, p, have, want, globaltimer() - t0, a.tile);
      return;
    }
  }
}
#endif

}  // namespace dev
}  // namespace mk

#if MK_DEVICE_CODE && defined(MK_CE_KERNEL)
extern "C" __global__ void __launch_bounds__(32) mk_ce_sync(const mk::dev::CeSyncArgs a) { mk::dev::ce_sync(a); }
#endif
// The source defines MK_CE_REDUCE_T (mk::dev element type), MK_CE_REDUCE_K
// (RedKind) and MK_CE_REDUCE_NAME (mk_ce_reduce_<dtype>_<op>, e.g.
// mk_ce_reduce_bf16_sum); runtime/launch/ce.cpp writes it.
#if MK_DEVICE_CODE && defined(MK_CE_REDUCE_T)
extern "C" __global__ void __launch_bounds__(256) MK_CE_REDUCE_NAME(const mk::dev::CeReduceArgs a) {
  mk::dev::ce_reduce<MK_CE_REDUCE_T, MK_CE_REDUCE_K>(a);
}
#endif
