// Compiler passes: pure functions Schedule -> Schedule, one per file. Each
// file's header comment states what the pass does, what it needs and what it
// guarantees. compiler/pipeline.cpp runs them top to bottom.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "compiler/ir/ir.hpp"
#include "compiler/verify/symmetry.hpp"

namespace mk::verify {
struct DataNeeds;  // hb.hpp
}

namespace mk::passes {

ir::Schedule compact_scratch(ir::Schedule s);
ir::Schedule stage_remote(ir::Schedule s);
// Cross-node transfers into puts (stage_network.cpp); after stage_remote.
ir::Schedule stage_network(ir::Schedule s);
ir::Schedule fuse(ir::Schedule s);
ir::Schedule parallelize(ir::Schedule s, int32_t instances);
ir::Schedule assign_tbs(ir::Schedule s, int32_t max_tbs);

// What one size bucket is compiled with (choose_protocol fills it in).
struct Bucket {
  int64_t min_bytes = 0;  // user buffer bytes (count * element size), inclusive
  int64_t max_bytes = 0;  // inclusive
  ir::Proto proto = ir::Proto::simple;
  int64_t tile_bytes = 0;
  int32_t depth = 2;
  int32_t instances = 1;
  int32_t threads = 512;  // threads per block
};

struct ProtocolOptions {
  int64_t scratch_budget = 32ll << 20;  // bytes of scratch one plan may use per rank
  int64_t ll_max_bytes = 256 << 10;     // LL for buckets that end at or below this
  int64_t max_tile_bytes = 256 << 10;
  int forced_proto = -1;                // -1: choose; else ir::Proto
  int64_t forced_tile = 0;              // 0: choose
  int32_t forced_instances = 0;         // 0: from the schedule
  // Instances per protocol when not forced: max(schedule's, this). More
  // instances = more CTAs moving data in parallel (bandwidth), more scratch.
  int32_t simple_instances = 32;
  int32_t ll_instances = 16;
  // At most this many thread blocks per kernel (0: no cap): instances are
  // lowered until instances x blocks per instance fits (never below 1).
  // The runtime passes mkConfig_t.maxCTAs here.
  int32_t max_grid = 0;
  // The simple protocol's streaming loop (templates/kernel.cuh prim_simple):
  // 16-byte loads in flight per thread, and whether the next batch's loads
  // are issued before this batch's stores.
  int32_t simple_loads = 16;
  int32_t simple_pipeline = 0;
  // LL buckets run in one pass where passes/one_pass.cpp allows (1) or keep
  // their flags and thread blocks (0).
  int32_t one_pass = 1;
  // One-pass buckets of floats of at most 4 bytes carry Lamport packets where
  // passes/one_pass.cpp mark_lamport allows (1: 16 data bytes a 16-byte
  // store, no flag) or LL packets (0: 8 data bytes and a flag).
  int32_t lamport = 1;
  // Lamport kernels: 16-byte units each thread loads before it polls and
  // stores (at most 4 with two sources, 2 with four, else 1). One is fastest
  // up to 256 KiB on one H200 (session 12: 2 and 4 add 0.2-0.7 us a call up
  // to 64 KiB); two with 32 instances from 256 KiB to 1 MiB.
  int32_t lamport_units = 1;
  // One-pass kernels whose ranks differ only in where their own input sits
  // among a reduce's sources (one-shot, the hierarchical reduce-scatter):
  // one code path for every rank, the reduce's operands from the rank's
  // table row (1, kernel.cuh op_gpass), or a code path per rank (0). One
  // path compiles about 10x faster (one-shot at 8 ranks: 1.4 s instead of
  // 14 s on 2 cores) but costs 1-2 us a call up to 8 KiB on the one-GPU
  // proxy (s22: 8 ranks 11.2 -> 13.0 us at 512 B; equal from 32 KiB), so
  // the default keeps the per-rank paths; the runtime compiles only its own
  // rank's path either way.
  int32_t one_pass_generic = 0;
  // Adjacent thread blocks that run the same steps with other peers, slots
  // and chunks (a direct all-to-all's block per peer, two-shot's scatter):
  // one function, its numbers per block from the block's index (1,
  // codegen's block groups), or a function per block (0). One function
  // compiles 2-5x faster at 16 ranks (two-shot: 2.8 -> 0.6 s on 2 cores).
  int32_t block_groups = 1;
  // Copy-engine schedules (runtime/launch/ce.hpp): bytes per peer and tile, a
  // multiple of 64 KiB (bounds the ops a call issues); 0: by rank count
  // (ce::default_tile). Shapes no kernel (not part of plan cache
  // keys); the runtime reads it.
  int64_t ce_tile_bytes = 0;
};

// Size buckets for [min_bytes, max_bytes] (max -1: unbounded).
std::vector<Bucket> plan_buckets(const ir::Schedule& s, int64_t min_bytes, int64_t max_bytes,
                                 const ProtocolOptions& o);
ir::Schedule choose_protocol(ir::Schedule s, const Bucket& b);
// One pass (one_pass.cpp): whether an LL bucket's kernel can run every data
// op of a rank in one pass with no flags (`why`: what stands in the way);
// one_block puts each rank's ops into one thread block (before insert_sync);
// mark_one_pass sets Schedule::one_pass after insert_sync when it holds.
bool one_pass_possible(const ir::Schedule& s, int64_t max_bytes, std::string* why = nullptr);
ir::Schedule one_block(ir::Schedule s);
ir::Schedule mark_one_pass(ir::Schedule s, int64_t max_bytes);
// Lamport packets (one_pass.cpp): whether a one-pass schedule's scratch can
// hold plain data with a sentinel (every slot written by one op and read by
// one other op, once); mark_lamport sets Schedule::lamport for a dtype
// lamport_dtype allows when `on` and it holds, and clears it otherwise.
bool lamport_possible(const ir::Schedule& s, std::string* why = nullptr);
// Whether a dtype can carry Lamport packets: floats of at most 4 bytes (the
// sentinel is an all-ones 32-bit word, a NaN only where an element fills
// no more than that word; in an fp64 it can be the low half of a number).
bool lamport_dtype(DType t);
ir::Schedule mark_lamport(ir::Schedule s, DType dtype, bool on);
ir::Schedule insert_sync(ir::Schedule s);
// Flushes before a put's source may be written (insert_flush.cpp); after insert_sync.
ir::Schedule insert_flush(ir::Schedule s);
// With an explicit clock budget in bytes (tests force several chain blocks),
// and the schedule's access needs where the caller has them
// (verify::data_needs(s, s.proto == ll), for s as given here).
ir::Schedule insert_sync(ir::Schedule s, size_t clock_budget, const verify::DataNeeds* needs = nullptr);

// insert_sync's two halves, for tests. What must be ordered, per data op j,
// latest first: the earlier ops it conflicts with in a step (within), and the
// accessors of the scratch slots it writes, whose step-g accesses must come
// before its write at g + depth (reuse).
// Per op, a short list of op indices, flat (a vector per op was a fifth of
// insert_sync's memory and most of its allocations at 1024 ranks).
struct OpLists {
  std::vector<uint32_t> at{0};  // size() + 1 offsets into items
  std::vector<uint32_t> items;
  size_t size() const { return at.size() - 1; }
  std::span<const uint32_t> operator[](size_t j) const {
    return {items.data() + at[j], items.data() + at[j + 1]};
  }
};
struct SyncNeeds {
  OpLists within, reuse;
};
SyncNeeds sync_needs(const ir::Schedule& s, const verify::DataNeeds* given = nullptr);
// Which of those get a signal/wait: iter 0 within a step, -depth for reuse.
// Sorted by (to, iter, from).
struct SyncEdge {
  size_t from, to;
  int32_t iter;
};
// `mode`: whether the decisions may be made once per rank class, by the
// dependency graph's rank symmetry (verify/symmetry.hpp); the edges are the same.
std::vector<SyncEdge> sync_edges(const ir::Schedule& s, const SyncNeeds& needs, size_t clock_budget,
                                 verify::SymMode mode = verify::SymMode::automatic);

}  // namespace mk::passes
