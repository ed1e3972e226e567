// reducescatter.pull: each rank reads its block from every rank's input and
// reduces it into its output. With registered buffers (zero-copy) peers'
// inputs are read in place: no scratch, no flag between the ranks inside the
// kernel. Without registration the compiler stages it (every rank pushes
// block q into rank q's scratch), which is reducescatter.direct.
#include <mk/dsl.hpp>

using namespace mk::dsl;

static void reducescatter_pull(Program& p) {
  const int n = p.ranks();
  for (int r = 0; r < n; ++r) {
    std::vector<Chunk> srcs;
    for (int d = 0; d < n; ++d) srcs.push_back(p.input((r + d) % n, r));
    if (n == 1)
      p.copy(p.output(r, 0), srcs[0]);
    else
      p.reduce(p.output(r, 0), srcs);
  }
}

MK_SCHEDULE("reducescatter.pull", reducescatter, reducescatter_pull,
            "each rank reduces its block from every rank's input; with registered buffers no scratch at all");
