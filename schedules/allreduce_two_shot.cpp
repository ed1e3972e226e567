// allreduce.two_shot: reduce-scatter, then all-gather, both direct. Chunk c
// is owned by rank c: every rank pushes its chunk c into rank c's scratch,
// rank c reduces and pushes the result to every peer. Two hops, each rank
// sends 2(n-1)/n of the data: the medium-size algorithm. (Pushes rather than
// peer loads: NVLink stores are faster, and only scratch is ever remote.)
#include <mk/dsl.hpp>

using namespace mk::dsl;

static void allreduce_two_shot(Program& p) {
  const int n = p.ranks();
  p.chunks(n);
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
    p.reduce(p.output(r, r), srcs);
  }
  for (int d = 1; d < n; ++d)
    for (int r = 0; r < n; ++r) p.copy(p.output((r + d) % n, r), p.output(r, r));
}

MK_SCHEDULE("allreduce.two_shot", allreduce, allreduce_two_shot,
            "direct reduce-scatter then direct all-gather; two hops, for medium messages");
