// The copy-engine protocol (runtime/launch/ce.hpp) run in a model of its streams:
// every rank's two streams execute their ops in order, a scheduler picks
// which runnable stream moves next (at random, or each rank's ops as one
// sequence as the fake driver runs them), copies move real bytes, and a sync
// bumps and writes counters and blocks until its waits hold, as
// templates/copy_engine.cuh does. Checked: every output equals the
// collective's definition; no copy overwrites a scratch slot its consumer
// has not copied out, and no copy reads a slot before its tile arrived; no
// state deadlocks; sequences of calls of different sizes, collectives and
// roots on one set of counters stay correct.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "runtime/launch/ce.hpp"

using namespace mk;
using namespace mk::rt;

namespace {

struct Slot {
  bool full = false;
  int64_t tile_tag = -1;  // which (call, tile) it holds
};

struct RankState {
  std::vector<uint8_t> in, out, scratch;
  std::vector<int64_t> shipped, taken, ready, consumed;  // per peer
  std::map<std::pair<int32_t, int32_t>, Slot> slots;    // (from, slot)
};

struct Call {
  Collective coll;
  int32_t root;
  int64_t bytes;
  bool in_place;
  int32_t elem = 1;  // all-reduce's chunks are whole elements
};

bool reduces(Collective c) { return c == Collective::reducescatter || c == Collective::allreduce; }

uint8_t value(int call, int rank, int64_t i) { return uint8_t((call * 131 + rank * 37 + i * 7 + (i >> 8)) & 0xff); }

// Runs `calls` on `n` ranks, each rank's calls one after the other as its
// streams allow (so calls of different ranks overlap, as on a GPU).
// mode 0: random interleaving of every rank's two streams; mode 1: each
// rank's ops as one sequence in issue order, ranks interleaved at random (the
// fake driver, one process a rank); mode 2: lockstep, one thread issuing
// every rank's calls step by step in turn as mkGroupEnd does, each op run as
// it is issued (the fake driver, one process for all ranks): an op that
// cannot run then is a deadlock.
// strip_waits: drop the send side's waits (a broken protocol, for the test
// that the checks can fail); skip_phase_wait: drop the wait that opens every
// phase (the same).
// Returns an error message, or "" on success.
std::string run(int32_t n, int64_t tile, const std::vector<Call>& calls, int mode, uint64_t seed,
                bool strip_waits = false, bool skip_phase_wait = false) {
  std::mt19937_64 rng(seed);
  std::vector<RankState> R{size_t(n)};
  for (auto& r : R) {
    r.scratch.assign(size_t(ce::scratch_bytes(n, tile)), 0);
    r.shipped.assign(size_t(n), 0);
    r.taken.assign(size_t(n), 0);
    r.ready.assign(size_t(n), 0);
    r.consumed.assign(size_t(n), 0);
  }
  const size_t ncalls = calls.size();
  // Buffers [call][rank]; programs [rank] (all calls, in order) with each
  // op's call; steps [rank][call].
  std::vector<std::vector<std::vector<uint8_t>>> IN(ncalls, std::vector<std::vector<uint8_t>>(size_t(n)));
  auto OUT = IN;
  std::vector<std::vector<ce::Op>> prog{size_t(n)};
  std::vector<std::vector<size_t>> call_of{size_t(n)};
  std::vector<std::vector<int32_t>> steps(size_t(n), std::vector<int32_t>(ncalls, 0));
  auto in_blocks = [&](const Call& c) { return c.coll == Collective::alltoall || c.coll == Collective::reducescatter ? n : 1; };
  auto out_blocks = [&](const Call& c) { return c.coll == Collective::allgather || c.coll == Collective::alltoall ? n : 1; };
  auto alias = [&](const Call& c) { return c.in_place && reduces(c.coll); };
  for (size_t ci = 0; ci < ncalls; ++ci) {
    const Call& c = calls[ci];
    const int64_t B = c.bytes;
    for (int32_t r = 0; r < n; ++r) {
      auto& in = IN[ci][size_t(r)];
      auto& out = OUT[ci][size_t(r)];
      in.resize(size_t(in_blocks(c) * B));
      for (int64_t i = 0; i < in_blocks(c) * B; ++i) in[size_t(i)] = value(int(ci), r, i);
      out.assign(size_t(out_blocks(c) * B), 0xEE);
      ce::Shape s;
      s.coll = c.coll;
      s.nranks = n;
      s.rank = r;
      s.root = c.root;
      s.bytes = B;
      s.tile = tile;
      s.elem = c.elem;
      s.in_place = c.in_place && !reduces(c.coll);  // as the runtime sets it
      if (c.in_place) {  // the input lives in the output already
        if (c.coll == Collective::allgather)
          std::copy(in.begin(), in.end(), out.begin() + int64_t(r) * B);
        else if (c.coll == Collective::broadcast && r == c.root)
          out = in;
      }
      std::vector<ce::Op> p = ce::program(s, &steps[size_t(r)][ci]);
      bool first_wait = true;
      for (auto& o : p) {
        if (strip_waits && o.kind == ce::Op::sync && o.stream == 0) o.wait = false;
        if (skip_phase_wait && o.kind == ce::Op::sync && o.stream == 0 && o.wait && o.delta == 0 && first_wait) {
          o.wait = false;
          first_wait = false;
        }
        prog[size_t(r)].push_back(o);
        call_of[size_t(r)].push_back(ci);
      }
    }
  }
  // Per rank and stream: the index of the next op; started: a sync whose
  // bumps were done.
  std::vector<std::array<size_t, 2>> pos(size_t(n), {0, 0});
  std::vector<std::array<bool, 2>> started(size_t(n), {false, false});
  auto next_of = [&](int32_t r, int s) -> const ce::Op* {
    auto& p = prog[size_t(r)];
    size_t& i = pos[size_t(r)][size_t(s)];
    while (i < p.size() && !(p[i].stream == s && (s == 0 || p[i].kind != ce::Op::join))) ++i;
    return i < p.size() ? &p[i] : nullptr;
  };
  // Stream 1 may not pass a join stream 0 has not run; a join runs once
  // stream 1 has run everything before it.
  auto blocked_by_join = [&](int32_t r, size_t i) {
    auto& p = prog[size_t(r)];
    for (size_t j = 0; j < i; ++j)
      if (p[j].kind == ce::Op::join && pos[size_t(r)][0] <= j) return true;
    return false;
  };
  std::string err;
  // Tries to run rank r's next op of stream s; true if it ran.
  auto step = [&](int32_t r, int s) -> bool {
    const ce::Op* o = next_of(r, s);
    if (!o) return false;
    const size_t idx = size_t(o - prog[size_t(r)].data());
    const size_t ci = call_of[size_t(r)][idx];
    const Call& c = calls[ci];
    const int64_t B = c.bytes;
    auto& st = R[size_t(r)];
    auto& in = IN[ci][size_t(r)];
    auto& out = OUT[ci][size_t(r)];
    if (s == 1 && blocked_by_join(r, idx)) return false;
    if (o->kind == ce::Op::join) {
      next_of(r, 1);
      if (pos[size_t(r)][1] < idx) return false;
      ++pos[size_t(r)][size_t(s)];
      return true;
    }
    auto at = [&](const ce::Loc& l) -> uint8_t* {
      if (l.space == ce::Loc::input) return in.data() + l.offset;
      if (alias(c)) return in.data() + l.offset + (c.coll == Collective::reducescatter ? int64_t(r) * B : 0);
      return out.data() + l.offset;
    };
    if (o->kind == ce::Op::reduce) {
      for (int32_t q : ce::peers(c.coll, n, r, c.root, 1)) {
        Slot& sl = st.slots[{q, o->slot}];
        if (!sl.full) err = "rank " + std::to_string(r) + " reduced an empty slot";
        sl.full = false;
      }
      uint8_t* dst = at(o->dst);
      const uint8_t* own = at(o->src);
      for (int64_t i = 0; i < o->bytes; ++i) {
        unsigned acc = 0;
        for (int32_t q = 0; q < n; ++q)
          acc += q == r ? own[i] : st.scratch[size_t(ce::slot_offset(q, o->slot, tile) + i)];
        dst[i] = uint8_t(acc);
      }
      ++pos[size_t(r)][size_t(s)];
      return true;
    }
    if (o->kind == ce::Op::copy) {
      auto buf = [&](const ce::Loc& l, bool write) -> uint8_t* {
        if (l.space != ce::Loc::scratch) return at(l);
        auto& owner = R[size_t(l.rank)];
        const int32_t from = int32_t(l.offset / (tile * ce::kSlots));
        const int32_t slot = int32_t((l.offset / tile) % ce::kSlots);
        Slot& sl = owner.slots[{from, slot}];
        if (write) {
          if (sl.full)
            err = "rank " + std::to_string(r) + " overwrote an unconsumed slot of rank " + std::to_string(l.rank);
          sl.full = true;
        } else {
          if (!sl.full) err = "rank " + std::to_string(r) + " read an empty slot";
          sl.full = false;
        }
        return owner.scratch.data() + l.offset;
      };
      uint8_t* src = buf(o->src, false);
      uint8_t* dst = buf(o->dst, true);
      std::memmove(dst, src, size_t(o->bytes));
      ++pos[size_t(r)][size_t(s)];
      return true;
    }
    // A sync: bumps once, then runs when every wait holds.
    std::vector<int32_t> ps = ce::peers(c.coll, n, r, c.root, o->stream);
    if (o->only >= 0) ps.erase(std::remove_if(ps.begin(), ps.end(), [&](int32_t p) { return p != o->only; }), ps.end());
    if (!started[size_t(r)][size_t(s)]) {
      started[size_t(r)][size_t(s)] = true;
      if (o->bump)
        for (int32_t p : ps) {
          if (s == 0) R[size_t(p)].ready[size_t(r)] = ++st.shipped[size_t(p)];
          else R[size_t(p)].consumed[size_t(r)] = ++st.taken[size_t(p)];
        }
    }
    if (o->wait)
      for (int32_t p : ps) {
        const int64_t target = (s == 0 ? st.shipped[size_t(p)] : st.taken[size_t(p)]) + o->delta;
        const int64_t have = s == 0 ? st.consumed[size_t(p)] : st.ready[size_t(p)];
        if (target > 0 && have < target) return false;
      }
    started[size_t(r)][size_t(s)] = false;
    ++pos[size_t(r)][size_t(s)];
    return true;
  };
  if (mode == 2) {
    // Round robin: per round, each rank issues (and runs) the ops of its
    // current call's current step; a call's last step moves the rank to its
    // next call.
    std::vector<size_t> call_at(size_t(n), 0), idx(size_t(n), 0);
    std::vector<int32_t> step_at(size_t(n), 0);
    for (bool busy = true; busy;) {
      busy = false;
      for (int32_t r = 0; r < n; ++r) {
        if (call_at[size_t(r)] == ncalls) continue;
        busy = true;
        auto& p = prog[size_t(r)];
        while (idx[size_t(r)] < p.size() && call_of[size_t(r)][idx[size_t(r)]] == call_at[size_t(r)] &&
               p[idx[size_t(r)]].step == step_at[size_t(r)]) {
          const ce::Op& o = p[idx[size_t(r)]];
          if (next_of(r, o.stream == 0 || o.kind == ce::Op::join ? 0 : 1) != &o) return "issue order differs from stream order";
          if (!step(r, o.kind == ce::Op::join ? 0 : o.stream))
            return "lockstep: rank " + std::to_string(r) + " call " + std::to_string(call_at[size_t(r)]) + " step " +
                   std::to_string(step_at[size_t(r)]) + " waits for work not issued yet";
          if (!err.empty()) return err;
          ++idx[size_t(r)];
        }
        if (++step_at[size_t(r)] >= steps[size_t(r)][call_at[size_t(r)]]) {
          step_at[size_t(r)] = 0;
          ++call_at[size_t(r)];
        }
      }
    }
  } else {
    std::vector<size_t> seq_pos(size_t(n), 0);
    for (;;) {
      if (!err.empty()) return err;
      bool moved = false;
      if (mode == 0) {
        std::vector<std::pair<int32_t, int>> order;
        for (int32_t r = 0; r < n; ++r)
          for (int s = 0; s < 2; ++s)
            if (next_of(r, s)) order.push_back({r, s});
        if (order.empty()) break;
        std::shuffle(order.begin(), order.end(), rng);
        for (auto [r, s] : order)
          if (step(r, s)) {
            moved = true;
            break;
          }
      } else {
        // Each rank: its ops in issue order; ranks interleave at random.
        std::vector<int32_t> order;
        for (int32_t r = 0; r < n; ++r)
          if (seq_pos[size_t(r)] < prog[size_t(r)].size()) order.push_back(r);
        if (order.empty()) break;
        std::shuffle(order.begin(), order.end(), rng);
        for (int32_t r : order) {
          const ce::Op& o = prog[size_t(r)][seq_pos[size_t(r)]];
          const int s = o.kind == ce::Op::join ? 0 : o.stream;
          if (next_of(r, s) != &o) return "issue order differs from stream order";
          if (step(r, s)) {
            ++seq_pos[size_t(r)];
            moved = true;
            break;
          }
        }
      }
      if (!moved) return "deadlock";
    }
  }
  if (!err.empty()) return err;
  // Every call's result against the collective's definition.
  for (size_t ci = 0; ci < ncalls; ++ci) {
    const Call& c = calls[ci];
    const int64_t B = c.bytes;
    for (int32_t r = 0; r < n; ++r) {
      const auto& in = IN[ci][size_t(r)];
      const auto& out = OUT[ci][size_t(r)];
      if (reduces(c.coll)) {
        const int64_t base = c.coll == Collective::reducescatter ? int64_t(r) * B : 0;
        const uint8_t* res = alias(c) ? in.data() + base : out.data();
        for (int64_t i = 0; i < B; ++i) {
          unsigned want = 0;
          for (int32_t q = 0; q < n; ++q) want += value(int(ci), q, base + i);
          if (res[i] != uint8_t(want))
            return "call " + std::to_string(ci) + " rank " + std::to_string(r) + " byte " + std::to_string(i) + ": " +
                   std::to_string(res[i]) + " != " + std::to_string(uint8_t(want));
        }
        continue;
      }
      for (int64_t b = 0; b < out_blocks(c); ++b)
        for (int64_t i = 0; i < B; ++i) {
          const int32_t src_rank = c.coll == Collective::broadcast ? c.root : int32_t(b);
          const int64_t src_index = (c.coll == Collective::alltoall ? int64_t(r) * B : 0) + i;
          const uint8_t want = value(int(ci), src_rank, src_index);
          const uint8_t have = out[size_t(b * B + i)];
          if (have != want)
            return "call " + std::to_string(ci) + " rank " + std::to_string(r) + " block " + std::to_string(b) +
                   " byte " + std::to_string(i) + ": " + std::to_string(have) + " != " + std::to_string(want);
        }
    }
  }
  return "";
}

}  // namespace

TEST_CASE("copy engine: every collective, rank count and tile boundary, random interleavings") {
  for (int32_t n : {1, 2, 3, 4, 5}) {
    for (Collective coll : {Collective::allgather, Collective::alltoall, Collective::broadcast,
                            Collective::reducescatter, Collective::allreduce}) {
      for (int64_t bytes : {int64_t(1), int64_t(63), int64_t(64), int64_t(65), int64_t(64 * 3), int64_t(64 * 7 + 5),
                            int64_t(64 * 11)}) {
        for (int mode : {0, 1, 2}) {
          for (uint64_t seed = 0; seed < 3; ++seed) {
            const int32_t root = coll == Collective::broadcast ? int32_t(seed % uint64_t(n)) : 0;
            const bool in_place = coll != Collective::alltoall && seed == 1;
            const std::string e = run(n, 64, {{coll, root, bytes, in_place}}, mode, seed * 7919 + uint64_t(bytes));
            INFO("n=" << n << " coll=" << name(coll) << " bytes=" << bytes << " mode=" << mode << " seed=" << seed);
            CHECK(e == "");
          }
        }
      }
    }
  }
}

TEST_CASE("copy engine: calls of mixed sizes, collectives and roots share counters and slots") {
  for (int32_t n : {2, 3, 4}) {
    for (int mode : {0, 1, 2}) {
      for (uint64_t seed = 0; seed < 20; ++seed) {
        std::mt19937_64 g(seed);
        std::vector<Call> calls;
        for (int k = 0; k < 8; ++k) {
          const Collective coll = std::array{Collective::allgather, Collective::alltoall, Collective::broadcast,
                                             Collective::reducescatter, Collective::allreduce}[g() % 5];
          const int32_t elem = coll == Collective::allreduce ? int32_t(1) << (g() % 4) : 1;
          const int64_t bytes = int64_t(1 + g() % 600) * elem;
          calls.push_back({coll, int32_t(g() % uint64_t(n)), bytes, (g() % 2) == 0 && coll != Collective::alltoall, elem});
        }
        INFO("n=" << n << " mode=" << mode << " seed=" << seed);
        CHECK(run(n, 64, calls, mode, seed) == "");
      }
    }
  }
}

TEST_CASE("copy engine: the checks catch a broken protocol") {
  // Without the send side's waits a sender runs ahead of its consumer and
  // overwrites slots not yet copied out: the model must say so for some
  // interleaving (so the cases above can fail).
  int caught = 0;
  for (uint64_t seed = 0; seed < 40; ++seed)
    caught += run(2, 16, {{Collective::allgather, 0, 16 * 40, false}}, 0, seed, true) != "";
  CHECK(caught > 0);
  // The intact protocol passes the same interleavings.
  for (uint64_t seed = 0; seed < 40; ++seed) CHECK(run(2, 16, {{Collective::allgather, 0, 16 * 40, false}}, 0, seed) == "");
  // Without the wait that opens every phase, a call's first tiles overwrite
  // slots whose last use, in the previous call, was not consumed yet: calls
  // overlap across ranks in the model, so it must see that too.
  const std::vector<Call> three = {{Collective::allgather, 0, 16 * 5, false},
                                   {Collective::allgather, 0, 16 * 2, false},
                                   {Collective::alltoall, 0, 16 * 4, false}};
  int caught2 = 0;
  for (uint64_t seed = 0; seed < 200; ++seed) caught2 += run(2, 16, three, 0, seed, false, true) != "";
  CHECK(caught2 > 0);
  for (uint64_t seed = 0; seed < 200; ++seed) CHECK(run(2, 16, three, 0, seed) == "");
}

TEST_CASE("copy engine: the default tile fills 64 MiB of scratch, whole MiB, 1 to 16 MiB") {
  const int64_t mib = int64_t(1) << 20;
  CHECK(ce::default_tile(1) == 16 * mib);
  CHECK(ce::default_tile(2) == 10 * mib);  // 64 / 6 = 10.7
  CHECK(ce::default_tile(4) == 5 * mib);
  CHECK(ce::default_tile(8) == 2 * mib);
  CHECK(ce::default_tile(64) == mib);
  for (int32_t n = 1; n <= 64; ++n) CHECK(ce::scratch_bytes(n, ce::default_tile(n)) <= std::max<int64_t>(64 * mib, n * ce::kSlots * mib));
}
