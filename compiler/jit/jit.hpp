// NVRTC, opened lazily (dlopen) so that binaries run on machines without the
// CUDA toolkit until they actually compile, and a disk cache of cubins.
//
// Cache key: a 128-bit hash of the generated source, every embedded template,
// the architecture, the NVRTC version and the options. Location: cache_dir(),
// used only while it is private (private_cache_dir()). Writes are atomic
// (temp file + rename), so concurrent processes of one user may share a
// cache. A cached cubin is checked like one from a plan directory
// (compiler/common/cubin.hpp); one that fails is removed and recompiled.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mk/error.hpp"

namespace mk::jit {

// "sm_90", "90", "compute_90", "9.0" -> 90; throws mk.cli.E010 if malformed.
int parse_arch(const std::string& s);
std::string arch_name(int arch);  // 90 -> "sm_90"

// NVRTC's version as major*1000+minor*10 (e.g. 13000), 0 when unavailable.
int nvrtc_version();
// Whether a failed compilation ran out of memory (NVRTC's result, or ptxas's
// words in the log): reported as jit E005 (too large), not E002 (a bug).
bool out_of_memory(bool nvrtc_said_so, const std::string& log);
// Architectures the loaded NVRTC can target (e.g. 75..121). Empty if none.
std::vector<int> supported_archs();
// Where NVRTC was found, or why not.
std::string nvrtc_status();
// Which NVRTC would be loaded (resolved file name and size), found without
// loading it: cheap enough for cache keys on the fast path.
std::string nvrtc_identity();
// A hash of every embedded template (part of every cache key).
const std::string& templates_hash();

// NVRTC's --Ofast-compile level for every kernel compiled from now on: "0"
// (full optimisation), "min", "mid" or "max". MK_FAST_COMPILE when set, else
// what set_fast_compile() chose, else kDefaultFastCompile. Part of every
// cubin's cache key and of plan keys (compiler::options_json, when not
// "0"). An NVRTC older than 12.8 has no such option: the level is then "0"
// whatever was asked (and said once under MK_DEBUG). Throws mk.jit.E007 for
// another value.
inline constexpr const char* kDefaultFastCompile = "0";
std::string fast_compile();
void set_fast_compile(const std::string& level);  // mkc --fast-compile; validated

struct CompileResult {
  std::vector<char> cubin;
  std::string log;
  bool from_cache = false;
  std::string cache_file;
};

// Compiles `source` (which includes the embedded templates by name) for
// `arch`. Throws mk.jit.E001 (no NVRTC), E002 (compile error: log and the path
// of the saved source), E003 (arch unsupported), E004 (cache I/O).
// Threads of one process asking for the same cubin while it compiles wait
// for that compile (its result or its error) instead of compiling it again.
CompileResult compile(const std::string& source, const std::string& name, int arch,
                      bool use_cache = true);
// NVRTC compiles this process has run (tests: what the caches spared).
int64_t nvrtc_compiles();

// Where the caches live: $MK_CACHE_DIR, else $XDG_CACHE_HOME/mkernel, else
// $HOME/.cache/mkernel (the passwd entry's home when HOME is unset); "" when
// there is no home. Never a shared path such as /tmp.
std::string cache_dir();
// cache_dir(), ready for use: created (mode 0700, missing parents too) when
// absent, and private: a directory owned by this user that neither group nor
// others can write, since cached cubins and plugins are loaded as they are.
// Otherwise "" with the reason in *why; the callers then compile without the
// cache, and the first refusal of each directory is reported once on stderr.
// *id: mk.jit.E004 when it cannot be created, E006 when it is not private.
// Thread-safe.
std::string private_cache_dir(std::string* why = nullptr, ErrId* id = nullptr);
std::string hash_hex(const std::string& data);  // 32 hex digits

}  // namespace mk::jit
