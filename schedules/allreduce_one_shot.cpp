// allreduce.one_shot: every rank pushes its whole input into every peer's
// scratch, then each rank reduces all n contributions locally. One hop, so
// latency-optimal for small messages; each rank sends (n-1) times the data.
//
// Every rank adds the contributions in the same order (rank 0, 1, ...), so all
// ranks get bit-identical results even for floating point.
#include <mk/dsl.hpp>

using namespace mk::dsl;

static void allreduce_one_shot(Program& p) {
  const int n = p.ranks();
  if (n == 1) {
    p.copy(p.output(0, 0), p.input(0, 0));
    return;
  }
  // Rank q keeps rank r's data in slot (r - q - 1) mod n.
  auto slot = [n](int from, int at) { return ((from - at - 1) % n + n) % n; };
  for (int d = 1; d < n; ++d)
    for (int r = 0; r < n; ++r) {
      const int q = (r + d) % n;
      p.copy(p.scratch(q, slot(r, q)), p.input(r, 0));
    }
  for (int r = 0; r < n; ++r) {
    std::vector<Chunk> srcs;
    for (int q = 0; q < n; ++q) srcs.push_back(q == r ? p.input(r, 0) : p.scratch(r, slot(q, r)));
    p.reduce(p.output(r, 0), srcs);
  }
}

MK_SCHEDULE("allreduce.one_shot", allreduce, allreduce_one_shot,
            "push everything to everyone, reduce locally; one hop, for small messages");
