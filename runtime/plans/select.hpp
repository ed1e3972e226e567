// The selection table: which schedule (and which protocol knobs) serves a
// call, per collective, rank count, size range and whether the buffers are
// registered. One format for the built-in default, for MK_SELECT_FILE and for
// what `mkc tune` writes (docs/select.md):
//
//   {"mkernel_select": 1, "note": "...",
//    "entries": [{"collective": "allreduce", "min_ranks": 2, "max_ranks": 2,
//                 "min_bytes": 0, "max_bytes": 262144, "schedule": "allreduce.one_shot",
//                 "tune": "ll_instances=16", "registered": false}, ...]}
//
// A call takes the first entry (in file order) of its collective whose rank
// range holds the communicator's size, whose machine fields hold its machine
// (runtime/topology/machine.hpp) and whose byte range holds the call's bytes
// (count x element size; max_bytes -1: no bound). Machine fields, all
// optional: "min_nodes" / "max_nodes" (default 1 / 1: an entry without them
// is for one node), "gpus_per_node" (ranks per node; default any), "intra"
// ("nvlink" or "pcie": the link inside a node; default any). Entries with
// "registered" true serve zero-copy calls, and say where zero-copy pays: a
// call whose buffers are all registered goes zero-copy where such an entry
// matches (MK_ZERO_COPY_MIN_BYTES, when set, decides instead); a zero-copy
// call with no such entry takes the others. MK_SELECT_FILE's entries come before the built-in ones; MK_ALGO
// overrides both; above 8 ranks, where neither has an entry, the cost model
// picks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/topology/topology.hpp"
#include "mk/types.hpp"

namespace mk::rt {

struct SelectEntry {
  Collective coll = Collective::allreduce;
  int32_t min_ranks = 1, max_ranks = 1;
  int64_t min_bytes = 0, max_bytes = -1;  // inclusive; -1: no bound
  std::string schedule;
  std::string tune;  // MK_TUNE syntax, applied after MK_TUNE; "" for none
  bool registered = false;
  int32_t min_nodes = 1, max_nodes = 1;
  int32_t gpus_per_node = 0;  // 0: any
  std::string intra;          // "nvlink", "pcie"; "": any
  // Its rank and machine fields hold `t` (its bytes and `registered` aside).
  bool fits(const topology::Topology& t) const;
};

struct SelectTable {
  std::string note;
  std::vector<SelectEntry> entries;
};

// Parses and checks a table (hostile input: any bytes). Throws
// RtError(mkInvalidArgument) naming `where` and the JSON path of what is
// wrong: unknown collectives or schedules (a schedule of another
// collective), bad ranges, malformed knobs.
SelectTable parse_select(const std::string& text, const std::string& where);
std::string to_json(const SelectTable& t);

// The built-in table (the same format, measured on 2 x H200 up to 8 ranks).
const SelectTable& builtin_select();
// MK_SELECT_FILE's table (empty when unset), read once per process; a
// malformed file throws from every call.
const SelectTable& file_select();
// What MK_SELECT_FILE holds, for the settings every rank must agree on:
// "none", or its path's content hash.
std::string select_file_digest();

// The table whose registered entries decide zero-copy for (coll, nranks):
// MK_SELECT_FILE's when it has any for them (its own decide alone), else the
// built-in one.
const SelectTable& registered_table(Collective coll, const topology::Topology& topo);
inline const SelectTable& registered_table(Collective coll, int nranks) {
  return registered_table(coll, topology::single(nranks));
}

// The first matching entry of `t`, or nullptr. `nranks`: one NVLink node.
const SelectEntry* lookup(const SelectTable& t, Collective coll, const topology::Topology& topo, int64_t bytes,
                          bool registered);
inline const SelectEntry* lookup(const SelectTable& t, Collective coll, int nranks, int64_t bytes, bool registered) {
  return lookup(t, coll, topology::single(nranks), bytes, registered);
}

}  // namespace mk::rt
