/*
 * mKernel's NCCL-compatible library: which library runs a call.
 *
 * A pure function of the call and of the communicator's MK_NCCL_FALLBACK
 * list, so that every rank of a job decides alike (a collective that one
 * rank ran on mKernel and another on NCCL would hang). Header-only: the
 * library and its tests include it.
 */
#ifndef MK_NCCL_ROUTE_H_
#define MK_NCCL_ROUTE_H_

#include <stddef.h>
#include <string.h>

namespace mk_nccl {

// The calls mKernel can run; anything else goes to NCCL.
enum Coll { kAllReduce = 0, kBroadcast, kReduce, kAllGather, kReduceScatter, kAlltoAll, kNumMk, kOther = kNumMk };
inline const char* coll_name(int c) {
  static const char* names[] = {"allreduce", "broadcast", "reduce", "allgather", "reducescatter", "alltoall", "other"};
  return c >= 0 && c <= kOther ? names[c] : "other";
}
inline bool coll_reduces(int c) { return c == kAllReduce || c == kReduce || c == kReduceScatter; }

constexpr unsigned kFallbackAll = (1u << kNumMk) - 1;

// MK_NCCL_FALLBACK: a comma-separated list of collectives NCCL runs instead
// of mKernel ("allreduce,alltoall"), "all" or "none" alone, or unset/empty
// (none). Strict: names are lower case, with no spaces and no empty items.
// Returns false for anything else and names the item it refused in `bad`
// (at most `cap` bytes; "" for an empty item).
inline bool parse_fallback(const char* s, unsigned* mask, char* bad, size_t cap) {
  *mask = 0;
  if (!s || !*s) return true;
  const bool alone = !strchr(s, ',');
  for (;;) {
    const char* e = strchr(s, ',');
    const size_t n = e ? size_t(e - s) : strlen(s);
    bool known = false;
    if (n == 3 && strncmp(s, "all", 3) == 0) {
      *mask = kFallbackAll;
      known = alone;
    } else if (n == 4 && strncmp(s, "none", 4) == 0) {
      known = alone;
    }
    for (int c = 0; c < kNumMk && !known && n > 0; ++c)
      if (strlen(coll_name(c)) == n && strncmp(s, coll_name(c), n) == 0) {
        *mask |= 1u << c;
        known = true;
      }
    if (!known) {
      const size_t k = n < cap ? n : cap - 1;
      memcpy(bad, s, k);
      bad[k] = 0;
      *mask = 0;
      return false;
    }
    if (!e) return true;
    s = e + 1;
  }
}

// Whether mKernel runs this call: one of its six collectives, a dtype it
// has (NCCL's 12), a built-in reduction op (not a PreMulSum op from
// ncclRedOpCreatePreMulSum: those are >= 5), and not in the fallback list.
// Counts, rank counts and registration do not change the answer today; they
// are arguments so that a future limit stays a function of what every rank
// passes alike.
inline bool mk_runs(int coll, int dtype, int op, size_t count, int nranks, bool registered, unsigned fallback) {
  (void)count;
  (void)nranks;
  (void)registered;
  if (coll < 0 || coll >= kNumMk) return false;
  if (fallback & (1u << coll)) return false;
  if (dtype < 0 || dtype >= 12) return false;
  if (coll_reduces(coll) && (op < 0 || op >= 5)) return false;
  return true;
}

// Across nodes (MK_NET: `nodes` > 1, ranks node by node) mKernel runs a
// broadcast or reduce only with its root on a node's first rank
// (runtime/launch/enqueue.cpp refuses the others); NCCL runs the rest.
// A function of the root and the communicator's shape, alike on every rank.
inline bool mk_runs_root(int coll, int root, int nranks, int nodes) {
  if (coll != kBroadcast && coll != kReduce) return true;
  return nodes <= 1 || nranks % nodes != 0 || root % (nranks / nodes) == 0;
}

}  // namespace mk_nccl

#endif  // MK_NCCL_ROUTE_H_
