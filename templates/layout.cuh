// Where each tile of each chunk lives. Shared by the generated kernels and the
// CPU executor, so the simulator checks the very index math the GPU runs.
//
//   buffer  = blocks x count elements (count: the user's per-rank count)
//   block   = `chunks` chunks of chunk_len elements (the last ones may be
//             short or empty); chunk_len is rounded up to 16 bytes so chunk
//             starts keep the block's alignment
//   chunk   = tiles of `tile` elements; step s of instance i handles tile
//             s * instances + i of every chunk
//   scratch = [instance][step % depth][slot] tiles (LL tiles take twice the
//             bytes: each 8 data bytes travel with 8 bytes of flags)
#pragma once
#include "common.cuh"

namespace mk {
namespace dev {

struct Layout {
  int64_t count;      // elements per block
  int64_t chunk_len;  // elements per chunk
  int64_t tile;       // elements per tile
  int64_t tiles;      // tiles per chunk
  int64_t steps;      // steps per launch
  int32_t chunks;     // chunks per block
  int32_t instances;
};

MK_HD Layout make_layout(int64_t count, int32_t chunks, int64_t tile_bytes, int32_t instances,
                         int32_t elem_size) {
  Layout L;
  L.count = count;
  L.chunks = chunks;
  L.instances = instances;
  const int64_t vec = 16 / elem_size;
  L.chunk_len = round_up(ceil_div(count, chunks), vec);
  L.tile = tile_bytes / elem_size;
  L.tiles = count == 0 ? 0 : ceil_div(L.chunk_len, L.tile);
  L.steps = ceil_div(L.tiles, instances);
  return L;
}

// The tile a launch uses: each instance gets one tile of every chunk per step
// until the tile reaches the plan's maximum (which sizes scratch). Chosen the
// same way by the runtime and the CPU executor.
MK_HD int64_t pick_tile_bytes(int64_t count, int32_t chunks, int32_t instances, int32_t elem_size,
                              int64_t max_tile_bytes) {
  const int64_t vec = 16 / elem_size;
  const int64_t chunk_bytes = round_up(ceil_div(count, chunks), vec) * elem_size;
  const int64_t t = round_up(ceil_div(chunk_bytes, instances), 16);
  return max64(16, min64(t, max_tile_bytes));
}

// Elements of the chunk at position `pos` (0..chunks-1) of a block.
MK_HD int64_t chunk_elems(const Layout& L, int32_t pos) {
  return max64(0, min64(L.chunk_len, L.count - int64_t(pos) * L.chunk_len));
}

// Elements of tile `t` of the chunk at position `pos`.
MK_HD int64_t tile_elems(const Layout& L, int32_t pos, int64_t t) {
  return max64(0, min64(L.tile, chunk_elems(L, pos) - t * L.tile));
}

// Element offset of tile `t` of chunk `index` (index counts over all blocks).
MK_HD int64_t data_offset(const Layout& L, int32_t index, int64_t t) {
  const int32_t block = index / L.chunks;
  const int32_t pos = index % L.chunks;
  return int64_t(block) * L.count + int64_t(pos) * L.chunk_len + t * L.tile;
}

// Byte offset of a scratch slot's tile within the plan's scratch region.
MK_HD int64_t scratch_offset(int64_t slot_bytes, int32_t scratch_slots, int32_t depth, int32_t inst,
                             int64_t step, int32_t slot) {
  return ((int64_t(inst) * depth + step % depth) * scratch_slots + slot) * slot_bytes;
}

}  // namespace dev
}  // namespace mk
