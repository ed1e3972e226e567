// A plan: what `mkc compile` writes and the runtime loads. A directory with
//   plan.json      the description below (docs/plan.md)
//   <kernel>.cubin one per size bucket
//   <kernel>.cu    its generated source (for reading and debugging)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "compiler/topology/topology.hpp"
#include "mk/types.hpp"

namespace mk::plan {

struct Kernel {
  std::string name;
  int32_t bucket = 0;
  int64_t min_bytes = 0;
  int64_t max_bytes = -1;  // -1: no upper bound
  std::string proto;       // "simple" | "ll" (and `lamport`: LL with Lamport packets)
  int64_t max_tile_bytes = 0;  // the launch picks its tile up to this (pick_tile_bytes)
  int32_t instances = 1;
  int32_t tbs = 1;
  int32_t threads = 512;
  int32_t grid = 1;
  int32_t depth = 1;
  int32_t scratch_slots = 1;
  int32_t flag_slots = 1;
  int32_t classes = 1;
  int64_t scratch_bytes = 0;  // per rank
  int64_t flag_bytes = 0;     // per rank
  int32_t seq_words = 0;      // per rank (instances * tbs)
  // The kernel waits for the previous grid of its stream (griddepcontrol.wait,
  // sm_90+) before it touches memory, so it may be launched with programmatic
  // dependent launch (its launch overlaps the previous kernel's tail).
  bool pdl = false;
  // One pass (passes/one_pass.cpp): no flags between the kernel's ops, and
  // launches of one step each. Its scratch and step counters are never
  // shared with a kernel that waits for flags (the resource key includes it).
  bool one_pass = false;
  // Lamport packets (passes/one_pass.cpp mark_lamport): a one-pass kernel whose
  // scratch holds plain data and the all-ones sentinel at rest (the arena's
  // scratch starts so); slots of one tile, not LL's two. Its scratch is never
  // shared with an LL kernel's (the resource key includes this field).
  bool lamport = false;
  // Network connections (plans across nodes, templates/net.cuh): block `tb`
  // of `rank` puts into or signals rank `peer` on another node; `puts`: it
  // puts data (its FIFO needs staging), else it only signals. Every rank's,
  // sorted; each instance of the block has a connection of its own.
  struct NetConn {
    int32_t rank = 0, tb = 0, peer = 0;
    bool puts = false;
    bool operator==(const NetConn&) const = default;
  };
  std::vector<NetConn> net;
  std::string cubin_file;     // relative to the plan directory
  std::string source_file;

  std::vector<char> cubin;  // contents of cubin_file
  std::string source;       // contents of source_file
};

struct Plan {
  static constexpr int kVersion = 1;
  std::string schedule;
  Collective coll = Collective::allreduce;
  int32_t nranks = 1;
  int32_t chunks = 1;
  std::optional<topology::Topology> topology;  // what it was lowered for; unset: one NVLink node
  bool zero_copy = false;  // lowered for registered buffers (mkc compile --zero-copy)
  DType dtype = DType::fp32;
  RedOp op = RedOp::sum;
  // The fused epilogue in every kernel's tail (include/mk/fusion.hpp):
  // "name@hash" of the code it was compiled from (compiler::fusion_identity);
  // empty: none.
  std::string fusion;
  // Its epilogue accessors are checked (MK_FUSION_CHECK=1, `mkc compile
  // --fusion-check`): a debugging build that traps on a bad access. The
  // runtime takes a plan only where this matches its own setting.
  bool fusion_check = false;
  int32_t arch = 90;
  int32_t nvrtc_version = 0;
  std::string mkernel_version;
  // The ranks the kernels run on (mkc compile --rank R: R's rank class),
  // ascending; empty: every rank. On another rank a kernel does nothing.
  std::vector<int32_t> serves;
  std::vector<Kernel> kernels;
};

// Whether the plan's kernels run on `rank`.
bool serves(const Plan& p, int32_t rank);
// Throws mk.plan.E006, naming `where`, the ranks the plan serves and how to
// compile one for `rank`, unless serves(p, rank).
void check_serves(const Plan& p, int32_t rank, const std::string& where);
// "0-3,5" (every rank when p.serves is empty: "0-(nranks-1)").
std::string served_ranks(const Plan& p);

std::string to_json(const Plan& p);
// Parses and validates plan.json text (hostile input: any bytes); `where`
// names the file in errors. Throws only mk::Error: mk.plan.E001 naming the
// file and the JSON path of a field that is missing, of the wrong type or out
// of range (limits in docs/plan.md), E002 for another version.
Plan from_json(const std::string& text, const std::string& where);

// Writes plan.json, the cubins and sources into `dir` (created), each file
// through a temporary name and a rename, with modes that do not depend on the
// umask: 0700 / 0600 when `private_files` (the cache), else 0755 / 0644 (an
// output directory, shipped plans). Throws mk.cli.E012.
void write_dir(const Plan& p, const std::string& dir, bool private_files = false);
// Reads plan.json and its cubins, each checked as a complete CUDA ELF for
// the plan's arch (compiler/common/cubin.hpp) before anyone loads it. The
// directory and every file read must pass compiler/common/trusted_fs.hpp's
// policy (no symbolic link; owned by this user or root; not writable by
// others). Throws mk.plan.E001..E003, E005 (a bad cubin), E007 (not trusted).
Plan read_dir(const std::string& dir);

// Throws mk.plan.E008 naming `where` unless `p` was compiled by this mKernel
// version (plan.json's mkernel_version): a plan of another version may rely
// on device templates or an ABI this library does not have.
void check_version(const Plan& p, const std::string& where);
// This library's version, as compile() records it in mkernel_version.
const char* library_version();

// Throws mk.plan.E005 naming `file` unless `cubin` is a complete CUDA ELF
// file for sm_`arch`.
void check_cubin(const std::vector<char>& cubin, int arch, const std::string& file);

// A hash of a kernel's resource layout (32 hex digits): every field of the
// plan and the kernel as to_json writes them, except dtype, op, the names
// (kernel, cubin and source files) and the cubin bytes. Kernels with equal
// keys can share scratch, flags and step counters (runtime Comm::resources_for).
std::string resource_key(const Plan& p, const Kernel& k);

// The kernel whose size range holds `bytes`, or nullptr.
const Kernel* select(const Plan& p, int64_t bytes);

// One human-readable paragraph (mkc compile prints it).
std::string summary(const Plan& p);

}  // namespace mk::plan
