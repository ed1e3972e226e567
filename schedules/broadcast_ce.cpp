// broadcast.ce: broadcast.direct's data flow moved by copy engines
// (runtime/launch/ce.hpp, docs/copy_engine.md): the root's buffer goes through a slot
// of every other rank's scratch into its output, tile by tile. Written for
// root 0; the runtime relabels ranks for any other root.
#include <mk/dsl.hpp>

using namespace mk::dsl;

static void broadcast_ce(Program& p) {
  const int n = p.ranks();
  const int root = p.root();
  for (int d = 0; d < n; ++d) p.copy(p.output((root + d) % n, 0), p.input(root, 0));
}

MK_CE_SCHEDULE("broadcast.ce", broadcast, broadcast_ce,
               "copy engines push the root's buffer through peers' scratch; no SM moves data");
