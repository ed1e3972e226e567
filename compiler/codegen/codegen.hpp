// Code generation: lowered schedules -> one CUDA source with one kernel per
// size bucket. The device code proper lives in templates/*.cuh; the generated
// source only fills in what varies: plan constants (ranks, chunks, tiles,
// instances, slots) as constexprs, and per rank class and thread block the
// straight-line list of operations of one step.
//
// Rank classes: ranks whose programs have the same steps (the same kinds of
// operation, with the same numbers of sources, destinations, waits and
// signals, in the same order per thread block) share one code path. Peers,
// blocks and chunk positions are relative to the rank (rotated by it); where
// all members of a class agree on such a number it is a compile-time
// constant in the generated code, where they differ (e.g. recursive
// halving-doubling's partner r xor 2^k) it is read from a rank-indexed table
// (one row per member: `kT<bucket>_c<class>[kMember<bucket>[rank]]`, in
// constant memory while the tables fit in 32 KiB, else global memory). So
// ring, direct and halving-doubling schedules have one class for any rank
// count, and code size is O(one rank's program). Only ranks whose step lists
// differ (e.g. a root's special role) get their own class. Rooted collectives
// are built for root 0; the kernel runs the program of virtual rank
// (rank - root).
//
// Wide ops: an op of more than 8 sources or destinations passes its
// operands as a runtime list (kernel.cuh op_wide loops over them), so NVRTC's
// work does not grow with the operand count. Where ranks differ only in the
// kinds of a reduce's sources (one_shot: the own input at its own place in
// the fixed rank order), every reduce is made wide and the encoded operands
// come from the rank table: one class, and each rank still folds its sources
// in the schedule's order.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "compiler/ir/ir.hpp"

namespace mk::codegen {

struct RankClasses {
  int32_t pos_rot = 0;                // chunk-position rotation per rank (0 or chunks/ranks)
  std::vector<int32_t> class_of;      // per (virtual) rank
  std::vector<int32_t> representative;  // per class: its lowest rank
  std::vector<std::string> why;         // per class: how it differs from class 0 ("" for class 0)
};
RankClasses rank_classes(const ir::Schedule& s, bool one_pass_generic = false);
// "class 0: ranks 0-3,5 (1 code path)\n" per class, with how it differs from class 0.
std::string print_classes(const RankClasses& rc);

struct KernelInfo {
  std::string name;
  int32_t grid = 0;
  int32_t block = 0;
  int32_t classes = 0;
  int64_t size = 0;         // what Limits::max_size bounds
  int64_t table_bytes = 0;  // rank tables
};

// What one kernel may hold; more is refused with jit E005 before NVRTC runs.
// Size: per statement (a rerolled loop body counts once) its operands, plus
// 32 x the operands of every distinct instantiation of the data primitive.
// A wide op's loop body counts once (2 operands), whatever its operand count.
// NVRTC's time and memory grow faster than linearly with it: one_shot at 16
// ranks (16 classes, before it became one, size ~9.5k) took 233 s and 1.3 GB
// on the 2-core build machine, at 8 ranks (~2.6k) 34 s.
struct Limits {
  int64_t max_size = 8192;
  int64_t max_table_bytes = 16ll << 20;
  // false: no loops, every chunk of every op its own statement (the same
  // statements in the same order: tests compare the rerolled code with it)
  bool reroll = true;
  // A plan for one rank (`generate`'s rank) whose class's rank tables pass
  // this many bytes holds only that rank's rows and serves that rank alone
  // (1024 ranks: megabytes of initialisers NVRTC parses for seconds).
  int64_t row_only_bytes = 64 << 10;
  // A plan for one rank of at least this many ranks is generated from that
  // rank's program alone (its own code path, every number a constant or a
  // loop table entry, serving that rank alone) instead of from every rank's
  // (rank classes, then the rank's rows): at 1024 ranks splitting every
  // rank's program took seconds and hundreds of megabytes. From 128 ranks the
  // hierarchical plans' tables already passed row_only_bytes.
  int32_t own_rank_from = 128;
  // The simple protocol's streaming loop (P::kLoads, P::kPipeline).
  int32_t loads = 16;
  bool pipeline = false;
  // Lamport kernels' 16-byte units in flight per thread (P::kLamportUnits).
  int32_t lamport_units = 1;
  // One-pass kernels: one code path for ranks whose reduces differ only in
  // their sources' kinds (passes::ProtocolOptions::one_pass_generic).
  bool one_pass_generic = false;
  // Adjacent thread blocks of a class with the same item shapes share one
  // function (Emitter::emit_group; passes::ProtocolOptions::block_groups).
  bool block_groups = true;
  // A fused epilogue (include/mk/fusion.hpp) in the kernel's tail: its name,
  // device code (defining struct Epi) and each operand's dtype and shape
  // (0 per element, 1 per column, 2 per row). Empty source: none.
  struct Epilogue {
    std::string name;
    std::string source;
    std::vector<std::pair<DType, int32_t>> operands;
    // Checked accessors (templates/fused.cuh RowCtx::kCheck): which operands
    // are outputs, how many scalars the fusion declares.
    bool check = false;
    std::vector<bool> outputs;
    int32_t scalars = 4;
  } epilogue;
  // A fusion's prologue (MK_PROLOGUE: device code defining struct Pro),
  // applied to every read of this rank's input (templates/prims.cuh
  // Combine). Empty source: none.
  struct Prologue {
    std::string name;
    std::string source;
  } prologue;
};

// One compilation unit per size bucket (compiled in parallel).
struct Unit {
  std::string source;
  KernelInfo kernel;
  std::vector<int32_t> serves;  // the ranks the kernel runs correctly on, ascending; empty: every rank
};
// `variants`: lowered schedules (one per bucket), all of one collective and
// rank count. `tag`: a C identifier fragment naming the plan.
// `rank` >= 0: only the code path of that rank's class is generated (and
// its tables), so the kernel's size is O(one class) however many classes
// the schedule has; Unit::serves lists the class's ranks, and on any other
// rank the kernel does nothing (callers must refuse to launch it there).
// From lim.own_rank_from ranks, the code is generated from that rank's
// program alone and serves that rank (O(one rank's program) to generate).
// Rooted collectives run the program of rank - root, which moves with the
// root at run time: they keep every class (serves stays empty).
// Throws Error(jit_E005) when a bucket's kernel exceeds `lim`.
std::vector<Unit> generate(const std::vector<ir::Schedule>& variants, DType dtype, RedOp op,
                           const std::string& tag, const Limits& lim = {}, int32_t rank = -1);
// One bucket's unit: variant `bucket` of `buckets` (what generate does for
// each, side by side). compile_plan calls it as each bucket is proved.
Unit generate_one(const ir::Schedule& variant, size_t bucket, size_t buckets, DType dtype, RedOp op,
                  const std::string& tag, const Limits& lim = {}, int32_t rank = -1);

// A group kernel: several plan kernels in one launch (the runtime's fused
// mkGroupStart/End). Each member is a kernel generated above (`source`,
// `kernel` its name) with its own mk::dev::Args (mk::dev::GroupArgs<members>
// ::a[i], in member order). Members of one `lane` (they share scratch, flags
// and step counters, or one reads or writes what another writes) run in
// member order on the same blocks (the lane has its largest member's `grid`;
// a smaller member runs on the first of them), each after every block of the
// one before has finished (kernel.cuh chain_barrier; a lane stops at the
// first failure). Lanes run side by side, on consecutive block ranges in
// order of their first member. Every member uses `threads` threads per
// block; members with the same kernel share its code. Throws
// Error(jit_E005) for 0 or more than dev::kMaxGroupMembers members.
struct GroupMember {
  std::string source;
  std::string kernel;
  int32_t grid = 0;
  int32_t lane = 0;
};
std::string group_source(const std::vector<GroupMember>& members, int32_t threads, const std::string& kernel_name);

// The embedded templates/*.cuh (name, contents), for NVRTC.
const std::vector<std::pair<std::string_view, std::string_view>>& embedded_templates();

// "allreduce.ring" -> "allreduce_ring"
std::string identifier(std::string_view s);

// The comment the generated `source` gives op `op` (its IR id, as an error
// record names it): "%7 copy r0.in[1] -> r1.sc[0]  (file.cpp:22)", or "" if
// none. A rerolled loop's ops are commented once, as its first iteration's:
// only that one is found (a thread-block group comments every block's op).
std::string op_comment(const std::string& source, int32_t op);

}  // namespace mk::codegen
