// Importers: existing collective algorithms into the mKernel IR, and back.
//
//   MSCCL XML (msccl-tools / MSCCLang, TACCL, TE-CCL, ForestColl writers):
//     <algo><gpu><tb><step .../></tb></gpu></algo>, step types s r rcs rrs rrc
//     rrcs cpy re nop, buffers i o s.
//   MSCCL++ execution-plan JSON (mscclpp.language, the executor's format):
//     gpus[] with threadblocks[] of ops (put get copy signal wait re rre ...,
//     packet ops, barrier, semaphores, pipeline).
//   mKernel IR JSON (ir::to_json, what `mkc import -o` writes).
//
// What an import guarantees: the returned raw schedule (copy/reduce ops only,
// tb = -1, Op::loc pointing at the file's line and, for JSON, path) means what
// the file's algorithm computes, read with the thread-block program order and
// the file's ordering (dependencies, send/recv pairs, signal/wait, ...). The
// importer proves on the way that the algorithm is deadlock-free and
// race-free in the file's own model (errors mk.import.E007/E009); it does NOT
// prove that the algorithm computes its collective: that is
// verify::verify_semantics, which compiler::lower runs on every schedule
// (`mkc import` runs it too). A file that declares both in-place and
// out-of-place use is imported under both readings and the one not returned
// is verified here. docs/import.md has the full mapping and the limits.
//
// Errors are mk::Error with ids mk.import.E001..E013 and a SrcLoc at the
// offending line; nothing is skipped silently.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "compiler/ir/ir.hpp"

namespace mk::importers {

struct ImportOptions {
  // Files that declare both in-place and out-of-place use: also import and
  // verify the reading that is not returned.
  bool check_both_readings = true;
};

// What was imported, for summaries (`mkc import`).
struct ImportInfo {
  std::string format;    // "msccl-xml", "mscclpp-json", "mk-ir-json"
  std::string name;      // the algorithm's name in the file
  std::string protocol;  // as the file says ("Simple", "LL", "LL128"); mKernel picks its own
  bool inplace = false, outofplace = false;  // what the file declares
  std::string reading;   // the reading the returned IR was built from: "in-place" / "out-of-place"
  int64_t min_bytes = 0, max_bytes = -1;  // the file's size range, -1: unbounded
  int32_t threadblocks = 0;  // over all gpus
  int32_t steps = 0;         // steps/ops in the file (nops included)
  int32_t transfers = 0;     // matched send/recv pairs (MSCCL) or remote data ops (MSCCL++)
  int32_t sync_edges = 0;    // dependencies, signal/wait pairs, barrier and semaphore edges
  int32_t staging_ops = 0;   // IR ops the importer added (see algo.hpp)
  int32_t refine = 1;        // chunk refinement factor (MSCCL++ thread-block groups)
  std::vector<std::string> notes;  // what was ignored or assumed, one line each
};

ir::Schedule import_msccl_xml(std::string_view text, const std::string& file_name, ImportInfo* info = nullptr,
                              const ImportOptions& opt = {});
ir::Schedule import_mscclpp_json(std::string_view text, const std::string& file_name, ImportInfo* info = nullptr,
                                 const ImportOptions& opt = {});

// Which format a file is: by extension (.xml, .json), then by content.
enum class Format { msccl_xml, mscclpp_json, mk_ir_json };
Format detect_format(std::string_view text, const std::string& file_name);

// Reads `path` (mk.cli.E009 if it cannot) and imports it in whatever format
// it is, an IR JSON included.
ir::Schedule import_file(const std::string& path, ImportInfo* info = nullptr, const ImportOptions& opt = {});
ir::Schedule import_text(std::string_view text, const std::string& file_name, ImportInfo* info = nullptr,
                         const ImportOptions& opt = {});

// A raw mKernel schedule (copy/reduce ops, as a DSL builder makes them) as an
// MSCCL XML algorithm: every op becomes local steps (cpy, re) and send/recv
// pairs, one thread block per (peer, direction) plus one for local work,
// dependencies for every conflicting pair of steps on a GPU (input/output
// aliasing included, so the algorithm is declared for in-place and
// out-of-place use). import_msccl_xml(export_msccl_xml(s)) computes what s
// computes. Throws if `raw` is not a raw schedule (signal/wait ops).
std::string export_msccl_xml(const ir::Schedule& raw);

}  // namespace mk::importers
