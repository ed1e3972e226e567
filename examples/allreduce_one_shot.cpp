// The README's example: a one-shot all-reduce written in the DSL.
//   build/mkc verify examples/allreduce_one_shot.cpp --ranks 4
//   build/mkc simulate examples/allreduce_one_shot.cpp --ranks 4 --dtype bf16 --count 10000
//   build/mkc compile examples/allreduce_one_shot.cpp --ranks 4 --dtype bf16 -o plans/my_one_shot
#include <mk/dsl.hpp>
using namespace mk::dsl;

// Every rank pushes its input into every peer's scratch, then reduces all n
// contributions locally, in rank order (bit-identical results on every rank).
static void one_shot(Program& p) {
  const int n = p.ranks();
  for (int d = 1; d < n; ++d)
    for (int r = 0; r < n; ++r) {
      const int q = (r + d) % n;
      p.copy(p.scratch(q, r), p.input(r, 0));  // runs on r: an NVLink store
    }
  for (int r = 0; r < n; ++r) {
    std::vector<Chunk> srcs;
    for (int q = 0; q < n; ++q) srcs.push_back(q == r ? p.input(r, 0) : p.scratch(r, q));
    p.reduce(p.output(r, 0), srcs);
  }
}
MK_SCHEDULE("my.allreduce.one_shot", allreduce, one_shot, "one hop, for small messages");
