// Plan files, the caches and MK_PLAN_DIR as hostile input: every field of
// plan.json type- and range-checked, cubins checked as complete CUDA ELF
// files, damaged cache entries dropped and rebuilt, the cache directory
// private, a bad MK_PLAN_DIR failing every call alike; resource keys.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "compiler/common/cubin.hpp"
#include "compiler/common/trusted_fs.hpp"
#include "compiler/compile.hpp"
#include "compiler/jit/jit.hpp"
#include "compiler/plan/plan.hpp"
#include "mk/dsl.hpp"
#include "plan_util.hpp"
#include "runtime/comm/comm.hpp"
#include "runtime/comm/env.hpp"
#include "runtime/plans/plans.hpp"
#include "runtime/plans/schedules.hpp"
#include "runtime/plans/select.hpp"
#include "runtime/api/status.hpp"
#include "support.hpp"

using namespace mk;
using mkt::catch_error;
using mkt::contains;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

json plan_json(const fs::path& dir) { return json::parse(mkt::read_text(dir / "plan.json")); }
void put_json(const fs::path& dir, const json& j) { mkt::write_text(dir / "plan.json", j.dump(2)); }

// read_dir's outcome for `j` written over a good plan in `dir`.
mkt::Caught read_with(const fs::path& dir, const json& j) {
  put_json(dir, j);
  return catch_error([&] { plan::read_dir(dir.string()); });
}

std::string cubin_check(const std::vector<char>& c, int arch) { return cubin_problem(c.data(), c.size(), arch); }

void put_u64(std::vector<char>& f, size_t off, uint64_t v, size_t n) {
  for (size_t i = 0; i < n; ++i) f[off + i] = char((v >> (8 * i)) & 0xff);
}

}  // namespace

TEST_CASE("plan: every field of plan.json is type-checked, naming the field and the file") {
  mkt::TempDir d;
  plan::write_dir(mkt::fake_plan(), d.str());
  const json good = plan_json(d.path);
  const std::vector<json> wrong = {json(nullptr), json::array(), json::object(), json("x"), json(1.5), json(true)};
  auto check_field = [&](const std::string& path, const std::function<json&(json&)>& at, const json& orig) {
    for (const json& w : wrong) {
      if (w.type() == orig.type()) continue;
      if (orig.is_number_integer() && w.is_number_integer()) continue;
      CAPTURE(path);
      CAPTURE(w.dump());
      json j = good;
      at(j) = w;
      auto c = read_with(d.path, j);
      CHECK_FALSE(c.internal);
      CHECK(c.id == "mk.plan.E001");
      CHECK(contains(c.message, path));
      CHECK(contains(c.message, (d / "plan.json").string()));
    }
  };
  for (const auto& [key, v] : good.items()) {
    if (key == "kernels") continue;
    check_field("$." + key, [key = key](json& j) -> json& { return j[key]; }, v);
  }
  for (const auto& [key, v] : good["kernels"][0].items())
    check_field("$.kernels[0]." + key, [key = key](json& j) -> json& { return j["kernels"][0][key]; }, v);
  // deeply nested input is refused while it is parsed
  put_json(d.path, good);
  mkt::write_text(d / "plan.json", std::string(100000, '[') + std::string(100000, ']'));
  auto deep = catch_error([&] { plan::read_dir(d.str()); });
  CHECK(deep.id == "mk.plan.E001");
  CHECK(contains(deep.message, "nested more than 16 levels deep"));
  // the optional field, present with a wrong type
  json j = good;
  j["zero_copy"] = "yes";
  CHECK(contains(read_with(d.path, j).message, "$.zero_copy: expected true or false"));
  j = good;
  j["kernels"][0]["pdl"] = 1;
  CHECK(contains(read_with(d.path, j).message, "$.kernels[0].pdl: expected true or false"));
  // a kernel before sm_90 cannot wait for the previous grid: it must not be
  // launched early (programmatic dependent launch)
  j = good;
  j["arch"] = "sm_80";
  j["kernels"][0]["pdl"] = true;
  CHECK(contains(read_with(d.path, j).message, "$.kernels[0].pdl: programmatic dependent launch needs sm_90"));
}

TEST_CASE("plan: sizes are range-checked in 64 bits, buckets ordered and disjoint") {
  mkt::TempDir d;
  plan::write_dir(mkt::fake_plan(), d.str());
  const json good = plan_json(d.path);
  struct Case {
    const char* what;
    std::function<void(json&)> f;
    const char* says;
  };
  const std::vector<Case> cases = {
      // tbs x instances overflows int32 to 0, which used to match grid 0
      {"grid overflow", [](json& j) {
         auto& k = j["kernels"][0];
         k["tbs"] = 65536, k["instances"] = 65536, k["grid"] = 0, k["seq_words"] = 0;
         k["flag_slots"] = 1, k["flag_bytes"] = 1 << 20, k["scratch_bytes"] = 0;
       }, "$.kernels[0].instances: 65536 is outside 1..1024"},
      {"grid zero", [](json& j) { j["kernels"][0]["grid"] = 0; }, "$.kernels[0].grid: 0 is outside"},
      {"threads negative", [](json& j) { j["kernels"][0]["threads"] = -256; }, "$.kernels[0].threads: -256 is outside"},
      {"threads not a warp multiple", [](json& j) { j["kernels"][0]["threads"] = 100; }, "multiple of 32"},
      {"tile huge", [](json& j) { j["kernels"][0]["max_tile_bytes"] = int64_t(1) << 50; }, "max_tile_bytes"},
      {"tile zero", [](json& j) { j["kernels"][0]["max_tile_bytes"] = 0; }, "max_tile_bytes: 0 is outside"},
      {"scratch product overflows", [](json& j) {
         auto& k = j["kernels"][1];
         k["max_tile_bytes"] = int64_t(1) << 30, k["scratch_slots"] = 1 << 20, k["depth"] = 1024;
         k["scratch_bytes"] = 1 << 20;
       }, "exceeds 1 TiB"},
      {"scratch too small", [](json& j) { j["kernels"][1]["scratch_bytes"] = 100; }, "cannot hold the scratch layout"},
      {"scratch negative", [](json& j) { j["kernels"][1]["scratch_bytes"] = -1; }, "scratch_bytes: -1 is outside"},
      {"flag bytes huge", [](json& j) { j["kernels"][1]["flag_bytes"] = int64_t(1) << 62; }, "flag_bytes"},
      {"slots zero", [](json& j) { j["kernels"][1]["flag_slots"] = 0; }, "flag_slots: 0 is outside"},
      {"uint64 beyond int64", [](json& j) { j["kernels"][1]["min_bytes"] = uint64_t(1) << 63; }, "min_bytes"},
      {"bucket index", [](json& j) { j["kernels"][1]["bucket"] = 7; }, "$.kernels[1].bucket: 7 is outside 1..1"},
      {"buckets overlap", [](json& j) { j["kernels"][1]["min_bytes"] = 100; }, "overlaps the previous bucket"},
      {"unbounded bucket not last", [](json& j) { j["kernels"][0]["max_bytes"] = -1; }, "overlaps"},
      {"classes above ranks", [](json& j) { j["kernels"][0]["classes"] = 3; }, "classes: 3 is outside 1..2"},
      {"kernel name not a symbol", [](json& j) { j["kernels"][0]["name"] = "a b"; }, "not a C identifier"},
      {"arch with junk", [](json& j) { j["arch"] = "sm_90x"; }, "$.arch"},
      {"arch negative", [](json& j) { j["arch"] = "sm_-9"; }, "$.arch"},
  };
  for (const auto& k : cases) {
    CAPTURE(k.what);
    json j = good;
    k.f(j);
    auto c = read_with(d.path, j);
    CHECK_FALSE(c.internal);
    CHECK(c.id == "mk.plan.E001");
    CHECK(contains(c.message, k.says));
  }
  CHECK_FALSE(read_with(d.path, good));
}

TEST_CASE("cubin: a complete CUDA ELF of the plan's arch, or mk.plan.E005") {
  const auto good = mkt::fake_cubin(90);
  CHECK(cubin_check(good, 90) == "");
  CHECK(cubin_arch(good.data(), good.size()) == 90);
  CHECK(contains(cubin_check(good, 80), "compiled for sm_90, not sm_80"));
  struct Case {
    const char* what;
    std::function<void(std::vector<char>&)> f;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"truncated", [](auto& c) { c.pop_back(); }, "section header table outside the file"},
      {"cut inside the data", [](auto& c) { c.resize(70); }, "section header table outside"},
      {"trailing bytes", [](auto& c) { c.push_back(0); }, "but its headers describe"},
      {"empty", [](auto& c) { c.clear(); }, "shorter than an ELF header"},
      {"not ELF", [](auto& c) { c[1] = 'X'; }, "not an ELF file"},
      {"32-bit", [](auto& c) { c[4] = 1; }, "not a 64-bit ELF"},
      {"big-endian", [](auto& c) { c[5] = 2; }, "not a little-endian"},
      {"x86-64", [](auto& c) { put_u64(c, 18, 62, 2); }, "ELF machine 62 is not CUDA (190)"},
      {"relocatable", [](auto& c) { put_u64(c, 16, 1, 2); }, "not an executable"},
      {"section table far away", [](auto& c) { put_u64(c, 40, uint64_t(1) << 63, 8); }, "outside the file"},
      {"section count huge", [](auto& c) { put_u64(c, 60, 0xffff, 2); }, "outside the file"},
      {"section data beyond the end", [](auto& c) { put_u64(c, 144 + 32, uint64_t(-8), 8); }, "section 1 lies outside"},
      {"program headers beyond the end", [](auto& c) {
         put_u64(c, 32, 100, 8), put_u64(c, 54, 56, 2), put_u64(c, 56, 3, 2);
       }, "program header table outside"},
      {"odd section entry size", [](auto& c) { put_u64(c, 58, 40, 2); }, "section header size 40"},
  };
  for (const auto& k : cases) {
    CAPTURE(k.what);
    auto c = good;
    k.f(c);
    CHECK(contains(cubin_check(c, 90), k.says));
  }
  // through read_dir: named with the file
  mkt::TempDir d;
  auto p = mkt::fake_plan();
  p.kernels[1].cubin.pop_back();
  plan::write_dir(p, d.str());
  auto c = catch_error([&] { plan::read_dir(d.str()); });
  CHECK(c.id == "mk.plan.E005");
  CHECK(contains(c.message, (d / "mk_test_b1.sm_90.cubin").string() + " is not a complete cubin for sm_90"));
  // a plan that says sm_80 over sm_90 cubins
  p = mkt::fake_plan();
  p.arch = 80;
  plan::write_dir(p, d.str());
  c = catch_error([&] { plan::read_dir(d.str()); });
  CHECK(c.id == "mk.plan.E005");
  CHECK(contains(c.message, "compiled for sm_90, not sm_80"));
}

TEST_CASE("cubin: what NVRTC writes passes the checks, with its arch in e_flags" * doctest::skip(!mkt::have_nvrtc())) {
  mkt::TempDir d;
  mkt::ScopedEnv env("MK_CACHE_DIR", d.str());
  const char* src = "extern \"C\" __global__ void mkt_arch(int* p) { p[threadIdx.x] = 2; }\n";
  for (int arch : {75, 80, 90, 100}) {
    CAPTURE(arch);
    auto r = jit::compile(src, "arch", arch, /*use_cache=*/false);
    CHECK(cubin_check(r.cubin, arch) == "");
    CHECK(cubin_arch(r.cubin.data(), r.cubin.size()) == arch);
  }
}

TEST_CASE("jit cache: a damaged cubin in the cache is dropped and compiled again" * doctest::skip(!mkt::have_nvrtc())) {
  mkt::TempDir d;
  mkt::ScopedEnv env("MK_CACHE_DIR", d.str());
  const char* src = "extern \"C\" __global__ void mkt_damaged(int* p) { p[threadIdx.x] = 3; }\n";
  auto a = jit::compile(src, "damaged", 90);
  REQUIRE(fs::exists(a.cache_file));
  const std::vector<std::function<void(std::string&)>> damages = {
      [](std::string& t) { t.resize(t.size() / 2); }, [](std::string& t) { t[18] = 62; },
      [](std::string& t) { t += "junk"; }};
  for (const auto& damage : damages) {
    std::string text = mkt::read_text(a.cache_file);
    damage(text);
    mkt::write_text(a.cache_file, text);
    auto b = jit::compile(src, "damaged", 90);
    CHECK_FALSE(b.from_cache);
    CHECK(b.cubin == a.cubin);
    CHECK(mkt::read_text(a.cache_file) == std::string(a.cubin.begin(), a.cubin.end()));  // rewritten
    CHECK(jit::compile(src, "damaged", 90).from_cache);
  }
}

TEST_CASE("plan cache: a damaged cached plan is dropped and rebuilt" * doctest::skip(!mkt::have_nvrtc())) {
  mkt::TempDir d;
  mkt::ScopedEnv env("MK_CACHE_DIR", d.str());
  const dsl::ScheduleInfo* info = dsl::find_schedule("allgather.direct");
  REQUIRE(info);
  compiler::CompileOptions o;
  const auto first = compiler::compile_plan(dsl::build(*info, 2, 0), o);
  const fs::path entry = d / "plans" / compiler::plan_key(dsl::build(*info, 2, 0), o);
  REQUIRE(fs::exists(entry / "plan.json"));
  compiler::CompileStats st;
  compiler::compile_plan(dsl::build(*info, 2, 0), o, &st);
  CHECK(st.from_cache);
  // a cubin of the cached plan cut short: the entry is rebuilt, not loaded
  const fs::path cub = entry / first.kernels[0].cubin_file;
  std::string text = mkt::read_text(cub);
  mkt::write_text(cub, text.substr(0, text.size() - 1));
  const auto again = compiler::compile_plan(dsl::build(*info, 2, 0), o);
  CHECK(again.kernels[0].cubin == first.kernels[0].cubin);
  CHECK(mkt::read_text(cub) == text);
  // a cached plan.json that lies about its layout
  json j = plan_json(entry);
  j["kernels"][0]["grid"] = 12345;
  put_json(entry, j);
  const auto third = compiler::compile_plan(dsl::build(*info, 2, 0), o);
  CHECK(third.kernels[0].grid == first.kernels[0].grid);
  CHECK(plan_json(entry)["kernels"][0]["grid"] == first.kernels[0].grid);
}

TEST_CASE("cache directory: where it is, created private, refused when others can write it") {
  {
    mkt::ScopedEnv a("MK_CACHE_DIR", "");
    mkt::ScopedEnv b("XDG_CACHE_HOME", "/x/cache");
    CHECK(jit::cache_dir() == "/x/cache/mkernel");
    mkt::ScopedEnv c("XDG_CACHE_HOME", "");
    mkt::ScopedEnv h("HOME", "/home/u");
    CHECK(jit::cache_dir() == "/home/u/.cache/mkernel");
    ::unsetenv("HOME");
    const std::string fallback = jit::cache_dir();
    CHECK(!contains(fallback, "/tmp"));
    CHECK(contains(fallback, "/.cache/mkernel"));
  }
  mkt::TempDir d;
  const fs::path dir = d / "new" / "cache";
  mkt::ScopedEnv env("MK_CACHE_DIR", dir.string());
  std::string why;
  CHECK(jit::private_cache_dir(&why) == dir.string());
  CHECK(why == "");
  struct stat st {};
  REQUIRE(::stat(dir.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  REQUIRE(::stat((d / "new").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  // writable by others: refused, with the reason
  ::chmod(dir.c_str(), 0777);
  ErrId id{};
  CHECK(jit::private_cache_dir(&why, &id) == "");
  CHECK(id == ErrId::jit_E006);
  CHECK(contains(why, dir.string() + " is writable by every user (mode 0777)"));
  // writable by a group that is not this user's private group (root can
  // give it one; others test it with a group of theirs where they have one)
  ::chmod(dir.c_str(), 0770);
  if (::geteuid() == 0) REQUIRE(::chown(dir.c_str(), 0, 65534) == 0);
  if (::geteuid() == 0 || tfs::mode_problem(::geteuid(), ::getegid(), S_IFDIR | 0770) != "") {
    CHECK(jit::private_cache_dir(&why) == "");
    CHECK(contains(why, "writable by its group"));
  }
  if (::geteuid() == 0) REQUIRE(::chown(dir.c_str(), 0, 0) == 0);
  // owned by someone else
  ::chmod(dir.c_str(), 0700);
  const fs::path foreign = ::geteuid() == 0 ? dir : fs::path("/");
  if (::geteuid() == 0) REQUIRE(::chown(dir.c_str(), 65534, 65534) == 0);
  mkt::ScopedEnv env2("MK_CACHE_DIR", foreign.string());
  CHECK(jit::private_cache_dir(&why, &id) == "");
  CHECK(id == ErrId::jit_E006);
  CHECK(contains(why, "is owned by uid"));
  // a path that cannot be a directory
  mkt::write_text(d / "file", "x");
  mkt::ScopedEnv env3("MK_CACHE_DIR", (d / "file" / "c").string());
  CHECK(jit::private_cache_dir(&why, &id) == "");
  CHECK(id == ErrId::jit_E004);
}

TEST_CASE("cache directory: not private, compiling goes on without it" * doctest::skip(!mkt::have_nvrtc())) {
  mkt::TempDir d;
  ::chmod(d.path.c_str(), 0777);
  mkt::ScopedEnv env("MK_CACHE_DIR", d.str());
  const char* src = "extern \"C\" __global__ void mkt_public(int* p) { p[threadIdx.x] = 4; }\n";
  auto a = jit::compile(src, "public", 90);
  CHECK(cubin_check(a.cubin, 90) == "");
  CHECK(a.cache_file.empty());
  CHECK(fs::is_empty(d.path));  // nothing written where others could plant files
  // a planted cubin under the key is not read either
  ::chmod(d.path.c_str(), 0700);
  auto b = jit::compile(src, "public", 90);
  REQUIRE(!b.cache_file.empty());
  ::chmod(d.path.c_str(), 0777);
  auto c = jit::compile(src, "public", 90);
  CHECK_FALSE(c.from_cache);
}

TEST_CASE("resource_key: the layout, not dtype, op, names or code") {
  const auto p = mkt::fake_plan();
  const auto& k = p.kernels[1];
  const std::string key = plan::resource_key(p, k);
  CHECK(key.size() == 32);
  auto same = [&](const std::function<void(plan::Plan&, plan::Kernel&)>& f) {
    auto q = p;
    f(q, q.kernels[1]);
    return plan::resource_key(q, q.kernels[1]) == key;
  };
  CHECK(same([](auto& q, auto&) { q.dtype = DType::bf16; }));
  CHECK(same([](auto& q, auto&) { q.op = RedOp::max; }));
  CHECK(same([](auto&, auto& x) { x.name = "other"; }));
  CHECK(same([](auto&, auto& x) { x.cubin_file = "other.cubin"; }));
  CHECK(same([](auto&, auto& x) { x.source_file = "other.cu"; }));
  CHECK(same([](auto&, auto& x) { x.cubin.push_back(1); }));
  // every layout field counts, including the ones the old hand-kept list missed
  CHECK_FALSE(same([](auto& q, auto&) { q.topology = topology::single(q.nranks, topology::Link::pcie); }));
  CHECK_FALSE(same([](auto& q, auto&) { q.topology = topology::parse("2x1:direct", q.nranks); }));
  CHECK_FALSE(same([](auto& q, auto&) { q.arch = 80; }));
  CHECK_FALSE(same([](auto& q, auto&) { q.coll = Collective::allgather; }));
  CHECK_FALSE(same([](auto& q, auto&) { q.nranks = 3; }));
  CHECK_FALSE(same([](auto& q, auto&) { q.zero_copy = true; }));
  CHECK_FALSE(same([](auto& q, auto&) { q.mkernel_version = "9"; }));
  CHECK_FALSE(same([](auto&, auto& x) { x.flag_slots = 9; }));
  CHECK_FALSE(same([](auto&, auto& x) { x.max_bytes = 1 << 30; }));
  CHECK_FALSE(same([](auto&, auto& x) { x.scratch_bytes += 16; }));
  CHECK_FALSE(same([](auto&, auto& x) { x.proto = "ll"; }));
}

TEST_CASE("MK_PLAN_DIR: a bad directory fails every call the same way, from any thread") {
  mkt::TempDir d;
  plan::write_dir(mkt::fake_plan(), (d / "ar").string());
  json j = plan_json(d / "ar");
  j["kernels"][0]["grid"] = "six";
  put_json(d / "ar", j);
  mkt::ScopedEnv env("MK_PLAN_DIR", d.str());
  auto call = [] {
    try {
      rt::get_plan("allreduce.ring", Collective::allreduce, 2, DType::fp16, RedOp::avg, 90, false);
    } catch (const rt::RtError& e) {
      return std::to_string(int(e.code())) + " " + e.what();
    }
    return std::string("no error");
  };
  const std::string first = call();
  CHECK(contains(first, std::to_string(int(mkInvalidArgument)) + " MK_PLAN_DIR: [mk.plan.E001]"));
  CHECK(contains(first, "$.kernels[0].grid: expected an integer"));
  CHECK(call() == first);
  std::vector<std::string> got(4);
  std::vector<std::thread> ts;
  for (size_t i = 0; i < got.size(); ++i) ts.emplace_back([&, i] { got[i] = call(); });
  for (auto& t : ts) t.join();
  for (const auto& g : got) CHECK(g == first);
  CHECK_THROWS_AS(rt::plan_dir_digest(), rt::RtError);
  // repaired: the plans load, and the digest follows the files
  plan::write_dir(mkt::fake_plan(), (d / "ar").string());
  mkt::ScopedEnv again("MK_PLAN_DIR", d.str() + "/");  // another value: read again
  auto p = rt::get_plan("allreduce.ring", Collective::allreduce, 2, DType::fp16, RedOp::avg, 90, false);
  CHECK(p->kernels.size() == 2);
  const std::string digest = rt::plan_dir_digest();
  CHECK(digest.size() == 32);
  auto other = mkt::fake_plan();
  other.kernels[0].cubin[70] ^= 1;
  plan::write_dir(other, (d / "ar").string());
  mkt::ScopedEnv third("MK_PLAN_DIR", d.str() + "//");
  CHECK(rt::plan_dir_digest() != digest);
  mkt::ScopedEnv missing("MK_PLAN_DIR", (d / "nope").string());
  auto c = catch_error([] { rt::plan_dir_digest(); });
  CHECK(contains(c.what, "is not a directory"));
}

TEST_CASE("get_plan: plans compiled with other MK_TUNE values are other plans" * doctest::skip(!mkt::have_nvrtc())) {
  mkt::ScopedEnv cache("MK_CACHE_DIR", mkt::process_cache_dir());
  mkt::ScopedEnv dir("MK_PLAN_DIR", "");
  auto get = [] { return rt::get_plan("allgather.direct", Collective::allgather, 2, DType::fp32, RedOp::sum, 90, false); };
  std::shared_ptr<const plan::Plan> a, b;
  {
    mkt::ScopedEnv tune("MK_TUNE", "simple_instances=2");
    a = get();
  }
  {
    mkt::ScopedEnv tune("MK_TUNE", "simple_instances=3");
    b = get();
  }
  REQUIRE(a->kernels.size() == 2);
  REQUIRE(b->kernels.size() == 2);
  CHECK(a->kernels[1].instances == 2);
  CHECK(b->kernels[1].instances == 3);
}

// A plan compiled for one rank class (mkc compile --rank) says which ranks
// it serves; a malformed list is refused, and a runtime rank outside it gets
// mk.plan.E006 naming the ranks and the command for its own (regression: a
// plan had no notion of ranks, so another rank's kernel would run nothing).
TEST_CASE("plan: serves lists the ranks a plan runs on, another rank gets mk.plan.E006") {
  auto p = mkt::fake_plan();
  CHECK(plan::serves(p, 0));
  CHECK(plan::serves(p, 1));
  CHECK_FALSE(plan::serves(p, 2));
  CHECK(plan::served_ranks(p) == "0-1");
  CHECK(plan::to_json(p).find("serves") == std::string::npos);  // every rank: no field
  p.serves = {1};
  mkt::TempDir d;
  plan::write_dir(p, d.str());
  const auto back = plan::read_dir(d.str());
  CHECK(back.serves == std::vector<int32_t>{1});
  CHECK(plan::resource_key(back, back.kernels[0]) == plan::resource_key(mkt::fake_plan(), back.kernels[0]));
  CHECK(plan::serves(back, 1));
  CHECK_FALSE(plan::serves(back, 0));
  CHECK_NOTHROW(plan::check_serves(back, 1, "x"));
  auto c = catch_error([&] { plan::check_serves(back, 0, "/plans/ar"); });
  CHECK(c.id == "mk.plan.E006");
  CHECK(contains(c.what, "/plans/ar: plan allreduce.ring for 2 ranks was compiled for ranks 1 only"));
  CHECK(contains(c.what, "not rank 0"));
  CHECK(contains(c.what, "--rank 0"));
  const json good = plan_json(d.path);
  for (const json& bad : {json::array(), json({1, 1}), json({1, 0}), json({2}), json({-1}), json("1"), json({0, 1, 1})}) {
    CAPTURE(bad.dump());
    json j = good;
    j["serves"] = bad;
    put_json(d.path, j);
    auto e = catch_error([&] { plan::read_dir(d.str()); });
    CHECK(e.id == "mk.plan.E001");
    CHECK(contains(e.what, "$.serves"));
  }
  // the runtime: MK_PLAN_DIR's plan for rank 1 serves rank 1, not rank 0
  put_json(d.path, good);
  mkt::ScopedEnv env("MK_PLAN_DIR", d.str());
  CHECK(rt::get_plan("allreduce.ring", Collective::allreduce, 2, DType::fp16, RedOp::avg, 90, false, 0, 1)->serves ==
        std::vector<int32_t>{1});
  auto r = catch_error([] { rt::get_plan("allreduce.ring", Collective::allreduce, 2, DType::fp16, RedOp::avg, 90, false, 0, 0); });
  CHECK(contains(r.what, "[mk.plan.E006]"));
  CHECK(contains(r.what, "not rank 0"));
  auto all = catch_error([] { rt::get_plan("allreduce.ring", Collective::allreduce, 2, DType::fp16, RedOp::avg, 90, false); });
  CHECK(contains(all.what, "a plan for every rank is needed"));
}

TEST_CASE("MK_PLAN_DIR: a schedule known only from its plans can be selected, serves what it was compiled for, "
          "and says what to compile otherwise") {
  mkt::TempDir d;
  auto shipped = mkt::fake_plan();  // all-reduce, 2 ranks, fp16 avg, sm_90
  shipped.schedule = "shipped.allreduce";
  plan::write_dir(shipped, (d / "ar").string());
  mkt::ScopedEnv env("MK_PLAN_DIR", d.str());
  REQUIRE(dsl::find_schedule("shipped.allreduce") == nullptr);  // no source anywhere
  const auto known = rt::plan_dir_schedule("shipped.allreduce");
  REQUIRE(known.has_value());
  CHECK(known->coll == Collective::allreduce);
  CHECK(known->nranks == std::set<int32_t>{2});
  CHECK_FALSE(rt::plan_dir_schedule("shipped.nothing").has_value());
  // MK_ALGO and a selection table may name it, for its collective only
  CHECK(rt::env::parse_algo("allreduce=shipped.allreduce").at(Collective::allreduce) == "shipped.allreduce");
  auto c = catch_error([] { rt::env::parse_algo("allgather=shipped.allreduce"); });
  CHECK(contains(c.what, "schedule 'shipped.allreduce' implements allreduce, not allgather"));
  c = catch_error([] { rt::env::parse_algo("allreduce=shipped.nothing"); });
  CHECK(contains(c.what, "no schedule named 'shipped.nothing'"));
  const auto t = rt::parse_select(R"({"mkernel_select": 1, "entries": [
    {"collective": "allreduce", "min_ranks": 2, "schedule": "shipped.allreduce"}]})", "t.json");
  CHECK(t.entries.at(0).schedule == "shipped.allreduce");
  // its plan serves the calls it was compiled for ...
  auto p = rt::get_plan("shipped.allreduce", Collective::allreduce, 2, DType::fp16, RedOp::avg, 90, false);
  CHECK(p->schedule == "shipped.allreduce");
  // ... and another dtype says what to compile
  c = catch_error([] { rt::get_plan("shipped.allreduce", Collective::allreduce, 2, DType::fp32, RedOp::sum, 90, false); });
  CHECK(contains(c.what, "schedule shipped.allreduce is known only from MK_PLAN_DIR's plans"));
  CHECK(contains(c.what, "--dtype fp32 --op sum --ranks 2 --arch sm_90"));
  // selected for another rank count: init fails, naming the rank counts it has
  {
    mkt::ScopedEnv algo("MK_ALGO", "allreduce=shipped.allreduce");
    c = catch_error([] { rt::prove_user_schedules("", 4); });
    CHECK(contains(c.what, "MK_ALGO selects schedule 'shipped.allreduce' for 4 ranks"));
    CHECK(contains(c.what, "whose plans of it are for 2 ranks"));
    CHECK_NOTHROW(rt::prove_user_schedules("", 2));
  }
}

// Ranks of one process whose plans differ (a one-pass kernel: a code path per
// rank) compile at once: each compile tells, before NVRTC, the ranks its plan
// will serve, and a rank it will not serve starts its own. A plan that serves
// every rank is still compiled once, the others waiting for it.
TEST_CASE("get_plan: ranks of one process compile their own one-pass plans together, and a shared plan once" *
          doctest::skip(!mkt::have_nvrtc())) {
  mkt::TempDir d;  // a cold cache: every plan is compiled
  mkt::ScopedEnv env("MK_CACHE_DIR", d.str());
  auto run = [](const std::string& schedule) {
    std::vector<std::shared_ptr<const plan::Plan>> got(3);
    std::vector<std::thread> ts;
    for (int r = 0; r < 3; ++r)
      ts.emplace_back([&, r] {
        // a grid cap no other test uses (above these kernels' grids): a key of its own in the process's plan store
        got[size_t(r)] = rt::get_plan(schedule, Collective::allreduce, 3, DType::fp32, RedOp::max, 90, false, 997, r);
      });
    for (auto& t : ts) t.join();
    return got;
  };
  rt::plan_compiles(/*reset=*/true);
  const auto own = run("allreduce.one_shot");
  for (int r = 0; r < 3; ++r) {
    CHECK(own[size_t(r)]->serves == std::vector<int32_t>{r});
    CHECK(plan::serves(*own[size_t(r)], r));
  }
  const rt::PlanCompiles a = rt::plan_compiles(true);
  CHECK(a.started == 3);
  CHECK(a.peak_at_once >= 2);  // before: one after another (peak 1)
  const auto shared = run("allreduce.ring");
  CHECK(shared[0] == shared[1]);
  CHECK(shared[1] == shared[2]);
  CHECK(shared[0]->serves.empty());
  CHECK(rt::plan_compiles().started == 1);
}
