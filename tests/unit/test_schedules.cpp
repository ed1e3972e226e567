// Every built-in schedule, lowered and proved for 1..64 ranks (powers of two
// and not), and simulated on the CPU for a spread of sizes.
#include <doctest/doctest.h>

#include "compiler/pipeline.hpp"
#include "compiler/verify/executor.hpp"
#include "mk/dsl.hpp"

using namespace mk;

namespace {
// Fewer instances than the defaults (16 simple / 4 LL) and small tiles keep the
// simulations fast and make large counts take many steps (scratch reuse across
// steps, several launches). The defaults themselves run in the GPU suite and
// in the CLI tests. verify_each: every pass's guarantees are checked on
// every built-in.
compiler::Lowered lower_builtin(const std::string& name, int n) {
  const auto* info = dsl::find_schedule(name);
  REQUIRE(info != nullptr);
  compiler::LowerOptions o;
  o.verify_each = true;
  o.proto.simple_instances = 3;
  o.proto.ll_instances = 2;
  o.proto.max_tile_bytes = 8192;
  return compiler::lower(dsl::build(*info, n), o);
}
}  // namespace

TEST_CASE("built-in schedules verify for 1..9, 12, 16, 31, 32, 64 ranks") {
  for (const auto& info : dsl::registered_schedules()) {
    for (int n : {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 31, 32, 64}) {
      if (n > 16 && (info.name == "allreduce.one_shot")) continue;  // n^2 pushes; covered to 16
      CAPTURE(info.name);
      CAPTURE(n);
      auto l = lower_builtin(info.name, n);
      CHECK(!l.variants.empty());
    }
  }
}

TEST_CASE("built-in schedules simulate correctly") {
  for (const auto& info : dsl::registered_schedules()) {
    for (int n : {1, 2, 3, 4, 8}) {
      auto l = lower_builtin(info.name, n);
      for (size_t v = 0; v < l.variants.size(); ++v) {
        for (int64_t count : {0, 1, 7, 1000, 70001}) {
          verify::SimOptions o;
          o.count = count;
          o.dtype = DType::fp32;
          o.op = RedOp::sum;
          o.seed = uint64_t(count + n);
          for (bool inplace : {false, true}) {
            if (inplace && info.coll == Collective::alltoall) continue;
            o.inplace = inplace;
            CAPTURE(info.name);
            CAPTURE(n);
            CAPTURE(v);
            CAPTURE(count);
            CAPTURE(inplace);
            auto r = verify::simulate(l.variants[v], o);
            CHECK_MESSAGE(r.ok, r.first_bad);
          }
        }
      }
    }
  }
}
