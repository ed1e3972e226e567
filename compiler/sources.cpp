#include "compiler/sources.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "compiler/importers/importers.hpp"
#include "compiler/ir/ir.hpp"
#include "compiler/jit/jit.hpp"
#include "compiler/plugin.hpp"
#include "mk/dsl.hpp"
#include "mk/error.hpp"

namespace mk::sources {
namespace fs = std::filesystem;

namespace {

constexpr int64_t kMaxFileBytes = int64_t(64) << 20;  // an algorithm file; the importers bound the rest

std::mutex& user_mutex() {
  static std::mutex m;
  return m;
}
std::set<std::string>& user_names() {
  static std::set<std::string> s;
  return s;
}

// Every schedule registered after `seq` came from a user file.
void mark_user_after(int64_t seq) {
  std::lock_guard<std::mutex> lock(user_mutex());
  for (const auto& s : plugin::registered_after(seq)) user_names().insert(s.name);
}

std::string read_bounded(const std::string& path) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) throw Error(ErrId::cli_E009, fmt::format("cannot read schedule file '{}': {}", path, ec.message()));
  if (int64_t(size) > kMaxFileBytes)
    throw Error(ErrId::cli_E009, fmt::format("schedule file '{}' is {} bytes; at most {} are read", path, size,
                                             kMaxFileBytes));
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(ErrId::cli_E009, fmt::format("cannot read schedule file '{}'", path));
  std::string text(size_t(size), '\0');
  f.read(text.data(), std::streamsize(size));
  if (f.gcount() != std::streamsize(size))
    throw Error(ErrId::cli_E009, fmt::format("schedule file '{}' changed while it was read", path));
  return text;
}

// What a name= prefix or a file's algorithm name becomes: invalid characters
// replaced, a leading digit or symbol prefixed.
std::string sanitize(const std::string& raw) {
  std::string out;
  for (char c : raw.substr(0, 96))
    out += (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-') ? c : '_';
  if (out.empty() || !std::isalpha(static_cast<unsigned char>(out[0]))) out = ("user_" + out).substr(0, 96);
  return out;
}

[[noreturn]] void taken(const std::string& name, const std::string& path) {
  const dsl::ScheduleInfo* other = dsl::find_schedule(name);
  throw Error(ErrId::cli_E014,
              fmt::format("schedule '{}' from '{}' is already a schedule (registered at {}:{})", name, path,
                          other ? other->file : "?", other ? other->line : 0),
              {},
              "give yours another name (for an imported file: NAME=PATH in the list) and select it with "
              "MK_ALGO or MK_SELECT_FILE; user schedules never replace built-in ones");
}

Source load_dsl(const std::string& path, bool source) {
  Source s;
  s.path = path;
  s.kind = source ? "dsl-source" : "plugin";
  s.digest = jit::hash_hex(read_bounded(path));
  std::vector<dsl::ScheduleInfo> found;
  dsl::RefuseReplacement guard;
  const int64_t before = plugin::current_seq();
  try {
    found = source ? plugin::load_source(path) : plugin::load_library(path);
  } catch (const Error&) {
    mark_user_after(before);
    // a file whose every schedule was refused registered nothing ("defines no schedule")
    if (!guard.refused.empty()) taken(guard.refused.front(), path);
    throw;
  }
  mark_user_after(before);
  if (!guard.refused.empty()) taken(guard.refused.front(), path);
  for (const auto& info : found) {
    if (!valid_name(info.name))
      throw Error(ErrId::cli_E014,
                  fmt::format("'{}' registers a schedule named '{}': names are 1-96 characters of letters, digits, "
                              "'_', '.' and '-', starting with a letter",
                              path, info.name));
    s.schedules.push_back(info.name);
  }
  return s;
}

Source load_imported(const std::string& path, const std::string& given_name) {
  Source s;
  s.path = path;
  const std::string text = read_bounded(path);
  s.digest = jit::hash_hex(text);
  importers::ImportInfo info;
  auto ir = std::make_shared<ir::Schedule>(importers::import_text(text, path, &info));
  s.kind = info.format;
  std::string chosen = given_name;
  if (chosen.empty()) chosen = sanitize(info.name.empty() ? fs::path(path).stem().string() : info.name);
  if (dsl::find_schedule(chosen)) taken(chosen, path);
  if (ir->root != 0)
    throw Error(ErrId::dsl_E008,
                fmt::format("'{}' is a {} with root {}; the runtime serves every root from a root-0 schedule", path,
                            name(ir->coll), ir->root),
                {}, "export the algorithm with root 0");
  ir->name = chosen;
  dsl::ScheduleInfo reg;
  reg.name = chosen;
  reg.coll = ir->coll;
  reg.doc = fmt::format("{} for {} ranks, imported from {}", info.format, ir->nranks, path);
  reg.file = path;
  reg.line = 1;
  reg.imported = std::move(ir);
  dsl::RefuseReplacement guard;
  const int64_t before = plugin::current_seq();
  dsl::register_schedule(reg);
  mark_user_after(before);
  if (!guard.refused.empty()) taken(chosen, path);
  s.schedules.push_back(chosen);
  return s;
}

}  // namespace

bool is_user_schedule(const std::string& name) {
  std::lock_guard<std::mutex> lock(user_mutex());
  return user_names().count(name) != 0;
}

bool valid_name(const std::string& name) {
  if (name.empty() || name.size() > 96 || !std::isalpha(static_cast<unsigned char>(name[0]))) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
  });
}

std::vector<Source> load(const std::string& list) {
  static std::mutex mu;  // one loader at a time: the registry checks below are not atomic with the loads
  static std::map<std::string, Source> loaded;  // by canonical path and given name
  // A file that failed fails the same way when asked again (a plugin is
  // loaded once: loading it again would register nothing and say so).
  static std::map<std::string, Error> failed;
  std::lock_guard<std::mutex> lock(mu);
  std::vector<Source> out;
  size_t at = 0;
  while (at <= list.size()) {
    size_t end = list.find(':', at);
    if (end == std::string::npos) end = list.size();
    std::string entry = list.substr(at, end - at);
    at = end + 1;
    if (entry.empty()) continue;
    std::string given;
    if (const size_t eq = entry.find('='); eq != std::string::npos && entry.find('/') > eq) {
      given = entry.substr(0, eq);
      entry = entry.substr(eq + 1);
      if (!valid_name(given))
        throw Error(ErrId::cli_E014, fmt::format("'{}' (before '=' in the schedule list) is not a valid name", given),
                    {}, "names are 1-96 characters of letters, digits, '_', '.' and '-', starting with a letter");
    }
    std::error_code ec;
    if (!fs::is_regular_file(entry, ec))
      throw Error(ErrId::cli_E009, fmt::format("schedule file '{}' does not exist or is not a file", entry), {},
                  "the list holds paths separated by ':' (.cpp DSL files, .so plugins, .xml or .json algorithms)");
    const std::string key = fs::weakly_canonical(entry, ec).string() + "|" + given;
    if (auto it = loaded.find(key); it != loaded.end()) {
      out.push_back(it->second);
      continue;
    }
    if (auto it = failed.find(key); it != failed.end()) throw it->second;
    Source s;
    try {
      if (plugin::is_dsl_source(entry)) {
        if (!given.empty())
          throw Error(ErrId::cli_E014, fmt::format("'{}={}': a DSL file names its schedules itself", given, entry), {},
                      "drop the NAME= prefix; MK_SCHEDULE(\"name\", ...) in the file names each schedule");
        s = load_dsl(entry, true);
      } else if (fs::path(entry).extension() == ".so") {
        if (!given.empty())
          throw Error(ErrId::cli_E014, fmt::format("'{}={}': a plugin names its schedules itself", given, entry));
        s = load_dsl(entry, false);
      } else {
        s = load_imported(entry, given);
      }
    } catch (const Error& e) {
      failed.emplace(key, e);
      throw;
    }
    s.path = entry;
    loaded[key] = s;
    out.push_back(std::move(s));
  }
  return out;
}

std::string describe(const std::vector<Source>& sources) {
  std::vector<std::string> items;
  for (const Source& s : sources)
    for (const std::string& n : s.schedules) items.push_back(n + "@" + s.digest);
  std::sort(items.begin(), items.end());
  items.erase(std::unique(items.begin(), items.end()), items.end());
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : ",") + i;
  return out;
}

}  // namespace mk::sources
