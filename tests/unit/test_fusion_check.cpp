// The fusion checker (compiler/verify/fusion_check.hpp): fusions whose code
// breaks one rule each are refused with the rule's id, naming the fusion, the
// accessor, the row and the thread, at the fusion's line; correct fusions,
// the built-ins included, pass; find_fusion (what the runtime and mkc ask)
// refuses a bad one before its first use.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "compiler/compile.hpp"
#include "compiler/pipeline.hpp"
#include "compiler/verify/fusion_check.hpp"
#include "compiler/verify/verify.hpp"
#include "mk/dsl.hpp"
#include "mk/fusion.hpp"
#include "support.hpp"

using namespace mk;
using mkt::catch_error;
using mkt::contains;

// ---- fusions that break one rule each (as a user's file would write them) ----

// Reads the next element, which the next thread writes: a race (E021).
MK_EPILOGUE(chk_neighbour,
  struct Epi {
    template <class R>
    MK_DEV static void row(R& r) {
      for (int i = r.first(); i < r.n; i += r.step()) {
        const int j = i + 1 < r.n ? i + 1 : i;
        r.set_out(i, r.out(i) + r.out(j));
      }
    }
  };
)
MK_FUSION(chk_neighbour, "test.chk_neighbour", "out[i] += out[i + 1]", ({}), ({}), mk::dsl::RowMode::given);

// Writes one element past its row: the next row's, past recvbuff on the last (E020).
MK_EPILOGUE(chk_past_row,
  struct Epi {
    template <class R>
    MK_DEV static void row(R& r) {
      for (int i = r.first(); i < r.n; i += r.step()) r.set_out(i, r.out(i));
      if (r.first() == 0) r.set_out(r.n, 0);
    }
  };
)
MK_FUSION(chk_past_row, "test.chk_past_row", "writes out[n]", ({}), ({}), mk::dsl::RowMode::given);

// Stores into an input operand shared by every row (E020).
MK_EPILOGUE(chk_store_input,
  struct Epi {
    template <class R>
    MK_DEV static void row(R& r) {
      for (int i = r.first(); i < r.n; i += r.step()) {
        r.set_out(i, r.out(i) + r.ld(0, i));
        r.st(0, i, r.out(i));
      }
    }
  };
)
MK_FUSION(chk_store_input, "test.chk_store_input", "bias += out", ({{"bias", mk::dsl::Shape::col, false}}), ({}),
          mk::dsl::RowMode::given);

// Depends on the row length the runtime picks for an element-wise fusion (E022).
MK_EPILOGUE(chk_row_length,
  struct Epi {
    template <class R>
    MK_DEV static void row(R& r) {
      for (int i = r.first(); i < r.n; i += r.step()) r.set_out(i, r.out(i) * typename R::C(r.n));
    }
  };
)
MK_FUSION(chk_row_length, "test.chk_row_length", "out *= n", ({}), ({}), mk::dsl::RowMode::any);

// The vector path and the element path compute different things (E022).
MK_EPILOGUE(chk_paths,
  struct Epi {
    template <class R>
    MK_DEV static void row(R& r) {
      using C = typename R::C;
      if (r.vec()) {
        for (int v = r.first(); v < r.nv(); v += r.step()) {
          C x[R::V];
          r.out_v(v, x);
          for (int j = 0; j < R::V; ++j) x[j] = x[j] + C(1);
          r.set_out_v(v, x);
        }
      } else {
        for (int i = r.first(); i < r.n; i += r.step()) r.set_out(i, r.out(i) + C(2));
      }
    }
  };
)
MK_FUSION(chk_paths, "test.chk_paths", "out + 1 or + 2", ({}), ({}), mk::dsl::RowMode::given);

// A vector access without asking r.vec() (E020).
MK_EPILOGUE(chk_no_vec_test,
  struct Epi {
    template <class R>
    MK_DEV static void row(R& r) {
      for (int v = r.first(); v * R::V < r.n; v += r.step()) {
        typename R::C x[R::V];
        r.out_v(v, x);
        r.set_out_v(v, x);
      }
    }
  };
)
MK_FUSION(chk_no_vec_test, "test.chk_no_vec_test", "vectors always", ({}), ({}), mk::dsl::RowMode::given);

// Reads a scalar it does not declare (E020).
MK_EPILOGUE(chk_scalar,
  struct Epi {
    template <class R>
    MK_DEV static void row(R& r) {
      for (int i = r.first(); i < r.n; i += r.step()) r.set_out(i, r.out(i) * r.scalar(0) + r.scalar(1));
    }
  };
)
MK_FUSION(chk_scalar, "test.chk_scalar", "out * a + b, declaring only a", ({}), ({"a"}), mk::dsl::RowMode::any);

// Only thread 0 calls the block-wide reduction (E021: the kernel would hang).
MK_EPILOGUE(chk_uneven,
  struct Epi {
    template <class R>
    MK_DEV static void row(R& r) {
      typename R::C s = 0;
      for (int i = r.first(); i < r.n; i += r.step()) s += r.out(i);
      if (r.first() == 0) s = r.sum(s);
      for (int i = r.first(); i < r.n; i += r.step()) r.set_out(i, s);
    }
  };
)
MK_FUSION(chk_uneven, "test.chk_uneven", "a sum only thread 0 calls", ({}), ({}), mk::dsl::RowMode::given);

// Every thread stores the row's per-row output (E021: writes race).
MK_EPILOGUE(chk_row_race,
  struct Epi {
    template <class R>
    MK_DEV static void row(R& r) {
      typename R::C m = 0;
      for (int i = r.first(); i < r.n; i += r.step()) m = r.abs(r.out(i)) > m ? r.abs(r.out(i)) : m;
      r.st(0, 0, m);  // each thread's own partial, unreduced
    }
  };
)
MK_FUSION(chk_row_race, "test.chk_row_race", "per-row max without a reduction",
          ({{"amax", mk::dsl::Shape::row, true}}), ({}), mk::dsl::RowMode::given);

// Reads the residual after writing residual_out: wrong when the caller passes
// one buffer for both, as the runtime allows (E022).
MK_EPILOGUE(chk_alias,
  struct Epi {
    template <class R>
    MK_DEV static void row(R& r) {
      for (int i = r.first(); i < r.n; i += r.step()) {
        r.st(1, i, r.out(i) + r.ld(0, i));
        r.set_out(i, r.ld(1, i) + r.ld(0, i));  // reads operand 0 again after writing operand 1
      }
    }
  };
)
MK_FUSION(chk_alias, "test.chk_alias", "reads the residual after writing residual_out",
          ({{"residual", mk::dsl::Shape::elem, false}, {"residual_out", mk::dsl::Shape::elem, true}}), ({}),
          mk::dsl::RowMode::any);

// Never ends (E020: more accesses than any row needs).
MK_EPILOGUE(chk_forever,
  struct Epi {
    template <class R>
    MK_DEV static void row(R& r) {
      for (int i = r.first(); i < r.n; i += r.step() - r.step()) r.set_out(i, r.out(i));
    }
  };
)
MK_FUSION(chk_forever, "test.chk_forever", "a loop that never moves", ({}), ({}), mk::dsl::RowMode::any);

// Correct code with a reference that disagrees (E022: the reference catches it).
MK_EPILOGUE(chk_times_two,
  struct Epi {
    template <class R>
    MK_DEV static void row(R& r) {
      for (int i = r.first(); i < r.n; i += r.step()) r.set_out(i, r.out(i) * typename R::C(2));
    }
  };
)
MK_FUSION(chk_times_two, "test.chk_times_two", "out * 2 (its reference says * 3)", ({}), ({}), mk::dsl::RowMode::any);
static void times_three(mk::dsl::FusionRef& r) {
  for (int64_t i = 0; i < r.count; ++i) r.want_out(i, r.out(i) * 3, 1e-6);
}
MK_FUSION_REFERENCE("test.chk_times_two", times_three);

// A prologue that reads a scalar it does not declare, one that keeps state.
MK_PROLOGUE(chk_pro_scalar,
  struct Pro {
    template <class Q>
    MK_DEV static typename Q::C in(const Q& q, typename Q::C x) {
      return x * q.scalar(2);
    }
  };
)
MK_PROLOGUE_FUSION(chk_pro_scalar, "test.chk_pro_scalar", "x * s2 declaring one scalar", ({"s"}));
MK_PROLOGUE(chk_pro_state,
  struct Pro {
    template <class Q>
    MK_DEV static typename Q::C in(const Q& q, typename Q::C x) {
      static int calls = 0;
      return x + typename Q::C(++calls % 2);
    }
  };
)
MK_PROLOGUE_FUSION(chk_pro_state, "test.chk_pro_state", "a prologue that counts its calls", ({}));

// Steps by 256 elements: fine for 4 threads, a race for a block of 512
// (threads t and t + 256 both write element t + 256) (E021).
MK_EPILOGUE(chk_step256,
  struct Epi {
    template <class R>
    MK_DEV static void row(R& r) {
      for (int i = r.first(); i < r.n; i += 256) r.set_out(i, r.out(i) * typename R::C(3));
    }
  };
)
MK_FUSION(chk_step256, "test.chk_step256", "a fixed stride of 256", ({}), ({}), mk::dsl::RowMode::given);

// Races on fp32 only (its vector width is 4; fp16's and bf16's is 8): a call
// of another dtype runs code the checker passes.
MK_EPILOGUE(chk_fp32_race,
  struct Epi {
    template <class R>
    MK_DEV static void row(R& r) {
      for (int i = r.first(); i < r.n; i += r.step()) {
        const int j = R::V == 4 && i + 1 < r.n ? i + 1 : i;
        r.set_out(i, r.out(i) + r.out(j));
      }
    }
  };
)
MK_FUSION(chk_fp32_race, "test.chk_fp32_race", "out[i] += out[i + 1] on fp32", ({}), ({}), mk::dsl::RowMode::given);

// Writes only half of its output operand (E022: the caller keeps stale data).
MK_EPILOGUE(chk_half,
  struct Epi {
    template <class R>
    MK_DEV static void row(R& r) {
      for (int i = r.first(); i < r.n; i += r.step())
        if (i % 2 == 0) r.st(0, i, r.out(i));
    }
  };
)
MK_FUSION(chk_half, "test.chk_half", "writes every other element of y", ({{"y", mk::dsl::Shape::elem, true}}), ({}),
          mk::dsl::RowMode::any);

// Operand -1 (E020, not the output).
MK_EPILOGUE(chk_minus_one,
  struct Epi {
    template <class R>
    MK_DEV static void row(R& r) {
      for (int i = r.first(); i < r.n; i += r.step()) r.set_out(i, r.ld(-1, i));
    }
  };
)
MK_FUSION(chk_minus_one, "test.chk_minus_one", "reads operand -1", ({{"x", mk::dsl::Shape::elem, false}}), ({}),
          mk::dsl::RowMode::any);

// Spins without touching memory until the test lets it go: the row deadline.
static volatile bool chk_spin_hold = true;
MK_EPILOGUE(chk_spin,
  struct Epi {
    template <class R>
    MK_DEV static void row(R& r) {
      while (chk_spin_hold) {
      }
      for (int i = r.first(); i < r.n; i += r.step()) r.set_out(i, r.out(i));
    }
  };
)
MK_FUSION(chk_spin, "test.chk_spin", "a loop that never ends", ({}), ({}), mk::dsl::RowMode::any);

// Correct, with a reference declared in this file; a replacement of it from
// another file does not inherit the reference.
MK_EPILOGUE(chk_halve,
  struct Epi {
    template <class R>
    MK_DEV static void row(R& r) {
      for (int i = r.first(); i < r.n; i += r.step()) r.set_out(i, r.out(i) * typename R::C(0.5));
    }
  };
)
MK_FUSION(chk_halve, "test.chk_halve", "out / 2", ({}), ({}), mk::dsl::RowMode::any);
static void halve_reference(mk::dsl::FusionRef& r) {
  for (int64_t i = 0; i < r.count; ++i) r.want_out(i, r.out(i) / 2, r.smallest());  // exact but among subnormals
}
MK_FUSION_REFERENCE("test.chk_halve", halve_reference);

// y = out + residual, out = y * gate: correct with separate buffers; wrong
// when a caller passes one buffer as y and gate, which the runtime must
// then refuse (the checker tells it so), while y == residual is fine.
MK_EPILOGUE(chk_gated,
  struct Epi {
    template <class R>
    MK_DEV static void row(R& r) {
      for (int i = r.first(); i < r.n; i += r.step()) {
        const typename R::C y = r.out(i) + r.ld(0, i);
        r.st(2, i, y);
        r.set_out(i, y * r.ld(1, i));
      }
    }
  };
)
MK_FUSION(chk_gated, "test.chk_gated", "y = out + residual; out = y * gate",
          ({{"residual", mk::dsl::Shape::elem, false}, {"gate", mk::dsl::Shape::elem, false},
            {"y", mk::dsl::Shape::elem, true}}),
          ({}), mk::dsl::RowMode::any);

// Correct user fusions: a per-column bias with a block-wide mean, and a
// per-row scale written by one thread after the reduction.
MK_EPILOGUE(chk_good,
  struct Epi {
    template <class R>
    MK_DEV static void row(R& r) {
      using C = typename R::C;
      C s = 0;
      for (int i = r.first(); i < r.n; i += r.step()) s += r.out(i);
      const C mean = r.sum(s) / C(r.n);
      if (r.first() == 0) r.st(1, 0, mean);
      for (int i = r.first(); i < r.n; i += r.step()) r.set_out(i, r.out(i) - mean + r.ld(0, i) * r.scalar(0));
    }
  };
)
MK_FUSION(chk_good, "test.chk_good", "out - mean(out) + bias * s, mean per row",
          ({{"bias", mk::dsl::Shape::col, false}, {"mean", mk::dsl::Shape::row, true, false, mk::DType::fp32}}),
          ({"s"}), mk::dsl::RowMode::given);

namespace {

const dsl::FusionInfo& unchecked(const std::string& name) {
  const dsl::FusionInfo* f = dsl::find_fusion_unchecked(name);
  REQUIRE_MESSAGE(f != nullptr, name);
  return *f;
}

mkt::Caught refused(const std::string& name) {
  return catch_error([&] { verify::check_fusion(unchecked(name)); });
}

}  // namespace

TEST_CASE("fusion check: the built-ins and correct user fusions pass, against their float64 references") {
  for (const char* n : {"allreduce.rmsnorm", "allreduce.fp8_rows", "allreduce.premulsum", "test.chk_good",
                        "test.clip_sum_times"}) {
    CAPTURE(n);
    const auto rep = verify::check_fusion(unchecked(n));
    CHECK(rep.rows + rep.values > 0);
    if (std::string(n).rfind("allreduce.", 0) == 0) {
      CHECK(rep.reference);  // every built-in declares one
      CHECK(rep.max_err <= rep.max_tol);
    }
  }
  const auto rep = verify::check_fusion(unchecked("allreduce.rmsnorm"));
  CHECK(contains(rep.summary, "same bits on the vector and element paths"));
  CHECK(contains(rep.summary, "the same buffer as an input"));
  CHECK(contains(rep.summary, "within its float64 reference"));
  CHECK(rep.lengths.front() == 1);
  CHECK(rep.lengths.back() == 16384);  // the longest row it serves
  CHECK(dsl::find_fusion("allreduce.rmsnorm") != nullptr);
}

TEST_CASE("fusion check: mk.verify.E020 accesses outside the row, into an input, of undeclared scalars") {
  auto c = refused("test.chk_past_row");
  CHECK(c.id == "mk.verify.E020");
  CHECK(contains(c.message, "fusion test.chk_past_row (fp16 epilogue)"));
  CHECK(contains(c.message, "thread 0 of 4: r.set_out(i, v) with i = 1, outside the row's elements 0..0"));
  CHECK(contains(c.loc.file, "test_fusion_check.cpp"));
  CHECK(c.loc.line == uint32_t(mkt::line_of(__FILE__, "MK_EPILOGUE(chk_past_row,")));

  c = refused("test.chk_store_input");
  CHECK(c.id == "mk.verify.E020");
  CHECK(contains(c.message, "r.st(k, i, v) writes operand 0 (bias, per column, an input)"));
  CHECK(contains(c.message, "shared by every row's block"));

  c = refused("test.chk_no_vec_test");
  CHECK(c.id == "mk.verify.E020");
  CHECK(contains(c.message, "r.out_v(v, x) on a row the kernel moves element by element"));

  c = refused("test.chk_scalar");
  CHECK(c.id == "mk.verify.E020");
  CHECK(contains(c.message, "r.scalar(1): the fusion declares 1 scalar(s) (a)"));

  c = refused("test.chk_forever");
  CHECK(c.id == "mk.verify.E020");
  CHECK(contains(c.message, "the code does not end"));

  c = refused("test.chk_pro_scalar");
  CHECK(c.id == "mk.verify.E020");
  CHECK(contains(c.message, "fusion test.chk_pro_scalar (fp16 prologue)"));
  CHECK(contains(c.message, "q.scalar(2)"));
  CHECK(c.loc.line == uint32_t(mkt::line_of(__FILE__, "MK_PROLOGUE(chk_pro_scalar,")));
}

TEST_CASE("fusion check: mk.verify.E021 threads that race on an element or call reductions unevenly") {
  auto c = refused("test.chk_neighbour");
  CHECK(c.id == "mk.verify.E021");
  CHECK(contains(c.message, "r.set_out(i, v) writes out[1], which thread 0 read (r.out(i))"));
  CHECK(contains(c.message, "after the same block-wide reduction (the start of the row)"));

  c = refused("test.chk_row_race");
  CHECK(c.id == "mk.verify.E021");
  CHECK(contains(c.message, "r.st(k, i, v) writes amax[0], which thread 0 writes"));

  c = refused("test.chk_uneven");
  CHECK(c.id == "mk.verify.E021");
  CHECK(contains(c.message, "ends after 0 block-wide reduction(s) while thread 0 calls a 1st"));
  CHECK(contains(c.what, "let each thread touch only its own elements"));  // the race hint, not the bounds one

  // the kernels' block sizes: a stride of 256 races only in a block of 512
  c = refused("test.chk_step256");
  CHECK(c.id == "mk.verify.E021");
  CHECK(contains(c.message, "thread 256 of 512"));
  CHECK(contains(c.message, "out[256], which thread 0 writes (r.set_out(i, v))"));
}

TEST_CASE("fusion check: operand -1 is not the output, and a row that never ends is refused at its deadline") {
  auto c = refused("test.chk_minus_one");
  CHECK(c.id == "mk.verify.E020");
  CHECK(contains(c.message, "r.ld(k, i) names operand -1"));
  verify::FusionCheckOptions o;
  o.row_deadline_ms = 300;
  o.dtypes = {DType::fp32};
  c = catch_error([&] { verify::check_fusion(unchecked("test.chk_spin"), o); });
  chk_spin_hold = false;  // the row's thread, left behind, ends now
  CHECK(c.id == "mk.verify.E020");
  CHECK(contains(c.message, "the row did not end within 300 ms"));
}

TEST_CASE("fusion check: aliasing an output with an input is recorded, and refused only where the results differ") {
  // chk_alias reads the residual after writing residual_out
  const auto& a = unchecked("test.chk_alias");
  const auto rep = verify::check_fusion(a);  // correct with separate buffers
  REQUIRE(rep.aliases.size() == 1);
  CHECK(contains(rep.aliases[0].why, "with residual_out the same buffer as residual"));
  CHECK(contains(rep.summary, "except residual_out as residual"));
  CHECK(contains(verify::alias_refusal(a, {{1, 0}}), "reads an input at an element after writing the output"));
  // chk_gated: y may be the residual (read first), not the gate (read after y is written)
  const auto& g = unchecked("test.chk_gated");
  CHECK(verify::alias_refusal(g, {{2, 0}}).empty());
  CHECK(contains(verify::alias_refusal(g, {{2, 1}}), "with y the same buffer as gate"));
  CHECK(verify::alias_refusal(unchecked("allreduce.rmsnorm"), {{1, 0}}).empty());  // residual_out == residual
}

TEST_CASE("fusion check: a reference belongs to its file, so a replacement from another file does not inherit it") {
  const dsl::FusionInfo mine = unchecked("test.chk_halve");
  CHECK(bool(mine.reference));
  dsl::FusionInfo other = mine;
  other.file = "elsewhere.cpp";
  other.reference = nullptr;
  REQUIRE(dsl::register_fusion(other));
  CHECK(!unchecked("test.chk_halve").reference);
  CHECK(!verify::check_fusion(unchecked("test.chk_halve")).reference);
  REQUIRE(dsl::register_fusion(mine));  // this file's again: its reference with it
  CHECK(bool(unchecked("test.chk_halve").reference));
  CHECK(verify::check_fusion(unchecked("test.chk_halve")).reference);
}

TEST_CASE("fusion check: mk.verify.E022 results that depend on the path, the row length, aliasing or miss the "
          "reference") {
  auto c = refused("test.chk_paths");
  CHECK(c.id == "mk.verify.E022");
  CHECK(contains(c.message, "on the vector path and"));
  CHECK(contains(c.message, "on the element path"));

  c = refused("test.chk_row_length");
  CHECK(c.id == "mk.verify.E022");
  CHECK(contains(c.message, "must not depend on the row length"));

  c = refused("test.chk_half");
  CHECK(c.id == "mk.verify.E022");
  CHECK(contains(c.message, "y[1] (row 0) is never written"));
  CHECK(contains(c.what, "store every element of each output operand"));

  c = refused("test.chk_times_two");
  CHECK(c.id == "mk.verify.E022");
  CHECK(contains(c.message, "its float64 reference (MK_FUSION_REFERENCE) says"));

  c = refused("test.chk_pro_state");
  CHECK(c.id == "mk.verify.E022");
  CHECK(contains(c.message, "keeps state between calls"));
}

TEST_CASE("fusion check: find_fusion refuses a bad fusion before its first use, every time, and compile_plan with it") {
  for (int k = 0; k < 2; ++k)
    CHECK(catch_error([] { dsl::find_fusion("test.chk_neighbour"); }).id == "mk.verify.E021");
  CHECK(dsl::find_fusion_unchecked("test.chk_neighbour") != nullptr);  // registered, just never handed out
  const dsl::ScheduleInfo* ring = dsl::find_schedule("allreduce.ring");
  REQUIRE(ring != nullptr);
  compiler::CompileOptions o;
  o.dtype = DType::bf16;
  o.fusion = "test.chk_neighbour";
  CHECK(catch_error([&] { compiler::compile_plan(dsl::build(*ring, 2), o); }).id == "mk.verify.E021");
}

// A call's first use checks the fusion on the call's dtype only (a third of
// the work for a fusion of three dtypes); find_fusion without one, every dtype.
TEST_CASE("fusion check: per dtype: a fusion refused on fp32 serves bf16, and compile_plan checks the plan's dtype") {
  CHECK(dsl::find_fusion("test.chk_fp32_race", DType::bf16) != nullptr);
  CHECK(dsl::find_fusion("test.chk_fp32_race", DType::fp16) != nullptr);
  for (int k = 0; k < 2; ++k) {
    const auto e = catch_error([] { dsl::find_fusion("test.chk_fp32_race", DType::fp32); });
    CHECK(e.id == "mk.verify.E021");
    CHECK(contains(e.message, "(fp32 epilogue)"));
  }
  CHECK(catch_error([] { dsl::find_fusion("test.chk_fp32_race"); }).id == "mk.verify.E021");
  CHECK(catch_error([] { dsl::find_fusion("test.chk_fp32_race", DType::fp64); }).id == "mk.cli.E013");
  const dsl::FusionInfo& f = unchecked("test.chk_fp32_race");
  CHECK(catch_error([&] { verify::alias_refusal(f, {}, DType::fp32); }).id == "mk.verify.E021");
  CHECK(verify::alias_refusal(f, {}, DType::bf16).empty());
  const dsl::ScheduleInfo* ring = dsl::find_schedule("allreduce.ring");
  REQUIRE(ring != nullptr);
  compiler::CompileOptions o;
  o.fusion = "test.chk_fp32_race";
  o.dtype = DType::fp32;
  o.lower.max_bytes = 4096;  // one bucket: the check's error comes after the compile it overlapped
  CHECK(catch_error([&] { compiler::compile_plan(dsl::build(*ring, 2), o); }).id == "mk.verify.E021");
  o.dtype = DType::bf16;
  const plan::Plan p = compiler::compile_plan(dsl::build(*ring, 2), o);
  CHECK(p.fusion.rfind("test.chk_fp32_race@", 0) == 0);
  CHECK(p.kernels.size() == 1);
}

TEST_CASE("simulate_fusion: a fused all-reduce on the CPU against float64 and across ranks") {
  const dsl::ScheduleInfo* ring = dsl::find_schedule("allreduce.ring");
  REQUIRE(ring != nullptr);
  const compiler::Lowered l = compiler::lower(dsl::build(*ring, 3), {});
  verify::FusionSimOptions o;
  o.count = 96;
  o.row = 32;
  for (DType t : {DType::bf16, DType::fp32}) {
    o.dtype = t;
    const auto r = verify::simulate_fusion(l.variants.front(), unchecked("allreduce.rmsnorm"), o);
    CHECK_MESSAGE(r.first_bad.empty(), r.first_bad);
    CHECK(r.reference);
    CHECK(r.checked == 3 * 96);
    const auto p = verify::simulate_fusion(l.variants.front(), unchecked("allreduce.premulsum"), o);
    CHECK_MESSAGE(p.first_bad.empty(), p.first_bad);
  }
  // the reference catches an epilogue that disagrees with it
  o.dtype = DType::fp32;
  const auto bad = verify::simulate_fusion(l.variants.front(), unchecked("test.chk_times_two"), o);
  CHECK(contains(bad.first_bad, "its float64 reference says"));
  CHECK(bad.bad_id == ErrId::verify_E022);
}
