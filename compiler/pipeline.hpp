// The compiler pipeline, top to bottom (compiler/pipeline.cpp):
//
//   build (DSL) -> verify -> stage -> fuse -> analyze -> parallelize -> assign
//     -> per size bucket: protocol -> sync -> verify(final)
//     -> codegen -> NVRTC -> plan
//
// `mkc lower --dump-after=PASS` prints the IR after any of pass_names().
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/ir/ir.hpp"
#include "compiler/passes/passes.hpp"
#include "compiler/verify/verify.hpp"

namespace mk::compiler {

struct PassInfo {
  double ms = 0;         // time since the previous pass ended
  bool changed = true;   // the IR's text differs from the previous pass's
};

struct LowerOptions {
  int32_t instances = 0;  // 0: what the schedule asks for
  int32_t max_tbs = 32;   // thread blocks per rank per instance
  int64_t min_bytes = 0;
  int64_t max_bytes = -1;  // -1: unbounded
  passes::ProtocolOptions proto;
  // What to lower for; unset: the schedule's own (ir::topology_of). A
  // schedule built for one topology cannot be lowered for another.
  std::optional<topology::Topology> topology;
  // Zero-copy: skip `stage`; ops read and write peers' registered user
  // buffers directly (the kernel gets their addresses at launch and runs an
  // entry and an exit barrier). Plans need no scratch.
  bool zero_copy = false;
  // Re-run the structural checks (verify_all: bounds, meaning, and once
  // synced pairing, deadlock and races) after every pass, so that each pass's
  // "Guarantees" header is enforced where it is broken, not downstream. On in
  // tests and fuzzing; off by default (the final proof runs anyway).
  bool verify_each = false;
  // Also ask whether every rank combines each reduction in the same order and
  // rounds it at the same points (verify_deterministic), as written and as lowered: answered by the
  // symbolic runs of verify and analyze (Lowered::nondeterministic_*).
  bool orders = false;
  // Called once per bucket with its variant (synced and proved) and the
  // number of buckets, as soon as that bucket is done: in the bucket's worker,
  // while other buckets are still being lowered (compile_plan generates code
  // and runs NVRTC here). It may take the variant's ops (Lowered then holds
  // it without them). With on_pass or verify_each it is called after the
  // last pass instead, in bucket order. A failure here is the bucket's.
  std::function<void(size_t bucket, size_t buckets, ir::Schedule& variant)> on_variant;
  // Called after every pass with its name (for --dump-after), its wall time
  // and whether it changed the printed IR.
  std::function<void(std::string_view pass, const ir::Schedule&, const PassInfo&)> on_pass;
};

struct Lowered {
  std::vector<passes::Bucket> buckets;
  std::vector<ir::Schedule> variants;  // one per bucket: synced and verified
  // With LowerOptions::orders: why ranks' results of a reduction may differ
  // bit-wise (verify::Orders; empty when they cannot), as written and as
  // lowered (the first variant, in bucket order, whose answer is not empty).
  verify::Orders nondeterministic_written, nondeterministic_lowered;
};

// Names accepted by --dump-after, in pipeline order.
const std::vector<std::string>& pass_names();

Lowered lower(ir::Schedule s, const LowerOptions& o);

// The variant that serves a message of `bytes` per rank (the last if none
// covers it).
const ir::Schedule& variant_for(const Lowered& l, int64_t bytes);

}  // namespace mk::compiler
