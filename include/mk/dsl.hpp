// mKernel DSL: write a collective algorithm as a chunk-level schedule.
//
// You describe *what moves where* over a global view of all ranks; the compiler
// verifies it, derives all synchronisation, splits the work into thread blocks
// and pipelined tiles, and emits one fused CUDA kernel.
//
//   #include <mk/dsl.hpp>
//   using namespace mk::dsl;
//
//   // every rank pushes its input into every peer's scratch, then reduces
//   static void one_shot(Program& p) {
//     const int n = p.ranks();
//     for (int r = 0; r < n; ++r)
//       for (int q = 0; q < n; ++q)
//         if (q != r) p.copy(p.scratch(q, r), p.input(r, 0));   // push r -> q
//     for (int r = 0; r < n; ++r) {
//       std::vector<Chunk> srcs{p.input(r, 0)};
//       for (int q = 0; q < n; ++q) if (q != r) srcs.push_back(p.scratch(r, q));
//       p.reduce(p.output(r, 0), srcs);
//     }
//   }
//   MK_SCHEDULE("my.allreduce.one_shot", allreduce, one_shot, "one-shot all-reduce");
//
// Meaning: the calls form a sequential program; executing the operations one
// after another, in call order, must compute the collective. The compiler runs
// them as concurrently as the data dependencies allow.
//
// Buffers: each rank has `input`, `output` and `scratch`, each a row of chunks.
// The user's buffer of `count` elements (one "block") is cut into
// `p.chunks(k)` chunks; all-gather's output has nranks blocks (rank q's data in
// block q), reduce-scatter's input has nranks blocks, all-to-all has nranks
// blocks in both. Scratch chunks are private staging slots of the schedule.
//
// Every call records its std::source_location; errors point at your line.
#pragma once

#include <functional>
#include <memory>
#include <source_location>
#include <string>
#include <vector>

#include "mk/error.hpp"
#include "mk/types.hpp"

namespace mk::ir {
struct Schedule;
}
namespace mk::topology {
struct Topology;
}

namespace mk::dsl {

enum class Buf { input, output, scratch };

// A run of `count` consecutive chunks of one rank's buffer.
struct Chunk {
  int rank = 0;
  Buf buf = Buf::input;
  int index = 0;
  int count = 1;
  // the i-th chunk of this run, as a one-chunk reference
  Chunk at(int i) const { return Chunk{rank, buf, index + i, 1}; }
  // chunks [i, i+n) of this run
  Chunk sub(int i, int n) const { return Chunk{rank, buf, index + i, n}; }
};

// Who executes an operation. By default copies run on the source's GPU (push:
// NVLink stores are faster than loads) and reductions on the GPU that owns all
// sources if there is one, else on the destination's GPU.
struct Exec {
  int on = -1;  // executing rank, -1: default
  int tb = -1;  // thread block on that rank, -1: the compiler chooses
};
inline Exec on(int rank) { return Exec{rank, -1}; }
inline Exec on(int rank, int tb) { return Exec{rank, tb}; }

class Program;

// A rank's buffer: `p.rank(r).input()[i]`.
class Buffer {
 public:
  Buffer(const Program* p, int rank, Buf buf) : p_(p), rank_(rank), buf_(buf) {}
  Chunk operator[](int index) const { return Chunk{rank_, buf_, index, 1}; }
  Chunk slice(int index, int count) const { return Chunk{rank_, buf_, index, count}; }

 private:
  const Program* p_;
  int rank_;
  Buf buf_;
};

class Rank {
 public:
  Rank(const Program* p, int r) : p_(p), r_(r) {}
  int id() const { return r_; }
  Buffer input() const { return Buffer(p_, r_, Buf::input); }
  Buffer output() const { return Buffer(p_, r_, Buf::output); }
  Buffer scratch() const { return Buffer(p_, r_, Buf::scratch); }

 private:
  const Program* p_;
  int r_;
};

class Program {
 public:
  using Loc = std::source_location;

  Program(Collective coll, int nranks, int root = 0, std::string name = "", Loc loc = Loc::current());
  ~Program();
  Program(Program&&) noexcept;
  Program& operator=(Program&&) noexcept;
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  Collective collective() const;
  int ranks() const;
  int root() const;
  const std::string& name() const;

  // The machine the program is built for. Ranks are numbered node-major:
  // rank r is GPU local(r) of node node(r), and rank_of(node(r), local(r)) ==
  // r. Loads and stores reach only ranks of one node (NVLink or PCIe); a copy
  // or reduce between nodes is lowered into network operations (puts into the
  // peer's scratch, passes/stage_network.cpp), which the verifier proves in
  // its network model (docs/ir.md). The default is one node of ranks() GPUs,
  // so a schedule that ignores these calls works everywhere it did before.
  int nodes() const;
  int gpus_per_node() const;
  int node(int r, Loc loc = Loc::current()) const;
  int local(int r, Loc loc = Loc::current()) const;
  int rank_of(int node, int local, Loc loc = Loc::current()) const;

  // Chunks per block (default 1). Set it before making chunk references.
  void chunks(int k, Loc loc = Loc::current());
  int chunks() const;
  // Pipelining: run `n` copies of the schedule side by side, each on its own
  // thread blocks and its own interleaved tiles of every chunk.
  void instances(int n, Loc loc = Loc::current());
  int instances() const;

  Rank rank(int r) const { return Rank(this, r); }
  Chunk input(int rank, int index, int count = 1) const { return Chunk{rank, Buf::input, index, count}; }
  Chunk output(int rank, int index, int count = 1) const { return Chunk{rank, Buf::output, index, count}; }
  Chunk scratch(int rank, int index, int count = 1) const { return Chunk{rank, Buf::scratch, index, count}; }

  // Number of chunks in a rank's input / output buffer.
  int input_chunks() const;
  int output_chunks() const;

  // dst := src
  void copy(const Chunk& dst, const Chunk& src, Exec e = {}, Loc loc = Loc::current());
  // dst := src into several destinations at once (read once, write many)
  void copy(const std::vector<Chunk>& dsts, const Chunk& src, Exec e = {}, Loc loc = Loc::current());
  // dst := op(srcs...) elementwise with the collective's reduction op. dst may
  // be one of the sources (accumulate); needs at least two sources.
  void reduce(const Chunk& dst, const std::vector<Chunk>& srcs, Exec e = {}, Loc loc = Loc::current());
  // dst := op(dst, src)
  void accumulate(const Chunk& dst, const Chunk& src, Exec e = {}, Loc loc = Loc::current());

  // ---- Phases over groups of ranks ----
  // The steps two-shot and the hierarchical schedules are made of, so that a
  // schedule composes them over any groups: all ranks, each node's
  // (node_groups()), each rail's (rail_groups()). Groups have equal sizes.
  // Ops come distance by distance across all groups (d = 1.., member i of
  // every group sending to member i + d, modulo the size), as a hand-written
  // loop over every rank emits them, and carry the caller's line.
  using Groups = std::vector<std::vector<int>>;
  using PairFn = std::function<Chunk(int from, int to)>;  // ranks
  using RankFn = std::function<Chunk(int rank)>;
  enum class Order { own_first, group };
  // Reduce-scatter: each member pushes piece(from, to) into slot(from, to)
  // (a chunk of `to`'s scratch) for every other member `to` of its group;
  // then each member reduces into dst(rank) its own piece(rank, rank) and
  // what it received: its own first, then by distance (own_first: the member
  // after it first), or in group order, its own at its place (group). The
  // order of a reduction's sources fixes its bits (docs/schedules.md).
  // Groups of at least 2.
  void reduce_scatter(const Groups& groups, const PairFn& piece, const RankFn& dst, const PairFn& slot, Order order,
                      Loc loc = Loc::current());
  // All-gather: each member copies src(rank) into dst(to, rank) of every
  // other member `to` of its group (with `self`, first into its own
  // dst(rank, rank) too, at distance 0).
  void all_gather(const Groups& groups, const RankFn& src, const PairFn& dst, bool self = false,
                  Loc loc = Loc::current());
  Groups all_ranks() const;    // one group: 0..ranks()-1
  Groups node_groups() const;  // each node's ranks, in local order
  Groups rail_groups() const;  // for each local index, its rank on every node, in node order

  // The IR built so far (for the compiler).
  ir::Schedule& ir();
  const ir::Schedule& ir() const;

 private:
  void check_chunk(const Chunk& c, Loc loc) const;
  void check_rank(int r, const char* what, Loc loc) const;
  void add(int kind, const std::vector<Chunk>& dsts, const std::vector<Chunk>& srcs, Exec e, Loc loc);
  ir::Schedule* s_;
};

// ---- Registration ----------------------------------------------------------

using BuildFn = void (*)(Program&);

struct ScheduleInfo {
  std::string name;  // "allreduce.ring"
  Collective coll = Collective::allreduce;
  BuildFn build = nullptr;
  std::string doc;
  std::string file;  // where it was registered
  int line = 0;
  int64_t seq = 0;   // registration order (set by register_schedule)
  // Copy engines carry it (runtime/launch/ce.hpp): the program says what moves
  // where (verify and simulate it like any schedule); the runtime issues
  // copy-engine transfers for it instead of compiling a kernel.
  bool copy_engine = false;
  // An algorithm imported from a file (MSCCL XML, MSCCL++ JSON, mKernel IR
  // JSON: compiler/sources.hpp) instead of built by `build`: the raw IR for
  // the one rank count (and root 0) it was written for. build() returns a
  // copy for that rank count and throws mk.dsl.E008 for any other.
  std::shared_ptr<const ir::Schedule> imported = nullptr;
};

// Adds a schedule to the process-wide registry. Returns true (for static init).
// A schedule of a name already registered replaces it (`mkc --plugin` lets a
// user file override a built-in), except while a RefuseReplacement is alive
// on this thread: then the name is recorded there and the registry is left
// as it was.
bool register_schedule(const ScheduleInfo& info);
struct RefuseReplacement {
  RefuseReplacement();
  ~RefuseReplacement();
  RefuseReplacement(const RefuseReplacement&) = delete;
  RefuseReplacement& operator=(const RefuseReplacement&) = delete;
  std::vector<std::string> refused;  // names that were already registered
 private:
  RefuseReplacement* outer_;
};
std::vector<ScheduleInfo> registered_schedules();
const ScheduleInfo* find_schedule(const std::string& name);

// Runs a registered builder for `nranks` ranks (and a root, for rooted
// collectives) and returns the raw IR. DSL errors keep their ids; anything else
// the builder throws becomes mk.dsl.E007. An imported schedule (`imported`)
// is returned as it is for its rank count; other rank counts or a root other
// than 0: mk.dsl.E008.
ir::Schedule build(const ScheduleInfo& info, int nranks, int root = 0);
// ... for a topology (its nranks() ranks; the one above builds for one NVLink
// node of nranks GPUs). The IR records the topology.
ir::Schedule build(const ScheduleInfo& info, const topology::Topology& t, int root = 0);

#define MK_DSL_CAT2(a, b) a##b
#define MK_DSL_CAT(a, b) MK_DSL_CAT2(a, b)
// MK_SCHEDULE("name", collective, builder_function, "one-line description")
#define MK_SCHEDULE(NAME, COLL, FN, DOC)                                                      \
  static const bool MK_DSL_CAT(mk_schedule_registered_, __LINE__) = ::mk::dsl::register_schedule( \
      ::mk::dsl::ScheduleInfo{NAME, ::mk::Collective::COLL, FN, DOC, __FILE__, __LINE__, 0, false, nullptr})

// MK_CE_SCHEDULE: the same, for a schedule the runtime runs on copy engines
// (ScheduleInfo::copy_engine); `mkc compile` refuses it.
#define MK_CE_SCHEDULE(NAME, COLL, FN, DOC)                                                       \
  static const bool MK_DSL_CAT(mk_schedule_registered_, __LINE__) = ::mk::dsl::register_schedule( \
      ::mk::dsl::ScheduleInfo{NAME, ::mk::Collective::COLL, FN, DOC, __FILE__, __LINE__, 0, true, nullptr})

}  // namespace mk::dsl
