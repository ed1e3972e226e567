// User-authored schedules without rebuilding mKernel: a DSL file is compiled
// with the system C++ compiler against the installed <mk/dsl.hpp> into a
// shared object, then loaded; its MK_SCHEDULE lines register it. The cache
// ($MK_CACHE_DIR/plugins) is keyed on the .cpp and on the content of every
// file the compiler read for it (its -MD dependency list, re-hashed on each
// lookup), so editing an included header recompiles.
#pragma once

#include <cstdint>
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

// Whether `path` names a DSL source file (.cpp, .cc, .cxx, any case).
bool is_dsl_source(const std::string& path);

// The newest registration's sequence number, and every schedule registered
// after a given one (what a plugin's loading added).
int64_t current_seq();
std::vector<dsl::ScheduleInfo> registered_after(int64_t seq);

}  // namespace mk::plugin
