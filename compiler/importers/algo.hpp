// The importers' common middle: an imported algorithm as a graph of steps,
// and its translation into the mKernel IR.
//
// Both MSCCL and MSCCL++ describe a collective as per-GPU thread blocks, each
// a list of steps, plus cross-thread-block ordering (dependencies, send/recv
// pairs, signal/wait, barriers). The format readers (msccl_xml.cpp,
// mscclpp_json.cpp) build a Graph: one node per step, in its thread's program
// order, with the extra ordering edges and the chunks each step reads and
// writes. This file then
//
//   1. orders the graph (topo_order): a level-by-level topological order, so
//      the IR comes out "step-major" like a hand-written DSL schedule; a cycle
//      is a deadlock and an error naming the steps on it;
//   2. proves the graph race-free (check_races): any two steps that touch the
//      same chunk, one writing, must be ordered by the graph (vector clocks),
//      so that every topological order means the same thing;
//   3. translates steps into IR ops in that order (Emitter), mapping the
//      file's buffers onto the IR's under one "reading" of the file (View).
//
// Readings. MSCCL/MSCCL++ files are written either for in-place calls (the
// input lies inside the output, and steps may name either) or out-of-place.
// The IR must be right in BOTH modes, input buffers being read-only. The View
// therefore maps each file chunk to a "cell" with an initial value (an IR
// input chunk, or nothing) and a home where writes go (an IR output chunk, or
// a private scratch slot). A read before the cell's first write reads the
// initial value, afterwards the home. Where an in-place file leaves its own
// data in place (never writes a cell whose home is an output chunk), the
// Emitter materialises the input into that output first: a copy that is a
// no-op in-place and the required copy out-of-place. Where, under the IR's
// in-place aliasing, a write would clobber an input chunk that is still to be
// read, the Emitter saves the input chunk into scratch first. Both are proved
// by the verifier like any other op.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "compiler/ir/ir.hpp"

namespace mk::importers::detail {

enum class VBuf : uint8_t { i = 0, o = 1, s = 2 };
const char* vbuf_name(VBuf b);  // "input", "output", "scratch"
const char* vbuf_letter(VBuf b);  // "i", "o", "s"

// `count` chunks of a file buffer of `rank`, in view units (file chunks times
// the refinement factor, see Geometry::refine).
struct VRef {
  int32_t rank = 0;
  VBuf buf = VBuf::i;
  int32_t index = 0;
  int32_t count = 1;
};
std::string to_string(const VRef& r);  // "gpu 1 o[3]", "gpu 0 s[2:4]"

struct Access {
  VRef ref;
  bool write = false;
};

struct Node {
  int32_t thread = -1;  // -1: a virtual node (a barrier instance)
  int32_t pos = 0;      // index in its thread
  int32_t gpu = -1;
  SrcLoc loc;           // file:line (func: the JSON path, if any)
  std::string what;     // "gpu 1 tb 2 step 5 (rrc)"
  std::vector<int32_t> preds;  // ordering edges besides program order
  std::vector<Access> acc;     // reads listed before writes
  int32_t payload = -1;        // the format reader's step record
};

struct Thread {
  int32_t gpu = 0;
  int32_t tb = 0;
  std::vector<int32_t> nodes;
};

struct Graph {
  std::vector<Node> nodes;
  std::vector<Thread> threads;

  int32_t add_thread(int32_t gpu, int32_t tb);
  // Appends a node to `thread` (program order), or a virtual node (-1).
  int32_t add_node(int32_t thread, int32_t gpu, SrcLoc loc, std::string what);
  void edge(int32_t from, int32_t to) { nodes[size_t(to)].preds.push_back(from); }
  // Records that node n reads or writes `ref` (reads first, then writes).
  // Throws import_E012 past kMaxChunkAccesses chunks in all, which bounds
  // the work of everything downstream.
  void access(int32_t n, const VRef& ref, bool write);
  int64_t chunk_accesses = 0;
  // "file:line" of a node, for messages
  std::string where(int32_t n) const;
  // View units per file chunk (Geometry's refinement); describe() names a
  // reference in the file's own chunks, with the byte range of a part of a
  // chunk where the reference is one ("gpu 1 s[0] bytes [C/2, C) (C: ...)").
  int32_t refine = 1;
  std::string describe(const VRef &r) const;
};

// Level-by-level topological order of all nodes (program order + edges),
// ties broken by (gpu, thread block, position). Throws import_E007 naming a
// cycle. `hint` goes into that error.
std::vector<int32_t> topo_order(const Graph& g, const std::string& hint);

// The collective's buffers as the file sees them.
struct Geometry {
  Collective coll = Collective::allreduce;
  int32_t nranks = 1;
  int32_t root = 0;
  int32_t chunks = 1;             // IR chunks per block (view units)
  std::vector<int32_t> scratch;   // per rank: scratch chunks the file declares (view units)
  std::vector<int32_t> decl_in;   // per rank: declared input chunks, -1 when not declared
  std::vector<int32_t> decl_out;  // per rank: declared output chunks, -1 when not declared

  int32_t in_chunks() const;   // IR input chunks per rank
  int32_t out_chunks() const;  // IR output chunks per rank
};

// One reading (in-place or out-of-place) of the file's buffers.
class View {
 public:
  View(const Geometry& g, bool inplace);
  const Geometry& geo() const { return g_; }
  bool inplace() const { return inplace_; }

  // Chunks a reference may address in buffer b of `rank` (file semantics: for
  // i and o the collective's buffer, further limited by what the file
  // declares; for s the declared scratch).
  int32_t bound(int32_t rank, VBuf b) const;
  int64_t cell(int32_t rank, VBuf b, int32_t index) const;  // dense id of one chunk's cell
  int64_t ncells() const { return int64_t(per_rank_) * g_.nranks; }
  int32_t cell_rank(int64_t cell) const { return int32_t(cell / per_rank_); }

  struct Cell {
    std::optional<ir::Ref> init;  // initial value (an input chunk), if any
    std::optional<ir::Ref> home;  // where writes go; nullopt: a private scratch slot
  };
  Cell info(int64_t cell) const;

 private:
  Geometry g_;
  bool inplace_;
  int32_t unified_ = 0;  // in-place: chunks of the unified user buffer
  int32_t per_rank_ = 0;
};

// Throws import_E009 naming two unordered steps that touch the same cell.
void check_races(const Graph& g, const std::vector<int32_t>& order, const View& v, const std::string& hint);

// Translates steps into IR ops (see the file comment).
class Emitter {
 public:
  // `order` is the emission order; `s` receives the ops (its geometry must be
  // set). File scratch slot i is IR scratch slot i; the Emitter's own slots
  // (private homes, staging) start at `scratch_base`.
  Emitter(const Graph& g, const std::vector<int32_t>& order, const View& v, ir::Schedule& s,
          int32_t scratch_base);

  // Emits the copies that put each in-place file's own input into its
  // output (see the file comment). Call once, before the first node.
  void materialise_in_place_inputs(const SrcLoc& loc);
  // Sets the node being emitted (its position in `order`).
  void begin_node(int32_t order_index, const SrcLoc& loc);

  // Per-chunk IR refs of a file reference: reading (current values) and
  // writing (homes; private slots are allocated here).
  std::vector<ir::Ref> read(const VRef& r);
  std::vector<ir::Ref> write(const VRef& r);
  void mark_written(const VRef& r);

  // Emits dsts := src (copy) or dsts := op(srcs...) (reduce) chunk by chunk,
  // coalescing consecutive chunks into one op. Operands are per-chunk refs
  // of equal length. Before writing, it materialises in-flight transfers and
  // saves input chunks that the write would clobber (see the file comment).
  void emit(ir::OpKind kind, const std::vector<std::vector<ir::Ref>>& dsts,
            const std::vector<std::vector<ir::Ref>>& srcs);

  // MSCCL transfers ("flights"): data a send step captured, consumed by the
  // matching receive. The captured refs stay lazy until something would
  // overwrite them; then they are copied into a fresh scratch slot of the
  // receiver (what the runtime's FIFO does).
  int32_t capture(int32_t sender, int32_t receiver, std::vector<ir::Ref> refs);
  std::vector<ir::Ref> consume(int32_t flight);
  // `count` fresh consecutive scratch slots of `rank`
  std::vector<ir::Ref> fresh(int32_t rank, int32_t count);

  int32_t staging_ops() const { return staging_; }
  // Sets s.scratch; call after the last node.
  void finish();

 private:
  struct Flight {
    int32_t sender = 0, receiver = 0;
    std::vector<ir::Ref> refs;
    bool live = false;
  };
  int64_t canon(const ir::Ref& r) const;  // the storage an IR chunk uses under in-place aliasing
  void push(ir::OpKind kind, const std::vector<std::vector<ir::Ref>>& dsts,
            const std::vector<std::vector<ir::Ref>>& srcs, bool count_staging);
  void before_write(const std::vector<std::vector<ir::Ref>>& dsts, const std::vector<ir::Ref>* copy_src);
  void materialise(int32_t flight);
  ir::Ref home(int64_t cell);
  std::optional<ir::Ref> home_of(int64_t cell) const;  // nullopt: private, not allocated yet
  std::optional<ir::Ref> init_of(int64_t cell) const;

  const View& v_;
  ir::Schedule& s_;
  SrcLoc loc_;
  int32_t cur_ = -1;
  int32_t staging_ = 0;
  std::vector<int32_t> next_slot_;
  std::vector<uint8_t> written_;  // per cell: 0 not yet, 1 written, 2 never written by the file
  std::unordered_map<int64_t, int32_t> last_init_read_;  // cell -> last order index reading its initial value
  std::unordered_map<int64_t, ir::Ref> private_home_, init_override_;
  std::unordered_map<int64_t, std::vector<int64_t>> init_users_;  // canon -> cells reading it as init
  std::vector<Flight> flights_;
  std::unordered_map<int64_t, std::vector<int32_t>> flight_users_;  // canon -> live flights
};

}  // namespace mk::importers::detail
