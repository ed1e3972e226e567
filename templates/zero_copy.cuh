// Zero-copy plans (registered buffers): each rank's kernel learns every
// peer's buffers at entry and holds its own until every peer is done with
// them at exit. The per-rank area after the tail word (abi.cuh zc_words):
//   ZcMailbox box[nranks]   what each rank announced to this one
//   uint64_t  exit[nranks]  each rank's "done with your buffers" epoch
//   uint64_t  epoch         this rank's launches so far
//   uint64_t  done          blocks of this launch that finished
// X: the kernel's context (kernel.cuh Ctx<P>).
#pragma once
#include "abi.cuh"
#include "sync.cuh"

#if MK_DEVICE_CODE
namespace mk {
namespace dev {

template <class X>
struct ZcArea {
  X& c;
  MK_DEV uint64_t* base(int32_t r) const { return c.sh.fl[r] + X::kTailWord + 1; }
  MK_DEV ZcMailbox* box(int32_t at, int32_t from) const { return reinterpret_cast<ZcMailbox*>(base(at)) + from; }
  MK_DEV uint64_t* exit(int32_t at, int32_t from) const { return base(at) + kZcBoxWords * X::N + from; }
  MK_DEV uint64_t* epoch() const { return base(c.rank) + (kZcBoxWords + 1) * X::N; }
  MK_DEV uint64_t* done() const { return epoch() + 1; }
};

// Bounded wait for *f >= want; false (and the abort raised) on timeout.
// what: -1 at entry, -2 at exit (the error record's slot).
template <class X>
MK_DEV bool zc_spin(X& c, const uint64_t* f, uint64_t want, int32_t what, int32_t from) {
  uint64_t have = 0, t0 = 0;
  if (bounded_spin([&] { return (have = ld_acquire_sys(f)) >= want; },
                   [&](uint64_t since) { return c.stop_requested(since); }, &t0))
    return true;
  c.fail(kErrWaitTimeout, what, from, -1, have, want, globaltimer() - t0);
  return false;
}

// Every block: announce this rank's buffers (block 0 writes every peer's
// mailbox), then wait for every peer's announcement of this launch, check it
// against this call and map its buffers. A peer's announcement also means its
// kernel has started: its stream has produced its input and released its
// output. False: the collective aborted.
template <class X>
MK_DEV bool zc_enter(X& c) {
  const ZcArea<X> z{c};
  const Args& a = c.a;
  constexpr int N = X::N, NT = X::NT;
  const uint64_t E = *reinterpret_cast<volatile uint64_t*>(z.epoch()) + 1;
  if (c.bid == 0)
    for (int q = threadIdx.x; q < N; q += NT) {
      if (q == c.rank) continue;
      ZcMailbox* box = z.box(q, c.rank);
      box->windows = uint64_t(uint32_t(a.in_window)) | (uint64_t(uint32_t(a.out_window)) << 32);
      box->in_offset = a.in_offset;
      box->out_offset = a.out_offset;
      box->count = a.count;
      box->call_sig = a.call_sig;
      st_release_sys(&box->epoch, E);
    }
  for (int q = threadIdx.x; q < N; q += NT) {
    if (q == c.rank) {
      c.sh.zin[q] = const_cast<char*>(static_cast<const char*>(a.input));
      c.sh.zout[q] = static_cast<char*>(a.output);
      continue;
    }
    const ZcMailbox* box = z.box(c.rank, q);
    if (!zc_spin(c, &box->epoch, E, -1, q)) break;
    const volatile ZcMailbox* vb = box;
    const int32_t win[2] = {int32_t(uint32_t(vb->windows)), int32_t(uint32_t(vb->windows >> 32))};
    const int64_t off[2] = {vb->in_offset, vb->out_offset};
    const int64_t bytes[2] = {a.in_bytes, a.out_bytes};
    const int64_t count = vb->count;
    char* ptr[2] = {nullptr, nullptr};
    if (vb->call_sig != a.call_sig) {  // another collective, dtype, op or root: its buffers mean something else
      c.fail(kErrZcMismatch, kZcCall, q, -1, vb->call_sig, a.call_sig, 0);
      break;
    }
    if (count != a.count) {
      c.fail(kErrZcMismatch, kZcCount, q, -1, uint64_t(count), uint64_t(a.count), 0);
      break;
    }
    for (int k = 0; k < 2; ++k) {
      if (win[k] < 0) continue;
      const ZcPeerWindow* w = win[k] < a.max_windows ? a.windows + int64_t(win[k]) * N + q : nullptr;
      if (!w || !w->base) {
        c.fail(kErrZcMismatch, kZcWindow, q, -1, uint64_t(win[k]), 0, 0);
        break;
      }
      if (off[k] < 0 || off[k] + bytes[k] > w->bytes) {
        c.fail(kErrZcMismatch, kZcBounds, q, -1, uint64_t(off[k] + bytes[k]), uint64_t(w->bytes), 0);
        break;
      }
      ptr[k] = w->base + off[k];
    }
    c.sh.zin[q] = ptr[0];
    c.sh.zout[q] = ptr[1];
  }
  return !__syncthreads_or(c.aborted);
}

// Every block after its last step: the launch's last block on this rank
// tells every peer "done with your buffers" and waits until every peer has
// said the same, so no rank returns while a peer may still read or write its
// buffers. Then it advances the epoch for the next launch.
template <class X>
MK_DEV void zc_exit(X& c) {
  const ZcArea<X> z{c};
  constexpr int N = X::N, NT = X::NT;
  const uint64_t E = *reinterpret_cast<volatile uint64_t*>(z.epoch()) + 1;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();  // this block's peer writes, before it is counted
    c.sh.last = atomicAdd(reinterpret_cast<unsigned long long*>(z.done()), 1ull) == uint64_t(c.nbid) - 1;
  }
  __syncthreads();
  if (!c.sh.last) return;
  __threadfence_system();
  for (int q = threadIdx.x; q < N; q += NT)
    if (q != c.rank) st_release_sys(z.exit(q, c.rank), E);
  for (int q = threadIdx.x; q < N; q += NT)
    if (q != c.rank && !zc_spin(c, z.exit(c.rank, q), E, -2, q)) break;
  __syncthreads();
  if (threadIdx.x == 0) {
    *z.done() = 0;
    *reinterpret_cast<volatile uint64_t*>(z.epoch()) = E;
  }
}

}  // namespace dev
}  // namespace mk
#endif
