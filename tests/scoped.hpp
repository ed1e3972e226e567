// Scoped test state shared by the unit and runtime test binaries: a fresh
// directory removed at scope exit, an environment variable set (or unset)
// for a scope and restored after, also when an assertion throws.
#pragma once

#include <doctest/doctest.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

namespace mkt {

// A fresh directory, removed at scope exit.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag = "mkt") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (tag + ".XXXXXX")).string();
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    char* d = ::mkdtemp(buf.data());
    REQUIRE(d != nullptr);
    path = d;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string str() const { return path.string(); }
  std::filesystem::path operator/(const std::string& s) const { return path / s; }
};

// Sets an environment variable for the scope (a null value: unset for the
// scope); restores the old value, or its absence, after.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> old;
  ScopedEnv(std::string n, const char* value) : name(std::move(n)) {
    if (const char* v = std::getenv(name.c_str())) old = v;
    if (value)
      ::setenv(name.c_str(), value, 1);
    else
      ::unsetenv(name.c_str());
  }
  ScopedEnv(std::string n, const std::string& value) : ScopedEnv(std::move(n), value.c_str()) {}
  ~ScopedEnv() {
    if (old)
      ::setenv(name.c_str(), old->c_str(), 1);
    else
      ::unsetenv(name.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
};

}  // namespace mkt
