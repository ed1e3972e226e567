// allreduce.hier: hierarchical all-reduce for N nodes of G GPUs, written once
// for any shape with the topology accessors (p.nodes(), p.node(r), ...).
//  1. inside each node, a direct reduce-scatter: local GPU l reduces part l
//     (chunks l*N .. l*N+N-1) of its node's inputs, in local order 0..G-1;
//  2. across nodes, among the ranks of local index l (one rail): a ring
//     all-reduce of part l (ring reduce-scatter of its N chunks, then ring
//     all-gather);
//  3. inside each node, a direct all-gather of every part.
// Each chunk's sum is formed once and copied, so every rank ends with
// bit-identical results. One node: direct reduce-scatter + all-gather (a
// two-shot all-reduce); one GPU per node: a ring across the nodes.
// Step 2 crosses nodes: on NxG its transfers become puts (stage_network),
// proved and simulated; kernels come with part 2 (NxG:direct compiles now).
#include <mk/dsl.hpp>

using namespace mk::dsl;

static void allreduce_hier(Program& p) {
  const int N = p.nodes(), G = p.gpus_per_node(), n = p.ranks();
  p.chunks(n);
  p.instances(2);
  if (n == 1) {
    p.copy(p.output(0, 0), p.input(0, 0));
    return;
  }
  auto part = [&](Chunk c, int l) { return Chunk{c.rank, c.buf, l * N, N}; };
  auto mod = [](int x, int m) { return ((x % m) + m) % m; };
  // scratch: local peer k's part at k*N (N chunks), ring slot t at G*N + t
  const int ring = G * N;

  // 1. intra-node reduce-scatter; the partial sum of part l lands in output
  //    (or stays in the input when a node has one GPU)
  if (G > 1)
    p.reduce_scatter(
        p.node_groups(), [&](int from, int to) { return part(p.input(from, 0), p.local(to)); },
        [&](int r) { return part(p.output(r, 0), p.local(r)); },
        [&](int from, int to) { return p.scratch(to, p.local(from) * N, N); }, Program::Order::group);
  auto partial = [&](int r, int j) {  // chunk j of rank r's part after step 1
    return (G > 1 ? p.output(r, 0) : p.input(r, 0)).at(p.local(r) * N + j);
  };

  // 2. ring all-reduce of part l across the nodes (nothing to do for N == 1)
  auto next = [&](int r) { return p.rank_of(mod(p.node(r) + 1, N), p.local(r)); };
  for (int t = 0; t < N - 1; ++t)
    for (int r = 0; r < n; ++r) {
      const int c = mod(p.node(r) - t - 1, N);
      if (t == 0)
        p.copy(p.scratch(next(r), ring), partial(r, c));
      else
        p.reduce(p.scratch(next(r), ring + t), {partial(r, c), p.scratch(r, ring + t - 1)});
    }
  if (N > 1)
    for (int r = 0; r < n; ++r) {
      const int c = p.node(r);
      p.reduce(p.output(r, 0).at(p.local(r) * N + c), {partial(r, c), p.scratch(r, ring + N - 2)});
    }
  for (int u = 0; u < N - 1; ++u)
    for (int r = 0; r < n; ++r) {
      const Chunk c = p.output(r, 0).at(p.local(r) * N + mod(p.node(r) - u, N));
      p.copy(Chunk{next(r), Buf::output, c.index, 1}, c);
    }

  // 3. intra-node all-gather of the parts, to the local peers in order of
  //    distance (every rank's sends and receives the same relative to its
  //    node: one rank per class for the sync analyses)
  if (G > 1)
    p.all_gather(p.node_groups(), [&](int r) { return part(p.output(r, 0), p.local(r)); },
                 [&](int to, int from) { return part(p.output(to, 0), p.local(from)); });
}

MK_SCHEDULE("allreduce.hier", allreduce, allreduce_hier,
            "hierarchical: reduce-scatter in each node, ring across nodes per rail, all-gather in each node");
