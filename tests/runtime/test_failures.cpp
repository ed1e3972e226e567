// Driver failures injected by the fake: clear errors, nothing half-made.
#include <string>

#include "tests/runtime/fake.hpp"

namespace {

// Fails the nth next call of `fn` for the scope.
struct FailNext {
  FailNext(const char* fn, int nth) { mkt::require_fn<decltype(mkfake_fail)>("mkfake_fail")(fn, nth, 0); }
  ~FailNext() { mkt::require_fn<decltype(mkfake_fail)>("mkfake_fail")(nullptr, 0, 0); }
};

}  // namespace

TEST_CASE("cuMemCreate failing: mkCommInitRank says symmetric memory, leaves comm NULL and leaks nothing") {
  MKT_REQUIRE_FAKE();
  mkt::Device dev(0);
  const mkfake_counts before = mkt::counts();
  mkUniqueId id;
  REQUIRE(mkGetUniqueId(&id) == mkSuccess);
  mkComm_t comm = reinterpret_cast<mkComm_t>(&id);  // must be overwritten
  {
    FailNext f("cuMemCreate", 1);
    CHECK(mkCommInitRank(&comm, 1, id, 0) == mkUnhandledCudaError);
  }
  CHECK(comm == nullptr);
  const std::string msg = mkGetLastError(nullptr);
  CHECK_MESSAGE(msg.find("symmetric memory") != std::string::npos, msg);
  CHECK_MESSAGE(msg.find("CUDA_ERROR_OUT_OF_MEMORY") != std::string::npos, msg);
  const std::string leaked = mkt::leaks(before, mkt::counts());
  CHECK_MESSAGE(leaked.empty(), leaked);
}

TEST_CASE("cuModuleLoadData failing: the first all-reduce fails clearly, the next one works") {
  MKT_REQUIRE_FAKE();
  const mkfake_counts before = mkt::counts();
  {
    mkt::Device dev(0);
    mkt::Buffer buf(dev, 4096);
    mkComm_t comm = mkt::one_rank();
    const int64_t launches = mkt::counts().launches;
    {
      FailNext f("cuModuleLoadData", 1);
      CHECK(mkAllReduce(buf.ptr(), buf.ptr(), 64, mkFloat32, mkSum, comm, dev.stream) == mkUnhandledCudaError);
    }
    const std::string msg = mkGetLastError(comm);
    CHECK_MESSAGE(msg.find("loading the kernel of plan allreduce") != std::string::npos, msg);
    CHECK_MESSAGE(msg.find("CUDA_ERROR_OUT_OF_MEMORY") != std::string::npos, msg);
    CHECK(mkt::counts().launches == launches);
    CHECK(mkt::counts().modules == before.modules);  // nothing half-loaded
    CHECK_MESSAGE(mkAllReduce(buf.ptr(), buf.ptr(), 64, mkFloat32, mkSum, comm, dev.stream) == mkSuccess,
                  mkGetLastError(comm));
    CHECK(mkt::counts().launches == launches + 1);
    CHECK(mkCommDestroy(comm) == mkSuccess);
  }
  const std::string leaked = mkt::leaks(before, mkt::counts());
  CHECK_MESSAGE(leaked.empty(), leaked);
}

TEST_CASE("MKFAKE_FAIL-style rules count calls from the rule on, per function") {
  MKT_REQUIRE_FAKE();
  mkt::Device dev(0);
  FailNext f("cuMemAlloc", 2);
  CUdeviceptr a = 0, b = 0, c = 0;
  CHECK(mkt::cu().cuMemAlloc(&a, 64) == CUDA_SUCCESS);
  CHECK(mkt::cu().cuMemAlloc(&b, 64) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(mkt::cu().cuMemAlloc(&c, 64) == CUDA_SUCCESS);
  CHECK(mkt::cu().cuMemFree(a) == CUDA_SUCCESS);
  CHECK(mkt::cu().cuMemFree(c) == CUDA_SUCCESS);
}
