// Files that hold code (compiler/common/trusted_fs.hpp): what mKernel writes
// has modes that do not depend on the umask, and what it reads (plans,
// cubins, plugins) is used only if nobody but this user or root could have
// written it. "Another user" is uid 65534 where the tests run as root
// (chown), and a mode or a symbolic link otherwise; the cases that need root
// say so when they skip.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "compiler/common/trusted_fs.hpp"
#include "compiler/compile.hpp"
#include "compiler/jit/jit.hpp"
#include "compiler/plan/plan.hpp"
#include "mk/dsl.hpp"
#include "plan_util.hpp"
#include "runtime/comm/comm.hpp"
#include "runtime/plans/plans.hpp"
#include "runtime/api/status.hpp"
#include "support.hpp"

using namespace mk;
using mkt::catch_error;
using mkt::contains;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

mode_t mode_of(const fs::path& p) {
  struct stat st {};
  REQUIRE(::lstat(p.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

bool root() { return ::geteuid() == 0; }

// Restores the umask at the end of the scope.
struct ScopedUmask {
  mode_t old;
  explicit ScopedUmask(mode_t m) : old(::umask(m)) {}
  ~ScopedUmask() { ::umask(old); }
};

std::string get_plan_error() {
  try {
    rt::get_plan("allreduce.ring", Collective::allreduce, 2, DType::fp16, RedOp::avg, 90, false);
  } catch (const rt::RtError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("trusted files: what mKernel writes has its own modes under umask 000 and 002") {
  for (mode_t um : {mode_t(0), mode_t(002)}) {
    CAPTURE(um);
    ScopedUmask u(um);
    mkt::TempDir d;
    // an output directory (mkc compile -o, shipped plans): 0755 / 0644
    plan::write_dir(mkt::fake_plan(), (d / "out" / "ar").string());
    CHECK(mode_of(d / "out") == 0755);
    CHECK(mode_of(d / "out" / "ar") == 0755);
    CHECK(mode_of(d / "out" / "ar" / "plan.json") == 0644);
    CHECK(mode_of(d / "out" / "ar" / "mk_test_b0.sm_90.cubin") == 0644);
    // the cache's: 0700 / 0600
    plan::write_dir(mkt::fake_plan(), (d / "priv").string(), true);
    CHECK(mode_of(d / "priv") == 0700);
    CHECK(mode_of(d / "priv" / "plan.json") == 0600);
    CHECK(tfs::make_private_dir(d / "a" / "b") == "");
    CHECK(mode_of(d / "a") == 0700);
    CHECK(mode_of(d / "a" / "b") == 0700);
    CHECK(tfs::write_private(d / "a" / "f", "x") == "");
    CHECK(mode_of(d / "a" / "f") == 0600);
    // read back as written
    CHECK(plan::read_dir((d / "out" / "ar").string()).kernels.size() == 2);
  }
}

TEST_CASE("trusted files: the kernel and plan caches write 0600 files in 0700 directories under umask 000" *
          doctest::skip(!mkt::have_nvrtc())) {
  ScopedUmask u(0);
  mkt::TempDir d;
  mkt::ScopedEnv env("MK_CACHE_DIR", (d / "cache").string());
  const auto r = jit::compile("extern \"C\" __global__ void mkt_umask(int* p) { p[0] = 1; }\n", "umask", 90);
  REQUIRE(!r.cache_file.empty());
  CHECK(mode_of(r.cache_file) == 0600);
  CHECK(mode_of(d / "cache") == 0700);
  const dsl::ScheduleInfo* info = dsl::find_schedule("allgather.direct");
  REQUIRE(info);
  compiler::CompileOptions o;
  (void)compiler::compile_plan(dsl::build(*info, 2, 0), o);
  const fs::path entry = d / "cache" / "plans" / compiler::plan_key(dsl::build(*info, 2, 0), o);
  CHECK(mode_of(d / "cache" / "plans") == 0700);
  CHECK(mode_of(entry) == 0700);
  for (const auto& e : fs::directory_iterator(entry)) {
    CAPTURE(e.path());
    CHECK(mode_of(e.path()) == 0600);
  }
}

TEST_CASE("trusted files: a plan or cubin others could write, or a link, is mk.plan.E007") {
  mkt::TempDir d;
  const fs::path dir = d / "ar";
  const fs::path cub = dir / "mk_test_b1.sm_90.cubin";
  auto fresh = [&] {
    fs::remove_all(dir);
    plan::write_dir(mkt::fake_plan(), dir.string());
  };
  auto read = [&] { return catch_error([&] { plan::read_dir(dir.string()); }); };
  fresh();
  CHECK_FALSE(read());
  ::chmod(cub.c_str(), 0666);
  auto c = read();
  CHECK(c.id == "mk.plan.E007");
  CHECK(contains(c.message, "names mk_test_b1.sm_90.cubin, which is not used: it is writable by every user (mode 0666)"));
  fresh();
  ::chmod((dir / "plan.json").c_str(), 0646);
  c = read();
  CHECK(c.id == "mk.plan.E007");
  CHECK(contains(c.message, "plan.json, which is not used: it is writable by every user"));
  fresh();
  ::chmod(dir.c_str(), 0777);  // anyone could swap the files
  c = read();
  CHECK(c.id == "mk.plan.E007");
  CHECK(contains(c.message, "plan directory " + fs::canonical(dir).string() + " is not used: it is writable by every user"));
  fresh();
  // a cubin that is a link to a file elsewhere: not followed
  fs::rename(cub, d / "elsewhere.cubin");
  fs::create_symlink(d / "elsewhere.cubin", cub);
  c = read();
  CHECK(c.id == "mk.plan.E007");
  CHECK(contains(c.message, "which is not used: it is a symbolic link (not followed)"));
  fresh();
  if (root()) {
    REQUIRE(::chown(cub.c_str(), 65534, 65534) == 0);
    c = read();
    CHECK(c.id == "mk.plan.E007");
    CHECK(contains(c.message, "owned by uid 65534, neither this user (uid 0) nor root"));
  } else {
    MESSAGE("not root: a file of another owner cannot be made here (modes and links are tested)");
  }
}

TEST_CASE("trusted files: a tree with a parent others can write is refused, /tmp (sticky) is fine") {
  mkt::TempDir d;  // under /tmp: sticky, writable by all
  CHECK(tfs::tree_problem(d.path) == "");
  fs::create_directories(d / "open" / "plans");
  ::chmod((d / "open").c_str(), 0777);
  const std::string why = tfs::tree_problem(d / "open" / "plans");
  CHECK(contains(why, "its parent " + fs::canonical(d / "open").string() + " can be written by every user"));
  ::chmod((d / "open").c_str(), 01777);  // sticky: nobody can rename our entries away
  CHECK(tfs::tree_problem(d / "open" / "plans") == "");
  // the user may name the tree through a link; the link is resolved
  fs::create_directory_symlink(d / "open" / "plans", d / "link");
  fs::path real;
  CHECK(tfs::tree_problem(d / "link", &real) == "");
  CHECK(real == fs::canonical(d / "open" / "plans"));
}

TEST_CASE("MK_PLAN_DIR: a tree another user could change is refused (mk.plan.E007), links are not followed") {
  mkt::TempDir d;
  plan::write_dir(mkt::fake_plan(), (d / "ar").string());
  {
    mkt::ScopedEnv env("MK_PLAN_DIR", d.str());
    CHECK(get_plan_error() == "no error");
  }
  ::chmod((d / "ar").c_str(), 0757);
  {
    mkt::ScopedEnv env("MK_PLAN_DIR", d.str() + "/");  // another value: read again
    const std::string e = get_plan_error();
    CHECK(contains(e, "[mk.plan.E007]"));
    CHECK(contains(e, "ar is not used: it is writable by every user (mode 0757)"));
  }
  ::chmod((d / "ar").c_str(), 0755);
  ::chmod(d.path.c_str(), 0777);
  {
    mkt::ScopedEnv env("MK_PLAN_DIR", d.str() + "//");
    const std::string e = get_plan_error();
    CHECK(contains(e, "[mk.plan.E007] MK_PLAN_DIR='" + d.str() + "//' is not used"));
    CHECK(contains(e, "writable by every user (mode 0777)"));
  }
  ::chmod(d.path.c_str(), 0700);
  if (root()) {
    REQUIRE(::chown(d.path.c_str(), 65534, 65534) == 0);
    mkt::ScopedEnv env("MK_PLAN_DIR", d.str() + "/./");
    const std::string e = get_plan_error();
    CHECK(contains(e, "[mk.plan.E007]"));
    CHECK(contains(e, "owned by uid 65534"));
    REQUIRE(::chown(d.path.c_str(), 0, 0) == 0);
  }
  // a plan directory behind a link is not used (not followed)
  mkt::TempDir other;
  fs::remove_all(d / "ar");
  auto p = mkt::fake_plan();
  p.schedule = "test.linked_only";
  plan::write_dir(p, (other / "ar").string());
  fs::create_directory_symlink(other / "ar", d / "ar");
  mkt::ScopedEnv env("MK_PLAN_DIR", d.str() + "/././");
  CHECK_FALSE(rt::plan_dir_schedule("test.linked_only"));
  p.schedule = "test.linked_only";  // the same plan copied in is found
  fs::remove(d / "ar");
  plan::write_dir(p, (d / "ar").string());
  mkt::ScopedEnv env2("MK_PLAN_DIR", d.str() + "/./././");
  CHECK(rt::plan_dir_schedule("test.linked_only"));
}

TEST_CASE("MK_PLAN_DIR: a plan of another mKernel version is mk.plan.E008") {
  mkt::TempDir d;
  auto p = mkt::fake_plan();
  p.mkernel_version = "0.0.1";
  plan::write_dir(p, (d / "ar").string());
  mkt::ScopedEnv env("MK_PLAN_DIR", d.str());
  const std::string e = get_plan_error();
  CHECK(contains(e, "[mk.plan.E008]"));
  CHECK(contains(e, "plan allreduce.ring was compiled by mKernel 0.0.1, this library is " +
                        std::string(plan::library_version())));
}

TEST_CASE("plan cache: an entry that is not ours, or a link, is dropped and compiled again" *
          doctest::skip(!mkt::have_nvrtc())) {
  mkt::TempDir d;
  mkt::ScopedEnv env("MK_CACHE_DIR", d.str());
  const dsl::ScheduleInfo* info = dsl::find_schedule("allgather.direct");
  REQUIRE(info);
  compiler::CompileOptions o;
  const auto first = compiler::compile_plan(dsl::build(*info, 2, 0), o);
  const fs::path entry = d / "plans" / compiler::plan_key(dsl::build(*info, 2, 0), o);
  REQUIRE(fs::exists(entry / "plan.json"));
  compiler::CompileStats st;
  // a planted plan: the entry replaced by a link to a directory elsewhere
  mkt::TempDir planted;
  fs::copy(entry, planted / "p");
  fs::remove_all(entry);
  fs::create_directory_symlink(planted / "p", entry);
  (void)compiler::compile_plan(dsl::build(*info, 2, 0), o, &st);
  CHECK_FALSE(st.from_cache);
  CHECK_FALSE(fs::is_symlink(entry));
  // writable by others: dropped
  ::chmod((entry / "plan.json").c_str(), 0666);
  (void)compiler::compile_plan(dsl::build(*info, 2, 0), o, &st);
  CHECK_FALSE(st.from_cache);
  CHECK(mode_of(entry / "plan.json") == 0600);
  // of another version: dropped
  json j = json::parse(mkt::read_text(entry / "plan.json"));
  j["mkernel_version"] = "0.0.1";
  mkt::write_text(entry / "plan.json", j.dump());
  (void)compiler::compile_plan(dsl::build(*info, 2, 0), o, &st);
  CHECK_FALSE(st.from_cache);
  (void)compiler::compile_plan(dsl::build(*info, 2, 0), o, &st);
  CHECK(st.from_cache);
  if (root()) {
    REQUIRE(::chown((entry / first.kernels[0].cubin_file).c_str(), 65534, 65534) == 0);
    compiler::CompileStats fresh;
    (void)compiler::compile_plan(dsl::build(*info, 2, 0), o, &fresh);
    CHECK_FALSE(fresh.from_cache);
  }
}

TEST_CASE("jit cache: a cubin that is not ours, or a link, is not loaded" * doctest::skip(!mkt::have_nvrtc())) {
  mkt::TempDir d;
  mkt::ScopedEnv env("MK_CACHE_DIR", d.str());
  const char* src = "extern \"C\" __global__ void mkt_foreign(int* p) { p[threadIdx.x] = 5; }\n";
  const auto a = jit::compile(src, "foreign", 90);
  REQUIRE(!a.cache_file.empty());
  ::chmod(a.cache_file.c_str(), 0606);
  CHECK_FALSE(jit::compile(src, "foreign", 90).from_cache);
  CHECK(mode_of(a.cache_file) == 0600);  // rewritten, ours
  mkt::TempDir planted;
  fs::rename(a.cache_file, planted / "x.cubin");
  fs::create_symlink(planted / "x.cubin", a.cache_file);
  CHECK_FALSE(jit::compile(src, "foreign", 90).from_cache);
  CHECK_FALSE(fs::is_symlink(a.cache_file));
  CHECK(jit::compile(src, "foreign", 90).from_cache);
  if (root()) {
    REQUIRE(::chown(a.cache_file.c_str(), 65534, 65534) == 0);
    CHECK_FALSE(jit::compile(src, "foreign", 90).from_cache);
  }
}

// The attack of the report: another user replaces a cached schedule plugin
// and its constructor runs in the job. The planted library writes a marker
// file when loaded; mkc must never load it, and must compile its own.
TEST_CASE("plugin cache: a cached library that is not ours, or not what was stored, is never loaded") {
  mkt::TempDir d, cache;
  const fs::path src = d / "sched.cpp", evil_src = d / "evil.cpp", evil = d / "evil.so", mark = d / "ran";
  mkt::write_text(src, R"(#include <mk/dsl.hpp>
using namespace mk::dsl;
static void build(Program& p) {
  for (int r = 0; r < p.ranks(); ++r) p.copy(p.output(r, 0), p.input(0, 0));
}
MK_SCHEDULE("test.trust_bcast", broadcast, build, "a broadcast");
)");
  mkt::write_text(evil_src, "#include <cstdio>\n#include <cstdlib>\n__attribute__((constructor)) static void planted() {"
                            " if (FILE* f = std::fopen(std::getenv(\"MKT_MARK\"), \"w\")) std::fclose(f); }\n");
  const auto cc = mkt::run_process({"/usr/bin/c++", "-shared", "-fPIC", "-o", evil.string(), evil_src.string()});
  REQUIRE(cc.exit_code == 0);
  auto run = [&] {
    return mkt::mkc({"verify", src.string(), "--ranks", "2"},
                    {{"MK_CACHE_DIR", cache.str()}, {"MKT_MARK", mark.string()}});
  };
  REQUIRE(run().exit_code == 0);
  fs::path so;
  for (const auto& e : fs::directory_iterator(cache / "plugins"))
    if (e.path().extension() == ".so") so = e.path();
  REQUIRE(!so.empty());
  CHECK(mode_of(so) == 0700);
  CHECK(mode_of(cache / "plugins") == 0700);
  CHECK(fs::exists(so.string() + ".sum"));
  // The planted library under the cached name: (1) writable by others,
  // (2) bytes that are not the stored plugin's, (3) another owner (root only).
  std::vector<std::string> cases = {"writable", "changed"};
  if (root()) cases.push_back("foreign");
  for (const auto& c : cases) {
    CAPTURE(c);
    fs::remove(mark);
    fs::copy_file(evil, so, fs::copy_options::overwrite_existing);
    ::chmod(so.c_str(), c == "writable" ? 0777 : 0700);
    if (c == "foreign") REQUIRE(::chown(so.c_str(), 65534, 65534) == 0);
    const auto r = run();
    CHECK(r.exit_code == 0);
    CHECK(contains(r.out, "proved: test.trust_bcast"));
    CHECK_FALSE(fs::exists(mark));  // the planted constructor never ran
  }
  if (!root()) MESSAGE("not root: a library of another owner cannot be planted here (modes and contents are tested)");
  // a plugin passed by path that others can write is not loaded either
  fs::remove(mark);
  ::chmod(evil.c_str(), 0757);
  const auto r = mkt::mkc({"list"}, {{"MK_SCHEDULES", evil.string()}, {"MKT_MARK", mark.string()}});
  CHECK(r.exit_code != 0);
  CHECK(contains(r.err, "[mk.cli.E006] plugin " + evil.string() + " is not loaded: "));
  CHECK(contains(r.err, "writable by every user"));
  CHECK_FALSE(fs::exists(mark));
}

TEST_CASE("schedule files: a DSL file others could change is not compiled into the job") {
  mkt::TempDir d, cache;
  const std::string text = R"(#include <mk/dsl.hpp>
using namespace mk::dsl;
static void build(Program& p) {
  for (int r = 0; r < p.ranks(); ++r) p.copy(p.output(r, 0), p.input(0, 0));
}
MK_SCHEDULE("test.trust_src", broadcast, build, "a broadcast");
)";
  fs::create_directory(d / "open");
  const fs::path in_open = d / "open" / "s.cpp", writable = d / "w.cpp";
  mkt::write_text(in_open, text);
  mkt::write_text(writable, text);
  ::chmod((d / "open").c_str(), 0777);  // anyone could swap the file
  ::chmod(writable.c_str(), 0666);
  for (const fs::path& f : {in_open, writable}) {
    CAPTURE(f);
    const auto r = mkt::mkc({"verify", f.string(), "--ranks", "2"}, {{"MK_CACHE_DIR", cache.str()}});
    CHECK(r.exit_code != 0);
    CHECK(contains(r.err, "[mk.cli.E006] schedule file " + f.string() + " is not compiled: "));
    CHECK(contains(r.err, "writable by every user"));
  }
  CHECK_FALSE(fs::exists(cache / "plugins"));  // nothing was compiled
  ::chmod(writable.c_str(), 0644);
  CHECK(mkt::mkc({"verify", writable.string(), "--ranks", "2"}, {{"MK_CACHE_DIR", cache.str()}}).exit_code == 0);
}

TEST_CASE("cache directory: a cache named through a link is used (the link resolved)") {
  mkt::TempDir d;
  fs::create_directory(d / "scratch");
  ::chmod((d / "scratch").c_str(), 0700);
  fs::create_directory_symlink(d / "scratch", d / "cache");
  mkt::ScopedEnv env("MK_CACHE_DIR", (d / "cache").string());
  std::string why;
  CHECK(jit::private_cache_dir(&why) == fs::canonical(d / "scratch").string());
  CHECK(why == "");
}
