// reducescatter.hier_direct: hierarchical reduce-scatter for N nodes of G
// GPUs in one network step. A rank's input is N node-blocks of G chunks
// (node-block j: the chunks of node j's ranks, contiguous); node-block j is
// handled on node i by GPU d % G, d = (j - i) mod N its distance:
//  1. inside each node, the handler of node-block j reduces the node's
//     inputs of it (local order 0..G-1), whole: G chunks per op;
//  2. across nodes, each handler sends its node's sum of node-block j to the
//     GPU of the same local index on node j (rail-aligned): with N >= G
//     nodes every GPU sends and receives about N/G node-blocks, all at once,
//     not N-1 ring steps;
//  3. on node j, each GPU sums the node-blocks it received (in order of
//     distance), then a reduce-scatter inside the node (local order) gives
//     chunk l of node-block j to GPU l.
// The network carries what reducescatter.hier's ring carries ((N-1) x G
// chunks per node) in one step of larger transfers, and each op moves a
// node-block instead of a chunk: about 2N + 2G ops per rank instead of
// reducescatter.hier's N x G (1024 ranks on 128x8: 1.2M ops there).
// The price: GPU l's program differs from GPU m's (it handles other
// distances), so a full plan has up to G rank classes (G kernels to compile,
// where reducescatter.hier has one; a rank compiles only its own), and each
// GPU talks to about N/G peers across nodes (the network proof's cost grows
// with those connections: 17 s at 128x8 on the 2-core machine). It is for
// N >= G: with fewer nodes than GPUs per node, GPUs N..G-1 handle no
// node-block and their NICs idle, and reducescatter.hier is faster (the
// cost model picks it there).
// One node: a direct reduce-scatter.
// Step 2 crosses nodes: on NxG its transfers become puts (stage_network),
// proved and simulated; kernels come with part 2 (NxG:direct compiles now).
#include <mk/dsl.hpp>

using namespace mk::dsl;

static void reducescatter_hier_direct(Program& p) {
  const int N = p.nodes(), G = p.gpus_per_node(), n = p.ranks();
  p.instances(2);
  if (n == 1) {
    p.copy(p.output(0, 0), p.input(0, 0));
    return;
  }
  if (N == 1) {
    p.reduce_scatter(
        p.node_groups(), [&](int from, int to) { return p.input(from, p.local(to)); },
        [&](int r) { return p.output(r, 0); }, [&](int from, int to) { return p.scratch(to, p.local(from)); },
        Program::Order::group);
    return;
  }
  auto mod = [](int x, int m) { return ((x % m) + m) % m; };
  const int Q = (N + G - 1) / G;  // node-blocks a GPU handles at most
  auto block = [&](int r, int j) { return Chunk{r, Buf::input, j * G, G}; };
  // scratch (in chunks): step 1 from the local peer `e` places after the
  // handler (e = 0..G-2), the q-th handled block at (e*Q + q)*G; its sum at
  // SUM + q*G; step 2 received at RCV + q*G; step 3's sum at ACC, and from
  // local peer k at FIN + k
  const int SUM = (G - 1) * Q * G, RCV = SUM + Q * G, ACC = RCV + Q * G, FIN = ACC + G;
  auto from_peer = [&](int l, int k, int q) { return (mod(l - k - 1, G) * Q + q) * G; };
  auto slot = [&](int r, int at, int count) { return p.scratch(r, at, count); };

  // 1. per node i and distance d: GPU d % G reduces node-block (i + d) mod N
  auto partial = [&](int i, int d) {  // node i's sum of the node-block at distance d, where it lies
    const int h = p.rank_of(i, d % G);
    return G > 1 ? slot(h, SUM + d / G * G, G) : block(h, mod(i + d, N));
  };
  if (G > 1)
    for (int d = 0; d < N; ++d)
      for (int i = 0; i < N; ++i) {
        const int j = mod(i + d, N), k = d % G, q = d / G, h = p.rank_of(i, k);
        for (int l = 0; l < G; ++l)
          if (l != k) p.copy(slot(h, from_peer(l, k, q), G), block(p.rank_of(i, l), j));
        std::vector<Chunk> srcs;
        for (int l = 0; l < G; ++l) srcs.push_back(l == k ? block(h, j) : slot(h, from_peer(l, k, q), G));
        p.reduce(partial(i, d), srcs);
      }

  // 2. to the GPU of the same local index on the block's node
  for (int d = 1; d < N; ++d)
    for (int i = 0; i < N; ++i) {
      const int j = mod(i + d, N), k = d % G;
      p.copy(slot(p.rank_of(j, k), RCV + d / G * G, G), partial(i, d));
    }

  // 3. on node j, GPU k sums what it received (distances k, k+G, ...; its own
  //    node's block at distance 0 on GPU 0), then the node reduce-scatters
  const int contributors = std::min(N, G);
  auto received = [&](int j, int d) { return d == 0 ? partial(j, 0) : slot(p.rank_of(j, d % G), RCV + d / G * G, G); };
  auto acc = [&](int j, int k) {  // GPU k's sum on node j
    return k + G < N ? slot(p.rank_of(j, k), ACC, G) : received(j, k);  // one block received: itself
  };
  for (int j = 0; j < N; ++j)
    for (int k = 0; k < contributors; ++k) {
      const int g = p.rank_of(j, k);
      std::vector<Chunk> srcs;
      for (int d = k; d < N; d += G) srcs.push_back(received(j, d));
      if (G == 1)
        p.reduce(p.output(g, 0), srcs);  // one GPU per node: this is the result
      else if (srcs.size() > 1)
        p.reduce(acc(j, k), srcs);
    }
  if (G > 1)
    for (int j = 0; j < N; ++j)
      for (int m = 0; m < G; ++m) {
        const int r = p.rank_of(j, m);
        for (int k = 0; k < contributors; ++k)
          if (k != m) p.copy(slot(r, FIN + k, 1), acc(j, k).at(m));
        std::vector<Chunk> srcs;
        for (int k = 0; k < contributors; ++k) srcs.push_back(k == m ? acc(j, m).at(m) : slot(r, FIN + k, 1));
        p.reduce(p.output(r, 0), srcs);
      }
}

MK_SCHEDULE("reducescatter.hier_direct", reducescatter, reducescatter_hier_direct,
            "hierarchical: reduce node-blocks inside the node, one direct exchange across nodes per rail, "
            "reduce-scatter inside the node");
