// allreduce.two_shot: reduce-scatter, then all-gather, both direct. Chunk c
// is owned by rank c: every rank pushes its chunk c into rank c's scratch,
// rank c reduces and pushes the result to every peer. Two hops, each rank
// sends 2(n-1)/n of the data: the medium-size algorithm. (Pushes rather than
// peer loads: NVLink stores are faster, and only scratch is ever remote.)
#include <mk/dsl.hpp>

using namespace mk::dsl;

static void allreduce_two_shot(Program& p) {
  const int n = p.ranks();
  p.chunks(n);
  p.instances(2);
  if (n == 1) {
    p.copy(p.output(0, 0), p.input(0, 0));
    return;
  }
  // chunk `to` of rank `from` lands in `to`'s scratch, slot by distance
  auto slot = [&](int from, int to) { return p.scratch(to, ((from - to - 1) % n + n) % n); };
  p.reduce_scatter(p.all_ranks(), [&](int from, int to) { return p.input(from, to); },
                   [&](int r) { return p.output(r, r); }, slot, Program::Order::own_first);
  p.all_gather(p.all_ranks(), [&](int r) { return p.output(r, r); },
               [&](int to, int from) { return p.output(to, from); });
}

MK_SCHEDULE("allreduce.two_shot", allreduce, allreduce_two_shot,
            "direct reduce-scatter then direct all-gather; two hops, for medium messages");
