// Environment settings (runtime/comm/env.hpp): whole-string parsing, ranges, and
// errors that name the variable, its value and what it accepts.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "compiler/common/env_parse.hpp"
#include "compiler/common/log.hpp"
#include "compiler/jit/jit.hpp"
#include "compiler/passes/passes.hpp"
#include "runtime/bootstrap/bootstrap.hpp"
#include "runtime/comm/comm.hpp"
#include "runtime/comm/env.hpp"
#include "runtime/api/status.hpp"
#include "support.hpp"
#include "tests/capture.hpp"

using namespace mk;
using mkt::contains;

using mkt::occurrences;
using mkt::stderr_of;

namespace {

// The RtError message of `f`, checked to be mkInvalidArgument ("" if none).
std::string invalid(const std::function<void()>& f) {
  try {
    f();
  } catch (const rt::RtError& e) {
    CHECK(e.code() == mkInvalidArgument);
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("env: the shared strict parser (env_parse.hpp) takes whole decimal integers and 0 or 1, nothing else") {
  int64_t v = -7;
  CHECK(env_parse::parse_int("8", 1, 86400, &v));
  CHECK(v == 8);
  CHECK(env_parse::parse_int("-9223372036854775808", INT64_MIN, 0, &v));
  CHECK(v == INT64_MIN);
  CHECK(env_parse::parse_int("0086400", 1, 86400, &v));
  CHECK(v == 86400);
  // what strtod/strtoll took (MK_PLUGIN_TIMEOUT_S read " 0x8" and "0x1p3" as 8 s)
  for (const char* bad : {" 0x8", "0x8", "0x1p3", "0.0001", "8.0", "8 ", "+8", "8s", "1e3", "inf", "nan", "",
                          "-", "9223372036854775808", "-9223372036854775809", "86401", "0"}) {
    CAPTURE(bad);
    v = -7;
    CHECK_FALSE(env_parse::parse_int(bad, 1, 86400, &v));
    CHECK(v == -7);  // untouched
  }
  // a NUL inside the value is not its end
  CHECK_FALSE(env_parse::parse_int(std::string_view("8\0" "9", 3), 0, 100, &v));
  bool b = false;
  CHECK(env_parse::parse_bool("1", &b));
  CHECK(b);
  CHECK(env_parse::parse_bool("0", &b));
  CHECK_FALSE(b);
  for (const char* bad : {"abc", "2", "01", "1 ", " 1", "true", "on", "yes", ""}) {
    CAPTURE(bad);
    CHECK_FALSE(env_parse::parse_bool(bad, &b));
  }
}

TEST_CASE("env: a diagnostic switch (MK_DEBUG, MK_NCCL_STATS) is 0 or 1, another value is off, with one warning") {
  const char* var = "MK_TEST_DIAGNOSTIC";
  struct Case {
    const char* value;  // nullptr: unset
    bool on;
    bool warns;
  };
  for (const Case& c : {Case{nullptr, false, false}, Case{"", false, false}, Case{"0", false, false},
                        Case{"1", true, false}, Case{"abc", false, true}, Case{"2", false, true},
                        Case{"true", false, true}, Case{" 1", false, true}}) {
    CAPTURE(c.value ? c.value : "(unset)");
    std::optional<mkt::ScopedEnv> e;
    if (c.value)
      e.emplace(var, c.value);
    else
      ::unsetenv(var);
    bool on = !c.on;
    const std::string err = stderr_of([&] { on = env_parse::diagnostic_flag(var, "[test]"); });
    CHECK(on == c.on);
    if (c.warns) {
      CHECK(err == std::string("[test] warning: MK_TEST_DIAGNOSTIC='") + c.value +
                       "' is not accepted (expected 0 or 1; unset or empty: 0); MK_TEST_DIAGNOSTIC is off\n");
    } else {
      CHECK(err.empty());
    }
  }
  // a long value is cut in the warning
  mkt::ScopedEnv e(var, std::string(5000, 'x'));
  const std::string err = stderr_of([&] { CHECK_FALSE(env_parse::diagnostic_flag(var, "[test]")); });
  CHECK(err.size() < 300);
  CHECK(contains(err, std::string(64, 'x') + "...'"));
}

// The library's own MK_DEBUG (compiler/common/log.hpp), read once per
// process: this test runs itself again as a child with MK_DEBUG set.
TEST_CASE("env: MK_DEBUG accepts 0 or 1 only and logging never throws") {
  if (std::getenv("MKT_DEBUG_PROBE")) {  // the child
    debug_log("probe one");
    debug_log("probe two");
    return;
  }
  char self[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  REQUIRE(n > 0);
  auto child = [&](const char* value) {
    return mkt::run_process({self, "-tc=env: MK_DEBUG accepts 0 or 1 only and logging never throws"},
                            {{"MKT_DEBUG_PROBE", "1"}, {"MK_DEBUG", value}}, 60);
  };
  const mkt::RunResult on = child("1");
  INFO(on);
  CHECK(on.exit_code == 0);
  CHECK(contains(on.err, "[mkernel] probe one\n[mkernel] probe two\n"));
  for (const char* off : {"0", ""}) {
    const mkt::RunResult r = child(off);
    CHECK(r.exit_code == 0);
    CHECK_FALSE(contains(r.err, "probe"));
    CHECK_FALSE(contains(r.err, "warning"));
  }
  for (const char* bad : {"abc", "yes", "2", "on"}) {
    CAPTURE(bad);
    const mkt::RunResult r = child(bad);
    INFO(r);
    CHECK(r.exit_code == 0);
    CHECK_FALSE(contains(r.err, "probe"));  // off, as documented
    CHECK(occurrences(r.err, "MK_DEBUG='" + std::string(bad) + "' is not accepted (expected 0 or 1") == 1);
  }
}

TEST_CASE("env: config commName is at most 128 characters, and longer is refused, not cut") {
  mkConfig_t cfg = MK_CONFIG_INITIALIZER;
  rt::CommConfig c;
  std::string name(128, 'n');
  cfg.commName = name.c_str();
  rt::apply_user_config(&c, &cfg);
  CHECK(c.comm_name == name);
  name += 'x';
  cfg.commName = name.c_str();
  CHECK(contains(invalid([&] { rt::apply_user_config(&c, &cfg); }), "commName is longer than 128 characters"));
  // read no further than that: an unterminated name is refused, not overread
  char unterminated[129];
  std::memset(unterminated, 'u', sizeof unterminated);
  cfg.commName = unterminated;
  CHECK(contains(invalid([&] { rt::apply_user_config(&c, &cfg); }), "commName is longer than 128 characters"));
}

TEST_CASE("env: config netName is read no further than 64 characters, and longer is refused") {
  mkConfig_t cfg = MK_CONFIG_INITIALIZER;
  rt::CommConfig c;
  cfg.netName = "p2p";
  rt::apply_user_config(&c, &cfg);
  CHECK(c.net_name == "p2p");
  char unterminated[65];  // no terminator: was read with strlen, past the array
  std::memset(unterminated, 'n', sizeof unterminated);
  cfg.netName = unterminated;
  CHECK(contains(invalid([&] { rt::apply_user_config(&c, &cfg); }), "netName is longer than 64 characters"));
}

TEST_CASE("env: integers parse whole, inside their range") {
  CHECK(rt::env::parse_int("X", "12", 0, 100) == 12);
  CHECK(rt::env::parse_int("X", "-3", -5, 5) == -3);
  CHECK(rt::env::parse_int("X", "9223372036854775807", 0, INT64_MAX) == INT64_MAX);
  for (const char* bad : {"12abc", "abc", "", " 12", "12 ", "+12", "1e3", "0x10", "-", "--1", "1.0",
                          "99999999999999999999", "9223372036854775808"}) {
    CAPTURE(bad);
    const std::string m = invalid([&] { rt::env::parse_int("MK_X", bad, 0, 100); });
    CHECK(contains(m, std::string("MK_X='") + bad + "'"));
    CHECK(contains(m, "expected an integer in 0..100"));
  }
  CHECK(contains(invalid([] { rt::env::parse_int("MK_X", "101", 0, 100); }), "MK_X='101': expected an integer in 0..100"));
  CHECK(contains(invalid([] { rt::env::parse_int("MK_X", "-1", 0, 100); }), "0..100"));
}

TEST_CASE("env: booleans are 0 or 1") {
  CHECK_FALSE(rt::env::parse_bool("B", "0"));
  CHECK(rt::env::parse_bool("B", "1"));
  for (const char* bad : {"2", "true", "yes", "01", "1 ", "off"}) {
    CAPTURE(bad);
    CHECK(contains(invalid([&] { rt::env::parse_bool("MK_ZERO_COPY", bad); }),
                   std::string("MK_ZERO_COPY='") + bad + "': expected 0 or 1"));
  }
}

TEST_CASE("env: key=value lists") {
  auto l = rt::env::parse_list("L", "a=1,b=x=y");
  REQUIRE(l.size() == 2);
  CHECK(l[0] == std::pair<std::string, std::string>{"a", "1"});
  CHECK(l[1] == std::pair<std::string, std::string>{"b", "x=y"});
  for (const char* bad : {"a", "=1", "a=", "a=1,", ",a=1", "a=1,,b=2", ""}) {
    CAPTURE(bad);
    CHECK(contains(invalid([&] { rt::env::parse_list("MK_L", bad); }), "is not key=value"));
  }
  CHECK(contains(invalid([] { rt::env::parse_list("MK_L", "a=1,a=2"); }), "'a' is given twice"));
}

TEST_CASE("env: the runtime's integer settings, each with its range") {
  struct Case {
    const char* var;
    std::function<int64_t()> get;
    int64_t dflt;
    const char* bad_range;  // a well-formed value outside the range
  };
  const std::vector<Case> cases = {
      {"MK_SCRATCH_BYTES", rt::env::scratch_bytes, 256 << 20, "1024"},
      {"MK_FLAG_BYTES", rt::env::flag_bytes, 1 << 20, "100"},
      {"MK_TIMEOUT_MS", rt::env::timeout_ms, 600000, "-1"},
      {"MK_MAX_REGISTRATIONS", [] { return int64_t(rt::env::max_registrations()); }, 256, "0"},
      {"MK_BOOTSTRAP_TIMEOUT_MS", [] { return int64_t(rt::bootstrap_timeout_ms()); }, 120000, "0"},
      {"MK_ZERO_COPY_MIN_BYTES", rt::env::zero_copy_min_bytes, 4 << 20, "-5"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.var);
    {
      mkt::ScopedEnv e(c.var, "");
      CHECK(c.get() == c.dflt);
    }
    {
      mkt::ScopedEnv e(c.var, "1048576");  // inside every range
      CHECK(c.get() == 1048576);
    }
    for (const char* bad : {"12abc", "lots", c.bad_range, "99999999999999999999"}) {
      CAPTURE(bad);
      mkt::ScopedEnv e(c.var, bad);
      const std::string m = invalid([&] { c.get(); });
      CHECK(contains(m, std::string(c.var) + "='" + bad + "': expected an integer in "));
    }
  }
  mkt::ScopedEnv e("MK_TIMEOUT_MS", "5x");
  CHECK(contains(invalid([] { rt::comm_config_from_env(); }), "MK_TIMEOUT_MS='5x'"));
}

TEST_CASE("env: MK_ZERO_COPY") {
  {
    mkt::ScopedEnv e("MK_ZERO_COPY", "");
    CHECK(rt::env::zero_copy());
  }
  {
    mkt::ScopedEnv e("MK_ZERO_COPY", "0");
    CHECK_FALSE(rt::env::zero_copy());
  }
  mkt::ScopedEnv e("MK_ZERO_COPY", "no");
  CHECK(contains(invalid([] { rt::env::zero_copy(); }), "MK_ZERO_COPY='no': expected 0 or 1"));
}

TEST_CASE("env: MK_TUNE values are parsed strictly, unknown keys are errors") {
  passes::ProtocolOptions p;
  rt::env::apply_tune("simple_instances=8,ll_instances=2,max_tile=65536,ll_max=4096,scratch_budget=1048576", &p);
  CHECK(p.simple_instances == 8);
  CHECK(p.ll_instances == 2);
  CHECK(p.max_tile_bytes == 65536);
  CHECK(p.ll_max_bytes == 4096);
  CHECK(p.scratch_budget == 1048576);
  struct Case {
    const char* value;
    const char* says;
  };
  for (const Case& c : std::vector<Case>{
           {"max_tile=12abc", "MK_TUNE max_tile='12abc': expected an integer in 16..1073741824"},
           {"simple_instances=0", "MK_TUNE simple_instances='0': expected an integer in 1..1024"},
           {"ll_instances=4096", "1..1024"},
           {"max_tile=100", "MK_TUNE max_tile='100': must be a multiple of 16"},
           {"ll_max=-1", "MK_TUNE ll_max='-1'"},
           {"tile=16", "MK_TUNE='tile=16': unknown key 'tile'; keys: simple_instances (1..1024)"},
           {"max_tile", "is not key=value"},
           {"max_tile=16,max_tile=32", "given twice"},
       }) {
    CAPTURE(c.value);
    passes::ProtocolOptions q;
    CHECK(contains(invalid([&] { rt::env::apply_tune(c.value, &q); }), c.says));
  }
}

TEST_CASE("env: MK_ALGO items must name a collective and one of its schedules") {
  auto m = rt::env::parse_algo("allreduce=allreduce.ring,allgather=allgather.ring");
  CHECK(m.size() == 2);
  CHECK(m[Collective::allreduce] == "allreduce.ring");
  struct Case {
    const char* value;
    const char* says;
  };
  for (const Case& c : std::vector<Case>{
           {"allreduce", "item 'allreduce' is not key=value"},
           {"allreduce=allreduce.ring,", "item '' is not key=value"},
           {"allsum=allreduce.ring", "'allsum' is not a collective"},
           {"allreduce=allreduce.nope", "no schedule named 'allreduce.nope'"},
           {"allreduce=allgather.ring", "schedule 'allgather.ring' implements allgather, not allreduce"},
           {"allreduce=allreduce.ring,allreduce=allreduce.one_shot", "'allreduce' is given twice"},
       }) {
    CAPTURE(c.value);
    const std::string msg = invalid([&] { rt::env::parse_algo(c.value); });
    CHECK(contains(msg, std::string("MK_ALGO='") + c.value + "'"));
    CHECK(contains(msg, c.says));
  }
}

TEST_CASE("env: plan_shaping_settings, normalised, in a fixed order") {
  mkt::ScopedEnv a("MK_ALGO", "allgather=allgather.ring,allreduce=allreduce.ring");
  mkt::ScopedEnv t("MK_TUNE", "ll_max=4096");
  mkt::ScopedEnv z("MK_ZERO_COPY", "");
  mkt::ScopedEnv zm("MK_ZERO_COPY_MIN_BYTES", "");
  mkt::ScopedEnv s("MK_SCRATCH_BYTES", "00000002097152");
  mkt::ScopedEnv p("MK_PLAN_DIR", "");
  mkt::ScopedEnv sel("MK_SELECT_FILE", "");
  mkt::ScopedEnv fcu("MK_FAST_COMPILE", nullptr);
  const auto all = rt::env::plan_shaping_settings();
  std::vector<std::string> names;
  for (const auto& [n, x] : all) names.push_back(n);
  CHECK(names == std::vector<std::string>{"MK_SCHEDULES", "MK_ALGO", "MK_TUNE", "MK_ZERO_COPY",
                                          "MK_ZERO_COPY_MIN_BYTES", "MK_SCRATCH_BYTES", "MK_FLAG_BYTES",
                                          "MK_MAX_REGISTRATIONS", "MK_PLAN_DIR", "MK_SELECT_FILE", "mkernel version",
                                          "MK_FAST_COMPILE", "compiler", "MK_NET"});
  // first, so that MK_ALGO and MK_SELECT_FILE can name what it loads; unset here
  CHECK(all[0].second == "");
  const std::vector<std::pair<std::string, std::string>> v(all.begin() + 1, all.end());
  CHECK(v[0].second == "allreduce=allreduce.ring,allgather=allgather.ring");  // collective order, not the user's
  CHECK(v[1].second ==
        "simple_instances=32,ll_instances=16,max_tile=262144,ll_max=4096,scratch_budget=33554432,simple_loads=16,"
        "simple_pipeline=0,one_pass=1,lamport=1,lamport_units=1,one_pass_generic=0,block_groups=1,ce_tile=0");
  CHECK(v[2].second == "1");
  // unset and set to the built-in 4 MiB choose zero-copy differently (the
  // table's sizes, the larger buffer's): ranks must not agree on them as one
  CHECK(v[3].second == "unset");
  {
    mkt::ScopedEnv zs("MK_ZERO_COPY_MIN_BYTES", "4194304");
    CHECK(rt::env::plan_shaping_settings()[4].second == "4194304");
  }
  CHECK(v[4].second == "2097152");
  CHECK(v[7].second == "none");
  CHECK(v[8].second == "none");
  CHECK(v[10].second == "0");  // MK_FAST_COMPILE: full optimisation unless set
  CHECK(!v[11].second.empty());
  {
    mkt::ScopedEnv fc("MK_FAST_COMPILE", "mid");
    const int v = mk::jit::nvrtc_version();  // before 12.8 NVRTC has no levels: "0"
    CHECK(rt::env::plan_shaping_settings()[11].second == (v == 0 || v >= 12080 ? "mid" : "0"));
    mkt::ScopedEnv bad_fc("MK_FAST_COMPILE", "fastest");
    CHECK(contains(invalid([] { rt::env::plan_shaping_settings(); }), "mk.jit.E007"));
  }
  CHECK(v[12].second == "");  // MK_NET unset: no network transport
  {
    mkt::ScopedEnv n("MK_NET", "socket");
    CHECK(rt::env::plan_shaping_settings()[13].second == "socket");
    mkt::ScopedEnv np("MK_NET_PLUGIN", "aws-ofi");
    CHECK(rt::env::plan_shaping_settings()[13].second == "socket:aws-ofi");
    mkt::ScopedEnv bad_net("MK_NET", "infiniband");
    CHECK(contains(invalid([] { rt::env::plan_shaping_settings(); }), "MK_NET='infiniband'"));
  }
  {
    mkt::ScopedEnv n("MK_NET", "plugin");
    mkt::ScopedEnv np("MK_NET_PLUGIN", nullptr);
    CHECK(contains(invalid([] { rt::env::plan_shaping_settings(); }), "MK_NET=plugin needs MK_NET_PLUGIN"));
  }
  mkt::ScopedEnv bad("MK_FLAG_BYTES", "1M");
  CHECK(contains(invalid([] { rt::env::plan_shaping_settings(); }), "MK_FLAG_BYTES='1M'"));
}

TEST_CASE("env: MK_HOST_ID is 1..63 printable characters without spaces and unset or empty means the host name") {
  {
    mkt::ScopedEnv e("MK_HOST_ID", nullptr);
    CHECK_FALSE(rt::env::host_id().has_value());
  }
  {
    mkt::ScopedEnv e("MK_HOST_ID", "");
    CHECK_FALSE(rt::env::host_id().has_value());
  }
  {
    mkt::ScopedEnv e("MK_HOST_ID", "node-7.rack2");
    CHECK(rt::env::host_id() == std::optional<std::string>("node-7.rack2"));
  }
  {
    mkt::ScopedEnv e("MK_HOST_ID", std::string(63, 'x'));
    CHECK(rt::env::host_id()->size() == 63);
  }
  for (const std::string& bad : {std::string(64, 'x'), std::string("node a"), std::string("node\t1"),
                                std::string("n\xc3\xa9")}) {
    CAPTURE(bad);
    mkt::ScopedEnv e("MK_HOST_ID", bad);
    bool threw = false;
    try {
      (void)rt::env::host_id();
    } catch (const rt::RtError& x) {
      threw = true;
      CHECK(x.code() == mkInvalidArgument);
      CHECK(std::string(x.what()).find("MK_HOST_ID=") != std::string::npos);
    }
    CHECK(threw);
  }
}
