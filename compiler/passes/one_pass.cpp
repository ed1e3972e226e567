// one_pass: for an LL bucket of a schedule in which every rank sends to and
// receives from the same peers, a kernel that makes one pass over the data:
// each thread loads its units of the input once, stores them as LL packets
// into its peers' scratch, then polls its own scratch for the peers' packets
// and combines them, with no barrier, no flag and no fence in between.
//
// Why that is safe, given the proof of the schedule with its synchronisation
// (insert_sync runs on the one-block schedule, the verifier proves it):
//  - within a rank: every data op of the rank runs in one thread block and
//    addresses the same chunk position, so a given 8-byte unit of a tile is
//    handled by the same thread in every op (templates/kernel.cuh prim_ll).
//    Program order in that thread orders what the block barrier between ops
//    ordered (the in-place write-after-read, reads after local writes).
//  - across ranks, data: LL packets carry their step's flag (no flag wait).
//  - across ranks, scratch reuse (the only other waits the schedule has: a
//    writer waits, depth steps later, for the reader's signal): every launch
//    is exactly one step, so depth >= 2 puts launch k and launch k + 2 in the
//    same scratch copy, launch k + 1 in another. Before a rank W writes a
//    slot that R reads (R's own, pushed; or W's, which R pulls) in launch
//    k + 2, W's kernel k + 1 completed; it read R's packets of launch k + 1
//    (W hears from every rank that reads what it writes), which R's
//    kernel k + 1 wrote only after R's kernel k had completed (stream order,
//    or griddepcontrol.wait at kernel entry), and with it R's reads of launch
//    k. So launch order does what the reuse waits did, and kernels drop them.
//
// Needs: protocol chosen (choose_protocol), analyzed positions. Guarantees
// (mark_one_pass, after insert_sync): one_pass set only when every condition
// holds: LL, depth >= 2, one thread block per rank, one step per launch for
// every size of the bucket, every data op of one chunk at chunk position 0
// (never empty) and of at most 8 sources and destinations, every rank whose
// scratch writes another rank reads (pushed into the reader's scratch, or
// staged in its own and pulled) reads scratch that rank wrote, and every
// wait a reuse wait (iter -depth).
//
// Lamport packets (mark_lamport, per dtype, after mark_one_pass): the scratch
// of a one-pass kernel can hold the data itself, 16 bytes a 16-byte store
// instead of LL's 8, with the readiness in the data: scratch at rest is all
// sentinel (an all-ones 32-bit word: a NaN in every float type of at most 4
// bytes, the dtypes that get Lamport packets; in an fp64 it can be the low
// half of a number such as DBL_MAX; the arena's scratch is filled with it when
// it is created), a writer replaces the sentinel word in what it stores by
// 0x7fffffff (the elements it holds stay NaN, their payload changes: peers
// see that NaN, the rank itself the original), and a reader polls until no
// word of its 16 bytes is the sentinel, then stores the sentinel back. Why that is safe, on top of the
// one-pass argument above:
//  - readiness: a 32-bit word is written whole (the vector store's elements
//    are 32-bit), so a reader that sees no sentinel word sees every byte of
//    this launch's data (the data of launch k - depth was put back to the
//    sentinel by its reader);
//  - the reset: each slot has one reader (one op reads it, once), which is
//    the thread that owns those units in every op; it resets after reading,
//    so by the end of its launch the slot is at rest again. The writer's next
//    write into that copy comes depth >= 2 launches later, after it heard
//    from the reader in the launch between (the one-pass argument), which
//    the reader began only after this launch, resets included, completed;
//  - a slot written by one op and read by another (never the same op, whose
//    own store would then be read back as the peer's).
// Integer dtypes and fp64 keep LL packets: there every 32-bit word can be a value.
#include <fmt/format.h>

#include <map>
#include <set>

#include "compiler/passes/passes.hpp"

namespace mk::passes {

namespace {

constexpr int kMaxOperands = 8;  // codegen unrolls up to this many (no wide ops)
constexpr int kMaxRanks = 8;

int64_t round16(int64_t x) { return (x + 15) / 16 * 16; }

}  // namespace

bool one_pass_possible(const ir::Schedule& s, int64_t max_bytes, std::string* why) {
  auto no = [&](const std::string& w) {
    if (why) *why = w;
    return false;
  };
  if (s.proto != ir::Proto::ll) return no("not LL");
  if (s.zero_copy) return no("zero-copy");
  for (const ir::Op& op : s.ops)
    if (op.kind == ir::OpKind::put) return no("network operations");
  if (s.nranks < 2 || s.nranks > kMaxRanks) return no("rank count outside 2..8");
  if (s.depth < 2) return no("depth below 2");
  if (max_bytes < 0) return no("unbounded bucket");
  // one step per launch for every size: the runtime's tile (pick_tile_bytes)
  // covers a chunk with the instances
  const int64_t chunk = round16((max_bytes + s.chunks - 1) / s.chunks);
  if (round16((chunk + s.instances - 1) / s.instances) > s.tile_bytes) return no("more than one step per launch");
  // Who writes each scratch slot (of whichever rank owns it): pushes write a
  // peer's scratch, staged pulls their own, which the peer then reads.
  std::vector<std::vector<int32_t>> writer(size_t(s.nranks), std::vector<int32_t>(size_t(std::max(s.scratch, 0)), -1));
  auto in_range = [&](const ir::Ref& r) {
    return r.rank >= 0 && r.rank < s.nranks && r.index >= 0 && r.index < s.scratch;
  };
  for (const ir::Op& op : s.ops) {
    if (!op.is_data()) continue;
    for (const ir::Ref& r : op.dsts)
      if (r.buf == ir::Buf::scratch) {
        if (!in_range(r)) return no("bad scratch ref");
        writer[size_t(r.rank)][size_t(r.index)] = op.rank;
      }
  }
  // (writer W, reader X): X reads a slot W writes; W "hears" X when W reads
  // a slot X writes. W may reuse its slots for launch k + 2 only once X is
  // done with launch k: W must hear X in every launch (every op is at chunk
  // position 0, never empty for a count of at least 1).
  std::set<std::pair<int32_t, int32_t>> feeds, hears;
  for (const ir::Op& op : s.ops) {
    if (!op.is_data()) continue;
    if (op.count() != 1 || op.pos.size() != 1) return no("an op of several chunks");
    if (op.pos[0] != 0) return no("an op at chunk position " + std::to_string(op.pos[0]) + " (not 0: it may be empty)");
    if (int(op.srcs.size()) > kMaxOperands || int(op.dsts.size()) > kMaxOperands) return no("a wide op");
    for (const ir::Ref& r : op.srcs) {
      if (r.buf != ir::Buf::scratch) continue;
      if (!in_range(r)) return no("bad scratch ref");
      const int32_t w = writer[size_t(r.rank)][size_t(r.index)];
      if (w < 0 || w == op.rank) continue;
      feeds.insert({w, op.rank});
      hears.insert({op.rank, w});
    }
  }
  for (const auto& [w, x] : feeds)
    if (!hears.count({w, x}))
      return no("rank " + std::to_string(w) + " sends to rank " + std::to_string(x) + " but reads nothing from it");
  return true;
}

ir::Schedule one_block(ir::Schedule s) {
  for (ir::Op& op : s.ops) op.tb = 0;
  s.tbs = 1;
  return s;
}

ir::Schedule mark_one_pass(ir::Schedule s, int64_t max_bytes) {
  s.one_pass = false;
  if (!s.synced || s.tbs != 1 || !one_pass_possible(s, max_bytes, nullptr)) return s;
  for (const ir::Op& op : s.ops)
    if (op.kind == ir::OpKind::wait && op.iter != -s.depth) return s;  // a true dependency: flags stay
  s.one_pass = true;
  return s;
}

bool lamport_possible(const ir::Schedule& s, std::string* why) {
  auto no = [&](const std::string& w) {
    if (why) *why = w;
    return false;
  };
  if (!s.one_pass) return no("not a one-pass schedule");
  // Per scratch cell (rank, slot): the op that writes it, the op that reads
  // it and how often.
  struct Use {
    int64_t writer = -1, reader = -1;
    int reads = 0;
  };
  std::map<std::pair<int32_t, int32_t>, Use> cells;
  auto cell = [&](const ir::Ref& r) -> Use* {
    if (r.buf != ir::Buf::scratch) return nullptr;
    return &cells[{r.rank, r.index}];
  };
  for (size_t i = 0; i < s.ops.size(); ++i) {
    const ir::Op& op = s.ops[i];
    if (!op.is_data()) continue;
    for (const ir::Ref& r : op.srcs)
      if (r.count != 1) return no("an op of several chunks");
    for (const ir::Ref& r : op.dsts)
      if (r.count != 1) return no("an op of several chunks");
    for (const ir::Ref& r : op.dsts)
      if (Use* u = cell(r)) {
        if (u->writer >= 0 && u->writer != int64_t(i))
          return no(fmt::format("scratch slot {} of rank {} is written by two ops", r.index, r.rank));
        u->writer = int64_t(i);
      }
    for (const ir::Ref& r : op.srcs)
      if (Use* u = cell(r)) {
        if (u->reader >= 0 && u->reader != int64_t(i))
          return no(fmt::format("scratch slot {} of rank {} is read by two ops (only one can put the sentinel back)",
                                r.index, r.rank));
        u->reader = int64_t(i);
        ++u->reads;
      }
  }
  for (const auto& [at, u] : cells) {
    if (u.reads > 1)
      return no(fmt::format("scratch slot {} of rank {} is read twice by one op", at.second, at.first));
    if (u.reader < 0 || u.writer < 0)
      return no(fmt::format("scratch slot {} of rank {} is {}", at.second, at.first,
                            u.reader < 0 ? "written but never read (it would never go back to rest)"
                                         : "read but never written"));
    if (u.reader == u.writer)
      return no(fmt::format("scratch slot {} of rank {} is read and written by one op", at.second, at.first));
  }
  return true;
}

bool lamport_dtype(DType t) { return dtype_is_float(t) && dtype_size(t) <= 4; }

ir::Schedule mark_lamport(ir::Schedule s, DType dtype, bool on) {
  s.lamport = on && lamport_dtype(dtype) && lamport_possible(s, nullptr);
  return s;
}

}  // namespace mk::passes
