// Helpers of the sync-analysis tests (test_sync_clocks.cpp, test_symmetry.cpp).
#pragma once

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "compiler/pipeline.hpp"
#include "compiler/topology/topology.hpp"
#include "mk/dsl.hpp"
#include "support.hpp"

namespace test_sync {

// The schedules a built-in gives insert_sync (one per size bucket), for a
// topology ("": one node of n). The pipeline's own sync and proof run too
// (and must pass); the schedules were captured before them.
inline std::vector<mk::ir::Schedule> before_sync(const std::string& name, int n, const std::string& topo = "") {
  const auto* info = mk::dsl::find_schedule(name);
  REQUIRE(info != nullptr);
  mk::compiler::LowerOptions o;
  o.proto.simple_instances = 2;
  o.proto.ll_instances = 2;
  std::vector<mk::ir::Schedule> out;
  o.on_pass = [&](std::string_view pass, const mk::ir::Schedule& s, const mk::compiler::PassInfo&) {
    if (pass == "protocol") out.push_back(s);
  };
  mk::ir::Schedule built =
      topo.empty() ? mk::dsl::build(*info, n) : mk::dsl::build(*info, mk::topology::parse(topo, n));
  CHECK_NOTHROW(mk::compiler::lower(std::move(built), o));
  return out;
}

// Outcome of a verifier: "" or the error id.
template <class F>
std::string verdict(F&& f) {
  try {
    f();
    return "";
  } catch (const mk::Error& e) {
    return mk::err_name(e.id());
  }
}

}  // namespace test_sync
