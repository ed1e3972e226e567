// Composites (include/mk/composite.hpp) through the real host runtime and the
// fake driver: mkCompositeRun runs a composite's stages as one group kernel
// whatever MK_GROUP_FUSE says, each stage with its own arguments, the stages
// that depend on each other on one lane; bad calls fail whole, naming the
// stage, and launch nothing.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "mk.h"
#include "mk/composite.hpp"
#include "tests/runtime/fake.hpp"

namespace {

bool is_group(const mkfake_launch& l) { return std::string(l.function).rfind("mk_group_", 0) == 0; }

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Composites of this test binary (registered into the library's registry as a
// user's plugin would be).
void test_bad_schedule(mk::dsl::Composite& c) {
  const int a = c.buffer("a"), b = c.buffer("b");
  c.all_reduce(a, b, "allgather.ring");  // an all-gather schedule for an all-reduce stage
}
MK_COMPOSITE("test.bad_schedule", test_bad_schedule, "names a schedule of another collective");

void test_three(mk::dsl::Composite& c) {
  const int x = c.buffer("x"), y = c.buffer("y"), z = c.buffer("z");
  c.all_reduce(x, y);
  c.broadcast(y, z, c.ranks() - 1);
  c.all_reduce(z, z);  // in place
}
MK_COMPOSITE("test.three", test_three, "all-reduce, broadcast of its result, all-reduce in place");

}  // namespace

TEST_CASE("mkCompositeRun: dependent stages chain on one lane of one group kernel, independent ones side by side, "
          "each with its own arguments, with MK_GROUP_FUSE unset") {
  MKT_REQUIRE_FAKE();
  unsetenv("MK_GROUP_FUSE");
  const mkfake_counts before = mkt::counts();
  {
    mkt::Device dev(0);
    const size_t n = 4096;  // fp32 elements per block
    mkt::Buffer in(dev, n * 4), shard(dev, n * 4), out(dev, n * 4), p(dev, n * 4);
    mkComm_t comm = mkt::one_rank();
    // the stages alone, for their grids
    REQUIRE(mkReduceScatter(in.ptr(), shard.ptr(), n, mkFloat32, mkSum, comm, dev.stream) == mkSuccess);
    const mkfake_launch rs = mkt::last_launch();
    REQUIRE(mkAllGather(shard.ptr(), out.ptr(), n, mkFloat32, comm, dev.stream) == mkSuccess);
    const mkfake_launch ag = mkt::last_launch();

    // reduce-scatter, then an all-gather of its output: one lane
    void* bufs[3] = {in.ptr(), shard.ptr(), out.ptr()};
    int64_t launches = mkt::counts().launches;
    REQUIRE_MESSAGE(mkCompositeRun("composite.reduce_scatter_all_gather", bufs, 3, n, mkFloat32, mkSum, comm,
                                   dev.stream) == mkSuccess,
                    mkGetLastError(comm));
    CHECK(mkt::counts().launches == launches + 1);
    mkfake_launch l = mkt::last_launch();
    REQUIRE_MESSAGE(is_group(l), l.function);
    REQUIRE(l.members == 2);
    CHECK(l.member[0].input == in.ptr());
    CHECK(l.member[0].output == shard.ptr());
    CHECK(l.member[1].input == shard.ptr());
    CHECK(l.member[1].output == out.ptr());
    CHECK(l.member[0].count == int64_t(n));
    CHECK(l.member[1].count == int64_t(n));
    CHECK(l.grid[0] == std::max(rs.grid[0], ag.grid[0]));

    // zero_step: independent stages, two lanes side by side
    void* z[4] = {in.ptr(), shard.ptr(), p.ptr(), out.ptr()};
    launches = mkt::counts().launches;
    REQUIRE_MESSAGE(mkCompositeRun("composite.zero_step", z, 4, n, mkFloat32, mkSum, comm, dev.stream) == mkSuccess,
                    mkGetLastError(comm));
    CHECK(mkt::counts().launches == launches + 1);
    l = mkt::last_launch();
    REQUIRE(is_group(l));
    REQUIRE(l.members == 2);
    CHECK(l.member[1].input == p.ptr());
    CHECK(l.member[1].output == out.ptr());
    if (l.member[0].flags != l.member[1].flags)  // other resources: a lane each
      CHECK(l.grid[0] == rs.grid[0] + ag.grid[0]);

    // three stages, each reading what the one before wrote: one lane
    void* t[3] = {in.ptr(), shard.ptr(), out.ptr()};
    REQUIRE_MESSAGE(mkCompositeRun("test.three", t, 3, n, mkFloat32, mkMax, comm, dev.stream) == mkSuccess,
                    mkGetLastError(comm));
    l = mkt::last_launch();
    REQUIRE(is_group(l));
    REQUIRE(l.members == 3);
    CHECK(l.member[2].input == out.ptr());
    CHECK(l.member[2].output == out.ptr());

    // inside the caller's group: the stages join it
    launches = mkt::counts().launches;
    REQUIRE(mkGroupStart() == mkSuccess);
    REQUIRE(mkCompositeRun("composite.reduce_scatter_all_gather", bufs, 3, n, mkFloat32, mkSum, comm, dev.stream) ==
            mkSuccess);
    CHECK(mkt::counts().launches == launches);  // nothing before mkGroupEnd
    REQUIRE(mkAllReduce(p.ptr(), p.ptr(), n, mkFloat32, mkSum, comm, dev.stream) == mkSuccess);
    REQUIRE_MESSAGE(mkGroupEnd() == mkSuccess, mkGetLastError(comm));
    CHECK(mkt::counts().launches == launches + 1);
    CHECK(mkt::last_launch().members == 3);

    // count 0: nothing to do
    launches = mkt::counts().launches;
    CHECK(mkCompositeRun("composite.reduce_scatter_all_gather", bufs, 3, 0, mkFloat32, mkSum, comm, dev.stream) ==
          mkSuccess);
    CHECK(mkt::counts().launches == launches);
    REQUIRE(mkCommDestroy(comm) == mkSuccess);
  }
  const std::string leak = mkt::leaks(before, mkt::counts());
  CHECK_MESSAGE(leak.empty(), leak);
}

TEST_CASE("mkCompositeRun: unknown names, wrong buffers, bad schedules and a failing stage are errors that launch "
          "nothing and leave the communicator usable") {
  MKT_REQUIRE_FAKE();
  mkt::Device dev(0);
  const size_t n = 1024;
  mkt::Buffer a(dev, n * 4), b(dev, n * 4), c(dev, n * 4);
  mkComm_t comm = mkt::one_rank();
  void* bufs[3] = {a.ptr(), b.ptr(), c.ptr()};
  const int64_t launches = mkt::counts().launches;
  auto run = [&](const char* name, void* const* v, int nv) {
    return mkCompositeRun(name, v, nv, n, mkFloat32, mkSum, comm, dev.stream);
  };
  CHECK(run(nullptr, bufs, 3) == mkInvalidArgument);
  CHECK(has(mkGetLastError(comm), "name is NULL"));
  CHECK(run("no.such.composite", bufs, 3) == mkInvalidArgument);
  CHECK_MESSAGE((has(mkGetLastError(comm), "no composite named 'no.such.composite'") &&
                    has(mkGetLastError(comm), "composite.zero_step")),
                mkGetLastError(comm));
  CHECK(run("composite.reduce_scatter_all_gather", bufs, 2) == mkInvalidArgument);
  CHECK_MESSAGE((has(mkGetLastError(comm), "2 buffer(s) given") && has(mkGetLastError(comm), "in, shard, out")),
                mkGetLastError(comm));
  CHECK(run("composite.reduce_scatter_all_gather", nullptr, 3) == mkInvalidArgument);
  void* null_mid[3] = {a.ptr(), nullptr, c.ptr()};
  CHECK(run("composite.reduce_scatter_all_gather", null_mid, 3) == mkInvalidArgument);
  CHECK_MESSAGE(has(mkGetLastError(comm), "buffer 1 ('shard') is NULL"), mkGetLastError(comm));
  // a composite naming a schedule of another collective: mk.dsl.E010
  CHECK(run("test.bad_schedule", bufs, 2) == mkInvalidArgument);
  CHECK_MESSAGE((has(mkGetLastError(comm), "mk.dsl.E010") && has(mkGetLastError(comm), "allgather.ring")),
                mkGetLastError(comm));
  // a stage whose buffer is host memory: the error names the stage
  std::vector<float> host(n);
  void* bad[3] = {a.ptr(), host.data(), c.ptr()};
  CHECK(run("composite.reduce_scatter_all_gather", bad, 3) == mkInvalidArgument);
  CHECK_MESSAGE(has(mkGetLastError(comm), "stage 0 (reducescatter 'in' -> 'shard')"), mkGetLastError(comm));
  CHECK(mkt::counts().launches == launches);
  // ... and inside a group, the group fails whole
  REQUIRE(mkGroupStart() == mkSuccess);
  CHECK(mkAllReduce(a.ptr(), a.ptr(), n, mkFloat32, mkSum, comm, dev.stream) == mkSuccess);
  CHECK(run("composite.reduce_scatter_all_gather", bad, 3) == mkInvalidArgument);
  CHECK(mkGroupEnd() != mkSuccess);
  CHECK(mkt::counts().launches == launches);
  // still usable
  CHECK_MESSAGE(run("composite.reduce_scatter_all_gather", bufs, 3) == mkSuccess, mkGetLastError(comm));
  CHECK(mkt::counts().launches == launches + 1);
  REQUIRE(mkCommDestroy(comm) == mkSuccess);
}
