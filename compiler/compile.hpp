// From a built schedule to a plan: lower, generate, NVRTC, describe.
#pragma once

#include "compiler/ir/ir.hpp"
#include "compiler/pipeline.hpp"
#include "compiler/plan/plan.hpp"

namespace mk::compiler {

struct CompileOptions {
  int32_t arch = 90;
  DType dtype = DType::fp32;
  RedOp op = RedOp::sum;
  LowerOptions lower;
  bool use_cache = true;
};

struct CompileStats {
  double lower_ms = 0, codegen_ms = 0, nvrtc_ms = 0;
  bool from_cache = false;
};

plan::Plan compile_plan(ir::Schedule built, const CompileOptions& o, CompileStats* stats = nullptr);

}  // namespace mk::compiler
