// Enumerations shared by the compiler, the runtime and the tools: collectives,
// element types and reduction operators, with their names and parsers.
// The numeric values of DType and RedOp match NCCL's ncclDataType_t/ncclRedOp_t.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mk {

enum class Collective : uint8_t { allreduce, allgather, reducescatter, broadcast, reduce, alltoall };

enum class DType : uint8_t {
  int8 = 0,
  uint8 = 1,
  int32 = 2,
  uint32 = 3,
  int64 = 4,
  uint64 = 5,
  fp16 = 6,
  fp32 = 7,
  fp64 = 8,
  bf16 = 9,
  fp8e4m3 = 10,
  fp8e5m2 = 11,
};
inline constexpr int kNumDTypes = 12;

enum class RedOp : uint8_t { sum = 0, prod = 1, max = 2, min = 3, avg = 4 };
inline constexpr int kNumRedOps = 5;

std::string_view name(Collective c);
std::string_view name(DType t);
std::string_view name(RedOp o);

std::optional<Collective> parse_collective(std::string_view s);
// canonical names plus NCCL spellings (float, half, bfloat16, ncclFloat32, ...)
std::optional<DType> parse_dtype(std::string_view s);
std::optional<RedOp> parse_redop(std::string_view s);

size_t dtype_size(DType t);
bool dtype_is_float(DType t);
// the C++ type name used in generated device code (templates/dtype.cuh)
std::string_view dtype_device_name(DType t);

std::vector<DType> all_dtypes();
std::vector<RedOp> all_redops();
std::vector<Collective> all_collectives();

// Whether the collective reduces (takes an op) at all.
bool collective_reduces(Collective c);

}  // namespace mk
