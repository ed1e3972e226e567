// Test-only reference implementations of the sync closures (see ref_sync.cpp).
#pragma once

#include <vector>

#include "compiler/ir/ir.hpp"
#include "compiler/passes/passes.hpp"
#include "tests/unit/ref_bitset.hpp"

namespace mk::test_ref {

// insert_sync's edges from dense closures.
std::vector<passes::SyncEdge> ref_sync_edges(const ir::Schedule& s, const passes::SyncNeeds& needs);

struct RefHB {
  std::vector<size_t> topo;
  std::vector<int32_t> data_index;
  BitRows within;
  BitRows cross;
  bool before(size_t a, size_t b) const;        // within a step (both data ops, a != b)
  bool before_reuse(size_t a, size_t b) const;  // a@g before b@(g+depth)
};
RefHB ref_build_hb(const ir::Schedule& s);
// Throws mk.verify.* as verify_sync does (graph errors from build_sync_graph,
// races from the all-pairs check).
void ref_verify_sync(const ir::Schedule& s);

}  // namespace mk::test_ref
