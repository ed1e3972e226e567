// verify_links: until network operations exist, an op may only touch memory
// of ranks its executing GPU reaches by a load or store (same node, or a
// `:direct` stand-in topology). Checked on the author's program, before
// staging, so the message points at the DSL line that crossed nodes.
#include <fmt/format.h>

#include "compiler/verify/verify.hpp"

namespace mk::verify {

namespace {

// The first rank an op reaches over the network, or -1.
int32_t network_peer(const topology::Topology& t, const ir::Op& op) {
  auto far = [&](int32_t r) { return r != op.rank && t.link(op.rank, r) == topology::Link::net; };
  for (const auto* list : {&op.srcs, &op.dsts})
    for (const auto& ref : *list)
      if (far(ref.rank)) return ref.rank;
  if (op.kind == ir::OpKind::signal && op.peer >= 0 && far(op.peer)) return op.peer;
  return -1;
}

}  // namespace

void verify_links(const ir::Schedule& s) {
  if (!s.topology) return;  // one node: every pair is linked
  const topology::Topology& t = *s.topology;
  if (t.nranks() != s.nranks)
    throw InternalError(fmt::format("topology {} has {} ranks, schedule {} has {}", t.name(), t.nranks(), s.name,
                                    s.nranks));
  for (size_t i = 0; i < s.ops.size(); ++i) {
    const ir::Op& op = s.ops[i];
    if (op.rank < 0 || op.rank >= s.nranks) continue;  // verify_bounds reports it
    const int32_t peer = network_peer(t, op);
    if (peer < 0) continue;
    throw Error(ErrId::verify_E017,
                fmt::format("{} ({} ranks, topology {}): {} moves data between rank {} (node {}) and rank {} "
                            "(node {}), which have no direct link: network operations are not yet supported",
                            s.name.empty() ? std::string(name(s.coll)) : s.name, s.nranks, t.name(),
                            describe_op(s, i), op.rank, t.node(op.rank), peer, t.node(peer)),
                op.loc,
                fmt::format("keep every op inside one node (p.node(r) names a rank's node); --topology {}:direct "
                            "compiles as if every pair were linked (a stand-in, not a real machine)",
                            fmt::format("{}x{}", t.nodes, t.gpus_per_node)));
  }
}

}  // namespace mk::verify
