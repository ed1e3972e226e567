// The runtime-trust contract (issue 8): abort and destroy from any thread,
// sticky errors, nonblocking init, split, finalize, all-or-nothing groups,
// complete-or-nothing resources, first use inside capture, occupancy of ranks
// sharing a GPU, pointer checks. Against the fake driver.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "mk/mk.hpp"
#include "compiler/jit/jit.hpp"
#include "tests/runtime/fake.hpp"
#include "tests/scoped.hpp"

using mkt::cu;
using Clock = std::chrono::steady_clock;

namespace {

using mkt::bound_ms;
using mkt::ms_since;
using mkt::one_rank;
using mkt::settle;

struct Pair {  // two ranks of one process (mkCommInitAll) on two fake GPUs
  mkt::Device d0{0}, d1{1};
  mkt::Buffer b0{d0, 1 << 16}, b1{d1, 1 << 16};
  mkComm_t c[2] = {};
  Pair() {
    const int devs[2] = {0, 1};
    REQUIRE_MESSAGE(mkCommInitAll(c, 2, devs) == mkSuccess, mkGetLastError(nullptr));
  }
  mkResult_t allreduce(size_t count = 64) {
    mkGroupStart();
    mkAllReduce(b0.ptr(), b0.ptr(), count, mkFloat32, mkSum, c[0], d0.stream);
    mkAllReduce(b1.ptr(), b1.ptr(), count, mkFloat32, mkSum, c[1], d1.stream);
    return mkGroupEnd();
  }
  void destroy() {
    for (auto& x : c)
      if (x) CHECK(mkCommDestroy(std::exchange(x, nullptr)) == mkSuccess);
  }
};

}  // namespace

TEST_CASE("abort from another thread while threads are inside calls: no freed memory touched, calls fail cleanly") {
  MKT_REQUIRE_FAKE();
  const mkfake_counts before = mkt::counts();
  {
    mkt::Device dev(0);
    mkt::Buffer buf(dev, 1 << 16);
    mkComm_t comm = one_rank();
    REQUIRE(mkAllReduce(buf.ptr(), buf.ptr(), 256, mkFloat32, mkSum, comm, dev.stream) == mkSuccess);  // plan ready
    std::atomic<bool> go{true};
    std::atomic<int> ok{0}, failed{0}, polls{0};
    std::vector<std::thread> callers;
    for (int t = 0; t < 3; ++t)
      callers.emplace_back([&] {
        CHECK(cu().cuCtxSetCurrent(dev.ctx) == CUDA_SUCCESS);
        while (go.load()) {
          const mkResult_t r = mkAllReduce(buf.ptr(), buf.ptr(), 256, mkFloat32, mkSum, comm, dev.stream);
          (r == mkSuccess ? ok : failed)++;
          int n = 0;
          mkCommCount(comm, &n);
          mkGetLastError(comm);
          if (r != mkSuccess && r != mkInvalidArgument && r != mkInvalidUsage) FAIL("unexpected code " << int(r));
          std::this_thread::yield();  // under valgrind's one-thread-at-a-time scheduler, let the aborter in
        }
      });
    std::thread watchdog([&] {  // what PyTorch's watchdog does: poll, every few microseconds here
      while (go.load()) {
        mkResult_t e = mkSuccess;
        mkCommGetAsyncError(comm, &e);
        ++polls;
        std::this_thread::yield();
      }
    });
    // Abort only once every thread is demonstrably running: under valgrind, which runs one thread
    // at a time, a fixed sleep could pass before the watchdog had polled even once.
    const auto started = Clock::now();
    while ((polls.load() == 0 || ok.load() == 0) && ms_since(started) < bound_ms(10000))
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const auto t0 = Clock::now();
    CHECK_MESSAGE(mkCommAbort(comm) == mkSuccess, mkGetLastError(nullptr));
    CHECK(ms_since(t0) < bound_ms(5000));
    const auto aborted = Clock::now();  // and let the callers see the dead handle before they stop
    while (failed.load() == 0 && ms_since(aborted) < bound_ms(10000))
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    go = false;
    for (auto& t : callers) t.join();
    watchdog.join();
    CHECK(ok.load() > 0);
    CHECK(failed.load() > 0);  // calls after the abort fail (invalid communicator), they do not crash
    CHECK(polls.load() > 0);
    // Calls on the dead handle are refused, not dereferenced.
    CHECK(mkAllReduce(buf.ptr(), buf.ptr(), 256, mkFloat32, mkSum, comm, dev.stream) == mkInvalidArgument);
    CHECK(mkCommDestroy(comm) == mkInvalidArgument);
  }
  const std::string leaked = mkt::leaks(before, mkt::counts());
  CHECK_MESSAGE(leaked.empty(), leaked);
}

TEST_CASE("abort ends a call blocked in the bootstrap (a registration whose peer never comes) within a second") {
  MKT_REQUIRE_FAKE();
  // Two ranks in two threads of this process over the bootstrap.
  mkUniqueId id;
  REQUIRE(mkGetUniqueId(&id) == mkSuccess);
  mkComm_t comms[2] = {};
  std::thread r1([&] {
    mkt::Device d(1);
    CHECK(mkCommInitRank(&comms[1], 2, id, 1) == mkSuccess);
  });
  {
    mkt::Device d(0);
    REQUIRE(mkCommInitRank(&comms[0], 2, id, 0) == mkSuccess);
  }
  r1.join();
  REQUIRE(comms[1]);
  mkt::Device d0(0);
  mkt::Buffer buf(d0, 1 << 20);
  std::atomic<int> result{-1};
  std::thread blocked([&] {
    CHECK(cu().cuCtxSetCurrent(d0.ctx) == CUDA_SUCCESS);
    void* h = nullptr;
    result = mkCommRegister(comms[0], buf.ptr(), 1 << 20, &h);  // rank 1 never registers: waits in the bootstrap
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK(result.load() == -1);
  const auto t0 = Clock::now();
  CHECK(mkCommAbort(comms[0]) == mkSuccess);
  blocked.join();
  CHECK(ms_since(t0) < bound_ms(1500));
  CHECK(result.load() != mkSuccess);
  CHECK(result.load() != -1);
  CHECK(mkCommAbort(comms[1]) == mkSuccess);
}

TEST_CASE("abort does not wait for unrelated work on the device (no context-wide synchronisation)") {
  MKT_REQUIRE_FAKE();
  auto release = mkt::require_fn<decltype(mkfake_release)>("mkfake_release");
  mkt::Device dev(0);
  mkt::Buffer buf(dev, 1 << 16);
  mkComm_t busy = one_rank(), mine = one_rank();
  REQUIRE(mkAllReduce(buf.ptr(), buf.ptr(), 64, mkFloat32, mkSum, mine, dev.stream) == mkSuccess);
  CUstream other = nullptr;
  REQUIRE(cu().cuStreamCreate(&other, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  mkt::launch_hung(busy, other, buf.ptr());  // another communicator's kernel that does not end
  const auto t0 = Clock::now();
  CHECK(mkCommAbort(mine) == mkSuccess);
  CHECK(ms_since(t0) < bound_ms(1000));
  release();
  CHECK(mkCommDestroy(busy) == mkSuccess);
  cu().cuStreamDestroy(other);
}

TEST_CASE("errors are sticky: after a kernel's error record every call fails, whether or not anyone polled") {
  MKT_REQUIRE_FAKE();
  Pair p;
  REQUIRE(p.allreduce() == mkSuccess);
  mk::dev::ErrorRecord rec{};
  rec.code = mk::dev::kErrWaitTimeout;
  rec.rank = 0;
  rec.peer = 1;
  rec.slot = 2;
  auto inject = mkt::require_fn<decltype(mkfake_inject_record)>("mkfake_inject_record");
  inject(1, &rec);  // rank 0's next kernel times out
  REQUIRE(mkAllReduce(p.b0.ptr(), p.b0.ptr(), 64, mkFloat32, mkSum, p.c[0], p.d0.stream) == mkSuccess);
  // Nobody called mkCommGetAsyncError: the next call still fails, with the reason.
  CHECK(mkAllReduce(p.b0.ptr(), p.b0.ptr(), 64, mkFloat32, mkSum, p.c[0], p.d0.stream) == mkRemoteError);
  CHECK(std::string(mkGetLastError(p.c[0])).find("from rank 1") != std::string::npos);
  CHECK(mkAllGather(p.b0.ptr(), p.b0.ptr(), 16, mkFloat32, p.c[0], p.d0.stream) == mkRemoteError);
  mkResult_t e = mkSuccess;
  CHECK(mkCommGetAsyncError(p.c[0], &e) == mkSuccess);
  CHECK(e == mkRemoteError);
  p.destroy();
}

TEST_CASE("abort tells the peers: their next kernel stops at entry and their calls fail, without a timeout") {
  MKT_REQUIRE_FAKE();
  Pair p;
  REQUIRE(p.allreduce() == mkSuccess);
  const auto t0 = Clock::now();
  REQUIRE(mkCommAbort(p.c[0]) == mkSuccess);
  p.c[0] = nullptr;
  // Rank 1's comm-wide abort word was raised by rank 0: its next launch stops
  // at entry (kStoppedAtEntry), and the call after that fails on the host.
  CHECK(mkAllReduce(p.b1.ptr(), p.b1.ptr(), 64, mkFloat32, mkSum, p.c[1], p.d1.stream) == mkSuccess);
  CHECK(mkt::last_launch().args.rank == 1);
  CHECK(mkAllReduce(p.b1.ptr(), p.b1.ptr(), 64, mkFloat32, mkSum, p.c[1], p.d1.stream) == mkRemoteError);
  const std::string msg = mkGetLastError(p.c[1]);
  CHECK_MESSAGE(msg.find("did not start") != std::string::npos, msg);
  CHECK(ms_since(t0) < bound_ms(2000));
  p.destroy();
}

TEST_CASE("graph replays after an error stop at kernel entry") {
  MKT_REQUIRE_FAKE();
  mkt::Device dev(0);
  mkt::Buffer buf(dev, 1 << 16);
  mkComm_t comm = one_rank();
  REQUIRE(mkAllReduce(buf.ptr(), buf.ptr(), 64, mkFloat32, mkSum, comm, dev.stream) == mkSuccess);
  REQUIRE(MKT_FN(cuStreamBeginCapture)(dev.stream, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  REQUIRE(mkAllReduce(buf.ptr(), buf.ptr(), 64, mkFloat32, mkSum, comm, dev.stream) == mkSuccess);
  CUgraph g = nullptr;
  REQUIRE(MKT_FN(cuStreamEndCapture)(dev.stream, &g) == CUDA_SUCCESS);
  CUgraphExec ge = nullptr;
  REQUIRE(MKT_FN(cuGraphInstantiateWithFlags)(&ge, g, 0) == CUDA_SUCCESS);
  REQUIRE(MKT_FN(cuGraphLaunch)(ge, dev.stream) == CUDA_SUCCESS);
  mkResult_t e = mkInternalError;
  REQUIRE(mkCommGetAsyncError(comm, &e) == mkSuccess);
  CHECK(e == mkSuccess);
  mk::dev::ErrorRecord rec{};
  rec.code = mk::dev::kErrWaitTimeout;
  auto inject = mkt::require_fn<decltype(mkfake_inject_record)>("mkfake_inject_record");
  inject(1, &rec);
  REQUIRE(MKT_FN(cuGraphLaunch)(ge, dev.stream) == CUDA_SUCCESS);  // this replay's kernel fails
  REQUIRE(MKT_FN(cuGraphLaunch)(ge, dev.stream) == CUDA_SUCCESS);  // the next one must not run
  const mk::dev::ErrorRecord* errs = mkt::last_launch().args.errors;
  REQUIRE(errs != nullptr);
  CHECK(errs[0].code == mk::dev::kErrStopped);
  CHECK(errs[0].slot == mk::dev::kStoppedAtEntry);
  REQUIRE(mkCommGetAsyncError(comm, &e) == mkSuccess);
  CHECK(e == mkRemoteError);
  MKT_FN(cuGraphExecDestroy)(ge);
  MKT_FN(cuGraphDestroy)(g);
  CHECK(mkCommDestroy(comm) == mkSuccess);
}

TEST_CASE("a collective whose plan was never used works inside stream capture (global and relaxed)") {
  MKT_REQUIRE_FAKE();
  for (CUstreamCaptureMode mode : {CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_RELAXED}) {
    mkt::Device dev(0);
    mkt::Buffer buf(dev, 1 << 16);
    mkComm_t comm = one_rank();
    const int64_t launches = mkt::counts().launches;
    REQUIRE(MKT_FN(cuStreamBeginCapture)(dev.stream, mode) == CUDA_SUCCESS);
    CHECK_MESSAGE(mkAllReduce(buf.ptr(), buf.ptr(), 64, mkFloat32, mkSum, comm, dev.stream) == mkSuccess,
                  mkGetLastError(comm));
    CUgraph g = nullptr;
    REQUIRE(MKT_FN(cuStreamEndCapture)(dev.stream, &g) == CUDA_SUCCESS);  // not invalidated by the first use
    CHECK(mkt::counts().launches == launches);                          // captured, not run
    CUgraphExec ge = nullptr;
    REQUIRE(MKT_FN(cuGraphInstantiateWithFlags)(&ge, g, 0) == CUDA_SUCCESS);
    for (int i = 0; i < 3; ++i) REQUIRE(MKT_FN(cuGraphLaunch)(ge, dev.stream) == CUDA_SUCCESS);
    CHECK(mkt::counts().launches == launches + 3);
    mkResult_t e = mkInternalError;
    CHECK(mkCommGetAsyncError(comm, &e) == mkSuccess);
    CHECK(e == mkSuccess);
    MKT_FN(cuGraphExecDestroy)(ge);
    MKT_FN(cuGraphDestroy)(g);
    CHECK(mkCommDestroy(comm) == mkSuccess);
  }
}

TEST_CASE("a failed call inside a group fails mkGroupEnd and launches nothing of the group") {
  MKT_REQUIRE_FAKE();
  Pair p;
  REQUIRE(p.allreduce() == mkSuccess);
  const int64_t launches = mkt::counts().launches;
  REQUIRE(mkGroupStart() == mkSuccess);
  CHECK(mkAllReduce(p.b0.ptr(), p.b0.ptr(), 64, mkFloat32, mkSum, p.c[0], p.d0.stream) == mkSuccess);
  CHECK(mkAllReduce(nullptr, p.b1.ptr(), 64, mkFloat32, mkSum, p.c[1], p.d1.stream) == mkInvalidArgument);
  CHECK(mkGroupEnd() == mkInvalidArgument);
  CHECK(std::string(mkGetLastError(nullptr)).find("none of its") != std::string::npos);
  CHECK(mkt::counts().launches == launches);
  // The next group is unaffected.
  CHECK(p.allreduce() == mkSuccess);
  CHECK(mkt::counts().launches == launches + 2);
  p.destroy();
}

TEST_CASE("an allocation failure while creating a plan's resources leaves nothing behind, a retry works") {
  MKT_REQUIRE_FAKE();
  auto fail_at = mkt::require_fn<decltype(mkfake_fail)>("mkfake_fail");
  mkt::Device dev(0);
  mkt::Buffer buf(dev, 1 << 16);
  mkComm_t comm = one_rank();
  const mkfake_counts before = mkt::counts();
  // The third cuMemAlloc of the first call (the step counters) fails: the GPU is full.
  REQUIRE(fail_at("cuMemAlloc", 3, 0) == 0);
  CHECK(mkAllReduce(buf.ptr(), buf.ptr(), 64, mkFloat32, mkSum, comm, dev.stream) == mkUnhandledCudaError);
  CHECK(std::string(mkGetLastError(comm)).find("step counters") != std::string::npos);
  fail_at(nullptr, 0, 0);
  mkfake_counts after = mkt::counts();
  CHECK(after.device_allocs == before.device_allocs);
  CHECK(after.host_allocs == before.host_allocs);
  CHECK(after.modules == before.modules);
  CHECK(after.launches == before.launches);
  // A retry allocates again (no half-built entry is reused) and launches with real tables.
  REQUIRE_MESSAGE(mkAllReduce(buf.ptr(), buf.ptr(), 64, mkFloat32, mkSum, comm, dev.stream) == mkSuccess,
                  mkGetLastError(comm));
  const mkfake_launch l = mkt::last_launch();
  CHECK(l.args.seq != nullptr);
  CHECK(l.args.flags != nullptr);
  CHECK(l.args.scratch != nullptr);
  CHECK(mkCommDestroy(comm) == mkSuccess);
}

TEST_CASE("host pointers and memory of another GPU are rejected at the call") {
  MKT_REQUIRE_FAKE();
  mkt::Device d1(1), d0(0);
  mkt::Buffer on0(d0, 1 << 16), on1(d1, 1 << 16);
  mkComm_t comm = one_rank();  // on GPU 0 (current)
  std::vector<float> host(1024);
  CHECK(mkAllReduce(host.data(), host.data(), 64, mkFloat32, mkSum, comm, d0.stream) == mkInvalidArgument);
  CHECK(std::string(mkGetLastError(comm)).find("not GPU memory") != std::string::npos);
  CHECK(mkAllReduce(on1.ptr(), on0.ptr(), 64, mkFloat32, mkSum, comm, d0.stream) == mkInvalidArgument);
  CHECK(std::string(mkGetLastError(comm)).find("GPU 1") != std::string::npos);
  // Past the end of the allocation.
  CHECK(mkAllReduce(on0.ptr(), on0.ptr(), (1 << 16) / 4 + 1, mkFloat32, mkSum, comm, d0.stream) == mkInvalidArgument);
  CHECK(mkAllReduce(on0.ptr(), on0.ptr(), 64, mkFloat32, mkSum, comm, d0.stream) == mkSuccess);
  CHECK(mkCommDestroy(comm) == mkSuccess);
}

TEST_CASE("ranks sharing a GPU whose kernels cannot all be resident are refused with a clear error") {
  MKT_REQUIRE_FAKE();
  auto limits = mkt::require_fn<decltype(mkfake_set_limits)>("mkfake_set_limits");
  // A GPU with room for 2 blocks at a time: one rank's kernel may fit, four
  // ranks' kernels together cannot (they would wait for each other forever).
  mkt::Device d(0);  // the driver is initialised (cuInit reads the fake's defaults)
  limits(1, 2);
  const int devs[4] = {0, 0, 0, 0};
  mkComm_t c[4] = {};
  REQUIRE(mkCommInitAll(c, 4, devs) == mkSuccess);
  mkt::Buffer b(d, 8 << 20);
  const int64_t launches = mkt::counts().launches;
  mkGroupStart();
  for (int i = 0; i < 4; ++i)
    mkReduceScatter(b.ptr(), reinterpret_cast<char*>(b.ptr()) + (4 << 20) + i * (1 << 20), 1 << 18, mkFloat32, mkSum,
                    c[i], d.stream);
  CHECK(mkGroupEnd() == mkInvalidUsage);
  const std::string msg = mkGetLastError(nullptr);
  CHECK_MESSAGE(msg.find("4 rank(s) of this communicator share GPU 0") != std::string::npos, msg);
  CHECK(mkt::counts().launches == launches);  // nothing launched: no deadlock
  limits(0, 0);
  for (auto x : c) CHECK(mkCommDestroy(x) == mkSuccess);
}

TEST_CASE("ranks sharing a GPU get an equal share of its SMs: their kernels' grids shrink to fit together") {
  MKT_REQUIRE_FAKE();
  auto limits = mkt::require_fn<decltype(mkfake_set_limits)>("mkfake_set_limits");
  mkt::Device d(0);
  limits(8, 1);  // 8 blocks at a time: 4 per rank (and the plans fit the tests' 4 MiB of scratch)
  const int devs[2] = {0, 0};
  mkComm_t c[2] = {};
  REQUIRE(mkCommInitAll(c, 2, devs) == mkSuccess);
  mkt::Buffer b(d, 16 << 20);
  for (size_t count : {size_t(1) << 20, size_t(256)}) {  // 4 MiB (simple protocol) and 1 KiB (LL)
    const int64_t launches = mkt::counts().launches;
    REQUIRE(mkGroupStart() == mkSuccess);
    for (int i = 0; i < 2; ++i)
      CHECK(mkAllReduce(b.ptr(), reinterpret_cast<char*>(b.ptr()) + (8 << 20) * i, count, mkFloat32, mkSum, c[i],
                        d.stream) == mkSuccess);
    REQUIRE_MESSAGE(mkGroupEnd() == mkSuccess, std::string(mkGetLastError(nullptr)));
    CHECK(mkt::counts().launches == launches + 2);
    CHECK(mkt::last_launch().grid[0] <= 4);
    CHECK(mkt::last_launch().grid[0] >= 2);
  }
  limits(0, 0);
  for (auto x : c) CHECK(mkCommDestroy(x) == mkSuccess);
}

TEST_CASE("nonblocking init returns mkInProgress and completes in the background") {
  MKT_REQUIRE_FAKE();
  mkt::Device dev(0);
  mkt::Buffer buf(dev, 1 << 16);
  mkUniqueId id;
  REQUIRE(mkGetUniqueId(&id) == mkSuccess);
  mkConfig_t cfg = MK_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  mkComm_t comms[2] = {};
  mkResult_t r0 = mkInternalError, r1 = mkInternalError;
  std::thread t([&] {
    mkt::Device d1(1);
    r1 = mkCommInitRankConfig(&comms[1], 2, id, 1, &cfg);
  });
  r0 = mkCommInitRankConfig(&comms[0], 2, id, 0, &cfg);
  t.join();
  CHECK(r0 == mkInProgress);
  CHECK(r1 == mkInProgress);
  REQUIRE(comms[0]);
  REQUIRE(comms[1]);
  for (mkComm_t c : comms) {
    const mkResult_t e = settle(c, 20000);
    CHECK_MESSAGE(e == mkSuccess, mkGetLastError(c));
  }
  int n = 0;
  CHECK(mkCommCount(comms[0], &n) == mkSuccess);
  CHECK(n == 2);
  for (mkComm_t c : comms) CHECK(mkCommDestroy(c) == mkSuccess);
}

TEST_CASE("nonblocking init: a failure is reported by mkCommGetAsyncError, calls before it are refused") {
  MKT_REQUIRE_FAKE();
  setenv("MK_BOOTSTRAP_TIMEOUT_MS", "300", 1);
  mkUniqueId id;
  REQUIRE(mkGetUniqueId(&id) == mkSuccess);
  mkConfig_t cfg = MK_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  mkComm_t comm = nullptr;
  CHECK(mkCommInitRankConfig(&comm, 2, id, 0, &cfg) == mkInProgress);  // rank 1 never comes
  REQUIRE(comm);
  mkt::Device dev(0);
  mkt::Buffer buf(dev, 4096);
  mkResult_t first = mkAllReduce(buf.ptr(), buf.ptr(), 8, mkFloat32, mkSum, comm, dev.stream);
  CHECK((first == mkInvalidUsage || first == mkSystemError || first == mkRemoteError));
  const mkResult_t e = settle(comm);
  CHECK(e != mkSuccess);
  CHECK(e != mkInProgress);
  CHECK(mkCommAbort(comm) == mkSuccess);
  unsetenv("MK_BOOTSTRAP_TIMEOUT_MS");
}

TEST_CASE("config: magic, version and ranges are checked, a short struct from an older header works") {
  MKT_REQUIRE_FAKE();
  mkUniqueId id;
  REQUIRE(mkGetUniqueId(&id) == mkSuccess);
  mkComm_t comm = nullptr;
  mkConfig_t bad = MK_CONFIG_INITIALIZER;
  bad.magic = 0;
  CHECK(mkCommInitRankConfig(&comm, 1, id, 0, &bad) == mkInvalidArgument);
  CHECK(std::string(mkGetLastError(nullptr)).find("MK_CONFIG_INITIALIZER") != std::string::npos);
  mkConfig_t range = MK_CONFIG_INITIALIZER;
  range.blocking = 7;
  CHECK(mkCommInitRankConfig(&comm, 1, id, 0, &range) == mkInvalidArgument);
  CHECK(std::string(mkGetLastError(nullptr)).find("blocking") != std::string::npos);
  mkConfig_t net = MK_CONFIG_INITIALIZER;
  net.netName = "IB";
  CHECK(mkCommInitRankConfig(&comm, 1, id, 0, &net) == mkInvalidArgument);
  mkConfig_t shorter = MK_CONFIG_INITIALIZER;
  shorter.size = offsetof(mkConfig_t, splitShare);  // an older layout: fields after it are not read
  shorter.splitShare = 12345;
  REQUIRE_MESSAGE(mkCommInitRankConfig(&comm, 1, id, 0, &shorter) == mkSuccess, mkGetLastError(nullptr));
  CHECK(mkCommDestroy(comm) == mkSuccess);
  REQUIRE(mkCommInitRankConfig(&comm, 1, id, 0, nullptr) == mkSuccess);
  CHECK(mkCommDestroy(comm) == mkSuccess);
}

TEST_CASE("mkCommSplit: ranks of one process split by color, ordered by key, NOCOLOR gets NULL") {
  MKT_REQUIRE_FAKE();
  const int devs[4] = {0, 1, 2, 3};
  mkComm_t parent[4] = {};
  REQUIRE(mkCommInitAll(parent, 4, devs) == mkSuccess);
  mkComm_t child[4] = {};
  mkResult_t res[4] = {};
  std::vector<std::thread> ts;
  for (int r = 0; r < 4; ++r)
    ts.emplace_back([&, r] {
      mkt::Device d(r);
      const int color = r == 3 ? MK_SPLIT_NOCOLOR : r % 2;
      res[r] = mkCommSplit(parent[r], color, /*key=*/-r, &child[r], nullptr);
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < 4; ++r) CHECK_MESSAGE(res[r] == mkSuccess, mkGetLastError(nullptr));
  CHECK(child[3] == nullptr);
  // color 0: ranks 0 and 2, keys 0 and -2: rank 2 first.
  int n = 0, me = -1, dev = -1;
  REQUIRE(child[0]);
  REQUIRE(child[2]);
  CHECK(mkCommCount(child[0], &n) == mkSuccess);
  CHECK(n == 2);
  CHECK(mkCommUserRank(child[2], &me) == mkSuccess);
  CHECK(me == 0);
  CHECK(mkCommUserRank(child[0], &me) == mkSuccess);
  CHECK(me == 1);
  CHECK(mkCommCuDevice(child[0], &dev) == mkSuccess);
  CHECK(dev == 0);
  REQUIRE(child[1]);
  CHECK(mkCommCount(child[1], &n) == mkSuccess);
  CHECK(n == 1);
  for (auto c : child)
    if (c) CHECK(mkCommDestroy(c) == mkSuccess);
  for (auto c : parent) CHECK(mkCommDestroy(c) == mkSuccess);
}

TEST_CASE("mkCommSplit over the bootstrap (ranks in threads with mkCommInitRank)") {
  MKT_REQUIRE_FAKE();
  mkUniqueId id;
  REQUIRE(mkGetUniqueId(&id) == mkSuccess);
  const int n = 3;
  mkComm_t parent[n] = {}, child[n] = {};
  int size[n] = {}, rank[n] = {};
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      mkt::Device d(r);
      CHECK(mkCommInitRank(&parent[r], n, id, r) == mkSuccess);
      CHECK_MESSAGE(mkCommSplit(parent[r], r == 1 ? 7 : 3, 0, &child[r], nullptr) == mkSuccess,
                    mkGetLastError(parent[r]));
      mkCommCount(child[r], &size[r]);
      mkCommUserRank(child[r], &rank[r]);
    });
  for (auto& t : ts) t.join();
  CHECK(size[0] == 2);
  CHECK(size[2] == 2);
  CHECK(size[1] == 1);
  CHECK(rank[0] == 0);
  CHECK(rank[2] == 1);
  for (auto c : child) CHECK(mkCommDestroy(c) == mkSuccess);
  for (auto c : parent) CHECK(mkCommDestroy(c) == mkSuccess);
}

TEST_CASE("mkCommFinalize waits for the communicator's work, afterwards only destroy is allowed") {
  MKT_REQUIRE_FAKE();
  mkt::Device dev(0);
  mkt::Buffer buf(dev, 1 << 16);
  mkComm_t comm = one_rank();
  REQUIRE(mkAllReduce(buf.ptr(), buf.ptr(), 64, mkFloat32, mkSum, comm, dev.stream) == mkSuccess);
  CHECK(mkCommFinalize(comm) == mkSuccess);
  CHECK(mkAllReduce(buf.ptr(), buf.ptr(), 64, mkFloat32, mkSum, comm, dev.stream) == mkInvalidUsage);
  CHECK(std::string(mkGetLastError(comm)).find("finalized") != std::string::npos);
  CHECK(mkCommDestroy(comm) == mkSuccess);
}

TEST_CASE("C++ API: nonblocking init, split and finalize") {
  MKT_REQUIRE_FAKE();
  mkt::Device dev(0);
  mkConfig_t cfg = MK_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  auto comm = mk::Communicator::init_rank(1, mk::UniqueId::create(), 0, cfg);
  REQUIRE(comm.get() != nullptr);
  // Through the C++ wrapper's async_error(), not mkt::settle.
  auto settle = [](const mk::Communicator& c) {
    const auto t0 = Clock::now();
    while (c.async_error() == mkInProgress && ms_since(t0) < bound_ms(10000))
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return c.async_error();
  };
  CHECK(settle(comm) == mkSuccess);
  mk::Communicator child = comm.split(0, 0);  // nonblocking too: the child inherits the config
  CHECK(settle(child) == mkSuccess);
  CHECK(settle(comm) == mkSuccess);
  CHECK(child.size() == 1);
  mk::Communicator none = comm.split(MK_SPLIT_NOCOLOR, 0);
  CHECK(none.get() == nullptr);
  CHECK(settle(comm) == mkSuccess);
  child.finalize();
  comm.finalize();
  CHECK_THROWS_AS(comm.split(0, 0), mk::RuntimeError);  // finalized: only destruction is allowed
}

TEST_CASE("destroy is not held up by a group still open on this thread, mkGroupEnd then fails cleanly") {
  MKT_REQUIRE_FAKE();
  mkt::Device dev(0);
  mkt::Buffer buf(dev, 1 << 16);
  mkComm_t comm = one_rank();
  const int64_t launches = mkt::counts().launches;
  REQUIRE(mkGroupStart() == mkSuccess);
  REQUIRE(mkAllReduce(buf.ptr(), buf.ptr(), 64, mkFloat32, mkSum, comm, dev.stream) == mkSuccess);
  const auto t0 = Clock::now();
  CHECK(mkCommDestroy(comm) == mkSuccess);
  CHECK(ms_since(t0) < bound_ms(2000));
  CHECK(mkGroupEnd() == mkInvalidUsage);
  CHECK(std::string(mkGetLastError(nullptr)).find("destroyed or aborted before mkGroupEnd") != std::string::npos);
  CHECK(mkt::counts().launches == launches);
}

TEST_CASE("a peer's arena in this process outlives the peer's destroy while this rank addresses it") {
  MKT_REQUIRE_FAKE();
  Pair p;
  REQUIRE(p.allreduce() == mkSuccess);
  const int64_t mapped = mkt::counts().vmm_mappings;
  CHECK(mkCommDestroy(p.c[1]) == mkSuccess);
  p.c[1] = nullptr;
  // Rank 0 still addresses rank 1's arena (its kernels and its abort write
  // into it): it stays mapped until rank 0 goes.
  CHECK(mkt::counts().vmm_mappings == mapped);
  // A new communicator may get the freed address range of anything that was
  // freed; rank 0's abort must not land in it.
  REQUIRE(cu().cuCtxSetCurrent(p.d0.ctx) == CUDA_SUCCESS);
  mkComm_t fresh = one_rank();
  CHECK_MESSAGE(mkAllReduce(p.b0.ptr(), p.b0.ptr(), 64, mkFloat32, mkSum, fresh, p.d0.stream) == mkSuccess,
                std::string(mkGetLastError(fresh)));
  const int64_t with_fresh = mkt::counts().vmm_mappings;
  CHECK(mkCommAbort(p.c[0]) == mkSuccess);
  p.c[0] = nullptr;
  CHECK(mkt::counts().vmm_mappings == with_fresh - 2);  // rank 0's arena and rank 1's, together
  for (int i = 0; i < 2; ++i)
    CHECK_MESSAGE(mkAllReduce(p.b0.ptr(), p.b0.ptr(), 64, mkFloat32, mkSum, fresh, p.d0.stream) == mkSuccess,
                  std::string(mkGetLastError(fresh)));
  CHECK(mkCommDestroy(fresh) == mkSuccess);
}

TEST_CASE("mkCommSplit back to back from the ranks' threads: every round gives every rank its child") {
  MKT_REQUIRE_FAKE();
  const int devs[2] = {0, 1};
  mkComm_t parent[2] = {};
  REQUIRE(mkCommInitAll(parent, 2, devs) == mkSuccess);
  std::atomic<int> lost{0};
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      mkt::Device d(r);
      for (int round = 0; round < 20; ++round) {
        mkComm_t child = nullptr;
        if (mkCommSplit(parent[r], 0, r, &child, nullptr) != mkSuccess || !child) {
          ++lost;
          continue;
        }
        int n = 0;
        if (mkCommCount(child, &n) != mkSuccess || n != 2) ++lost;
        mkCommDestroy(child);
      }
    });
  for (auto& t : ts) t.join();
  CHECK(lost.load() == 0);
  for (auto c : parent) CHECK(mkCommDestroy(c) == mkSuccess);
}

TEST_CASE("a group whose launch fails part-way stops what it launched and makes every communicator's error sticky") {
  MKT_REQUIRE_FAKE();
  auto fail_at = mkt::require_fn<decltype(mkfake_fail)>("mkfake_fail");
  Pair p;
  REQUIRE(p.allreduce() == mkSuccess);
  // (sm_90 plans are launched with programmatic dependent launch: cuLaunchKernelEx)
  REQUIRE(fail_at("cuLaunchKernelEx", 2, int(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES)) == 0);
  CHECK(p.allreduce() == mkUnhandledCudaError);
  fail_at(nullptr, 0, 0);
  // Rank 0's kernel was launched and would wait for rank 1's forever: both
  // communicators are stopped (abort words raised) and report the failure.
  const mk::dev::Args a0 = mkt::last_launch().args;
  CHECK(a0.rank == 0);
  CHECK(a0.host_abort[0] == 1);
  for (mkComm_t c : p.c) {
    mkResult_t e = mkSuccess;
    CHECK(mkCommGetAsyncError(c, &e) == mkSuccess);
    CHECK(e == mkUnhandledCudaError);
    CHECK(std::string(mkGetLastError(c)).find("launched 1 of the group's 2 calls") != std::string::npos);
  }
  CHECK(p.allreduce() == mkUnhandledCudaError);
  for (auto& c : p.c) CHECK(mkCommAbort(std::exchange(c, nullptr)) == mkSuccess);
}

TEST_CASE("mkCommFinalize blocks until the communicator's kernels are done") {
  MKT_REQUIRE_FAKE();
  auto release = mkt::require_fn<decltype(mkfake_release)>("mkfake_release");
  mkt::Device dev(0);
  mkt::Buffer buf(dev, 1 << 16);
  mkComm_t comm = one_rank();
  mkt::launch_hung(comm, dev.stream, buf.ptr());
  std::atomic<int> result{-1};
  std::thread t([&] { result = mkCommFinalize(comm); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK(result.load() == -1);  // still waiting for the kernel
  release();
  t.join();
  CHECK(result.load() == mkSuccess);
  CHECK(mkCommDestroy(comm) == mkSuccess);
}

TEST_CASE("abort from another thread while a thread waits inside mkCommFinalize: both return, nothing freed early") {
  MKT_REQUIRE_FAKE();
  mkt::Device dev(0);
  mkt::Buffer buf(dev, 1 << 16);
  mkComm_t comm = one_rank();
  mkt::launch_hung(comm, dev.stream, buf.ptr());
  std::atomic<int> result{-1};
  std::thread inside([&] { result = mkCommFinalize(comm); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE(result.load() == -1);
  const auto t0 = Clock::now();
  CHECK(mkCommAbort(comm) == mkSuccess);  // its kernel stops on the abort word; the finalize returns
  inside.join();
  CHECK(ms_since(t0) < bound_ms(3000));
  CHECK(result.load() != mkSuccess);
  CHECK(result.load() != -1);
}

namespace {
// Rank 0 of 2 initialising without blocking; rank 1 never comes, so the
// init stays in progress (its thread waits at the rendezvous).
mkComm_t init_without_peer() {
  mkUniqueId id;
  REQUIRE(mkGetUniqueId(&id) == mkSuccess);
  mkConfig_t cfg = MK_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  mkComm_t comm = nullptr;
  REQUIRE(mkCommInitRankConfig(&comm, 2, id, 0, &cfg) == mkInProgress);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  return comm;
}
}  // namespace

TEST_CASE("abort during a nonblocking init whose peer never comes returns promptly") {
  MKT_REQUIRE_FAKE();
  mkt::Device dev(0);
  mkComm_t comm = init_without_peer();
  mkResult_t e = mkSuccess;
  REQUIRE(mkCommGetAsyncError(comm, &e) == mkSuccess);
  CHECK(e == mkInProgress);
  const auto t0 = Clock::now();
  CHECK(mkCommAbort(comm) == mkSuccess);
  CHECK(ms_since(t0) < bound_ms(2000));  // the abort ends the init thread's rendezvous wait
  int n = 0;
  CHECK(mkCommCount(comm, &n) == mkInvalidArgument);
}

TEST_CASE("a communicator's launches on another stream wait for its previous launch, on the same stream they do not") {
  MKT_REQUIRE_FAKE();
  mkt::Device dev(0);
  mkt::Buffer buf(dev, 1 << 16);
  mkComm_t comm = one_rank();
  CUstream a = nullptr, b = nullptr;
  REQUIRE(cu().cuStreamCreate(&a, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  REQUIRE(cu().cuStreamCreate(&b, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  auto call = [&](CUstream s) {
    REQUIRE(mkAllReduce(buf.ptr(), buf.ptr(), 64, mkFloat32, mkSum, comm, s) == mkSuccess);
    return mkt::counts().stream_waits;
  };
  const int64_t w0 = call(a);
  CHECK(call(a) == w0);      // same stream: ordered already
  CHECK(call(b) == w0 + 1);  // another stream waits
  // A new stream, even one that gets the old handle back, is another stream.
  REQUIRE(cu().cuStreamDestroy(b) == CUDA_SUCCESS);
  CUstream c = nullptr;
  REQUIRE(cu().cuStreamCreate(&c, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CHECK(call(c) == w0 + 2);
  CHECK(mkCommDestroy(comm) == mkSuccess);
  cu().cuStreamDestroy(a);
  cu().cuStreamDestroy(c);
}

TEST_CASE("config maxCTAs caps every kernel's grid, below one instance's blocks the call fails naming maxCTAs") {
  MKT_REQUIRE_FAKE();
  mkUniqueId id;
  REQUIRE(mkGetUniqueId(&id) == mkSuccess);
  const int n = 2;
  // a broadcast: its LL kernel has two thread blocks per instance (one-pass
  // kernels, like the all-reduce's, have one and fit maxCTAs=1)
  unsigned grid_default[n] = {}, grid_capped[n] = {};
  mkResult_t tiny[n] = {};
  std::string tiny_msg[n];
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      mkt::Device d(r);
      mkt::Buffer buf(d, 1 << 16);
      mkComm_t plain = nullptr, capped = nullptr, one = nullptr;
      mkConfig_t cfg = MK_CONFIG_INITIALIZER;
      REQUIRE(mkCommInitRank(&plain, n, id, r) == mkSuccess);
      REQUIRE(mkBroadcast(buf.ptr(), buf.ptr(), 64, mkFloat32, 0, plain, d.stream) == mkSuccess);
      grid_default[r] = mkt::last_launch().grid[0];  // uncapped: no capped launch can come before the split
      cfg.maxCTAs = 4;
      REQUIRE(mkCommSplit(plain, 0, r, &capped, &cfg) == mkSuccess);
      REQUIRE(mkBroadcast(buf.ptr(), buf.ptr(), 64, mkFloat32, 0, capped, d.stream) == mkSuccess);
      grid_capped[r] = mkt::last_launch().grid[0];
      cfg.maxCTAs = 1;
      REQUIRE(mkCommSplit(plain, 0, r, &one, &cfg) == mkSuccess);
      tiny[r] = mkBroadcast(buf.ptr(), buf.ptr(), 64, mkFloat32, 0, one, d.stream);
      tiny_msg[r] = mkGetLastError(one);
      for (mkComm_t c : {one, capped, plain}) CHECK(mkCommDestroy(c) == mkSuccess);
    });
  for (auto& t : ts) t.join();
  // Either thread may have read the other's launch (the fake keeps the last one).
  CHECK(std::max(grid_default[0], grid_default[1]) > 4);
  CHECK(grid_capped[0] <= 4);
  CHECK(grid_capped[1] <= 4);
  for (int r = 0; r < n; ++r) {
    CHECK(tiny[r] == mkInvalidUsage);
    CHECK_MESSAGE(tiny_msg[r].find("maxCTAs") != std::string::npos, tiny_msg[r]);
  }
}

TEST_CASE("destroy during a nonblocking init whose peer never comes cancels the init and returns promptly") {
  MKT_REQUIRE_FAKE();
  mkt::Device dev(0);
  mkComm_t comm = init_without_peer();
  const auto t0 = Clock::now();
  CHECK(mkCommDestroy(comm) == mkSuccess);
  // it waited 10 s for the init thread, which waited for the peer
  CHECK(ms_since(t0) < bound_ms(2000));
  int n = 0;
  CHECK(mkCommCount(comm, &n) == mkInvalidArgument);
}

TEST_CASE("a first call compiling its plan does not hold up mkCommAbort from another thread, and fails when its compile ends") {
  MKT_REQUIRE_FAKE();
  if (mk::jit::nvrtc_version() <= 0) {
    MESSAGE("SKIPPED: no NVRTC on this machine (the call must compile a plan)");
    return;
  }
  // A private cache: the plan is compiled now, not read (seconds on a small
  // machine). fp64 max: a plan no other case of this process has made.
  mkt::TempDir cache("mkt-abort-compile");
  mkt::ScopedEnv env("MK_CACHE_DIR", cache.str());
  mkt::Device dev(0);
  const size_t hidden = 1024, count = 4 * hidden;
  mkt::Buffer in(dev, count * 2), out(dev, count * 2), res(dev, count * 2), res_out(dev, count * 2),
      weight(dev, hidden * 2);
  mkComm_t comm = one_rank();
  // A fused all-reduce + RMSNorm: its first call checks the fusion's code and
  // compiles a plan with the epilogue (a second or more here).
  mkFusion_t f{};
  f.name = "allreduce.rmsnorm";
  f.operands[0] = res.ptr();
  f.operands[1] = res_out.ptr();
  f.operands[2] = weight.ptr();
  f.scalars[0] = 1e-5;
  f.row = int64_t(hidden);
  std::atomic<mkResult_t> got{mkSuccess};
  std::atomic<bool> returned{false};
  const auto started = Clock::now();
  std::thread caller([&] {
    got = mkAllReduceFused(in.ptr(), out.ptr(), count, mkBfloat16, mkSum, &f, comm, dev.stream);
    returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  const bool compiling = !returned.load();
  const auto t0 = Clock::now();
  CHECK(mkCommAbort(comm) == mkSuccess);
  const bool call_done_at_abort = returned.load();  // it waited for the call's compile
  const int64_t abort_ms = ms_since(t0);
  caller.join();
  const int64_t call_ms = ms_since(started);
  MESSAGE("abort took " << abort_ms << " ms; the call (compiling its plan) took " << call_ms << " ms");
  if (compiling) {
    CHECK_FALSE(call_done_at_abort);
    CHECK(abort_ms < bound_ms(300));  // it waited for the compile (about a second or more)
    CHECK(got.load() != mkSuccess);   // the call saw the abort when its compile ended
  }
}
