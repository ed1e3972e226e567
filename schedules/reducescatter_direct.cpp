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
  auto slot = [n](int from, int at) { return ((from - at - 1) % n + n) % n; };
  for (int d = 1; d < n; ++d)
    for (int r = 0; r < n; ++r) {
      const int q = (r + d) % n;
      p.copy(p.scratch(q, slot(r, q)), p.input(r, q));
    }
  for (int r = 0; r < n; ++r) {
    std::vector<Chunk> srcs{p.input(r, r)};
    for (int d = 1; d < n; ++d) srcs.push_back(p.scratch(r, slot((r + d) % n, r)));
    p.reduce(p.output(r, 0), srcs);
  }
}

MK_SCHEDULE("reducescatter.direct", reducescatter, reducescatter_direct,
            "every rank pushes each block to its owner, owners reduce; one hop");
