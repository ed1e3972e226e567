// A composite (include/mk/composite.hpp) run end to end on the CPU: every
// stage's lowered schedule in the CPU executor (executor.hpp: thread blocks
// interleaved at random, flags, scratch rotation), in program order, on
// buffers that carry each stage's output to the stages that read it, against
// a float64 reference of the stages run as NCCL defines them. Stages the
// runtime runs side by side touch no buffer the other writes, so program
// order gives the same bytes as any order the runtime allows.
#pragma once

#include <string>
#include <vector>

#include "compiler/ir/ir.hpp"
#include "mk/composite.hpp"

namespace mk::verify {

struct CompositeSimResult {
  bool ok = true;
  int64_t checked = 0;     // elements compared (every buffer of every rank)
  int64_t mismatches = 0;
  double max_err = 0;      // largest |got - reference|
  std::string first_bad;   // "buffer out rank 1 element 17: got 3 want 4 (bound 0)"
  // Every buffer's bytes at the end, [buffer][rank]. Buffer b of rank r
  // starts as fill_input(DataSpec{dtype, op, seed * 1000 + b, 0, nranks}, r, ...)
  // (reference.hpp), so a test can check a result independently.
  std::vector<std::vector<std::vector<uint8_t>>> buffers;
};

// `lowered[i]`: stage i's lowered schedule for the composite's rank count
// (its root, for rooted collectives, is the stage's). Floating-point dtypes;
// ops sum, avg, min, max. The bound per element follows every stage's
// rounding: a reduction of n values adds (n - 1) unit roundoffs of the sum
// of their magnitudes, a store one of the value. Throws mk::Error
// (cli_E011) for other dtypes or ops.
CompositeSimResult simulate_composite(const dsl::Composite& c, const std::vector<const ir::Schedule*>& lowered,
                                      DType dtype, RedOp op, int64_t count, uint64_t seed);

}  // namespace mk::verify
