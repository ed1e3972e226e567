#include "runtime/comm/env.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <set>

#include "compiler/common/env_parse.hpp"
#include "compiler/jit/jit.hpp"
#include "compiler/verify/verify.hpp"
#include "runtime/plans/plans.hpp"
#include "runtime/plans/schedules.hpp"
#include "runtime/plans/select.hpp"
#include "runtime/api/status.hpp"

#ifndef MK_VERSION
#define MK_VERSION "dev"
#endif

namespace mk::rt::env {

namespace {

[[noreturn]] void invalid(const char* name, const std::string& value, const std::string& what) {
  fail(mkInvalidArgument, fmt::format("{}='{}': {}", name, value, what));
}

// One integer knob of MK_TUNE: where it goes and what it accepts.
struct TuneKey {
  const char* key;
  int64_t lo, hi;
  int64_t multiple;  // the value must be a multiple of this
  int64_t passes::ProtocolOptions::*i64;
  int32_t passes::ProtocolOptions::*i32;
};

const std::vector<TuneKey>& tune_table() {
  using P = passes::ProtocolOptions;
  static const std::vector<TuneKey> t = {
      {"simple_instances", 1, 1024, 1, nullptr, &P::simple_instances},
      {"ll_instances", 1, 1024, 1, nullptr, &P::ll_instances},
      {"max_tile", 16, int64_t(1) << 30, 16, &P::max_tile_bytes, nullptr},
      {"ll_max", 0, int64_t(1) << 62, 1, &P::ll_max_bytes, nullptr},
      {"scratch_budget", 0, int64_t(1) << 40, 1, &P::scratch_budget, nullptr},
      {"simple_loads", 1, 32, 1, nullptr, &P::simple_loads},
      {"simple_pipeline", 0, 1, 1, nullptr, &P::simple_pipeline},
      {"one_pass", 0, 1, 1, nullptr, &P::one_pass},
      {"lamport", 0, 1, 1, nullptr, &P::lamport},
      {"lamport_units", 1, 4, 1, nullptr, &P::lamport_units},
      {"one_pass_generic", 0, 1, 1, nullptr, &P::one_pass_generic},
      {"block_groups", 0, 1, 1, nullptr, &P::block_groups},
      {"ce_tile", 0, int64_t(1) << 30, 65536, &P::ce_tile_bytes, nullptr},
  };
  return t;
}

}  // namespace

std::optional<std::string> raw(const char* name) {
  const char* e = std::getenv(name);
  if (!e || !*e) return std::nullopt;
  return std::string(e);
}

int64_t parse_int(const char* name, const std::string& value, int64_t lo, int64_t hi) {
  int64_t v = 0;
  if (!env_parse::parse_int(value, lo, hi, &v))
    invalid(name, value, fmt::format("expected an integer in {}..{}", lo, hi));
  return v;
}

bool parse_bool(const char* name, const std::string& value) {
  bool v = false;
  if (!env_parse::parse_bool(value, &v)) invalid(name, value, "expected 0 or 1");
  return v;
}

std::vector<std::pair<std::string, std::string>> parse_list(const char* name, const std::string& value) {
  std::vector<std::pair<std::string, std::string>> out;
  std::set<std::string> seen;
  size_t start = 0;
  while (start <= value.size()) {
    const size_t comma = std::min(value.find(',', start), value.size());
    const std::string item = value.substr(start, comma - start);
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == item.size())
      invalid(name, value, fmt::format("item '{}' is not key=value (expected key=value,key=value)", item));
    std::string key = item.substr(0, eq);
    if (!seen.insert(key).second) invalid(name, value, fmt::format("'{}' is given twice", key));
    out.emplace_back(std::move(key), item.substr(eq + 1));
    start = comma + 1;
  }
  return out;
}

int64_t get_int(const char* name, int64_t dflt, int64_t lo, int64_t hi) {
  const auto v = raw(name);
  return v ? parse_int(name, *v, lo, hi) : dflt;
}

bool get_bool(const char* name, bool dflt) {
  const auto v = raw(name);
  return v ? parse_bool(name, *v) : dflt;
}

int64_t scratch_bytes() { return get_int("MK_SCRATCH_BYTES", mk::verify::kDefaultScratchBytes, int64_t(1) << 20, int64_t(1) << 40); }
int64_t flag_bytes() { return get_int("MK_FLAG_BYTES", int64_t(1) << 20, 4096, int64_t(1) << 30); }
int64_t timeout_ms() { return get_int("MK_TIMEOUT_MS", 600000, 0, int64_t(1) << 40); }
int32_t max_registrations() { return int32_t(get_int("MK_MAX_REGISTRATIONS", 256, 1, 1 << 20)); }
int32_t bootstrap_timeout_ms() {
  return int32_t(get_int("MK_BOOTSTRAP_TIMEOUT_MS", 120000, 1, (int64_t(1) << 31) - 1));
}
std::optional<std::string> host_id() {
  const auto v = raw("MK_HOST_ID");
  if (!v || v->empty()) return std::nullopt;
  if (v->size() > 4096) invalid("MK_HOST_ID", v->substr(0, 80) + "...", "at most 4096 characters");
  size_t at = 0;
  do {  // one name, or a list of names separated by commas (one per rank)
    const size_t comma = std::min(v->find(',', at), v->size());
    const std::string name = v->substr(at, comma - at);
    if (name.empty() || name.size() > 63)
      invalid("MK_HOST_ID", *v, "expected node names of 1..63 characters (one, or one per rank separated by commas)");
    for (char ch : name)
      if (ch <= ' ' || ch > '~')
        invalid("MK_HOST_ID", *v, "expected printable ASCII characters without spaces (a node's name)");
    at = comma + 1;
  } while (at <= v->size());
  return v;
}
std::optional<std::string> host_id(int rank, int nranks) {
  auto v = host_id();
  if (!v || v->find(',') == std::string::npos) return v;
  std::vector<std::string> names;
  for (size_t at = 0; at <= v->size();) {
    const size_t comma = std::min(v->find(',', at), v->size());
    names.push_back(v->substr(at, comma - at));
    at = comma + 1;
  }
  if (int(names.size()) != nranks)
    invalid("MK_HOST_ID", v->size() > 80 ? v->substr(0, 80) + "..." : *v,
            "a list names one node per rank: " + std::to_string(names.size()) + " names for a communicator of " +
                std::to_string(nranks) + " ranks");
  return names[size_t(rank)];
}
bool zero_copy() { return get_bool("MK_ZERO_COPY", true); }
bool pdl() { return get_bool("MK_PDL", true); }
int group_fuse() {
  const auto v = raw("MK_GROUP_FUSE");
  if (!v) return 0;  // off by default until two GPUs confirm the one-GPU proxies (docs/groups.md)
  if (*v == "auto") return 2;
  if (*v != "0" && *v != "1") invalid("MK_GROUP_FUSE", *v, "expected 0, 1 or auto");
  return *v == "1" ? 1 : 0;
}
int64_t zero_copy_min_bytes() { return get_int("MK_ZERO_COPY_MIN_BYTES", int64_t(4) << 20, 0, int64_t(1) << 62); }

std::string tune_keys() {
  std::string s;
  for (const auto& k : tune_table())
    s += fmt::format("{}{} ({}..{}{})", s.empty() ? "" : ", ", k.key, k.lo, k.hi,
                     k.multiple > 1 ? fmt::format(", a multiple of {}", k.multiple) : "");
  return s;
}

void apply_tune(const std::string& value, passes::ProtocolOptions* p) {
  for (const auto& [key, v] : parse_list("MK_TUNE", value)) {
    auto it = std::find_if(tune_table().begin(), tune_table().end(), [&](const TuneKey& t) { return key == t.key; });
    if (it == tune_table().end())
      invalid("MK_TUNE", value, fmt::format("unknown key '{}'; keys: {}", key, tune_keys()));
    const std::string label = "MK_TUNE " + key;
    const int64_t x = parse_int(label.c_str(), v, it->lo, it->hi);
    if (x % it->multiple) invalid(label.c_str(), v, fmt::format("must be a multiple of {}", it->multiple));
    if (it->i64)
      p->*(it->i64) = x;
    else
      p->*(it->i32) = int32_t(x);
  }
}

void apply_tune(passes::ProtocolOptions* p) {
  if (const auto v = raw("MK_TUNE")) apply_tune(*v, p);
}

std::map<Collective, std::string> parse_algo(const std::string& value) {
  std::map<Collective, std::string> m;
  for (const auto& [c, schedule] : parse_list("MK_ALGO", value)) {
    const auto coll = parse_collective(c);
    if (!coll) invalid("MK_ALGO", value, fmt::format("'{}' is not a collective (allreduce, allgather, ...)", c));
    const std::optional<Collective> implements = schedule_collective(schedule);
    if (!implements)
      invalid("MK_ALGO", value,
              fmt::format("no schedule named '{}' (`mkc list` lists them; MK_SCHEDULES loads yours, and "
                          "MK_PLAN_DIR's plans name theirs)",
                          schedule));
    if (*implements != *coll)
      invalid("MK_ALGO", value, fmt::format("schedule '{}' implements {}, not {}", schedule, name(*implements), c));
    m[*coll] = schedule;
  }
  return m;
}

std::map<Collective, std::string> algo() {
  const auto v = raw("MK_ALGO");
  return v ? parse_algo(*v) : std::map<Collective, std::string>{};
}

std::string net_transport() {
  const auto v = raw("MK_NET");
  const auto plugin = raw("MK_NET_PLUGIN");
  if (!v) return plugin ? "plugin" : "";
  if (*v == "socket" || *v == "verbs" || *v == "auto" || *v == "plugin") {
    if (*v == "plugin" && !plugin)
      fail(mkInvalidArgument, "MK_NET=plugin needs MK_NET_PLUGIN (a path, a file name, or NAME for libnccl-net-NAME.so)");
    return *v;
  }
  fail(mkInvalidArgument, fmt::format("MK_NET='{}': expected socket, verbs, auto (verbs between ranks that both have an RDMA device, "
                                      "socket otherwise) or plugin (with MK_NET_PLUGIN)", *v));
}

int net_depth() {
  const int64_t d = get_int("MK_NET_DEPTH", 8, 2, 16);
  if (d & (d - 1)) invalid("MK_NET_DEPTH", std::to_string(d), "expected a power of two in 2..16");
  return int(d);
}

std::vector<std::pair<std::string, std::string>> plan_shaping_settings() {
  std::vector<std::pair<std::string, std::string>> s;
  // first: MK_ALGO and MK_SELECT_FILE may name what it loads
  s.emplace_back("MK_SCHEDULES", env_schedules());
  std::string a;
  for (const auto& [coll, schedule] : algo()) a += fmt::format("{}{}={}", a.empty() ? "" : ",", name(coll), schedule);
  s.emplace_back("MK_ALGO", a);
  passes::ProtocolOptions tuned;
  apply_tune(&tuned);
  std::string t;
  for (const auto& k : tune_table())
    t += fmt::format("{}{}={}", t.empty() ? "" : ",", k.key, k.i64 ? tuned.*(k.i64) : int64_t(tuned.*(k.i32)));
  s.emplace_back("MK_TUNE", t);
  s.emplace_back("MK_ZERO_COPY", zero_copy() ? "1" : "0");
  // set or not decides how zero-copy is chosen (runtime/launch/enqueue.cpp): ranks must agree on both
  s.emplace_back("MK_ZERO_COPY_MIN_BYTES", raw("MK_ZERO_COPY_MIN_BYTES") ? std::to_string(zero_copy_min_bytes()) : "unset");
  s.emplace_back("MK_SCRATCH_BYTES", std::to_string(scratch_bytes()));
  s.emplace_back("MK_FLAG_BYTES", std::to_string(flag_bytes()));
  s.emplace_back("MK_MAX_REGISTRATIONS", std::to_string(max_registrations()));
  s.emplace_back("MK_PLAN_DIR", plan_dir_digest());
  s.emplace_back("MK_SELECT_FILE", select_file_digest());
  s.emplace_back("mkernel version", MK_VERSION);
  std::string fast;  // kernels of other levels differ in speed, and may round a fusion's arithmetic otherwise
  try {
    fast = jit::fast_compile();
  } catch (const Error& e) {
    fail(mkInvalidArgument, e.what());
  }
  s.emplace_back("MK_FAST_COMPILE", fast);
  s.emplace_back("compiler", jit::nvrtc_identity() + " templates " + jit::templates_hash());
  // the network transport to other nodes' ranks (part of how a communicator is built: all or none)
  s.emplace_back("MK_NET", net_transport() + (raw("MK_NET_PLUGIN") ? ":" + *raw("MK_NET_PLUGIN") : ""));
  return s;
}

}  // namespace mk::rt::env
