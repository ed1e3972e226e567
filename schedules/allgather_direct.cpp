// allgather.direct: every rank pushes its block to every peer at once; one
// hop. Latency-optimal; on a switched NVLink fabric all links work in parallel.
#include <mk/dsl.hpp>

using namespace mk::dsl;

static void allgather_direct(Program& p) {
  p.instances(2);
  p.all_gather(p.all_ranks(), [&](int r) { return p.input(r, 0); },
               [&](int to, int from) { return p.output(to, from); }, /*self=*/true);
}

MK_SCHEDULE("allgather.direct", allgather, allgather_direct,
            "every rank pushes its block to every peer; one hop");
