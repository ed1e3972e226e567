// Enumerations shared by the compiler, the runtime and the tools: collectives,
// element types and reduction operators, with their names and parsers.
// The numeric values of DType and RedOp match NCCL's ncclDataType_t/ncclRedOp_t.
// Everything about a collective comes from include/mk/collectives.def.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mk {

// Numeric values follow the rows of collectives.def (allreduce = 0, allgather,
// reducescatter, broadcast, reduce, alltoall = 5); the kernel's call signature carries them.
enum class Collective : uint8_t {
#define MK_COLL(id, name, api, reduces, rooted, in_blocks, out_blocks, inplace) id,
#include "mk/collectives.def"
#undef MK_COLL
};
inline constexpr int kNumCollectives = 0
#define MK_COLL(id, name, api, reduces, rooted, in_blocks, out_blocks, inplace) +1
#include "mk/collectives.def"
#undef MK_COLL
    ;

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

// sum..avg are NCCL's built-in ops (the values a call names). premulsum is
// NCCL's ncclRedOpCreatePreMulSum: a sum whose inputs are each multiplied by
// their own rank's scalar first (the prologue, templates/prims.cuh); a call
// names it through an op handle (mkRedOpCreatePreMulSum), and the kernel gets
// the scalar in dev::Args.
enum class RedOp : uint8_t { sum = 0, prod = 1, max = 2, min = 3, avg = 4, premulsum = 5 };
inline constexpr int kNumRedOps = 6;

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
std::vector<RedOp> all_redops();  // the five built-in ops (not premulsum)
std::vector<Collective> all_collectives();

// ---- Collective semantics (the columns of collectives.def) --------------------

// The C API entry point, e.g. "mkAllReduce" (null-terminated).
std::string_view api_name(Collective c);

// Whether the collective reduces (takes an op) at all.
bool collective_reduces(Collective c);

// Which buffer only the root has: broadcast's input, reduce's output.
enum class RootBuffer : uint8_t { none, input, output };
RootBuffer root_buffer(Collective c);
// Whether the collective has a root (root_buffer(c) != none); for the others
// root is 0.
bool collective_rooted(Collective c);
// Whether `rank` has a meaningful input (send) / output (receive) buffer in a
// call rooted at `root`.
bool has_input(Collective c, int rank, int root);
bool has_output(Collective c, int rank, int root);

// How many count-sized blocks a buffer holds per rank: one or nranks.
enum class Blocks : uint8_t { one, nranks };
int input_blocks(Collective c, int nranks);
int output_blocks(Collective c, int nranks);

// What the collective computes: output block `out_block` of `rank` is input
// block `in_block` of rank `from`, or, when `from` is kAllRanks, the reduction
// of input block `in_block` of every rank, in rank order.
struct BlockSource {
  static constexpr int kAllRanks = -1;
  int from;
  int in_block;
};
BlockSource output_source(Collective c, int root, int rank, int out_block);

// The in-place form of a call. In-place, input and output share one allocation
// of max(input, output) blocks, each starting at a block of it:
//   same             input and output both start at block 0
//   input_in_output  the input is output block `rank` (all-gather)
//   output_in_input  the output is input block `rank` (reduce-scatter)
//   unsupported      no in-place form (all-to-all); a call with sendbuff ==
//                    recvbuff must be rejected
// Only ranks that have both buffers (has_input and has_output) have an
// in-place form.
enum class InPlace : uint8_t { same, input_in_output, output_in_input, unsupported };
InPlace inplace_rule(Collective c);
// The block of the shared allocation at which `rank`'s input / output starts
// in an in-place call (0 for same and unsupported).
int inplace_input_block(Collective c, int rank);
int inplace_output_block(Collective c, int rank);
// Whether (send, recv) of `rank`, with `block_bytes` bytes per block (count x
// element size), is the in-place case of the collective. For an unsupported
// rule it says whether the call attempts one (send == recv), which the caller
// must reject.
bool is_inplace_call(Collective c, uintptr_t send, uintptr_t recv, int rank, size_t block_bytes);
// The in-place condition in the C API's words, for messages:
// "sendbuff == recvbuff + rank*count", or "not supported".
std::string_view inplace_condition(Collective c);

}  // namespace mk
