// TEST-ONLY (compile-scale benchmark and tests, not a built-in): a two-level
// all-reduce over nodes of 8 GPUs, the shape of a hierarchical schedule (ranks
// differ by more than a rotation: by node and by local index). It stands in
// for allreduce.hier until the topology-aware built-in lands. Rank r is local
// rank g = r % G of node a = r / G; chunk c = g * nodes + x belongs to local
// rank g and, within the node ring, to node x.
//   1. intra-node direct reduce-scatter: rank (a, l) pushes chunks of group g
//      to rank (a, g), which sums the node's contributions;
//   2. inter-node ring all-reduce of group g among the ranks (x, g);
//   3. intra-node direct all-gather of group g.
#include <mk/dsl.hpp>

#include <stdexcept>
#include <string>

using namespace mk::dsl;

static void test_allreduce_hier8(Program& p) {
  const int n = p.ranks(), G = n < 8 ? n : 8, nodes = n / G;
  if (n % G) throw std::invalid_argument("test.allreduce.hier8 needs a multiple of 8 ranks, got " + std::to_string(n));
  p.chunks(n);
  auto rank = [&](int a, int g) { return a * G + g; };
  // scratch: [0, G*nodes) chunks received from each local rank l (l*nodes + x),
  // [G*nodes, +nodes) the node's sums, then nodes-1 ring slots
  const int acc = G * nodes, ring = acc + nodes;
  for (int a = 0; a < nodes; ++a)
    for (int l = 0; l < G; ++l)
      for (int d = 1; d < G; ++d) {
        const int g = (l + d) % G;
        p.copy(p.scratch(rank(a, g), l * nodes, nodes), p.input(rank(a, l), g * nodes, nodes));
      }
  for (int a = 0; a < nodes; ++a)
    for (int g = 0; g < G; ++g) {
      const int r = rank(a, g);
      std::vector<Chunk> srcs{p.input(r, g * nodes, nodes)};
      for (int d = 1; d < G; ++d) srcs.push_back(p.scratch(r, ((g + d) % G) * nodes, nodes));
      p.reduce(nodes == 1 ? p.output(r, g * nodes, nodes) : p.scratch(r, acc, nodes), srcs);
    }
  if (nodes > 1) {
    auto mod = [&](int x) { return ((x % nodes) + nodes) % nodes; };
    for (int t = 0; t < nodes - 1; ++t)
      for (int a = 0; a < nodes; ++a)
        for (int g = 0; g < G; ++g) {
          const int x = mod(a - t - 1), r = rank(a, g), next = rank(mod(a + 1), g);
          if (t == 0)
            p.copy(p.scratch(next, ring), p.scratch(r, acc + x));
          else
            p.reduce(p.scratch(next, ring + t), {p.scratch(r, acc + x), p.scratch(r, ring + t - 1)});
        }
    for (int a = 0; a < nodes; ++a)
      for (int g = 0; g < G; ++g)
        p.reduce(p.output(rank(a, g), g * nodes + a), {p.scratch(rank(a, g), acc + a), p.scratch(rank(a, g), ring + nodes - 2)});
    for (int u = 0; u < nodes - 1; ++u)
      for (int a = 0; a < nodes; ++a)
        for (int g = 0; g < G; ++g) {
          const int c = g * nodes + mod(a - u);
          p.copy(p.output(rank(mod(a + 1), g), c), p.output(rank(a, g), c));
        }
  }
  for (int a = 0; a < nodes; ++a)
    for (int g = 0; g < G; ++g)
      for (int d = 1; d < G; ++d)
        p.copy(p.output(rank(a, (g + d) % G), g * nodes, nodes), p.output(rank(a, g), g * nodes, nodes));
}

MK_SCHEDULE("test.allreduce.hier8", allreduce, test_allreduce_hier8,
            "TEST-ONLY: intra-node direct reduce-scatter, inter-node ring all-reduce, intra-node all-gather (8 GPUs a node)");
