// broadcast.direct: the root pushes its buffer to every rank. Written for root
// 0; the runtime relabels ranks for any other root.
#include <mk/dsl.hpp>

using namespace mk::dsl;

static void broadcast_direct(Program& p) {
  const int n = p.ranks();
  const int root = p.root();
  p.instances(2);
  for (int d = 0; d < n; ++d) p.copy(p.output((root + d) % n, 0), p.input(root, 0));
}

MK_SCHEDULE("broadcast.direct", broadcast, broadcast_direct,
            "the root pushes its buffer to every rank; one hop");
