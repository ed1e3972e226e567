// mkCommSplit beyond the basics (test_lifetime.cpp has those): nonblocking
// splits, aborts that end a split in progress, and splitShare (children that
// use part of their parent's symmetric memory). Against the fake driver.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "mk/mk.hpp"
#include "tests/runtime/fake.hpp"

using Clock = std::chrono::steady_clock;

namespace {

using mkt::bound_ms;
using mkt::ms_since;
using mkt::settle;

// Where a launched kernel's flags and scratch of `rank` are, as addresses
// (read from the tables the launch's Args point at).
struct Where {
  CUdeviceptr abort_word = 0, scratch = 0;
};
Where where_last_launch_went() {
  const mkfake_launch l = mkt::last_launch();
  const int r = l.args.rank;
  CUdeviceptr fp = 0, sp = 0;
  REQUIRE(MKT_FN(cuMemcpyDtoH)(&fp, CUdeviceptr(reinterpret_cast<uintptr_t>(l.args.flags + r)), sizeof fp) ==
          CUDA_SUCCESS);
  REQUIRE(MKT_FN(cuMemcpyDtoH)(&sp, CUdeviceptr(reinterpret_cast<uintptr_t>(l.args.scratch + r)), sizeof sp) ==
          CUDA_SUCCESS);
  return {fp - CUdeviceptr(l.args.flag_offset), sp};
}

struct Ranks {  // n ranks of one process (mkCommInitAll) on n fake GPUs
  int n;
  std::vector<std::unique_ptr<mkt::Device>> dev;
  std::vector<std::unique_ptr<mkt::Buffer>> buf;
  std::vector<mkComm_t> c;
  explicit Ranks(int n_) : n(n_), c(size_t(n_), nullptr) {
    std::vector<int> devs;
    for (int r = 0; r < n; ++r) {
      devs.push_back(r);
      dev.push_back(std::make_unique<mkt::Device>(r));
      buf.push_back(std::make_unique<mkt::Buffer>(*dev.back(), 1 << 16));
    }
    REQUIRE_MESSAGE(mkCommInitAll(c.data(), n, devs.data()) == mkSuccess, mkGetLastError(nullptr));
  }
  // One all-reduce on every communicator of `comms` (by its rank's device).
  mkResult_t allreduce(const std::vector<mkComm_t>& comms, const std::vector<int>& on) {
    mkGroupStart();
    for (size_t i = 0; i < comms.size(); ++i)
      mkAllReduce(buf[size_t(on[i])]->ptr(), buf[size_t(on[i])]->ptr(), 64, mkFloat32, mkSum, comms[i],
                  dev[size_t(on[i])]->stream);
    return mkGroupEnd();
  }
  // Every rank splits with (color(r), key 0, config) from its own thread.
  std::vector<mkResult_t> split(std::vector<mkComm_t>* out, int (*color)(int), const mkConfig_t* config) {
    std::vector<mkResult_t> res(static_cast<size_t>(n));
    out->assign(size_t(n), nullptr);
    std::vector<std::thread> ts;
    for (int r = 0; r < n; ++r)
      ts.emplace_back([&, r] {
        mkt::Device d(r);
        res[size_t(r)] = mkCommSplit(c[size_t(r)], color(r), 0, &(*out)[size_t(r)], config);
      });
    for (auto& t : ts) t.join();
    return res;
  }
  ~Ranks() {
    for (auto x : c)
      if (x) mkCommDestroy(x);
  }
};

int all_one(int) { return 0; }

mkConfig_t share_config() {
  mkConfig_t cfg = MK_CONFIG_INITIALIZER;
  cfg.splitShare = 1;
  return cfg;
}

}  // namespace

TEST_CASE("splitShare: the children use part of the parent's arena (no new symmetric memory), apart from it") {
  MKT_REQUIRE_FAKE();
  Ranks p(2);
  REQUIRE(p.allreduce(p.c, {0, 1}) == mkSuccess);  // the parent holds a plan below the shared region
  const Where parent = where_last_launch_went();
  const int64_t vmm_before = mkt::counts().vmm_handles;
  const mkConfig_t cfg = share_config();
  std::vector<mkComm_t> child;
  for (mkResult_t r : p.split(&child, all_one, &cfg)) CHECK_MESSAGE(r == mkSuccess, mkGetLastError(nullptr));
  CHECK(mkt::counts().vmm_handles == vmm_before);  // no arena was created
  REQUIRE(p.allreduce(child, {0, 1}) == mkSuccess);
  const Where kid = where_last_launch_went();
  // Same arena (rank 1's, as its own GPU sees it): the child's abort word and
  // scratch lie in the parent's flag and scratch parts, above what the
  // parent's plan uses.
  const int64_t flag_bytes = int64_t(1) << 20;                             // the default
  const int64_t scratch_bytes = std::strtoll(std::getenv("MK_SCRATCH_BYTES"), nullptr, 10);  // tests/runtime/main.cpp
  CHECK(kid.abort_word > parent.abort_word);
  CHECK(kid.abort_word < parent.abort_word + CUdeviceptr(flag_bytes));
  CHECK(kid.scratch > parent.scratch);
  CHECK(kid.scratch < parent.abort_word + CUdeviceptr(flag_bytes + scratch_bytes));
  // The child's abort stops the child only.
  CHECK(mkCommAbort(child[0]) == mkSuccess);
  CHECK(mkCommAbort(child[1]) == mkSuccess);
  REQUIRE(p.allreduce(p.c, {0, 1}) == mkSuccess);
  mkResult_t e = mkSuccess;
  REQUIRE(mkCommGetAsyncError(p.c[0], &e) == mkSuccess);
  CHECK_MESSAGE(e == mkSuccess, mkGetLastError(p.c[0]));
  // Without splitShare the children get arenas of their own.
  std::vector<mkComm_t> own;
  for (mkResult_t r : p.split(&own, all_one, nullptr)) CHECK(r == mkSuccess);
  CHECK(mkt::counts().vmm_handles == vmm_before + 2);
  for (auto c : own) CHECK(mkCommDestroy(c) == mkSuccess);
}

TEST_CASE("splitShare: a child outlives its parent and still works, everything is freed after both") {
  MKT_REQUIRE_FAKE();
  const mkfake_counts before = mkt::counts();
  {
    Ranks p(2);
    const mkConfig_t cfg = share_config();
    std::vector<mkComm_t> child;
    for (mkResult_t r : p.split(&child, all_one, &cfg)) CHECK(r == mkSuccess);
    for (auto& c : p.c) CHECK(mkCommDestroy(std::exchange(c, nullptr)) == mkSuccess);
    CHECK(p.allreduce(child, {0, 1}) == mkSuccess);
    mkResult_t e = mkInProgress;
    REQUIRE(mkCommGetAsyncError(child[1], &e) == mkSuccess);
    CHECK(e == mkSuccess);
    for (auto c : child) CHECK(mkCommDestroy(c) == mkSuccess);
  }
  CHECK(mkt::leaks(before, mkt::counts()) == "");
}

TEST_CASE("splitShare over the bootstrap: children share, and ranks that disagree on splitShare all fail") {
  MKT_REQUIRE_FAKE();
  mkUniqueId id;
  REQUIRE(mkGetUniqueId(&id) == mkSuccess);
  const int n = 2;
  mkComm_t parent[n] = {}, shared[n] = {}, mixed[n] = {};
  mkResult_t mixed_res[n] = {};
  std::string mixed_msg[n];
  int64_t vmm_delta[n] = {};
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      mkt::Device d(r);
      REQUIRE(mkCommInitRank(&parent[r], n, id, r) == mkSuccess);
      const mkConfig_t cfg = share_config();
      const int64_t v0 = mkt::counts().vmm_handles;
      CHECK_MESSAGE(mkCommSplit(parent[r], 0, r, &shared[r], &cfg) == mkSuccess, mkGetLastError(parent[r]));
      vmm_delta[r] = mkt::counts().vmm_handles - v0;
      mkConfig_t no = MK_CONFIG_INITIALIZER;
      no.splitShare = 0;
      mixed_res[r] = mkCommSplit(parent[r], 0, r, &mixed[r], r == 0 ? &cfg : &no);
      mixed_msg[r] = mkGetLastError(parent[r]);
    });
  for (auto& t : ts) t.join();
  // Counts are process-wide: no rank's split created an arena (a split
  // without sharing creates one per rank, and one rank would see at least its own).
  CHECK(vmm_delta[0] == 0);
  CHECK(vmm_delta[1] == 0);
  int size = 0;
  REQUIRE(shared[1]);
  CHECK(mkCommCount(shared[1], &size) == mkSuccess);
  CHECK(size == 2);
  for (int r = 0; r < n; ++r) {
    CHECK(mixed_res[r] == mkInvalidUsage);
    CHECK(mixed[r] == nullptr);
    CHECK_MESSAGE(mixed_msg[r].find("disagree on splitShare") != std::string::npos, mixed_msg[r]);
  }
  for (auto c : shared) CHECK(mkCommDestroy(c) == mkSuccess);
  for (auto c : parent) CHECK(mkCommDestroy(c) == mkSuccess);
}

TEST_CASE("splitShare: a child's plans that need more than its region fail with a message naming splitShare") {
  MKT_REQUIRE_FAKE();
  Ranks p(2);  // 4 MiB of scratch (tests/runtime/main.cpp): the children get about 2 MiB
  const mkConfig_t cfg = share_config();
  std::vector<mkComm_t> child;
  for (mkResult_t r : p.split(&child, all_one, &cfg)) CHECK(r == mkSuccess);
  // Large-message plans need more scratch than that.
  const size_t count = size_t(1) << 24;
  mkt::Buffer b0(*p.dev[0], count * 4), b1(*p.dev[1], count * 4);
  mkGroupStart();
  mkAllReduce(b0.ptr(), b0.ptr(), count, mkFloat32, mkSum, child[0], p.dev[0]->stream);
  mkAllReduce(b1.ptr(), b1.ptr(), count, mkFloat32, mkSum, child[1], p.dev[1]->stream);
  CHECK(mkGroupEnd() == mkSystemError);
  const std::string msg = mkGetLastError(nullptr);
  CHECK_MESSAGE(msg.find("splitShare") != std::string::npos, msg);
  for (auto c : child) CHECK(mkCommDestroy(c) == mkSuccess);
}

TEST_CASE("nonblocking split: mkInProgress at once, the parent refuses calls until it is done, then the child is ready") {
  MKT_REQUIRE_FAKE();
  Ranks p(2);
  mkConfig_t cfg = MK_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  mkComm_t child0 = nullptr, child1 = nullptr;
  {
    mkt::Device d(0);
    CHECK(mkCommSplit(p.c[0], 5, 0, &child0, &cfg) == mkInProgress);  // rank 1 has not come yet
  }
  REQUIRE(child0);
  mkResult_t e = mkSuccess;
  REQUIRE(mkCommGetAsyncError(child0, &e) == mkSuccess);
  CHECK(e == mkInProgress);
  REQUIRE(mkCommGetAsyncError(p.c[0], &e) == mkSuccess);
  CHECK(e == mkInProgress);
  CHECK(mkAllReduce(p.buf[0]->ptr(), p.buf[0]->ptr(), 64, mkFloat32, mkSum, p.c[0], p.dev[0]->stream) ==
        mkInvalidUsage);
  CHECK(std::string(mkGetLastError(p.c[0])).find("still running") != std::string::npos);
  {
    mkt::Device d(1);
    CHECK(mkCommSplit(p.c[1], 5, 0, &child1, nullptr) == mkSuccess);  // blocking: meets rank 0's split
  }
  CHECK(settle(child0) == mkSuccess);
  CHECK(settle(p.c[0]) == mkSuccess);
  int n = 0;
  CHECK(mkCommCount(child0, &n) == mkSuccess);
  CHECK(n == 2);
  CHECK(p.allreduce({child0, child1}, {0, 1}) == mkSuccess);
  CHECK(p.allreduce(p.c, {0, 1}) == mkSuccess);
  CHECK(mkCommDestroy(child0) == mkSuccess);
  CHECK(mkCommDestroy(child1) == mkSuccess);
}

TEST_CASE("aborting the parent ends a split that waits for ranks that never come (one process)") {
  MKT_REQUIRE_FAKE();
  setenv("MK_BOOTSTRAP_TIMEOUT_MS", "60000", 1);
  {
    Ranks p(2);
    mkComm_t child = nullptr;
    mkResult_t r = mkSuccess;
    const auto t0 = Clock::now();
    std::thread t([&] {
      mkt::Device d(0);
      r = mkCommSplit(p.c[0], 0, 0, &child, nullptr);  // rank 1 never splits
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    CHECK(mkCommAbort(std::exchange(p.c[0], nullptr)) == mkSuccess);
    t.join();
    CHECK(ms_since(t0) < bound_ms(5000));
    CHECK(r != mkSuccess);
    CHECK(child == nullptr);
  }
  unsetenv("MK_BOOTSTRAP_TIMEOUT_MS");
}

TEST_CASE("aborting the parent ends a split that waits for ranks that never come (bootstrap)") {
  MKT_REQUIRE_FAKE();
  setenv("MK_BOOTSTRAP_TIMEOUT_MS", "60000", 1);
  {
    mkUniqueId id;
    REQUIRE(mkGetUniqueId(&id) == mkSuccess);
    mkComm_t parent[2] = {};
    std::vector<std::thread> ts;
    for (int r = 0; r < 2; ++r)
      ts.emplace_back([&, r] {
        mkt::Device d(r);
        REQUIRE(mkCommInitRank(&parent[r], 2, id, r) == mkSuccess);
      });
    for (auto& t : ts) t.join();
    mkConfig_t cfg = MK_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    mkComm_t child = nullptr;
    {
      mkt::Device d(0);
      CHECK(mkCommSplit(parent[0], 0, 0, &child, &cfg) == mkInProgress);  // rank 1 never splits
    }
    REQUIRE(child);
    const auto t0 = Clock::now();
    CHECK(mkCommAbort(parent[0]) == mkSuccess);
    const mkResult_t e = settle(child, 5000);
    CHECK(ms_since(t0) < bound_ms(5000));
    CHECK(e != mkSuccess);
    CHECK(e != mkInProgress);
    CHECK(mkCommDestroy(child) == mkSuccess);
    CHECK(mkCommDestroy(parent[1]) == mkSuccess);
  }
  unsetenv("MK_BOOTSTRAP_TIMEOUT_MS");
}

// A rank that splits after its peer aborted (or destroyed its communicator,
// or whose process ended) learns it from the rendezvous within about a
// second, naming the rank, instead of waiting MK_BOOTSTRAP_TIMEOUT_MS.
namespace {
struct BootRanks {  // n ranks over the bootstrap, in threads of this process
  std::vector<mkComm_t> c;
  explicit BootRanks(int n) : c(size_t(n), nullptr) {
    mkUniqueId id;
    REQUIRE(mkGetUniqueId(&id) == mkSuccess);
    std::vector<std::thread> ts;
    for (int r = 0; r < n; ++r)
      ts.emplace_back([&, r] {
        mkt::Device d(r);
        CHECK(mkCommInitRank(&c[size_t(r)], n, id, r) == mkSuccess);
      });
    for (auto& t : ts) t.join();
    for (auto x : c) REQUIRE(x);
  }
  // Rank r splits (blocking): the result, mkGetLastError and how long it took.
  struct Split {
    mkResult_t r = mkSuccess;
    std::string msg;
    double ms = 0;
  };
  Split split(int r) {
    mkt::Device d(r);
    mkComm_t child = nullptr;
    Split s;
    const auto t0 = Clock::now();
    s.r = mkCommSplit(c[size_t(r)], 0, 0, &child, nullptr);
    s.ms = ms_since(t0);
    s.msg = mkGetLastError(c[size_t(r)]);
    if (child) mkCommDestroy(child);
    return s;
  }
  ~BootRanks() {
    for (auto x : c)
      if (x) CHECK(mkCommDestroy(x) == mkSuccess);  // the ranks left behind destroy cleanly
  }
};
bool has(const std::string& msg, const char* what) { return msg.find(what) != std::string::npos; }
}  // namespace

TEST_CASE("a split after the peer aborted or destroyed its communicator fails within a second, naming the rank") {
  MKT_REQUIRE_FAKE();
  setenv("MK_BOOTSTRAP_TIMEOUT_MS", "20000", 1);
  for (const bool abort : {true, false}) {
    CAPTURE(abort);
    BootRanks p(2);
    CHECK((abort ? mkCommAbort(p.c[0]) : mkCommDestroy(p.c[0])) == mkSuccess);
    p.c[0] = nullptr;
    const auto s = p.split(1);
    MESSAGE("rank 1's split failed after " << s.ms << " ms: " << s.msg);
    CHECK(s.r == mkRemoteError);
    CHECK(s.ms < bound_ms(2000));
    CHECK_MESSAGE(has(s.msg, abort ? "rank 0 aborted its communicator"
                                   : "rank 0's connection closed (process ended or communicator destroyed)"),
                  s.msg);
    const auto again = p.split(1);  // and every later exchange, at once
    CHECK(again.r == mkRemoteError);
    CHECK(again.msg == s.msg);
  }
  unsetenv("MK_BOOTSTRAP_TIMEOUT_MS");
}

TEST_CASE("an abort reaches ranks waiting in a split and ranks that split later, also when it came mid-round") {
  MKT_REQUIRE_FAKE();
  setenv("MK_BOOTSTRAP_TIMEOUT_MS", "20000", 1);
  {
    // Rank 0 has already sent its part of the split's first round (a
    // nonblocking split) when it aborts; rank 1 waits in that round, and
    // rank 2 has not come yet: the round could never complete.
    BootRanks p(3);
    mkConfig_t cfg = MK_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    mkComm_t child0 = nullptr;
    {
      mkt::Device d(0);
      CHECK(mkCommSplit(p.c[0], 0, 0, &child0, &cfg) == mkInProgress);
    }
    BootRanks::Split s1;
    std::thread t([&] { s1 = p.split(1); });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // rank 1 waits in the split's all-gather
    const auto t0 = Clock::now();
    CHECK(mkCommAbort(p.c[0]) == mkSuccess);
    p.c[0] = nullptr;
    t.join();
    MESSAGE("rank 1's split failed " << ms_since(t0) << " ms after the abort: " << s1.msg);
    CHECK(ms_since(t0) < bound_ms(2000));
    CHECK(s1.r == mkRemoteError);
    CHECK_MESSAGE(has(s1.msg, "rank 0 aborted its communicator"), s1.msg);
    const auto s2 = p.split(2);
    CHECK(s2.ms < bound_ms(2000));
    CHECK(s2.r == mkRemoteError);
    CHECK_MESSAGE(has(s2.msg, "rank 0 aborted its communicator"), s2.msg);
    CHECK(settle(child0, 5000) != mkSuccess);
    CHECK(mkCommDestroy(child0) == mkSuccess);
  }
  unsetenv("MK_BOOTSTRAP_TIMEOUT_MS");
}

TEST_CASE("mkCommSplit inside a group: one thread splits every rank of its process, and mkGroupEnd reports failures") {
  MKT_REQUIRE_FAKE();
  Ranks p(4);
  std::vector<mkComm_t> child(4, nullptr);
  REQUIRE(mkGroupStart() == mkSuccess);
  for (int r = 0; r < 4; ++r) CHECK(mkCommSplit(p.c[size_t(r)], r % 2, -r, &child[size_t(r)], nullptr) == mkSuccess);
  REQUIRE_MESSAGE(mkGroupEnd() == mkSuccess, mkGetLastError(nullptr));
  int n = 0, me = -1;
  CHECK(mkCommCount(child[0], &n) == mkSuccess);
  CHECK(n == 2);
  CHECK(mkCommUserRank(child[2], &me) == mkSuccess);  // color 0: keys 0 and -2, rank 2 first
  CHECK(me == 0);
  CHECK(p.allreduce({child[0], child[2]}, {0, 2}) == mkSuccess);
  CHECK(p.allreduce(p.c, {0, 1, 2, 3}) == mkSuccess);  // the parent is usable again
  for (auto c : child) CHECK(mkCommDestroy(c) == mkSuccess);
  // Ranks that disagree on splitShare: the group fails, naming why.
  mkConfig_t share = share_config(), no = MK_CONFIG_INITIALIZER;
  no.splitShare = 0;
  REQUIRE(mkGroupStart() == mkSuccess);
  for (int r = 0; r < 4; ++r) mkCommSplit(p.c[size_t(r)], 0, r, &child[size_t(r)], r == 0 ? &share : &no);
  CHECK(mkGroupEnd() == mkInvalidUsage);
  CHECK(std::string(mkGetLastError(nullptr)).find("splitShare") != std::string::npos);
  for (auto c : child)
    if (c) CHECK(mkCommDestroy(c) == mkSuccess);
  // Ranks that disagree on their schedule lists: the group fails, naming the
  // setting (before: rank 0's list served every rank, the others' were dropped).
  const auto file = std::filesystem::temp_directory_path() / ("mkt_split_sched." + std::to_string(::getpid()) + ".json");
  std::ofstream(file) << R"({"mk_ir_version": 1, "name": "split_ar", "collective": "allreduce", "ranks": 2,
  "root": 0, "chunks": 1, "instances": 1, "scratch": 2, "depth": 1, "proto": "simple", "slots": 0, "tbs": 0,
  "tile_bytes": 0, "staged": false, "synced": false, "ops": [
  {"id": 0, "kind": "copy", "rank": 0, "tb": -1, "dsts": ["r1.sc[0]"], "srcs": ["r0.in[0]"]},
  {"id": 1, "kind": "copy", "rank": 1, "tb": -1, "dsts": ["r0.sc[1]"], "srcs": ["r1.in[0]"]},
  {"id": 2, "kind": "reduce", "rank": 0, "tb": -1, "dsts": ["r0.out[0]"], "srcs": ["r0.in[0]", "r0.sc[1]"]},
  {"id": 3, "kind": "reduce", "rank": 1, "tb": -1, "dsts": ["r1.out[0]"], "srcs": ["r1.sc[0]", "r1.in[0]"]}]})";
  const std::string list = file.string();
  mkConfig_t with = MK_CONFIG_INITIALIZER, without = MK_CONFIG_INITIALIZER;
  with.schedules = list.c_str();
  REQUIRE(mkGroupStart() == mkSuccess);
  for (int r = 0; r < 4; ++r) mkCommSplit(p.c[size_t(r)], 0, r, &child[size_t(r)], r == 0 ? &with : &without);
  CHECK(mkGroupEnd() == mkInvalidUsage);
  CHECK(std::string(mkGetLastError(nullptr)).find("ranks disagree on the communicator's schedules (config)") !=
        std::string::npos);
  for (auto c : child)
    if (c) CHECK(mkCommDestroy(c) == mkSuccess);
  std::filesystem::remove(file);
}

// Lamport packets (templates/prims_lamport.cuh) rely on scratch at rest being
// all ones: the arena starts so (flags zero), and a splitShare child's part
// of its parent's scratch, never used before, is still so.
TEST_CASE("symmetric memory starts with zero flags and all-ones scratch, in a splitShare child's part too") {
  MKT_REQUIRE_FAKE();
  Ranks p(2);
  REQUIRE(p.allreduce(p.c, {0, 1}) == mkSuccess);
  const Where parent = where_last_launch_went();
  const int64_t flag_bytes = int64_t(1) << 20;                                              // the default
  const int64_t scratch_bytes = std::strtoll(std::getenv("MK_SCRATCH_BYTES"), nullptr, 10);  // tests/runtime/main.cpp
  std::vector<unsigned char> mem(size_t(flag_bytes + scratch_bytes));
  REQUIRE(MKT_FN(cuMemcpyDtoH)(mem.data(), parent.abort_word, mem.size()) == CUDA_SUCCESS);
  // (the fake's kernels write no flag and no scratch)
  size_t nonzero = 0, not_ones = 0;
  for (int64_t i = 0; i < flag_bytes; ++i) nonzero += mem[size_t(i)] != 0;
  for (int64_t i = flag_bytes; i < flag_bytes + scratch_bytes; ++i) not_ones += mem[size_t(i)] != 0xFF;
  CHECK(nonzero == 0);
  CHECK(not_ones == 0);
  CHECK(parent.scratch >= parent.abort_word + CUdeviceptr(flag_bytes));
  const mkConfig_t cfg = share_config();
  std::vector<mkComm_t> child;
  for (mkResult_t r : p.split(&child, all_one, &cfg)) CHECK_MESSAGE(r == mkSuccess, mkGetLastError(nullptr));
  REQUIRE(p.allreduce(child, {0, 1}) == mkSuccess);
  const Where kid = where_last_launch_went();
  std::vector<unsigned char> region(4096);
  REQUIRE(MKT_FN(cuMemcpyDtoH)(region.data(), kid.scratch, region.size()) == CUDA_SUCCESS);
  for (unsigned char b : region) REQUIRE(b == 0xFF);
  for (auto c : child) CHECK(mkCommDestroy(c) == mkSuccess);
}
