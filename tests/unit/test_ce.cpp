// The copy-engine protocol (runtime/ce.hpp) run in a model of its streams:
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

#include "runtime/ce.hpp"

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

// Runs `calls` in order on `n` ranks. mode 0: random interleaving of all
// streams; mode 1: each rank's ops as one sequence (the fake driver).
// Returns an error message, or "" on success.
// strip_waits: drop the send side's waits (a broken protocol, for the test
// that the checks can fail).
std::string run(int32_t n, int64_t tile, const std::vector<Call>& calls, int mode, uint64_t seed,
                bool strip_waits = false) {
  std::mt19937_64 rng(seed);
  std::vector<RankState> R{size_t(n)};
  for (auto& r : R) {
    r.scratch.assign(size_t(ce::scratch_bytes(n, tile)), 0);
    r.shipped.assign(size_t(n), 0);
    r.taken.assign(size_t(n), 0);
    r.ready.assign(size_t(n), 0);
    r.consumed.assign(size_t(n), 0);
  }
  for (size_t ci = 0; ci < calls.size(); ++ci) {
    const Call& c = calls[ci];
    const int64_t B = c.bytes;
    const int64_t in_blocks = c.coll == Collective::alltoall || c.coll == Collective::reducescatter ? n : 1;
    const int64_t out_blocks =
        c.coll == Collective::allgather || c.coll == Collective::alltoall ? n : 1;
    // In-place reductions: the output is the input (all-reduce) or its block
    // `rank` (reduce-scatter).
    const bool alias = c.in_place && reduces(c.coll);
    std::vector<std::vector<ce::Op>> prog{size_t(n)};
    for (int32_t r = 0; r < n; ++r) {
      auto& st = R[size_t(r)];
      st.in.resize(size_t(in_blocks * B));
      for (int64_t i = 0; i < in_blocks * B; ++i) st.in[size_t(i)] = value(int(ci), r, i);
      st.out.assign(size_t(out_blocks * B), 0xEE);
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
          std::copy(st.in.begin(), st.in.end(), st.out.begin() + int64_t(r) * B);
        else if (c.coll == Collective::broadcast && r == c.root)
          st.out = st.in;
      }
      prog[size_t(r)] = ce::program(s);
      if (strip_waits)
        for (auto& o : prog[size_t(r)])
          if (o.kind == ce::Op::sync && o.stream == 0) o.wait = false;
    }
    // Per rank and stream: the index of the next op; started: a sync whose
    // bumps were done.
    std::vector<std::array<size_t, 2>> pos(size_t(n), {0, 0});
    std::vector<std::array<bool, 2>> started(size_t(n), {false, false});
    std::vector<size_t> seq_pos(size_t(n), 0);
    auto next_of = [&](int32_t r, int s) -> const ce::Op* {
      auto& p = prog[size_t(r)];
      size_t& i = pos[size_t(r)][size_t(s)];
      while (i < p.size() && p[i].stream != s) ++i;
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
    auto peers_of = [&](const ce::Op& o, int32_t r) {
      std::vector<int32_t> v = ce::peers(c.coll, n, r, c.root, o.stream);
      if (o.only >= 0) v.erase(std::remove_if(v.begin(), v.end(), [&](int32_t p) { return p != o.only; }), v.end());
      return v;
    };
    std::string err;
    // Tries to run one op; true if it ran (or a sync made progress).
    auto step = [&](int32_t r, int s) -> bool {
      const ce::Op* o = next_of(r, s);
      if (!o) return false;
      auto& st = R[size_t(r)];
      if (s == 1 && blocked_by_join(r, size_t(o - prog[size_t(r)].data()))) return false;
      if (o->kind == ce::Op::join) {
        next_of(r, 1);
        if (pos[size_t(r)][1] < size_t(o - prog[size_t(r)].data())) return false;
        ++pos[size_t(r)][size_t(s)];
        return true;
      }
      auto slot_of = [&](int32_t q, int32_t slot) -> Slot& { return st.slots[{q, slot}]; };
      if (o->kind == ce::Op::reduce) {
        auto at = [&](const ce::Loc& l) -> uint8_t* {
          if (l.space == ce::Loc::input) return st.in.data() + l.offset;
          return alias ? st.in.data() + l.offset + (c.coll == Collective::reducescatter ? int64_t(r) * B : 0)
                       : st.out.data() + l.offset;
        };
        const std::vector<int32_t> from = ce::peers(c.coll, n, r, c.root, 1);
        for (int32_t q : from) {
          Slot& sl = slot_of(q, o->slot);
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
          if (l.space == ce::Loc::input) return st.in.data() + l.offset;
          if (l.space == ce::Loc::output && alias) return st.in.data() + l.offset;
          if (l.space == ce::Loc::output) return st.out.data() + l.offset;
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
      const auto ps = peers_of(*o, r);
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
    for (;;) {
      if (!err.empty()) return err;
      bool all_done = true, moved = false;
      if (mode == 0) {
        std::vector<std::pair<int32_t, int>> order;
        for (int32_t r = 0; r < n; ++r)
          for (int s = 0; s < 2; ++s)
            if (next_of(r, s)) order.push_back({r, s});
        if (order.empty()) break;
        all_done = false;
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
        all_done = false;
        std::shuffle(order.begin(), order.end(), rng);
        for (int32_t r : order) {
          const ce::Op& o = prog[size_t(r)][seq_pos[size_t(r)]];
          // The op is the next of its stream: run it there.
          if (next_of(r, o.stream) != &o) return "issue order differs from stream order";
          if (step(r, o.stream)) {
            ++seq_pos[size_t(r)];
            moved = true;
            break;
          }
        }
      }
      if (all_done) break;
      if (!moved) return "deadlock in call " + std::to_string(ci);
    }
    // The collective's definition.
    for (int32_t r = 0; r < n; ++r) {
      if (reduces(c.coll)) {
        const int64_t base = c.coll == Collective::reducescatter ? int64_t(r) * B : 0;
        const uint8_t* res = alias ? R[size_t(r)].in.data() + base : R[size_t(r)].out.data();
        for (int64_t i = 0; i < B; ++i) {
          unsigned want = 0;
          for (int32_t q = 0; q < n; ++q) want += value(int(ci), q, base + i);
          if (res[i] != uint8_t(want))
            return "call " + std::to_string(ci) + " rank " + std::to_string(r) + " byte " + std::to_string(i) + ": " +
                   std::to_string(res[i]) + " != " + std::to_string(uint8_t(want));
        }
        continue;
      }
      for (int64_t b = 0; b < out_blocks; ++b)
        for (int64_t i = 0; i < B; ++i) {
          int32_t src_rank = c.coll == Collective::broadcast ? c.root : int32_t(b);
          int64_t src_index = (c.coll == Collective::alltoall ? int64_t(r) * B : 0) + i;
          const uint8_t want = value(int(ci), src_rank, src_index);
          const uint8_t have = R[size_t(r)].out[size_t(b * B + i)];
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
        for (int mode : {0, 1}) {
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
    for (int mode : {0, 1}) {
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
