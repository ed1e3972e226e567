#include "compiler/common/cubin.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace mk {

namespace {

constexpr uint16_t kEmCuda = 190;
constexpr uint16_t kEtExec = 2;
constexpr uint32_t kShtNobits = 8;
constexpr size_t kEhdr = 64, kShdr = 64, kPhdr = 56;

// Little-endian reads at offsets the caller has bounded.
template <typename T>
T le(const char* p) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= T(uint8_t(p[i])) << (8 * i);
  return v;
}

// Whether [off, off + count * entry) lies inside a file of `size` bytes,
// without overflowing.
bool table_inside(uint64_t off, uint64_t count, uint64_t entry, uint64_t size) {
  return off <= size && count <= (size - off) / entry;
}

}  // namespace

int cubin_arch(const char* d, size_t size) {
  if (size < kEhdr || std::memcmp(d, "\x7f" "ELF", 4) != 0 || le<uint16_t>(d + 18) != kEmCuda) return 0;
  const uint32_t flags = le<uint32_t>(d + 48);
  return int(uint8_t(d[8]) >= 8 ? (flags >> 8) & 0xff : flags & 0xff);
}

std::string cubin_problem(const char* d, size_t size, int arch) {
  if (size < kEhdr) return fmt::format("{} bytes: shorter than an ELF header", size);
  if (std::memcmp(d, "\x7f" "ELF", 4) != 0) return "not an ELF file";
  if (d[4] != 2) return "not a 64-bit ELF file";
  if (d[5] != 1) return "not a little-endian ELF file";
  if (d[6] != 1) return "unknown ELF version";
  if (le<uint16_t>(d + 18) != kEmCuda)
    return fmt::format("ELF machine {} is not CUDA ({})", le<uint16_t>(d + 18), kEmCuda);
  if (le<uint16_t>(d + 16) != kEtExec) return "not an executable ELF file";
  const uint64_t phoff = le<uint64_t>(d + 32), shoff = le<uint64_t>(d + 40);
  const uint16_t ehsize = le<uint16_t>(d + 52), phentsize = le<uint16_t>(d + 54), phnum = le<uint16_t>(d + 56);
  const uint16_t shentsize = le<uint16_t>(d + 58), shnum = le<uint16_t>(d + 60), shstrndx = le<uint16_t>(d + 62);
  if (ehsize != kEhdr) return fmt::format("ELF header size {} (expected {})", ehsize, kEhdr);
  if (shnum == 0) return "no section headers";
  if (shentsize != kShdr) return fmt::format("section header size {} (expected {})", shentsize, kShdr);
  if (shstrndx >= shnum) return "section name table index outside the section table";
  if (!table_inside(shoff, shnum, kShdr, size) || shoff < kEhdr) return "section header table outside the file";
  uint64_t end = std::max<uint64_t>(kEhdr, shoff + uint64_t(shnum) * kShdr);
  if (phnum != 0) {
    if (phentsize != kPhdr) return fmt::format("program header size {} (expected {})", phentsize, kPhdr);
    if (!table_inside(phoff, phnum, kPhdr, size) || phoff < kEhdr) return "program header table outside the file";
    end = std::max(end, phoff + uint64_t(phnum) * kPhdr);
    for (uint16_t i = 0; i < phnum; ++i) {
      const char* ph = d + phoff + uint64_t(i) * kPhdr;
      const uint64_t off = le<uint64_t>(ph + 8), filesz = le<uint64_t>(ph + 32);
      if (!table_inside(off, filesz, 1, size)) return fmt::format("segment {} lies outside the file", i);
      end = std::max(end, off + filesz);
    }
  }
  for (uint16_t i = 0; i < shnum; ++i) {
    const char* sh = d + shoff + uint64_t(i) * kShdr;
    if (le<uint32_t>(sh + 4) == kShtNobits) continue;  // occupies no file bytes
    const uint64_t off = le<uint64_t>(sh + 24), sz = le<uint64_t>(sh + 32);
    if (!table_inside(off, sz, 1, size)) return fmt::format("section {} lies outside the file", i);
    end = std::max(end, off + sz);
  }
  if (end != size) return fmt::format("{} bytes, but its headers describe {}", size, end);
  const int sm = cubin_arch(d, size);
  if (sm != arch) return fmt::format("compiled for sm_{}, not sm_{}", sm, arch);
  return "";
}

}  // namespace mk
