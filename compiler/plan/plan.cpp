#include "compiler/plan/plan.hpp"

#include <fmt/format.h>

#include <cctype>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <fstream>
#include <nlohmann/json.hpp>

#include "compiler/common/cubin.hpp"
#include "compiler/common/hash.hpp"
#include "compiler/common/json_int.hpp"
#include "compiler/common/trusted_fs.hpp"
#include "compiler/passes/passes.hpp"
#include "mk/error.hpp"
#include "templates/abi.cuh"

namespace mk::plan {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

[[noreturn]] void bad(const std::string& where, const std::string& path, const std::string& what) {
  throw Error(ErrId::plan_E001, fmt::format("{}: {}: {}", where, path, what), {},
              "regenerate the plan with `mkc compile`; the format is in docs/plan.md");
}

// An integer field in [lo, hi]; every bound check below works on values this
// has already bounded, so its products fit in 64 bits.
template <typename T>
T num(const json& j, const char* key, const std::string& where, const std::string& path, int64_t lo, int64_t hi) {
  auto it = j.find(key);
  if (it == j.end()) bad(where, path + "." + key, "missing");
  if (!it->is_number_integer()) bad(where, path + "." + key, "expected an integer");
  if (!json_int_fits<T>(*it) || it->get<int64_t>() < lo || it->get<int64_t>() > hi)
    bad(where, path + "." + key, fmt::format("{} is outside {}..{}", it->dump(), lo, hi));
  return it->get<T>();
}

std::string str(const json& j, const char* key, const std::string& where, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end()) bad(where, path + "." + key, "missing");
  if (!it->is_string()) bad(where, path + "." + key, "expected a string");
  std::string v = it->get<std::string>();
  if (v.size() > 4096) bad(where, path + "." + key, "longer than 4096 characters");
  return v;
}

// An optional string field: `dflt` when absent.
std::string opt_str(const json& j, const char* key, const std::string& where, const std::string& path,
                    const std::string& dflt) {
  return j.contains(key) ? str(j, key, where, path) : dflt;
}

bool safe_file_name(const std::string& f) {
  return !f.empty() && f.find('/') == std::string::npos && f.find('\0') == std::string::npos && f != "." &&
         f != "..";
}

// Kernel names become symbol names (cuModuleGetFunction) and file names.
bool identifier(const std::string& s) {
  if (s.empty() || s.size() > 256 || (s[0] >= '0' && s[0] <= '9')) return false;
  for (char c : s)
    if (!(c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))) return false;
  return true;
}

// Limits of a plan's fields: far above anything the compiler emits, low
// enough that the layout arithmetic below cannot overflow int64.
constexpr int64_t kMaxRanks = 1024;
constexpr int64_t kMaxKernels = 1024;
constexpr int64_t kMaxInstances = 1024;
constexpr int64_t kMaxTbs = 1024;
constexpr int64_t kMaxGrid = 1 << 20;
constexpr int64_t kMaxDepth = 1024;
constexpr int64_t kMaxSlots = 1 << 20;
constexpr int64_t kMaxTile = 1ll << 30;
constexpr int64_t kMaxRegion = 1ll << 40;  // scratch or flag bytes per rank
constexpr int64_t kMaxBytes = int64_t(1) << 62;
constexpr size_t kMaxPlanJson = 16 << 20;  // bytes of plan.json text
constexpr size_t kMaxCubin = 256 << 20;    // bytes of one cubin or source file

int parse_sm(const std::string& arch, const std::string& where) {
  const std::string d = arch.rfind("sm_", 0) == 0 ? arch.substr(3) : "";
  if (d.size() < 2 || d.size() > 3 || !std::all_of(d.begin(), d.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      d[0] == '0')
    bad(where, "$.arch", "'" + arch + "' is not sm_NN or sm_NNN");
  return std::stoi(d);
}

Kernel kernel_from_json(const json& k, const Plan& p, size_t i, const std::string& where) {
  const std::string path = fmt::format("$.kernels[{}]", i);
  if (!k.is_object()) bad(where, path, "expected an object");
  Kernel x;
  x.name = str(k, "name", where, path);
  if (!identifier(x.name)) bad(where, path + ".name", "'" + x.name + "' is not a C identifier of up to 256 characters");
  x.bucket = num<int32_t>(k, "bucket", where, path, int64_t(i), int64_t(i));
  x.min_bytes = num<int64_t>(k, "min_bytes", where, path, 0, kMaxBytes);
  x.max_bytes = num<int64_t>(k, "max_bytes", where, path, -1, kMaxBytes);
  if (x.max_bytes >= 0 && x.max_bytes < x.min_bytes)
    bad(where, path + ".max_bytes", fmt::format("{} is below min_bytes {}", x.max_bytes, x.min_bytes));
  x.proto = str(k, "proto", where, path);
  if (x.proto != "simple" && x.proto != "ll") bad(where, path + ".proto", "expected simple or ll");
  x.max_tile_bytes = num<int64_t>(k, "max_tile_bytes", where, path, 16, kMaxTile);
  if (x.max_tile_bytes % 16) bad(where, path + ".max_tile_bytes", "must be a multiple of 16");
  x.instances = num<int32_t>(k, "instances", where, path, 1, kMaxInstances);
  x.tbs = num<int32_t>(k, "tbs", where, path, 1, kMaxTbs);
  x.threads = num<int32_t>(k, "threads", where, path, 32, 1024);
  if (x.threads % 32) bad(where, path + ".threads", "must be a multiple of 32");
  x.grid = num<int32_t>(k, "grid", where, path, 1, kMaxGrid);
  if (int64_t(x.grid) != int64_t(x.tbs) * x.instances)
    bad(where, path + ".grid", fmt::format("{} != tbs x instances = {}", x.grid, int64_t(x.tbs) * x.instances));
  x.depth = num<int32_t>(k, "depth", where, path, 1, kMaxDepth);
  x.scratch_slots = num<int32_t>(k, "scratch_slots", where, path, 1, kMaxSlots);
  x.flag_slots = num<int32_t>(k, "flag_slots", where, path, 1, kMaxSlots);
  x.classes = num<int32_t>(k, "classes", where, path, 1, p.nranks);
  x.scratch_bytes = num<int64_t>(k, "scratch_bytes", where, path, 0, kMaxRegion);
  x.flag_bytes = num<int64_t>(k, "flag_bytes", where, path, 8, kMaxRegion);
  x.seq_words = num<int32_t>(k, "seq_words", where, path, x.grid, x.grid);
  if (k.contains("one_pass")) {
    if (!k["one_pass"].is_boolean()) bad(where, path + ".one_pass", "expected true or false");
    x.one_pass = k["one_pass"].get<bool>();
    if (x.one_pass && x.proto != "ll") bad(where, path + ".one_pass", "only LL kernels run in one pass");
  }
  if (k.contains("lamport")) {
    if (!k["lamport"].is_boolean()) bad(where, path + ".lamport", "expected true or false");
    x.lamport = k["lamport"].get<bool>();
    if (x.lamport && !x.one_pass) bad(where, path + ".lamport", "only one-pass kernels carry Lamport packets");
    if (x.lamport && !passes::lamport_dtype(p.dtype))
      bad(where, path + ".lamport",
          fmt::format("{} has no spare 32-bit pattern for the sentinel (Lamport packets are for floats of at most 4 "
                      "bytes)",
                      name(p.dtype)));
  }
  if (k.contains("pdl")) {
    if (!k["pdl"].is_boolean()) bad(where, path + ".pdl", "expected true or false");
    x.pdl = k["pdl"].get<bool>();
    if (x.pdl && p.arch < 90) bad(where, path + ".pdl", "programmatic dependent launch needs sm_90 or later");
  }
  if (k.contains("net")) {
    const json& n = k["net"];
    if (!n.is_array() || n.size() > (size_t(1) << 22))
      bad(where, path + ".net", "expected an array of at most 2^22 [rank, tb, peer, puts] entries");
    for (size_t i = 0; i < n.size(); ++i) {
      const std::string at = path + ".net[" + std::to_string(i) + "]";
      const json& e = n[i];
      if (!e.is_array() || e.size() != 4) bad(where, at, "expected [rank, tb, peer, puts]");
      auto field = [&](size_t f, int64_t hi) {
        if (!e[f].is_number_integer() || e[f].get<int64_t>() < 0 || e[f].get<int64_t>() > hi)
          bad(where, at, fmt::format("field {} must be an integer in 0..{}", f, hi));
        return int32_t(e[f].get<int64_t>());
      };
      Kernel::NetConn c;
      c.rank = field(0, p.nranks - 1);
      c.tb = field(1, x.tbs - 1);
      c.peer = field(2, p.nranks - 1);
      c.puts = field(3, 1) != 0;
      if (c.peer == c.rank) bad(where, at, "a connection from a rank to itself");
      if (!x.net.empty() && !(std::tie(x.net.back().rank, x.net.back().tb, x.net.back().peer) <
                              std::tie(c.rank, c.tb, c.peer)))
        bad(where, at, "entries must be sorted and unique by (rank, tb, peer)");
      x.net.push_back(c);
    }
    if (!x.net.empty() && x.proto != "simple") bad(where, path + ".net", "network plans use the simple protocol");
  }
  x.cubin_file = str(k, "cubin", where, path);
  x.source_file = opt_str(k, "source", where, path, "");
  if (!safe_file_name(x.cubin_file)) bad(where, path + ".cubin", "must be a plain file name");
  if (!x.source_file.empty() && !safe_file_name(x.source_file))
    bad(where, path + ".source", "must be a plain file name");
  // The regions the kernel addresses must fit what the runtime allocates.
  // Every factor is bounded above: flag words < 2^41, scratch < 2^91 would
  // overflow, so the scratch product is checked step by step.
  const int64_t flag_words = dev::flag_words(x.instances, x.flag_slots) + (p.zero_copy ? dev::zc_words(p.nranks) : 0);
  if (x.flag_bytes < flag_words * 8)
    bad(where, path + ".flag_bytes",
        fmt::format("{} bytes cannot hold {} flag words ({} instances x {} slots, abort word{})", x.flag_bytes,
                    flag_words, x.instances, x.flag_slots, p.zero_copy ? ", zero-copy mailboxes" : ""));
  if (x.scratch_bytes != 0) {
    int64_t need = x.max_tile_bytes * (x.proto == "ll" && !x.lamport ? 2 : 1);  // < 2^32
    for (int64_t f : {int64_t(x.scratch_slots), int64_t(x.depth), int64_t(x.instances)}) {
      if (need > kMaxRegion / f)
        bad(where, path + ".scratch_bytes", "the scratch layout (tile x slots x depth x instances) exceeds 1 TiB");
      need *= f;
    }
    if (x.scratch_bytes < need)
      bad(where, path + ".scratch_bytes",
          fmt::format("{} bytes cannot hold the scratch layout ({} bytes)", x.scratch_bytes, need));
  }
  return x;
}

Plan parse(const json& j, const std::string& where) {
  if (!j.is_object()) bad(where, "$", "expected an object");
  int v = num<int>(j, "mk_plan_version", where, "$", std::numeric_limits<int>::min(), std::numeric_limits<int>::max());
  if (v != Plan::kVersion)
    throw Error(ErrId::plan_E002,
                fmt::format("{}: plan version {} is not supported (this mKernel reads {})", where, v, Plan::kVersion),
                {}, "recompile the plan with this mkc");
  Plan p;
  p.schedule = str(j, "schedule", where, "$");
  if (p.schedule.empty()) bad(where, "$.schedule", "empty");
  auto coll = parse_collective(str(j, "collective", where, "$"));
  if (!coll) bad(where, "$.collective", "unknown collective");
  p.coll = *coll;
  p.nranks = num<int32_t>(j, "ranks", where, "$", 1, kMaxRanks);
  p.chunks = num<int32_t>(j, "chunks", where, "$", 1, 1 << 20);
  // absent or "": one NVLink node (older plans write the label form, "nvlink:8")
  if (auto t = j.find("topology"); t != j.end() && *t != "")
    p.topology = topology::from_json(*t, p.nranks, [&](const std::string& path, const std::string& what) {
      bad(where, "$.topology" + path, what);
    });
  if (j.contains("zero_copy")) {
    if (!j["zero_copy"].is_boolean()) bad(where, "$.zero_copy", "expected true or false");
    p.zero_copy = j["zero_copy"].get<bool>();
  }
  auto dt = parse_dtype(str(j, "dtype", where, "$"));
  if (!dt) bad(where, "$.dtype", "unknown dtype");
  p.dtype = *dt;
  auto op = parse_redop(str(j, "op", where, "$"));
  if (!op) bad(where, "$.op", "unknown op");
  p.op = *op;
  if (j.contains("fusion_check")) {
    if (!j["fusion_check"].is_boolean()) bad(where, "$.fusion_check", "expected true or false");
    p.fusion_check = j["fusion_check"].get<bool>();
  }
  p.fusion = opt_str(j, "fusion", where, "$", "");
  if (p.fusion.size() > 128) bad(where, "$.fusion", "longer than 128 characters");
  for (char c : p.fusion)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' || c == '@'))
      bad(where, "$.fusion", "expected a fusion's name@hash (letters, digits, '.', '_', '-', '@')");
  p.arch = parse_sm(str(j, "arch", where, "$"), where);
  p.nvrtc_version = j.contains("nvrtc_version")
                        ? num<int32_t>(j, "nvrtc_version", where, "$", 0, std::numeric_limits<int32_t>::max())
                        : 0;
  p.mkernel_version = opt_str(j, "mkernel_version", where, "$", "");
  if (auto sv = j.find("serves"); sv != j.end()) {  // absent: every rank
    if (!sv->is_array() || sv->empty() || sv->size() > size_t(p.nranks))
      bad(where, "$.serves", fmt::format("expected a non-empty array of at most {} ranks", p.nranks));
    for (size_t i = 0; i < sv->size(); ++i) {
      const std::string at = fmt::format("$.serves[{}]", i);
      const json& r = (*sv)[i];
      if (!r.is_number_integer() || !json_int_fits<int32_t>(r) || r.get<int64_t>() < 0 ||
          r.get<int64_t>() >= p.nranks)
        bad(where, at, fmt::format("{} is not a rank of {}", r.dump(), p.nranks));
      if (!p.serves.empty() && r.get<int32_t>() <= p.serves.back())
        bad(where, at, "ranks must be listed in ascending order, each once");
      p.serves.push_back(r.get<int32_t>());
    }
  }
  auto ks = j.find("kernels");
  if (ks == j.end() || !ks->is_array() || ks->empty()) bad(where, "$.kernels", "expected a non-empty array");
  if (ks->size() > size_t(kMaxKernels)) bad(where, "$.kernels", fmt::format("more than {} kernels", kMaxKernels));
  for (size_t i = 0; i < ks->size(); ++i) {
    Kernel x = kernel_from_json((*ks)[i], p, i, where);
    // Buckets in order, ranges disjoint: select() takes the first match.
    if (i > 0) {
      const Kernel& prev = p.kernels.back();
      if (prev.max_bytes < 0 || x.min_bytes <= prev.max_bytes)
        bad(where, fmt::format("$.kernels[{}].min_bytes", i),
            fmt::format("size range {}..{} overlaps the previous bucket's ({}..{})", x.min_bytes, x.max_bytes,
                        prev.min_bytes, prev.max_bytes));
    }
    p.kernels.push_back(std::move(x));
  }
  return p;
}

}  // namespace

namespace {

// The plan-level fields, as plan.json has them (without "kernels").
json header_json(const Plan& p) {
  json j;
  j["mk_plan_version"] = Plan::kVersion;
  j["schedule"] = p.schedule;
  j["collective"] = std::string(name(p.coll));
  j["ranks"] = p.nranks;
  j["chunks"] = p.chunks;
  if (p.topology) j["topology"] = topology::to_json(*p.topology);
  if (p.zero_copy) j["zero_copy"] = true;
  j["dtype"] = std::string(name(p.dtype));
  j["op"] = std::string(name(p.op));
  if (!p.fusion.empty()) j["fusion"] = p.fusion;
  if (p.fusion_check) j["fusion_check"] = true;
  j["arch"] = "sm_" + std::to_string(p.arch);
  j["nvrtc_version"] = p.nvrtc_version;
  j["mkernel_version"] = p.mkernel_version;
  if (!p.serves.empty()) j["serves"] = p.serves;
  return j;
}

json kernel_json(const Kernel& k) {
  json j = {{"name", k.name},
          {"bucket", k.bucket},
          {"min_bytes", k.min_bytes},
          {"max_bytes", k.max_bytes},
          {"proto", k.proto},
          {"max_tile_bytes", k.max_tile_bytes},
          {"instances", k.instances},
          {"tbs", k.tbs},
          {"threads", k.threads},
          {"grid", k.grid},
          {"depth", k.depth},
          {"scratch_slots", k.scratch_slots},
          {"flag_slots", k.flag_slots},
          {"classes", k.classes},
          {"scratch_bytes", k.scratch_bytes},
          {"flag_bytes", k.flag_bytes},
          {"seq_words", k.seq_words},
          {"cubin", k.cubin_file},
          {"source", k.source_file}};
  if (k.pdl) j["pdl"] = true;
  if (k.one_pass) j["one_pass"] = true;
  if (k.lamport) j["lamport"] = true;
  if (!k.net.empty()) {
    json n = json::array();
    for (const Kernel::NetConn& c : k.net) n.push_back({c.rank, c.tb, c.peer, c.puts ? 1 : 0});
    j["net"] = std::move(n);
  }
  return j;
}

}  // namespace

std::string to_json(const Plan& p) {
  json j = header_json(p);
  json ks = json::array();
  for (const auto& k : p.kernels) ks.push_back(kernel_json(k));
  j["kernels"] = std::move(ks);
  return j.dump(2) + "\n";
}

std::string resource_key(const Plan& p, const Kernel& k) {
  // Derived from the serialised form, so a field added to plan.json joins
  // the key without anyone listing it here; only what cannot change the
  // layout is taken out.
  json j = header_json(p);
  j.erase("dtype");
  j.erase("op");
  j.erase("fusion");  // fused kernels share the layout; only they use the tail word
  j.erase("serves");  // which ranks run the code, not the layout (equal on every rank)
  json kj = kernel_json(k);
  for (const char* f : {"name", "cubin", "source"}) kj.erase(f);
  j["kernel"] = std::move(kj);
  return hash_hex(j.dump());
}

void check_cubin(const std::vector<char>& cubin, int arch, const std::string& file) {
  const std::string why = cubin_problem(cubin.data(), cubin.size(), arch);
  if (!why.empty())
    throw Error(ErrId::plan_E005, fmt::format("{} is not a complete cubin for sm_{}: {}", file, arch, why), {},
                "regenerate the plan with `mkc compile --arch sm_" + std::to_string(arch) +
                    "` and copy the whole directory");
}

Plan from_json(const std::string& text, const std::string& where) {
  if (text.size() > kMaxPlanJson)
    bad(where, "$", fmt::format("{} bytes; a plan.json has at most {}", text.size(), kMaxPlanJson));
  // A plan nests three levels; deeper input is refused while it is parsed.
  constexpr int kMaxNesting = 16;
  auto depth = [&](int d, json::parse_event_t, json&) {
    if (d > kMaxNesting) bad(where, "$", fmt::format("nested more than {} levels deep", kMaxNesting));
    return true;
  };
  json j;
  try {
    j = json::parse(text, depth);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers beyond a double
    bad(where, "$", std::string("not JSON: ") + e.what());
  }
  return parse(j, where);
}

void write_dir(const Plan& p, const std::string& dir, bool private_files) {
  if (std::string why = tfs::make_dir(dir, private_files ? 0700 : 0755); !why.empty())
    throw Error(ErrId::cli_E012, why, {}, "pick a writable output directory");
  auto write = [&](const std::string& name, const char* data, size_t size) {
    const fs::path f = fs::path(dir) / name;
    if (std::string why = tfs::write_file(f, data, size, private_files ? 0600 : 0644); !why.empty())
      throw Error(ErrId::cli_E012, why, {}, "pick a writable output directory");
  };
  for (const auto& k : p.kernels) {
    write(k.cubin_file, k.cubin.data(), k.cubin.size());
    if (!k.source_file.empty()) write(k.source_file, k.source.data(), k.source.size());
  }
  std::string j = to_json(p);
  write("plan.json", j.data(), j.size());  // last: a reader that sees it sees the cubins
}

namespace {

// The whole of a regular file of at most `limit` bytes, under the trust
// policy; a refusal by the policy is mk.plan.E007, anything else E003.
// `what` names the file in the message ("plan X", "plan X names Y").
void read_checked(const fs::path& f, size_t limit, std::vector<char>* out, const std::string& what) {
  std::string why;
  const tfs::Read r = tfs::read_file(f, limit, out, &why);
  if (r == tfs::Read::untrusted)
    throw Error(ErrId::plan_E007, fmt::format("{}, which is not used: it is {}", what, why), {},
                "plans are code: keep them in files only you (or root) can write, without symbolic links; "
                "copy them into such a directory, or compile them again with `mkc compile`");
  if (r != tfs::Read::ok)
    throw Error(ErrId::plan_E003, fmt::format("{}, which cannot be read: {}", what, why), {},
                "run `mkc compile ... -o DIR` first");
}

}  // namespace

Plan read_dir(const std::string& dir) {
  fs::path pj = fs::path(dir) / "plan.json";
  std::error_code ec;
  if (fs::is_regular_file(fs::symlink_status(dir, ec))) pj = dir;
  // The directory itself (as named: the links in its path are the user's
  // choice): nobody else may add or swap files in it.
  const fs::path d = fs::canonical(pj.parent_path().empty() ? fs::path(".") : pj.parent_path(), ec);
  if (ec) throw Error(ErrId::plan_E003, "cannot read " + pj.string() + ": " + ec.message(), {},
                      "run `mkc compile ... -o DIR` first");
  if (std::string why = tfs::entry_problem(d); !why.empty())
    throw Error(ErrId::plan_E007, fmt::format("plan directory {} is not used: it is {}", d.string(), why), {},
                "plans are code: keep them in a directory only you (or root) can write");
  pj = d / pj.filename();
  std::vector<char> bytes;
  read_checked(pj, kMaxPlanJson, &bytes, "plan " + pj.string());
  Plan p = from_json(std::string(bytes.begin(), bytes.end()), pj.string());
  for (auto& k : p.kernels) {
    const fs::path cub = pj.parent_path() / k.cubin_file;
    read_checked(cub, kMaxCubin, &k.cubin, "plan " + pj.string() + " names " + k.cubin_file);
    check_cubin(k.cubin, p.arch, cub.string());
    if (!k.source_file.empty()) {
      std::vector<char> src;
      std::string why;
      if (tfs::read_file(pj.parent_path() / k.source_file, kMaxCubin, &src, &why) == tfs::Read::ok)
        k.source.assign(src.begin(), src.end());
    }
  }
  return p;
}

const char* library_version() { return MK_VERSION; }

void check_version(const Plan& p, const std::string& where) {
  if (p.mkernel_version == MK_VERSION) return;
  throw Error(ErrId::plan_E008,
              fmt::format("{}: plan {} was compiled by mKernel {}, this library is {}", where, p.schedule,
                          p.mkernel_version.empty() ? "(no version recorded)" : p.mkernel_version, MK_VERSION),
              {}, "compile it again with this version's mkc (`mkc compile ... -o DIR`)");
}

bool serves(const Plan& p, int32_t rank) {
  return rank >= 0 && rank < p.nranks &&
         (p.serves.empty() || std::binary_search(p.serves.begin(), p.serves.end(), rank));
}

std::string served_ranks(const Plan& p) {
  std::vector<int32_t> all;
  if (p.serves.empty())
    for (int32_t r = 0; r < p.nranks; ++r) all.push_back(r);
  const std::vector<int32_t>& v = p.serves.empty() ? all : p.serves;
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    size_t e = i;
    while (e + 1 < v.size() && v[e + 1] == v[e] + 1) ++e;
    out += (out.empty() ? "" : ",") + (e > i ? fmt::format("{}-{}", v[i], v[e]) : std::to_string(v[i]));
    i = e;
  }
  return out;
}

void check_serves(const Plan& p, int32_t rank, const std::string& where) {
  if (serves(p, rank)) return;
  throw Error(ErrId::plan_E006,
              fmt::format("{}: plan {} for {} ranks was compiled for ranks {} only (its rank class), not rank {}",
                          where, p.schedule, p.nranks, served_ranks(p), rank),
              {},
              fmt::format("compile one for this rank with `mkc compile {} --ranks {} --rank {}`, or leave --rank out "
                          "for a plan that serves every rank",
                          p.schedule, p.nranks, rank));
}

const Kernel* select(const Plan& p, int64_t bytes) {
  for (const auto& k : p.kernels)
    if (bytes >= k.min_bytes && (k.max_bytes < 0 || bytes <= k.max_bytes)) return &k;
  return nullptr;
}

std::string summary(const Plan& p) {
  size_t bytes = 0;
  for (const auto& k : p.kernels) bytes += k.cubin.size();
  std::string s = fmt::format("plan {} ({}{}) for {} ranks{}, {} {}, {}; {} kernel(s), {} bytes of cubin\n", p.schedule,
                              name(p.coll), p.zero_copy ? ", zero-copy" : "", p.nranks,
                              p.serves.empty() ? "" : " (serves ranks " + served_ranks(p) + ")", name(p.dtype),
                              std::string(name(p.op)) + (p.fusion.empty() ? std::string() : ", fused " + p.fusion) +
                                  (p.fusion_check ? " (checked accessors)" : ""),
                              "sm_" + std::to_string(p.arch), p.kernels.size(), bytes);
  for (const auto& k : p.kernels) {
    std::string range = k.max_bytes < 0 ? fmt::format("{}B..", k.min_bytes)
                                        : fmt::format("{}B..{}B", k.min_bytes, k.max_bytes);
    s += fmt::format(
        "  bucket {} [{}]: {} proto={} tile<={}B grid={}x{} ({} instance(s) x {} block(s)) "
        "scratch={}B/rank flags={} slot(s) classes={}\n",
        k.bucket, range, k.name, k.proto + (k.lamport ? " (one pass, Lamport)" : k.one_pass ? " (one pass)" : ""),
        k.max_tile_bytes, k.grid, k.threads, k.instances, k.tbs, k.scratch_bytes,
        k.flag_slots, k.classes);
  }
  return s;
}

}  // namespace mk::plan
