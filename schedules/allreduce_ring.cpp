// allreduce.ring: the bandwidth-optimal ring. Each of the n chunks travels the
// ring twice: reduce-scatter (n-1 hops, each adding the local input), then
// all-gather (n-1 hops). Every rank sends 2(n-1)/n of the data; each chunk is
// reduced once, so every rank ends with bit-identical results.
//
// Written step-major ("at time t every rank does ..."), so every rank runs the
// same program up to rotation and the compiler emits one code path for all.
#include <mk/dsl.hpp>

using namespace mk::dsl;

static void allreduce_ring(Program& p) {
  const int n = p.ranks();
  p.chunks(n);
  p.instances(4);
  if (n == 1) {
    p.copy(p.output(0, 0), p.input(0, 0));
    return;
  }
  auto next = [n](int r) { return (r + 1) % n; };
  auto mod = [n](int x) { return ((x % n) + n) % n; };
  // Reduce-scatter: at time t rank r sends the partial sum of chunk r-t-1 to
  // its successor's scratch slot t; chunk c completes on rank c.
  for (int t = 0; t < n - 1; ++t)
    for (int r = 0; r < n; ++r) {
      const int c = mod(r - t - 1);
      if (t == 0)
        p.copy(p.scratch(next(r), 0), p.input(r, c));
      else
        p.reduce(p.scratch(next(r), t), {p.input(r, c), p.scratch(r, t - 1)});
    }
  for (int r = 0; r < n; ++r) p.reduce(p.output(r, r), {p.input(r, r), p.scratch(r, n - 2)});
  // All-gather: at time u rank r forwards chunk r-u to its successor.
  for (int u = 0; u < n - 1; ++u)
    for (int r = 0; r < n; ++r) {
      const int c = mod(r - u);
      p.copy(p.output(next(r), c), p.output(r, c));
    }
}

MK_SCHEDULE("allreduce.ring", allreduce, allreduce_ring,
            "ring reduce-scatter then ring all-gather; bandwidth-optimal, 2(n-1) hops");
