// allreduce.ce: reducescatter.ce over n chunks into the output, then
// allgather.ce of the chunks in place (runtime/launch/ce.hpp, docs/copy_engine.md):
// copy engines make every transfer, a kernel reduces each tile of a rank's
// chunk as it lands, in rank order. The program is what the copies and the
// kernel compute, for `mkc verify` and `mkc simulate`.
#include <mk/dsl.hpp>

using namespace mk::dsl;

static void allreduce_ce(Program& p) {
  const int n = p.ranks();
  p.chunks(n);
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
    p.reduce(p.output(r, r), srcs);
  }
  for (int d = 1; d < n; ++d)
    for (int r = 0; r < n; ++r) p.copy(p.output((r + d) % n, r), p.output(r, r));
}

MK_CE_SCHEDULE("allreduce.ce", allreduce, allreduce_ce,
               "copy-engine reduce-scatter (a kernel reduces tiles as they land), then copy-engine all-gather");
