// TEST-ONLY (compile-scale benchmark and tests, not a built-in): a two-level
// reduce-scatter over nodes of 8 GPUs, standing in for reducescatter.hier
// until the topology-aware built-in lands. Rank r = a * G + g.
//   1. inter-node ring reduce-scatter among the ranks (x, g) of node-sized
//      ranges of G blocks: rank (a, g) ends with node a's blocks summed over
//      the nodes' rank g;
//   2. intra-node direct reduce-scatter of those G blocks.
#include <mk/dsl.hpp>

#include <stdexcept>
#include <string>

using namespace mk::dsl;

static void test_reducescatter_hier8(Program& p) {
  const int n = p.ranks(), G = n < 8 ? n : 8, nodes = n / G;
  if (n % G) throw std::invalid_argument("test.reducescatter.hier8 needs a multiple of 8 ranks, got " + std::to_string(n));
  p.chunks(1);
  auto mod = [&](int x) { return ((x % nodes) + nodes) % nodes; };
  // scratch: [0, (nodes-1)*G) ring slots, [acc, +G) the ring's result,
  // [recv, +G) blocks from each local rank
  const int acc = (nodes - 1) * G, recv = acc + G;
  for (int t = 0; t < nodes - 1; ++t)
    for (int r = 0; r < n; ++r) {
      const int a = r / G, g = r % G, x = mod(a - t - 1), next = mod(a + 1) * G + g;
      if (t == 0)
        p.copy(p.scratch(next, 0, G), p.input(r, x * G, G));
      else
        p.reduce(p.scratch(next, t * G, G), {p.input(r, x * G, G), p.scratch(r, (t - 1) * G, G)});
    }
  // rank r's node range, summed over the nodes (its own input alone with one node)
  auto mine = [&](int r, int b) {
    return nodes == 1 ? p.input(r, (r / G) * G + b) : p.scratch(r, acc + b);
  };
  if (nodes > 1)
    for (int r = 0; r < n; ++r)
      p.reduce(p.scratch(r, acc, G), {p.input(r, (r / G) * G, G), p.scratch(r, (nodes - 2) * G, G)});
  for (int r = 0; r < n; ++r)
    for (int d = 1; d < G; ++d) {
      const int a = r / G, g = r % G, to = (g + d) % G;
      p.copy(p.scratch(a * G + to, recv + g), mine(r, to));
    }
  for (int r = 0; r < n; ++r) {
    const int g = r % G;
    std::vector<Chunk> srcs{mine(r, g)};
    for (int d = 1; d < G; ++d) srcs.push_back(p.scratch(r, recv + (g + d) % G));
    p.reduce(p.output(r, 0), srcs);
  }
}

MK_SCHEDULE("test.reducescatter.hier8", reducescatter, test_reducescatter_hier8,
            "TEST-ONLY: inter-node ring reduce-scatter of node ranges, then intra-node direct reduce-scatter (8 GPUs a node)");
