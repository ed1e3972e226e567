// Code generation (golden CUDA sources in tests/golden/*.cu), NVRTC
// compilation of every built-in schedule for sm_90, the jit helpers and the
// disk caches (cubins and whole plans).
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <functional>
#include <map>
#include <random>
#include <regex>
#include <sstream>
#include <set>

#include <fmt/format.h>

#include "compiler/codegen/codegen.hpp"
#include "compiler/compile.hpp"
#include "compiler/jit/jit.hpp"
#include "compiler/pipeline.hpp"
#include "compiler/plan/plan.hpp"
#include "compiler/topology/topology.hpp"
#include "mk/dsl.hpp"
#include "support.hpp"
#include "templates/abi.cuh"
#include "templates/ref.cuh"

using namespace mk;
using mkt::catch_error;
using mkt::contains;
namespace fs = std::filesystem;

namespace {

compiler::Lowered lower_builtin(const std::string& name, int n) {
  const auto* info = dsl::find_schedule(name);
  REQUIRE(info != nullptr);
  compiler::LowerOptions o;
  return compiler::lower(dsl::build(*info, n), o);
}

bool is_elf(const std::vector<char>& b) { return b.size() > 64 && std::string(b.data(), 4) == "\x7f" "ELF"; }

bool holds(const std::vector<char>& b, const std::string& s) {
  return std::search(b.begin(), b.end(), s.begin(), s.end()) != b.end();
}

size_t entries(const fs::path& dir) {
  if (!fs::exists(dir)) return 0;
  return size_t(std::distance(fs::directory_iterator(dir), fs::directory_iterator()));
}

void golden_units(const std::string& schedule, int n, DType t, RedOp op, bool lamport = false) {
  auto l = lower_builtin(schedule, n);
  for (auto& v : l.variants) v = passes::mark_lamport(std::move(v), t, lamport);  // as compile_plan does
  const std::string tag =
      fmt::format("{}_n{}_{}_{}{}", codegen::identifier(schedule), n, name(t), name(op), lamport ? "_lamport" : "");
  auto units = codegen::generate(l.variants, t, op, tag);
  REQUIRE(units.size() == l.variants.size());
  for (size_t b = 0; b < units.size(); ++b) {
    CAPTURE(b);
    const auto& k = units[b].kernel;
    CHECK(k.name == "mk_" + tag + "_b" + std::to_string(b));
    CHECK(k.grid == l.variants[b].tbs * l.variants[b].instances);
    CHECK(k.block == (l.variants[b].proto == ir::Proto::ll ? 256 : 512));
    CHECK(k.classes >= 1);
    // the source declares the kernel, includes the templates by name and
    // carries the plan's constants
    CHECK(contains(units[b].source, "extern \"C\" __global__ void __launch_bounds__"));
    CHECK(contains(units[b].source, k.name + "(const mk::dev::Args a)"));
    CHECK(contains(units[b].source, "#include \"kernel.cuh\""));
    CHECK(contains(units[b].source, "kRanks = " + std::to_string(n)));
    CHECK(contains(units[b].source, std::string("using T = ") + std::string(dtype_device_name(t)) + ";"));
    mkt::check_golden(tag + ".b" + std::to_string(b) + ".cu", units[b].source);
  }
}

}  // namespace

TEST_CASE("codegen golden: allreduce.ring, 4 ranks, fp32 sum") { golden_units("allreduce.ring", 4, DType::fp32, RedOp::sum); }

TEST_CASE("codegen golden: broadcast.direct, 3 ranks, bf16") { golden_units("broadcast.direct", 3, DType::bf16, RedOp::sum); }

TEST_CASE("codegen golden: reducescatter.direct, 2 ranks, int8 max") {
  golden_units("reducescatter.direct", 2, DType::int8, RedOp::max);
}

TEST_CASE("codegen golden: allreduce.one_shot, 3 ranks, fp16 max, Lamport packets in its one-pass bucket") {
  golden_units("allreduce.one_shot", 3, DType::fp16, RedOp::max, true);
  CHECK(mkt::contains(mkt::read_text(fs::path(mkt::test_dir()) / "golden" /
                                     "allreduce_one_shot_n3_fp16_max_lamport.b0.cu"),
                      "kLamport = true"));
}

// Lamport kernels compile for every dtype they serve, with each number of
// units in flight (the number a thread can hold depends on the op's sources:
// 2 at 3 ranks' one-shot reduce, 1 from 5).
TEST_CASE("codegen: Lamport kernels compile with NVRTC for every dtype they serve and every unit count" *
          doctest::skip(!mkt::have_nvrtc())) {
  mkt::ScopedEnv cache("MK_CACHE_DIR", mkt::process_cache_dir());
  struct Case {
    const char* schedule;
    int n;
    DType t;
    RedOp op;
    int units;
  };
  for (const Case& c : {Case{"allreduce.one_shot", 3, DType::fp32, RedOp::sum, 4},
                        Case{"allreduce.one_shot", 2, DType::bf16, RedOp::avg, 4},
                        Case{"allreduce.one_shot", 5, DType::fp16, RedOp::max, 2},
                        Case{"reducescatter.direct", 3, DType::fp8e4m3, RedOp::sum, 2},
                        Case{"allgather.direct", 2, DType::fp8e5m2, RedOp::sum, 1},
                        Case{"alltoall.direct", 4, DType::bf16, RedOp::sum, 3}}) {
    CAPTURE(c.schedule);
    CAPTURE(c.n);
    compiler::CompileOptions o;
    o.dtype = c.t;
    o.op = c.op;
    o.lower.max_bytes = 65536;
    o.lower.proto.lamport_units = c.units;
    const plan::Plan p = compiler::compile_plan(dsl::build(*dsl::find_schedule(c.schedule), c.n, 0), o);
    REQUIRE(p.kernels.size() == 1);
    CHECK(p.kernels[0].lamport);
    CHECK(contains(p.kernels[0].source, fmt::format("kLamportUnits = {}", c.units)));
    CHECK(is_elf(p.kernels[0].cubin));
  }
}

TEST_CASE("codegen: generation is deterministic and depends on dtype and op") {
  auto l = lower_builtin("allreduce.two_shot", 4);
  auto a = codegen::generate(l.variants, DType::fp16, RedOp::avg, "t");
  auto b = codegen::generate(l.variants, DType::fp16, RedOp::avg, "t");
  auto c = codegen::generate(l.variants, DType::fp16, RedOp::max, "t");
  auto d = codegen::generate(l.variants, DType::bf16, RedOp::avg, "t");
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].source == b[i].source);
    CHECK(a[i].source != c[i].source);
    CHECK(a[i].source != d[i].source);
    CHECK(contains(a[i].source, "kRed = " + std::to_string(int(RedOp::avg))));
    CHECK(contains(c[i].source, "kRed = " + std::to_string(int(RedOp::max))));
  }
}

TEST_CASE("codegen: identifiers") {
  CHECK(codegen::identifier("allreduce.ring") == "allreduce_ring");
  CHECK(codegen::identifier("my-sched v2") == "my_sched_v2");
  CHECK(codegen::identifier("9lives") == "s_9lives");
  CHECK(codegen::identifier("") == "s_");
}

TEST_CASE("codegen: the embedded templates are the files in templates/") {
  std::set<std::string> names;
  for (const auto& [n, text] : codegen::embedded_templates()) {
    names.insert(std::string(n));
    CHECK(!text.empty());
    const fs::path file = fs::path(mkt::test_dir()).parent_path() / "templates" / std::string(n);
    CAPTURE(file.string());
    REQUIRE(fs::exists(file));
    CHECK(mkt::read_text(file) == std::string(text));
  }
  for (const char* n : {"kernel.cuh", "dtype.cuh", "reduce.cuh", "layout.cuh", "prims.cuh", "prims_ll.cuh",
                        "prims_lamport.cuh", "prims_simple.cuh", "sync.cuh", "zero_copy.cuh"})
    CHECK(names.count(n) == 1);
}

TEST_CASE("codegen: rank classes") {
  // Symmetric schedules written step-major share one code path for all ranks
  // (codegen.hpp).
  for (std::string s : {"allreduce.ring", "allreduce.two_shot", "reducescatter.direct", "reducescatter.ring"}) {
    for (int n : {2, 3, 4, 8}) {
      auto l = lower_builtin(s, n);
      for (const auto& v : l.variants) {
        CAPTURE(s);
        CAPTURE(n);
        auto rc = codegen::rank_classes(v);
        CHECK(rc.class_of.size() == size_t(n));
        CHECK(rc.representative.size() == 1);
        CHECK(rc.representative[0] == 0);
      }
    }
  }
  // A rooted collective: the root's program differs from the others'.
  auto l = lower_builtin("broadcast.direct", 4);
  auto rc = codegen::rank_classes(l.variants.back());
  CHECK(rc.class_of.size() == 4);
  CHECK(rc.representative.size() >= 2);
  CHECK(rc.class_of[0] != rc.class_of[1]);
  for (size_t c = 0; c < rc.representative.size(); ++c)
    CHECK(rc.class_of[size_t(rc.representative[c])] == int32_t(c));
}

// Step-major ring and direct schedules are one code path for all ranks
// (regression: the canonical form and the flag-slot numbering used to depend
// on how different thread blocks' ops interleave). allreduce.one_shot sums in
// absolute rank order (bit-identical results on every rank), so the input's
// place among a reduce's sources differs per rank: its reduce is wide, with
// the operands (kinds included) from the rank table, so it too is one class
// (regression: one class per rank). The rooted collectives' non-root ranks
// differ only in peers and slots: they share a class through rank tables,
// the root has its own.
TEST_CASE("codegen: symmetric schedules have one rank class, asymmetric ones one per different program") {
  for (std::string s : {"allgather.direct", "alltoall.direct", "allgather.ring", "allreduce.ring",
                        "allreduce.two_shot", "reducescatter.ring", "reducescatter.direct"})
    for (int n : {3, 4, 8})
      for (const auto& v : lower_builtin(s, n).variants) {
        CAPTURE(s);
        CAPTURE(n);
        // one-pass kernels unroll every op: a class per distinct program, at most one per rank
        if (v.one_pass)
          CHECK(codegen::rank_classes(v).representative.size() <= size_t(n));
        else
          CHECK(codegen::rank_classes(v).representative.size() == 1);
      }
  // The hierarchical schedules take the rail blocks in the ring's order
  // relative to the node (regression: absolute order, one class per node).
  for (std::string s : {"allreduce.hier", "allgather.hier", "reducescatter.hier"})
    for (const char* t : {"2x4:direct", "4x2:direct", "3x2:direct", "8x8:direct"}) {
      CAPTURE(s);
      CAPTURE(t);
      const auto topo = topology::parse(t, 0);
      for (const auto& v : compiler::lower(dsl::build(*dsl::find_schedule(s), topo), compiler::LowerOptions{}).variants)
        CHECK(codegen::rank_classes(v).representative.size() <= (v.one_pass ? size_t(v.nranks) : 1));
    }
  // One-shot's one-pass reduce reads each rank's own input at its own place
  // in the fixed rank order: a code path per rank by default; with
  // one_pass_generic one generic op (operands from the rank's table row,
  // kernel.cuh op_gpass) serves every rank, as the wide ops do above 8.
  for (int n : {2, 3, 4, 6, 8, 16})
    for (const auto& v : lower_builtin("allreduce.one_shot", n).variants) {
      CAPTURE(n);
      CHECK(codegen::rank_classes(v).representative.size() == (v.one_pass ? size_t(n) : 1));
      CHECK(codegen::rank_classes(v, true).representative.size() == 1);
    }
  for (const auto& v : compiler::lower(dsl::build(*dsl::find_schedule("reducescatter.hier"), topology::parse("1x8:direct", 0)),
                                       compiler::LowerOptions{})
                           .variants) {
    CHECK(codegen::rank_classes(v).representative.size() == (v.one_pass ? size_t(8) : 1));
    CHECK(codegen::rank_classes(v, true).representative.size() == 1);
  }
  for (std::string s : {"broadcast.direct", "reduce.direct"})
    for (const auto& v : lower_builtin(s, 4).variants) {
      CAPTURE(s);
      auto rc = codegen::rank_classes(v);
      CHECK(rc.class_of == std::vector<int32_t>{0, 1, 1, 1});
      CHECK(rc.why[0].empty());
      CHECK(contains(rc.why[1], "rank 1 differs from rank 0"));
    }
}

// Ranks that differ by more than a rotation (partner r xor 2^k) share one code
// path: the numbers they disagree on come from a rank-indexed table, the ones
// they agree on stay constants (regression: one class, so one copy of the
// program, per rank).
TEST_CASE("codegen: halving-doubling is one rank class with a rank table") {
  for (int n : {4, 8, 16, 64}) {
    CAPTURE(n);
    auto l = lower_builtin("allreduce.halving_doubling", n);
    for (const auto& v : l.variants) CHECK(codegen::rank_classes(v).representative.size() == 1);
    auto units = codegen::generate(l.variants, DType::fp32, RedOp::sum, "t");
    for (const auto& u : units) {
      CHECK(u.kernel.classes == 1);
      CHECK(contains(u.source, "static constexpr short kClassOf"));
      CHECK(contains(u.source, fmt::format("const short kMember{}[{}]", u.kernel.name.back(), n)));
      CHECK(contains(u.source, "(c, kT"));
      CHECK(u.kernel.table_bytes > 0);
      CHECK(u.kernel.size < 2000);  // O(one rank's program), not O(n x program)
    }
  }
  // The table holds what differs; the rest is specialised: at 8 ranks each
  // step's partner differs per rank, the operation count per step does not.
  auto a = codegen::generate(lower_builtin("allreduce.halving_doubling", 8).variants, DType::fp32, RedOp::sum, "t");
  auto b = codegen::generate(lower_builtin("allreduce.halving_doubling", 64).variants, DType::fp32, RedOp::sum, "t");
  CHECK(b[1].kernel.size < 4 * a[1].kernel.size);
}

// The templated primitive is unrolled over its operands and keeps LL formats
// in 32-bit masks: an op of more than 8 sources or destinations is wide (a
// loop over a runtime operand list), so NVRTC's time stays flat in the rank
// count (regression: 64-source reduces took NVRTC 20-60 s, and a 64-way LL
// op's masks overflowed, marking the output as LL). The size E005 bounds
// counts a wide op's instantiation once, not per operand.
TEST_CASE("codegen: ops of more than 8 operands are wide, and weigh little") {
  // an unrolled op (kernel.cuh's named forms): its source and destination lists
  const std::regex templated(R"(c\.(?:template )?(?:copy|reduce|reduce_final)(?:_pass)?(?:<\d+u, \d+u>)?\(\{([^}]*)\}, \{([^}]*)\})");
  size_t total_unrolled = 0;  // the pattern matches something: the checks below are not vacuous
  auto operands = [](const std::string& list) {
    size_t k = 0;
    for (size_t at = list.find("_ref("); at != std::string::npos; at = list.find("_ref(", at + 1)) ++k;
    return k;
  };
  for (std::string s : {"allreduce.two_shot", "reducescatter.direct", "reduce.direct", "allreduce.one_shot"})
    for (int n : {16, 64}) {
      CAPTURE(s);
      CAPTURE(n);
      auto l = lower_builtin(s, n);
      auto units = codegen::generate(l.variants, DType::fp32, RedOp::sum, "t");
      for (const auto& u : units) {
        CHECK(contains(u.source, "op_wide<"));
        size_t unrolled = 0;
        for (std::sregex_iterator m(u.source.begin(), u.source.end(), templated), end; m != end; ++m, ++unrolled) {
          CAPTURE(m->str());
          CHECK(operands((*m)[1]) >= 1);
          CHECK(operands((*m)[1]) <= 8);
          CHECK(operands((*m)[2]) <= 8);
        }
        total_unrolled += unrolled;
        CHECK(u.kernel.size < 1500);
      }
    }
  CHECK(total_unrolled > 0);
}

// A kernel too large for NVRTC is refused before NVRTC runs, naming the ranks
// that could not share code (regression: E005 was never raised; NVRTC ran for
// minutes and gigabytes, or ptxas ran out of memory).
// An all-gather in which rank r pushes its block to the ranks below it in one
// copy and to those above it in another: the copies' destination counts
// differ per rank, so every rank but the last (the first's mirror image) is
// its own class.
ir::Schedule uneven_allgather(int n) {
  dsl::Program p(Collective::allgather, n, 0, "test.uneven");
  for (int r = 0; r < n; ++r) {
    p.copy(p.output(r, r), p.input(r, 0));
    std::vector<dsl::Chunk> lo, hi;
    for (int q = 0; q < n; ++q)
      if (q != r) (q < r ? lo : hi).push_back(p.output(q, r));
    if (!lo.empty()) p.copy(lo, p.input(r, 0));
    if (!hi.empty()) p.copy(hi, p.input(r, 0));
  }
  return std::move(p.ir());
}

TEST_CASE("codegen: a kernel over the size limit is refused with E005 and says which ranks differ") {
  auto l = compiler::lower(uneven_allgather(8), compiler::LowerOptions{});
  REQUIRE(codegen::rank_classes(l.variants.back()).representative.size() == 7);
  codegen::Limits small;
  small.max_size = 300;
  auto c = catch_error([&] { codegen::generate(l.variants, DType::fp32, RedOp::sum, "t", small); });
  CHECK(c.id == "mk.jit.E005");
  CHECK(contains(c.what, "7 rank class(es)"));
  CHECK(contains(c.what, "rank 1 differs from rank 0 in thread block"));
  CHECK(contains(c.what, "mkc show --classes"));
  // a limit is a limit: a small schedule over a small one fails the same way
  codegen::Limits tiny;
  tiny.max_size = 10;
  auto d = catch_error([&] { codegen::generate(lower_builtin("allreduce.ring", 4).variants, DType::fp32, RedOp::sum, "t", tiny); });
  CHECK(d.id == "mk.jit.E005");
  CHECK(contains(d.what, "one class, but too many steps"));
}

// One rank's plan: only the code (and tables) of that rank's class, so its
// size does not grow with the number of classes; the other ranks' class is
// -1 (they run nothing), and the plan says whom it serves (regression: every
// plan held every class; until s22 one-pass kernels still did).
TEST_CASE("codegen: --rank generates only that rank's class, plans say which ranks they serve") {
  auto l = compiler::lower(uneven_allgather(8), compiler::LowerOptions{});
  const auto all = codegen::generate(l.variants, DType::fp32, RedOp::sum, "t");
  for (int r : {0, 3, 7}) {
    CAPTURE(r);
    const auto one = codegen::generate(l.variants, DType::fp32, RedOp::sum, "t", {}, r);
    REQUIRE(one.size() == all.size());
    for (size_t b = 0; b < one.size(); ++b) {
      // (one-pass kernels too: a rank's first call compiles its own code path only)
      const auto rc = codegen::rank_classes(l.variants[b]);
      const int32_t mine = rc.class_of[size_t(r)];
      std::vector<int32_t> members;
      for (int32_t v = 0; v < 8; ++v)
        if (rc.class_of[size_t(v)] == mine) members.push_back(v);
      CHECK(one[b].serves == members);
      CHECK(all[b].serves.empty());
      CHECK(one[b].kernel.size * 3 < all[b].kernel.size);
      CHECK(contains(one[b].source, fmt::format("    case {}:\n", mine)));
      for (int32_t c = 0; c < int32_t(rc.representative.size()); ++c)
        if (c != mine) CHECK_FALSE(contains(one[b].source, fmt::format("    case {}:\n", c)));
      CHECK(contains(one[b].source, "kClassOf[8] = {"));
      CHECK(contains(one[b].source, "-1"));
    }
  }
  // a rooted collective's virtual rank moves with the root: every class stays
  for (const auto& u : codegen::generate(lower_builtin("broadcast.direct", 4).variants, DType::fp32, RedOp::sum, "t", {}, 2))
    CHECK(u.serves.empty());
}

TEST_CASE("codegen: a one-rank plan with big rank tables holds only that rank's rows") {
  // Forced at 16 ranks (row_only_bytes 0); by default it starts at 64 KiB of
  // tables (1024-rank hierarchical plans).
  auto l = lower_builtin("allreduce.halving_doubling", 16);
  codegen::Limits rows;
  rows.row_only_bytes = 0;
  const auto full = codegen::generate(l.variants, DType::fp32, RedOp::sum, "t", {}, 5);
  const auto one = codegen::generate(l.variants, DType::fp32, RedOp::sum, "t", rows, 5);
  REQUIRE(one.size() == full.size());
  for (size_t b = 0; b < one.size(); ++b) {
    CAPTURE(b);
    CHECK(full[b].serves.size() == 16);  // one class: the default keeps every row
    CHECK(one[b].serves == std::vector<int32_t>{5});
    CHECK(one[b].kernel.table_bytes * 8 < full[b].kernel.table_bytes);
    // The one row is rank 5's row of the full table.
    const std::string head = fmt::format("kT{}_c0[", b);
    auto rows_of = [&](const std::string& src) {
      std::vector<std::string> out;
      size_t at = src.find(head);
      REQUIRE(at != std::string::npos);
      at = src.find("{\n", at) + 2;
      for (size_t end; src.compare(at, 2, "};") != 0; at = end + 1) {
        end = src.find('\n', at);
        out.push_back(src.substr(at, end - at));
      }
      return out;
    };
    const auto all_rows = rows_of(full[b].source);
    const auto my_rows = rows_of(one[b].source);
    REQUIRE(all_rows.size() == 16);
    REQUIRE(my_rows.size() == 1);
    CHECK(my_rows[0] == all_rows[5]);
    // Rank 5 reads row 0, and no other rank runs the kernel.
    CHECK(contains(one[b].source, "kMember" + std::to_string(b) + "[16] = {0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0}"));
    CHECK(contains(one[b].source, "kClassOf[16] = {-1,-1,-1,-1,-1,0,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1}"));
    // The code is the same.
    const auto code = [](const std::string& src) {
      const size_t from = src.rfind("static __device__ ", src.find(" void b0_c0_tb0("));
      const size_t to = src.find("static constexpr short kClassOf");
      REQUIRE(from != std::string::npos);
      REQUIRE(to != std::string::npos);
      return src.substr(from, to - from);
    };
    CHECK(code(one[b].source) == code(full[b].source));
  }
}

TEST_CASE("compile: --rank R makes a plan serving R's class, a rank out of range is cli E004" *
          doctest::skip(!mkt::have_nvrtc())) {
  mkt::ScopedEnv cache("MK_CACHE_DIR", mkt::process_cache_dir());
  compiler::CompileOptions o;
  o.rank = 7;  // the uneven all-gather's rank 7 shares rank 0's class
  auto p = compiler::compile_plan(uneven_allgather(8), o);
  CHECK(p.serves == std::vector<int32_t>{0, 7});
  CHECK(contains(plan::summary(p), "(serves ranks 0,7)"));
  o.rank = 3;
  CHECK(compiler::compile_plan(uneven_allgather(8), o).serves == std::vector<int32_t>{3});
  o.rank = -1;
  CHECK(compiler::compile_plan(uneven_allgather(8), o).serves.empty());
  o.rank = 0;  // one class: the plan serves every rank
  CHECK(compiler::compile_plan(dsl::build(*dsl::find_schedule("allreduce.ring"), 4), o).serves.empty());
  o.rank = 8;
  auto c = catch_error([&] { compiler::compile_plan(uneven_allgather(8), o); });
  CHECK(c.id == "mk.cli.E004");
  CHECK(contains(c.what, "--rank 8 is not a rank of 8"));
}

// ---- NVRTC --------------------------------------------------------------------

TEST_CASE("jit: architecture names") {
  CHECK(jit::parse_arch("sm_90") == 90);
  CHECK(jit::parse_arch("90") == 90);
  CHECK(jit::parse_arch("compute_90") == 90);
  CHECK(jit::parse_arch("9.0") == 90);
  CHECK(jit::parse_arch("sm_90a") == 90);
  CHECK(jit::parse_arch("sm_100") == 100);
  CHECK(jit::parse_arch("sm_100f") == 100);
  CHECK(jit::parse_arch("SM_80") == 80);
  CHECK(jit::arch_name(90) == "sm_90");
  for (const char* bad : {"", "sm_", "gpu", "sm_9x", "1000", "sm_-1", "hopper", "9.0.1"}) {
    CAPTURE(bad);
    auto c = catch_error([&] { jit::parse_arch(bad); });
    CHECK(c.id == "mk.cli.E010");
    CHECK(contains(c.what, "sm_90"));  // the hint shows the expected form
  }
}

TEST_CASE("jit: hashes and the cache location") {
  CHECK(jit::hash_hex("a").size() == 32);
  CHECK(jit::hash_hex("a") == jit::hash_hex("a"));
  CHECK(jit::hash_hex("a") != jit::hash_hex("b"));
  CHECK(jit::hash_hex("") != jit::hash_hex(std::string(1, '\0')));
  CHECK(jit::templates_hash().size() == 32);
  mkt::TempDir d;
  mkt::ScopedEnv env("MK_CACHE_DIR", d.str());
  CHECK(jit::cache_dir() == d.str());
}

namespace {
const char* kTinyKernel = "#include \"common.cuh\"\nextern \"C\" __global__ void mkt_tiny(int* p) { p[threadIdx.x] = 1; }\n";
}

TEST_CASE("jit: compile, the cubin cache, and its key" * doctest::skip(!mkt::have_nvrtc())) {
  mkt::TempDir d;
  mkt::ScopedEnv env("MK_CACHE_DIR", d.str());
  CHECK(!jit::supported_archs().empty());
  const auto archs = jit::supported_archs();
  CHECK(std::count(archs.begin(), archs.end(), 90) == 1);
  auto a = jit::compile(kTinyKernel, "tiny", 90);
  CHECK_FALSE(a.from_cache);
  CHECK(is_elf(a.cubin));
  CHECK(holds(a.cubin, "mkt_tiny"));
  CHECK(fs::exists(a.cache_file));
  CHECK(fs::path(a.cache_file).parent_path() == d.path);
  auto b = jit::compile(kTinyKernel, "tiny", 90);
  CHECK(b.from_cache);
  CHECK(b.cubin == a.cubin);
  CHECK(b.cache_file == a.cache_file);
  auto c = jit::compile(kTinyKernel, "tiny", 80);  // another arch: another entry
  CHECK_FALSE(c.from_cache);
  CHECK(c.cache_file != a.cache_file);
  auto e = jit::compile(std::string(kTinyKernel) + "// changed\n", "tiny", 90);  // another source
  CHECK_FALSE(e.from_cache);
  CHECK(entries(d.path) == 3);
  auto f = jit::compile(kTinyKernel, "tiny", 90, /*use_cache=*/false);
  CHECK_FALSE(f.from_cache);
  CHECK(f.cache_file.empty());
  CHECK(entries(d.path) == 3);
}

// Threads asking for one cubin while it compiles share that compile (ranks
// of one process whose plans have a bucket's code in common): one NVRTC run,
// the same cubin for both; and the same error for both when it fails.
TEST_CASE("jit: threads asking for the same cubin at once share one NVRTC compile, or its error" *
          doctest::skip(!mkt::have_nvrtc())) {
  auto both = [](const std::string& src, std::vector<jit::CompileResult>* got, std::vector<std::string>* errs) {
    std::atomic<int> ready{0};
    std::vector<std::thread> ts;
    got->assign(2, {});
    errs->assign(2, "");
    for (int k = 0; k < 2; ++k)
      ts.emplace_back([&, k] {
        ready.fetch_add(1);
        while (ready.load() < 2) std::this_thread::yield();  // both ask at once
        try {
          (*got)[size_t(k)] = jit::compile(src, "shared", 90, /*use_cache=*/false);
        } catch (const Error& e) {
          (*errs)[size_t(k)] = e.what();
        }
      });
    for (auto& t : ts) t.join();
  };
  std::vector<jit::CompileResult> got;
  std::vector<std::string> errs;
  const int64_t before = jit::nvrtc_compiles();
  both(std::string(kTinyKernel) + "// shared by two threads\n", &got, &errs);
  CHECK(jit::nvrtc_compiles() - before == 1);  // before: 2
  CHECK(errs[0].empty());
  CHECK(errs[1].empty());
  CHECK(is_elf(got[0].cubin));
  CHECK(got[0].cubin == got[1].cubin);
  both("extern \"C\" __global__ void shared(int* p) { p[0] = not_declared_here; }\n", &got, &errs);
  CHECK(jit::nvrtc_compiles() - before == 2);
  CHECK(contains(errs[0], "[mk.jit.E002]"));
  CHECK(contains(errs[0], "not_declared_here"));
  CHECK(errs[1] == errs[0]);
  // one after the other: each its own compile (nothing kept without the cache)
  jit::compile(std::string(kTinyKernel) + "// shared by two threads\n", "shared", 90, false);
  CHECK(jit::nvrtc_compiles() - before == 3);
}

// NVRTC's --Ofast-compile level (MK_FAST_COMPILE, mkc --fast-compile): part
// of the cubin's key, so that a cubin of one level never serves another;
// "0" adds no option (cubins cached before the knob keep their keys).
// (NVRTC before 12.8 has no --Ofast-compile: every level is "0" there)
TEST_CASE("jit: the fast-compile level is part of the cubin's key" *
          doctest::skip(!mkt::have_nvrtc() || jit::nvrtc_version() < 12080)) {
  mkt::TempDir d;
  mkt::ScopedEnv env("MK_CACHE_DIR", d.str());
  mkt::ScopedEnv level("MK_FAST_COMPILE", nullptr);
  CHECK(jit::fast_compile() == "0");
  const auto a = jit::compile(kTinyKernel, "tiny", 90);
  {
    mkt::ScopedEnv max("MK_FAST_COMPILE", "max");
    CHECK(jit::fast_compile() == "max");
    const auto b = jit::compile(kTinyKernel, "tiny", 90);
    CHECK_FALSE(b.from_cache);
    CHECK(b.cache_file != a.cache_file);
    CHECK(is_elf(b.cubin));
    CHECK(jit::compile(kTinyKernel, "tiny", 90).from_cache);
  }
  {
    mkt::ScopedEnv zero("MK_FAST_COMPILE", "0");  // the default, spelled out: the same key
    const auto c = jit::compile(kTinyKernel, "tiny", 90);
    CHECK(c.from_cache);
    CHECK(c.cache_file == a.cache_file);
  }
  // the setter (mkc --fast-compile) when MK_FAST_COMPILE is unset
  jit::set_fast_compile("mid");
  CHECK(jit::fast_compile() == "mid");
  const auto m = jit::compile(kTinyKernel, "tiny", 90);
  CHECK_FALSE(m.from_cache);
  jit::set_fast_compile("0");
  CHECK(entries(d.path) == 3);

  // and of the plan cache's key: a plan of one level never serves another
  // (regression: the plan cache returned a fully optimised plan for
  // --fast-compile max, and a max plan to a later job at level 0)
  const auto* info = dsl::find_schedule("allgather.direct");
  compiler::CompileOptions o;
  o.lower.max_bytes = 4096;
  compiler::CompileStats st;
  compiler::compile_plan(dsl::build(*info, 2), o, &st);
  CHECK_FALSE(st.from_cache);
  {
    mkt::ScopedEnv max("MK_FAST_COMPILE", "max");
    compiler::compile_plan(dsl::build(*info, 2), o, &st);
    CHECK_FALSE(st.from_cache);
    CHECK(contains(compiler::options_json(o), "\"fast_compile\":\"max\""));
  }
  compiler::compile_plan(dsl::build(*info, 2), o, &st);
  CHECK(st.from_cache);
  CHECK_FALSE(contains(compiler::options_json(o), "fast_compile"));
}

TEST_CASE("jit: mk.jit.E007 an unknown fast-compile level") {
  {
    mkt::ScopedEnv bad("MK_FAST_COMPILE", "fast");
    const auto e = catch_error([] { jit::fast_compile(); });
    CHECK(e.id == "mk.jit.E007");
    CHECK(contains(e.message, "MK_FAST_COMPILE='fast'"));
  }
  for (const char* bad : {"", "1", "MAX", "max "}) {
    CAPTURE(bad);
    CHECK(catch_error([&] { jit::set_fast_compile(bad); }).id == "mk.jit.E007");
  }
  mkt::ScopedEnv unset("MK_FAST_COMPILE", nullptr);
  CHECK(jit::fast_compile() == "0");  // a refused level changed nothing
}

TEST_CASE("jit: mk.jit.E002 a source NVRTC rejects, with the log and the saved source" *
          doctest::skip(!mkt::have_nvrtc())) {
  mkt::TempDir d;
  mkt::ScopedEnv env("MK_CACHE_DIR", d.str());
  const std::string src = "extern \"C\" __global__ void broken(int* p) { p[0] = undeclared_name; }\n";
  auto c = catch_error([&] { jit::compile(src, "broken", 90); });
  CHECK(c.id == "mk.jit.E002");
  CHECK(contains(c.message, "NVRTC could not compile broken for sm_90"));
  CHECK(contains(c.message, "undeclared_name"));  // the NVRTC log
  auto at = c.message.find("generated source: ");
  REQUIRE(at != std::string::npos);
  const std::string saved = c.message.substr(at + 18);
  CHECK(mkt::read_text(saved) == src);
  CHECK(contains(saved, d.str()));
}

TEST_CASE("jit: mk.jit.E003 an architecture NVRTC does not support" * doctest::skip(!mkt::have_nvrtc())) {
  for (int arch : {20, 999}) {
    CAPTURE(arch);
    auto c = catch_error([&] { jit::compile(kTinyKernel, "tiny", arch, false); });
    CHECK(c.id == "mk.jit.E003");
    CHECK(contains(c.message, "sm_" + std::to_string(arch) + " is not supported"));
    CHECK(contains(c.message, "sm_90"));  // the list of what is supported
  }
}

// The cache is an optimisation: when it cannot be written, kernels still
// compile (nothing is cached). Plugins, which need a place for their .so,
// report mk.jit.E004 (tests/unit/test_cli.cpp).
TEST_CASE("jit: a cache directory that cannot be created does not stop a compile" * doctest::skip(!mkt::have_nvrtc())) {
  mkt::TempDir d;
  mkt::write_text(d / "file", "not a directory");
  mkt::ScopedEnv env("MK_CACHE_DIR", (d / "file" / "cache").string());
  jit::CompileResult r;
  auto c = catch_error([&] { r = jit::compile(kTinyKernel, "tiny", 90); });
  REQUIRE_MESSAGE(!c, c.what);
  CHECK(r.cubin.size() > 64);
  CHECK(r.cache_file.empty());
  CHECK_FALSE(r.from_cache);
}

TEST_CASE("nvrtc: every built-in schedule compiles for sm_90 at 2 and 8 ranks" * doctest::skip(!mkt::have_nvrtc())) {
  MESSAGE("NVRTC: " << jit::nvrtc_status());
  // Dtypes and ops rotate over the schedules so that every device-side dtype
  // and reduction is compiled at least once; the size range alternates
  // between the small-message (LL) and the large-message (simple) bucket so
  // that both protocols are compiled for every schedule while each plan needs
  // one NVRTC run. Plans compile on two threads; checks run afterwards.
  const auto dtypes = all_dtypes();
  const auto ops = all_redops();
  struct Job {
    dsl::ScheduleInfo info;
    int n;
    compiler::CompileOptions o;
    plan::Plan p;
    compiler::CompileStats st;
    mkt::Caught err;
  };
  std::vector<Job> jobs;
  size_t k = 0;
  for (const auto& info : dsl::registered_schedules())
    for (int n : {2, 8}) {
      Job j{info, n, {}, {}, {}, {}};
      j.o.arch = 90;
      j.o.use_cache = false;
      j.o.dtype = dtypes[k % dtypes.size()];
      j.o.op = collective_reduces(info.coll) ? ops[k % ops.size()] : RedOp::sum;
      if (k % 2 == 0) {
        j.o.lower.max_bytes = 4096;  // the LL bucket
      } else {
        j.o.lower.min_bytes = 1 << 20;  // the simple bucket
      }
      j.o.lower.proto.ll_max_bytes = 64 << 10;
      jobs.push_back(std::move(j));
      ++k;
    }
  {
    std::atomic<size_t> next{0};
    auto worker = [&] {
      for (size_t i; (i = next++) < jobs.size();) {
        Job& j = jobs[i];
        j.err = catch_error([&] { j.p = compiler::compile_plan(dsl::build(j.info, j.n), j.o, &j.st); });
      }
    };
    std::thread a(worker), b(worker);
    a.join();
    b.join();
  }
  std::set<DType> seen_t;
  std::set<RedOp> seen_op;
  std::set<std::pair<std::string, std::string>> seen_proto;
  for (auto& j : jobs) {
    CAPTURE(j.info.name);
    CAPTURE(j.n);
    CAPTURE(name(j.o.dtype));
    CAPTURE(name(j.o.op));
    REQUIRE_MESSAGE(!j.err, j.err.what);
    const plan::Plan& p = j.p;
    seen_t.insert(p.dtype);
    if (collective_reduces(p.coll)) seen_op.insert(p.op);
    CHECK_FALSE(j.st.from_cache);
    CHECK(p.schedule == j.info.name);
    CHECK(p.nranks == j.n);
    CHECK(p.arch == 90);
    CHECK(p.dtype == j.o.dtype);
    CHECK(p.op == j.o.op);
    REQUIRE(p.kernels.size() == 1);
    const auto& kern = p.kernels[0];
    CAPTURE(kern.name);
    seen_proto.insert({j.info.name, kern.proto});
    CHECK(kern.proto == (j.o.lower.max_bytes == 4096 ? "ll" : "simple"));
    CHECK(is_elf(kern.cubin));
    CHECK(holds(kern.cubin, kern.name));  // the kernel's symbol is in the cubin
    CHECK(contains(kern.source, kern.name));
    CHECK(contains(kern.name, codegen::identifier(j.info.name) + "_n" + std::to_string(j.n) + "_"));
    CHECK(kern.grid == kern.tbs * kern.instances);
    CHECK(kern.cubin_file == kern.name + ".sm_90.cubin");
  }
  CHECK(seen_t.size() == dtypes.size());
  CHECK(seen_op.size() == ops.size());
  CHECK(seen_proto.size() == jobs.size());  // each schedule: one LL and one simple kernel
}

TEST_CASE("nvrtc: a plan's buckets cover every size" * doctest::skip(!mkt::have_nvrtc())) {
  mkt::TempDir d;
  mkt::ScopedEnv env("MK_CACHE_DIR", d.str());
  compiler::CompileOptions o;
  auto p = compiler::compile_plan(dsl::build(*dsl::find_schedule("reducescatter.ring"), 4), o);
  REQUIRE(p.kernels.size() == 2);
  CHECK(p.kernels.front().min_bytes == 0);
  CHECK(p.kernels.back().max_bytes == -1);
  for (size_t b = 1; b < p.kernels.size(); ++b) CHECK(p.kernels[b].min_bytes == p.kernels[b - 1].max_bytes + 1);
  const int64_t edge = p.kernels[0].max_bytes;
  CHECK(plan::select(p, 0) == &p.kernels[0]);
  CHECK(plan::select(p, edge) == &p.kernels[0]);
  CHECK(plan::select(p, edge + 1) == &p.kernels[1]);
  CHECK(plan::select(p, int64_t(1) << 40) == &p.kernels[1]);
  CHECK(plan::select(p, -1) == nullptr);
  CHECK(p.kernels[0].proto == "ll");
  CHECK(p.kernels[1].proto == "simple");
  std::set<std::string> names;
  for (const auto& k : p.kernels) {
    CHECK(is_elf(k.cubin));
    CHECK(holds(k.cubin, k.name));
    CHECK(names.insert(k.name).second);
  }
}

// ---- the plan cache -------------------------------------------------------------

TEST_CASE("cache: the second compile of a plan comes from the cache, the key follows dtype, op and arch" *
          doctest::skip(!mkt::have_nvrtc())) {
  mkt::TempDir d;
  mkt::ScopedEnv env("MK_CACHE_DIR", d.str());
  const auto* info = dsl::find_schedule("allreduce.two_shot");
  REQUIRE(info);
  auto compile = [&](DType t, RedOp op, int arch, compiler::CompileStats* st) {
    compiler::CompileOptions o;
    o.dtype = t;
    o.op = op;
    o.arch = arch;
    o.lower.max_bytes = 4096;  // one bucket: one NVRTC run
    return compiler::compile_plan(dsl::build(*info, 2), o, st);
  };
  const fs::path plans = d.path / "plans";
  compiler::CompileStats s1, s2;
  auto p1 = compile(DType::fp32, RedOp::sum, 90, &s1);
  CHECK_FALSE(s1.from_cache);
  CHECK(entries(plans) == 1);
  auto p2 = compile(DType::fp32, RedOp::sum, 90, &s2);
  CHECK(s2.from_cache);
  CHECK(entries(plans) == 1);
  REQUIRE(p1.kernels.size() == p2.kernels.size());
  for (size_t i = 0; i < p1.kernels.size(); ++i) {
    CHECK(p1.kernels[i].name == p2.kernels[i].name);
    CHECK(p1.kernels[i].cubin == p2.kernels[i].cubin);
    CHECK(p1.kernels[i].source == p2.kernels[i].source);
  }
  size_t expect = 1;
  struct Change {
    DType t;
    RedOp op;
    int arch;
  };
  for (Change c : {Change{DType::bf16, RedOp::sum, 90}, Change{DType::fp32, RedOp::max, 90},
                   Change{DType::fp32, RedOp::sum, 80}}) {
    CAPTURE(name(c.t));
    CAPTURE(name(c.op));
    CAPTURE(c.arch);
    compiler::CompileStats st;
    auto p = compile(c.t, c.op, c.arch, &st);
    CHECK_FALSE(st.from_cache);
    CHECK(entries(plans) == ++expect);
    CHECK(p.dtype == c.t);
    CHECK(p.op == c.op);
    CHECK(p.arch == c.arch);
    compiler::CompileStats again;
    compile(c.t, c.op, c.arch, &again);
    CHECK(again.from_cache);
  }
  // other ranks: another key
  compiler::CompileStats st;
  compiler::CompileOptions o;
  o.lower.max_bytes = 4096;
  compiler::compile_plan(dsl::build(*info, 3), o, &st);
  CHECK_FALSE(st.from_cache);
  CHECK(entries(plans) == ++expect);
  // use_cache = false neither reads nor writes
  o.use_cache = false;
  compiler::compile_plan(dsl::build(*info, 2), o, &st);
  CHECK_FALSE(st.from_cache);
  CHECK(entries(plans) == expect);
}

// Regression: the fresh plan used to be renamed onto the damaged (non-empty)
// entry, which failed, so the damaged entry stayed.
TEST_CASE("cache: a damaged plan cache entry is replaced" * doctest::skip(!mkt::have_nvrtc())) {
  mkt::TempDir d;
  mkt::ScopedEnv env("MK_CACHE_DIR", d.str());
  compiler::CompileOptions o;
  const auto* info = dsl::find_schedule("allgather.direct");
  compiler::compile_plan(dsl::build(*info, 2), o);
  const fs::path plans = d.path / "plans";
  REQUIRE(entries(plans) == 1);
  const fs::path entry = fs::directory_iterator(plans)->path();
  mkt::write_text(entry / "plan.json", "{ truncated");
  compiler::CompileStats st;
  auto p = compiler::compile_plan(dsl::build(*info, 2), o, &st);
  CHECK(!p.kernels.empty());  // the damaged entry is not used
  CHECK_FALSE(catch_error([&] { plan::read_dir(entry.string()); }));
}

TEST_CASE("cache: a damaged plan cache entry is not used" * doctest::skip(!mkt::have_nvrtc())) {
  mkt::TempDir d;
  mkt::ScopedEnv env("MK_CACHE_DIR", d.str());
  compiler::CompileOptions o;
  const auto* info = dsl::find_schedule("allgather.direct");
  auto p0 = compiler::compile_plan(dsl::build(*info, 2), o);
  const fs::path plans = d.path / "plans";
  REQUIRE(entries(plans) == 1);
  const fs::path entry = fs::directory_iterator(plans)->path();
  mkt::write_text(entry / "plan.json", "{ truncated");
  auto p = compiler::compile_plan(dsl::build(*info, 2), o);
  REQUIRE(p.kernels.size() == p0.kernels.size());
  for (size_t i = 0; i < p.kernels.size(); ++i) CHECK(p.kernels[i].cubin == p0.kernels[i].cubin);
}

// ptxas or NVRTC out of memory is a too-large schedule (E005), not "a bug"
// (regression: reported as E002 "this is a bug").
TEST_CASE("jit: running out of memory is recognised") {
  CHECK(jit::out_of_memory(true, ""));
  CHECK(jit::out_of_memory(false, "ptxas fatal   : Out of memory"));
  CHECK(jit::out_of_memory(false, "error: memory allocation failure"));
  CHECK(!jit::out_of_memory(false, "error: identifier \"x\" is undefined"));
  CHECK(!jit::out_of_memory(false, ""));
}

TEST_CASE("codegen: print_classes lists each class's ranks and why it differs") {
  codegen::RankClasses rc;
  rc.class_of = {0, 1, 1, 0, 1};
  rc.representative = {0, 1};
  rc.why = {"", "rank 1 differs from rank 0 in thread block 0, step 0: x vs y"};
  CHECK(codegen::print_classes(rc) ==
        "2 rank class(es) (one code path each)\n"
        "  class 0: ranks 0,3\n"
        "  class 1: ranks 1-2,4; rank 1 differs from rank 0 in thread block 0, step 0: x vs y\n");
}

namespace {

// ---- a reading of generated code: the statements one rank's thread block
// runs per tile, with every number evaluated (loops run, table entries
// looked up, arithmetic done), so that rerolled code can be compared with
// straight-line code (Limits::reroll = false) statement by statement.
struct Tables {
  std::map<std::string, std::vector<std::vector<long long>>> rows;  // name -> rows (1 row for 1-d arrays)
};

std::vector<long long> ints(std::string s) {
  std::vector<long long> v;
  for (char& c : s)
    if (c == ',' || c == '{' || c == '}' || c == ';') c = ' ';
  std::istringstream in(s);
  for (long long x; in >> x;) v.push_back(x);
  return v;
}

// The source's tables, read line by line (std::regex recurses per
// character and overflows the stack on long ones).
Tables read_tables(const std::string& src) {
  Tables t;
  std::istringstream in(src);
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find(" const ");
    if (line.rfind("static ", 0) != 0 || at == std::string::npos) continue;
    const size_t name = line.find(' ', at + 7) + 1, end = line.find('[', name);
    if (end == std::string::npos || line.find("] = {") == std::string::npos) continue;
    const std::string key = line.substr(name, end - name);
    if (line.find("][") == std::string::npos) {  // one row: "... = {1,2,3};"
      t.rows[key] = {ints(line.substr(line.find("] = {") + 5))};
      continue;
    }
    std::vector<std::vector<long long>> rows;
    while (std::getline(in, line) && line != "};") rows.push_back(ints(line));
    t.rows[key] = rows;
  }
  return t;
}

// Evaluates the arithmetic the generator writes: loop counters, t[...] and
// kU<b>[...] entries, (n), n * m, n + m and n - m.
std::string evaluate(std::string s, const std::map<std::string, long long>& vars, const std::vector<long long>* row,
                     const Tables& tabs) {
  for (const auto& [v, x] : vars) s = std::regex_replace(s, std::regex("\\b" + v + "\\b"), std::to_string(x));
  static const std::regex entry(R"(\b(t|kU\d+)\[(-?\d+)\])"), paren(R"(([^\w>])\((-?\d+)\))"),
      mul(R"((-?\d+) \* (-?\d+))"), add(R"((-?\d+) ([-+]) (-?\d+)(?! \*))");
  for (bool again = true; again;) {
    again = false;
    std::smatch m;
    if (std::regex_search(s, m, entry)) {
      const auto& r = m[1] == "t" ? *row : tabs.rows.at(m[1]).at(0);
      s = m.prefix().str() + std::to_string(r.at(size_t(std::stoll(m[2])))) + m.suffix().str();
    } else if (std::regex_search(s, m, paren)) {
      s = m.prefix().str() + m[1].str() + m[2].str() + m.suffix().str();
    } else if (std::regex_search(s, m, mul)) {
      s = m.prefix().str() + std::to_string(std::stoll(m[1]) * std::stoll(m[2])) + m.suffix().str();
    } else if (std::regex_search(s, m, add)) {
      const long long a = std::stoll(m[1]), b = std::stoll(m[3]);
      s = m.prefix().str() + std::to_string(m[2] == "+" ? a + b : a - b) + m.suffix().str();
    } else {
      continue;
    }
    again = true;
  }
  return s;
}

// The body of function `fn` in `src`, run for one rank (its row of the
// class's table, if any): the statements in order, comments left out.
std::vector<std::string> trace(const std::string& src, const std::string& fn, const std::vector<long long>* row,
                               const Tables& tabs, const std::map<std::string, long long>& given = {}) {
  const size_t at = src.find("void " + fn + "(");
  REQUIRE(at != std::string::npos);
  std::vector<std::string> lines;
  std::istringstream in(src.substr(at));
  std::string line;
  std::getline(in, line);  // the signature
  while (std::getline(in, line) && line != "}") {
    line.erase(0, line.find_first_not_of(' '));
    if (line.rfind("//", 0) == 0 || line.rfind("#pragma", 0) == 0 || line == "do {" || line == "} while (c.next());" ||
        line.rfind("const mk::dev::Row<", 0) == 0)  // the table row in registers: t[k] reads the same numbers
      continue;
    lines.push_back(line);
  }
  std::vector<std::string> out;
  std::map<std::string, long long> vars = given;
  static const std::regex loop(R"(for \(int (\w+) = 0; \1 < (.+); \+\+\1\) \{.*)");
  // Runs lines[from..) up to the '}' that closes the block; returns the index after it.
  std::function<size_t(size_t)> run = [&](size_t from) {
    size_t i = from;
    while (i < lines.size()) {
      std::smatch m;
      if (lines[i] == "}") return i + 1;
      if (std::regex_match(lines[i], m, loop)) {
        const std::string v = m[1];
        const long long n = std::stoll(evaluate(m[2], vars, row, tabs));
        size_t end = i + 1;
        for (long long x = 0; x < n; ++x) {
          vars[v] = x;
          end = run(i + 1);
        }
        if (n == 0) FAIL("a loop that never runs: " << lines[i]);
        vars.erase(v);
        i = end;
        continue;
      }
      if (lines[i] == "{") {  // a wide op's operand list
        i = run(i + 1);
        continue;
      }
      out.push_back(evaluate(lines[i], vars, row, tabs));
      ++i;
    }
    return i;
  };
  run(0);
  return out;
}

// Per rank and thread block of every unit, the statements it runs.
std::vector<std::string> traces(const std::vector<codegen::Unit>& units, int n, int tbs) {
  std::vector<std::string> all;
  for (size_t b = 0; b < units.size(); ++b) {
    const std::string& src = units[b].source;
    const Tables tabs = read_tables(src);
    const size_t at = src.find("kClassOf[");
    REQUIRE(at != std::string::npos);
    const size_t from = src.find("= {", at) + 3;
    const auto class_of = ints(src.substr(from, src.find('}', from) - from));
    for (int v = 0; v < n; ++v)
      for (int tb = 0; tb < tbs; ++tb) {
        std::string fn = fmt::format("b{}_c{}_tb{}", b, class_of.at(size_t(v)), tb);
        std::map<std::string, long long> given;
        if (src.find("void " + fn + "(") == std::string::npos) {
          // a group of blocks first..last: one function, the block's index j among them
          const std::regex group(fmt::format(R"(void (b{}_c{}_tbs(\d+)_(\d+))\()", b, class_of.at(size_t(v))));
          for (std::sregex_iterator it(src.begin(), src.end(), group), end; it != end; ++it)
            if (std::stoi((*it)[2]) <= tb && tb <= std::stoi((*it)[3])) {
              fn = (*it)[1];
              given["j"] = tb - std::stoi((*it)[2]);
              // the switch calls it for exactly these blocks, with j = c.tb - first
              CHECK(contains(src, fmt::format(" case {}:", tb)));
              CHECK(contains(src, fmt::format("{}(c", fn)));
              CHECK(contains(src, fmt::format(", c.tb - {}); break;", (*it)[2].str())));
            }
          if (given.empty()) continue;
        }
        const auto kT = tabs.rows.find(fmt::format("kT{}_c{}", b, class_of.at(size_t(v))));
        const std::vector<long long>* row = nullptr;
        if (kT != tabs.rows.end())
          row = &kT->second.at(size_t(tabs.rows.at(fmt::format("kMember{}", b)).at(0).at(size_t(v))));
        all.push_back(fmt::format("bucket {} rank {} tb {}:", b, v, tb));
        for (auto& s : trace(src, fn, row, tabs, given)) all.push_back(std::move(s));
      }
  }
  return all;
}

void check_reroll_keeps_statements(const std::vector<ir::Schedule>& variants, const std::string& what) {
  CAPTURE(what);
  codegen::Limits straight;
  straight.reroll = false;
  const auto rolled = codegen::generate(variants, DType::fp32, RedOp::sum, "t");
  const auto flat = codegen::generate(variants, DType::fp32, RedOp::sum, "t", straight);
  CHECK_FALSE(contains(flat[0].source, "for (int"));
  const auto a = traces(rolled, variants[0].nranks, variants[0].tbs), b = traces(flat, variants[0].nranks, variants[0].tbs);
  REQUIRE(a.size() == b.size());
  // The op id a wait or an op carries names a statement for error reports
  // (in a rerolled loop, the first iteration's): not part of what runs.
  static const std::regex wait_id(R"(\{(-?\d+), (-?\d+), (-?\d+), -?\d+\})"), op_id(R"(, -?\d+\)\) return;)");
  auto runs = [&](const std::string& line) {
    return std::regex_replace(std::regex_replace(line, wait_id, "{$1, $2, $3}"), op_id, ")) return;");
  };
  for (size_t i = 0; i < a.size(); ++i) {
    CAPTURE(i);
    REQUIRE(runs(a[i]) == runs(b[i]));
  }
}

// A traced statement with its operands as the kernel reads them: every
// operand (data_ref, peer_data_ref, scratch_ref or a wide op's ref_halves)
// as its 64-bit encoding, and every chunk position that rotates with the
// rank made absolute (vrank v, kPosRot M, kChunks K), so that plans that
// differ only in how they spell an operation (unrolled or wide, rotated
// positions or absolute ones) give the same text. `wide` carries a wide
// op's operand list from its `const uint64_t r[...]` line to its call.
std::string canonical(const std::string& line, long long v, long long M, long long K, std::string& wide) {
  auto absolute = [&](long long p, bool rot) { return rot ? (p + v * M) % K : p; };
  auto enc = [&](uint64_t e) {
    if ((e & 3) != mk::dev::kRefScratch && (e & 8)) {
      const long long p = absolute(int64_t(e >> 32), true);
      e = (e & 0xffffffffull & ~uint64_t(8)) | (uint64_t(uint32_t(p)) << 32);
    }
    return fmt::format("{:#x}", e);
  };
  static const std::regex ref(
      R"(mk::dev::(data_ref|peer_data_ref|scratch_ref|ref_halves)\(([^()]*)\))"),
      op(R"(c\.(?:template )?(copy|reduce|reduce_final)(?:_pass)?(?:<\d+u, \d+u>)?\(\{(.*)\}, \{(.*)\}, mk::dev::pos_code\((-?\d+), (true|false)\), -?\d+\)\) return;)"),
      op_wide(R"(c\.template op_wide<(true|false), (true|false)>\(r, (\d+), (\d+), mk::dev::pos_code\((-?\d+), (true|false)\), -?\d+\)\) return;)"),
      // a one-pass kernel's generic op: operands from the rank's table row
      op_gpass(R"(c\.template op_gpass<(true|false), (true|false)>\(\{(.*)\}, \{(.*)\}, mk::dev::pos_code\((-?\d+), (true|false)\), -?\d+\)\) return;)"),
      // a wait's last number is the op it precedes (for error reports), not part of what runs
      wait_op(R"(\{(-?\d+), (-?\d+), (-?\d+), -?\d+\})");
  auto refs = [&](const std::string& list) {
    std::vector<std::string> out;
    for (std::sregex_iterator it(list.begin(), list.end(), ref), end; it != end; ++it) {
      const std::string fn = (*it)[1];
      std::vector<long long> a;
      std::string args = (*it)[2];
      for (char& c : args)
        if (c == ',') c = ' ';
      std::istringstream in(args);
      for (std::string w; in >> w;) {
        if (w == "true" || w == "false") a.push_back(w == "true");
        else if (w.rfind("mk::dev::kRef", 0) == 0) a.push_back(w == "mk::dev::kRefIn" ? 0 : 1);
        else a.push_back(std::stoll(w));
      }
      uint64_t e = 0;
      if (fn == "data_ref") e = mk::dev::data_ref(int(a.at(0)), int(a.at(1)), a.at(2), int(a.at(3)), a.at(4));
      else if (fn == "peer_data_ref")
        e = mk::dev::peer_data_ref(int(a.at(0)), int(a.at(1)), int(a.at(2)), a.at(3), int(a.at(4)), a.at(5));
      else if (fn == "scratch_ref") e = mk::dev::scratch_ref(int(a.at(0)), int(a.at(1)));
      else e = mk::dev::ref_halves(int32_t(a.at(0)), int32_t(a.at(1)));
      out.push_back(enc(e));
    }
    return out;
  };
  auto join = [](const std::vector<std::string>& v, size_t from, size_t to) {
    std::string o;
    for (size_t i = from; i < to; ++i) o += (i > from ? "," : "") + v[i];
    return o;
  };
  std::smatch m;
  if (line.rfind("const uint64_t r[", 0) == 0) {
    wide = line;
    return "";
  }
  if (std::regex_search(line, m, op)) {
    const auto r = refs(m[2].str() + " " + m[3].str());
    const size_t ns = refs(m[2].str()).size();
    const std::string kind = m[1];
    return fmt::format("op red={} fin={} src={} dst={} pos={}", kind != "copy", kind == "reduce_final",
                       join(r, 0, ns), join(r, ns, r.size()), absolute(std::stoll(m[4]), m[5] == "true"));
  }
  if (std::regex_search(line, m, op_gpass)) {
    const auto r = refs(m[3].str() + " " + m[4].str());
    const size_t ns = refs(m[3].str()).size();
    return fmt::format("op red={} fin={} src={} dst={} pos={}", m[1].str(), m[2].str(), join(r, 0, ns),
                       join(r, ns, r.size()), absolute(std::stoll(m[5]), m[6] == "true"));
  }
  if (std::regex_search(line, m, op_wide)) {
    REQUIRE_FALSE(wide.empty());
    const auto r = refs(wide);
    wide.clear();
    const size_t ns = std::stoul(m[3]);
    REQUIRE(r.size() == ns + std::stoul(m[4]));
    return fmt::format("op red={} fin={} src={} dst={} pos={}", m[1].str(), m[2].str(), join(r, 0, ns),
                       join(r, ns, r.size()), absolute(std::stoll(m[5]), m[6] == "true"));
  }
  // waits and signals: relative peers, slots and iterations
  return std::regex_replace(line, wait_op, "{$1, $2, $3}");
}

// Per (bucket, rank, thread block) of traces(), the canonical statements.
std::map<std::string, std::vector<std::string>> canonical_traces(const std::vector<codegen::Unit>& units, int n,
                                                                 int tbs) {
  std::map<std::string, std::vector<std::string>> out;
  const auto all = traces(units, n, tbs);
  std::vector<std::string>* cur = nullptr;
  long long v = 0, M = 0, K = 1;
  std::string wide;
  static const std::regex head(R"(bucket (\d+) rank (\d+) tb \d+:)");
  for (const auto& line : all) {
    std::smatch m;
    if (std::regex_match(line, m, head)) {
      cur = &out[line];
      v = std::stoll(m[2]);
      const std::string& src = units.at(std::stoul(m[1])).source;
      auto constant = [&](const std::string& name) {
        const size_t at = src.find(name + " = ");
        REQUIRE(at != std::string::npos);
        return std::stoll(src.substr(at + name.size() + 3));
      };
      M = constant("kPosRot");
      K = constant("kChunks");
      continue;
    }
    REQUIRE(cur);
    std::string c = canonical(line, v, M, K, wide);
    if (!c.empty()) cur->push_back(std::move(c));
  }
  return out;
}

// An all-gather whose ranks send to their peers in a scrambled order: the
// steps have one shape, the peer distances follow no stride, and odd ranks
// use another order than even ones (numbers the rank table holds).
ir::Schedule scrambled_allgather(int n) {
  dsl::Program p(Collective::allgather, n, 0, "test.scrambled");
  std::vector<int> d(size_t(n - 1));
  for (int s = 0; s < n - 1; ++s) d[size_t(s)] = s + 1;
  std::mt19937 g(7);
  std::shuffle(d.begin(), d.end(), g);
  for (int r = 0; r < n; ++r) {
    p.copy(p.output(r, r), p.input(r, 0));
    for (int s = 0; s < n - 1; ++s) {
      const int q = (r + d[size_t((s + (r % 2) * 3) % (n - 1))]) % n;
      p.copy(p.output(q, r), p.input(r, 0));
    }
  }
  return std::move(p.ir());
}

}  // namespace

// A one-rank plan of many ranks comes from that rank's program alone
// (Limits::own_rank_from; forced here at small rank counts): it serves that
// rank, holds no rank table, and runs exactly the operations the plan of
// every rank runs on that rank, in the same order, with the same operands
// (straight-line code of the full plan, operands compared as the kernel
// decodes them).
TEST_CASE("codegen: a one-rank plan from the rank's own program runs that rank's operations of the full plan") {
  codegen::Limits own, straight;
  own.own_rank_from = 0;
  straight.reroll = false;
  auto check = [&](const std::vector<ir::Schedule>& variants, const std::string& what) {
    CAPTURE(what);
    const int n = variants[0].nranks, tbs = variants[0].tbs;
    const auto full = canonical_traces(codegen::generate(variants, DType::fp32, RedOp::sum, "t", straight), n, tbs);
    REQUIRE(full.size() == size_t(n * tbs) * variants.size());
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      const auto units = codegen::generate(variants, DType::fp32, RedOp::sum, "t", own, r);
      for (const auto& u : units) {
        CHECK(u.serves == std::vector<int32_t>{r});
        CHECK_FALSE(contains(u.source, "const int kT"));  // no rank table
        CHECK(contains(u.source, fmt::format("rank {}'s own program", r)));
      }
      const auto mine = canonical_traces(units, n, tbs);
      REQUIRE(mine.size() == size_t(tbs) * variants.size());  // only rank r's functions run
      for (const auto& [key, statements] : mine) {
        CAPTURE(key);
        REQUIRE(full.count(key));
        const auto& theirs = full.at(key);
        CHECK(statements.size() == theirs.size());
        for (size_t i = 0; i < std::min(statements.size(), theirs.size()); ++i) {
          CAPTURE(i);
          REQUIRE(statements[i] == theirs[i]);
        }
      }
    }
  };
  for (std::string s : {"allreduce.halving_doubling", "allreduce.ring", "allreduce.one_shot", "allgather.ring",
                        "reducescatter.ring", "alltoall.direct", "allreduce.two_shot"})
    for (int n : {4, 8}) check(lower_builtin(s, n).variants, fmt::format("{}, {} ranks", s, n));
  // One-shot's generic one-pass reduce (one code path, each rank's operands
  // from its table row) runs each rank's own operations in the same order.
  straight.one_pass_generic = true;
  for (int n : {3, 8}) {
    const auto l = lower_builtin("allreduce.one_shot", n);
    check(l.variants, fmt::format("one-shot generic, {} ranks", n));
    const auto units = codegen::generate(l.variants, DType::fp32, RedOp::sum, "t", straight);
    CHECK(contains(units[0].source, "1 rank class(es)"));
    CHECK(contains(units[0].source, "c.template op_gpass<true, true>("));
  }
  check(compiler::lower(scrambled_allgather(6), compiler::LowerOptions{}).variants, "scrambled allgather, 6 ranks");
  for (std::string s : {"allreduce.hier", "allgather.hier", "reducescatter.hier"}) {
    const auto topo = topology::parse("2x4:direct", 0);
    check(compiler::lower(dsl::build(*dsl::find_schedule(s), topo), compiler::LowerOptions{}).variants, s + ", 2x4");
  }
  // one_shot's full plan spells its reduces wide (generic: so that its ranks
  // share a class), the own plan unrolls them: both spellings were compared.
  // (The simple bucket's: the LL bucket runs in one pass, which unrolls every op.)
  const std::vector<ir::Schedule> one_shot = {lower_builtin("allreduce.one_shot", 8).variants.back()};
  REQUIRE(one_shot[0].proto == ir::Proto::simple);
  CHECK(contains(codegen::generate(one_shot, DType::fp32, RedOp::sum, "t")[0].source, "op_wide"));
  CHECK_FALSE(contains(codegen::generate(one_shot, DType::fp32, RedOp::sum, "t", own, 5)[0].source, "op_wide"));
  // Rooted collectives keep every class (their virtual rank moves with the root).
  for (const auto& u : codegen::generate(lower_builtin("broadcast.direct", 4).variants, DType::fp32, RedOp::sum, "t",
                                         own, 2))
    CHECK(u.serves.empty());
  // By default plans of fewer ranks keep their classes.
  for (const auto& u : codegen::generate(lower_builtin("allreduce.ring", 8).variants, DType::fp32, RedOp::sum, "t", {}, 3))
    CHECK_FALSE(contains(u.source, "own program"));
}

TEST_CASE("nvrtc: one-rank plans from the rank's own program compile" * doctest::skip(!mkt::have_nvrtc())) {
  codegen::Limits own;
  own.own_rank_from = 0;
  const auto topo = topology::parse("2x4:direct", 0);
  const auto l = compiler::lower(dsl::build(*dsl::find_schedule("reducescatter.hier"), topo), compiler::LowerOptions{});
  for (const auto& u : codegen::generate(l.variants, DType::bf16, RedOp::max, "own", own, 6)) {
    CAPTURE(u.kernel.name);
    const auto r = jit::compile(u.source, u.kernel.name, 90, /*use_cache=*/false);
    CHECK(is_elf(r.cubin));
    CHECK(holds(r.cubin, u.kernel.name));
  }
}

// Steps of one shape whose numbers follow no stride become one loop whose
// numbers come from tables indexed by the loop counter, so the kernel does
// not grow with the step count (regression: only constant strides rerolled,
// so hierarchical and halving-doubling kernels grew with the rank count).
TEST_CASE("codegen: same-shape steps with unrelated numbers are one loop over a table") {
  std::map<int, int64_t> size;
  for (int n : {16, 32}) {
    CAPTURE(n);
    compiler::LowerOptions o;
    o.max_tbs = 2;  // the thread-block count does not grow with n either
    auto l = compiler::lower(scrambled_allgather(n), o);
    REQUIRE(codegen::rank_classes(l.variants.back()).representative.size() == 1);
    const auto units = codegen::generate(l.variants, DType::fp32, RedOp::sum, "t");
    for (const auto& u : units) {
      CHECK(contains(u.source, "#pragma unroll 1\n"));
      CHECK(contains(u.source, "+ i]"));  // a table entry per iteration
      CHECK(contains(u.source, fmt::format("for (int i = 0; i < {}; ++i)", n - 1)));
    }
    size[n] = units.back().kernel.size;
  }
  CHECK(size[32] == size[16]);
}

// The loops run exactly the statements of straight-line code, in its order
// (so every rank's reduction order, E015, is the schedule's), with the same
// numbers, for each rank: loops over chunks, groups, tables, strides.
TEST_CASE("codegen: rerolled code runs the statements of straight-line code in the same order") {
  for (int n : {5, 16})
    check_reroll_keeps_statements(compiler::lower(scrambled_allgather(n), compiler::LowerOptions{}).variants,
                                  fmt::format("scrambled allgather, {} ranks", n));
  for (std::string s : {"allreduce.halving_doubling", "allreduce.ring", "allreduce.one_shot", "broadcast.direct",
                        "reducescatter.ring", "alltoall.direct", "allreduce.two_shot", "allgather.direct",
                        "reducescatter.direct"})
    for (int n : {4, 16}) check_reroll_keeps_statements(lower_builtin(s, n).variants, fmt::format("{}, {} ranks", s, n));
  for (std::string s : {"allreduce.hier", "allgather.hier", "reducescatter.hier"})
    for (const char* t : {"2x4:direct", "8x8:direct"}) {
      const auto topo = topology::parse(t, 0);
      check_reroll_keeps_statements(
          compiler::lower(dsl::build(*dsl::find_schedule(s), topo), compiler::LowerOptions{}).variants,
          fmt::format("{}, {}", s, t));
    }
}

// Group kernels (codegen group_source): plans' kernels side by side, members
// that share resources chained on the same blocks.
namespace {
plan::Plan small_plan(const std::string& schedule, int n, DType t, int64_t max_bytes) {
  compiler::CompileOptions o;
  o.arch = 90;
  o.dtype = t;
  o.op = RedOp::sum;
  o.lower.max_bytes = max_bytes;
  return compiler::compile_plan(dsl::build(*dsl::find_schedule(schedule), n), o);
}
}  // namespace

TEST_CASE("codegen: a group kernel places lanes side by side and chains the members of a lane" *
          doctest::skip(!mkt::have_nvrtc())) {
  const plan::Plan ar = small_plan("allreduce.ring", 2, DType::bf16, 4096);
  const plan::Plan ag = small_plan("allgather.direct", 2, DType::bf16, 4096);
  const plan::Kernel& ka = ar.kernels.at(0);
  const plan::Kernel& kg = ag.kernels.at(0);
  REQUIRE(ka.threads == kg.threads);
  REQUIRE(ka.source.find(ka.name + "_body(") != std::string::npos);
  REQUIRE(ka.source.find(ka.name + "_chain(") != std::string::npos);
  // all-reduce, all-gather, all-reduce again: the two all-reduces share a lane
  std::vector<codegen::GroupMember> m{{ka.source, ka.name, ka.grid, 0},
                                      {kg.source, kg.name, kg.grid, 1},
                                      {ka.source, ka.name, ka.grid, 0}};
  const std::string src = codegen::group_source(m, ka.threads, "mk_group_test");
  // each distinct plan once, in its own namespace, its includes on top
  CHECK(src.find("namespace mk_m0 {") != std::string::npos);
  CHECK(src.find("namespace mk_m1 {") != std::string::npos);
  CHECK(src.find("namespace mk_m2 {") == std::string::npos);
  size_t includes = 0;
  for (size_t at = 0; (at = src.find("#include", at)) != std::string::npos; ++at) ++includes;
  CHECK(includes == 2);
  // lane 0 on blocks [0, grid_a): member 0, the chain barrier, member 2; lane 1 after it
  const std::string lane0 = fmt::format("if (b < {}) {{\n    const int bid = b - 0;\n    mk_m0::{}_body(g.a[0], bid, {});\n"
                                        "    if (!mk_m0::{}_chain(g.a[0], bid, {})) return;\n"
                                        "    mk_m0::{}_body(g.a[2], bid, {});\n",
                                        ka.grid, ka.name, ka.grid, ka.name, ka.grid, ka.name, ka.grid);
  CHECK_MESSAGE(src.find(lane0) != std::string::npos, src.substr(src.find("extern \"C\"")));
  const std::string lane1 = fmt::format("if (b < {}) {{\n    const int bid = b - {};\n    mk_m1::{}_body(g.a[1], bid, {});\n",
                                        ka.grid + kg.grid, ka.grid, kg.name, kg.grid);
  CHECK(src.find(lane1) != std::string::npos);
  CHECK(src.find("const __grid_constant__ mk::dev::GroupArgs<3> g") != std::string::npos);
  const auto r = jit::compile(src, "mk_group_test", 90, /*use_cache=*/false);
  CHECK(!r.cubin.empty());
  const std::string bytes(r.cubin.begin(), r.cubin.end());
  CHECK(bytes.find("mk_group_test") != std::string::npos);

  // refused: no members, too many
  CHECK(catch_error([&] { codegen::group_source({}, 256, "x"); }).id == "mk.jit.E005");
  std::vector<codegen::GroupMember> many(size_t(mk::dev::kMaxGroupMembers) + 1, m[0]);
  CHECK(catch_error([&] { codegen::group_source(many, 256, "x"); }).id == "mk.jit.E005");
}

TEST_CASE("codegen: a lane of members with different grids has its largest member's blocks, a smaller member runs "
          "on the first of them and every block takes part in the chain barrier" *
          doctest::skip(!mkt::have_nvrtc())) {
  // a reduce-scatter, then an all-gather of its output (a composite's chained stages)
  const plan::Plan rs = small_plan("reducescatter.ring", 4, DType::fp32, 1 << 16);
  const plan::Plan ag = small_plan("allgather.direct", 4, DType::fp32, 1 << 16);
  const plan::Kernel& kr = rs.kernels.at(0);
  const plan::Kernel& kg = ag.kernels.at(0);
  REQUIRE(kr.threads == kg.threads);
  REQUIRE(kr.grid != kg.grid);
  const int32_t big = std::max(kr.grid, kg.grid);
  std::vector<codegen::GroupMember> m{{kr.source, kr.name, kr.grid, 0}, {kg.source, kg.name, kg.grid, 0}};
  const std::string src = codegen::group_source(m, kr.threads, "mk_group_chain");
  auto call = [&](const std::string& ns, const plan::Kernel& k, int i) {
    const std::string body = fmt::format("{}::{}_body(g.a[{}], bid, {});", ns, k.name, i, k.grid);
    return k.grid == big ? body : fmt::format("if (bid < {}) {}", k.grid, body);
  };
  const std::string lane = fmt::format("if (b < {}) {{\n    const int bid = b - 0;\n    {}\n"
                                       "    if (!mk_m0::{}_chain(g.a[0], bid, {})) return;\n    {}\n",
                                       big, call("mk_m0", kr, 0), kr.name, big, call("mk_m1", kg, 1));
  CHECK_MESSAGE(src.find(lane) != std::string::npos, src.substr(src.find("extern \"C\"")));
  const auto r = jit::compile(src, "mk_group_chain", 90, /*use_cache=*/false);
  CHECK(!r.cubin.empty());
}

// Adjacent thread blocks that run the same steps with other peers, slots and
// chunks share one function (codegen's block groups, Limits::block_groups):
// every rank's every block runs exactly the statements of a function per
// block, op ids included (each block's own: an error names its op), and the
// kernel holds one copy of the op where it held one per block.
TEST_CASE("codegen: thread blocks of the same steps share one function and run their own statements") {
  codegen::Limits per_block;
  per_block.block_groups = false;
  auto functions = [](const std::vector<codegen::Unit>& units) {
    size_t n = 0;
    for (const auto& u : units)
      for (size_t at = u.source.find("static __device__ "); at != std::string::npos;
           at = u.source.find("static __device__ ", at + 1))
        n += u.source.compare(at, 40, "static __device__ __forceinline__ void b") == 0 ||
             u.source.compare(at, 37, "static __device__ __noinline__ void b") == 0;
    return n;
  };
  auto check = [&](const std::vector<ir::Schedule>& variants, const std::string& what, bool grouped) {
    CAPTURE(what);
    const int n = variants[0].nranks, tbs = variants[0].tbs;
    const auto on = codegen::generate(variants, DType::fp32, RedOp::sum, "t");
    const auto off = codegen::generate(variants, DType::fp32, RedOp::sum, "t", per_block);
    bool any = false;
    for (const auto& u : on) any = any || contains(u.source, "_tbs");
    for (const auto& u : off) CHECK_FALSE(contains(u.source, "_tbs"));
    CHECK(any == grouped);
    if (grouped) CHECK(functions(on) < functions(off));
    const auto a = traces(on, n, tbs), b = traces(off, n, tbs);
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      CAPTURE(i);
      REQUIRE(a[i] == b[i]);
    }
  };
  for (std::string s : {"allreduce.two_shot", "alltoall.direct", "allgather.direct", "reducescatter.direct",
                        "broadcast.direct"})
    for (int n : {3, 6, 16}) check(lower_builtin(s, n).variants, fmt::format("{}, {} ranks", s, n), true);
  check(compiler::lower(scrambled_allgather(9), compiler::LowerOptions{}).variants, "scrambled allgather, 9 ranks", true);
  // a ring's two blocks run different steps, as do the direct all-reduce's;
  // one-pass kernels keep a function per block
  check(lower_builtin("allreduce.ring", 8).variants, "allreduce.ring, 8 ranks", false);
  check(lower_builtin("allreduce.direct", 6).variants, "allreduce.direct, 6 ranks", false);
  compiler::LowerOptions small;
  small.max_bytes = 4096;
  const auto one_pass = compiler::lower(dsl::build(*dsl::find_schedule("allreduce.one_shot"), 4), small);
  REQUIRE(one_pass.variants[0].one_pass);
  check(one_pass.variants, "allreduce.one_shot, 4 ranks, one pass", false);

  // two-shot at 16 ranks: blocks 0-14 scatter a chunk each, one function and one call
  const auto two = codegen::generate(lower_builtin("allreduce.two_shot", 16).variants, DType::bf16, RedOp::sum, "t");
  for (const auto& u : two) {
    CHECK(contains(u.source, "_c0_tbs0_14(mk::dev::Ctx<"));
    CHECK(contains(u.source, " case 13: case 14: b"));
    CHECK(contains(u.source, "(c, c.tb - 0); break;"));
  }
}

// The comment of an op an error record names, found in the generated source
// as the host looks it up (runtime/comm/comm.cpp): on a comment line only, as a
// whole number, also as the first of a loop or of a block group.
TEST_CASE("codegen: op_comment finds an op's comment line") {
  const std::string src =
      "    // %7 copy r0.in[1] -> r1.sc[0]  (a.cpp:3)\n"
      "    if (!c.copy({x}, {y}, mk::dev::pos_code(1, true), 7)) return;\n"
      "      // first of 3: %17 reduce r0.sc[1] -> r0.out[1]  (a.cpp:9)\n"
      "    // block 2 of 2-5: %40 copy r0.in[2] -> r2.sc[1]  (a.cpp:12)\n"
      "    x = %41 ;\n";
  CHECK(codegen::op_comment(src, 7) == "%7 copy r0.in[1] -> r1.sc[0]  (a.cpp:3)");
  CHECK(codegen::op_comment(src, 17) == "%17 reduce r0.sc[1] -> r0.out[1]  (a.cpp:9)");
  CHECK(codegen::op_comment(src, 40) == "%40 copy r0.in[2] -> r2.sc[1]  (a.cpp:12)");
  CHECK(codegen::op_comment(src, 1) == "");   // not the 1 of %17
  CHECK(codegen::op_comment(src, 41) == "");  // not a comment
  CHECK(codegen::op_comment(src, -1) == "");
  // generated code: two-shot at 16 ranks scatters on blocks 0-14 (one
  // function), ops %0, %16, ... %224: each block's op has its comment
  const auto units = codegen::generate(lower_builtin("allreduce.two_shot", 16).variants, DType::fp32, RedOp::sum, "t");
  for (const auto& u : units) {
    REQUIRE(contains(u.source, "_tbs0_14("));
    for (int j = 0; j < 15; ++j) {
      CAPTURE(j);
      CHECK(contains(codegen::op_comment(u.source, 16 * j), fmt::format("%{} copy r0.in[{}]", 16 * j, j + 1)));
    }
  }
}

