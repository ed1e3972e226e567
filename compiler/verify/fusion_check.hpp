// The fusion checker: a fusion's prologue and epilogue (include/mk/fusion.hpp)
// are user device code pasted into the collective's kernel, where nothing
// bounds their accesses. This runs their host build (the same code, compiled
// into the schedule file) on the CPU before the fusion is first used, as the
// kernel would: each row by several threads of one block (one after another,
// switching at block-wide reductions, so the run is deterministic), through
// accessors that check and record every access, for every dtype the fusion
// serves, on rows of lengths 1, odd, the vector width -1, 0 and +1, several
// vectors per thread, and the longest row it serves. It refuses:
//
//  mk.verify.E020  an access outside the row (r.out(i), an element or column
//                  operand's i outside 0..n-1, a vector outside 0..nv()-1),
//                  an operand index the fusion does not declare, a vector
//                  access on a row the kernel moves element by element
//                  (r.vec() false), a store into an operand declared as an
//                  input, a scalar past the declared ones, code that never
//                  ends (more accesses than any row could need);
//  mk.verify.E021  two threads of a row touching one element of the output
//                  or an output operand, one of them writing, with no
//                  block-wide reduction (r.sum, r.max) between them; threads
//                  that call block-wide reductions unevenly (the kernel would
//                  hang or mix them up);
//  mk.verify.E022  results (every output bit) that differ between the vector
//                  and the element path (ranks whose buffers differ in
//                  alignment would differ), between row lengths for an
//                  element-wise fusion (RowMode::any: the runtime picks the
//                  rows), or with an output operand the same buffer as an
//                  input one where the runtime allows it (residual_out ==
//                  residual); and results outside the fusion's float64
//                  reference (MK_FUSION_REFERENCE) where one is declared.
//
// A prologue is checked on a spread of values of each dtype: its scalars
// (E020), the same bits from two calls (E022), and its reference
// (MK_PROLOGUE_REFERENCE, E022). What the checker cannot see: code that only
// the device build compiles differently (it is the same source), loops that
// never end without touching memory, and behaviour on rows or values it did
// not try. Errors name the fusion, the dtype, the row, the thread, the
// accessor call and the index, at the fusion's MK_EPILOGUE / MK_PROLOGUE line.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "compiler/ir/ir.hpp"
#include "mk/fusion.hpp"

namespace mk::verify {

struct FusionCheckOptions {
  std::vector<DType> dtypes;    // empty: every dtype the fusion serves
  std::vector<double> scalars;  // the call's scalars; empty: 0.5, 0.75, 1, 1.25
  std::vector<double> scalars2;  // a second set, against the reference; empty: 0.3, 1.7, 1e-3, 2.9
  int threads = 4;              // simulated threads per row (one block); rows by 256 and 512 are run too
  uint64_t seed = 1;            // data
  // A row that has not ended by then is refused (E020: a loop that never
  // ends); its threads are left running, detached.
  int64_t row_deadline_ms = 20000;
};

// An output operand stored in an input operand's buffer (the runtime lets a
// call pass one buffer for both: residual_out == residual): `why` is "" when
// every result has the same bits as with separate buffers.
struct AliasVerdict {
  int output = -1, input = -1;
  std::string why;
};

struct FusionCheckReport {
  int64_t rows = 0;          // rows run (every thread of each)
  int64_t accesses = 0;      // accesses checked
  std::vector<int64_t> lengths;  // row lengths tried (the first dtype's)
  int64_t values = 0;        // prologue: values tried
  std::vector<int> device_threads;  // the block sizes rows were also run by (256, 512)
  std::vector<AliasVerdict> aliases;  // every output/input pair the runtime may alias
  std::string aliases_together;       // "" or why the safe pairs fail when aliased together
  bool reference = false;    // compared with a float64 reference
  double max_err = 0, max_tol = 0;  // against it: the largest |got - want| and its tolerance
  std::string summary;       // one paragraph: what was checked
};

// Checks fusion `f` (prologue and epilogue, whichever it has); throws the
// mk.verify.E020-E022 error of the first problem.
FusionCheckReport check_fusion(const dsl::FusionInfo& f, const FusionCheckOptions& o = {});

// check_fusion with the default options on one dtype, once per registration
// (the registry entry's address; entries never change) and dtype: what
// find_fusion(name, dtype) asks before it returns a fusion for a call of that
// dtype. Without a dtype, every dtype the fusion serves, one by one in its
// order (what find_fusion(name) asks). Rethrows the first run's error on
// later calls. A dtype the fusion does not serve is mk.cli.E013.
void check_fusion_once(const dsl::FusionInfo& f, std::optional<DType> dtype = std::nullopt);

// Why a call of `dtype` may not pass these (output operand, input operand)
// pairs as one buffer each ("" when it may): what the checker saw with them
// aliased on that dtype. Without a dtype: refused if any dtype the fusion
// serves refuses them. Checks the fusion first (check_fusion_once).
std::string alias_refusal(const dsl::FusionInfo& f, const std::vector<std::pair<int, int>>& pairs,
                          std::optional<DType> dtype = std::nullopt);

// `mkc simulate --fusion`: a fused all-reduce on the CPU. The lowered
// schedule runs in the executor with the fusion's prologue (each rank its own
// scalars), then each rank's epilogue runs on its output (rows of `row`,
// operands that every rank shares), and the results are compared: the
// all-reduce with a float64 sum of the prologue's exact values (its bound:
// the sum's roundings and each term's), every output and output operand
// with the fusion's float64 reference where one is declared, and every
// rank's bits with rank 0's.
struct FusionSimOptions {
  DType dtype = DType::bf16;
  int64_t count = 4096;
  int64_t row = 0;  // the epilogue's row (0: 4096 for an element-wise fusion; a given-row fusion needs one)
  bool inplace = false;
  uint64_t seed = 1;
  // The call's scalars, each rank's (empty: a prologue-only fusion gives rank
  // r 0.5 + 0.25 * ((r + k) % 4), a fusion with an epilogue gives every rank
  // 0.5, 0.75, 1, 1.25 so that ranks' epilogue results can be compared).
  std::vector<std::vector<double>> scalars;
  // The determinism proof says ranks may differ bit-wise for this call
  // (Orders::for_call, mk.verify.E015): count the differences instead of
  // reporting them, and do not compare the epilogue's results across ranks.
  bool ranks_may_differ = false;
};
struct FusionSimResult {
  int64_t rank_diffs = 0;      // all-reduce elements whose bits differ from rank 0's
  int64_t checked = 0;         // elements compared with a reference
  double max_err = 0, max_tol = 0;  // the all-reduce's
  bool reference = false;      // the epilogue compared with MK_FUSION_REFERENCE
  double ref_max_err = 0, ref_max_tol = 0;
  std::string first_bad;       // "" when everything agreed
  ErrId bad_id = ErrId::verify_E013;
};
FusionSimResult simulate_fusion(const ir::Schedule& lowered, const dsl::FusionInfo& f, const FusionSimOptions& o);

}  // namespace mk::verify
