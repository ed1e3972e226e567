// allgather.hier: hierarchical all-gather for N nodes of G GPUs, written once
// for any shape with the topology accessors.
//  1. every rank copies its input into its own output block;
//  2. across nodes, among the ranks of local index l (one rail): a ring
//     all-gather of their blocks (N-1 hops);
//  3. inside each node, every rank pushes the N blocks of its rail to its
//     local peers.
// One node: a direct all-gather; one GPU per node: a ring across the nodes.
// Step 2 crosses nodes: on NxG its transfers become puts (stage_network),
// proved and simulated; kernels come with part 2 (NxG:direct compiles now).
#include <mk/dsl.hpp>

using namespace mk::dsl;

static void allgather_hier(Program& p) {
  const int N = p.nodes(), G = p.gpus_per_node(), n = p.ranks();
  p.instances(2);
  auto mod = [](int x, int m) { return ((x % m) + m) % m; };
  auto next = [&](int r) { return p.rank_of(mod(p.node(r) + 1, N), p.local(r)); };
  for (int r = 0; r < n; ++r) p.copy(p.output(r, r), p.input(r, 0));
  // at time u rank r forwards the block of node node(r)-u on its rail
  for (int u = 0; u < N - 1; ++u)
    for (int r = 0; r < n; ++r) {
      const int b = p.rank_of(mod(p.node(r) - u, N), p.local(r));
      p.copy(p.output(next(r), b), u == 0 ? p.input(r, 0) : p.output(r, b));
    }
  // blocks in the order they arrive (node(r), node(r)-1, ...), and each
  // block to the local peers in order of distance, so every rank's program,
  // sending and receiving, is the same relative to its node: one code path
  // for all ranks, and one rank per class for the sync analyses (fuse merges
  // a block's copies into the op that received it)
  auto block = [&](int r, int u) { return p.rank_of(mod(p.node(r) - u, N), p.local(r)); };
  if (G > 1)
    for (int u = 0; u < N; ++u)
      p.all_gather(
          p.node_groups(), [&](int r) { return block(r, u) == r ? p.input(r, 0) : p.output(r, block(r, u)); },
          [&](int to, int from) { return p.output(to, block(from, u)); });
}

MK_SCHEDULE("allgather.hier", allgather, allgather_hier,
            "hierarchical: ring across nodes per rail, then each rank pushes its rail's blocks inside its node");
