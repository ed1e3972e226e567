// reducescatter.hier: hierarchical reduce-scatter for N nodes of G GPUs,
// written once for any shape with the topology accessors.
//  1. inside each node, local GPU l collects and reduces (in local order
//     0..G-1) the node's inputs of the N blocks that belong to its rail
//     (blocks of ranks (j, l), j = 0..N-1);
//  2. across nodes, among the ranks of local index l: a ring reduce-scatter
//     of those N partial sums; block (j, l) completes on rank (j, l).
// One node: a direct reduce-scatter; one GPU per node: a ring across nodes.
// Step 2 crosses nodes: on NxG its transfers become puts (stage_network),
// proved and simulated; kernels come with part 2 (NxG:direct compiles now).
#include <mk/dsl.hpp>

using namespace mk::dsl;

static void reducescatter_hier(Program& p) {
  const int N = p.nodes(), G = p.gpus_per_node(), n = p.ranks();
  p.instances(2);
  if (n == 1) {
    p.copy(p.output(0, 0), p.input(0, 0));
    return;
  }
  auto mod = [](int x, int m) { return ((x % m) + m) % m; };
  auto next = [&](int r) { return p.rank_of(mod(p.node(r) + 1, N), p.local(r)); };
  auto block = [&](int r, int j) { return p.rank_of(j, p.local(r)); };  // rail block j of rank r
  // scratch: from local peer k, block j at k*N + j; partial sums at G*N + j;
  // ring slot t at G*N + N + t
  const int sums = G * N, ring = G * N + N;
  // The u-th rail block rank r works on: node(r)-1, node(r)-2, ..., node(r),
  // as the ring below consumes them. Every rank's program is then the same
  // relative to its node (one code path for all ranks); the order of the
  // sources inside each reduce is unchanged.
  auto order = [&](int r, int u) { return mod(p.node(r) - 1 - u, N); };

  // 1. intra-node reduction of the rail's blocks; with one node, straight
  //    into the output
  auto partial = [&](int r, int j) {
    if (G == 1) return p.input(r, block(r, j));
    return N == 1 ? p.output(r, 0) : p.scratch(r, sums + j);
  };
  if (G > 1) {
    for (int d = 1; d < G; ++d)
      for (int r = 0; r < n; ++r) {
        const int to = p.rank_of(p.node(r), mod(p.local(r) + d, G));
        for (int u = 0; u < N; ++u) {  // in the order the ring consumes them (see `order`)
          const int j = order(r, u);
          p.copy(p.scratch(to, p.local(r) * N + j), p.input(r, block(to, j)));
        }
      }
    for (int r = 0; r < n; ++r)
      for (int u = 0; u < N; ++u) {
        const int j = order(r, u);
        std::vector<Chunk> srcs;
        for (int k = 0; k < G; ++k)
          srcs.push_back(k == p.local(r) ? p.input(r, block(r, j)) : p.scratch(r, k * N + j));
        p.reduce(partial(r, j), srcs);
      }
  }

  // 2. ring reduce-scatter across nodes: at time t rank r passes on the sum
  //    of block node(r)-t-1
  for (int t = 0; t < N - 1; ++t)
    for (int r = 0; r < n; ++r) {
      const int j = mod(p.node(r) - t - 1, N);
      if (t == 0)
        p.copy(p.scratch(next(r), ring), partial(r, j));
      else
        p.reduce(p.scratch(next(r), ring + t), {partial(r, j), p.scratch(r, ring + t - 1)});
    }
  if (N > 1)
    for (int r = 0; r < n; ++r) p.reduce(p.output(r, 0), {partial(r, p.node(r)), p.scratch(r, ring + N - 2)});
}

MK_SCHEDULE("reducescatter.hier", reducescatter, reducescatter_hier,
            "hierarchical: reduce each rail's blocks inside the node, ring reduce-scatter across nodes per rail");
