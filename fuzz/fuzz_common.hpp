// Shared body of the importer fuzz targets.
//
// Contract under test: an import either returns a schedule or throws
// mk::Error. Anything else escaping (std::exception, mk::InternalError) is a
// finding: it is not caught here, so libFuzzer reports it as a crash, like
// sanitizer reports, timeouts and out-of-memory.
//
// Oracle beyond "no crash": when an imported schedule is proved correct
// (verify_semantics), exporting it to MSCCL XML and importing that must
// succeed and be proved too; a failure aborts. A proved schedule is also
// lowered with verify_each (every pass's guarantees checked): a pass that
// breaks a proved schedule throws mk::InternalError, a finding.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "compiler/importers/importers.hpp"
#include "compiler/pipeline.hpp"
#include "compiler/verify/verify.hpp"

namespace mkfuzz {

using Import = mk::ir::Schedule (*)(std::string_view, const std::string&, mk::importers::ImportInfo*,
                                     const mk::importers::ImportOptions&);

inline int run(Import import, const char* name, const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  mk::ir::Schedule s;
  try {
    mk::importers::ImportInfo info;
    s = import(text, name, &info, mk::importers::ImportOptions{});
  } catch (const mk::Error&) {
    return 0;  // a clear user error: the expected outcome for most inputs
  }
  try {
    mk::verify::verify_semantics(s);
  } catch (const mk::Error&) {
    return 0;  // imported, but not a correct collective: fine
  }
  try {
    mk::compiler::LowerOptions o;
    o.verify_each = true;
    mk::compiler::lower(s, o);
  } catch (const mk::Error&) {
    // a clear refusal (e.g. too large for scratch) is fine; InternalError is not caught
  }
  std::string xml = mk::importers::export_msccl_xml(s);
  try {
    mk::ir::Schedule back = mk::importers::import_msccl_xml(xml, "export.xml");
    mk::verify::verify_semantics(back);
  } catch (const mk::Error& e) {
    std::fprintf(stderr, "round trip of a proved schedule failed: %s\n--- exported XML ---\n%s\n", e.what(),
                 xml.c_str());
    std::abort();
  }
  return 0;
}

}  // namespace mkfuzz
