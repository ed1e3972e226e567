// TEST-ONLY (compile-scale benchmark and tests, not a built-in): a two-level
// all-gather over nodes of 8 GPUs, standing in for allgather.hier until the
// topology-aware built-in lands. Rank r = a * G + g (node a, local rank g).
//   1. intra-node direct all-gather: every rank holds its node's G blocks;
//   2. inter-node ring among the ranks (x, g): each forwards a node's blocks.
#include <mk/dsl.hpp>

#include <stdexcept>
#include <string>

using namespace mk::dsl;

static void test_allgather_hier8(Program& p) {
  const int n = p.ranks(), G = n < 8 ? n : 8, nodes = n / G;
  if (n % G) throw std::invalid_argument("test.allgather.hier8 needs a multiple of 8 ranks, got " + std::to_string(n));
  p.chunks(1);
  auto mod = [&](int x) { return ((x % nodes) + nodes) % nodes; };
  for (int r = 0; r < n; ++r) p.copy(p.output(r, r), p.input(r, 0));
  for (int r = 0; r < n; ++r)
    for (int d = 1; d < G; ++d) {
      const int a = r / G, g = r % G;
      p.copy(p.output(a * G + (g + d) % G, r), p.input(r, 0));
    }
  for (int u = 0; u < nodes - 1; ++u)
    for (int r = 0; r < n; ++r) {
      const int a = r / G, g = r % G, x = mod(a - u);
      p.copy(p.output(mod(a + 1) * G + g, x * G, G), p.output(r, x * G, G));
    }
}

MK_SCHEDULE("test.allgather.hier8", allgather, test_allgather_hier8,
            "TEST-ONLY: intra-node direct all-gather, then an inter-node ring of node blocks (8 GPUs a node)");
