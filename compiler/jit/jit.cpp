#include "compiler/jit/jit.hpp"

#include <dlfcn.h>
#include <fmt/format.h>
#include <nvrtc.h>
#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "compiler/codegen/codegen.hpp"
#include "compiler/common/cubin.hpp"
#include "compiler/common/hash.hpp"
#include "compiler/common/log.hpp"
#include "compiler/common/trusted_fs.hpp"
#include "mk/error.hpp"

namespace mk::jit {
namespace fs = std::filesystem;

namespace {

struct Nvrtc {
  void* handle = nullptr;
  std::string where;
  bool forced = false;  // MK_NVRTC_PATH named it
  decltype(&::nvrtcVersion) version = nullptr;
  decltype(&::nvrtcGetNumSupportedArchs) num_archs = nullptr;
  decltype(&::nvrtcGetSupportedArchs) archs = nullptr;
  decltype(&::nvrtcCreateProgram) create = nullptr;
  decltype(&::nvrtcCompileProgram) compile = nullptr;
  decltype(&::nvrtcGetProgramLogSize) log_size = nullptr;
  decltype(&::nvrtcGetProgramLog) log = nullptr;
  decltype(&::nvrtcGetCUBINSize) cubin_size = nullptr;
  decltype(&::nvrtcGetCUBIN) cubin = nullptr;
  decltype(&::nvrtcDestroyProgram) destroy = nullptr;
  decltype(&::nvrtcGetErrorString) error_string = nullptr;
};

// MK_NVRTC_PATH, or nullptr when it is unset or empty.
const char* forced_nvrtc() {
  const char* p = std::getenv("MK_NVRTC_PATH");
  return p && *p ? p : nullptr;
}

// MK_NVRTC_PATH alone when it is set: a library the user named that does not
// load is an error (lib() says why), never a silent fall back to another
// NVRTC. Otherwise absolute paths first (so nvrtc_identity() can name the
// library without loading it), then bare names for the dynamic loader.
std::vector<std::string> nvrtc_candidates() {
  if (const char* p = forced_nvrtc()) return {p};
  std::vector<std::string> c;
  std::vector<std::string> dirs;
  if (const char* l = std::getenv("LD_LIBRARY_PATH")) {
    std::stringstream ss(l);
    std::string d;
    while (std::getline(ss, d, ':'))
      if (!d.empty()) dirs.push_back(d);
  }
  for (const char* d : {"/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib",
                        "/usr/lib/x86_64-linux-gnu", "/usr/lib64"})
    dirs.push_back(d);
  for (const char* name : {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"})
    for (const auto& d : dirs) c.push_back(d + "/" + name);
  for (const char* name : {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"}) c.push_back(name);
  return c;
}

Nvrtc& lib() {
  static Nvrtc n;
  static std::once_flag once;
  std::call_once(once, [] {
    std::vector<std::string> candidates = nvrtc_candidates();
    const char* forced = forced_nvrtc();
    n.forced = forced != nullptr;
    std::string tried;
    for (const auto& c : candidates) {
      void* h = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!h) {
        const char* why = dlerror();
        if (forced) {
          n.where = fmt::format("MK_NVRTC_PATH='{}' could not be loaded: {}", c, why ? why : "dlopen failed");
          return;
        }
        tried += "\n    " + c;
        continue;
      }
      n.handle = h;
      n.where = c;
      break;
    }
    if (!n.handle) {
      n.where = "not found; tried:" + tried;
      return;
    }
    auto sym = [&](auto& fn, const char* s) { fn = reinterpret_cast<std::decay_t<decltype(fn)>>(dlsym(n.handle, s)); };
    sym(n.version, "nvrtcVersion");
    sym(n.num_archs, "nvrtcGetNumSupportedArchs");
    sym(n.archs, "nvrtcGetSupportedArchs");
    sym(n.create, "nvrtcCreateProgram");
    sym(n.compile, "nvrtcCompileProgram");
    sym(n.log_size, "nvrtcGetProgramLogSize");
    sym(n.log, "nvrtcGetProgramLog");
    sym(n.cubin_size, "nvrtcGetCUBINSize");
    sym(n.cubin, "nvrtcGetCUBIN");
    sym(n.destroy, "nvrtcDestroyProgram");
    sym(n.error_string, "nvrtcGetErrorString");
    if (!n.version || !n.create || !n.compile || !n.cubin || !n.cubin_size || !n.destroy) {
      dlclose(n.handle);
      n.handle = nullptr;
      n.where = forced ? fmt::format("MK_NVRTC_PATH='{}' is not a usable NVRTC: it lacks nvrtcCompileProgram, "
                                     "nvrtcGetCUBIN or another function mKernel needs (not libnvrtc, or too old?)",
                                     n.where)
                       : n.where + " (missing symbols: too old?)";
    }
  });
  return n;
}

Nvrtc& need_lib() {
  Nvrtc& n = lib();
  if (!n.handle)
    throw Error(ErrId::jit_E001, "NVRTC (libnvrtc.so) " + n.where, {},
                n.forced ? "point MK_NVRTC_PATH at a libnvrtc.so.12 or .13 that loads, or unset it to search "
                           "LD_LIBRARY_PATH, /usr/local/cuda and the system's libraries"
                         : "install the CUDA toolkit, or point MK_NVRTC_PATH at libnvrtc.so");
  return n;
}

}  // namespace

std::string hash_hex(const std::string& data) { return mk::hash_hex(data); }

int parse_arch(const std::string& s) {
  std::string t = s;
  for (const char* prefix : {"sm_", "compute_", "SM_", "sm"})
    if (t.rfind(prefix, 0) == 0) {
      t = t.substr(std::string(prefix).size());
      break;
    }
  if (t.size() == 3 && t[1] == '.') t = std::string(1, t[0]) + t[2];
  if (!t.empty() && (t.back() == 'a' || t.back() == 'f')) t.pop_back();
  bool digits = !t.empty() && t.size() <= 3 &&
                std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits)
    throw Error(ErrId::cli_E010, "'" + s + "' is not a GPU architecture", {},
                "write it as sm_90 (H100/H200), sm_80 (A100), sm_100 (B200), ...");
  return std::stoi(t);
}

std::string arch_name(int arch) { return "sm_" + std::to_string(arch); }

bool out_of_memory(bool nvrtc_said_so, const std::string& log) {
  if (nvrtc_said_so) return true;
  std::string l = log;
  std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  for (const char* what : {"out of memory", "memory allocation failure", "std::bad_alloc", "insufficient memory"})
    if (l.find(what) != std::string::npos) return true;
  return false;
}

int nvrtc_version() {
  Nvrtc& n = lib();
  if (!n.handle) return 0;
  int major = 0, minor = 0;
  n.version(&major, &minor);
  return major * 1000 + minor * 10;
}

std::vector<int> supported_archs() {
  Nvrtc& n = lib();
  std::vector<int> v;
  if (!n.handle || !n.num_archs || !n.archs) return v;
  int count = 0;
  if (n.num_archs(&count) != NVRTC_SUCCESS || count <= 0) return v;
  v.resize(size_t(count));
  n.archs(v.data());
  return v;
}

std::string nvrtc_status() {
  Nvrtc& n = lib();
  if (!n.handle) return n.where;
  int v = nvrtc_version();
  return fmt::format("{} (NVRTC {}.{})", n.where, v / 1000, (v % 1000) / 10);
}

std::string nvrtc_identity() {
  static const std::string id = [] {
    for (const auto& c : nvrtc_candidates()) {
      if (c.empty() || c[0] != '/') continue;
      std::error_code ec;
      fs::path real = fs::canonical(c, ec);
      if (ec) continue;
      auto size = fs::file_size(real, ec);
      return real.filename().string() + ":" + std::to_string(ec ? 0 : size);
    }
    return std::string("nvrtc:unknown");
  }();
  return id;
}

const std::string& templates_hash() {
  static const std::string h = [] {
    std::string all;
    for (const auto& [n, text] : codegen::embedded_templates()) {
      all += "\n//@";
      all += n;
      all += "\n";
      all += text;
    }
    return hash_hex(all);
  }();
  return h;
}

std::string cache_dir() {
  if (const char* d = std::getenv("MK_CACHE_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/mkernel";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/mkernel";
  if (const passwd* pw = ::getpwuid(::getuid()); pw && pw->pw_dir && *pw->pw_dir)
    return std::string(pw->pw_dir) + "/.cache/mkernel";
  return "";
}

namespace {

constexpr size_t kMaxCachedCubin = 256u << 20;  // as plan.cpp's limit for one cubin

std::string why_not_private(const std::string& dir, ErrId* id) {
  *id = ErrId::jit_E004;
  if (dir.empty()) return "no cache directory: set MK_CACHE_DIR, XDG_CACHE_HOME or HOME";
  if (std::string why = tfs::make_private_dir(dir); !why.empty()) {
    // created (or there) but not ours or not private: E006; not creatable: E004
    struct stat st {};
    if (::stat(dir.c_str(), &st) == 0) *id = ErrId::jit_E006;
    return why;
  }
  // What is inside is only as safe as the path to it: every parent must be
  // ours or root's, and writable by others only with the sticky bit (/tmp).
  *id = ErrId::jit_E006;
  if (std::string why = tfs::tree_problem(dir); !why.empty()) return fmt::format("cache directory {}: {}", dir, why);
  return "";
}

}  // namespace

std::string private_cache_dir(std::string* why, ErrId* id) {
  // Links in the name the user gave are resolved (a cache on scratch space);
  // below it nothing is followed.
  std::string dir = cache_dir();
  if (std::error_code ec; !dir.empty()) {
    const fs::path real = fs::weakly_canonical(dir, ec);
    if (!ec) dir = real.string();
  }
  ErrId err{};
  const std::string problem = why_not_private(dir, &err);
  if (why) *why = problem;
  if (id) *id = err;
  if (problem.empty()) return dir;
  static std::mutex m;
  static std::set<std::string> warned;
  std::lock_guard<std::mutex> lock(m);
  if (warned.insert(dir).second) {
    const Error e(err, problem, {},
                  "point MK_CACHE_DIR at a directory only you can write (chmod 700), or remove it so mKernel "
                  "creates it");
    std::fprintf(stderr, "mkernel: warning: %s (compiling without the cache)\n", e.what());
  }
  return "";
}

namespace {

// Where a source NVRTC rejected is kept for the report: the private cache,
// else a fresh file under the temp directory (never a predictable name there).
std::string save_failed_source(const std::string& source, const std::string& key) {
  std::string p;
  if (const std::string dir = private_cache_dir(); !dir.empty()) {
    const fs::path f = fs::path(dir) / "failed" / (key + ".cu");
    if (tfs::make_private_dir(f.parent_path()).empty() && tfs::write_private(f, source).empty()) return f.string();
  }
  std::string tmpl = (fs::temp_directory_path() / ("mk-failed-" + key + "-XXXXXX.cu")).string();
  const int fd = ::mkstemps(tmpl.data(), 3);  // 0600, a fresh name
  if (fd < 0) return "(not saved: " + std::string(std::strerror(errno)) + ")";
  p = tmpl;
  for (size_t off = 0; off < source.size();) {
    ssize_t w = ::write(fd, source.data() + off, source.size() - off);
    if (w <= 0) break;
    off += size_t(w);
  }
  ::close(fd);
  return p;
}

}  // namespace

namespace {

std::mutex& fast_compile_mutex() {
  static std::mutex m;
  return m;
}
std::string& chosen_fast_compile() {
  static std::string level = kDefaultFastCompile;
  return level;
}

std::string checked_fast_compile(const std::string& level, const char* from) {
  for (const char* ok : {"0", "min", "mid", "max"})
    if (level == ok) return level;
  throw Error(ErrId::jit_E007, fmt::format("{}='{}' is not a fast-compile level", from, level), {},
              "use 0 (full optimisation), min, mid or max (NVRTC's --Ofast-compile: faster compilation, slower "
              "kernels; see docs/plan.md)");
}

}  // namespace

std::string fast_compile() {
  std::string level;
  if (const char* e = std::getenv("MK_FAST_COMPILE"); e && *e) {
    level = checked_fast_compile(e, "MK_FAST_COMPILE");
  } else {
    std::lock_guard<std::mutex> lock(fast_compile_mutex());
    level = chosen_fast_compile();
  }
  if (level != "0" && nvrtc_version() != 0 && nvrtc_version() < 12080) {
    static std::once_flag said;
    std::call_once(said, [] {
      debug_log("NVRTC older than 12.8 has no --Ofast-compile: kernels are compiled with full optimisation");
    });
    return "0";
  }
  return level;
}

void set_fast_compile(const std::string& level) {
  std::string l = checked_fast_compile(level, "--fast-compile");
  std::lock_guard<std::mutex> lock(fast_compile_mutex());
  chosen_fast_compile() = std::move(l);
}

namespace {
// NVRTC on `source` (compile's cache missed), storing the cubin in `file` under `dir` when given.
CompileResult run_nvrtc(const std::string& source, const std::string& name, int arch,
                        const std::vector<std::string>& opts, const std::string& base_key, const fs::path& file,
                        const std::string& dir);
}  // namespace

CompileResult compile(const std::string& source, const std::string& name, int arch, bool use_cache) {
  std::vector<std::string> opts = {"--gpu-architecture=" + arch_name(arch), "-std=c++17", "-DNDEBUG",
                                   "--extra-device-vectorization", "-lineinfo"};
  // Not an option at "0", so that cubins cached before the knob keep their keys.
  if (const std::string fc = fast_compile(); fc != "0") opts.push_back("--Ofast-compile=" + fc);
  std::string keydata = source + "\n//templates " + templates_hash();
  for (const auto& o : opts) keydata += "\n//#" + o;
  keydata += "\n//nvrtc " + nvrtc_identity();
  CompileResult res;
  const std::string base_key = hash_hex(keydata);
  fs::path file;
  const std::string dir = use_cache ? private_cache_dir() : "";
  if (!dir.empty()) {
    file = fs::path(dir) / (base_key + "." + arch_name(arch) + ".cubin");
    std::string why;
    const tfs::Read r = tfs::read_file(file, kMaxCachedCubin, &res.cubin, &why);
    if (r == tfs::Read::ok && (why = cubin_problem(res.cubin.data(), res.cubin.size(), arch)).empty()) {
      res.from_cache = true;
      res.cache_file = file.string();
      return res;
    }
    if (std::error_code ec; r != tfs::Read::failed || fs::exists(fs::symlink_status(file, ec))) {
      // damaged (truncated, overwritten) or not ours (a link, another
      // owner, writable by others): drop it and compile again
      debug_log(fmt::format("kernel cache: dropping {}: {}", file.string(), why));
      fs::remove(file, ec);
    }
    res.cubin.clear();
  }
  // Compiles of one source running now in this process, by key and arch: a
  // second thread asking for the same cubin (ranks of one process whose plans
  // share a bucket's code, prewarm threads) waits for the first and gets its
  // result (or its error) instead of compiling it again.
  static std::mutex flights_mu;
  static std::map<std::string, std::shared_future<CompileResult>> flights;
  const std::string flight_key = base_key + "." + arch_name(arch) + (dir.empty() ? "" : "@" + dir);
  std::promise<CompileResult> mine;
  std::shared_future<CompileResult> theirs;
  {
    std::lock_guard<std::mutex> g(flights_mu);
    if (auto it = flights.find(flight_key); it != flights.end())
      theirs = it->second;
    else
      flights.emplace(flight_key, mine.get_future().share());
  }
  if (theirs.valid()) return theirs.get();
  auto land = [&] {
    std::lock_guard<std::mutex> g(flights_mu);
    flights.erase(flight_key);
  };
  try {
    // a flight that landed between this thread's cache miss and its own start
    std::string why;
    if (!dir.empty() && tfs::read_file(file, kMaxCachedCubin, &res.cubin, &why) == tfs::Read::ok &&
        cubin_problem(res.cubin.data(), res.cubin.size(), arch).empty()) {
      res.from_cache = true;
      res.cache_file = file.string();
    } else {
      res = run_nvrtc(source, name, arch, opts, base_key, file, dir);
    }
    mine.set_value(res);
  } catch (...) {
    try {
      mine.set_exception(std::current_exception());
    } catch (...) {  // (already satisfied: set_value's own failure came after)
    }
    land();
    throw;
  }
  land();
  return res;
}

namespace {
std::atomic<int64_t>& nvrtc_runs() {
  static std::atomic<int64_t> n{0};
  return n;
}
}  // namespace

int64_t nvrtc_compiles() { return nvrtc_runs().load(); }

namespace {
CompileResult run_nvrtc(const std::string& source, const std::string& name, int arch,
                        const std::vector<std::string>& opts, const std::string& base_key, const fs::path& file,
                        const std::string& dir) {
  CompileResult res;
  Nvrtc& n = need_lib();
  auto archs = supported_archs();
  if (!archs.empty() && std::find(archs.begin(), archs.end(), arch) == archs.end()) {
    std::string list;
    for (int a : archs) list += " " + arch_name(a);
    throw Error(ErrId::jit_E003,
                fmt::format("{} is not supported by this NVRTC ({}); it supports:{}", arch_name(arch),
                            nvrtc_status(), list),
                {}, "pick one of the listed architectures");
  }
  std::vector<std::string> names, texts;
  for (const auto& [hn, text] : codegen::embedded_templates()) {
    names.emplace_back(hn);
    texts.emplace_back(text);
  }
  std::vector<const char*> hnames, htexts;
  for (size_t i = 0; i < names.size(); ++i) {
    hnames.push_back(names[i].c_str());
    htexts.push_back(texts[i].c_str());
  }
  nvrtcProgram prog = nullptr;
  nvrtcResult r = n.create(&prog, source.c_str(), (name + ".cu").c_str(), int(htexts.size()), htexts.data(),
                           hnames.data());
  if (r != NVRTC_SUCCESS)
    throw Error(ErrId::jit_E002, fmt::format("nvrtcCreateProgram failed: {}", n.error_string ? n.error_string(r) : "?"));
  std::vector<const char*> copts;
  for (const auto& o : opts) copts.push_back(o.c_str());
  nvrtc_runs().fetch_add(1);
  r = n.compile(prog, int(copts.size()), copts.data());
  size_t log_size = 0;
  if (n.log_size) n.log_size(prog, &log_size);
  if (log_size > 1 && n.log) {
    res.log.resize(log_size);
    n.log(prog, res.log.data());
    res.log.resize(log_size - 1);
  }
  if (r != NVRTC_SUCCESS) {
    n.destroy(&prog);
    std::string path = save_failed_source(source, base_key);
    if (out_of_memory(r == NVRTC_ERROR_OUT_OF_MEMORY, res.log))
      throw Error(ErrId::jit_E005,
                  fmt::format("NVRTC ran out of memory compiling {} for {} ({} bytes of generated source: {})", name,
                              arch_name(arch), source.size(), path),
                  {},
                  "the schedule is too large for one kernel on this machine: see `mkc show --classes` for ranks "
                  "that could not share code, use fewer ranks or chunks, or compile on a machine with more memory");
    std::string log = res.log.size() > 6000 ? res.log.substr(0, 6000) + "\n[... log truncated]" : res.log;
    throw Error(ErrId::jit_E002,
                fmt::format("NVRTC could not compile {} for {}:\n{}\n  generated source: {}", name, arch_name(arch),
                            log, path),
                {}, "this is a bug in the schedule's lowering or in mKernel; please report it with that file");
  }
  size_t size = 0;
  n.cubin_size(prog, &size);
  res.cubin.resize(size);
  n.cubin(prog, res.cubin.data());
  n.destroy(&prog);
  if (!dir.empty()) {
    // The cache is an optimisation: a read-only cache costs a recompile later,
    // not this compilation.
    if (std::string why = tfs::write_private(file, res.cubin.data(), res.cubin.size()); why.empty())
      res.cache_file = file.string();
    else
      debug_log("kernel cache: not stored: " + why);
  }
  return res;
}

}  // namespace

}  // namespace mk::jit
