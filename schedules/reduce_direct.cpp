// reduce.direct: every rank pushes its input into the root's scratch; the root
// reduces. Written for root 0; the runtime relabels ranks for any other root.
#include <mk/dsl.hpp>

using namespace mk::dsl;

static void reduce_direct(Program& p) {
  const int n = p.ranks();
  const int root = p.root();
  p.instances(2);
  if (n == 1) {
    p.copy(p.output(root, 0), p.input(root, 0));
    return;
  }
  // The root keeps rank q's data in slot q (q < root) or q - 1 (q > root).
  auto slot = [root](int q) { return q < root ? q : q - 1; };
  std::vector<Chunk> srcs;
  for (int q = 0; q < n; ++q) {
    if (q == root) {
      srcs.push_back(p.input(root, 0));
    } else {
      p.copy(p.scratch(root, slot(q)), p.input(q, 0));
      srcs.push_back(p.scratch(root, slot(q)));
    }
  }
  p.reduce(p.output(root, 0), srcs);
}

MK_SCHEDULE("reduce.direct", reduce, reduce_direct,
            "every rank pushes to the root, the root reduces in rank order; one hop");
