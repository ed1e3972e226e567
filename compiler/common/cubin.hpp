// What a cubin must be before anything loads it: a complete CUDA ELF file
// for one GPU architecture. Cubins come from plan directories and the cache,
// which are files on disk: the driver must never see a truncated or foreign
// one.
#pragma once

#include <cstddef>
#include <string>

namespace mk {

// The problem with `data` as a cubin for sm_`arch`, or "" when it is fine.
// Checked: 64-bit little-endian ELF, e_machine EM_CUDA (190), an executable;
// section and program header tables of the standard entry sizes inside the
// file; every section's and segment's bytes inside the file; the file exactly
// as long as the headers say; and the SM version in e_flags equal to `arch`
// (bits 8..15 from ELF ABI version 8 on, which NVRTC 13 writes; bits 0..7
// before).
std::string cubin_problem(const char* data, size_t size, int arch);

// The SM version a cubin's ELF header names (0 when it is not a CUDA ELF
// header): what cubin_problem compares with `arch`.
int cubin_arch(const char* data, size_t size);

}  // namespace mk
