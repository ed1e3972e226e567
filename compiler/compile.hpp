// From a built schedule to a plan: lower, generate, NVRTC, describe.
#pragma once

#include <functional>
#include <vector>

#include "compiler/ir/ir.hpp"
#include "compiler/pipeline.hpp"
#include "compiler/plan/plan.hpp"
#include "mk/fusion.hpp"

namespace mk::compiler {

struct CompileOptions {
  int32_t arch = 90;
  DType dtype = DType::fp32;
  RedOp op = RedOp::sum;
  LowerOptions lower;
  bool use_cache = true;
  // Take the plan from the shipped plans (compiler/plan/prebuilt.hpp) when
  // one matches: the runtime does; `mkc compile`, which writes sources, not.
  bool use_prebuilt = true;
  // >= 0: generate and compile only the code of this rank's class
  // (plan::Plan::serves lists its ranks; from codegen::Limits::own_rank_from
  // ranks, this rank's code alone); -1: every rank.
  int32_t rank = -1;
  // A fused epilogue (include/mk/fusion.hpp, by its registered name) in every
  // kernel's tail; empty: none. Only for all-reduce plans that verify_epilogue
  // accepts (EpilogueRefused otherwise).
  std::string fusion;
  // Checked epilogue accessors (templates/fused.cuh RowCtx::kCheck; the
  // runtime's MK_FUSION_CHECK=1, `mkc compile --fusion-check`): a debugging
  // build of a fused plan that traps on an access outside a row.
  bool fusion_check = false;
};

// The wall time's split: lowering until the last size bucket was proved,
// then that bucket's code generation and NVRTC (each bucket's ran in its
// lowering worker as soon as it was proved, overlapping the others).
struct CompileStats {
  // Each size bucket, in bucket order: when its lowering and proof ended
  // (from the start of compile_plan), its codegen and its NVRTC time. The
  // buckets are lowered, generated and compiled on worker threads side by
  // side, so their times overlap; the wall time is the critical path's.
  struct Bucket {
    double proved_ms = 0, codegen_ms = 0, nvrtc_ms = 0;
    double done_ms() const { return proved_ms + codegen_ms + nvrtc_ms; }
  };
  std::vector<Bucket> buckets;
  size_t critical = 0;  // the bucket that finished last
  // The critical bucket's split: until it was proved, its codegen, its NVRTC.
  double lower_ms = 0, codegen_ms = 0, nvrtc_ms = 0;
  bool from_cache = false;    // the whole plan came from the plan cache
  bool cubins_cached = false;  // compiled, but every cubin came from the cubin cache
};

// Every compile option that shapes a plan, serialised as JSON text: arch,
// dtype, op, rank, the fusion (its name and a hash of its code and operands)
// and all of LowerOptions and ProtocolOptions. `use_cache` and
// `LowerOptions::on_pass`, `on_variant`, `orders` and `verify_each` do not shape the plan and are left out. The fields
// are taken apart with structured bindings, so adding a field to one of these
// structs fails to compile here until it is serialised (or named as excluded).
std::string options_json(const CompileOptions& o);

// A fusion as it shapes a plan: "name@hash" of its code, operands and row
// settings as registered now ("" for ""); throws mk.cli.E011 for an unknown
// name. plan::Plan::fusion holds it, so a plan compiled against another
// version of a fusion's code is never taken for it.
std::string fusion_identity(const std::string& name);
// The same, of one registration (find_fusion_unchecked's entry).
std::string fusion_identity(const dsl::FusionInfo& reg);

// "known fusions: a, b": the registered fusions' names, for error hints.
std::string known_fusions();

// The plan cache key (32 hex digits): a hash of the built schedule's IR JSON,
// options_json(o), the embedded templates, mKernel's version and NVRTC's
// identity. Equal keys mean equal plans.
std::string plan_key(const ir::Schedule& built, const CompileOptions& o);

// `on_serves`, when given, hears each bucket's ranks as soon as its code is
// generated, before NVRTC (from its lowering worker; empty: every rank): the
// plan will serve at most the ranks common to them all. The runtime lets a
// rank that will not be among them start its own compile at once.
using ServesFn = std::function<void(const std::vector<int32_t>& ranks)>;
plan::Plan compile_plan(ir::Schedule built, const CompileOptions& o, CompileStats* stats = nullptr,
                        const ServesFn& on_serves = {});

}  // namespace mk::compiler
