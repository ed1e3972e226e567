// include/mk/collectives.def and the helpers generated from it (mk/types.hpp):
// every row against expectations written here from NCCL's definitions of the
// collectives, and the consumers (the IR, the reference, mkc) against the table.
#include <doctest/doctest.h>

#include <regex>

#include "compiler/ir/ir.hpp"
#include "compiler/verify/reference.hpp"
#include "mk/dsl.hpp"
#include "mk/types.hpp"
#include "support.hpp"

using namespace mk;

namespace {

// What NCCL's documentation says about each collective, written independently
// of the table: per-rank blocks of `count` elements as "1" or "n" (nranks).
struct Want {
  Collective c;
  int value;  // numeric value: plan kernels' call signatures carry it
  const char* name;
  const char* api;
  bool reduces;
  RootBuffer root_only;
  bool in_n, out_n;  // input / output holds nranks blocks
  InPlace inplace;
};

const Want kWant[] = {
    {Collective::allreduce, 0, "allreduce", "mkAllReduce", true, RootBuffer::none, false, false, InPlace::same},
    {Collective::allgather, 1, "allgather", "mkAllGather", false, RootBuffer::none, false, true,
     InPlace::input_in_output},
    {Collective::reducescatter, 2, "reducescatter", "mkReduceScatter", true, RootBuffer::none, true, false,
     InPlace::output_in_input},
    {Collective::broadcast, 3, "broadcast", "mkBroadcast", false, RootBuffer::input, false, false, InPlace::same},
    {Collective::reduce, 4, "reduce", "mkReduce", true, RootBuffer::output, false, false, InPlace::same},
    {Collective::alltoall, 5, "alltoall", "mkAllToAll", false, RootBuffer::none, true, true, InPlace::unsupported},
};

const int kRankCounts[] = {1, 2, 3, 8};

const Want& want(Collective c) {
  for (const Want& w : kWant)
    if (w.c == c) return w;
  FAIL("no expectation for collective " << int(c));
  return kWant[0];
}

int want_in(Collective c, int n) { return want(c).in_n ? n : 1; }
int want_out(Collective c, int n) { return want(c).out_n ? n : 1; }

// The chunk of a schedule's output that in-place aliases input chunk `index`
// of `rank`, from the in-place definitions of NCCL's API.
std::optional<int32_t> want_alias(Collective c, int32_t root, int32_t K, int32_t rank, int32_t index) {
  switch (c) {
    case Collective::allreduce: return index;
    case Collective::allgather: return rank * K + index;  // sendbuff == recvbuff + rank*count
    case Collective::reducescatter:                       // recvbuff == sendbuff + rank*count
      if (index / K == rank) return index % K;
      return std::nullopt;
    case Collective::broadcast:
    case Collective::reduce: return rank == root ? std::optional<int32_t>(index) : std::nullopt;
    case Collective::alltoall: return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace

TEST_CASE("collectives.def: every row is the collective NCCL defines") {
  REQUIRE(all_collectives().size() == std::size(kWant));
  REQUIRE(kNumCollectives == int(std::size(kWant)));
  for (Collective c : all_collectives()) {
    const Want& w = want(c);
    CAPTURE(w.name);
    CHECK(int(c) == w.value);
    CHECK(name(c) == w.name);
    CHECK(api_name(c) == w.api);
    CHECK(api_name(c).data()[api_name(c).size()] == '\0');  // usable as a C string
    CHECK(parse_collective(w.name) == c);
    CHECK(parse_collective(w.api + 2) == c);  // "AllReduce": case-insensitive
    CHECK(collective_reduces(c) == w.reduces);
    CHECK(root_buffer(c) == w.root_only);
    CHECK(collective_rooted(c) == (w.root_only != RootBuffer::none));
    CHECK(inplace_rule(c) == w.inplace);
    for (int n : kRankCounts) {
      CAPTURE(n);
      CHECK(input_blocks(c, n) == want_in(c, n));
      CHECK(output_blocks(c, n) == want_out(c, n));
    }
  }
  CHECK(parse_collective("ncclAllGather") == Collective::allgather);
  CHECK(parse_collective("all_to_all") == Collective::alltoall);
  CHECK(parse_collective("alltoallv") == Collective::alltoall);
  CHECK_FALSE(parse_collective("gather").has_value());
}

TEST_CASE("collectives.def: which ranks hold a send and a receive buffer") {
  const int n = 4, root = 2;
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK(has_input(Collective::broadcast, r, root) == (r == root));
    CHECK(has_output(Collective::broadcast, r, root));
    CHECK(has_input(Collective::reduce, r, root));
    CHECK(has_output(Collective::reduce, r, root) == (r == root));
    for (Collective c : {Collective::allreduce, Collective::allgather, Collective::reducescatter, Collective::alltoall}) {
      CHECK(has_input(c, r, root));
      CHECK(has_output(c, r, root));
    }
  }
}

TEST_CASE("collectives.def: output_source is what each collective computes") {
  const int root = 1, rank = 2;
  constexpr int all = BlockSource::kAllRanks;
  auto src = [&](Collective c, int b) {
    BlockSource s = output_source(c, root, rank, b);
    return std::pair<int, int>{s.from, s.in_block};
  };
  using P = std::pair<int, int>;
  CHECK(src(Collective::allreduce, 0) == P(all, 0));
  CHECK(src(Collective::reduce, 0) == P(all, 0));
  CHECK(src(Collective::reducescatter, 0) == P(all, rank));  // every rank's block `rank`
  CHECK(src(Collective::broadcast, 0) == P(root, 0));
  for (int b = 0; b < 4; ++b) {
    CAPTURE(b);
    CHECK(src(Collective::allgather, b) == P(b, 0));      // rank b's whole input
    CHECK(src(Collective::alltoall, b) == P(b, rank));    // rank b's block for me
  }
}

TEST_CASE("collectives.def: in-place calls, by pointers and by chunks") {
  const uintptr_t base = 1 << 20;
  const size_t bb = 400;  // bytes per block
  const int rank = 3;
  // (sendbuff, recvbuff) as NCCL defines in-place, and a near miss
  CHECK(is_inplace_call(Collective::allreduce, base, base, rank, bb));
  CHECK_FALSE(is_inplace_call(Collective::allreduce, base, base + 4, rank, bb));
  CHECK(is_inplace_call(Collective::allgather, base + rank * bb, base, rank, bb));
  CHECK_FALSE(is_inplace_call(Collective::allgather, base, base, rank, bb));
  CHECK(is_inplace_call(Collective::reducescatter, base, base + rank * bb, rank, bb));
  CHECK_FALSE(is_inplace_call(Collective::reducescatter, base + rank * bb, base, rank, bb));
  CHECK(is_inplace_call(Collective::broadcast, base, base, rank, bb));
  CHECK(is_inplace_call(Collective::reduce, base, base, rank, bb));
  // all-to-all has no in-place form; the same pointer is the attempt to reject
  CHECK(is_inplace_call(Collective::alltoall, base, base, rank, bb));
  CHECK_FALSE(is_inplace_call(Collective::alltoall, base + rank * bb, base, rank, bb));
  CHECK(inplace_condition(Collective::allgather).find("rank*count") != std::string_view::npos);
  CHECK(inplace_condition(Collective::reducescatter).find("rank*count") != std::string_view::npos);
  CHECK(inplace_condition(Collective::alltoall).find("not supported") != std::string_view::npos);

  // The IR's chunk aliasing, for every collective, rank count, root and chunk
  for (Collective c : all_collectives())
    for (int n : kRankCounts) {
      ir::Schedule s;
      s.coll = c;
      s.nranks = n;
      s.chunks = 2;
      s.root = n - 1;
      CAPTURE(name(c));
      CAPTURE(n);
      for (int32_t r = 0; r < n; ++r)
        for (int32_t i = 0; i < ir::buf_chunks(s, ir::Buf::input); ++i) {
          CAPTURE(r);
          CAPTURE(i);
          CHECK(ir::inplace_output_of_input(s, r, i) == want_alias(c, s.root, s.chunks, r, i));
        }
    }
}

TEST_CASE("collectives.def: the IR and the reference size buffers by the table") {
  for (Collective c : all_collectives())
    for (int n : kRankCounts) {
      CAPTURE(name(c));
      CAPTURE(n);
      CHECK(ir::buf_blocks(c, n, ir::Buf::input) == want_in(c, n));
      CHECK(ir::buf_blocks(c, n, ir::Buf::output) == want_out(c, n));
      ir::Schedule s;
      s.coll = c;
      s.nranks = n;
      s.chunks = 3;
      CHECK(ir::buf_chunks(s, ir::Buf::input) == 3 * want_in(c, n));
      CHECK(ir::buf_chunks(s, ir::Buf::output) == 3 * want_out(c, n));
      for (int64_t count : {int64_t(0), int64_t(1), int64_t(1000)}) {
        CHECK(verify::input_elems(c, n, count) == count * want_in(c, n));
        CHECK(verify::output_elems(c, n, count) == count * want_out(c, n));
      }
    }
}

// mkc, end to end: the buffers it exports and the results it simulates (the
// executor sizes buffers, the reference says what they must hold) for a
// built-in schedule of every collective.
TEST_CASE("collectives.def: mkc exports and simulates every collective as the table says") {
  std::vector<Collective> seen;
  for (const dsl::ScheduleInfo& info : dsl::registered_schedules()) {
    if (std::find(seen.begin(), seen.end(), info.coll) != seen.end()) continue;
    seen.push_back(info.coll);
    const Collective c = info.coll;
    for (int n : {2, 3}) {
      CAPTURE(info.name);
      CAPTURE(n);
      const int32_t K = dsl::build(info, n, 0).chunks;
      auto x = mkt::mkc({"export", "--schedule", info.name, "--ranks", std::to_string(n)});
      INFO(x);
      REQUIRE(x.exit_code == 0);
      std::smatch m;
      REQUIRE(std::regex_search(x.out, m, std::regex("coll=\"(\\w+)\" inplace=\"(\\d)\"")));
      CHECK(m[1] == want(c).name);
      CHECK(m[2] == (want(c).inplace == InPlace::unsupported ? "0" : "1"));
      REQUIRE(std::regex_search(x.out, m, std::regex("i_chunks=\"(\\d+)\" o_chunks=\"(\\d+)\"")));
      CHECK(std::stoi(m[1]) == K * want_in(c, n));
      CHECK(std::stoi(m[2]) == K * want_out(c, n));

      const std::string root = std::to_string(want(c).root_only != RootBuffer::none ? n - 1 : 0);
      for (bool inplace : {false, true}) {
        CAPTURE(inplace);
        std::vector<std::string> args = {"simulate", "--schedule", info.name, "--ranks", std::to_string(n),
                                         "--count",  "37",         "--root",  root};
        if (inplace) args.push_back("--inplace");
        auto r = mkt::mkc(args);
        INFO(r);
        if (inplace && want(c).inplace == InPlace::unsupported) {
          CHECK(r.exit_code == 1);
          CHECK(mkt::contains(r.err, "mk.cli.E013"));
          CHECK(mkt::contains(r.err, "no in-place form"));
        } else {
          CHECK(r.exit_code == 0);
          CHECK(mkt::contains(r.out, "0 mismatch(es)"));
        }
      }
    }
  }
  CHECK(seen.size() == size_t(kNumCollectives));
}
