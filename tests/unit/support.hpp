// Helpers shared by the unit tests: catching mk::Error, golden files, temporary
// directories, running the mkc binary as a child process.
//
// Golden files live in tests/golden/. A mismatch fails the test and writes the
// actual text next to a temp copy for diffing; MK_UPDATE_GOLDEN=1 rewrites the
// golden files instead (see tests/README.md).
#pragma once

#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "compiler/jit/jit.hpp"
#include "mk/error.hpp"
#include "tests/scoped.hpp"

namespace mkt {

// Whether NVRTC loads here (tests that compile kernels skip visibly without it).
inline bool have_nvrtc() { return mk::jit::nvrtc_version() > 0; }

namespace fs = std::filesystem;

inline bool contains(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

inline std::string test_dir() { return MK_TEST_DIR; }
inline std::string mkc_path() { return MK_MKC; }

inline std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return {};
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline void write_text(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream f(p, std::ios::binary);
  f << text;
}

// The 1-based line of the first line of `file` containing `marker` (0 if none).
inline int line_of(const fs::path& file, const std::string& marker) {
  std::ifstream f(file);
  std::string line;
  for (int n = 1; std::getline(f, line); ++n)
    if (contains(line, marker)) return n;
  return 0;
}

// One MK_CACHE_DIR per test process, for the tests that compile (NVRTC
// cubins, user plugins): shared so that a fixture compiled by one test is
// reused by the next, fresh so that nothing from an earlier run leaks in.
// Removed at exit. (The path lives on the heap and is never destroyed, so the
// exit handler can still read it after static destructors ran.)
inline std::string*& process_cache_dir_slot() {
  static std::string* p = nullptr;
  return p;
}
inline const std::string& process_cache_dir() {
  std::string*& p = process_cache_dir_slot();
  if (!p) {
    std::string tmpl = (fs::temp_directory_path() / "mkt-cache.XXXXXX").string();
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    REQUIRE(::mkdtemp(buf.data()) != nullptr);
    p = new std::string(buf.data());
    std::atexit([] {
      std::error_code ec;
      if (std::string* dir = process_cache_dir_slot()) fs::remove_all(*dir, ec);
    });
  }
  return *p;
}

// What a thrown mk::Error (or anything else) looked like.
struct Caught {
  std::string id;    // "mk.verify.E001"; "" when nothing was thrown
  std::string what;  // the rendered message
  std::string message;
  mk::SrcLoc loc;
  bool internal = false;  // mk::InternalError or another exception type
  explicit operator bool() const { return !id.empty(); }
};

inline Caught catch_error(const std::function<void()>& f) {
  Caught c;
  try {
    f();
  } catch (const mk::Error& e) {
    c.id = mk::err_name(e.id());
    c.what = e.what();
    c.message = e.message();
    c.loc = e.loc();
  } catch (const mk::InternalError& e) {
    c.id = "internal";
    c.what = e.what();
    c.internal = true;
  } catch (const std::exception& e) {
    c.id = "std::exception";
    c.what = e.what();
    c.internal = true;
  }
  return c;
}

// Compares `actual` with tests/golden/<name>. MK_UPDATE_GOLDEN=1 rewrites it.
inline void check_golden(const std::string& name, const std::string& actual) {
  const fs::path golden = fs::path(test_dir()) / "golden" / name;
  const char* upd = std::getenv("MK_UPDATE_GOLDEN");
  if (upd && std::string(upd) == "1") {
    write_text(golden, actual);
    MESSAGE("golden file rewritten: " << golden.string());
    return;
  }
  if (!fs::exists(golden)) {
    FAIL_CHECK("golden file " << golden.string()
                              << " is missing; create it with MK_UPDATE_GOLDEN=1 (and review it)");
    return;
  }
  const std::string expected = read_text(golden);
  if (expected == actual) {
    CHECK(true);
    return;
  }
  // Report the first differing line and leave the actual text for diffing.
  std::istringstream a(expected), b(actual);
  std::string la, lb;
  int line = 1;
  while (true) {
    bool ga = bool(std::getline(a, la)), gb = bool(std::getline(b, lb));
    if (!ga && !gb) break;
    if (!ga) la = "<end of file>";
    if (!gb) lb = "<end of file>";
    if (la != lb || !ga || !gb) break;
    ++line;
  }
  const fs::path actual_file = fs::temp_directory_path() / "mk-golden-actual" / name;
  write_text(actual_file, actual);
  FAIL_CHECK("output differs from golden " << golden.string() << " at line " << line << ":\n  golden: " << la
                                           << "\n  actual: " << lb << "\nfull output: " << actual_file.string()
                                           << " (diff it; MK_UPDATE_GOLDEN=1 accepts it)");
}

// ---- running mkc ------------------------------------------------------------

struct RunResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;      // the signal that killed it, 0 if none
  bool timed_out = false;
  std::string out, err;
};

inline std::ostream& operator<<(std::ostream& os, const RunResult& r) {
  return os << "exit " << r.exit_code << " signal " << r.signal << (r.timed_out ? " (timed out)" : "")
            << "\n--- stdout ---\n"
            << r.out.substr(0, 4000) << "\n--- stderr ---\n"
            << r.err.substr(0, 4000);
}

// Runs `argv` (argv[0] is the program path) with stdout/stderr captured.
// `env` entries are added to the child's environment. Kills it after
// `timeout_s` seconds (a hang is a bug, and must not hang the suite).
inline RunResult run_process(const std::vector<std::string>& argv,
                             const std::vector<std::pair<std::string, std::string>>& env = {},
                             int timeout_s = 180) {
  TempDir io("mkt-run");
  const std::string out_f = (io / "out").string(), err_f = (io / "err").string();
  RunResult r;
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int fo = ::open(out_f.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int fe = ::open(err_f.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int fi = ::open("/dev/null", O_RDONLY);
    if (fo < 0 || fe < 0 || fi < 0) ::_exit(126);
    ::dup2(fi, 0);
    ::dup2(fo, 1);
    ::dup2(fe, 2);
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  int status = 0;
  auto t0 = std::chrono::steady_clock::now();
  while (true) {
    pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(timeout_s)) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      r.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  r.out = read_text(out_f);
  r.err = read_text(err_f);
  return r;
}

// Runs mkc with the given arguments, in the process-wide cache directory.
inline RunResult mkc(std::vector<std::string> args, std::vector<std::pair<std::string, std::string>> env = {}) {
  args.insert(args.begin(), mkc_path());
  bool has_cache = false;
  for (auto& [k, v] : env) has_cache = has_cache || k == "MK_CACHE_DIR";
  if (!has_cache) env.push_back({"MK_CACHE_DIR", process_cache_dir()});
  return run_process(args, env);
}

// A user error from mkc: exit code 1, the id in stderr, no crash.
#define MKT_CHECK_USER_ERROR(result, ID)                                          \
  do {                                                                            \
    const ::mkt::RunResult& r_ = (result);                                        \
    INFO(r_);                                                                     \
    CHECK(r_.signal == 0);                                                        \
    CHECK(!r_.timed_out);                                                         \
    CHECK(r_.exit_code == 1);                                                     \
    CHECK(::mkt::contains(r_.err, "mkc: error: [" ID "]"));                       \
  } while (0)

// The id of the mk::Error `f` throws (and its text in *what); fails the test
// when it throws none.
inline mk::ErrId error_id(const std::function<void()>& f, std::string* what = nullptr) {
  try {
    f();
  } catch (const mk::Error& e) {
    if (what) *what = e.what();
    return e.id();
  }
  FAIL("no mk::Error thrown");
  return mk::ErrId::count_;
}

}  // namespace mkt
