#include "mk/types.hpp"

#include <algorithm>
#include <array>
#include <cctype>

namespace mk {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

struct DTypeInfo {
  DType t;
  std::string_view name;
  size_t size;
  bool is_float;
  std::string_view device;
  std::array<std::string_view, 5> aliases;
};

constexpr std::array<DTypeInfo, kNumDTypes> kDTypes = {{
    {DType::int8, "int8", 1, false, "int8_t", {"char", "nccl_int8", "ncclint8", "ncclchar", "i8"}},
    {DType::uint8, "uint8", 1, false, "uint8_t", {"nccluint8", "u8", "", "", ""}},
    {DType::int32, "int32", 4, false, "int32_t", {"int", "ncclint32", "ncclint", "i32", ""}},
    {DType::uint32, "uint32", 4, false, "uint32_t", {"nccluint32", "u32", "", "", ""}},
    {DType::int64, "int64", 8, false, "int64_t", {"ncclint64", "i64", "", "", ""}},
    {DType::uint64, "uint64", 8, false, "uint64_t", {"nccluint64", "u64", "", "", ""}},
    {DType::fp16, "fp16", 2, true, "mk::dev::f16", {"half", "float16", "ncclfloat16", "ncclhalf", "f16"}},
    {DType::fp32, "fp32", 4, true, "float", {"float", "float32", "ncclfloat32", "ncclfloat", "f32"}},
    {DType::fp64, "fp64", 8, true, "double", {"double", "float64", "ncclfloat64", "nccldouble", "f64"}},
    {DType::bf16, "bf16", 2, true, "mk::dev::bf16", {"bfloat16", "ncclbfloat16", "", "", ""}},
    {DType::fp8e4m3, "fp8e4m3", 1, true, "mk::dev::f8e4m3", {"e4m3", "fp8_e4m3", "float8e4m3", "ncclfloat8e4m3", "f8e4m3"}},
    {DType::fp8e5m2, "fp8e5m2", 1, true, "mk::dev::f8e5m2", {"e5m2", "fp8_e5m2", "float8e5m2", "ncclfloat8e5m2", "f8e5m2"}},
}};

constexpr std::array<std::string_view, kNumRedOps> kOps = {"sum", "prod", "max", "min", "avg"};
constexpr std::array<std::string_view, 6> kColls = {"allreduce", "allgather", "reducescatter",
                                                    "broadcast", "reduce",    "alltoall"};

}  // namespace

std::string_view name(Collective c) { return kColls.at(size_t(c)); }
std::string_view name(DType t) { return kDTypes.at(size_t(t)).name; }
std::string_view name(RedOp o) { return kOps.at(size_t(o)); }

std::optional<Collective> parse_collective(std::string_view s) {
  std::string l = lower(s);
  l.erase(std::remove_if(l.begin(), l.end(), [](char c) { return c == '_' || c == '-'; }), l.end());
  if (l.rfind("nccl", 0) == 0) l = l.substr(4);
  if (l == "alltoall" || l == "alltoallv") l = "alltoall";
  for (size_t i = 0; i < kColls.size(); ++i)
    if (l == kColls[i]) return Collective(i);
  return std::nullopt;
}

std::optional<DType> parse_dtype(std::string_view s) {
  std::string l = lower(s);
  for (const auto& d : kDTypes) {
    if (l == d.name) return d.t;
    for (auto a : d.aliases)
      if (!a.empty() && l == a) return d.t;
  }
  return std::nullopt;
}

std::optional<RedOp> parse_redop(std::string_view s) {
  std::string l = lower(s);
  if (l.rfind("nccl", 0) == 0) l = l.substr(4);
  for (size_t i = 0; i < kOps.size(); ++i)
    if (l == kOps[i]) return RedOp(i);
  return std::nullopt;
}

size_t dtype_size(DType t) { return kDTypes.at(size_t(t)).size; }
bool dtype_is_float(DType t) { return kDTypes.at(size_t(t)).is_float; }
std::string_view dtype_device_name(DType t) { return kDTypes.at(size_t(t)).device; }

std::vector<DType> all_dtypes() {
  std::vector<DType> v;
  for (const auto& d : kDTypes) v.push_back(d.t);
  return v;
}
std::vector<RedOp> all_redops() {
  std::vector<RedOp> v;
  for (int i = 0; i < kNumRedOps; ++i) v.push_back(RedOp(i));
  return v;
}
std::vector<Collective> all_collectives() {
  std::vector<Collective> v;
  for (size_t i = 0; i < kColls.size(); ++i) v.push_back(Collective(i));
  return v;
}

bool collective_reduces(Collective c) {
  return c == Collective::allreduce || c == Collective::reducescatter || c == Collective::reduce;
}

}  // namespace mk
