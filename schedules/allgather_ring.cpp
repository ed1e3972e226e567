// allgather.ring: at time u every rank forwards block r-u to its successor;
// n-1 hops, each rank sends (n-1)/n of the output. Bandwidth-optimal.
#include <mk/dsl.hpp>

using namespace mk::dsl;

static void allgather_ring(Program& p) {
  const int n = p.ranks();
  p.instances(4);
  auto mod = [n](int x) { return ((x % n) + n) % n; };
  for (int r = 0; r < n; ++r) p.copy(p.output(r, r), p.input(r, 0));
  for (int u = 0; u < n - 1; ++u)
    for (int r = 0; r < n; ++r) {
      const int b = mod(r - u);
      p.copy(p.output((r + 1) % n, b), u == 0 ? p.input(r, 0) : p.output(r, b));
    }
}

MK_SCHEDULE("allgather.ring", allgather, allgather_ring,
            "ring all-gather; n-1 hops, bandwidth-optimal");
