// IR <-> JSON. The schema: docs/ir.md. Refs are written in their text form
// ("r1.sc[3]") so a JSON schedule stays readable and diffable.
#include <nlohmann/json.hpp>

#include <unordered_map>

#include "compiler/common/hash.hpp"
#include "compiler/common/json_int.hpp"
#include "compiler/ir/ir.hpp"

namespace mk::ir {
namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw Error(ErrId::ir_E001, "malformed IR JSON at " + path + ": " + what,
              {}, "the schema is in docs/ir.md; `mkc lower --emit=json` writes a valid example");
}

const json& field(const json& j, const char* key, const std::string& path) {
  if (!j.is_object()) bad(path, "expected an object");
  auto it = j.find(key);
  if (it == j.end()) bad(path + "." + key, "missing");
  return *it;
}

template <typename T>
T get_num(const json& j, const char* key, const std::string& path, std::optional<T> dflt = {}) {
  if (!j.contains(key)) {
    if (dflt) return *dflt;
    bad(path + "." + key, "missing");
  }
  const json& v = j.at(key);
  if (!v.is_number_integer()) bad(path + "." + key, "expected an integer");
  if (!json_int_fits<T>(v)) bad(path + "." + key, "integer out of range");
  return v.get<T>();
}

std::string get_str(const json& j, const char* key, const std::string& path,
                    std::optional<std::string> dflt = {}) {
  if (!j.contains(key)) {
    if (dflt) return *dflt;
    bad(path + "." + key, "missing");
  }
  const json& v = j.at(key);
  if (!v.is_string()) bad(path + "." + key, "expected a string");
  return v.get<std::string>();
}

bool get_bool(const json& j, const char* key, const std::string& path, bool dflt) {
  if (!j.contains(key)) return dflt;
  const json& v = j.at(key);
  if (!v.is_boolean()) bad(path + "." + key, "expected true or false");
  return v.get<bool>();
}

std::vector<Ref> get_refs(const json& j, const char* key, const std::string& path) {
  std::vector<Ref> out;
  if (!j.contains(key)) return out;
  const json& v = j.at(key);
  if (!v.is_array()) bad(path + "." + key, "expected an array of refs like \"r0.in[1]\"");
  for (size_t i = 0; i < v.size(); ++i) {
    std::string p = path + "." + key + "[" + std::to_string(i) + "]";
    if (!v[i].is_string()) bad(p, "expected a ref string like \"r0.in[1]\"");
    auto r = parse_ref(v[i].get<std::string>());
    if (!r) bad(p, "cannot parse ref '" + v[i].get<std::string>() + "'");
    out.push_back(*r);
  }
  return out;
}

}  // namespace

namespace {

// Everything of the schedule but its ops.
json header(const Schedule& s) {
  json j;
  j["mk_ir_version"] = Schedule::kVersion;
  j["name"] = s.name;
  j["collective"] = std::string(name(s.coll));
  j["ranks"] = s.nranks;
  j["root"] = s.root;
  j["chunks"] = s.chunks;
  j["instances"] = s.instances;
  j["scratch"] = s.scratch;
  j["tbs"] = s.tbs;
  j["slots"] = s.slots;
  j["depth"] = s.depth;
  j["proto"] = std::string(name(s.proto));
  j["tile_bytes"] = s.tile_bytes;
  j["staged"] = s.staged;
  if (s.zero_copy) j["zero_copy"] = true;
  if (s.one_pass) j["one_pass"] = true;
  if (s.lamport) j["lamport"] = true;
  j["synced"] = s.synced;
  if (s.topology) j["topology"] = topology::to_json(*s.topology);
  return j;
}

}  // namespace

std::string to_json(const Schedule& s, int indent) {
  json j = header(s);
  json ops = json::array();
  for (const auto& op : s.ops) {
    json o;
    o["id"] = op.id;
    o["kind"] = std::string(name(op.kind));
    o["rank"] = op.rank;
    o["tb"] = op.tb;
    if (!op.srcs.empty() || op.is_data()) {
      o["srcs"] = json::array();
      for (const auto& r : op.srcs) o["srcs"].push_back(to_string(r));
    }
    if (!op.dsts.empty() || op.is_data()) {
      o["dsts"] = json::array();
      for (const auto& r : op.dsts) o["dsts"].push_back(to_string(r));
    }
    if (op.kind == OpKind::signal) o["peer"] = op.peer;
    if (op.kind == OpKind::signal || op.kind == OpKind::wait) o["slot"] = op.slot;
    if (op.kind == OpKind::wait) o["iter"] = op.iter;
    if (op.final) o["final"] = true;
    if (!op.pos.empty()) o["pos"] = op.pos;
    if (op.loc.valid()) o["loc"] = {{"file", op.loc->file}, {"line", op.loc->line}};
    ops.push_back(std::move(o));
  }
  j["ops"] = std::move(ops);
  return j.dump(indent);
}

std::string fingerprint(const Schedule& s) {
  Hasher h;
  h.add(header(s).dump());
  // Each op as the fields to_json writes, fixed-width, with list lengths so
  // that no two op lists stream alike; a source position by its file and line
  // (what to_json keeps of it), hashed once per distinct position.
  std::unordered_map<const SrcLoc*, std::string> locs;
  std::vector<int32_t> w;
  for (const auto& op : s.ops) {
    w.clear();
    w.insert(w.end(), {op.id, int32_t(op.kind), op.rank, op.tb, int32_t(op.srcs.size()), int32_t(op.dsts.size())});
    for (const auto* list : {&op.srcs, &op.dsts})
      for (const auto& r : *list) w.insert(w.end(), {r.rank, int32_t(r.buf), r.index, r.count});
    const bool sig = op.kind == OpKind::signal, wait = op.kind == OpKind::wait;
    w.insert(w.end(), {sig ? op.peer : -1, sig || wait ? op.slot : -1, wait ? op.iter : 0, int32_t(op.final),
                       int32_t(op.pos.size())});
    w.insert(w.end(), op.pos.begin(), op.pos.end());
    h.add(w.data(), w.size() * sizeof(int32_t));
    auto [it, fresh] = locs.try_emplace(&op.loc.get());
    if (fresh)  // a tag byte, then (valid) the position's hash: the stream parses one way only
      it->second = op.loc.valid() ? "L" + Hasher().add(op.loc->file).add(&op.loc->line, sizeof op.loc->line).hex() : "-";
    h.add(it->second);
  }
  return h.hex();
}

Schedule from_json(std::string_view text) {
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    bad("$", std::string("not JSON: ") + e.what());
  }
  if (!j.is_object()) bad("$", "expected an object");
  int version = get_num<int>(j, "mk_ir_version", "$");
  if (version != Schedule::kVersion)
    throw Error(ErrId::ir_E002,
                "IR schema version " + std::to_string(version) + " is not supported (this mKernel reads " +
                    std::to_string(Schedule::kVersion) + ")",
                {}, "re-export the schedule with this version of mkc");
  Schedule s;
  s.name = get_str(j, "name", "$");
  auto coll = parse_collective(get_str(j, "collective", "$"));
  if (!coll) bad("$.collective", "unknown collective '" + get_str(j, "collective", "$") + "'");
  s.coll = *coll;
  s.nranks = get_num<int32_t>(j, "ranks", "$");
  s.root = get_num<int32_t>(j, "root", "$", 0);
  s.chunks = get_num<int32_t>(j, "chunks", "$", 1);
  s.instances = get_num<int32_t>(j, "instances", "$", 1);
  s.scratch = get_num<int32_t>(j, "scratch", "$", 0);
  s.tbs = get_num<int32_t>(j, "tbs", "$", 0);
  s.slots = get_num<int32_t>(j, "slots", "$", 0);
  s.depth = get_num<int32_t>(j, "depth", "$", 1);
  auto proto = parse_proto(get_str(j, "proto", "$", std::string("simple")));
  if (!proto) bad("$.proto", "expected \"simple\" or \"ll\"");
  s.proto = *proto;
  s.tile_bytes = get_num<int64_t>(j, "tile_bytes", "$", 0);
  s.staged = get_bool(j, "staged", "$", false);
  s.zero_copy = get_bool(j, "zero_copy", "$", false);
  s.one_pass = get_bool(j, "one_pass", "$", false);
  s.lamport = get_bool(j, "lamport", "$", false);
  if (s.lamport && !s.one_pass) bad("$.lamport", "only one-pass schedules use Lamport packets");
  s.synced = get_bool(j, "synced", "$", false);
  if (s.nranks < 1) bad("$.ranks", "must be >= 1");
  if (s.chunks < 1) bad("$.chunks", "must be >= 1");
  if (s.instances < 1) bad("$.instances", "must be >= 1");
  if (s.scratch < 0 || s.tbs < 0 || s.slots < 0 || s.depth < 1 || s.tile_bytes < 0)
    bad("$", "negative sizes");
  // "" or absent: unset (older files write the label form, e.g. "nvlink:8")
  if (auto t = j.find("topology"); t != j.end() && *t != "")
    s.topology = topology::from_json(*t, s.nranks, [](const std::string& path, const std::string& what) {
      bad("$.topology" + path, what);
    });
  const json& ops = field(j, "ops", "$");
  if (!ops.is_array()) bad("$.ops", "expected an array");
  for (size_t i = 0; i < ops.size(); ++i) {
    std::string p = "$.ops[" + std::to_string(i) + "]";
    const json& o = ops[i];
    if (!o.is_object()) bad(p, "expected an object");
    Op op;
    op.id = get_num<int32_t>(o, "id", p);
    auto kind = parse_opkind(get_str(o, "kind", p));
    if (!kind) bad(p + ".kind", "unknown op kind '" + get_str(o, "kind", p) + "'");
    op.kind = *kind;
    op.rank = get_num<int32_t>(o, "rank", p);
    op.tb = get_num<int32_t>(o, "tb", p, -1);
    op.srcs = get_refs(o, "srcs", p);
    op.dsts = get_refs(o, "dsts", p);
    op.peer = get_num<int32_t>(o, "peer", p, -1);
    op.slot = get_num<int32_t>(o, "slot", p, -1);
    op.iter = get_num<int32_t>(o, "iter", p, 0);
    op.final = get_bool(o, "final", p, false);
    if (o.contains("pos")) {
      if (!o["pos"].is_array()) bad(p + ".pos", "expected an array of integers");
      for (const auto& v : o["pos"]) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (1 << 30))
          bad(p + ".pos", "expected an array of small non-negative integers");
        op.pos.push_back(v.get<int32_t>());
      }
    }
    if (o.contains("loc")) {
      SrcLoc l;
      l.file = get_str(o["loc"], "file", p + ".loc");
      l.line = get_num<uint32_t>(o["loc"], "line", p + ".loc");
      op.loc = l;
    }
    if (int(op.srcs.size()) < min_srcs(op.kind) || int(op.dsts.size()) < min_dsts(op.kind))
      bad(p, "op '" + std::string(name(op.kind)) + "' needs at least " +
                 std::to_string(min_srcs(op.kind)) + " source(s) and " +
                 std::to_string(min_dsts(op.kind)) + " destination(s)");
    s.ops.push_back(std::move(op));
  }
  return s;
}

}  // namespace mk::ir
