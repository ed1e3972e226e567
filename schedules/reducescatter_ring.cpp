// reducescatter.ring: block b travels the ring, picking up each rank's block b,
// and completes on rank b. n-1 hops; bandwidth-optimal.
#include <mk/dsl.hpp>

using namespace mk::dsl;

static void reducescatter_ring(Program& p) {
  const int n = p.ranks();
  p.instances(4);
  if (n == 1) {
    p.copy(p.output(0, 0), p.input(0, 0));
    return;
  }
  auto mod = [n](int x) { return ((x % n) + n) % n; };
  for (int t = 0; t < n - 1; ++t)
    for (int r = 0; r < n; ++r) {
      const int b = mod(r - t - 1);
      if (t == 0)
        p.copy(p.scratch((r + 1) % n, 0), p.input(r, b));
      else
        p.reduce(p.scratch((r + 1) % n, t), {p.input(r, b), p.scratch(r, t - 1)});
    }
  for (int r = 0; r < n; ++r) p.reduce(p.output(r, 0), {p.input(r, r), p.scratch(r, n - 2)});
}

MK_SCHEDULE("reducescatter.ring", reducescatter, reducescatter_ring,
            "ring reduce-scatter; n-1 hops, bandwidth-optimal");
