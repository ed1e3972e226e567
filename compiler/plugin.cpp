#include "compiler/plugin.hpp"

#include <dlfcn.h>
#include <fmt/format.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <map>
#include <mutex>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/stat.h>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "compiler/common/env_parse.hpp"
#include "compiler/common/log.hpp"
#include "compiler/common/trusted_fs.hpp"
#include "compiler/jit/jit.hpp"
#include "mk/composite.hpp"
#include "mk/fusion.hpp"

namespace mk::plugin {
namespace fs = std::filesystem;

namespace {

std::string library_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&include_dir), &info) && info.dli_fname) return info.dli_fname;
  return {};
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// How long a schedule file may take to compile (MK_PLUGIN_TIMEOUT_S: whole
// seconds, 1..86400, default 300): it runs inside communicator init, which
// must not hang. Strict (env_parse.hpp): " 0x8", "0x1p3" or "0.0001" (which
// strtod read as hex 8 s, or as 0 ms) are errors, not some other limit.
int64_t compile_timeout_ms() {
  const char* e = std::getenv("MK_PLUGIN_TIMEOUT_S");
  if (!e || !*e) return 300'000;
  int64_t s = 0;
  if (!env_parse::parse_int(e, 1, 86400, &s))
    throw Error(ErrId::cli_E006,
                fmt::format("MK_PLUGIN_TIMEOUT_S='{}': expected whole seconds, an integer in 1..86400 (unset: 300)", e),
                {}, "set MK_PLUGIN_TIMEOUT_S to a plain number of seconds such as 600, or unset it");
  return s * 1000;
}

constexpr int kTimedOut = -2;

// Runs `cmd` with /bin/sh, its output (stdout and stderr) into *output; the
// exit status, -1 when it did not exit normally, kTimedOut when it ran past
// `timeout_ms` (then its whole process group is killed).
int run(const std::string& cmd, std::string* output, int64_t timeout_ms) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return -1;
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return -1;
  }
  if (pid == 0) {  // only async-signal-safe calls until exec
    setpgid(0, 0);
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  setpgid(pid, pid);  // also here: no window in which a kill misses it
  close(fds[1]);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  std::array<char, 4096> buf;
  bool timed_out = false;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd pf{fds[0], POLLIN, 0};
    const int r = poll(&pf, 1, int(std::min<int64_t>(left.count(), 1000)));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    const ssize_t n = read(fds[0], buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // every writer closed: the command is done (or closed its output)
    output->append(buf.data(), size_t(n));
  }
  close(fds[0]);
  if (timed_out) kill(-pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) return kTimedOut;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string read_all(const fs::path& p, bool* ok) {
  std::ifstream f(p, std::ios::binary);
  *ok = bool(f);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// The files of a make-style dependency list as the compiler writes it with
// -MD -MF (`target: a.cpp b.hpp \<newline> c.hpp`, spaces in names as `\ `),
// made absolute against the directory the compiler ran in.
std::vector<std::string> parse_depfile(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  bool after_colon = false;
  auto flush = [&] {
    if (!cur.empty() && after_colon) out.push_back(fs::absolute(cur).lexically_normal().string());
    cur.clear();
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\\' && i + 1 < text.size() && (text[i + 1] == '\n' || text[i + 1] == '\r')) {
      flush();
      ++i;
    } else if (c == '\\' && i + 1 < text.size() && (text[i + 1] == ' ' || text[i + 1] == '#')) {
      cur += text[++i];
    } else if (c == '$' && i + 1 < text.size() && text[i + 1] == '$') {
      cur += text[++i];
    } else if (c == ':' && !after_colon && (i + 1 == text.size() || std::isspace(static_cast<unsigned char>(text[i + 1])))) {
      cur.clear();  // the target
      after_colon = true;
    } else if (std::isspace(static_cast<unsigned char>(c))) {
      flush();
      if (c == '\n' && after_colon) break;  // only the first rule (no -MP phony targets)
    } else {
      cur += c;
    }
  }
  flush();
  return out;
}

// A hash over every listed file's path and content; "" when one is missing
// (the cached plugin then cannot be trusted to match).
std::string deps_hash(const std::vector<std::string>& files) {
  std::string all;
  for (const auto& f : files) {
    bool ok = false;
    std::string text = read_all(f, &ok);
    if (!ok) return {};
    all += f + '\0' + jit::hash_hex(text) + '\n';
  }
  return jit::hash_hex(all);
}

// `text` from a file of the cache, "" (and *ok false) unless the trust
// policy passes it (compiler/common/trusted_fs.hpp).
std::string read_cached(const fs::path& p, bool* ok) {
  std::vector<char> bytes;
  std::string why;
  *ok = tfs::read_file(p, 64u << 20, &bytes, &why) == tfs::Read::ok;
  if (!*ok && fs::exists(fs::symlink_status(p))) debug_log("plugin cache: " + p.string() + " is not used: " + why);
  return *ok ? std::string(bytes.begin(), bytes.end()) : std::string();
}

// The content hash of the regular file `so` as the checked descriptor reads
// it, "" (with *why) if the policy refuses it.
std::string checked_hash(const fs::path& so, std::string* why) {
  std::vector<char> bytes;
  if (tfs::read_file(so, size_t(1) << 31, &bytes, why) != tfs::Read::ok) return {};
  return jit::hash_hex(std::string(bytes.begin(), bytes.end()));
}

}  // namespace

std::vector<dsl::ScheduleInfo> registered_after(int64_t seq) {
  std::vector<dsl::ScheduleInfo> out;
  for (auto& s : dsl::registered_schedules())
    if (s.seq > seq) out.push_back(s);
  return out;
}

int64_t current_seq() {
  int64_t m = 0;
  for (auto& s : dsl::registered_schedules()) m = std::max(m, s.seq);
  return m;
}

bool is_dsl_source(const std::string& path) {
  std::string ext = fs::path(path).extension().string();
  for (auto& c : ext) c = char(std::tolower(static_cast<unsigned char>(c)));
  return ext == ".cpp" || ext == ".cc" || ext == ".cxx";
}

std::string include_dir() {
  std::vector<std::string> cands;
  // Set, it is the only place looked at (as MK_NVRTC_PATH): a wrong value is
  // an error, never a silent fall back to other headers.
  if (const char* e = std::getenv("MK_INCLUDE_DIR"); e && *e) {
    if (!fs::exists(fs::path(e) / "mk" / "dsl.hpp"))
      throw Error(ErrId::cli_E006, fmt::format("MK_INCLUDE_DIR='{}' does not hold mk/dsl.hpp", e), {},
                  "point MK_INCLUDE_DIR at the directory that holds mk/dsl.hpp (an install's include/), or unset it");
    return fs::weakly_canonical(e).string();
  }
  std::string lib = library_path();
  if (!lib.empty()) {
    fs::path d = fs::path(lib).parent_path();
    cands.push_back((d / ".." / "include").string());
  }
#ifdef MK_SOURCE_INCLUDE_DIR
  cands.push_back(MK_SOURCE_INCLUDE_DIR);
#endif
#ifdef MK_INSTALL_INCLUDE_DIR
  cands.push_back(MK_INSTALL_INCLUDE_DIR);
#endif
  for (const auto& c : cands)
    if (fs::exists(fs::path(c) / "mk" / "dsl.hpp")) return fs::weakly_canonical(c).string();
  return {};
}

std::vector<dsl::ScheduleInfo> load_library(const std::string& so_file) {
  if (!fs::exists(so_file)) throw Error(ErrId::cli_E009, "no such plugin: " + so_file);
  // A library runs its constructors when loaded: only one nobody else could
  // have written (trusted_fs.hpp: the file and every directory above it),
  // loaded by the path checked (a link in the name could move meanwhile).
  std::error_code ec;
  const fs::path real = fs::canonical(so_file, ec);
  std::string why = ec ? ec.message() : "";
  const tfs::Read r = ec ? tfs::Read::failed : tfs::check_file_in_tree(real, 0, nullptr, &why);
  if (r != tfs::Read::ok)
    throw Error(ErrId::cli_E006, fmt::format("plugin {} is not loaded: {}", so_file, why), {},
                r == tfs::Read::untrusted ? "a plugin is code that runs in this process: keep it in a file and "
                                            "directory only you (or root) can write"
                                          : "");
  // dlopen of an already loaded library runs no initialisers again: remember.
  static std::mutex mu;
  static std::map<std::string, std::vector<dsl::ScheduleInfo>> loaded;
  std::lock_guard<std::mutex> lock(mu);
  const std::string key = real.string();
  if (auto it = loaded.find(key); it != loaded.end()) return it->second;
  int64_t before = current_seq();
  const int64_t composites_before = dsl::composite_registrations();
  const size_t fusions_before = dsl::fusion_registrations();
  void* h = dlopen(real.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (!h) throw Error(ErrId::cli_E006, fmt::format("cannot load plugin {}: {}", so_file, dlerror()));
  auto found = registered_after(before);
  const std::vector<std::string> fusions = dsl::fusions_registered_since(fusions_before);
  if (found.empty() && dsl::composite_registrations() == composites_before && fusions.empty())
    throw Error(ErrId::cli_E007, so_file + " defines no schedule", {},
                "register one with MK_SCHEDULE(\"name\", collective, builder, \"description\") (or a composite "
                "with MK_COMPOSITE, a fusion with MK_FUSION)");
  loaded[key] = found;
  // Its fusions are user device code: checked on the CPU now, at load, as
  // find_fusion would before their first use (verify/fusion_check.hpp). The
  // verdict is kept: a refused fusion is refused where it is asked for (its
  // error, every time), while the file's other schedules and fusions serve.
  for (const std::string& name : fusions) try {
      (void)dsl::find_fusion(name);
    } catch (const Error& e) {
      debug_log(fmt::format("{}: fusion {} is refused: {}", so_file, name, e.what()));
    }
  return found;
}

std::vector<dsl::ScheduleInfo> load_source(const std::string& cpp_file) {
  // A schedule file becomes code in this process: the same policy as a
  // plugin library (trusted_fs.hpp), for the file and the directories above.
  std::string text;
  {
    std::error_code ec;
    const fs::path real = fs::canonical(cpp_file, ec);
    if (ec) throw Error(ErrId::cli_E009, "cannot read " + cpp_file + ": " + ec.message());
    std::vector<char> bytes;
    std::string why;
    const tfs::Read r = tfs::check_file_in_tree(real, size_t(64) << 20, &bytes, &why);
    if (r == tfs::Read::untrusted)
      throw Error(ErrId::cli_E006, fmt::format("schedule file {} is not compiled: {}", cpp_file, why), {},
                  "a schedule file becomes code that runs in this process: keep it in a file and directory only "
                  "you (or root) can write");
    if (r != tfs::Read::ok) throw Error(ErrId::cli_E009, "cannot read " + cpp_file + ": " + why);
    text.assign(bytes.begin(), bytes.end());
  }
  const std::string inc = include_dir();
  if (inc.empty())
    throw Error(ErrId::cli_E006, "cannot find the mKernel DSL headers (mk/dsl.hpp)", {},
                "set MK_INCLUDE_DIR to the directory that holds mk/dsl.hpp");
  const std::string lib = library_path();
  const char* cxx_env = std::getenv("MK_CXX");
  const std::string cxx = cxx_env && *cxx_env ? cxx_env : "c++";
  const std::string abs = fs::absolute(cpp_file).string();
  const std::string key = jit::hash_hex(text + "\n" + abs + "\n" + inc + "\n" + lib + "\n" + cxx);
  // A plugin is loaded as it is found: only a private cache may hold it.
  std::string why;
  ErrId id{};
  const std::string cache = jit::private_cache_dir(&why, &id);
  if (cache.empty())
    throw Error(id, "cannot compile " + cpp_file + " into a plugin: " + why, {},
                "set MK_CACHE_DIR to a writable directory only you can write");
  fs::path dir = fs::path(cache) / "plugins";
  std::error_code ec;
  if (std::string why = tfs::make_private_dir(dir); !why.empty())
    throw Error(ErrId::jit_E004, "cannot keep compiled schedules in " + dir.string() + ": " + why, {},
                "set MK_CACHE_DIR to a writable directory only you can write");
  // The key covers the .cpp; every other file the compiler read (local
  // headers, the DSL headers, the standard library) is listed in key.deps as
  // the compiler reported it, and the plugin is stored under a hash of all
  // their contents: a changed header finds no plugin and compiles afresh.
  const fs::path deps_file = dir / (key + ".deps");
  fs::path so;
  {
    bool ok = false;
    std::string listed = read_cached(deps_file, &ok);
    if (ok) {
      std::vector<std::string> files;
      std::istringstream in(listed);
      for (std::string line; std::getline(in, line);)
        if (!line.empty()) files.push_back(line);
      const std::string h = deps_hash(files);
      const fs::path cand = dir / (key + "-" + h + ".so");
      // Loaded only if it is the library this cache stored: ours, private,
      // and its bytes hash to what was recorded beside it when it was built.
      bool sum_ok = false;
      const std::string recorded = h.empty() ? "" : read_cached(fs::path(cand.string() + ".sum"), &sum_ok);
      std::string why;
      if (sum_ok && fs::exists(fs::symlink_status(cand, ec))) {
        if (checked_hash(cand, &why) == recorded) {
          so = cand;
        } else {
          debug_log(fmt::format("plugin cache: dropping {}: {}", cand.string(),
                                why.empty() ? "its bytes do not match the recorded hash" : why));
          fs::remove(cand, ec);
        }
      }
    }
  }
  if (so.empty()) {
    fs::path tmp = dir / fmt::format("{}.{}.tmp.so", key, ::getpid());
    fs::path dep = dir / fmt::format("{}.{}.tmp.d", key, ::getpid());
    std::string cmd = fmt::format("{} -std=c++20 -O1 -shared -fPIC -MD -MT mk_plugin -MF {} -I{} {} -o {}", cxx,
                                  shell_quote(dep.string()), shell_quote(inc), shell_quote(abs),
                                  shell_quote(tmp.string()));
    if (!lib.empty())
      cmd += fmt::format(" {} -Wl,-rpath,{}", shell_quote(lib), shell_quote(fs::path(lib).parent_path().string()));
    std::string out;
    const int64_t limit_ms = compile_timeout_ms();
    int rc = run(cmd, &out, limit_ms);
    bool dep_ok = false;
    const std::vector<std::string> files = parse_depfile(read_all(dep, &dep_ok));
    fs::remove(dep, ec);
    if (rc == kTimedOut) {
      fs::remove(tmp, ec);
      throw Error(ErrId::cli_E006,
                  fmt::format("compiling {} took longer than {} s; the compiler ({}) was stopped", cpp_file,
                              double(limit_ms) / 1000, cxx),
                  {}, "raise MK_PLUGIN_TIMEOUT_S, or compile the file once beforehand (`mkc list` with MK_SCHEDULES "
                      "set caches the plugin) and pass the .so");
    }
    if (rc != 0) {
      fs::remove(tmp, ec);
      throw Error(ErrId::cli_E006, fmt::format("{} does not compile:\n{}", cpp_file, out), {},
                  "fix the errors above (file:line points into your schedule)");
    }
    std::string h = dep_ok && !files.empty() ? deps_hash(files) : "";
    if (h.empty()) h = "nodeps-" + std::to_string(::getpid());  // never found again: compiled every time
    so = dir / (key + "-" + h + ".so");
    // The compiler created it with the umask's mode: make it ours alone
    // before it gets its name, and record what it holds.
    if (::chmod(tmp.c_str(), 0700) != 0) {
      fs::remove(tmp, ec);
      throw Error(ErrId::jit_E004, "cannot chmod " + tmp.string() + ": " + std::strerror(errno));
    }
    std::string why;
    const std::string sum = checked_hash(tmp, &why);
    fs::rename(tmp, so, ec);
    if (ec) throw Error(ErrId::jit_E004, "cannot store plugin in " + dir.string() + ": " + ec.message());
    std::string listed;
    for (const auto& f : files) listed += f + "\n";
    // A cache: failing to write these only costs a compile next time.
    if (dep_ok && !files.empty() && !sum.empty() && tfs::write_private(fs::path(so.string() + ".sum"), sum).empty())
      (void)tfs::write_private(deps_file, listed);
  }
  try {
    return load_library(so.string());
  } catch (const Error& e) {
    if (e.id() == ErrId::cli_E007)
      throw Error(ErrId::cli_E007, cpp_file + " defines no schedule", {},
                  "register one with MK_SCHEDULE(\"name\", collective, builder, \"description\") (or a composite "
                  "with MK_COMPOSITE)");
    throw;
  }
}

}  // namespace mk::plugin
