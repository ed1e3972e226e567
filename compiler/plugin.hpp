// User-authored schedules without rebuilding mKernel: a DSL file is compiled
// with the system C++ compiler against the installed <mk/dsl.hpp> into a
// shared object, then loaded; its MK_SCHEDULE lines register it. The cache
// ($MK_CACHE_DIR/plugins) is keyed on the .cpp and on the content of every
// file the compiler read for it (its -MD dependency list, re-hashed on each
// lookup), so editing an included header recompiles.
#pragma once

#include <string>
#include <vector>

#include "mk/dsl.hpp"

namespace mk::plugin {

// FILE.cpp -> the schedules it defines. Throws mk.cli.E009 (no file), E006
// (does not compile: the compiler's messages, with the file's lines), E007
// (defines no schedule).
std::vector<dsl::ScheduleInfo> load_source(const std::string& cpp_file);
// An already built plugin (.so), e.g. from mkernel_add_schedules().
std::vector<dsl::ScheduleInfo> load_library(const std::string& so_file);

// The directory holding mk/dsl.hpp that plugins compile against.
std::string include_dir();

}  // namespace mk::plugin
