// reducescatter.ce: copy engines push block q of every rank's input into a
// slot of rank q's scratch, tile by tile (runtime/launch/ce.hpp, docs/copy_engine.md);
// a kernel on rank q reduces each tile as it lands, in rank order, with its
// own block into its output. The program is what the copies and the kernel
// compute, for `mkc verify` and `mkc simulate`; the runtime's protocol is
// tested in tests/unit/test_ce.cpp.
#include <mk/dsl.hpp>

using namespace mk::dsl;

static void reducescatter_ce(Program& p) {
  const int n = p.ranks();
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
    std::vector<Chunk> srcs;  // rank order, as the kernel reduces
    for (int q = 0; q < n; ++q) srcs.push_back(q == r ? p.input(r, r) : p.scratch(r, slot(q, r)));
    p.reduce(p.output(r, 0), srcs);
  }
}

MK_CE_SCHEDULE("reducescatter.ce", reducescatter, reducescatter_ce,
               "copy engines push each block to its owner, a kernel reduces tiles as they land");
