// stage_remote: route every access to another rank's *user* buffer through
// scratch, so that only a buffer's owner ever touches it.
//
// Why: the runtime maps each rank's scratch into its peers once, at
// communicator creation; user buffers change every call and are not mapped.
// It also means a rank's buffers are never touched after its kernel returns.
//
//   remote source      op on E reads r.in[i]   ->  r: copy r.in[i] -> r.sc[new]
//                                                   E: op reads r.sc[new]
//   remote destination op on E writes r.out[i] ->  E: op writes r.sc[new]
//                                                   r: copy r.sc[new] -> r.out[i]
//
// Placement: a staging read sits right before the op it serves. A staging
// write (scratch -> user buffer) is deferred to just before the first later
// op that touches that user chunk (or the end): nothing in between can see
// the difference, and a rank's own sends are not queued behind its receives
// (a ring's "receive, store, forward" then fuses into one op).
//
// Needs: a verified schedule. Guarantees: same meaning; every data op touches
// user buffers of its executing rank only; each staging slot is new (no
// reuse, so staging adds no ordering between unrelated transfers).
#include <algorithm>

#include "compiler/passes/passes.hpp"

namespace mk::passes {

using ir::Buf;
using ir::Op;
using ir::OpKind;
using ir::Ref;

namespace {

// Dense index of a user-buffer chunk (rank-major: input, then output). A
// deferred staging write waits on the output chunk it fills; an op touches it
// through that chunk or, in either aliasing mode, the input chunk aliasing it.
struct UserChunks {
  const ir::Schedule& s;
  int32_t cin = ir::buf_chunks(s, Buf::input), cout = ir::buf_chunks(s, Buf::output);
  size_t size() const { return size_t(int64_t(cin + cout) * s.nranks); }
  size_t key(int32_t rank, Buf b, int32_t index) const {
    return size_t(int64_t(rank) * (cin + cout) + (b == Buf::input ? 0 : cin) + index);
  }
  // Keys an op touches: its user chunks, and the output chunks its input chunks alias.
  void touched(const Op& op, std::vector<size_t>& out) const {
    out.clear();
    for (const auto* list : {&op.srcs, &op.dsts})
      for (const Ref& r : *list) {
        if (r.buf == Buf::scratch) continue;
        for (int32_t k = 0; k < r.count; ++k) {
          out.push_back(key(r.rank, r.buf, r.index + k));
          if (r.buf == Buf::input)
            if (auto o = ir::inplace_output_of_input(s, r.rank, r.index + k)) out.push_back(key(r.rank, Buf::output, *o));
        }
      }
  }
};

}  // namespace

ir::Schedule stage_remote(ir::Schedule s) {
  std::vector<Op> out;
  out.reserve(s.ops.size() * 2);
  int32_t next_id = s.next_id();
  // Slots are numbered per rank, in that rank's order of need, so symmetric
  // schedules stay symmetric (codegen shares one code path across ranks).
  std::vector<int32_t> next_slot(s.nranks, s.scratch);
  // Deferred staging writes, in the order they were deferred, and by the
  // output chunks they fill (what flushes them).
  const UserChunks uc{s};
  std::vector<Op> pending;
  std::vector<bool> flushed;
  std::vector<std::vector<size_t>> waiting(uc.size());  // chunk -> pending entries filling it
  std::vector<size_t> keys, hits;
  auto defer = [&](Op&& c) {
    const Ref& d = c.dsts[0];
    for (int32_t k = 0; k < d.count; ++k) waiting[uc.key(d.rank, d.buf, d.index + k)].push_back(pending.size());
    pending.push_back(std::move(c));
    flushed.push_back(false);
  };
  auto flush_for = [&](const Op& op) {
    uc.touched(op, keys);
    hits.clear();
    for (size_t key : keys) {
      for (size_t i : waiting[key])
        if (!flushed[i]) hits.push_back(i);
      waiting[key].clear();
    }
    std::sort(hits.begin(), hits.end());
    hits.erase(std::unique(hits.begin(), hits.end()), hits.end());
    for (size_t i : hits) {
      flushed[i] = true;
      out.push_back(std::move(pending[i]));
    }
  };
  for (Op& op : s.ops) {
    flush_for(op);
    if (!op.is_data()) {
      out.push_back(std::move(op));
      continue;
    }
    // A new scratch slot on the buffer's owner, and the owner's copy between
    // it and the user buffer.
    auto stage = [&](Ref& r, bool into_scratch) {
      Ref slot{r.rank, Buf::scratch, next_slot[r.rank], r.count};
      next_slot[r.rank] += r.count;
      Op c;
      c.id = next_id++;
      c.kind = OpKind::copy;
      c.rank = r.rank;
      c.srcs = {into_scratch ? r : slot};
      c.dsts = {into_scratch ? slot : r};
      c.loc = op.loc;
      r = slot;
      return c;
    };
    std::vector<Op> after;
    for (Ref& r : op.srcs)
      if (r.buf != Buf::scratch && r.rank != op.rank) out.push_back(stage(r, true));
    for (Ref& r : op.dsts)
      if (r.buf != Buf::scratch && r.rank != op.rank) after.push_back(stage(r, false));
    out.push_back(std::move(op));
    for (auto& a : after) defer(std::move(a));
  }
  for (size_t i = 0; i < pending.size(); ++i)
    if (!flushed[i]) out.push_back(std::move(pending[i]));
  s.ops = std::move(out);
  s.author_scratch = s.scratch;
  for (int32_t n : next_slot) s.scratch = std::max(s.scratch, n);
  s.staged = true;
  return s;
}

}  // namespace mk::passes
