// allgather.direct: every rank pushes its block to every peer at once; one
// hop. Latency-optimal; on a switched NVLink fabric all links work in parallel.
#include <mk/dsl.hpp>

using namespace mk::dsl;

static void allgather_direct(Program& p) {
  const int n = p.ranks();
  p.instances(2);
  for (int d = 0; d < n; ++d)
    for (int r = 0; r < n; ++r) p.copy(p.output((r + d) % n, r), p.input(r, 0));
}

MK_SCHEDULE("allgather.direct", allgather, allgather_direct,
            "every rank pushes its block to every peer; one hop");
