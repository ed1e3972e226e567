// verify_links: what may cross nodes. Between nodes there is only the network:
// an op may load or store memory of ranks its executing GPU reaches (same
// node, or a `:direct` stand-in topology); a `put` carries a chunk to a
// scratch slot of a rank on another node, and a signal may go to any rank
// (across nodes it travels the connection after that thread block's puts).
//
// The author's program may copy and reduce across nodes: stage_network
// (after staging) turns those transfers into puts. Once staged (or lowered
// zero-copy), a plain load or store across nodes is mk.verify.E017 and a put
// that does not cross nodes, reads another rank's memory or writes anything
// but scratch is mk.verify.E023, each naming the op and its DSL line.
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
  return -1;
}

std::string sched_name(const ir::Schedule& s) { return s.name.empty() ? std::string(name(s.coll)) : s.name; }

void check_put(const ir::Schedule& s, size_t i, const topology::Topology* t) {
  const ir::Op& op = s.ops[i];
  std::string why;
  const ir::Ref& src = op.srcs[0];
  const ir::Ref& dst = op.dsts[0];
  if (op.srcs.size() != 1 || op.dsts.size() != 1)
    why = "a put moves one source to one destination";
  else if (src.rank != op.rank)
    why = fmt::format("its source {} is not rank {}'s own (a put reads the memory of the rank that issues it)",
                      ir::to_string(src), op.rank);
  else if (dst.buf != ir::Buf::scratch)
    why = fmt::format("its destination {} is not a scratch slot (a peer's user buffers are its own to write)",
                      ir::to_string(dst));
  else if (!t || t->link(op.rank, dst.rank) != topology::Link::net)
    why = fmt::format("its destination rank {} is on rank {}'s node{} (a put to a node-local peer: store to it "
                      "instead)",
                      dst.rank, op.rank, t ? fmt::format(" ({})", t->node(op.rank)) : std::string());
  if (why.empty()) return;
  throw Error(ErrId::verify_E023, fmt::format("{} ({} ranks): {}: {}", sched_name(s), s.nranks, describe_op(s, i), why),
              op.loc, "a put carries the issuing rank's chunk to a scratch slot of a rank on another node");
}

}  // namespace

void verify_links(const ir::Schedule& s) {
  const topology::Topology* t = s.topology ? &*s.topology : nullptr;
  if (t && t->nranks() != s.nranks)
    throw InternalError(fmt::format("topology {} has {} ranks, schedule {} has {}", t->name(), t->nranks(), s.name,
                                    s.nranks));
  // stage_network ran (a synced schedule was staged): every transfer across nodes is a put
  const bool lowered = s.staged || s.zero_copy || s.synced;
  for (size_t i = 0; i < s.ops.size(); ++i) {
    const ir::Op& op = s.ops[i];
    if (op.rank < 0 || op.rank >= s.nranks) continue;  // verify_bounds reports it
    if (op.kind == ir::OpKind::put) {
      if (op.srcs.empty() || op.dsts.empty()) continue;  // verify_bounds reports it
      check_put(s, i, t);
      continue;
    }
    if (!t || !lowered || !op.is_data()) continue;
    const int32_t peer = network_peer(*t, op);
    if (peer < 0) continue;
    throw Error(ErrId::verify_E017,
                fmt::format("{} ({} ranks, topology {}): {} loads or stores memory of rank {} (node {}) from rank {} "
                            "(node {}), which have no direct link: between nodes only puts (network operations) "
                            "move data",
                            sched_name(s), s.nranks, t->name(), describe_op(s, i), peer, t->node(peer), op.rank,
                            t->node(op.rank)),
                op.loc,
                s.zero_copy ? std::string("zero-copy plans touch peers' user buffers, which a node cannot reach "
                                          "on another node: lower without zero-copy")
                            : fmt::format("in a schedule's program, copies and reduces across nodes become puts "
                                          "(stage_network); an IR file that is already staged must use put ops "
                                          "between nodes ({}x{})",
                                          t->nodes, t->gpus_per_node));
  }
}

}  // namespace mk::verify
