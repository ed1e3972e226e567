// CPU reference executor: runs a lowered schedule (thread blocks, steps,
// instances, flags, scratch rotation, LL gating) on host arrays with the real
// arithmetic of every dtype and op, interleaving thread blocks in a random
// order that respects the waits, and compares each rank's output with a
// float64 (or exact integer) reference. It uses the same tile math and the
// same conversions as the GPU kernels (templates/layout.cuh, dtype.cuh).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/ir/ir.hpp"
#include "mk/fusion.hpp"


namespace mk::verify {

// Caller-provided data instead of the generated inputs and the reference
// check (a composite's stages, verify/composite.hpp): in[r] is rank r's input
// (its input bytes; empty for a rank without one), and the run leaves rank r's
// output in out[r] (empty for a rank without one). One launch; nothing is
// compared.
struct SimIO {
  std::vector<std::vector<uint8_t>> in, out;
};

struct SimOptions {
  DType dtype = DType::fp32;
  RedOp op = RedOp::sum;
  int64_t count = 1024;  // elements per rank (the collective's count argument)
  bool inplace = false;
  int32_t root = 0;      // rooted collectives: the plan is rotated to this root
  int32_t launches = 2;  // back-to-back launches (fresh data each) to exercise flag epochs
  uint64_t seed = 1;     // data and interleaving
  // Narrow-float sums on data whose partial sums round (reference.hpp
  // DataSpec::inexact): shows ranks that round at different points.
  bool inexact = false;
  int64_t tile_bytes = 0;  // 0: what the runtime would pick (pick_tile_bytes)
  // Zero-copy plans: model the kernel's entry and exit barriers (every rank
  // starts a launch once every rank has finished the previous one). false
  // shows what goes wrong without them (tests).
  bool zc_barriers = true;
  SimIO* io = nullptr;  // see SimIO
  // A fusion's prologue (include/mk/fusion.hpp MK_PROLOGUE), run on every
  // read of an input chunk as the kernel does, with rank r's scalars
  // pre_scalars[r] (needs `io`: the reference does not know the prologue).
  const dsl::FusionInfo* prologue = nullptr;
  std::vector<std::vector<double>> pre_scalars;
};

struct SimResult {
  bool ok = true;        // no mismatch and no rank_diffs
  double max_err = 0;    // largest |got - ref| seen
  double max_tol = 0;    // tolerance at that element
  int64_t mismatches = 0;  // elements outside the reference's tolerance
  // All-reduce elements whose bits differ from the first rank's (every value
  // may still be within tolerance): what verify_deterministic (E015) rules out.
  int64_t rank_diffs = 0;
  std::string first_diff;  // "launch 0: rank 2 element 5 differs bit-wise from rank 0's (3 element(s))"
  int64_t steps = 0;     // steps per launch
  int64_t ops_run = 0;
  std::string first_bad;  // "launch 0 rank 1 elem 17: got 3 want 4 (tol 0)"
};

// Throws mk::Error(verify_E005) when the simulated run deadlocks, and
// verify_prologue's mk.verify.E018 for a PreMulSum run of a schedule whose
// kernel could not scale every input once (op premulsum: a source that is an
// input chunk is multiplied by its rank's prescale_of scalar, as the kernel
// does). The data and
// its reference are compiler/verify/reference.hpp's (the GPU tests use them too).
SimResult simulate(const ir::Schedule& lowered, const SimOptions& o);

}  // namespace mk::verify
