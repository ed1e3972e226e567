#include "compiler/plan/plan.hpp"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "compiler/common/json_int.hpp"
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

template <typename T>
T num(const json& j, const char* key, const std::string& where, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end()) bad(where, path + "." + key, "missing");
  if (!it->is_number_integer()) bad(where, path + "." + key, "expected an integer");
  if (!json_int_fits<T>(*it)) bad(where, path + "." + key, "integer out of range");
  return it->get<T>();
}

std::string str(const json& j, const char* key, const std::string& where, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end()) bad(where, path + "." + key, "missing");
  if (!it->is_string()) bad(where, path + "." + key, "expected a string");
  return it->get<std::string>();
}

bool safe_file_name(const std::string& f) {
  return !f.empty() && f.find('/') == std::string::npos && f != "." && f != "..";
}

}  // namespace

std::string to_json(const Plan& p) {
  json j;
  j["mk_plan_version"] = Plan::kVersion;
  j["schedule"] = p.schedule;
  j["collective"] = std::string(name(p.coll));
  j["ranks"] = p.nranks;
  j["chunks"] = p.chunks;
  j["topology"] = p.topology;
  if (p.zero_copy) j["zero_copy"] = true;
  j["dtype"] = std::string(name(p.dtype));
  j["op"] = std::string(name(p.op));
  j["arch"] = "sm_" + std::to_string(p.arch);
  j["nvrtc_version"] = p.nvrtc_version;
  j["mkernel_version"] = p.mkernel_version;
  json ks = json::array();
  for (const auto& k : p.kernels) {
    ks.push_back({{"name", k.name},
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
                  {"source", k.source_file}});
  }
  j["kernels"] = std::move(ks);
  return j.dump(2) + "\n";
}

Plan from_json(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    bad(where, "$", std::string("not JSON: ") + e.what());
  }
  if (!j.is_object()) bad(where, "$", "expected an object");
  int v = num<int>(j, "mk_plan_version", where, "$");
  if (v != Plan::kVersion)
    throw Error(ErrId::plan_E002,
                fmt::format("{}: plan version {} is not supported (this mKernel reads {})", where, v, Plan::kVersion),
                {}, "recompile the plan with this mkc");
  Plan p;
  p.schedule = str(j, "schedule", where, "$");
  auto coll = parse_collective(str(j, "collective", where, "$"));
  if (!coll) bad(where, "$.collective", "unknown collective");
  p.coll = *coll;
  p.nranks = num<int32_t>(j, "ranks", where, "$");
  if (p.nranks < 1 || p.nranks > 1024) bad(where, "$.ranks", "must be 1..1024");
  p.chunks = num<int32_t>(j, "chunks", where, "$");
  if (p.chunks < 1) bad(where, "$.chunks", "must be >= 1");
  p.topology = j.value("topology", "");
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
  std::string arch = str(j, "arch", where, "$");
  if (arch.rfind("sm_", 0) != 0) bad(where, "$.arch", "expected sm_NN");
  try {
    p.arch = std::stoi(arch.substr(3));
  } catch (...) {
    bad(where, "$.arch", "expected sm_NN");
  }
  p.nvrtc_version = j.value("nvrtc_version", 0);
  p.mkernel_version = j.value("mkernel_version", "");
  auto ks = j.find("kernels");
  if (ks == j.end() || !ks->is_array() || ks->empty()) bad(where, "$.kernels", "expected a non-empty array");
  for (size_t i = 0; i < ks->size(); ++i) {
    const json& k = (*ks)[i];
    std::string path = fmt::format("$.kernels[{}]", i);
    if (!k.is_object()) bad(where, path, "expected an object");
    Kernel x;
    x.name = str(k, "name", where, path);
    x.bucket = num<int32_t>(k, "bucket", where, path);
    x.min_bytes = num<int64_t>(k, "min_bytes", where, path);
    x.max_bytes = num<int64_t>(k, "max_bytes", where, path);
    x.proto = str(k, "proto", where, path);
    if (x.proto != "simple" && x.proto != "ll") bad(where, path + ".proto", "expected simple or ll");
    x.max_tile_bytes = num<int64_t>(k, "max_tile_bytes", where, path);
    x.instances = num<int32_t>(k, "instances", where, path);
    x.tbs = num<int32_t>(k, "tbs", where, path);
    x.threads = num<int32_t>(k, "threads", where, path);
    x.grid = num<int32_t>(k, "grid", where, path);
    x.depth = num<int32_t>(k, "depth", where, path);
    x.scratch_slots = num<int32_t>(k, "scratch_slots", where, path);
    x.flag_slots = num<int32_t>(k, "flag_slots", where, path);
    x.classes = num<int32_t>(k, "classes", where, path);
    x.scratch_bytes = num<int64_t>(k, "scratch_bytes", where, path);
    x.flag_bytes = num<int64_t>(k, "flag_bytes", where, path);
    x.seq_words = num<int32_t>(k, "seq_words", where, path);
    x.cubin_file = str(k, "cubin", where, path);
    x.source_file = k.value("source", "");
    if (!safe_file_name(x.cubin_file)) bad(where, path + ".cubin", "must be a plain file name");
    if (!x.source_file.empty() && !safe_file_name(x.source_file)) bad(where, path + ".source", "must be a plain file name");
    if (x.max_tile_bytes < 16 || x.max_tile_bytes % 16 || x.instances < 1 || x.tbs < 1 || x.threads < 32 ||
        x.threads > 1024 || x.grid != x.tbs * x.instances || x.depth < 1 || x.scratch_slots < 1 ||
        x.flag_slots < 1 || x.min_bytes < 0 || (x.max_bytes >= 0 && x.max_bytes < x.min_bytes) ||
        x.seq_words != x.grid || x.scratch_bytes < 0 || x.flag_bytes < 8)
      bad(where, path, "inconsistent kernel description");
    // The regions the kernel addresses must fit what the runtime allocates.
    const int64_t flag_words =
        dev::flag_words(x.instances, x.flag_slots) + (p.zero_copy ? dev::zc_words(p.nranks) : 0);
    if (x.flag_bytes < flag_words * 8)
      bad(where, path + ".flag_bytes",
          fmt::format("{} bytes cannot hold {} flag words ({} instances x {} slots, abort word{})", x.flag_bytes,
                      flag_words, x.instances, x.flag_slots, p.zero_copy ? ", zero-copy mailboxes" : ""));
    const int64_t scratch_need =
        x.max_tile_bytes * (x.proto == "ll" ? 2 : 1) * x.scratch_slots * x.depth * x.instances;
    if (x.scratch_bytes != 0 && x.scratch_bytes < scratch_need)
      bad(where, path + ".scratch_bytes",
          fmt::format("{} bytes cannot hold the scratch layout ({} bytes)", x.scratch_bytes, scratch_need));
    p.kernels.push_back(std::move(x));
  }
  return p;
}

void write_dir(const Plan& p, const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  auto write = [&](const std::string& name, const char* data, size_t size) {
    fs::path f = fs::path(dir) / name;
    std::ofstream o(f, std::ios::binary);
    o.write(data, std::streamsize(size));
    if (!o) throw Error(ErrId::cli_E012, "cannot write " + f.string(), {}, "pick a writable output directory");
  };
  if (ec) throw Error(ErrId::cli_E012, "cannot create " + dir + ": " + ec.message());
  for (const auto& k : p.kernels) {
    write(k.cubin_file, k.cubin.data(), k.cubin.size());
    if (!k.source_file.empty()) write(k.source_file, k.source.data(), k.source.size());
  }
  std::string j = to_json(p);
  write("plan.json", j.data(), j.size());
}

Plan read_dir(const std::string& dir) {
  fs::path pj = fs::path(dir) / "plan.json";
  if (fs::is_regular_file(dir)) pj = dir;
  std::ifstream f(pj);
  if (!f) throw Error(ErrId::plan_E003, "cannot read " + pj.string(), {}, "run `mkc compile ... -o DIR` first");
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  Plan p = from_json(text, pj.string());
  for (auto& k : p.kernels) {
    fs::path cub = pj.parent_path() / k.cubin_file;
    std::ifstream c(cub, std::ios::binary);
    if (!c) throw Error(ErrId::plan_E003, "plan " + pj.string() + " names " + k.cubin_file + ", which cannot be read");
    k.cubin.assign(std::istreambuf_iterator<char>(c), std::istreambuf_iterator<char>());
    if (k.cubin.size() < 64 || std::string(k.cubin.data() + 1, 3) != "ELF")
      throw Error(ErrId::plan_E001, cub.string() + " is not a cubin (ELF) file");
    if (!k.source_file.empty()) {
      std::ifstream s(pj.parent_path() / k.source_file);
      if (s) k.source.assign(std::istreambuf_iterator<char>(s), std::istreambuf_iterator<char>());
    }
  }
  return p;
}

const Kernel* select(const Plan& p, int64_t bytes) {
  for (const auto& k : p.kernels)
    if (bytes >= k.min_bytes && (k.max_bytes < 0 || bytes <= k.max_bytes)) return &k;
  return nullptr;
}

std::string summary(const Plan& p) {
  size_t bytes = 0;
  for (const auto& k : p.kernels) bytes += k.cubin.size();
  std::string s = fmt::format("plan {} ({}{}) for {} ranks, {} {}, {}; {} kernel(s), {} bytes of cubin\n", p.schedule,
                              name(p.coll), p.zero_copy ? ", zero-copy" : "", p.nranks, name(p.dtype), name(p.op), "sm_" + std::to_string(p.arch),
                              p.kernels.size(), bytes);
  for (const auto& k : p.kernels) {
    std::string range = k.max_bytes < 0 ? fmt::format("{}B..", k.min_bytes)
                                        : fmt::format("{}B..{}B", k.min_bytes, k.max_bytes);
    s += fmt::format(
        "  bucket {} [{}]: {} proto={} tile<={}B grid={}x{} ({} instance(s) x {} block(s)) "
        "scratch={}B/rank flags={} slot(s) classes={}\n",
        k.bucket, range, k.name, k.proto, k.max_tile_bytes, k.grid, k.threads, k.instances, k.tbs, k.scratch_bytes,
        k.flag_slots, k.classes);
  }
  return s;
}

}  // namespace mk::plan
