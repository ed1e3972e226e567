// The copy-engine path: all-gather, all-to-all and broadcast moved by the
// GPU's copy engines instead of SM stores, and reduce-scatter and all-reduce
// whose transfers they make while a kernel reduces each tile as it lands
// (schedules `allgather.ce`, `alltoall.ce`, `broadcast.ce`,
// `reducescatter.ce`, `allreduce.ce`; the selection table or MK_ALGO picks
// them).
//
// A call is cut into tiles of at most `tile` bytes per peer. For each tile a
// rank copies its block(s) into a slot of each receiving peer's scratch (a
// copy engine writing over NVLink), then a one-warp kernel
// (templates/copy_engine.cuh) bumps its "shipped" counter for each of those
// peers and writes it to them. The receiving side waits (same kernel) until
// each sending peer's word says the tile is there, copies it from its own
// scratch into the output (reduce-scatter: reduces every peer's slot with its
// own block into the output, one kernel a tile), and signals "consumed"
// back. Sending and receiving run on two streams (the caller's and one of the
// communicator's), so tile t+1 travels while tile t is copied out or reduced.
// A slot is reused three tiles later, after its consumer said so; every phase
// first waits until all earlier tiles were consumed, because each phase
// numbers its slots from 0. All-reduce is two phases: a reduce-scatter of
// its chunks into the output, then (both streams meet) an all-gather of the
// chunks in place.
//
// program() is the whole protocol as data: the runtime issues it with the
// driver (ce.cpp, Issue), and the tests run it in a model of the streams
// with random interleavings against the collective's definition.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <cuda.h>

#include "mk/types.hpp"

namespace mk::rt::ce {

constexpr int32_t kSlots = 3;  // per (sender, receiver); three keep the sequential order (fake driver) deadlock-free
constexpr int64_t kDefaultTile = int64_t(4) << 20;  // ce::Shape's default (tests)

// The tile when MK_TUNE's ce_tile is 0 (the default): 64 MiB of scratch over
// nranks x kSlots slots, whole MiB, between 1 and 16 MiB. Each tile costs a
// copy and two small launches per rank and side, and switches each stream
// between copies and kernels (4 -> 16 MiB tiles took a 256 MiB all-gather from
// 1418 to 473 us eager on one H200: bench/results/*-copy-engine.md), so tiles
// are as large as that scratch allows.
int64_t default_tile(int32_t nranks);

// Whether the copy-engine path implements `coll`: all but reduce.
bool supports(Collective coll);

// Where bytes are: the caller's buffers of this rank, or rank `rank`'s
// copy-engine scratch (as this rank maps it).
struct Loc {
  enum Space : int8_t { input, output, scratch } space = input;
  int32_t rank = 0;  // scratch only
  int64_t offset = 0;
};

struct Op {
  // copy: src -> dst by a copy engine. sync: a CeSyncArgs launch. reduce
  // (receive side): dst := src (this rank's block) combined, in rank order,
  // with every sending peer's slot `slot` (the reduce kernel). join: both
  // streams meet (each waits for the other's work so far).
  enum Kind : int8_t { copy, sync, reduce, join } kind = copy;
  int8_t stream = 0;  // 0: the caller's (send side), 1: the communicator's (receive side)
  // copy
  Loc dst, src;
  int64_t bytes = 0;
  // sync (CeSyncArgs): side = stream
  bool bump = false;
  bool wait = false;
  int64_t delta = 0;
  int32_t only = -1;  // -1: every peer of the side; else one rank
  int32_t tile = 0;
  int32_t slot = 0;  // reduce
  // Issue step: 0 before the first tile, 2t+1 tile t's send side, 2t+2 its
  // receive side, 2 x tiles + 1 after the last. Ranks whose calls are issued
  // step by step in turn (one thread driving several ranks) never wait for a
  // peer's op that was not issued yet, even where enqueueing runs the work.
  int32_t step = 0;
};

struct Shape {
  Collective coll = Collective::allgather;
  int32_t nranks = 1, rank = 0, root = 0;
  int64_t bytes = 0;       // per block: count x element size
  int32_t elem = 1;        // element size (all-reduce's chunks are whole elements)
  bool in_place = false;   // the rank's own block is already where it belongs
  int64_t tile = kDefaultTile;
};

// All-reduce: chunk q of a count-element buffer (byte offset; q = nranks
// gives the end). Chunks are ceil(count / nranks) elements, the last ones
// shorter or empty.
int64_t chunk_offset(int64_t count, int32_t nranks, int32_t q, int32_t elem);

// Bytes of copy-engine scratch per rank: a slot per (sending rank, slot).
int64_t scratch_bytes(int32_t nranks, int64_t tile);
// Offset of sender `from`'s slot `slot` in a rank's scratch.
int64_t slot_offset(int32_t from, int32_t slot, int64_t tile);

// The ops of rank shape.rank for one call, in the order they are issued
// (each stream runs its own ops in this order). Counters and words are
// indexed by peer; a sync's peers are the ranks this side sends to (stream
// 0) or receives from (stream 1), narrowed by `only`.
// The NVRTC sources of the sync kernel and of the reduce kernel for (dt, op)
// (*name: its kernel name, mk_ce_reduce_<dtype>_<op>).
std::string sync_source();
std::string reduce_source(DType dt, RedOp op, std::string* name);

// *steps: the number of issue steps, the same on every rank of the call
// (a rank with nothing to do at a step still counts it).
std::vector<Op> program(const Shape& s, int32_t* steps = nullptr);

// The peers rank `rank` sends to (side 0) or receives from (side 1).
std::vector<int32_t> peers(Collective coll, int32_t nranks, int32_t rank, int32_t root, int side);

}  // namespace mk::rt::ce

namespace mk::rt {
class Comm;
struct PlanInstance;
namespace ce {
// One call of a copy-engine instance, issued on `stream` (the send side; the
// receive side runs on one of the communicator's streams, forked from and
// joined back into `stream`, so the call is stream-ordered and capturable),
// one step at a time. Caller holds c.mu around each step(). A driver failure
// part-way makes the communicator's error sticky and aborts it (peers would
// wait for the rest).
class Issue {
 public:
  // `capturing`: `stream` is capturing a graph (the caller asked already).
  Issue(Comm& c, PlanInstance& inst, Collective coll, DType dt, RedOp op, int32_t root, int64_t bytes,
        const void* input, void* output, CUstream stream, bool capturing);
  // Issues the next step; false once the call is complete (joined).
  bool step();

 private:
  void issue(const Op& o);
  Comm& c_;
  PlanInstance& inst_;
  Collective coll_;
  const void* input_;
  void* output_;
  CUstream stream_, recv_ = nullptr;
  bool capturing_;
  CUfunction reduce_ = nullptr;  // reduce-scatter and all-reduce
  std::vector<Op> ops_;
  size_t next_ = 0, issued_ = 0;
  int32_t step_ = -1, steps_ = 0;
};
}  // namespace ce
}  // namespace mk::rt
