// reducescatter.direct: every rank pushes block q into rank q's scratch; each
// rank reduces what it received with its own block. One hop.
#include <mk/dsl.hpp>

using namespace mk::dsl;

static void reducescatter_direct(Program& p) {
  const int n = p.ranks();
  p.instances(2);
  if (n == 1) {
    p.copy(p.output(0, 0), p.input(0, 0));
    return;
  }
  // block `to` of rank `from` lands in `to`'s scratch, slot by distance
  auto slot = [&](int from, int to) { return p.scratch(to, ((from - to - 1) % n + n) % n); };
  p.reduce_scatter(p.all_ranks(), [&](int from, int to) { return p.input(from, to); },
                   [&](int r) { return p.output(r, 0); }, slot, Program::Order::own_first);
}

MK_SCHEDULE("reducescatter.direct", reducescatter, reducescatter_direct,
            "every rank pushes each block to its owner, owners reduce; one hop");
