// One process: one rank, and ranks of mkCommInitAll.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <chrono>
#include <thread>

#include "compiler/compile.hpp"
#include "runtime/api/handles.hpp"
#include "runtime/comm/comm.hpp"
#include "runtime/proxy/proxy.hpp"
#include "compiler/plan/plan.hpp"
#include "mk/dsl.hpp"
#include "mk/mk.hpp"
#include "tests/runtime/fake.hpp"
#include "tests/scoped.hpp"

using mkt::cu;

TEST_CASE("fake driver: the libcuda.so.1 in use is the fake") {
  const mkt::Driver d = mkt::driver();
  if (d == mkt::Driver::real) {
    MESSAGE("SKIPPED: a real NVIDIA driver is loaded; every test of mk_runtime_tests skips");
    return;
  }
  REQUIRE_MESSAGE(d == mkt::Driver::fake, "no libcuda.so.1: run through ctest (LD_LIBRARY_PATH)");
  std::string why;
  CHECK_MESSAGE(mk::rt::cuda_available(&why), why);
  int n = 0;
  CHECK(cu().cuDeviceGetCount(&n) == CUDA_SUCCESS);
  CHECK(n >= 2);
}

TEST_CASE("one rank: an all-reduce launches one kernel with the call's arguments, destroy frees everything") {
  MKT_REQUIRE_FAKE();
  const mkfake_counts before = mkt::counts();
  {
    mkt::Device dev(0);
    mkt::Buffer in(dev, 4096), out(dev, 4096);
    mkComm_t comm = mkt::one_rank();
    const int64_t launches = mkt::counts().launches;
    REQUIRE_MESSAGE(mkAllReduce(in.ptr(), out.ptr(), 256, mkFloat32, mkSum, comm, dev.stream) == mkSuccess,
                    mkGetLastError(comm));
    CHECK(mkt::counts().launches == launches + 1);
    const mkfake_launch l = mkt::last_launch();
    CHECK(l.stream == dev.stream);
    CHECK(l.device == 0);
    CHECK(l.grid[0] >= 1);
    CHECK(l.block[0] >= 32);
    CHECK(l.args.count == 256);
    CHECK(l.args.rank == 0);
    CHECK(l.args.input == in.ptr());
    CHECK(l.args.output == out.ptr());
    CHECK(l.args.errors != nullptr);
    CHECK((l.args.host_abort != nullptr));
    CHECK(l.pdl == 1);  // an sm_90 plan waits for the previous grid: launched with PDL
    REQUIRE(mkCommDestroy(comm) == mkSuccess);
  }
  const std::string leaked = mkt::leaks(before, mkt::counts());
  CHECK_MESSAGE(leaked.empty(), leaked);
}

namespace {

// mkCommInitAll over `devlist`, a grouped all-reduce on every rank, destroy;
// no driver object may outlive it.
void init_all_allreduce(const std::vector<int>& devlist) {
  const mkfake_counts before = mkt::counts();
  {
    const int n = int(devlist.size());
    std::vector<std::unique_ptr<mkt::Device>> devs;
    std::vector<std::unique_ptr<mkt::Buffer>> in, out;
    for (int d : devlist) {
      devs.push_back(std::make_unique<mkt::Device>(d));
      in.push_back(std::make_unique<mkt::Buffer>(*devs.back(), 4096));
      out.push_back(std::make_unique<mkt::Buffer>(*devs.back(), 4096));
    }
    std::vector<mkComm_t> comms(size_t(n), nullptr);
    REQUIRE_MESSAGE(mkCommInitAll(comms.data(), n, devlist.data()) == mkSuccess, mkGetLastError(nullptr));
    const int64_t launches = mkt::counts().launches;
    REQUIRE(mkGroupStart() == mkSuccess);
    for (int r = 0; r < n; ++r)
      CHECK(mkAllReduce(in[size_t(r)]->ptr(), out[size_t(r)]->ptr(), 128, mkFloat32, mkSum, comms[size_t(r)],
                        devs[size_t(r)]->stream) == mkSuccess);
    REQUIRE_MESSAGE(mkGroupEnd() == mkSuccess, mkGetLastError(nullptr));
    CHECK(mkt::counts().launches == launches + n);
    const mkfake_launch l = mkt::last_launch();  // the group launches in call order
    CHECK(l.args.rank == n - 1);
    CHECK(l.args.count == 128);
    CHECK(l.device == devlist.back());
    CHECK(l.stream == devs.back()->stream);
    CHECK(l.args.input == in.back()->ptr());
    for (mkComm_t c : comms) CHECK(mkCommDestroy(c) == mkSuccess);
  }
  const std::string leaked = mkt::leaks(before, mkt::counts());
  CHECK_MESSAGE(leaked.empty(), leaked);
}

}  // namespace

TEST_CASE("mkCommInitAll: two GPUs, a grouped all-reduce launches one kernel per rank, no leaks") {
  MKT_REQUIRE_FAKE();
  init_all_allreduce({0, 1});
}

TEST_CASE("mkCommInitAll: two ranks sharing one GPU launch two kernels, no leaks") {
  MKT_REQUIRE_FAKE();
  init_all_allreduce({0, 0});
}

// Ranks of one process as nodes (MK_HOST_ID, one name per rank): the GPU
// host's way to run several "nodes" with concurrent kernels. The handles go
// round without a bootstrap; every rank's plan gets its connections and they
// reach the other node's proxies.
TEST_CASE("mkCommInitAll with MK_HOST_ID=a,a,b,b and MK_NET=socket: ranks of one process on two nodes") {
  MKT_REQUIRE_FAKE();
  mkt::ScopedEnv host("MK_HOST_ID", "node-a,node-a,node-b,node-b");
  mkt::ScopedEnv net("MK_NET", "socket");
  mkt::ScopedEnv ifname("MK_SOCKET_IFNAME", "=lo");
  mkt::ScopedEnv scratch("MK_SCRATCH_BYTES", "67108864");
  mkt::ScopedEnv tune("MK_TUNE", "simple_instances=2");
  const mkfake_counts before = mkt::counts();
  {
    const std::vector<int> devlist = {0, 0, 0, 0};
    const int n = 4;
    std::vector<std::unique_ptr<mkt::Device>> devs;
    std::vector<std::unique_ptr<mkt::Buffer>> bufs;
    for (int d : devlist) {
      devs.push_back(std::make_unique<mkt::Device>(d));
      bufs.push_back(std::make_unique<mkt::Buffer>(*devs.back(), 1 << 20));
    }
    std::vector<mkComm_t> comms(size_t(n), nullptr);
    REQUIRE_MESSAGE(mkCommInitAll(comms.data(), n, devlist.data()) == mkSuccess, mkGetLastError(nullptr));
    for (int r = 0; r < n; ++r) {
      int nodes = 0;
      CHECK(mkCommNodeCount(comms[size_t(r)], &nodes) == mkSuccess);
      CHECK(nodes == 2);
    }
    REQUIRE(mkGroupStart() == mkSuccess);
    for (int r = 0; r < n; ++r)
      CHECK(mkAllReduce(bufs[size_t(r)]->ptr(), bufs[size_t(r)]->ptr(), 1 << 18, mkFloat32, mkSum, comms[size_t(r)],
                        devs[size_t(r)]->stream) == mkSuccess);
    REQUIRE_MESSAGE(mkGroupEnd() == mkSuccess, mkGetLastError(nullptr));
    CHECK(mkt::last_launch().args.net != nullptr);  // a plan across nodes, with its connection table
    // Memory reaches this node's ranks only; every rank's connections
    // arrive at the other node's proxies.
    for (int r = 0; r < n; ++r) {
      auto c = mk::rt::acquire(comms[size_t(r)]);
      REQUIRE(c->proxy != nullptr);
      for (int p = 0; p < n; ++p) CHECK((c->peer_base[size_t(p)] != 0) == (p / 2 == r / 2));
      CHECK(c->proxy->stats().send_conns > 0);
      const auto t0 = std::chrono::steady_clock::now();
      while (c->proxy->stats().recv_conns == 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10))
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      CHECK(c->proxy->stats().recv_conns > 0);
      CHECK_MESSAGE(c->proxy->error().empty(), c->proxy->error());
    }
    // Split by node: the children (2 ranks each) keep their parents' nodes
    // (the list names the parent's ranks, not theirs).
    std::vector<mkComm_t> kids(size_t(n), nullptr);
    REQUIRE(mkGroupStart() == mkSuccess);
    for (int r = 0; r < n; ++r) CHECK(mkCommSplit(comms[size_t(r)], r / 2, r, &kids[size_t(r)], nullptr) == mkSuccess);
    REQUIRE_MESSAGE(mkGroupEnd() == mkSuccess, mkGetLastError(nullptr));
    for (int r = 0; r < n; ++r) {
      int nodes = 0;
      CHECK(mkCommNodeCount(kids[size_t(r)], &nodes) == mkSuccess);
      CHECK(nodes == 1);
      CHECK(mk::rt::acquire(kids[size_t(r)])->node_name == std::string(r < 2 ? "node-a" : "node-b"));
    }
    for (mkComm_t c : kids) CHECK(mkCommDestroy(c) == mkSuccess);
    for (mkComm_t c : comms) CHECK(mkCommDestroy(c) == mkSuccess);
  }
  const std::string leaked = mkt::leaks(before, mkt::counts());
  CHECK_MESSAGE(leaked.empty(), leaked);
}

TEST_CASE("MK_HOST_ID listing another number of nodes than the communicator has ranks fails init naming both") {
  MKT_REQUIRE_FAKE();
  mkt::ScopedEnv host("MK_HOST_ID", "node-a,node-b,node-c");
  std::vector<mkComm_t> comms(2, nullptr);
  const std::vector<int> devlist = {0, 0};
  CHECK(mkCommInitAll(comms.data(), 2, devlist.data()) == mkInvalidArgument);
  const std::string e = mkGetLastError(nullptr);
  CHECK_MESSAGE(e.find("MK_HOST_ID") != std::string::npos, e);
  CHECK_MESSAGE(e.find("3 names for a communicator of 2 ranks") != std::string::npos, e);
  mkt::ScopedEnv bad("MK_HOST_ID", "node-a,,node-b");
  CHECK(mkCommInitAll(comms.data(), 2, devlist.data()) == mkInvalidArgument);
  CHECK(std::string(mkGetLastError(nullptr)).find("1..63 characters") != std::string::npos);
}

TEST_CASE("a kernel's error record makes mkCommGetAsyncError report the rank, block and peer") {
  MKT_REQUIRE_FAKE();
  mkt::Device d0(0), d1(1);
  mkt::Buffer a0(d0, 4096), a1(d1, 4096);
  mkComm_t comms[2] = {};
  const int devs[2] = {0, 1};
  REQUIRE_MESSAGE(mkCommInitAll(comms, 2, devs) == mkSuccess, mkGetLastError(nullptr));
  auto allreduce = [&] {
    mkGroupStart();
    mkAllReduce(a0.ptr(), a0.ptr(), 64, mkFloat32, mkSum, comms[0], d0.stream);
    mkAllReduce(a1.ptr(), a1.ptr(), 64, mkFloat32, mkSum, comms[1], d1.stream);
    return mkGroupEnd();
  };
  REQUIRE(allreduce() == mkSuccess);
  mkResult_t async = mkInternalError;
  REQUIRE(mkCommGetAsyncError(comms[1], &async) == mkSuccess);
  CHECK(async == mkSuccess);
  // Only rank 1's launch fails: a group launches in call order, rank 1 first here.
  mk::dev::ErrorRecord rec{};
  rec.code = mk::dev::kErrWaitTimeout;
  rec.rank = 1;
  rec.tb = 3;
  rec.slot = 1;
  rec.peer = 0;
  rec.step = 7;
  rec.have = 5;
  rec.want = 6;
  rec.waited_ns = 2000000000;
  rec.op = 1;  // the IR op the block was at: the message quotes its line of the generated source
  auto inject = mkt::require_fn<decltype(mkfake_inject_record)>("mkfake_inject_record");
  mkGroupStart();
  mkAllReduce(a1.ptr(), a1.ptr(), 64, mkFloat32, mkSum, comms[1], d1.stream);
  mkAllReduce(a0.ptr(), a0.ptr(), 64, mkFloat32, mkSum, comms[0], d0.stream);
  inject(1, &rec);
  REQUIRE(mkGroupEnd() == mkSuccess);
  CHECK(mkt::last_launch().args.rank == 0);
  REQUIRE(mkCommGetAsyncError(comms[0], &async) == mkSuccess);
  CHECK(async == mkSuccess);
  REQUIRE(mkCommGetAsyncError(comms[1], &async) == mkSuccess);
  CHECK(async == mkRemoteError);
  const std::string msg = mkGetLastError(comms[1]);
  CHECK_MESSAGE(msg.find("rank 1:") != std::string::npos, msg);
  CHECK_MESSAGE(msg.find("thread block 3") != std::string::npos, msg);
  CHECK_MESSAGE(msg.find("from rank 0") != std::string::npos, msg);
  CHECK_MESSAGE(msg.find("step 7") != std::string::npos, msg);
  CHECK_MESSAGE(msg.find("at op `%1 copy r1.in[0]") != std::string::npos, msg);
  CHECK_MESSAGE(msg.find("allreduce_one_shot.cpp:") != std::string::npos, msg);
  // Sticky: the next call on that communicator fails with the same error.
  CHECK(mkAllReduce(a1.ptr(), a1.ptr(), 64, mkFloat32, mkSum, comms[1], d1.stream) == mkRemoteError);
  CHECK(mkCommDestroy(comms[0]) == mkSuccess);
  CHECK(mkCommDestroy(comms[1]) == mkSuccess);
}

TEST_CASE("a one-pass kernel launched for more steps than one stops at entry, and says the plan does not fit") {
  MKT_REQUIRE_FAKE();
  mkt::Device d0(0);
  mkt::Buffer a0(d0, 4096);
  mkComm_t comm = mkt::one_rank();
  mk::dev::ErrorRecord rec{};
  rec.code = mk::dev::kErrOnePassSteps;  // what templates/kernel.cuh writes (Ctx's constructor)
  rec.slot = -1;
  rec.peer = -1;
  rec.op = -1;
  rec.have = 3;
  rec.want = 1;
  auto inject = mkt::require_fn<decltype(mkfake_inject_record)>("mkfake_inject_record");
  inject(1, &rec);
  REQUIRE(mkAllReduce(a0.ptr(), a0.ptr(), 64, mkFloat32, mkSum, comm, d0.stream) == mkSuccess);
  mkResult_t async = mkSuccess;
  REQUIRE(mkCommGetAsyncError(comm, &async) == mkSuccess);
  CHECK(async == mkInvalidUsage);
  const std::string msg = mkGetLastError(comm);
  CHECK_MESSAGE(msg.find("one-pass kernel") != std::string::npos, msg);
  CHECK_MESSAGE(msg.find("needs 3 steps") != std::string::npos, msg);
  CHECK(mkCommDestroy(comm) == mkSuccess);
}

TEST_CASE("a hung kernel ends when mkCommAbort raises the abort word") {
  MKT_REQUIRE_FAKE();
  auto running = mkt::require_fn<decltype(mkfake_running)>("mkfake_running");
  mkt::Device dev(0);
  mkt::Buffer buf(dev, 4096);
  mkComm_t comm = mkt::one_rank();
  mkt::launch_hung(comm, dev.stream, buf.ptr());
  CHECK(running() == 1);
  CHECK(cu().cuStreamQuery(dev.stream) == CUDA_ERROR_NOT_READY);
  CHECK(mkCommAbort(comm) == mkSuccess);  // returns only once the kernel ended
  CHECK(running() == 0);
  CHECK(cu().cuStreamQuery(dev.stream) == CUDA_SUCCESS);
}

TEST_CASE("mkCommPrewarm: bad arguments are mkInvalidArgument with a message, a valid call compiles and launches nothing") {
  MKT_REQUIRE_FAKE();
  mkt::Device dev(0);
  mkComm_t comm = mkt::one_rank();
  const mkDataType_t f32[] = {mkFloat32};
  const mkRedOp_t sum[] = {mkSum};
  const mkDataType_t bad_dt[] = {mkDataType_t(12)};
  const mkRedOp_t bad_op[] = {mkRedOp_t(-1)};
  CHECK(mkCommPrewarm(comm, nullptr, 1, sum, 1, 0) == mkInvalidArgument);
  CHECK(std::string(mkGetLastError(comm)).find("dtypes or ops is NULL") != std::string::npos);
  CHECK(mkCommPrewarm(comm, f32, -1, sum, 1, 0) == mkInvalidArgument);
  CHECK(mkCommPrewarm(comm, bad_dt, 1, sum, 1, 0) == mkInvalidArgument);
  CHECK(std::string(mkGetLastError(comm)).find("datatype 12 is not an mkDataType_t") != std::string::npos);
  CHECK(mkCommPrewarm(comm, f32, 1, bad_op, 1, 0) == mkInvalidArgument);
  CHECK(mkCommPrewarm(nullptr, f32, 1, sum, 1, 0) != mkSuccess);
  const int64_t launches = mkt::counts().launches;
  REQUIRE_MESSAGE(mkCommPrewarm(comm, f32, 1, sum, 1, 2) == mkSuccess, mkGetLastError(comm));
  CHECK(mkt::counts().launches == launches);  // plans only: no kernel runs, no peer is needed
  // errors of prewarm are not sticky: the communicator still works
  mkt::Buffer in(dev, 4096), out(dev, 4096);
  CHECK(mkAllReduce(in.ptr(), out.ptr(), 256, mkFloat32, mkSum, comm, dev.stream) == mkSuccess);
  CHECK(mkCommDestroy(comm) == mkSuccess);
}

// Lamport kernels (fp32, bf16: one-pass all-reduce at this size) share their
// scratch whatever the dtype (each launch leaves it at rest), while the LL
// kernel of the same schedule (int32) gets a region of its own: its packets
// would look like data that arrived (compiler/plan resource_key).
TEST_CASE("Lamport kernels of two dtypes share scratch, an LL kernel of the same schedule gets its own") {
  MKT_REQUIRE_FAKE();
  const std::vector<int> devlist = {0, 1};
  std::vector<std::unique_ptr<mkt::Device>> devs;
  std::vector<std::unique_ptr<mkt::Buffer>> buf;
  for (int d : devlist) {
    devs.push_back(std::make_unique<mkt::Device>(d));
    buf.push_back(std::make_unique<mkt::Buffer>(*devs.back(), 4096));
  }
  std::vector<mkComm_t> comms(2, nullptr);
  REQUIRE_MESSAGE(mkCommInitAll(comms.data(), 2, devlist.data()) == mkSuccess, mkGetLastError(nullptr));
  auto scratch_of = [&](mkDataType_t t) {
    REQUIRE(mkGroupStart() == mkSuccess);
    for (int r = 0; r < 2; ++r)
      CHECK(mkAllReduce(buf[size_t(r)]->ptr(), buf[size_t(r)]->ptr(), 128, t, mkSum, comms[size_t(r)],
                        devs[size_t(r)]->stream) == mkSuccess);
    REQUIRE_MESSAGE(mkGroupEnd() == mkSuccess, mkGetLastError(nullptr));
    const mkfake_launch l = mkt::last_launch();  // rank 1's
    CUdeviceptr sp = 0;
    REQUIRE(MKT_FN(cuMemcpyDtoH)(&sp, CUdeviceptr(reinterpret_cast<uintptr_t>(l.args.scratch + 1)), sizeof sp) ==
            CUDA_SUCCESS);
    return sp;
  };
  const CUdeviceptr bf16 = scratch_of(mkBfloat16), fp32 = scratch_of(mkFloat32), i32 = scratch_of(mkInt32);
  CHECK(bf16 != 0);
  CHECK(fp32 == bf16);
  CHECK(i32 != bf16);
  CHECK(scratch_of(mkFloat64) == i32);  // fp64 keeps LL packets
  for (mkComm_t c : comms) CHECK(mkCommDestroy(c) == mkSuccess);
}

TEST_CASE("PreMulSum ops: a call passes its rank's scalar (by value or device pointer) to a premulsum kernel, and bad "
          "handles, dtypes and scalars are mkInvalidArgument with a message") {
  MKT_REQUIRE_FAKE();
  const mkfake_counts before = mkt::counts();
  {
    mkt::Device dev(0);
    mkt::Buffer in(dev, 16 << 20), out(dev, 16 << 20), scalar(dev, 64);
    mkComm_t comm = mkt::one_rank();
    float half = 0.5f;
    mkRedOp_t op = mkSum;
    REQUIRE_MESSAGE(mkRedOpCreatePreMulSum(&op, &half, mkFloat32, mkScalarHostImmediate, comm) == mkSuccess,
                    mkGetLastError(comm));
    CHECK(int(op) >= int(mkNumOps));  // handles come after the built-in ops, as NCCL's do
    half = 4.0f;  // host-immediate: the value was copied at creation
    REQUIRE_MESSAGE(mkAllReduce(in.ptr(), out.ptr(), 256, mkFloat32, op, comm, dev.stream) == mkSuccess,
                    mkGetLastError(comm));
    mkfake_launch l = mkt::last_launch();
    CHECK(std::string(l.function).find("premulsum") != std::string::npos);
    uint32_t bits = 0;
    const float want = 0.5f;
    std::memcpy(&bits, &want, 4);
    CHECK(uint32_t(l.args.prescale) == bits);
    CHECK(l.args.prescale_ptr == nullptr);
    REQUIRE_MESSAGE(mkReduceScatter(in.ptr(), out.ptr(), 64, mkFloat32, op, comm, dev.stream) == mkSuccess,
                    mkGetLastError(comm));
    CHECK(std::string(mkt::last_launch().function).find("premulsum") != std::string::npos);
    // A plain sum of the same size takes another kernel.
    REQUIRE(mkAllReduce(in.ptr(), out.ptr(), 256, mkFloat32, mkSum, comm, dev.stream) == mkSuccess);
    CHECK(std::string(mkt::last_launch().function).find("premulsum") == std::string::npos);

    // Device residence: the kernel reads the scalar where it lives.
    mkRedOp_t dop = mkSum;
    REQUIRE_MESSAGE(mkRedOpCreatePreMulSum(&dop, scalar.ptr(), mkBfloat16, mkScalarDevice, comm) == mkSuccess,
                    mkGetLastError(comm));
    CHECK(int(dop) > int(op));
    REQUIRE_MESSAGE(mkAllReduce(in.ptr(), out.ptr(), 1000, mkBfloat16, dop, comm, dev.stream) == mkSuccess,
                    mkGetLastError(comm));
    l = mkt::last_launch();
    CHECK(l.args.prescale_ptr == scalar.ptr());
    CHECK(std::string(l.function).find("bf16_premulsum") != std::string::npos);

    auto fails = [&](mkResult_t r, const char* text) {
      CHECK(r == mkInvalidArgument);
      const std::string msg = mkGetLastError(comm);
      CHECK_MESSAGE(msg.find(text) != std::string::npos, msg);
    };
    const int64_t launches = mkt::counts().launches;
    fails(mkAllReduce(in.ptr(), out.ptr(), 256, mkFloat16, op, comm, dev.stream), "created for fp32");
    fails(mkAllReduce(in.ptr(), out.ptr(), 256, mkFloat32, mkRedOp_t(int(mkNumOps) + 100000), comm, dev.stream),
          "neither a built-in");
    fails(mkAllReduce(in.ptr(), out.ptr(), 0, mkFloat32, mkRedOp_t(int(mkNumOps) + 100000), comm, dev.stream),
          "neither a built-in");  // count 0 does nothing, but a bad handle is still an error
    CHECK(mkAllReduce(in.ptr(), out.ptr(), 0, mkFloat32, op, comm, dev.stream) == mkSuccess);
    mkRedOp_t tmp;
    fails(mkRedOpCreatePreMulSum(nullptr, &half, mkFloat32, mkScalarHostImmediate, comm), "op is NULL");
    fails(mkRedOpCreatePreMulSum(&tmp, nullptr, mkFloat32, mkScalarHostImmediate, comm), "scalar is NULL");
    fails(mkRedOpCreatePreMulSum(&tmp, &half, mkDataType_t(99), mkScalarHostImmediate, comm), "not an mkDataType_t");
    fails(mkRedOpCreatePreMulSum(&tmp, &half, mkFloat32, mkScalarResidence_t(7), comm), "residence 7");
    fails(mkRedOpCreatePreMulSum(&tmp, &half, mkFloat32, mkScalarDevice, comm), "not GPU memory");
    fails(mkRedOpCreatePreMulSum(&tmp, static_cast<char*>(scalar.ptr()) + 2, mkFloat32, mkScalarDevice, comm),
          "not aligned");
    fails(mkRedOpDestroy(mkSum, comm), "built-in op");
    REQUIRE(mkRedOpDestroy(op, comm) == mkSuccess);
    fails(mkRedOpDestroy(op, comm), "not a live PreMulSum op");
    fails(mkAllReduce(in.ptr(), out.ptr(), 256, mkFloat32, op, comm, dev.stream), "destroyed");
    CHECK(mkt::counts().launches == launches);  // nothing launched for a bad call
    // A freed handle is never given out again (tests/runtime/test_handles.cpp).
    REQUIRE(mkRedOpCreatePreMulSum(&tmp, &half, mkFloat64, mkScalarHostImmediate, comm) == mkSuccess);
    CHECK(int(tmp) > int(dop));
    CHECK(int(tmp) != int(op));
    CHECK(mkRedOpDestroy(tmp, comm) == mkSuccess);
    CHECK(mkRedOpDestroy(dop, comm) == mkSuccess);
    REQUIRE(mkCommDestroy(comm) == mkSuccess);
  }
  const std::string leaked = mkt::leaks(before, mkt::counts());
  CHECK_MESSAGE(leaked.empty(), leaked);
}

TEST_CASE("C++ API: PreMulSum ops by value and on the device serve typed calls, and are freed with their object") {
  MKT_REQUIRE_FAKE();
  const mkfake_counts before = mkt::counts();
  {
    mkt::Device dev(0);
    mkt::Buffer in(dev, 4096), out(dev, 4096), scalar(dev, 16);
    mk::Communicator comm(mkt::one_rank());
    {
      mk::PreMulSum half = comm.premul_sum(0.5f);
      CHECK(int(half.op()) >= int(mkNumOps));
      comm.all_reduce(static_cast<const float*>(in.ptr()), static_cast<float*>(out.ptr()), 256, half, dev.stream);
      const mkfake_launch l = mkt::last_launch();
      CHECK(std::string(l.function).find("fp32_premulsum") != std::string::npos);
      float got = 0;
      const uint32_t bits = uint32_t(l.args.prescale);
      std::memcpy(&got, &bits, 4);
      CHECK(got == 0.5f);
      mk::PreMulSum dev_scale = comm.premul_sum_device(static_cast<const double*>(scalar.ptr()));
      comm.reduce_scatter(static_cast<const double*>(in.ptr()), static_cast<double*>(out.ptr()), 64, dev_scale,
                          dev.stream);
      CHECK(mkt::last_launch().args.prescale_ptr == scalar.ptr());
      // a typed call in another dtype than the op's: the library's error as an exception
      CHECK_THROWS_AS(comm.all_reduce(static_cast<const double*>(in.ptr()), static_cast<double*>(out.ptr()), 8, half,
                                      dev.stream),
                      mk::RuntimeError);
    }
    // both ops were freed (their handles are never given out again)
    mk::PreMulSum again = comm.premul_sum(int32_t(3));
    CHECK(int(again.op()) > int(mkNumOps) + 1);
  }
  const std::string leaked = mkt::leaks(before, mkt::counts());
  CHECK_MESSAGE(leaked.empty(), leaked);
}

TEST_CASE("mkCommPrewarm with a PreMulSum op compiles premulsum plans, and refuses a handle the communicator never made") {
  MKT_REQUIRE_FAKE();
  mkt::Device dev(0);
  mkt::TempDir tmp("mkt_prewarm_pm");
  const std::string dir = tmp.str();
  mkt::ScopedEnv env("MK_CACHE_DIR", dir);  // read at every compile: this test's plans land here
  mkComm_t comm = mkt::one_rank();
  double two = 2.0;
  mkRedOp_t pm = mkSum;
  REQUIRE(mkRedOpCreatePreMulSum(&pm, &two, mkFloat64, mkScalarHostImmediate, comm) == mkSuccess);
  const mkDataType_t f64[] = {mkFloat64};
  const mkRedOp_t bogus[] = {mkRedOp_t(int(mkNumOps) + 3)};
  CHECK(mkCommPrewarm(comm, f64, 1, bogus, 1, 0) == mkInvalidArgument);
  CHECK(std::string(mkGetLastError(comm)).find("neither a built-in mkRedOp_t nor a PreMulSum op") != std::string::npos);
  const mkRedOp_t ops[] = {pm};
  const int64_t launches = mkt::counts().launches;
  REQUIRE_MESSAGE(mkCommPrewarm(comm, f64, 1, ops, 1, 2) == mkSuccess, mkGetLastError(comm));
  CHECK(mkt::counts().launches == launches);
  int premul_plans = 0;
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(dir) / "plans")) {
    std::ifstream f(e.path() / "plan.json");
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    premul_plans += text.find("\"premulsum\"") != std::string::npos;
  }
  // all-reduce, reduce-scatter, reduce at least (the collectives that do not
  // reduce have one byte plan for every type and op, which an earlier test of
  // this process may have compiled already)
  CHECK(premul_plans >= 2);
  CHECK(mkRedOpDestroy(pm, comm) == mkSuccess);
  CHECK(mkCommDestroy(comm) == mkSuccess);
}

// Collectives that only move data run one plan per element size (as NCCL
// moves bytes): fp32 and int32 calls launch the same uint32 kernel, bf16 and
// fp16 the same fp16 one, counted in their elements, odd counts included; a
// plan compiled for the call's own type in MK_PLAN_DIR still serves that type.
TEST_CASE("all-gather, broadcast and all-to-all run one plan per element size, whatever the type") {
  MKT_REQUIRE_FAKE();
  mkt::Device dev(0);
  mkt::Buffer in(dev, 1 << 16), out(dev, 1 << 16);
  mkComm_t comm = mkt::one_rank();
  struct Call {
    mkDataType_t t;
    size_t count;
    const char* kernel;  // the type in the kernel's name
  };
  for (const Call c : {Call{mkFloat32, 256, "_uint32_"}, Call{mkInt32, 5, "_uint32_"}, Call{mkInt64, 100, "_uint64_"},
                       Call{mkFloat64, 3, "_uint64_"}, Call{mkBfloat16, 3, "_fp16_"}, Call{mkFloat16, 1000, "_fp16_"},
                       Call{mkInt8, 7, "_uint8_"}}) {
    CAPTURE(c.count);
    CAPTURE(c.kernel);
    REQUIRE_MESSAGE(mkAllGather(in.ptr(), out.ptr(), c.count, c.t, comm, dev.stream) == mkSuccess, mkGetLastError(comm));
    CHECK(std::string(mkt::last_launch().function).find(c.kernel) != std::string::npos);
    CHECK(mkt::last_launch().args.count == int64_t(c.count));
    REQUIRE(mkBroadcast(in.ptr(), out.ptr(), c.count, c.t, 0, comm, dev.stream) == mkSuccess);
    CHECK(std::string(mkt::last_launch().function).find(c.kernel) != std::string::npos);
    CHECK(mkt::last_launch().args.count == int64_t(c.count));
    REQUIRE(mkAllToAll(in.ptr(), out.ptr(), c.count, c.t, comm, dev.stream) == mkSuccess);
    CHECK(std::string(mkt::last_launch().function).find(c.kernel) != std::string::npos);
    CHECK(mkt::last_launch().args.count == int64_t(c.count));
  }
  // the call's alignment is still its own type's
  CHECK(mkAllGather(static_cast<char*>(in.ptr()) + 2, out.ptr(), 4, mkFloat32, comm, dev.stream) == mkInvalidArgument);
  CHECK(mkCommDestroy(comm) == mkSuccess);

  // MK_PLAN_DIR: an all-gather plan compiled for fp32 serves fp32 calls;
  // int32 (the same size) and bf16 calls get their size's plan
  mkt::TempDir plans("mkt_size_plan_dir");
  mk::compiler::CompileOptions o;
  o.dtype = mk::DType::fp32;
  mk::plan::write_dir(mk::compiler::compile_plan(mk::dsl::build(*mk::dsl::find_schedule("allgather.direct"), 1, 0), o),
                      (plans.path / "ag").string());
  mkt::ScopedEnv dir("MK_PLAN_DIR", plans.str());
  mkt::ScopedEnv algo("MK_ALGO", "allgather=allgather.direct");
  comm = mkt::one_rank();
  REQUIRE_MESSAGE(mkAllGather(in.ptr(), out.ptr(), 256, mkFloat32, comm, dev.stream) == mkSuccess, mkGetLastError(comm));
  CHECK(std::string(mkt::last_launch().function).find("_fp32_") != std::string::npos);
  CHECK(mkt::last_launch().args.count == 256);
  REQUIRE_MESSAGE(mkAllGather(in.ptr(), out.ptr(), 9, mkInt32, comm, dev.stream) == mkSuccess, mkGetLastError(comm));
  CHECK(std::string(mkt::last_launch().function).find("_uint32_") != std::string::npos);
  CHECK(mkt::last_launch().args.count == 9);
  REQUIRE_MESSAGE(mkAllGather(in.ptr(), out.ptr(), 3, mkBfloat16, comm, dev.stream) == mkSuccess, mkGetLastError(comm));
  CHECK(std::string(mkt::last_launch().function).find("_fp16_") != std::string::npos);
  CHECK(mkt::last_launch().args.count == 3);
  CHECK(mkCommDestroy(comm) == mkSuccess);
}
