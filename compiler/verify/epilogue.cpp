// verify_epilogue: a fused epilogue runs once on every final output element.
//
// A fused kernel (templates/fused.cuh) applies the epilogue in its tail: each
// block of a rank first finishes every op of its thread block, a grid barrier
// waits for all the rank's blocks, then the blocks take the output rows one
// each and rewrite them in place. By construction that visits every element
// of the rank's output exactly once, in one block per row, after every op of
// this rank. It is after the element's final value, and nothing reads or
// writes the element afterwards, exactly when no op of another rank touches
// this rank's buffers: such an op runs in the peer's kernel, unordered with
// this rank's tail (before it: the tail rewrites a value the peer still
// writes; after it: the peer reads an epilogued value, or overwrites it). In
// place, the input is the output, so inputs count too. verify_semantics has
// already proved what each output holds; this pass proves the rest.
#include <fmt/format.h>

#include "compiler/verify/verify.hpp"

namespace mk::verify {

void verify_epilogue(const ir::Schedule& s, const std::string& fusion) {
  const std::string who = fmt::format("{} ({} ranks, epilogue {})", s.name.empty() ? std::string(name(s.coll)) : s.name,
                                      s.nranks, fusion);
  if (s.coll != Collective::allreduce)
    throw Error(ErrId::verify_E019,
                fmt::format("{}: {} is not an all-reduce; fused epilogues run on all-reduce outputs", who, name(s.coll)),
                s.loc, "fuse into an all-reduce schedule");
  // The first op that touches another rank's buffers, named at its DSL line
  // (a zero-copy plan has them by design; a staged one only when imported or
  // hand-lowered).
  for (size_t oi = 0; oi < s.ops.size(); ++oi) {
    const ir::Op& op = s.ops[oi];
    if (!op.is_data()) continue;
    auto check = [&](const ir::Ref& r, const char* how) {
      if (r.buf == ir::Buf::scratch || r.rank == op.rank) return;
      const std::string what = fmt::format("{} {} rank {}'s {} {}", describe_op(s, oi), how, r.rank,
                                           r.buf == ir::Buf::input ? "input" : "output", ir::to_string(r));
      if (s.zero_copy)
        throw Error(ErrId::verify_E019,
                    fmt::format("{}: a zero-copy plan lets peers read this rank's input and write its output from "
                                "their own kernels, unordered with this rank's epilogue: {}",
                                who, what),
                    op.loc, "use the staged plan (zero-copy plans cannot serve a fused epilogue)");
      throw Error(ErrId::verify_E019,
                  fmt::format("{}: {}; the epilogue runs in rank {}'s kernel tail and would race with it", who, what,
                              r.rank),
                  op.loc, "stage peers' data through scratch (only a rank's own ops may touch its buffers)");
    };
    for (const ir::Ref& r : op.srcs) check(r, "reads");
    for (const ir::Ref& r : op.dsts) check(r, "writes");
  }
  if (s.zero_copy)  // touches no peer (the pipeline stages such a schedule): refused all the same
    throw Error(ErrId::verify_E019,
                fmt::format("{}: a zero-copy plan lets peers read this rank's input and write its output from their "
                            "own kernels, unordered with this rank's epilogue",
                            who),
                s.loc, "use the staged plan (zero-copy plans cannot serve a fused epilogue)");
}

}  // namespace mk::verify
