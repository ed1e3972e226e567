// mk::ir: the schedule IR every pass reads and writes.
//
// A Schedule is a global, sequential program over all ranks: `ops` in order is
// its meaning (executing them one after another computes the collective). Each
// op runs on one rank (`rank`, the GPU that executes it) and, after
// assign_tbs, on one thread block (`tb`) of that rank. Ops of one (rank, tb)
// run in the order they appear in `ops`. Cross-thread-block order exists only
// through signal/wait pairs, which insert_sync derives.
//
// Memory: each rank has an input, an output and a scratch buffer, each a row
// of chunks. A data buffer is `blocks x chunks` chunks: a block is the
// per-rank element count the user passes (NCCL's `count`), cut into `chunks`
// pieces; all-gather's output has one block per rank, and so on
// (buf_chunks()). Scratch holds `scratch` slots of one tile each; a slot is
// reused every step (and rotated over `depth` copies).
//
// Execution is tiled: every step, each op moves one tile (tile_bytes) of each
// of its chunks; `instances` copies of the whole program run side by side on
// interleaved tiles (parallelize).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/ir/small_vec.hpp"
#include "compiler/topology/topology.hpp"
#include "mk/error.hpp"
#include "mk/types.hpp"

namespace mk::ir {

enum class OpKind : uint8_t {
#define MK_OP(name, min_srcs, min_dsts, meaning) name,
#include "compiler/ir/ops.def"
#undef MK_OP
};
std::string_view name(OpKind k);
std::optional<OpKind> parse_opkind(std::string_view s);
int min_srcs(OpKind k);
int min_dsts(OpKind k);
std::string_view meaning(OpKind k);
std::vector<OpKind> all_opkinds();

enum class Buf : uint8_t { input, output, scratch };
std::string_view name(Buf b);  // "in", "out", "sc"
std::optional<Buf> parse_buf(std::string_view s);

enum class Proto : uint8_t { simple, ll };
std::string_view name(Proto p);
std::optional<Proto> parse_proto(std::string_view s);

// `count` consecutive chunks of one rank's buffer, starting at `index`.
struct Ref {
  int32_t rank = 0;
  Buf buf = Buf::input;
  int32_t index = 0;
  int32_t count = 1;
  bool operator==(const Ref&) const = default;
  Ref at(int32_t i) const { return Ref{rank, buf, index + i, 1}; }
};
std::string to_string(const Ref& r);            // "r1.sc[3]", "r0.out[2:4]"
std::optional<Ref> parse_ref(std::string_view s);  // inverse of to_string

// An op's source position, interned: copying one copies a pointer. Every signal
// and wait carries the position of the op it orders (millions at 1024 ranks),
// which as a SrcLoc were two heap strings each. Interned positions live for the
// process; Loc() is the invalid position.
class Loc {
 public:
  Loc() = default;
  Loc(const SrcLoc& l);  // NOLINT: implicit, so that `op.loc = some_srcloc` interns
  operator const SrcLoc&() const { return *p_; }  // NOLINT: passes where a SrcLoc is taken
  const SrcLoc& get() const { return *p_; }
  const SrcLoc* operator->() const { return p_; }
  bool valid() const { return p_->valid(); }
  std::string str() const { return p_->str(); }
  bool operator==(const Loc& o) const { return p_ == o.p_; }  // interned: same position, same pointer

 private:
  static const SrcLoc* const kNone;  // never destroyed: static destructors may read a Loc
  const SrcLoc* p_ = kNone;
};

// An op's operands and chunk positions: mostly one or two each (small_vec.hpp).
using Refs = SmallVec<Ref, 1>;
using Positions = SmallVec<int32_t, 2>;

struct Op {
  int32_t id = -1;  // unique, stable across passes (new ops get fresh ids)
  OpKind kind = OpKind::nop;
  int32_t rank = -1;  // executing rank
  int32_t tb = -1;    // thread block on `rank`; -1 until assign_tbs
  Refs srcs;
  Refs dsts;
  int32_t peer = -1;  // signal: rank whose flag slot is written
  int32_t slot = -1;  // signal: slot on `peer`; wait: slot on own rank
  int32_t iter = 0;   // wait: step offset of the awaited signal (0, or -depth)
  bool final = false;  // reduce whose result is complete: applies avg and the epilogue
  Positions pos;  // per chunk: its position in the block (set by analyze)
  Loc loc;

  bool is_data() const { return kind == OpKind::copy || kind == OpKind::reduce || kind == OpKind::put; }
  // dsts := srcs[0]: a copy, or a put (a copy across the network).
  bool is_copy() const { return kind == OpKind::copy || kind == OpKind::put; }
  int32_t count() const { return dsts.empty() ? 0 : dsts[0].count; }
};

struct Schedule {
  static constexpr int kVersion = 1;

  std::string name;
  Collective coll = Collective::allreduce;
  int32_t nranks = 1;
  int32_t root = 0;
  int32_t chunks = 1;     // chunks per block
  int32_t instances = 1;  // parallel copies of the program on interleaved tiles
  int32_t scratch = 0;    // scratch slots per rank per step
  int32_t tbs = 0;        // thread blocks per rank (max over ranks); 0 before assign_tbs
  int32_t slots = 0;      // flag slots per rank (max over ranks); 0 before insert_sync
  int32_t depth = 1;      // copies of scratch rotated over consecutive steps
  Proto proto = Proto::simple;
  int64_t tile_bytes = 0;  // largest tile (bytes per chunk per step per instance), which
                           // sizes scratch slots; each launch picks its tile up to this
                           // (layout.cuh pick_tile_bytes). 0 until chosen
  bool staged = false;     // only owners touch user buffers (stage_remote ran)
  bool synced = false;     // signal/wait present (insert_sync ran)
  bool zero_copy = false;  // lowered for registered buffers: ops touch peers' user buffers
  // One pass (passes/one_pass.cpp): an LL schedule whose launches are one
  // step each and whose scratch reuse is ordered by the launches themselves;
  // kernels run its data ops without its wait and signal ops.
  bool one_pass = false;
  // Lamport packets (passes/one_pass.cpp mark_lamport): a one-pass schedule
  // whose scratch holds plain data, with a sentinel where nothing has arrived
  // yet; each slot's one reader polls it and puts the sentinel back. Floats
  // of at most 4 bytes only (the sentinel is an all-ones 32-bit word, there a
  // NaN the writer replaces), so it is set per dtype after lowering.
  bool lamport = false;
  // What it is built and lowered for; unset: one NVLink node of nranks GPUs
  // (topology_of). When set, topology->nranks() == nranks.
  std::optional<topology::Topology> topology;
  std::vector<Op> ops;
  SrcLoc loc;  // where the schedule is declared (MK_SCHEDULE, or the Program); not serialised
  // Scratch slots the author's ops use (after compaction) where stage_remote
  // added slots of its own (scratch - author_scratch of them); -1: unknown.
  // For messages; not serialised.
  int32_t author_scratch = -1;

  int32_t next_id() const;  // an id no op has yet
};

// Buffer geometry (collectives.def). blocks(...) * chunks = chunks in that
// buffer; scratch is not made of blocks (buf_blocks says 1).
int32_t buf_blocks(Collective c, int32_t nranks, Buf b);
int32_t buf_chunks(const Schedule& s, Buf b);  // scratch: s.scratch
// Which ranks own a meaningful input/output (broadcast/reduce: only the root
// has a send buffer / receive buffer): mk::has_input/has_output at s.root.
bool has_input(const Schedule& s, int32_t rank);
bool has_output(const Schedule& s, int32_t rank);
// In-place: the output chunk that aliases input chunk `index` of `rank`, if any
// (mk::inplace_rule; none where the rank lacks a buffer or the collective has
// no in-place form).
std::optional<int32_t> inplace_output_of_input(const Schedule& s, int32_t rank, int32_t index);
// The same as a shift: input chunk i of `rank` is output chunk i + shift when
// 0 <= i + shift < output chunks; nullopt when nothing aliases there.
std::optional<int32_t> inplace_shift(const Schedule& s, int32_t rank);

// The schedule's topology, or one NVLink node of s.nranks GPUs when unset.
topology::Topology topology_of(const Schedule& s);

// Text form: stable and diff-friendly (golden tests use it).
std::string print(const Schedule& s);
std::string print_op(const Op& op);

// JSON round trip with a schema version.
std::string to_json(const Schedule& s, int indent = 1);
// What to_json writes, hashed without writing it (32 hex digits, hash.hpp):
// equal for schedules whose JSON is equal, a cache key. At 1024 ranks the JSON
// of a million ops took 5 s to build for a key.
std::string fingerprint(const Schedule& s);

// Whether `a` and `b` run the same data ops in the same order (kind, rank,
// operands, final flag, positions), whatever their thread blocks and sync ops:
// what a proof of meaning depends on.
bool same_data_ops(const Schedule& a, const Schedule& b);
Schedule from_json(std::string_view text);  // throws Error(ir_E001/E002)

}  // namespace mk::ir
