// alltoall.direct: rank r sends block q of its input to rank q, which stores
// it as block r of its output; every pair at once, one hop.
#include <mk/dsl.hpp>

using namespace mk::dsl;

static void alltoall_direct(Program& p) {
  const int n = p.ranks();
  p.instances(2);
  for (int d = 0; d < n; ++d)
    for (int r = 0; r < n; ++r) {
      const int q = (r + d) % n;
      p.copy(p.output(q, r), p.input(r, q));
    }
}

MK_SCHEDULE("alltoall.direct", alltoall, alltoall_direct,
            "every rank sends each block straight to its destination; one hop");
