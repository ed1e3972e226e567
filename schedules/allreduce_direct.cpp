// allreduce.direct: chunk c is owned by rank c, which reads chunk c of every
// rank's input, reduces it and writes the result into chunk c of every rank's
// output. With registered buffers (zero-copy) that is all there is: peers'
// buffers are read and written in place, no scratch, no flag between the
// ranks inside the kernel, each rank's HBM and links touched once per byte.
// Without registration the compiler stages it (every rank pushes chunk c into
// rank c's scratch, rank c pushes the result into every rank's scratch),
// which is two_shot. Every chunk is reduced by one rank, so every rank gets
// the same bits.
#include <mk/dsl.hpp>

using namespace mk::dsl;

static void allreduce_direct(Program& p) {
  const int n = p.ranks();
  p.chunks(n);
  if (n == 1) {
    p.copy(p.output(0, 0), p.input(0, 0));
    return;
  }
  for (int r = 0; r < n; ++r) {
    std::vector<Chunk> srcs;
    for (int d = 0; d < n; ++d) srcs.push_back(p.input((r + d) % n, r));
    p.reduce(p.output(r, r), srcs);
  }
  for (int d = 1; d < n; ++d)
    for (int r = 0; r < n; ++r) p.copy(p.output((r + d) % n, r), p.output(r, r));
}

MK_SCHEDULE("allreduce.direct", allreduce, allreduce_direct,
            "each rank reduces its chunk from every rank's input and writes it into every output; with registered "
            "buffers no scratch at all");
