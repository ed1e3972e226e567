// Plans without NVRTC, for the plan reader's tests: a minimal CUDA ELF that
// passes the cubin checks (compiler/common/cubin.hpp) and a two-bucket plan.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "compiler/plan/plan.hpp"

namespace mkt {

// ELF header, 16 bytes of section data, then a section table: the null
// section and one PROGBITS section over the data. e_flags carry `arch` the
// way NVRTC 13 writes it (ELF ABI version 8: SM in bits 8..15).
inline std::vector<char> fake_cubin(int arch) {
  std::vector<char> f(64 + 16 + 2 * 64, 0);
  auto put = [&](size_t off, uint64_t v, size_t n) {
    for (size_t i = 0; i < n; ++i) f[off + i] = char((v >> (8 * i)) & 0xff);
  };
  std::memcpy(f.data(), "\x7f" "ELF", 4);
  f[4] = 2;     // 64-bit
  f[5] = 1;     // little-endian
  f[6] = 1;     // ELF version
  f[7] = 0x41;  // CUDA OS ABI
  f[8] = 8;     // ABI version
  put(16, 2, 2);                          // ET_EXEC
  put(18, 190, 2);                        // EM_CUDA
  put(20, 1, 4);                          // e_version
  put(40, 80, 8);                         // e_shoff
  put(48, (uint64_t(arch) << 8) | 4, 4);  // e_flags
  put(52, 64, 2);                         // e_ehsize
  put(58, 64, 2);                         // e_shentsize
  put(60, 2, 2);                          // e_shnum
  for (size_t i = 0; i < 16; ++i) f[64 + i] = char(0xa0 + i);
  const size_t sh1 = 80 + 64;
  put(sh1 + 4, 1, 4);    // SHT_PROGBITS
  put(sh1 + 24, 64, 8);  // sh_offset
  put(sh1 + 32, 16, 8);  // sh_size
  return f;
}

// Two buckets (LL up to 64 KiB, simple above) for 2 ranks on sm_90.
inline mk::plan::Plan fake_plan() {
  mk::plan::Plan p;
  p.schedule = "allreduce.ring";
  p.coll = mk::Collective::allreduce;
  p.nranks = 2;
  p.chunks = 2;
  p.dtype = mk::DType::fp16;
  p.op = mk::RedOp::avg;
  p.arch = 90;
  p.mkernel_version = mk::plan::library_version();
  for (int b = 0; b < 2; ++b) {
    mk::plan::Kernel k;
    k.name = "mk_test_b" + std::to_string(b);
    k.bucket = b;
    k.min_bytes = b == 0 ? 0 : 65537;
    k.max_bytes = b == 0 ? 65536 : -1;
    k.proto = b == 0 ? "ll" : "simple";
    k.max_tile_bytes = 4096;
    k.instances = 2;
    k.tbs = 3;
    k.grid = 6;
    k.seq_words = 6;
    k.threads = 256;
    k.depth = 2;
    k.scratch_slots = 4;
    k.flag_slots = 3;
    k.scratch_bytes = 4096 * (b == 0 ? 2 : 1) * 4 * 2 * 2;
    k.flag_bytes = 64;
    k.cubin_file = k.name + ".sm_90.cubin";
    k.source_file = k.name + ".cu";
    k.cubin = fake_cubin(90);
    k.source = "// source " + k.name;
    p.kernels.push_back(k);
  }
  return p;
}

}  // namespace mkt
