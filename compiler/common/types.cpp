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

constexpr std::array<std::string_view, kNumRedOps> kOps = {"sum", "prod", "max", "min", "avg", "premulsum"};
struct CollInfo {
  std::string_view name, api;
  bool reduces;
  RootBuffer rooted;
  Blocks in, out;
  InPlace inplace;
};

constexpr std::array<CollInfo, kNumCollectives> kColls = {{
#define MK_COLL(id, name, api, reduces, rooted, in_blocks, out_blocks, inplace) \
  {name, api, reduces, RootBuffer::rooted, Blocks::in_blocks, Blocks::out_blocks, InPlace::inplace},
#include "mk/collectives.def"
#undef MK_COLL
}};

// Plans' kernels carry these numbers in their call signature (and tests pin
// them): a reordered collectives.def would silently mismatch old plans.
static_assert(int(Collective::allreduce) == 0 && int(Collective::allgather) == 1 &&
              int(Collective::reducescatter) == 2 && int(Collective::broadcast) == 3 &&
              int(Collective::reduce) == 4 && int(Collective::alltoall) == 5);

const CollInfo& info(Collective c) { return kColls.at(size_t(c)); }

int blocks(Blocks b, int nranks) { return b == Blocks::nranks ? nranks : 1; }

}  // namespace

std::string_view name(Collective c) { return info(c).name; }
std::string_view name(DType t) { return kDTypes.at(size_t(t)).name; }
std::string_view name(RedOp o) { return kOps.at(size_t(o)); }

std::optional<Collective> parse_collective(std::string_view s) {
  std::string l = lower(s);
  l.erase(std::remove_if(l.begin(), l.end(), [](char c) { return c == '_' || c == '-'; }), l.end());
  if (l.rfind("nccl", 0) == 0) l = l.substr(4);
  if (l == "alltoall" || l == "alltoallv") l = "alltoall";
  for (size_t i = 0; i < kColls.size(); ++i)
    if (l == kColls[i].name) return Collective(i);
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
  if (l == "premul_sum") l = "premulsum";  // torch.distributed's spelling
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
  for (int i = 0; i <= int(RedOp::avg); ++i) v.push_back(RedOp(i));
  return v;
}
std::vector<Collective> all_collectives() {
  std::vector<Collective> v;
  for (size_t i = 0; i < kColls.size(); ++i) v.push_back(Collective(i));
  return v;
}

std::string_view api_name(Collective c) { return info(c).api; }
bool collective_reduces(Collective c) { return info(c).reduces; }
RootBuffer root_buffer(Collective c) { return info(c).rooted; }
bool collective_rooted(Collective c) { return root_buffer(c) != RootBuffer::none; }
bool has_input(Collective c, int rank, int root) { return root_buffer(c) != RootBuffer::input || rank == root; }
bool has_output(Collective c, int rank, int root) { return root_buffer(c) != RootBuffer::output || rank == root; }
int input_blocks(Collective c, int nranks) { return blocks(info(c).in, nranks); }
int output_blocks(Collective c, int nranks) { return blocks(info(c).out, nranks); }

BlockSource output_source(Collective c, int root, int rank, int out_block) {
  const int in_block = info(c).in == Blocks::nranks ? rank : 0;
  if (collective_reduces(c)) return {BlockSource::kAllRanks, in_block};
  if (info(c).out == Blocks::nranks) return {out_block, in_block};
  return {root, in_block};
}

InPlace inplace_rule(Collective c) { return info(c).inplace; }
int inplace_input_block(Collective c, int rank) { return inplace_rule(c) == InPlace::input_in_output ? rank : 0; }
int inplace_output_block(Collective c, int rank) { return inplace_rule(c) == InPlace::output_in_input ? rank : 0; }

bool is_inplace_call(Collective c, uintptr_t send, uintptr_t recv, int rank, size_t block_bytes) {
  // both start at their block of one allocation: the allocation's base agrees
  return send - uintptr_t(inplace_input_block(c, rank)) * block_bytes ==
         recv - uintptr_t(inplace_output_block(c, rank)) * block_bytes;
}

std::string_view inplace_condition(Collective c) {
  switch (inplace_rule(c)) {
    case InPlace::same: return "sendbuff == recvbuff";
    case InPlace::input_in_output: return "sendbuff == recvbuff + rank*count";
    case InPlace::output_in_input: return "recvbuff == sendbuff + rank*count";
    case InPlace::unsupported: return "not supported";
  }
  return "not supported";
}

}  // namespace mk
