// Fused epilogues (include/mk/fusion.hpp): the kernel's tail.
//
// A fused kernel runs the collective as usual; then, once every block of this
// rank has finished its ops (a grid barrier on the plan's tail word), the
// blocks take the rank's output rows in turn (row r: block r mod grid) and
// run the fusion's Epi::row on each, in place. What makes that sound is
// proved by the compiler (verify/epilogue.cpp): in the plans a fused kernel is
// built from, only a rank's own ops touch its buffers, so after the barrier
// every output element holds its final value, nothing writes it again, and
// no peer reads it; one block owns a row.
#pragma once
#include "kernel.cuh"

#if MK_DEVICE_CODE
namespace mk {
namespace dev {

// Whether a fusion's traits ask for checked accessors (MK_FUSION_CHECK=1, or
// `mkc compile --fusion-check`): F::kCheck, absent from traits generated
// before the option existed (plans a group kernel recompiles).
template <class F, class = void>
struct FusionChecked {
  static constexpr bool value = false;
};
template <class F>
struct FusionChecked<F, typename VoidOf<decltype(F::kCheck)>::type> {
  static constexpr bool value = F::kCheck;
};

// The row context the user's Epi::row sees (the host has the same interface:
// include/mk/fusion.hpp HostRow). Cx: the kernel context (Ctx<P>); F: the
// fusion's traits from the generated source (operand types O0..O5 and
// shapes kS0..kS5: 0 per element, 1 per column, 2 per row).
template <class Cx, class F>
struct RowCtx {
  using T = typename Cx::T;
  using C = typename Compute<T>::type;
  static constexpr int NT = Cx::NT;
  // Elements per 16-byte vector of the collective's dtype (the vector
  // accessors move V elements of any operand at once).
  static constexpr int V = 16 / int(sizeof(T));
  int32_t n;
  int64_t row;
  int64_t stride;  // the row length rows are laid out with (the last row may be shorter)
  T* out_row;
  const Args& a;
  C* red;        // shared: NT / 32 partials
  bool aligned;  // the call's buffers allow vectors (epilogue_rows), given n % V == 0

  // Checked accessors (F::kCheck): an access outside the row, an operand or
  // scalar the fusion does not declare, a store into an input operand or a
  // vector access on a row that is not vectorised prints what and where, and
  // traps (the launch fails with an illegal instruction; the communicator's
  // next call reports it). The same rules the CPU checker enforces
  // (compiler/verify/fusion_check.hpp) on rows it tried, here on every row.
  static constexpr bool kCheck = FusionChecked<F>::value;
  MK_DEV void fault(const char* call, const char* what, long long x, long long hi) const {
    if constexpr (kCheck) {
      if (hi >= 0)
        printf("mKernel: fusion %s (MK_FUSION_CHECK): row %lld of %d element(s), thread %d: %s: %s %lld, outside "
               "0..%lld\n",
               F::name(), (long long)row, n, int(threadIdx.x), call, what, x, hi);
      else
        printf("mKernel: fusion %s (MK_FUSION_CHECK): row %lld of %d element(s), thread %d: %s: %s %lld\n", F::name(),
               (long long)row, n, int(threadIdx.x), call, what, x);
      __trap();
    }
  }
  MK_DEV void check_i(const char* call, int i) const {
    if constexpr (kCheck)
      if (i < 0 || i >= n) fault(call, "element i =", i, n - 1);
  }
  MK_DEV void check_k(const char* call, int k, bool write) const {
    if constexpr (kCheck) {
      if (k < 0 || k >= F::kOps) fault(call, "operand k =", k, F::kOps - 1);
      if (write && !((F::kOutputs >> k) & 1u)) fault(call, "a store into input operand k =", k, -1);
    }
  }
  MK_DEV void check_ki(const char* call, int k, int i, bool write) const {
    if constexpr (kCheck) {
      check_k(call, k, write);
      const int shape = k == 0 ? F::kS0 : k == 1 ? F::kS1 : k == 2 ? F::kS2 : k == 3 ? F::kS3 : k == 4 ? F::kS4 : F::kS5;
      if (shape != 2) check_i(call, i);
    }
  }
  MK_DEV void check_v(const char* call, int v) const {
    if constexpr (kCheck) {
      if (!vec()) fault(call, "a vector access on a row that is not vectorised (r.vec() is false): vector", v, -1);
      if (v < 0 || v >= nv()) fault(call, "vector v =", v, nv() - 1);
    }
  }

  MK_DEV int first() const { return int(threadIdx.x); }
  MK_DEV int step() const { return NT; }
  // Vectors: whether this row may be moved V elements at a time, and how many
  // vectors it holds (element i of vector v is element v * V + i).
  MK_DEV bool vec() const { return aligned && n % V == 0; }
  MK_DEV int nv() const { return n / V; }
  // Rounds to the collective's dtype, as a store to the output would.
  MK_DEV C round(C v) const { return Compute<T>::load(Compute<T>::store(v)); }
  // The final values, written by other blocks (or the previous kernel) and
  // made visible by the tail barrier's acquire and __syncthreads (or the
  // kernel boundary): plain loads, which the compiler may batch (volatile
  // loads would wait out one memory latency per element).
  MK_DEV C out(int i) const {
    check_i("r.out(i)", i);
    return Compute<T>::load(out_row[i]);
  }
  MK_DEV void set_out(int i, C v) {
    check_i("r.set_out(i, v)", i);
    out_row[i] = Compute<T>::store(v);
  }

  template <class U, int S>
  MK_DEV U* at(int k, int i) const {
    U* base = static_cast<U*>(const_cast<void*>(a.epi_ops[k]));
    if constexpr (S == 0)
      return base + row * stride + i;
    else if constexpr (S == 1)
      return base + i;
    else
      return base + row;
  }
  template <class U, int S>
  MK_DEV C ld_as(int k, int i) const {
    return C(Compute<U>::load(*at<U, S>(k, i)));
  }
  template <class U, int S>
  MK_DEV void st_as(int k, int i, C v) {
    *at<U, S>(k, i) = Compute<U>::store(typename Compute<U>::type(v));
  }
  // k is a constant at every call site: the switch folds away.
  MK_DEV C ld(int k, int i) const {
    check_ki("r.ld(k, i)", k, i, false);
    switch (k) {
      case 0: return ld_as<typename F::O0, F::kS0>(0, i);
      case 1: return ld_as<typename F::O1, F::kS1>(1, i);
      case 2: return ld_as<typename F::O2, F::kS2>(2, i);
      case 3: return ld_as<typename F::O3, F::kS3>(3, i);
      case 4: return ld_as<typename F::O4, F::kS4>(4, i);
      default: return ld_as<typename F::O5, F::kS5>(5, i);
    }
  }
  MK_DEV void st(int k, int i, C v) {
    check_ki("r.st(k, i, v)", k, i, true);
    switch (k) {
      case 0: st_as<typename F::O0, F::kS0>(0, i, v); break;
      case 1: st_as<typename F::O1, F::kS1>(1, i, v); break;
      case 2: st_as<typename F::O2, F::kS2>(2, i, v); break;
      case 3: st_as<typename F::O3, F::kS3>(3, i, v); break;
      case 4: st_as<typename F::O4, F::kS4>(4, i, v); break;
      default: st_as<typename F::O5, F::kS5>(5, i, v); break;
    }
  }
  // V elements of U at p (aligned to V * sizeof(U)), moved as the widest
  // words that fit: one 16-byte access per vector of the collective's dtype.
  template <class U>
  union Pack {
    U e[V];
    uint4 w16[(sizeof(U) * V) / 16 > 0 ? (sizeof(U) * V) / 16 : 1];
    uint2 w8;
    uint32_t w4;
  };
  template <class U>
  MK_DEV static void ld_pack(const U* p, Pack<U>& k) {
    constexpr int B = int(sizeof(U)) * V;
    if constexpr (B >= 16) {
#pragma unroll
      for (int i = 0; i < B / 16; ++i) k.w16[i] = reinterpret_cast<const uint4*>(p)[i];
    } else if constexpr (B == 8) {
      k.w8 = *reinterpret_cast<const uint2*>(p);
    } else if constexpr (B == 4) {
      k.w4 = *reinterpret_cast<const uint32_t*>(p);
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) k.e[j] = p[j];
    }
  }
  template <class U>
  MK_DEV static void st_pack(U* p, const Pack<U>& k) {
    constexpr int B = int(sizeof(U)) * V;
    if constexpr (B >= 16) {
#pragma unroll
      for (int i = 0; i < B / 16; ++i) reinterpret_cast<uint4*>(p)[i] = k.w16[i];
    } else if constexpr (B == 8) {
      *reinterpret_cast<uint2*>(p) = k.w8;
    } else if constexpr (B == 4) {
      *reinterpret_cast<uint32_t*>(p) = k.w4;
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) p[j] = k.e[j];
    }
  }
  // A per-row operand holds one value per row: ld_v gives it in every lane,
  // st_v stores x[0] (the host's HostRow does the same).
  template <class U, int S>
  MK_DEV void ld_v_as(int k, int v, C (&x)[V]) const {
    if constexpr (S == 2) {
      const C one = ld_as<U, S>(k, 0);
#pragma unroll
      for (int j = 0; j < V; ++j) x[j] = one;
    } else {
      Pack<U> p;
      ld_pack(at<U, S>(k, v * V), p);
#pragma unroll
      for (int j = 0; j < V; ++j) x[j] = C(Compute<U>::load(p.e[j]));
    }
  }
  template <class U, int S>
  MK_DEV void st_v_as(int k, int v, const C (&x)[V]) {
    if constexpr (S == 2) {
      st_as<U, S>(k, 0, x[0]);
    } else {
      Pack<U> p;
#pragma unroll
      for (int j = 0; j < V; ++j) p.e[j] = Compute<U>::store(typename Compute<U>::type(x[j]));
      st_pack(at<U, S>(k, v * V), p);
    }
  }
  MK_DEV void out_v(int v, C (&x)[V]) const {
    check_v("r.out_v(v, x)", v);
    Pack<T> p;
    ld_pack(out_row + v * V, p);
#pragma unroll
    for (int j = 0; j < V; ++j) x[j] = Compute<T>::load(p.e[j]);
  }
  MK_DEV void set_out_v(int v, const C (&x)[V]) {
    check_v("r.set_out_v(v, x)", v);
    Pack<T> p;
#pragma unroll
    for (int j = 0; j < V; ++j) p.e[j] = Compute<T>::store(x[j]);
    st_pack(out_row + v * V, p);
  }
  // Operand k (per element or per column) at vector v.
  MK_DEV void ld_v(int k, int v, C (&x)[V]) const {
    check_v("r.ld_v(k, v, x)", v);
    check_k("r.ld_v(k, v, x)", k, false);
    switch (k) {
      case 0: ld_v_as<typename F::O0, F::kS0>(0, v, x); break;
      case 1: ld_v_as<typename F::O1, F::kS1>(1, v, x); break;
      case 2: ld_v_as<typename F::O2, F::kS2>(2, v, x); break;
      case 3: ld_v_as<typename F::O3, F::kS3>(3, v, x); break;
      case 4: ld_v_as<typename F::O4, F::kS4>(4, v, x); break;
      default: ld_v_as<typename F::O5, F::kS5>(5, v, x); break;
    }
  }
  MK_DEV void st_v(int k, int v, const C (&x)[V]) {
    check_v("r.st_v(k, v, x)", v);
    check_k("r.st_v(k, v, x)", k, true);
    switch (k) {
      case 0: st_v_as<typename F::O0, F::kS0>(0, v, x); break;
      case 1: st_v_as<typename F::O1, F::kS1>(1, v, x); break;
      case 2: st_v_as<typename F::O2, F::kS2>(2, v, x); break;
      case 3: st_v_as<typename F::O3, F::kS3>(3, v, x); break;
      case 4: st_v_as<typename F::O4, F::kS4>(4, v, x); break;
      default: st_v_as<typename F::O5, F::kS5>(5, v, x); break;
    }
  }
  MK_DEV C scalar(int k) const {
    if constexpr (kCheck)
      if (k < 0 || k >= F::kScalars) fault("r.scalar(k)", "undeclared scalar k =", k, F::kScalars - 1);
    return unsigned(k) < 4u ? C(a.epi_scalars[k]) : C(0);  // undeclared: 0
  }
  MK_DEV C rsqrt(C x) const {
    if constexpr (sizeof(C) == 8)
      return ::rsqrt(x);
    else
      return ::rsqrtf(x);
  }
  MK_DEV C abs(C x) const { return x < C(0) ? -x : x; }

  // Block-wide reductions: a fixed tree (the same bits on every rank).
  template <class Op>
  MK_DEV C block_reduce(C x, Op op) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = op(x, __shfl_xor_sync(0xffffffffu, x, o));
    const int w = int(threadIdx.x) >> 5;
    if ((threadIdx.x & 31u) == 0) red[w] = x;
    __syncthreads();
    C t = red[0];
    for (int j = 1; j < NT / 32; ++j) t = op(t, red[j]);
    __syncthreads();  // red is free again
    return t;
  }
  MK_DEV C sum(C x) {
    return block_reduce(x, [](C p, C q) { return p + q; });
  }
  MK_DEV C max(C x) {
    return block_reduce(x, [](C p, C q) { return p > q ? p : q; });
  }
};

// After the collective: every block of this rank arrives; the last one to
// arrive opens the barrier. The tail word holds arrivals (low 32 bits) and a
// generation (high 32): the last arrival adds 2^32 - grid, which resets the
// count and bumps the generation in one atomic, so launches of any grid size
// reuse the word without a reset (launches on a stream do not overlap).
template <class Cx>
MK_DEV bool tail_barrier(Cx& c) {
  __syncthreads();
  if (threadIdx.x == 0) {
    uint64_t* w = c.sh.fl[c.rank] + Cx::kTailWord;
    __threadfence();  // this block's output stores before its arrival
    const uint64_t old = atomicAdd(reinterpret_cast<unsigned long long*>(w), 1ull);
    const uint64_t gen = old >> 32;
    if ((old & 0xffffffffull) == uint64_t(c.nbid) - 1) {
      atomicAdd(reinterpret_cast<unsigned long long*>(w), (1ull << 32) - uint64_t(c.nbid));
    } else {
      uint64_t have = 0, t0 = 0;
      if (!bounded_spin([&] { return ((have = ld_acquire_sys(w)) >> 32) != gen; },
                        [&](uint64_t since) { return c.stop_requested(since); }, &t0))
        c.fail(kErrWaitTimeout, kTailBarrierSlot, c.rank, -1, have & 0xffffffffull, uint64_t(c.nbid),
               globaltimer() - t0);
    }
    __threadfence();
  }
  return !__syncthreads_or(c.aborted);
}

// Rows first, first + stride, ... of the output.
template <class Cx, class F, class Epi>
MK_DEV void epilogue_rows(const Args& a, int64_t first, int64_t stride) {
  using T = typename Cx::T;
  using R = RowCtx<Cx, F>;
  __shared__ typename R::C red[Cx::NT / 32];
  const int64_t count = a.count;
  const int64_t n = a.epi_row;
  const int64_t rows = ceil_div(count, n);
  // Vectors need every row start of every element and column operand (and
  // of the output) on a vector boundary: row length a multiple of V, bases
  // aligned to V elements of their type (the runtime says which are which:
  // F's shapes; per-row operands are never moved as vectors).
  bool aligned = n % R::V == 0 && (reinterpret_cast<uintptr_t>(a.output) % 16) == 0;
  auto ok = [&](const void* p, int shape, int size) {
    return shape == 2 || p == nullptr || reinterpret_cast<uintptr_t>(p) % uintptr_t(size * R::V) == 0;
  };
  aligned = aligned && ok(a.epi_ops[0], F::kS0, int(sizeof(typename F::O0))) &&
            ok(a.epi_ops[1], F::kS1, int(sizeof(typename F::O1))) &&
            ok(a.epi_ops[2], F::kS2, int(sizeof(typename F::O2))) &&
            ok(a.epi_ops[3], F::kS3, int(sizeof(typename F::O3))) &&
            ok(a.epi_ops[4], F::kS4, int(sizeof(typename F::O4))) &&
            ok(a.epi_ops[5], F::kS5, int(sizeof(typename F::O5)));
  for (int64_t row = first; row < rows; row += stride) {
    R r{int32_t(min64(n, count - row * n)), row, n, static_cast<T*>(a.output) + row * n, a, red, aligned};
    Epi::row(r);
    __syncthreads();
  }
}

// The collective kernel's tail (epi_mode 0): after every block of this rank
// arrived, block b takes rows b, b + grid, ...
template <class Cx, class F, class Epi>
MK_DEV void epilogue_tail(Cx& c) {
  if (c.a.epi_mode != 0) return;  // the epilogue kernel runs it (every block sees the same mode)
  if (!tail_barrier(c)) return;
  epilogue_rows<Cx, F, Epi>(c.a, c.bid, c.nbid);
}

// The plan's epilogue kernel (epi_mode 1: many rows, a grid of its own on
// every SM), launched right after the collective on the same stream. A
// communicator that was aborted (the collective may have stopped half way)
// gets no epilogue. Only the device abort word is read: a read of the
// host-mapped words crosses PCIe, and those of many blocks queue there
// (hundreds of microseconds for a few hundred blocks).
template <class Cx, class F, class Epi>
MK_DEV void epilogue_kernel(const Args& a) {
  __shared__ int stop;
  if (threadIdx.x == 0)
    stop = int(*reinterpret_cast<const volatile uint64_t*>(Cx::comm_abort(a.flags[a.rank], a.flag_offset)) != 0);
  __syncthreads();
  if (stop) return;
  epilogue_rows<Cx, F, Epi>(a, blockIdx.x, gridDim.x);
}

}  // namespace dev
}  // namespace mk
#endif
