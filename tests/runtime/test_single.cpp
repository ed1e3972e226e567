// One process: one rank, and ranks of mkCommInitAll.
#include <vector>

#include "tests/runtime/fake.hpp"

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

TEST_CASE("one rank: an all-reduce launches one kernel with the call's arguments; destroy frees everything") {
  MKT_REQUIRE_FAKE();
  const mkfake_counts before = mkt::counts();
  {
    mkt::Device dev(0);
    mkt::Buffer in(dev, 4096), out(dev, 4096);
    mkUniqueId id;
    REQUIRE(mkGetUniqueId(&id) == mkSuccess);
    mkComm_t comm = nullptr;
    REQUIRE_MESSAGE(mkCommInitRank(&comm, 1, id, 0) == mkSuccess, mkGetLastError(nullptr));
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
    REQUIRE(mkCommDestroy(comm) == mkSuccess);
  }
  const std::string leaked = mkt::leaks(before, mkt::counts());
  CHECK_MESSAGE(leaked.empty(), leaked);
}
