// Prebuilt plans (compiler/plan/prebuilt.hpp).
#include "compiler/plan/prebuilt.hpp"

#include <dlfcn.h>
#include <sys/stat.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "compiler/common/log.hpp"
#include "compiler/common/trusted_fs.hpp"
#include "compiler/ir/ir.hpp"
#include "compiler/jit/jit.hpp"

namespace mk::prebuilt {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr size_t kMaxIndex = 64u << 20;

void note(const std::string& msg) { debug_log("prebuilt plans: " + msg); }

std::vector<std::string> dirs() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("MK_PREBUILT_DIR")) {
    std::string s = env;
    size_t start = 0;
    while (start <= s.size()) {
      size_t end = s.find(':', start);
      if (end == std::string::npos) end = s.size();
      if (end > start) out.push_back(s.substr(start, end - start));
      start = end + 1;
    }
    return out;
  }
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&dirs), &info) && info.dli_fname) {
    std::error_code ec;
    fs::path lib = fs::weakly_canonical(fs::path(info.dli_fname), ec);
    if (!ec) out.push_back((lib.parent_path().parent_path() / "share" / "mkernel" / "prebuilt").string());
  }
  return out;
}

struct Index {
  std::string dir;
  std::map<std::string, std::string> keys;
};

std::vector<Index> read_indexes() {
  std::vector<Index> v;
  for (const auto& d : dirs()) {
    const fs::path f = fs::path(d) / "index.json";
    std::error_code ec;
    if (!fs::is_regular_file(f, ec)) continue;
    Index ix;
    ix.dir = d;
    // Plans are code: the directory, every directory above it and every
    // file read pass one policy (compiler/common/trusted_fs.hpp); plan
    // directories are checked again when read (plan::read_dir).
    if (std::string why = tfs::tree_problem(d); !why.empty()) {
      note(d + " is not used: " + why);
      continue;
    }
    try {
      std::vector<char> bytes;
      std::string why;
      if (tfs::read_file(f, kMaxIndex, &bytes, &why) != tfs::Read::ok) throw std::runtime_error(why);
      const json j = json::parse(bytes.begin(), bytes.end());
      if (j.value("format", 0) != 1) throw std::runtime_error("unknown format");
      for (const auto& [k, rel] : j.at("plans").items()) {
        const std::string r = rel.get<std::string>();
        // plan directories are plain names inside the prebuilt directory
        if (r.empty() || r.find('/') != std::string::npos || r == "." || r == "..") continue;
        ix.keys.emplace(k, r);
      }
    } catch (const std::exception& e) {
      note(f.string() + " is not used: " + e.what());
      continue;
    }
    note(fmt::format("{} plans known in {}", ix.keys.size(), d));
    v.push_back(std::move(ix));
  }
  return v;
}

std::mutex& mutex() {
  static std::mutex m;
  return m;
}

// The indexes of the current search path, read again when it changes.
// Called with mutex() held.
const std::vector<Index>& indexes() {
  static std::optional<std::string> path;
  static std::vector<Index> all;
  const std::string now = search_path();
  if (path != now) {
    all = read_indexes();
    path = now;
  }
  return all;
}

}  // namespace

std::string key(const ir::Schedule& built, const compiler::CompileOptions& o) {
  std::string k = ir::fingerprint(built);
  k += "\n//options " + compiler::options_json(o);
  k += "\n//templates " + jit::templates_hash();
  k += "\n//mkernel " MK_VERSION;
  k += "\n//prebuilt";
  return jit::hash_hex(k);
}

std::shared_ptr<const plan::Plan> find(const std::string& k, const ir::Schedule& built,
                                       const compiler::CompileOptions& o) {
  std::lock_guard<std::mutex> lock(mutex());
  static std::map<std::string, std::shared_ptr<const plan::Plan>> loaded;  // by plan directory
  for (const Index& ix : indexes()) {
    auto it = ix.keys.find(k);
    if (it == ix.keys.end()) continue;
    const std::string dir = (fs::path(ix.dir) / it->second).string();
    auto& p = loaded[dir];
    if (!p) {
      try {
        // A link in place of a plan directory would leave the tree.
        if (std::string why = tfs::entry_problem(dir); !why.empty())
          throw Error(ErrId::plan_E007, dir + " is " + why);
        auto read = std::make_shared<const plan::Plan>(plan::read_dir(dir));
        plan::check_version(*read, dir);
        p = std::move(read);
      } catch (const Error& e) {
        note(dir + " is not used: " + e.what());
        loaded.erase(dir);
        continue;
      }
    }
    if (p->schedule != built.name || p->nranks != built.nranks || p->dtype != o.dtype || p->op != o.op ||
        p->arch != o.arch || p->coll != built.coll || p->zero_copy != o.lower.zero_copy ||
        (o.rank >= 0 ? !plan::serves(*p, o.rank) : !p->serves.empty()) ||
        std::any_of(p->kernels.begin(), p->kernels.end(), [&](const plan::Kernel& k) {
          return o.lower.proto.max_grid > 0 && k.grid > o.lower.proto.max_grid;
        })) {
      note(dir + " does not match the plan its key names; not used");
      continue;
    }
    note("using " + dir);
    return p;
  }
  return nullptr;
}

std::string search_path() {
  std::string s;
  for (const auto& d : dirs()) s += (s.empty() ? "" : ":") + d;
  return s;
}

Writer::Writer(std::string dir) : dir_(std::move(dir)) {}

void Writer::add(const std::string& k, const plan::Plan& p) {
  plan::Plan copy = p;
  std::string all = plan::to_json(copy);
  for (auto& kn : copy.kernels) {
    all += std::string(kn.cubin.begin(), kn.cubin.end());
    kn.source_file.clear();  // shipped without sources (mkc compile writes them)
    kn.source.clear();
  }
  const std::string rel = fmt::format("{}_n{}_{}_{}_sm{}_{}", copy.schedule, copy.nranks, name(copy.dtype),
                                      name(copy.op), copy.arch, jit::hash_hex(all).substr(0, 12));
  std::lock_guard<std::mutex> lock(*mu_);
  keys_[k] = rel;
  std::error_code ec;
  if (!fs::exists(fs::path(dir_) / rel / "plan.json", ec)) plan::write_dir(copy, (fs::path(dir_) / rel).string());
}

std::pair<size_t, size_t> Writer::finish() {
  std::lock_guard<std::mutex> lock(*mu_);
  const fs::path f = fs::path(dir_) / "index.json";
  json j = {{"format", 1}, {"mkernel", MK_VERSION}, {"plans", json::object()}};
  std::error_code ec;
  if (fs::is_regular_file(f, ec)) {
    try {
      std::ifstream in(f);
      json old = json::parse(in);
      if (old.value("format", 0) == 1 && old.contains("plans")) j["plans"] = old["plans"];
    } catch (const std::exception&) {
    }
  }
  for (const auto& [k, rel] : keys_) j["plans"][k] = rel;
  std::map<std::string, int> distinct;
  for (const auto& [k, rel] : j["plans"].items()) distinct[rel.get<std::string>()]++;
  std::string why = tfs::make_dir(dir_, 0755);
  if (why.empty()) why = tfs::write_file(f, j.dump(1) + "\n", 0644);
  if (!why.empty()) throw Error(ErrId::cli_E012, why, {}, "pick a writable output directory");
  return {j["plans"].size(), distinct.size()};
}

}  // namespace mk::prebuilt
