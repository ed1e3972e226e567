// Helpers for the importer tests (test_import_*.cpp).
#pragma once

#include <doctest/doctest.h>

#include <random>
#include <string>

#include "compiler/importers/importers.hpp"
#include "compiler/pipeline.hpp"
#include "compiler/verify/executor.hpp"
#include "compiler/verify/verify.hpp"
#include "support.hpp"

namespace mkt {

inline std::string fixture(const std::string& rel) { return test_dir() + "/fixtures/" + rel; }
inline std::string fixture_text(const std::string& rel) {
  std::string t = read_text(fixture(rel));
  REQUIRE_MESSAGE(!t.empty(), "fixture " << rel << " is missing; run tests/fixtures/gen_fixtures.py");
  return t;
}

// Replaces the first occurrence of `from` (which must exist).
inline std::string edit(std::string text, const std::string& from, const std::string& to) {
  auto at = text.find(from);
  REQUIRE_MESSAGE(at != std::string::npos, "edit: '" << from << "' not found");
  return text.replace(at, from.size(), to);
}

// Lowers and simulates `raw` for a spread of dtypes, ops, sizes and both
// aliasing modes; every run must match the float64 reference. Small counts
// for every dtype, one larger count in fp32.
inline void simulate_all(const mk::ir::Schedule& raw, const std::vector<mk::DType>& dtypes = {mk::DType::fp32,
                                                                                               mk::DType::fp16,
                                                                                               mk::DType::int32}) {
  using namespace mk;
  compiler::LowerOptions lo;
  lo.proto.max_tile_bytes = 16 << 10;  // small tiles: several steps, and a cheap simulation
  auto l = compiler::lower(raw, lo);
  REQUIRE(!l.variants.empty());
  const bool reduces = collective_reduces(raw.coll);
  struct Run {
    DType t;
    RedOp op;
    int64_t count;
  };
  std::vector<Run> runs;
  for (DType t : dtypes)
    for (int64_t count : {0, 1, 777}) runs.push_back({t, RedOp::sum, count});
  if (reduces) runs.push_back({dtypes.front(), RedOp::max, 777});
  runs.push_back({DType::fp32, RedOp::sum, 40001});
  for (size_t v = 0; v < l.variants.size(); ++v)
    for (const Run& run : runs)
      for (bool inplace : {false, true}) {
        if (inplace && raw.coll == Collective::alltoall) continue;
        verify::SimOptions o;
        o.dtype = run.t;
        o.op = run.op;
        o.count = run.count;
        o.inplace = inplace;
        o.launches = 1;
        o.seed = uint64_t(run.count) * 31 + uint64_t(run.t);
        CAPTURE(raw.name);
        CAPTURE(v);
        CAPTURE(name(run.t));
        CAPTURE(name(run.op));
        CAPTURE(run.count);
        CAPTURE(inplace);
        auto r = verify::simulate(l.variants[v], o);
        CHECK_MESSAGE(r.ok, r.first_bad);
      }
}

// Import must either succeed or throw mk::Error: anything else (another
// exception type, an internal error) fails.
inline void import_is_clean(const std::string& text, const std::string& name) {
  try {
    mk::importers::import_text(text, name);
  } catch (const mk::Error&) {
  } catch (const std::exception& e) {
    FAIL("import of a damaged " << name << " threw a non-mk::Error: " << e.what());
  }
}

// Truncations at many lengths and random byte damage of `text`.
inline void damage_is_clean(const std::string& text, const std::string& name, int flips = 300) {
  for (size_t len = 0; len < text.size(); len += 1 + len / 16) import_is_clean(text.substr(0, len), name);
  std::mt19937 rng(12345);
  const std::string alphabet = "<>/=\"' \n&;-!?[]{}:,0123456789abcdefghijklmnopqrstuvwxyz";
  for (int i = 0; i < flips; ++i) {
    std::string t = text;
    int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits; ++e) t[rng() % t.size()] = alphabet[rng() % alphabet.size()];
    import_is_clean(t, name);
  }
}

}  // namespace mkt
