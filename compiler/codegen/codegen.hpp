// Code generation: lowered schedules -> one CUDA source with one kernel per
// size bucket. The device code proper lives in templates/*.cuh; the generated
// source only fills in what varies: plan constants (ranks, chunks, tiles,
// instances, slots) as constexprs, and per rank class and thread block the
// straight-line list of operations of one step.
//
// Rank classes: ranks whose programs are the same up to rotation (rank r+d
// does what rank r does with every rank, block and chunk position shifted by
// d) share one code path, with peers and chunks computed from the rank at run
// time. Ring and direct schedules written step-major have one class, so a
// 64-rank plan compiles as fast as a 2-rank one (schedules that are not
// symmetric, e.g. one-shot's rank-ordered sums or a root's special role, get
// one class per distinct program). Rooted collectives are built for root 0;
// the kernel runs the program of virtual rank (rank - root).
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
  std::vector<int32_t> representative;  // per class
};
RankClasses rank_classes(const ir::Schedule& s);

struct KernelInfo {
  std::string name;
  int32_t grid = 0;
  int32_t block = 0;
  int32_t classes = 0;
};

// One compilation unit per size bucket (compiled in parallel).
struct Unit {
  std::string source;
  KernelInfo kernel;
};
// `variants`: lowered schedules (one per bucket), all of one collective and
// rank count. `tag`: a C identifier fragment naming the plan.
std::vector<Unit> generate(const std::vector<ir::Schedule>& variants, DType dtype, RedOp op,
                           const std::string& tag);

// The embedded templates/*.cuh (name, contents), for NVRTC.
const std::vector<std::pair<std::string_view, std::string_view>>& embedded_templates();

// "allreduce.ring" -> "allreduce_ring"
std::string identifier(std::string_view s);

}  // namespace mk::codegen
