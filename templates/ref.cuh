// Operand encoding shared by the generated code, the kernels (kernel.cuh
// decodes) and the code generator (which computes wide reduces' source
// tables on the host). Plain constexpr functions: no ABI struct changes.
#pragma once
#include "common.cuh"

namespace mk {
namespace dev {

// An op's operand, encoded in 64 bits so that a call site is a handful of
// constants (this keeps generated kernels small and fast to compile):
//   bits 0-1 buffer (0 input, 1 output, 2 scratch), bit 2 block rotates with
//   the rank, bit 3 chunk position rotates, bits 4-15 rank relative to this
//   one, bits 16-31 block, bits 32-63 position (data) or slot (scratch).
enum RefKind { kRefIn = 0, kRefOut = 1, kRefScratch = 2 };
MK_HD constexpr uint64_t data_ref(int kind, int block, bool rot_block, int pos, bool rot_pos) {
  return uint64_t(kind) | (rot_block ? 4u : 0u) | (rot_pos ? 8u : 0u) | (uint64_t(uint32_t(block) & 0xffffu) << 16) |
         (uint64_t(uint32_t(pos)) << 32);
}
// Zero-copy plans: any rank's user buffer (bits 4-15: that rank, relative).
MK_HD constexpr uint64_t peer_data_ref(int kind, int rank_d, int block, bool rot_block, int pos, bool rot_pos) {
  return data_ref(kind, block, rot_block, pos, rot_pos) | (uint64_t(uint32_t(rank_d) & 0xfffu) << 4);
}
MK_HD constexpr uint64_t scratch_ref(int rank_d, int slot) {
  return uint64_t(kRefScratch) | (uint64_t(uint32_t(rank_d) & 0xfffu) << 4) | (uint64_t(uint32_t(slot)) << 32);
}
// A chunk position for the tile length: value, and whether it rotates.
MK_HD constexpr int32_t pos_code(int pos, bool rot) { return pos | (rot ? int32_t(0x40000000) : 0); }

// An operand given as its two 32-bit halves (a wide reduce's source list:
// the halves are constants or rank-table entries in the generated code).
MK_HD constexpr uint64_t ref_halves(int32_t lo, int32_t hi) {
  return uint64_t(uint32_t(lo)) | (uint64_t(uint32_t(hi)) << 32);
}

}  // namespace dev
}  // namespace mk
