// allreduce.hier_tree: hierarchical all-reduce for N nodes of G GPUs with
// trees across nodes instead of allreduce.hier's ring:
//  1. inside each node, a direct reduce-scatter: local GPU l reduces part l
//     (chunks l*N .. l*N+N-1) of its node's inputs, in local order 0..G-1;
//  2. across nodes, among the ranks of local index l (one rail): two binary
//     trees over the nodes (NCCL's double binary tree idea), each carrying
//     half of part l up to its root, whole, and its sum back down; a node
//     interior in one tree is a leaf in the other (tree B is tree A with
//     the nodes mirrored), so no node carries much more than the others;
//  3. inside each node, a direct all-gather of every part.
// Step 2 takes 2*ceil(log2(N+1))-2 network steps where the ring takes
// 2(N-1): fewer latencies for small messages on many nodes; on bandwidth
// the busiest node moves about 2 parts each way, the ring 2(N-1)/N, about
// the same for many nodes.
// Interior nodes add their children's partial sums to their own (own part
// first, then the children's in order); each chunk's full sum is formed
// once, at its tree's root, and copied down: every rank ends with
// bit-identical results. One node: direct reduce-scatter + all-gather; one GPU per node:
// trees across the nodes.
// Step 2 crosses nodes: on NxG its transfers become puts (stage_network),
// proved and simulated; kernels come with part 2 (NxG:direct compiles now).
#include <mk/dsl.hpp>

using namespace mk::dsl;

static void allreduce_hier_tree(Program& p) {
  const int N = p.nodes(), G = p.gpus_per_node(), n = p.ranks();
  p.instances(2);
  if (n == 1) {
    p.copy(p.output(0, 0), p.input(0, 0));
    return;
  }
  p.chunks(2 * n);  // two chunks a rank: each tree carries exactly half of a part
  // part l of a rank's buffer: its P = 2N chunks from l*P
  const int P = 2 * N;
  auto part = [&](Chunk c, int l) { return Chunk{c.rank, c.buf, l * P, P}; };
  // scratch: local peer k's part at k*P (step 1); step 2: child k's half at
  // G*P + k*N, for both trees (no node is interior in both)
  const int up = G * P;

  // 1. intra-node reduce-scatter; the partial sum of part l lands in output
  //    (or stays in the input when a node has one GPU)
  if (G > 1)
    p.reduce_scatter(
        p.node_groups(), [&](int from, int to) { return part(p.input(from, 0), p.local(to)); },
        [&](int r) { return part(p.output(r, 0), p.local(r)); },
        [&](int from, int to) { return p.scratch(to, p.local(from) * P, P); }, Program::Order::group);

  // 2. two trees across nodes, per rail: the first half of part l goes up
  //    and down tree A (heap order: node v's children 2v+1 and 2v+2, root
  //    0), the second half tree B (the same heap over the nodes mirrored,
  //    v -> N-1-v, root N-1). Tree A's interior nodes are the lower half of
  //    the nodes, B's the upper half, so each node is interior in at most
  //    one tree (NCCL's double binary tree idea): a node interior in one
  //    tree sends and receives four halves (two parts) each way, a node that
  //    is a leaf in both (the middle one of an odd count) two halves; the
  //    ring moves 2(N-1)/N parts.
  auto mine = [&](int r) { return part(p.output(r, 0), p.local(r)); };
  auto kids = [&](int w) {  // heap children of heap index w
    std::vector<int> c;
    for (int k : {2 * w + 1, 2 * w + 2})
      if (k < N) c.push_back(k);
    return c;
  };
  struct Tree {
    bool mirrored;
    int first, count, slots;  // its chunks of a part, and its scratch at `slots`
  };
  const Tree trees[] = {{false, 0, N, up}, {true, N, N, up}};
  auto node_of = [&](const Tree& t, int w) { return t.mirrored ? N - 1 - w : w; };
  auto sub = [](Chunk c, const Tree& t) { return Chunk{c.rank, c.buf, c.index + t.first, t.count}; };
  // up, leaves first (children have larger heap indices than their parent)
  for (const Tree& t : trees) {
    if (t.count == 0) continue;
    for (int w = N - 1; w >= 0; --w)
      for (int l = 0; l < G; ++l) {
        const int r = p.rank_of(node_of(t, w), l);
        const std::vector<int> children = kids(w);
        const Chunk own = sub(G > 1 ? mine(r) : part(p.input(r, 0), l), t);
        if (!children.empty()) {
          std::vector<Chunk> srcs = {own};
          for (size_t k = 0; k < children.size(); ++k) srcs.push_back(p.scratch(r, t.slots + int(k) * t.count, t.count));
          p.reduce(sub(mine(r), t), srcs);
        }
        if (w > 0) {
          const int parent = p.rank_of(node_of(t, (w - 1) / 2), l);
          p.copy(p.scratch(parent, t.slots + (w - 1) % 2 * t.count, t.count), children.empty() ? own : sub(mine(r), t));
        }
      }
  }
  // down, roots first
  for (const Tree& t : trees) {
    if (t.count == 0) continue;
    for (int w = 0; w < N; ++w)
      for (int l = 0; l < G; ++l)
        for (int k : kids(w))
          p.copy(sub(mine(p.rank_of(node_of(t, k), l)), t), sub(mine(p.rank_of(node_of(t, w), l)), t));
  }

  // 3. intra-node all-gather of the parts
  if (G > 1)
    p.all_gather(p.node_groups(), [&](int r) { return part(p.output(r, 0), p.local(r)); },
                 [&](int to, int from) { return part(p.output(to, 0), p.local(from)); });
}

MK_SCHEDULE("allreduce.hier_tree", allreduce, allreduce_hier_tree,
            "hierarchical: reduce-scatter in each node, two binary trees across nodes per rail, all-gather in each node");
