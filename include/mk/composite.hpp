// Composites: the communication of a whole step, several collectives, written
// as one program and run as one kernel.
//
//   #include <mk/composite.hpp>
//   using namespace mk::dsl;
//
//   // ZeRO/FSDP: reduce-scatter the gradients, then all-gather the
//   // parameters, one launch
//   static void rs_then_ag(Composite& c) {
//     const int grads = c.buffer("grads"), shard = c.buffer("grad_shard");
//     const int params = c.buffer("params"), full = c.buffer("full_params");
//     c.reduce_scatter(grads, shard, "reducescatter.ring");
//     c.all_gather(params, full);   // no schedule: the runtime's choice for the size
//   }
//   MK_COMPOSITE("my.rs_then_ag", rs_then_ag, "gradient reduce-scatter, then parameter all-gather");
//
// Meaning: the stages run in program order, each the collective NCCL defines
// over the named buffers, with the call's `count` (elements per block: a
// reduce-scatter reads ranks x count and writes count, an all-gather the
// reverse, as ncclReduceScatter / ncclAllGather with that count). A stage
// that reads or overwrites what an earlier stage writes (or overwrites what
// it reads) runs after it; other stages run side by side. Each stage runs the
// schedule it names (proved like any other), or the runtime's selection.
//
// mkCompositeRun (mk.h) runs one with a buffer per name, in declaration order.
// The runtime compiles the stages into one group kernel (docs/groups.md): the
// ordered stages chained on the same thread blocks, the independent ones on
// blocks of their own. Where a group kernel cannot be built (too many blocks
// for the rank's share of the GPU, a copy-engine or zero-copy stage), the
// stages run one launch each, in program order: same results.
//
// `mkc composite NAME -n N` lists the stages, proves every schedule a stage
// names for N ranks, and shows which stages chain and which run side by side;
// with --simulate it runs every stage's lowered schedule on the CPU in program
// order against a float64 reference (verify::simulate_composite).
#pragma once

#include <memory>
#include <source_location>
#include <string>
#include <vector>

#include "mk/error.hpp"
#include "mk/types.hpp"

namespace mk::dsl {

// At most this many stages (a group kernel holds up to 32 collectives) and
// buffers.
inline constexpr int kMaxStages = 32;
inline constexpr int kMaxCompositeBuffers = 64;

struct Stage {
  Collective coll = Collective::allreduce;
  int in = 0, out = 0;     // buffer indices (Composite::buffer)
  int root = 0;            // broadcast, reduce
  std::string schedule;    // "" : the runtime's selection for the call's size
  SrcLoc loc;              // the stage's line in the composite's file
};

class Composite {
 public:
  using Loc = std::source_location;

  // For `nranks` ranks (a builder may depend on it, as schedules do).
  explicit Composite(int nranks, std::string name = "", Loc loc = Loc::current());

  int ranks() const { return nranks_; }
  const std::string& name() const { return name_; }

  // Declares a user buffer; returns its index. The call passes one pointer
  // per buffer, in declaration order. Names are unique: letters, digits, '_'.
  int buffer(const std::string& name, Loc loc = Loc::current());

  // Stages, in program order; each returns its index. In-place (in == out)
  // is the same pointer for all-reduce, broadcast and reduce; the others
  // take distinct buffers.
  int all_reduce(int in, int out, const std::string& schedule = "", Loc loc = Loc::current());
  int all_gather(int in, int out, const std::string& schedule = "", Loc loc = Loc::current());
  int reduce_scatter(int in, int out, const std::string& schedule = "", Loc loc = Loc::current());
  int all_to_all(int in, int out, const std::string& schedule = "", Loc loc = Loc::current());
  int broadcast(int in, int out, int root, const std::string& schedule = "", Loc loc = Loc::current());
  int reduce(int in, int out, int root, const std::string& schedule = "", Loc loc = Loc::current());
  int stage(Collective coll, int in, int out, int root, const std::string& schedule, Loc loc = Loc::current());

  const std::vector<std::string>& buffers() const { return buffers_; }
  const std::vector<Stage>& stages() const { return stages_; }
  const SrcLoc& loc() const { return loc_; }

  // Elements per rank buffer `b` must hold for a call of `count`: the most
  // any stage reads or writes of it.
  int64_t buffer_elems(int b, int64_t count) const;
  // Whether stage `j` must run after stage `i` (i < j): j reads or writes
  // what i writes, or writes what i reads.
  bool depends(int i, int j) const;

 private:
  int nranks_;
  std::string name_;
  SrcLoc loc_;
  std::vector<std::string> buffers_;
  std::vector<Stage> stages_;
};

using CompositeFn = void (*)(Composite&);

struct CompositeInfo {
  std::string name;  // "my.rs_then_ag"
  CompositeFn build = nullptr;
  std::string doc;
  std::string file;
  int line = 0;
};

// Adds a composite to the process-wide registry (a later registration of a
// name replaces the earlier one, as for schedules). Returns true.
bool register_composite(const CompositeInfo& info);
std::vector<CompositeInfo> registered_composites();
// How many registrations there have been (a plugin that registers only
// composites still registered something).
int64_t composite_registrations();
const CompositeInfo* find_composite(const std::string& name);

// Runs the builder for `nranks` ranks and checks the result: at least one
// stage, every schedule it names registered, of the stage's collective and
// not a copy-engine schedule (mk.dsl.E010 with the stage's line). Anything
// else the builder throws becomes mk.dsl.E007.
Composite build_composite(const CompositeInfo& info, int nranks);

// MK_COMPOSITE("name", builder_function, "one-line description")
#define MK_COMPOSITE(NAME, FN, DOC)                                                                   \
  static const bool MK_COMPOSITE_CAT(mk_composite_registered_, __LINE__) = ::mk::dsl::register_composite( \
      ::mk::dsl::CompositeInfo{NAME, FN, DOC, __FILE__, __LINE__})
#define MK_COMPOSITE_CAT2(a, b) a##b
#define MK_COMPOSITE_CAT(a, b) MK_COMPOSITE_CAT2(a, b)

}  // namespace mk::dsl
