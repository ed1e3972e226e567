// verify_prologue: the prologue (PreMulSum's scaling, or a fusion's
// MK_PROLOGUE) transforms every contribution exactly once.
//
// The kernel multiplies a source by its rank's scalar exactly when the source
// is an input chunk (templates/kernel.cuh run_op), and it can only know its
// own rank's scalar. verify_semantics has already proved which contributions
// each output holds; this pass follows one more fact per chunk, in program
// order and in both aliasings: whether the value there is the caller's
// pristine input (unscaled), or a value all of whose contributions were
// scaled once. Every source that is an input chunk must be pristine and read
// by its owner; every other source must not be pristine (an in-place output
// still holding the input would enter unscaled); every output ends scaled.
#include <fmt/format.h>

#include <unordered_map>
#include <vector>

#include "compiler/verify/verify.hpp"

namespace mk::verify {
namespace {

using ir::Buf;
using ir::Op;
using ir::Ref;
using ir::Schedule;

enum class State : uint8_t { none, pristine, scaled };

class Cells {
 public:
  Cells(const Schedule& s, bool inplace) : s_(s), inplace_(inplace) {
    cin_ = ir::buf_chunks(s, Buf::input);
    cout_ = ir::buf_chunks(s, Buf::output);
    data_.assign(size_t(s.nranks) * size_t(cin_ + cout_), State::none);
    for (int32_t r = 0; r < s.nranks; ++r)
      if (ir::has_input(s, r))
        for (int32_t j = 0; j < cin_; ++j) at(Ref{r, Buf::input, j, 1}) = State::pristine;
  }
  State& at(const Ref& c) {
    if (c.buf == Buf::scratch) return scratch_[(uint64_t(uint32_t(c.rank)) << 32) | uint32_t(c.index)];
    int32_t i = c.buf == Buf::input ? c.index : cin_ + c.index;
    if (inplace_ && c.buf == Buf::input)
      if (auto o = ir::inplace_output_of_input(s_, c.rank, c.index)) i = cin_ + *o;
    return data_[size_t(c.rank) * size_t(cin_ + cout_) + size_t(i)];
  }
  int32_t outputs() const { return cout_; }

 private:
  const Schedule& s_;
  bool inplace_;
  int32_t cin_ = 0, cout_ = 0;
  std::vector<State> data_;
  std::unordered_map<uint64_t, State> scratch_;
};

void run(const Schedule& s, bool inplace, const std::string& what) {
  const char* mode = inplace ? "in-place" : "out-of-place";
  const std::string who =
      fmt::format("{} ({} ranks, {}, {})", s.name.empty() ? std::string(name(s.coll)) : s.name, s.nranks, mode, what);
  Cells cells(s, inplace);
  // In place, a copy of an input chunk onto its own output alias writes
  // nothing for a sum, so insert_sync orders nothing against it; a PreMulSum
  // kernel writes the scaled value there. Sound only while no other op reads
  // that location (the input or its alias), before or after.
  if (inplace) {
    std::unordered_map<const State*, size_t> self;  // location -> the op copying it onto itself
    for (size_t oi = 0; oi < s.ops.size(); ++oi) {
      const Op& op = s.ops[oi];
      if (!op.is_copy() || op.srcs.empty() || op.srcs[0].buf != Buf::input) continue;
      for (int32_t k = 0; k < op.count(); ++k)
        for (const Ref& d : op.dsts)
          if (&cells.at(d.at(k)) == &cells.at(op.srcs[0].at(k))) self.emplace(&cells.at(d.at(k)), oi);
    }
    if (!self.empty())
      for (size_t oi = 0; oi < s.ops.size(); ++oi) {
        const Op& op = s.ops[oi];
        if (!op.is_data()) continue;
        for (const Ref& src : op.srcs)
          for (int32_t k = 0; k < op.count(); ++k) {
            auto it = self.find(&cells.at(src.at(k)));
            if (it == self.end() || it->second == oi) continue;
            const Op& c = s.ops[it->second];
            // On one thread block, program order orders the two; on two, no
            // sync was inserted for the self-copy (a sum kernel skips it).
            const bool one_tb = op.rank == c.rank && op.tb >= 0 && op.tb == c.tb;
            const std::string relation =
                !one_tb ? fmt::format("unordered with {}, which also reads {} (a sum kernel skips such a copy, so "
                                      "nothing orders the two)",
                                      describe_op(s, oi), ir::to_string(src.at(k)))
                : oi > it->second
                    ? fmt::format("and then {} on the same thread block reads {} back, transformed already, and "
                                  "would transform it again",
                                  describe_op(s, oi), ir::to_string(src.at(k)))
                    : fmt::format("while {} on the same thread block reads {} before it (the checker refuses every "
                                  "other reader of a location a prologue copies onto itself)",
                                  describe_op(s, oi), ir::to_string(src.at(k)));
            throw Error(ErrId::verify_E018,
                        fmt::format("{}: {} copies input {} onto itself (its in-place output), which a kernel with a "
                                    "prologue must write (the prologue's value), {}",
                                    who, describe_op(s, it->second), ir::to_string(c.srcs[0]), relation),
                        c.loc, "copy the input into scratch or another chunk instead of onto itself");
          }
      }
  }
  std::vector<State> result;
  for (size_t oi = 0; oi < s.ops.size(); ++oi) {
    const Op& op = s.ops[oi];
    if (!op.is_data()) continue;
    const int32_t n = op.count();
    result.assign(size_t(n), State::none);
    for (int32_t k = 0; k < n; ++k) {
      for (const Ref& src : op.srcs) {
        const Ref c = src.at(k);
        const State st = cells.at(c);
        if (c.buf == Buf::input) {
          if (c.rank != op.rank)
            throw Error(ErrId::verify_E018,
                        fmt::format("{}: {} reads rank {}'s input {}; the prologue transforms an input with its "
                                    "owner's scalars, which only rank {} has",
                                    who, describe_op(s, oi), c.rank, ir::to_string(c), c.rank),
                        op.loc, "let the owner read its input (zero-copy plans cannot run a prologue)");
          if (st != State::pristine)
            throw Error(ErrId::verify_E018,
                        fmt::format("{}: {} reads input {} after it was overwritten (through its in-place "
                                    "output); the prologue would scale a result again",
                                    who, describe_op(s, oi), ir::to_string(c)),
                        op.loc, "read each input chunk before anything writes its in-place output chunk");
        } else if (st == State::pristine) {
          throw Error(ErrId::verify_E018,
                      fmt::format("{}: {} reads {}, which still holds the caller's input (its in-place alias), "
                                  "unscaled: the prologue scales only reads of the input buffer",
                                  who, describe_op(s, oi), ir::to_string(c)),
                      op.loc, "read the input chunk itself");
        }
      }
      result[size_t(k)] = State::scaled;
    }
    for (const Ref& d : op.dsts)
      for (int32_t k = 0; k < n; ++k) cells.at(d.at(k)) = result[size_t(k)];
  }
  for (int32_t r = 0; r < s.nranks; ++r) {
    if (!ir::has_output(s, r)) continue;
    for (int32_t i = 0; i < cells.outputs(); ++i)
      if (cells.at(Ref{r, Buf::output, i, 1}) != State::scaled)
        throw Error(ErrId::verify_E018,
                    fmt::format("{}: rank {} output chunk {} does not end as a value read from scaled inputs", who, r, i),
                    s.loc, "write every output chunk from a read of the input");
  }
}

}  // namespace

void verify_prologue(const Schedule& s, const std::string& what) {
  if (!collective_reduces(s.coll))
    throw Error(ErrId::verify_E018, fmt::format("{}: {} does not reduce; the {} runs on reductions",
                                                s.name, name(s.coll), what));
  run(s, false, what);
  run(s, true, what);
}

}  // namespace mk::verify
