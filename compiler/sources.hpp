// Schedules from files, registered by name next to the built-ins, so that a
// researcher's algorithm can serve mkAllReduce without rebuilding mKernel.
// What MK_SCHEDULES, mkConfig_t::schedules and
// mkernel.torch.Communicator(schedules=[...]) name (docs/schedules.md):
//
//   PATH.cpp         a DSL file: compiled into a plugin with the system C++
//                    compiler (compiler/plugin.hpp, cached), its MK_SCHEDULE
//                    lines name its schedules;
//   PATH.so          such a plugin, already built;
//   PATH.xml         an MSCCL algorithm, PATH.json an MSCCL++ execution plan
//                    or an mKernel IR file (`mkc import -o`): one schedule for
//                    the rank count it was written for, named by the file's
//                    algorithm name (else the file's stem) or by NAME= before
//                    the path.
//
// A list separates entries with ':' (empty entries are skipped). A file is
// loaded once per process; later lists naming it get what it loaded. A name
// that is already registered (a built-in, or another file's) is an error:
// user schedules never replace what the selection tables name.
#pragma once

#include <string>
#include <vector>

namespace mk::sources {

struct Source {
  std::string path;    // as given
  std::string kind;    // "dsl-source", "plugin", "msccl-xml", "mscclpp-json", "mk-ir-json"
  std::string digest;  // hash of the file's bytes (a plugin built from a .cpp: of the .cpp)
  std::vector<std::string> schedules;  // the names it registered
};

// Loads every entry of `list`. Throws mk::Error naming the file: mk.cli.E009
// (unreadable or too large), E006/E007 (a DSL file that does not compile or
// defines nothing), the importers' errors, E014 (a name taken or not a valid
// name).
std::vector<Source> load(const std::string& list);

// "name@digest,..." over every schedule of `sources`, sorted: what ranks
// compare at init ("" for none).
std::string describe(const std::vector<Source>& sources);

// Whether `name` is usable as a schedule name: 1-96 characters of
// [A-Za-z0-9_.-], starting with a letter.
bool valid_name(const std::string& name);

// Whether `name` was registered by a file this process loaded (also by a load
// that failed after its plugin had registered some schedules): the runtime
// proves these at init and makes ranks agree on them, and the cost model
// leaves them out.
bool is_user_schedule(const std::string& name);

}  // namespace mk::sources
