// The verifier: proves, before any code is emitted, that a schedule computes
// its collective and that its synchronisation is sound.
//
//  verify_bounds     every ref inside its buffer, every rank/peer/slot valid.
//  verify_semantics  symbolic execution in program order, once with input and
//                    output separate and once aliased (in-place): every output
//                    chunk ends with exactly the contributions the collective
//                    demands; nothing reads unwritten data or writes a buffer it
//                    may not.
//  verify_sync       (after insert_sync) signals and waits pair up; the wait
//                    graph has no cycle; every two operations that touch the
//                    same bytes, one of them writing, are ordered by
//                    happens-before in program order, within a step and across
//                    the scratch reuse between steps.
//  verify_links      every op touches only ranks its executing rank has a
//                    direct link to (the schedule's topology: not across the
//                    network between nodes, mk.verify.E017). Part of
//                    verify_semantics.
//  analyze           fills Op::pos and Op::final from the symbolic run.
//
// Each failure is an mk::Error with an mk.verify.* id naming the rank, step,
// chunk and DSL line.
#pragma once

#include <string>
#include <vector>

#include "compiler/ir/ir.hpp"

namespace mk::verify {

void verify_bounds(const ir::Schedule& s);
void verify_semantics(const ir::Schedule& s);
void verify_links(const ir::Schedule& s);
void verify_sync(const ir::Schedule& s);
// All of the above that apply to the schedule's stage (verify_sync only once
// synced).
void verify_all(const ir::Schedule& s);

void analyze(ir::Schedule& s);

// "%12 (copy on rank 1, tb 0, step 3)": how errors name an op. `step` is the
// op's index in its rank's program.
std::string describe_op(const ir::Schedule& s, size_t op_index);

}  // namespace mk::verify
