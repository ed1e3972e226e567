// allgather.ce: allgather.direct's data flow moved by copy engines
// (runtime/launch/ce.hpp, docs/copy_engine.md): each block goes from its owner's
// input through a slot of every peer's scratch into the peer's output, tile
// by tile; no kernel moves data, a one-warp kernel orders the copies. The
// program is what the copies compute, for `mkc verify` and `mkc simulate`;
// the runtime's protocol is tested in tests/unit/test_ce.cpp.
#include <mk/dsl.hpp>

using namespace mk::dsl;

static void allgather_ce(Program& p) {
  const int n = p.ranks();
  for (int d = 0; d < n; ++d)
    for (int r = 0; r < n; ++r) p.copy(p.output((r + d) % n, r), p.input(r, 0));
}

MK_CE_SCHEDULE("allgather.ce", allgather, allgather_ce,
               "copy engines push every block through peers' scratch; no SM moves data");
