// allreduce.hier_tree: hierarchical all-reduce for N nodes of G GPUs with a
// tree across nodes instead of allreduce.hier's ring:
//  1. inside each node, a direct reduce-scatter: local GPU l reduces part l
//     (chunks l*N .. l*N+N-1) of its node's inputs, in local order 0..G-1;
//  2. across nodes, among the ranks of local index l (one rail): a binary
//     tree over the nodes (node v's children are 2v+1 and 2v+2, node 0 the
//     root) reduces part l up to the root, whole, then copies the sum down;
//  3. inside each node, a direct all-gather of every part.
// Step 2 takes 2*ceil(log2(N+1))-2 network steps where the ring takes
// 2(N-1): fewer latencies for small messages on many nodes. An interior
// node receives three parts (two children's, its parent's sum) and sends
// three, a leaf one each way, so on bandwidth it is the ring's inferior;
// NCCL balances this with two trees (each node interior in one, a leaf in
// the other), which this one-tree version does not do yet.
// Each part's sum is formed once, at the root (own part first, then the
// children's in order), and copied: every rank ends with bit-identical
// results. One node: direct reduce-scatter + all-gather; one GPU per node: a
// tree across the nodes.
// Step 2 crosses nodes: on NxG its transfers become puts (stage_network),
// proved and simulated; kernels come with part 2 (NxG:direct compiles now).
#include <mk/dsl.hpp>

using namespace mk::dsl;

static void allreduce_hier_tree(Program& p) {
  const int N = p.nodes(), G = p.gpus_per_node(), n = p.ranks();
  p.chunks(n);
  p.instances(2);
  if (n == 1) {
    p.copy(p.output(0, 0), p.input(0, 0));
    return;
  }
  // part l of a rank's buffer: its N chunks from l*N
  auto part = [&](Chunk c, int l) { return Chunk{c.rank, c.buf, l * N, N}; };
  // scratch: local peer k's part at k*N (step 1), child k's part at G*N + k*N (step 2)
  const int up = G * N;

  // 1. intra-node reduce-scatter; the partial sum of part l lands in output
  //    (or stays in the input when a node has one GPU)
  if (G > 1)
    p.reduce_scatter(
        p.node_groups(), [&](int from, int to) { return part(p.input(from, 0), p.local(to)); },
        [&](int r) { return part(p.output(r, 0), p.local(r)); },
        [&](int from, int to) { return p.scratch(to, p.local(from) * N, N); }, Program::Order::group);

  // 2. the tree across nodes, per rail
  auto children = [&](int v) {
    std::vector<int> c;
    for (int k : {2 * v + 1, 2 * v + 2})
      if (k < N) c.push_back(k);
    return c;
  };
  auto mine = [&](int r) { return part(p.output(r, 0), p.local(r)); };
  // what rank r sends up: the sum of its subtree's part
  auto subtree = [&](int r) {
    return !children(p.node(r)).empty() || G > 1 ? mine(r) : part(p.input(r, 0), p.local(r));
  };
  // up, leaves first (children have larger node numbers than their parent)
  for (int v = N - 1; v >= 0; --v)
    for (int l = 0; l < G; ++l) {
      const int r = p.rank_of(v, l);
      const std::vector<int> kids = children(v);
      if (!kids.empty()) {
        std::vector<Chunk> srcs = {G > 1 ? mine(r) : part(p.input(r, 0), l)};
        for (size_t k = 0; k < kids.size(); ++k) srcs.push_back(p.scratch(r, up + int(k) * N, N));
        p.reduce(mine(r), srcs);
      }
      if (v > 0) {
        const int parent = p.rank_of((v - 1) / 2, l);
        p.copy(p.scratch(parent, up + (v - 1) % 2 * N, N), subtree(r));
      }
    }
  // down, root first
  for (int v = 0; v < N; ++v)
    for (int l = 0; l < G; ++l)
      for (int k : children(v)) p.copy(mine(p.rank_of(k, l)), mine(p.rank_of(v, l)));

  // 3. intra-node all-gather of the parts
  if (G > 1)
    p.all_gather(p.node_groups(), [&](int r) { return part(p.output(r, 0), p.local(r)); },
                 [&](int to, int from) { return part(p.output(to, 0), p.local(from)); });
}

MK_SCHEDULE("allreduce.hier_tree", allreduce, allreduce_hier_tree,
            "hierarchical: reduce-scatter in each node, a binary tree across nodes per rail, all-gather in each node");
