// Group kernels through the real host runtime and the fake driver: a group's
// calls on one communicator become one launch of a group kernel (MK_GROUP_FUSE),
// each call with its own arguments, calls that share scratch and flags on one
// lane, everything else (other streams, buffers one call writes and another
// touches, fused or copy-engine calls) launched one by one.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "mk.h"
#include "runtime/comm/comm.hpp"
#include "tests/runtime/fake.hpp"
#include "tests/scoped.hpp"

namespace {

using mkt::ScopedEnv;

// The launches a group of `calls` on `comm` makes.
template <class F>
int64_t launches_of(mkComm_t comm, F&& calls) {
  const int64_t launches = mkt::counts().launches;
  mkGroupStart();
  calls();
  REQUIRE_MESSAGE(mkGroupEnd() == mkSuccess, mkGetLastError(comm));
  return mkt::counts().launches - launches;
}

bool is_group(const mkfake_launch& l) { return std::string(l.function).rfind("mk_group_", 0) == 0; }

}  // namespace

TEST_CASE("mkGroupEnd: a group's calls on one communicator run as one group kernel from the second time (auto), "
          "each with its own arguments, calls of one plan on one lane") {
  MKT_REQUIRE_FAKE();
  ScopedEnv fuse("MK_GROUP_FUSE", "auto");
  const mkfake_counts before = mkt::counts();
  {
    mkt::Device dev(0);
    const size_t n = 1024;  // bf16 elements
    mkt::Buffer in(dev, n * 2), o1(dev, n * 2), o2(dev, n * 2), o3(dev, n * 2);
    mkComm_t comm = mkt::one_rank();
    auto group = [&] {
      REQUIRE(mkGroupStart() == mkSuccess);
      CHECK(mkAllReduce(in.ptr(), o1.ptr(), n, mkBfloat16, mkSum, comm, dev.stream) == mkSuccess);
      CHECK(mkAllGather(in.ptr(), o2.ptr(), n, mkBfloat16, comm, dev.stream) == mkSuccess);
      CHECK(mkAllReduce(in.ptr(), o3.ptr(), n / 2, mkBfloat16, mkMax, comm, dev.stream) == mkSuccess);
      return mkGroupEnd();
    };
    // the first time: one launch per call (a shape seen once is not compiled)
    int64_t launches = mkt::counts().launches;
    REQUIRE_MESSAGE(group() == mkSuccess, mkGetLastError(comm));
    CHECK(mkt::counts().launches == launches + 3);
    const mkfake_launch last_plain = mkt::last_launch();
    CHECK_FALSE(is_group(last_plain));
    // the same calls alone, for their grids
    REQUIRE(mkAllReduce(in.ptr(), o1.ptr(), n, mkBfloat16, mkSum, comm, dev.stream) == mkSuccess);
    const mkfake_launch ar = mkt::last_launch();
    REQUIRE(mkAllGather(in.ptr(), o2.ptr(), n, mkBfloat16, comm, dev.stream) == mkSuccess);
    const mkfake_launch ag = mkt::last_launch();
    REQUIRE(mkAllReduce(in.ptr(), o3.ptr(), n / 2, mkBfloat16, mkMax, comm, dev.stream) == mkSuccess);
    const mkfake_launch ar2 = mkt::last_launch();
    // the second time: one launch
    launches = mkt::counts().launches;
    REQUIRE_MESSAGE(group() == mkSuccess, mkGetLastError(comm));
    CHECK(mkt::counts().launches == launches + 1);
    const mkfake_launch l = mkt::last_launch();
    REQUIRE_MESSAGE(is_group(l), l.function);
    REQUIRE(l.members == 3);
    CHECK(l.stream == dev.stream);
    CHECK(l.block[0] == ar.block[0]);
    // each member's arguments are those of its call alone
    CHECK(l.member[0].input == in.ptr());
    CHECK(l.member[0].output == o1.ptr());
    CHECK(l.member[0].count == int64_t(n));
    CHECK(l.member[1].output == o2.ptr());
    CHECK(l.member[2].output == o3.ptr());
    CHECK(l.member[2].count == int64_t(n / 2));
    CHECK(l.member[0].flags == ar.args.flags);
    CHECK(l.member[1].flags == ag.args.flags);
    CHECK(l.member[0].tile_bytes == ar.args.tile_bytes);
    CHECK(l.member[2].tile_bytes == ar2.args.tile_bytes);
    // the two all-reduces: when their plans share scratch and flags, the
    // group's second call of them runs on a copy of the resources (its own
    // flags), side by side with the first; otherwise on its own
    const bool shared = ar.args.flags == ar2.args.flags;
    if (shared)
      CHECK(l.member[2].flags != ar2.args.flags);
    else
      CHECK(l.member[2].flags == ar2.args.flags);
    CHECK(l.grid[0] == ar.grid[0] + ag.grid[0] + ar2.grid[0]);
    // the third time: the same kernel, no new module
    const int64_t modules = mkt::counts().modules;
    REQUIRE(group() == mkSuccess);
    CHECK(mkt::counts().modules == modules);
    CHECK(std::string(mkt::last_launch().function) == l.function);
    REQUIRE(mkCommDestroy(comm) == mkSuccess);
  }
  const std::string leak = mkt::leaks(before, mkt::counts());
  CHECK_MESSAGE(leak.empty(), leak);
}

TEST_CASE("mkGroupEnd: a group's repeated calls of one plan take copies of its resources in turn, fused or not, "
          "and run side by side") {
  MKT_REQUIRE_FAKE();
  const mkfake_counts before = mkt::counts();
  {
    mkt::Device dev(0);
    const size_t n = 2048;
    std::vector<std::unique_ptr<mkt::Buffer>> in, out;
    for (int i = 0; i < 5; ++i) {
      in.push_back(std::make_unique<mkt::Buffer>(dev, n * 4));
      out.push_back(std::make_unique<mkt::Buffer>(dev, n * 4));
    }
    mkComm_t comm = mkt::one_rank();
    REQUIRE(mkAllReduce(in[0]->ptr(), out[0]->ptr(), n, mkFloat32, mkSum, comm, dev.stream) == mkSuccess);
    const mkfake_launch alone = mkt::last_launch();
    auto group = [&] {
      mkGroupStart();
      for (int i = 0; i < 5; ++i) mkAllReduce(in[i]->ptr(), out[i]->ptr(), n, mkFloat32, mkSum, comm, dev.stream);
      return mkGroupEnd();
    };
    // one launch per call: call k of the group runs on copy k % 4
    std::vector<uint64_t* const*> flags;
    {
      ScopedEnv fuse("MK_GROUP_FUSE", "0");
      const int64_t allocs = mkt::counts().device_allocs;
      REQUIRE(group() == mkSuccess);
      CHECK(mkt::counts().device_allocs > allocs);  // the copies, on first use
      CHECK(mkt::last_launch().args.flags == alone.args.flags);  // the fifth call: the plan's own again
    }
    // fused: five members, the first four side by side, the fifth after the first
    ScopedEnv fuse("MK_GROUP_FUSE", "1");
    const int64_t allocs = mkt::counts().device_allocs;
    REQUIRE(group() == mkSuccess);
    CHECK(mkt::counts().device_allocs == allocs);  // the same copies
    const mkfake_launch l = mkt::last_launch();
    REQUIRE(is_group(l));
    REQUIRE(l.members == 5);
    CHECK(l.member[0].flags == alone.args.flags);
    for (int i = 1; i < 4; ++i)
      for (int j = 0; j < i; ++j) CHECK(l.member[i].flags != l.member[j].flags);
    CHECK(l.member[4].flags == alone.args.flags);
    CHECK(l.grid[0] == 4 * alone.grid[0]);
    for (int i = 0; i < 5; ++i) {
      CHECK(l.member[i].input == in[size_t(i)]->ptr());
      CHECK(l.member[i].output == out[size_t(i)]->ptr());
    }
    // a call alone still runs on the plan's own resources
    REQUIRE(mkAllReduce(in[1]->ptr(), out[1]->ptr(), n, mkFloat32, mkSum, comm, dev.stream) == mkSuccess);
    CHECK(mkt::last_launch().args.flags == alone.args.flags);
    REQUIRE(mkCommDestroy(comm) == mkSuccess);
  }
  const std::string leak = mkt::leaks(before, mkt::counts());
  CHECK_MESSAGE(leak.empty(), leak);
}

TEST_CASE("mkGroupEnd: resource copies never take the room later plans need: with the smallest flag memory a "
          "group of repeated calls runs, and new plans still find room afterwards") {
  MKT_REQUIRE_FAKE();
  ScopedEnv flags("MK_FLAG_BYTES", "4096");
  ScopedEnv fuse("MK_GROUP_FUSE", "1");
  mkt::Device dev(0);
  const size_t n = 4096;
  std::vector<std::unique_ptr<mkt::Buffer>> bufs;
  for (int i = 0; i < 9; ++i) bufs.push_back(std::make_unique<mkt::Buffer>(dev, n * 4 * 2));
  mkComm_t comm = mkt::one_rank();
  // plans of four other collectives first: the arena fills up
  REQUIRE(mkAllGather(bufs[8]->ptr(), bufs[1]->ptr(), n, mkFloat32, comm, dev.stream) == mkSuccess);
  REQUIRE(mkReduceScatter(bufs[2]->ptr(), bufs[8]->ptr(), n / 2, mkFloat32, mkSum, comm, dev.stream) == mkSuccess);
  REQUIRE(mkBroadcast(bufs[3]->ptr(), bufs[4]->ptr(), n, mkFloat32, 0, comm, dev.stream) == mkSuccess);
  REQUIRE(mkReduce(bufs[3]->ptr(), bufs[4]->ptr(), n, mkFloat32, mkSum, 0, comm, dev.stream) == mkSuccess);
  REQUIRE(mkAllReduce(bufs[0]->ptr(), bufs[0]->ptr(), n, mkFloat32, mkSum, comm, dev.stream) == mkSuccess);
  const int64_t own = mkt::last_launch().args.flag_offset;
  // three copies of 256 bytes or more after it would cross the half (2048)
  REQUIRE(own + 4 * 256 > 2048);
  mkGroupStart();
  for (int i = 0; i < 8; ++i) mkAllReduce(bufs[size_t(i)]->ptr(), bufs[size_t(i)]->ptr(), n, mkFloat32, mkSum, comm, dev.stream);
  REQUIRE_MESSAGE(mkGroupEnd() == mkSuccess, mkGetLastError(comm));
  const mkfake_launch l = mkt::last_launch();
  REQUIRE(is_group(l));
  REQUIRE(l.members == 8);
  // every copy made ends in the first half of the flag memory; calls whose
  // copy would not fit run on the plan's own resources
  int refused = 0;
  for (int i = 1; i < l.members; ++i) {
    CAPTURE(i);
    if (l.member[i].flag_offset == own) ++refused;
    else CHECK(l.member[i].flag_offset + 256 <= 2048);
  }
  CHECK(refused > 1);  // members 4 (copy 0) and at least one refused copy
  CHECK(l.member[0].flag_offset == own);
  // plans of other collectives still get their own room
  CHECK_MESSAGE(mkAllToAll(bufs[5]->ptr(), bufs[6]->ptr(), n / 2, mkFloat32, comm, dev.stream) == mkSuccess,
                mkGetLastError(comm));
  REQUIRE(mkCommDestroy(comm) == mkSuccess);
}

TEST_CASE("mkGroupEnd: MK_GROUP_FUSE=0 and unset launch one kernel per call, =1 fuses the first time, a bad value "
          "is mkInvalidArgument and launches nothing") {
  MKT_REQUIRE_FAKE();
  mkt::Device dev(0);
  const size_t n = 512;
  mkt::Buffer in(dev, n * 4), o1(dev, n * 4), o2(dev, n * 4);
  mkComm_t comm = mkt::one_rank();
  auto group = [&] {
    mkGroupStart();
    mkAllReduce(in.ptr(), o1.ptr(), n, mkFloat32, mkSum, comm, dev.stream);
    mkReduceScatter(in.ptr(), o2.ptr(), n, mkFloat32, mkSum, comm, dev.stream);
    return mkGroupEnd();
  };
  for (const char* off : {"0", static_cast<const char*>(nullptr)}) {
    ScopedEnv fuse("MK_GROUP_FUSE", off);
    for (int i = 0; i < 3; ++i) {
      const int64_t launches = mkt::counts().launches;
      REQUIRE_MESSAGE(group() == mkSuccess, mkGetLastError(comm));
      CHECK(mkt::counts().launches == launches + 2);
      CHECK_FALSE(is_group(mkt::last_launch()));
    }
  }
  {
    ScopedEnv fuse("MK_GROUP_FUSE", "1");
    const int64_t launches = mkt::counts().launches;
    REQUIRE_MESSAGE(group() == mkSuccess, mkGetLastError(comm));
    CHECK(mkt::counts().launches == launches + 1);
    CHECK(is_group(mkt::last_launch()));
    CHECK(mkt::last_launch().members == 2);
  }
  {
    ScopedEnv fuse("MK_GROUP_FUSE", "yes");
    const int64_t launches = mkt::counts().launches;
    CHECK(group() == mkInvalidArgument);
    const std::string msg = mkGetLastError(nullptr);
    CHECK_MESSAGE(msg.find("MK_GROUP_FUSE") != std::string::npos, msg);
    CHECK(mkt::counts().launches == launches);
  }
  // the communicator is still usable
  ScopedEnv fuse("MK_GROUP_FUSE", "1");
  CHECK(group() == mkSuccess);
  REQUIRE(mkCommDestroy(comm) == mkSuccess);
}

TEST_CASE("mkGroupEnd: calls on other streams, a call that reads what another writes, and fused calls are not in "
          "a group kernel") {
  MKT_REQUIRE_FAKE();
  ScopedEnv fuse("MK_GROUP_FUSE", "1");
  mkt::Device dev(0);
  CUstream other = nullptr;
  REQUIRE(mkt::cu().cuStreamCreate(&other, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  const size_t n = 1024;
  mkt::Buffer in(dev, n * 2), o1(dev, n * 2), o2(dev, n * 2), res(dev, n * 2), w(dev, n * 2);
  mkComm_t comm = mkt::one_rank();
  auto launched = [&](auto&& calls) { return launches_of(comm, calls); };
  // other streams: one launch each
  CHECK(launched([&] {
          mkAllReduce(in.ptr(), o1.ptr(), n, mkBfloat16, mkSum, comm, dev.stream);
          mkAllGather(in.ptr(), o2.ptr(), n, mkBfloat16, comm, other);
        }) == 2);
  // the calls alone, for their grids
  REQUIRE(mkAllReduce(in.ptr(), o1.ptr(), n, mkBfloat16, mkSum, comm, dev.stream) == mkSuccess);
  const unsigned ar_grid = mkt::last_launch().grid[0];
  REQUIRE(mkAllGather(o1.ptr(), o2.ptr(), n, mkBfloat16, comm, dev.stream) == mkSuccess);
  const unsigned ag_grid = mkt::last_launch().grid[0];
  // the all-gather reads the all-reduce's output: it must see it complete,
  // so it runs after it on the same blocks (one lane: the larger grid)
  CHECK(launched([&] {
          mkAllReduce(in.ptr(), o1.ptr(), n, mkBfloat16, mkSum, comm, dev.stream);
          mkAllGather(o1.ptr(), o2.ptr(), n, mkBfloat16, comm, dev.stream);
        }) == 1);
  CHECK(is_group(mkt::last_launch()));
  CHECK(mkt::last_launch().grid[0] == std::max(ar_grid, ag_grid));
  // ... or writes what it reads
  CHECK(launched([&] {
          mkAllReduce(in.ptr(), o1.ptr(), n, mkBfloat16, mkSum, comm, dev.stream);
          mkAllGather(o2.ptr(), in.ptr(), n, mkBfloat16, comm, dev.stream);
        }) == 1);
  CHECK(mkt::last_launch().grid[0] == std::max(ar_grid, ag_grid));
  // a call that depends on two lanes (they run side by side; one lane cannot
  // wait for the other) starts a new launch
  CHECK(launched([&] {
          mkAllReduce(in.ptr(), o1.ptr(), n, mkBfloat16, mkSum, comm, dev.stream);
          mkAllGather(w.ptr(), o2.ptr(), n / 2, mkBfloat16, comm, dev.stream);
          mkAllReduce(o1.ptr(), o2.ptr(), n, mkBfloat16, mkMax, comm, dev.stream);
        }) == 2);
  // independent buffers: one launch
  CHECK(launched([&] {
          mkAllReduce(in.ptr(), o1.ptr(), n, mkBfloat16, mkSum, comm, dev.stream);
          mkAllGather(in.ptr(), o2.ptr(), n, mkBfloat16, comm, dev.stream);
        }) == 1);
  // a fused all-reduce runs alone; the calls around it are not fused across it
  mkFusion_t f{};
  f.name = "allreduce.rmsnorm";
  f.operands[0] = res.ptr();
  f.operands[1] = res.ptr();
  f.operands[2] = w.ptr();
  f.scalars[0] = 1e-6;
  f.row = int64_t(n);
  CHECK(launched([&] {
          mkAllReduce(in.ptr(), o1.ptr(), n, mkBfloat16, mkSum, comm, dev.stream);
          mkAllReduceFused(in.ptr(), o2.ptr(), n, mkBfloat16, mkSum, &f, comm, dev.stream);
          mkAllGather(in.ptr(), o2.ptr(), n, mkBfloat16, comm, dev.stream);
        }) == 3);
  REQUIRE(mkCommDestroy(comm) == mkSuccess);
  mkt::cu().cuStreamDestroy(other);
}

TEST_CASE("mkGroupEnd: two ranks sharing one GPU each launch one group kernel within their share of the SMs, and a "
          "config's maxCTAs below the lanes' blocks chains the calls on one lane") {
  MKT_REQUIRE_FAKE();
  ScopedEnv fuse("MK_GROUP_FUSE", "1");
  const mkfake_counts before = mkt::counts();
  {
    mkt::Device dev(0);
    const size_t n = 2048;
    std::vector<std::unique_ptr<mkt::Buffer>> in, o1, o2;
    for (int r = 0; r < 2; ++r) {
      in.push_back(std::make_unique<mkt::Buffer>(dev, n * 4 * 2));
      o1.push_back(std::make_unique<mkt::Buffer>(dev, n * 4 * 2));
      o2.push_back(std::make_unique<mkt::Buffer>(dev, n * 4 * 2));
    }
    mkComm_t comms[2] = {};
    const int devs[2] = {0, 0};
    REQUIRE_MESSAGE(mkCommInitAll(comms, 2, devs) == mkSuccess, mkGetLastError(nullptr));
    const int64_t launches = mkt::counts().launches;
    REQUIRE(mkGroupStart() == mkSuccess);
    for (int r = 0; r < 2; ++r) {
      mkAllReduce(in[size_t(r)]->ptr(), o1[size_t(r)]->ptr(), n, mkFloat32, mkSum, comms[r], dev.stream);
      mkAllGather(in[size_t(r)]->ptr(), o2[size_t(r)]->ptr(), n, mkFloat32, comms[r], dev.stream);
    }
    REQUIRE_MESSAGE(mkGroupEnd() == mkSuccess, mkGetLastError(nullptr));
    CHECK(mkt::counts().launches == launches + 2);
    const mkfake_launch l = mkt::last_launch();
    REQUIRE(is_group(l));
    CHECK(l.members == 2);
    CHECK(l.member[0].rank == 1);
    CHECK(l.grid[0] <= 132u / 2);  // the rank's share of the fake GPU's SMs
    for (mkComm_t c : comms) CHECK(mkCommDestroy(c) == mkSuccess);
  }
  {
    // one rank whose config allows the blocks of one lane, not of two side by side
    mkt::Device dev(0);
    const size_t n = 1024;
    mkt::Buffer in(dev, n * 2), o1(dev, n * 2), o2(dev, n * 2);
    mkComm_t probe = mkt::one_rank();
    REQUIRE(mkAllReduce(in.ptr(), o1.ptr(), n, mkBfloat16, mkSum, probe, dev.stream) == mkSuccess);
    const mkfake_launch ar = mkt::last_launch();
    REQUIRE(mkAllGather(in.ptr(), o2.ptr(), n, mkBfloat16, probe, dev.stream) == mkSuccess);
    const mkfake_launch ag = mkt::last_launch();
    REQUIRE(mkAllGather(in.ptr(), o2.ptr(), n / 2, mkBfloat16, probe, dev.stream) == mkSuccess);
    const mkfake_launch ag2 = mkt::last_launch();
    REQUIRE(ag2.args.flags == ag.args.flags);  // one plan
    REQUIRE(mkCommDestroy(probe) == mkSuccess);
    mkUniqueId id;
    REQUIRE(mkGetUniqueId(&id) == mkSuccess);
    mkConfig_t cfg = MK_CONFIG_INITIALIZER;
    cfg.maxCTAs = int(std::max(ar.grid[0], ag.grid[0]));
    mkComm_t comm = nullptr;
    REQUIRE_MESSAGE(mkCommInitRankConfig(&comm, 1, id, 0, &cfg) == mkSuccess, mkGetLastError(nullptr));
    auto launched = [&](auto&& calls) { return launches_of(comm, calls); };
    // independent calls with no room for two lanes: one lane, one after the other
    CHECK(launched([&] {
            mkAllReduce(in.ptr(), o1.ptr(), n, mkBfloat16, mkSum, comm, dev.stream);
            mkAllGather(in.ptr(), o2.ptr(), n, mkBfloat16, comm, dev.stream);
          }) == 1);
    CHECK(is_group(mkt::last_launch()));
    CHECK(mkt::last_launch().grid[0] == std::max(ar.grid[0], ag.grid[0]));
    // two calls of one plan: the second runs on a copy of the resources, and
    // with no room for its own lane after the first on the same blocks
    CHECK(launched([&] {
            mkAllGather(in.ptr(), o1.ptr(), n / 2, mkBfloat16, comm, dev.stream);
            mkAllGather(in.ptr(), o2.ptr(), n, mkBfloat16, comm, dev.stream);
          }) == 1);
    CHECK(mkt::last_launch().grid[0] == ag.grid[0]);
    CHECK(mkt::last_launch().member[0].flags != mkt::last_launch().member[1].flags);
    // an all-reduce of what an all-gather wrote: one lane, within the room
    CHECK(launched([&] {
            mkAllGather(in.ptr(), o1.ptr(), n / 2, mkBfloat16, comm, dev.stream);
            mkAllReduce(o1.ptr(), o2.ptr(), n / 2, mkBfloat16, mkSum, comm, dev.stream);
          }) == 1);
    const mkfake_launch l = mkt::last_launch();
    CHECK(is_group(l));
    CHECK(l.grid[0] == std::max(ag.grid[0], ar.grid[0]));
    REQUIRE(mkCommDestroy(comm) == mkSuccess);
  }
  const std::string leak = mkt::leaks(before, mkt::counts());
  CHECK_MESSAGE(leak.empty(), leak);
}

// One thread issuing every rank's first call in a group (an ncclGroupStart /
// ncclGroupEnd loop over the GPUs of a process): the ranks' plans, one per
// rank for a one-pass kernel, compile side by side in mkGroupEnd, not one
// after another; the calls run as before.
TEST_CASE("mkGroupEnd: ranks of one process compile their first calls' plans side by side") {
  MKT_REQUIRE_FAKE();
  mkt::TempDir cache;  // cold: every plan is compiled
  ScopedEnv dir("MK_CACHE_DIR", cache.str());
  ScopedEnv shipped("MK_PREBUILT_DIR", "");
  // three fake GPUs (ranks sharing one get a grid cap, under which one-shot is not one pass)
  std::vector<std::unique_ptr<mkt::Device>> dev;
  const size_t n = 64;  // 512 B of fp64: the one-pass one-shot all-reduce
  std::vector<std::unique_ptr<mkt::Buffer>> in, out;
  for (int r = 0; r < 3; ++r) {
    dev.push_back(std::make_unique<mkt::Device>(r));
    in.push_back(std::make_unique<mkt::Buffer>(*dev[size_t(r)], n * 8));
    out.push_back(std::make_unique<mkt::Buffer>(*dev[size_t(r)], n * 8));
  }
  mkComm_t comms[3] = {};
  const int devs[3] = {0, 1, 2};
  REQUIRE_MESSAGE(mkCommInitAll(comms, 3, devs) == mkSuccess, mkGetLastError(nullptr));
  mk::rt::plan_compiles(/*reset=*/true);
  const int64_t launches = mkt::counts().launches;
  REQUIRE(mkGroupStart() == mkSuccess);
  for (int r = 0; r < 3; ++r)
    REQUIRE(mkAllReduce(in[size_t(r)]->ptr(), out[size_t(r)]->ptr(), n, mkFloat64, mkMax, comms[r],
                        dev[size_t(r)]->stream) == mkSuccess);
  REQUIRE_MESSAGE(mkGroupEnd() == mkSuccess, mkGetLastError(nullptr));
  CHECK(mkt::counts().launches == launches + 3);
  CHECK(std::string(mkt::last_launch().function).find("allreduce_one_shot") != std::string::npos);
  const mk::rt::PlanCompiles c = mk::rt::plan_compiles();
  CHECK(c.started == 3);        // a plan per rank
  CHECK(c.peak_at_once >= 2);   // before: one after another in mkGroupEnd (peak 1)
  // the second group finds every instance: nothing compiles
  REQUIRE(mkGroupStart() == mkSuccess);
  for (int r = 0; r < 3; ++r)
    mkAllReduce(in[size_t(r)]->ptr(), out[size_t(r)]->ptr(), n, mkFloat64, mkMax, comms[r], dev[size_t(r)]->stream);
  REQUIRE_MESSAGE(mkGroupEnd() == mkSuccess, mkGetLastError(nullptr));
  CHECK(mk::rt::plan_compiles().started == 3);
  for (mkComm_t comm : comms) CHECK(mkCommDestroy(comm) == mkSuccess);
}
