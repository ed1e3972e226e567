// Which schedule serves a call: MK_ALGO overrides per collective
// ("allreduce=allreduce.ring,allgather=allgather.ring", runtime/comm/env.hpp);
// else the selection tables (runtime/plans/select.hpp: MK_SELECT_FILE's entries,
// then the built-in ones, keyed by rank count and machine); above 8 ranks or
// across nodes, where no entry matches, the cost model (compiler/cost
// estimate_us) picks among the built-in schedules of the collective that
// lower for the machine's topology.
#include "runtime/plans/select.hpp"

#include <fmt/format.h>

#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>
#include <vector>

#include "compiler/cost/cost.hpp"
#include "compiler/jit/jit.hpp"
#include "compiler/pipeline.hpp"
#include "compiler/sources.hpp"
#include "mk/dsl.hpp"
#include "runtime/comm/comm.hpp"
#include "runtime/comm/env.hpp"
#include "runtime/plans/plans.hpp"
#include "runtime/api/status.hpp"

namespace mk::rt {

namespace {

// MK_ALGO, parsed and checked once (runtime/comm/env.hpp). A malformed value
// throws from every call: the static is only set once parsing succeeded.
const std::map<Collective, std::string>& overrides() {
  static const std::map<Collective, std::string> m = env::algo();
  return m;
}

// The built-in schedules of `coll`, lowered for `topo`, once per process
// (those that do not lower for it are left out).
const std::vector<std::pair<std::string, compiler::Lowered>>& candidates(Collective coll,
                                                                         const topology::Topology& topo) {
  static std::mutex mu;
  static std::map<std::pair<int, std::string>, std::vector<std::pair<std::string, compiler::Lowered>>> cache;
  std::lock_guard<std::mutex> lock(mu);
  const int nranks = topo.nranks();
  const bool plain = plain_topology(topo);
  auto [it, fresh] = cache.try_emplace({int(coll), topology::to_json(topo).dump()});
  if (!fresh) return it->second;
  compiler::LowerOptions o;
  env::apply_tune(&o.proto);
  for (const auto& info : dsl::registered_schedules()) {
    if (info.coll != coll || info.copy_engine) continue;  // the cost model knows kernels only
    // Built-ins only: which user schedules a process has loaded may differ
    // between ranks' processes; users select theirs (MK_ALGO, MK_SELECT_FILE).
    if (sources::is_user_schedule(info.name)) continue;
    try {
      it->second.emplace_back(info.name,
                              compiler::lower(plain ? dsl::build(info, nranks, 0) : dsl::build(info, topo, 0), o));
    } catch (const Error&) {
      // e.g. a schedule for other rank counts
    }
  }
  return it->second;
}

// Sizes are judged per power-of-two range [2^k, 2^(k+1)) (below 1 KiB: one
// range), at its upper end; the same on every rank.
Choice estimated(Collective coll, const topology::Topology& topo, int64_t bytes) {
  int64_t lo = 0, hi = 1023;
  if (bytes >= 1024) {
    lo = 1024;
    while (lo <= bytes / 2) lo *= 2;
    hi = lo * 2 - 1;
  }
  const auto& all = candidates(coll, topo);
  if (all.empty()) fail(mkInternalError, fmt::format("no built-in {} schedule lowers for {}", name(coll), topo.name()));
  const std::string* best = nullptr;
  double best_us = 0;
  for (const auto& [schedule, lowered] : all) {
    const double us = cost::estimate_us(compiler::variant_for(lowered, hi), topo, hi);
    if (!best || us < best_us) best = &schedule, best_us = us;
  }
  return {*best, lo, hi, ""};
}

}  // namespace

Choice choose_schedule(Collective coll, const topology::Topology& topo, int64_t bytes, bool zero_copy) {
  const int nranks = topo.nranks();
  const auto& o = overrides();
  if (auto it = o.find(coll); it != o.end()) {
    return {it->second, 0, -1, ""};
  }
  if (zero_copy) {
    const SelectTable& t = registered_table(coll, topo);
    if (const SelectEntry* e = lookup(t, coll, topo, bytes, true)) return {e->schedule, e->min_bytes, e->max_bytes, e->tune};
    // Zero-copy forced outside the registered entries' sizes
    // (MK_ZERO_COPY_MIN_BYTES): the nearest entry's schedule, over the gap.
    const SelectEntry* near = nullptr;
    int64_t lo = 0, hi = -1;
    for (const SelectEntry& x : t.entries) {
      if (x.coll != coll || !x.registered || !x.fits(topo)) continue;
      if (x.min_bytes > bytes) {
        if (hi < 0 || x.min_bytes - 1 < hi) hi = x.min_bytes - 1, near = &x;
      } else if (x.max_bytes >= 0 && x.max_bytes < bytes) {
        lo = std::max(lo, x.max_bytes + 1);
        if (!near) near = &x;
      }
    }
    if (near) return {near->schedule, lo, hi, near->tune};
  }
  for (const SelectTable* t : {&file_select(), &builtin_select()})
    if (const SelectEntry* e = lookup(*t, coll, topo, bytes, false))
      return {e->schedule, e->min_bytes, e->max_bytes, e->tune};
  if (nranks > 8 || topo.nodes > 1) return estimated(coll, topo, bytes);
  fail(mkInternalError, fmt::format("no schedule for {} at {} ranks ({}) and {} bytes in the selection tables",
                                    name(coll), nranks, topo.name(), bytes));
}

// ---- selection tables ----------------------------------------------------------

namespace {

using nlohmann::json;

constexpr size_t kMaxSelectBytes = 16u << 20;
constexpr size_t kMaxEntries = 100000;

[[noreturn]] void bad_select(const std::string& where, const std::string& path, const std::string& what) {
  fail(mkInvalidArgument, fmt::format("{}: {}: {}", where, path, what));
}

int64_t num(const json& j, const char* key, const std::string& where, const std::string& path, int64_t lo, int64_t hi,
            int64_t dflt) {
  if (!j.contains(key)) return dflt;
  const json& v = j[key];
  if (!v.is_number_integer()) bad_select(where, path + "." + key, "expected an integer");
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) bad_select(where, path + "." + key, fmt::format("{} is outside {}..{}", x, lo, hi));
  return x;
}

// Built on 2 x H200 (bench/results/2026-11-30-*) and one H200 with ranks
// sharing it (bench/results/2026-12-02-*): one-shot (one pass) up to 256 KiB,
// a bandwidth schedule above; registered buffers in place from where their
// larger buffer reaches 4 MiB (sizes here are per rank, count x element
// size: all-gather's, reduce-scatter's and all-to-all's larger buffer holds
// one such block per rank, hence their entries per rank count). `mkc tune` on
// the target machine writes a table of this format (MK_SELECT_FILE).
// The table itself: runtime/plans/select_builtin.json, embedded at build time
// (cmake/embed_file.cmake) and installed as share/mkernel/select.json, a
// starting point for a table of your own.
constexpr const char* kBuiltin =
#include "select_builtin.inc"
    ;

std::string read_select_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(mkInvalidArgument, "MK_SELECT_FILE='" + path + "' cannot be read");
  std::string text;
  char buf[65536];
  while (f.read(buf, sizeof buf) || f.gcount() > 0) {
    text.append(buf, size_t(f.gcount()));
    if (text.size() > kMaxSelectBytes)
      fail(mkInvalidArgument, fmt::format("MK_SELECT_FILE='{}' is larger than {} bytes", path, kMaxSelectBytes));
  }
  return text;
}

}  // namespace

SelectTable parse_select(const std::string& text, const std::string& where) {
  if (text.size() > kMaxSelectBytes) bad_select(where, "$", "larger than 16 MiB");
  json j;
  try {
    int depth_seen = 0;
    j = json::parse(text, [&](int depth, json::parse_event_t, json&) {
      depth_seen = std::max(depth_seen, depth);
      if (depth > 8) throw std::runtime_error("nested more than 8 levels deep");
      return true;
    });
  } catch (const std::exception& e) {
    bad_select(where, "$", std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) bad_select(where, "$", "expected an object");
  for (const auto& [k, v] : j.items())
    if (k != "mkernel_select" && k != "note" && k != "entries" && k != "measured_on" && k != "command")
      bad_select(where, "$." + k, "unknown key (known: mkernel_select, note, entries, measured_on, command)");
  if (!j.contains("mkernel_select") || j["mkernel_select"] != 1)
    bad_select(where, "$.mkernel_select", "expected 1 (the format's version)");
  SelectTable t;
  if (j.contains("note")) {
    if (!j["note"].is_string()) bad_select(where, "$.note", "expected a string");
    t.note = j["note"].get<std::string>();
  }
  if (!j.contains("entries") || !j["entries"].is_array()) bad_select(where, "$.entries", "expected an array");
  if (j["entries"].size() > kMaxEntries) bad_select(where, "$.entries", "more than 100000 entries");
  size_t i = 0;
  for (const json& x : j["entries"]) {
    const std::string path = fmt::format("$.entries[{}]", i++);
    if (!x.is_object()) bad_select(where, path, "expected an object");
    for (const auto& [k, v] : x.items())
      if (k != "collective" && k != "min_ranks" && k != "max_ranks" && k != "min_bytes" && k != "max_bytes" &&
          k != "schedule" && k != "tune" && k != "registered" && k != "measured_us" && k != "min_nodes" &&
          k != "max_nodes" && k != "gpus_per_node" && k != "intra")
        bad_select(where, path + "." + k, "unknown key");
    SelectEntry e;
    if (!x.contains("collective") || !x["collective"].is_string())
      bad_select(where, path + ".collective", "expected a collective's name");
    const auto coll = parse_collective(x["collective"].get<std::string>());
    if (!coll) bad_select(where, path + ".collective", "'" + x["collective"].get<std::string>() + "' is not a collective");
    e.coll = *coll;
    e.min_ranks = int32_t(num(x, "min_ranks", where, path, 1, 65536, 1));
    e.max_ranks = int32_t(num(x, "max_ranks", where, path, e.min_ranks, 65536, e.min_ranks));
    e.min_nodes = int32_t(num(x, "min_nodes", where, path, 1, 65536, 1));
    e.max_nodes = int32_t(num(x, "max_nodes", where, path, e.min_nodes, 65536, e.min_nodes));
    e.gpus_per_node = int32_t(num(x, "gpus_per_node", where, path, 1, 65536, 0));
    if (x.contains("intra")) {
      if (!x["intra"].is_string() || (x["intra"] != "nvlink" && x["intra"] != "pcie"))
        bad_select(where, path + ".intra", "expected \"nvlink\" or \"pcie\"");
      e.intra = x["intra"].get<std::string>();
    }
    e.min_bytes = num(x, "min_bytes", where, path, 0, int64_t(1) << 62, 0);
    e.max_bytes = num(x, "max_bytes", where, path, -1, int64_t(1) << 62, -1);
    if (e.max_bytes >= 0 && e.max_bytes < e.min_bytes)
      bad_select(where, path + ".max_bytes", fmt::format("{} is below min_bytes {}", e.max_bytes, e.min_bytes));
    if (!x.contains("schedule") || !x["schedule"].is_string())
      bad_select(where, path + ".schedule", "expected a schedule's name");
    e.schedule = x["schedule"].get<std::string>();
    const std::optional<Collective> implements = schedule_collective(e.schedule);
    if (!implements)
      bad_select(where, path + ".schedule",
                 "no schedule named '" + e.schedule +
                     "' (`mkc list` lists them; MK_SCHEDULES loads yours, and MK_PLAN_DIR's plans name theirs)");
    if (*implements != e.coll)
      bad_select(where, path + ".schedule",
                 fmt::format("'{}' implements {}, not {}", e.schedule, name(*implements), name(e.coll)));
    if (x.contains("tune")) {
      if (!x["tune"].is_string()) bad_select(where, path + ".tune", "expected a string of MK_TUNE's form");
      e.tune = x["tune"].get<std::string>();
      if (!e.tune.empty()) {
        passes::ProtocolOptions scratch;
        try {
          env::apply_tune(e.tune, &scratch);
        } catch (const RtError& err) {
          bad_select(where, path + ".tune", err.what());
        }
      }
    }
    if (x.contains("registered")) {
      if (!x["registered"].is_boolean()) bad_select(where, path + ".registered", "expected true or false");
      e.registered = x["registered"].get<bool>();
    }
    if (x.contains("measured_us") && !x["measured_us"].is_number())
      bad_select(where, path + ".measured_us", "expected a number");
    t.entries.push_back(std::move(e));
  }
  return t;
}

std::string to_json(const SelectTable& t) {
  json j;
  j["mkernel_select"] = 1;
  if (!t.note.empty()) j["note"] = t.note;
  j["entries"] = json::array();
  for (const SelectEntry& e : t.entries) {
    json x = {{"collective", std::string(name(e.coll))},
              {"min_ranks", e.min_ranks},
              {"max_ranks", e.max_ranks},
              {"min_bytes", e.min_bytes},
              {"max_bytes", e.max_bytes},
              {"schedule", e.schedule}};
    if (!e.tune.empty()) x["tune"] = e.tune;
    if (e.registered) x["registered"] = true;
    if (e.min_nodes != 1 || e.max_nodes != 1) {
      x["min_nodes"] = e.min_nodes;
      x["max_nodes"] = e.max_nodes;
    }
    if (e.gpus_per_node != 0) x["gpus_per_node"] = e.gpus_per_node;
    if (!e.intra.empty()) x["intra"] = e.intra;
    j["entries"].push_back(std::move(x));
  }
  return j.dump(1) + "\n";
}

const SelectTable& builtin_select() {
  static const SelectTable t = parse_select(kBuiltin, "the built-in selection table");
  return t;
}

const SelectTable& file_select() {
  // A throwing initialiser leaves the static unset, so a file that names a
  // schedule not loaded yet (a communicator's own list loads it) parses on a
  // later call; a malformed file throws from every call.
  static const SelectTable table = [] {
    const auto path = env::raw("MK_SELECT_FILE");
    if (!path) return SelectTable{};
    return parse_select(read_select_file(*path), "MK_SELECT_FILE='" + *path + "'");
  }();
  return table;
}

std::string select_file_digest() {
  const auto path = env::raw("MK_SELECT_FILE");
  if (!path) return "none";
  const std::string text = read_select_file(*path);
  parse_select(text, "MK_SELECT_FILE='" + *path + "'");  // malformed: init fails, naming it
  return jit::hash_hex(text);
}

bool SelectEntry::fits(const topology::Topology& t) const {
  return t.nranks() >= min_ranks && t.nranks() <= max_ranks && t.nodes >= min_nodes && t.nodes <= max_nodes &&
         (gpus_per_node == 0 || gpus_per_node == t.gpus_per_node) &&
         (intra.empty() || intra == topology::name(t.intra));
}

const SelectTable& registered_table(Collective coll, const topology::Topology& topo) {
  for (const SelectEntry& e : file_select().entries)
    if (e.coll == coll && e.registered && e.fits(topo)) return file_select();
  return builtin_select();
}

const SelectEntry* lookup(const SelectTable& t, Collective coll, const topology::Topology& topo, int64_t bytes,
                          bool registered) {
  for (const SelectEntry& e : t.entries)
    if (e.coll == coll && e.registered == registered && e.fits(topo) && bytes >= e.min_bytes && (e.max_bytes < 0 || bytes <= e.max_bytes))
      return &e;
  return nullptr;
}

}  // namespace mk::rt
