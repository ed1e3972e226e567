// alltoall.ce: alltoall.direct's data flow moved by copy engines
// (runtime/launch/ce.hpp, docs/copy_engine.md): block q of rank r's input goes
// through a slot of rank q's scratch into block r of its output, tile by tile.
#include <mk/dsl.hpp>

using namespace mk::dsl;

static void alltoall_ce(Program& p) {
  const int n = p.ranks();
  for (int d = 0; d < n; ++d)
    for (int r = 0; r < n; ++r) {
      const int q = (r + d) % n;
      p.copy(p.output(q, r), p.input(r, q));
    }
}

MK_CE_SCHEDULE("alltoall.ce", alltoall, alltoall_ce,
               "copy engines send each block through its receiver's scratch; no SM moves data");
