// Small helpers shared by the importers (internal).
#pragma once

#include <fmt/format.h>

#include <string>

#include "compiler/importers/algo.hpp"
#include "compiler/importers/importers.hpp"

namespace mk::importers::detail {

// Limits that keep hostile input from allocating without bound.
inline constexpr int32_t kMaxRanks = 1024;
inline constexpr int64_t kMaxChunksPerBlock = 65536;
inline constexpr int64_t kMaxBufferChunks = int64_t(1) << 22;  // per rank and buffer
inline constexpr int64_t kMaxSteps = int64_t(1) << 22;         // steps in a file
inline constexpr int64_t kMaxViewCells = int64_t(1) << 22;     // cells over all ranks
inline constexpr int64_t kMaxChunkAccesses = int64_t(1) << 26;  // chunk reads + writes over all steps

// Relabels a rooted schedule so that `root` becomes rank 0 (plans are built
// for root 0; the runtime relabels for any root).
void rotate_to_root0(ir::Schedule& s, int32_t root);

// Re-throws an error found under the secondary reading with that context.
[[noreturn]] void rethrow_in_reading(const Error& e, const std::string& reading, const std::string& why);

}  // namespace mk::importers::detail
