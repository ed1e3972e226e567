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
//  verify_links      what crosses nodes: once staged, only puts (and signals)
//                    do; a plain load or store across the network is
//                    mk.verify.E017, a malformed put mk.verify.E023. Part of
//                    verify_semantics and verify_sync. Puts and flushes are
//                    proved in verify_sync's network model (network.cpp).
//  analyze           fills Op::pos and Op::final from the symbolic run.
//  verify_deterministic  ranks that end with the same reduced chunk get the
//                    same bits: they combine its contributions in the same
//                    order (floating-point sum and product are not
//                    associative) *and* store partial results in the dtype at
//                    the same points (every store into a buffer of fp16, bf16
//                    or fp8 rounds a value the kernel computed in float).
//                    Not in verify_all: `mkc verify` warns, `--strict`
//                    refuses. Which dtypes and ops a difference matters for:
//                    Orders::for_call.
//  verify_resources  a lowered schedule's scratch fits the communicator's
//                    default scratch (compile_plan refuses larger plans).
//  verify_prologue   (PreMulSum kernels, fusion prologues) every input element enters the
//                    result scaled exactly once: each read of an input chunk
//                    is by its owner, of the caller's data as it came in, and
//                    nothing reads an input unscaled through its in-place
//                    alias (mk.verify.E018). compile_plan asks it of every
//                    bucket of a premulsum plan.
//  verify_epilogue   (fused kernels) the epilogue in each rank's kernel tail
//                    sees every output element final and nothing touches it
//                    after: only a rank's own ops touch its buffers
//                    (mk.verify.E019). compile_plan asks it of every bucket
//                    of a fused plan.
//
// Rooted collectives are proved for root 0, the only root plans are built
// for: the kernel runs rank r as virtual rank (r - root) mod nranks, and
// every rooted collective's meaning is invariant under that relabelling
// (output_source, has_input and has_output rotate with the root; tested in
// test_verify.cpp), so the proof holds for every root the runtime can pass.
// verify_root() checks a schedule relabelled to one root explicitly.
//
// Each failure is an mk::Error with an mk.verify.* id naming the rank, step,
// chunk and DSL line.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "compiler/ir/ir.hpp"
#include "compiler/verify/symmetry.hpp"

namespace mk::verify {

void verify_bounds(const ir::Schedule& s);

// Why ranks may get different bits for one reduced chunk ("" where they
// cannot). `order`: two ranks combine its contributions in different orders
// (up to swapping the two operands of one step): every floating-point dtype
// under sum, prod, avg and premulsum. `rounding`: the same order, but one
// rank stores a partial result in the dtype (rounding it) where another
// keeps it in the compute type: the dtypes narrower than their compute type
// (fp16, bf16, fp8e4m3, fp8e5m2). Integer results, and min and max (exact,
// and associative and commutative bit for bit: templates/reduce.cuh), agree
// whatever the tree. Each names the ranks, the chunk, the ops and their DSL
// lines; `*_loc` is the DSL line of the first op that differs.
struct Orders {
  std::string order, rounding;
  SrcLoc order_loc, rounding_loc;
  bool empty() const { return order.empty() && rounding.empty(); }
  // What makes a call of this dtype and op differ between ranks ("": nothing).
  // Without a dtype: any dtype (order first, then rounding).
  const std::string& for_call(std::optional<DType> dtype = std::nullopt, RedOp op = RedOp::sum) const;
  // The location matching for_call's answer.
  SrcLoc loc_for(std::optional<DType> dtype = std::nullopt, RedOp op = RedOp::sum) const;
};

// With `orders` (non-null), the out-of-place run also answers
// verify_deterministic's question at little extra cost.
void verify_semantics(const ir::Schedule& s, Orders* orders = nullptr);
void verify_links(const ir::Schedule& s);
// Network operations (put, flush; verify/network.cpp): whether a schedule has
// any, and the schedule of plain copies, signals and waits on extra thread
// blocks (one per connection) that models them, which verify_sync proves and
// the executor runs in their place.
bool has_network_ops(const ir::Schedule& s);
ir::Schedule network_model(const ir::Schedule& s);
// The same, made of `s`'s own ops (moved, not copied: at 1024 ranks a copy
// was a third of the proof's peak memory); `restore` (when given) keeps what
// restore_from_model needs to give the schedule back.
struct NetworkRestore {
  int32_t first_new = 0;  // ids from here on are the model's own ops
  std::vector<std::pair<size_t, ir::Op>> ops;  // the ops it replaced, each with where its expansion starts
  int32_t scratch = 0, slots = 0, tbs = 0;
  std::optional<topology::Topology> topology;
};
ir::Schedule network_model(ir::Schedule&& s, NetworkRestore* restore);
ir::Schedule restore_from_model(ir::Schedule&& model, NetworkRestore&& restore);
// verify_sync of a schedule with network operations in place: its model is
// built from its ops and proved, and the schedule is given back (also when
// the proof throws).
// `mode`: symmetry.hpp's SymMode (automatic by default).
void verify_sync_network(ir::Schedule& s, size_t clock_budget, SymMode mode = SymMode::automatic);
void verify_sync(const ir::Schedule& s);
// All of the above that apply to the schedule's stage (verify_sync only once
// synced).
void verify_all(const ir::Schedule& s);

void analyze(ir::Schedule& s, Orders* orders = nullptr);  // `orders` as for verify_semantics

// Throws mk.verify.E015 when ranks may differ bit-wise for a call of `dtype`
// and `op` (without a dtype: of any dtype).
void verify_deterministic(const ir::Schedule& s, std::optional<DType> dtype = std::nullopt, RedOp op = RedOp::sum);
// Its two halves: why ranks may differ bit-wise, and the E015 error that says
// so for a call of `dtype` and `op` (nullopt-free: the error needs a reason).
Orders nondeterminism(const ir::Schedule& s);
Error nondeterministic_error(const Orders& why, std::optional<DType> dtype = std::nullopt, RedOp op = RedOp::sum);

// The communicator's default symmetric scratch per rank (MK_SCRATCH_BYTES).
inline constexpr int64_t kDefaultScratchBytes = int64_t(256) << 20;
// Scratch bytes per rank a lowered schedule needs: tile x slots x depth x
// instances (LL tiles take twice the bytes); 0 without scratch.
int64_t scratch_bytes(const ir::Schedule& s);
void verify_resources(const ir::Schedule& s);  // throws mk.verify.E016

// The kernel's prologue (templates/prims.cuh) scales a source exactly when it
// is an input chunk; whether that scales every contribution exactly once.
// Runs both aliasings; throws mk.verify.E018 naming the op, the chunk and the
// DSL line.
// `what` names the prologue in messages ("PreMulSum", "prologue of fusion
// my.clip_sum"): a fusion's prologue takes the same path in the kernel.
void verify_prologue(const ir::Schedule& s, const std::string& what = "PreMulSum");

// A fused epilogue (templates/fused.cuh) runs in each rank's kernel tail, on
// every element of its output once; whether that is after the element's
// final value and before nothing else touches it: an all-reduce whose ops
// touch only their own rank's input and output (no zero-copy). Throws
// mk.verify.E019 naming the op, the chunk and the DSL line.
void verify_epilogue(const ir::Schedule& s, const std::string& fusion);

// The schedule relabelled (ranks rotated) so that `root` is its root: from
// root 0, what the kernel does at run time; to root 0, what lower() does to a
// schedule written for another root (a plan is always for root 0). Non-rooted
// collectives only get root 0.
ir::Schedule rotate_root(ir::Schedule s, int32_t root);
// verify_semantics of the schedule relabelled to `root` (rooted collectives).
void verify_root(const ir::Schedule& s, int32_t root);

// "%12 (copy on rank 1, tb 0, step 3)": how errors name an op. `step` is the
// op's index in its rank's program.
std::string describe_op(const ir::Schedule& s, size_t op_index);

}  // namespace mk::verify
