// mkAllReduceFused through the real host runtime and the fake driver: the
// call's fusion reaches the kernel's arguments, fused calls take fused
// kernels (never zero-copy), and every bad argument is mkInvalidArgument
// with a message, launching nothing.
#include <cstring>
#include <string>

#include "mk/fusion.hpp"
#include "mk/mk.hpp"
#include "tests/runtime/fake.hpp"

// A user fusion whose threads race (each reads the element the next thread
// writes): the fusion checker refuses it before its first use.
MK_EPILOGUE(rt_race,
  struct Epi {
    template <class R>
    MK_DEV static void row(R& r) {
      for (int i = r.first(); i < r.n; i += r.step()) r.set_out(i, r.out(i + 1 < r.n ? i + 1 : i));
    }
  };
)
MK_FUSION(rt_race, "test.rt_race", "out[i] = out[i + 1]", ({}), ({}), mk::dsl::RowMode::given);

// y = out + residual; out = y * gate: y may share the residual's buffer (read
// first), not the gate's (read after y is written).
MK_EPILOGUE(rt_gated,
  struct Epi {
    template <class R>
    MK_DEV static void row(R& r) {
      for (int i = r.first(); i < r.n; i += r.step()) {
        const typename R::C y = r.out(i) + r.ld(0, i);
        r.st(2, i, y);
        r.set_out(i, y * r.ld(1, i));
      }
    }
  };
)
MK_FUSION(rt_gated, "test.rt_gated", "y = out + residual; out = y * gate",
          ({{"residual", mk::dsl::Shape::elem, false}, {"gate", mk::dsl::Shape::elem, false},
            {"y", mk::dsl::Shape::elem, true}}),
          ({}), mk::dsl::RowMode::any);

TEST_CASE("mkAllReduceFused: the fusion's operands, scalars and row reach a fused kernel, bad fusions, rows, operands "
          "and overlaps are mkInvalidArgument with a message") {
  MKT_REQUIRE_FAKE();
  const mkfake_counts before = mkt::counts();
  {
    mkt::Device dev(0);
    const size_t hidden = 1024, tokens = 4, count = hidden * tokens;
    mkt::Buffer in(dev, count * 2), out(dev, count * 2), res(dev, count * 2 + 64), res_out(dev, count * 2),
        weight(dev, hidden * 2), q(dev, count), scales(dev, tokens * 4);
    mkComm_t comm = mkt::one_rank();
    mkFusion_t f{};
    f.name = "allreduce.rmsnorm";
    f.operands[0] = res.ptr();
    f.operands[1] = res_out.ptr();
    f.operands[2] = weight.ptr();
    f.scalars[0] = 1e-5;
    f.row = int64_t(hidden);
    REQUIRE_MESSAGE(mkAllReduceFused(in.ptr(), out.ptr(), count, mkBfloat16, mkSum, &f, comm, dev.stream) ==
                        mkSuccess,
                    mkGetLastError(comm));
    mkfake_launch l = mkt::last_launch();
    CHECK(std::string(l.function).find("allreduce_rmsnorm") != std::string::npos);
    CHECK(l.args.epi_ops[0] == res.ptr());
    CHECK(l.args.epi_ops[1] == res_out.ptr());
    CHECK(l.args.epi_ops[2] == weight.ptr());
    CHECK(l.args.epi_ops[3] == nullptr);
    CHECK(l.args.epi_scalars[0] == 1e-5);
    CHECK(l.args.epi_row == int64_t(hidden));
    CHECK(l.args.count == int64_t(count));
    // in place, with the residual updated in place (residual_out == residual)
    f.operands[1] = res.ptr();
    REQUIRE_MESSAGE(mkAllReduceFused(out.ptr(), out.ptr(), count, mkBfloat16, mkSum, &f, comm, dev.stream) ==
                        mkSuccess,
                    mkGetLastError(comm));
    CHECK(mkt::last_launch().args.epi_ops[1] == res.ptr());
    // a plain all-reduce of the same size takes an unfused kernel, and NULL is plain
    REQUIRE(mkAllReduce(in.ptr(), out.ptr(), count, mkBfloat16, mkSum, comm, dev.stream) == mkSuccess);
    l = mkt::last_launch();
    CHECK(std::string(l.function).find("rmsnorm") == std::string::npos);
    CHECK(l.args.epi_ops[0] == nullptr);
    REQUIRE(mkAllReduceFused(in.ptr(), out.ptr(), count, mkBfloat16, mkSum, nullptr, comm, dev.stream) == mkSuccess);
    CHECK(std::string(mkt::last_launch().function).find("rmsnorm") == std::string::npos);
    // fp8 rows: operands of their own dtypes
    mkFusion_t g{};
    g.name = "allreduce.fp8_rows";
    g.operands[0] = q.ptr();
    g.operands[1] = scales.ptr();
    g.row = int64_t(hidden);
    REQUIRE_MESSAGE(mkAllReduceFused(in.ptr(), out.ptr(), count, mkFloat16, mkSum, &g, comm, dev.stream) ==
                        mkSuccess,
                    mkGetLastError(comm));
    CHECK(std::string(mkt::last_launch().function).find("fp8_rows") != std::string::npos);

    auto fails = [&](mkResult_t r, const char* text) {
      CHECK(r == mkInvalidArgument);
      const std::string msg = mkGetLastError(comm);
      CHECK_MESSAGE(msg.find(text) != std::string::npos, msg);
    };
    const int64_t launches = mkt::counts().launches;
    f.operands[1] = res_out.ptr();
    auto call = [&](const mkFusion_t& x, size_t n = 4096, mkDataType_t t = mkBfloat16) {
      return mkAllReduceFused(in.ptr(), out.ptr(), n, t, mkSum, &x, comm, dev.stream);
    };
    mkFusion_t b = f;
    b.name = nullptr;
    fails(call(b), "fusion->name is NULL");
    b.name = "no.such.fusion";
    fails(call(b), "unknown fusion 'no.such.fusion'");
    b = f;
    fails(call(b, count, mkInt32), "does not serve int32");
    fails(call(b, count + 1), "not a whole number of rows");
    b.row = 0;
    fails(call(b), "fusion->row");
    b.row = 20000;
    fails(call(b, 20000), "in 1..16384");
    b = f;
    b.operands[2] = nullptr;
    fails(call(b), "operands[2] (weight of fusion allreduce.rmsnorm) is NULL");
    b = f;
    b.operands[4] = weight.ptr();
    fails(call(b), "takes 3 operand(s)");
    b = f;
    b.operands[0] = static_cast<char*>(res.ptr()) + 1;
    fails(call(b), "not aligned");
    b = f;
    b.operands[0] = out.ptr();
    fails(call(b), "overlaps recvbuff");
    b = f;
    b.operands[1] = in.ptr();
    fails(call(b), "overlaps sendbuff");
    b = f;
    b.operands[1] = static_cast<char*>(res.ptr()) + 2;  // overlaps the residual, not exactly
    fails(call(b), "without being the same buffer");
    b = f;
    int host = 0;
    b.operands[2] = &host;
    fails(call(b), "not GPU memory");
    b = f;
    b.operands[1] = res_out.ptr();
    mkt::Buffer small(dev, 64);
    b.operands[1] = small.ptr();
    fails(call(b), "allocation ends");
    // count 0 launches nothing, but a bad fusion is still an error (its operands are not read)
    CHECK(mkAllReduceFused(in.ptr(), out.ptr(), 0, mkBfloat16, mkSum, &b, comm, dev.stream) == mkSuccess);
    b = f;
    b.name = "no.such.fusion";
    fails(mkAllReduceFused(in.ptr(), out.ptr(), 0, mkBfloat16, mkSum, &b, comm, dev.stream), "unknown fusion");
    mkFusion_t empty{};
    empty.name = "allreduce.rmsnorm";
    empty.row = 16;
    CHECK(mkAllReduceFused(in.ptr(), out.ptr(), 0, mkBfloat16, mkSum, &empty, comm, dev.stream) == mkSuccess);
    CHECK(mkt::counts().launches == launches);  // nothing launched for a bad call
    REQUIRE(mkCommDestroy(comm) == mkSuccess);
  }
  const std::string leaked = mkt::leaks(before, mkt::counts());
  CHECK_MESSAGE(leaked.empty(), leaked);
}

TEST_CASE("C++ API: mk::Communicator::all_reduce_fused runs a fused all-reduce of typed buffers") {
  MKT_REQUIRE_FAKE();
  mkt::Device dev(0);
  const size_t hidden = 512, tokens = 2, count = hidden * tokens;
  mkt::Buffer in(dev, count * 4), out(dev, count * 4), res(dev, count * 4), weight(dev, hidden * 4);
  mk::Communicator comm(mkt::one_rank());
  mk::Fusion f("allreduce.rmsnorm", int64_t(hidden));
  f.operand(res.ptr()).operand(res.ptr()).operand(weight.ptr()).scalar(1e-6);
  comm.all_reduce_fused(static_cast<const float*>(in.ptr()), static_cast<float*>(out.ptr()), count, mk::Op::sum, f,
                        dev.stream);
  const mkfake_launch l = mkt::last_launch();
  CHECK(std::string(l.function).find("fp32_sum_allreduce_rmsnorm") != std::string::npos);
  CHECK(l.args.epi_ops[2] == weight.ptr());
  CHECK(l.args.epi_scalars[0] == 1e-6);
  CHECK_THROWS_WITH_AS(comm.all_reduce_fused(static_cast<const float*>(in.ptr()), static_cast<float*>(out.ptr()),
                                             count + 3, mk::Op::sum, f, dev.stream),
                       doctest::Contains("whole number of rows"), mk::RuntimeError);
}

TEST_CASE("mkAllReduceFused: a call of many rows launches the collective without its tail, then the plan's epilogue "
          "kernel on every SM") {
  MKT_REQUIRE_FAKE();
  mkt::Device dev(0);
  const size_t hidden = 16, tokens = 8192, count = hidden * tokens;
  mkt::Buffer in(dev, count * 2), out(dev, count * 2), res(dev, count * 2), weight(dev, hidden * 2);
  mkComm_t comm = mkt::one_rank();
  mkFusion_t f{};
  f.name = "allreduce.rmsnorm";
  f.operands[0] = res.ptr();
  f.operands[1] = res.ptr();
  f.operands[2] = weight.ptr();
  f.row = int64_t(hidden);
  // few rows: one launch, the epilogue in the collective's tail
  const int64_t l0 = mkt::counts().launches;
  REQUIRE_MESSAGE(mkAllReduceFused(in.ptr(), out.ptr(), hidden, mkBfloat16, mkSum, &f, comm, dev.stream) == mkSuccess,
                  mkGetLastError(comm));
  CHECK(mkt::counts().launches == l0 + 1);
  mkfake_launch l = mkt::last_launch();
  CHECK(l.args.epi_mode == 0);
  CHECK(std::string(l.function).find("_epi") == std::string::npos);
  // many rows: two launches; the second is <kernel>_epi with up to 4 blocks per SM
  const int64_t l1 = mkt::counts().launches;
  REQUIRE_MESSAGE(mkAllReduceFused(in.ptr(), out.ptr(), count, mkBfloat16, mkSum, &f, comm, dev.stream) == mkSuccess,
                  mkGetLastError(comm));
  CHECK(mkt::counts().launches == l1 + 2);
  l = mkt::last_launch();
  const std::string fn = l.function;
  CHECK(fn.size() > 4);
  CHECK(fn.substr(fn.size() - 4) == "_epi");
  CHECK(l.args.epi_mode == 1);
  CHECK(l.args.epi_row == int64_t(hidden));
  CHECK(l.grid[0] >= 1);
  CHECK(int64_t(l.grid[0]) <= int64_t(tokens));
  REQUIRE(mkCommDestroy(comm) == mkSuccess);
}

TEST_CASE("mkAllReduceFused: a prologue fusion (allreduce.premulsum) passes each call's scalars to one kernel "
          "launch, never an epilogue kernel, and a PreMulSum op with it is mkInvalidArgument") {
  MKT_REQUIRE_FAKE();
  mkt::Device dev(0);
  const size_t count = size_t(1) << 20;  // many rows of the element-wise default: still one launch
  mkt::Buffer in(dev, count * 2), out(dev, count * 2);
  mkComm_t comm = mkt::one_rank();
  mkFusion_t f{};
  f.name = "allreduce.premulsum";
  f.scalars[0] = 0.75;
  const int64_t l0 = mkt::counts().launches;
  REQUIRE_MESSAGE(mkAllReduceFused(in.ptr(), out.ptr(), count, mkBfloat16, mkSum, &f, comm, dev.stream) == mkSuccess,
                  mkGetLastError(comm));
  CHECK(mkt::counts().launches == l0 + 1);
  mkfake_launch l = mkt::last_launch();
  const std::string fn = l.function;
  CHECK(fn.find("allreduce_premulsum") != std::string::npos);
  CHECK(fn.find("_epi") == std::string::npos);
  CHECK(l.args.epi_scalars[0] == 0.75);
  CHECK(l.args.epi_mode == 0);
  // undeclared scalars reach the kernel as 0, as the simulator has them,
  // whatever the caller left there
  f.scalars[1] = f.scalars[2] = f.scalars[3] = 7.0;
  REQUIRE(mkAllReduceFused(in.ptr(), out.ptr(), count, mkBfloat16, mkSum, &f, comm, dev.stream) == mkSuccess);
  for (int j = 1; j < 4; ++j) CHECK(mkt::last_launch().args.epi_scalars[j] == 0.0);
  CHECK(mkt::last_launch().args.epi_scalars[0] == 0.75);
  // the next call's scalar reaches the same kernel
  f.scalars[0] = -2.5;
  REQUIRE(mkAllReduceFused(in.ptr(), out.ptr(), count, mkBfloat16, mkSum, &f, comm, dev.stream) == mkSuccess);
  CHECK(mkt::last_launch().args.epi_scalars[0] == -2.5);
  CHECK(std::string(mkt::last_launch().function) == fn);
  // operands are the epilogue's: a prologue fusion takes none
  mkFusion_t b = f;
  b.operands[0] = in.ptr();
  CHECK(mkAllReduceFused(in.ptr(), out.ptr(), count, mkBfloat16, mkSum, &b, comm, dev.stream) == mkInvalidArgument);
  CHECK(std::string(mkGetLastError(comm)).find("takes 0 operand(s)") != std::string::npos);
  // PreMulSum is a prologue of its own
  mkRedOp_t op;
  float scalar = 2.0f;
  REQUIRE(mkRedOpCreatePreMulSum(&op, &scalar, mkFloat32, mkScalarHostImmediate, comm) == mkSuccess);
  const int64_t l1 = mkt::counts().launches;
  CHECK(mkAllReduceFused(in.ptr(), out.ptr(), 1024, mkFloat32, op, &f, comm, dev.stream) == mkInvalidArgument);
  CHECK(std::string(mkGetLastError(comm)).find("has a prologue") != std::string::npos);
  CHECK(mkt::counts().launches == l1);
  REQUIRE(mkRedOpDestroy(op, comm) == mkSuccess);
  REQUIRE(mkCommDestroy(comm) == mkSuccess);
}

TEST_CASE("mkAllReduceFused: a fusion the checker refuses is mkInvalidArgument naming the rule, every call, launching "
          "nothing") {
  MKT_REQUIRE_FAKE();
  mkt::Device dev(0);
  const size_t count = 1024;
  mkt::Buffer in(dev, count * 4), out(dev, count * 4);
  mkComm_t comm = mkt::one_rank();
  const int64_t launches = mkt::counts().launches;
  mkFusion_t f{};
  f.name = "test.rt_race";
  f.row = 256;
  for (int k = 0; k < 2; ++k) {
    CHECK(mkAllReduceFused(in.ptr(), out.ptr(), count, mkFloat32, mkSum, &f, comm, dev.stream) == mkInvalidArgument);
    const std::string msg = mkGetLastError(comm);
    CHECK_MESSAGE(msg.find("[mk.verify.E021] fusion test.rt_race") != std::string::npos, msg);
    CHECK_MESSAGE(msg.find("test_fused.cpp") != std::string::npos, msg);  // the fusion's line
  }
  CHECK(mkt::counts().launches == launches);
  REQUIRE(mkCommDestroy(comm) == mkSuccess);
}

TEST_CASE("mkAllReduceFused: one buffer for an output and an input operand only where the fusion's code allows it") {
  MKT_REQUIRE_FAKE();
  mkt::Device dev(0);
  const size_t count = 1024;
  mkt::Buffer in(dev, count * 4), out(dev, count * 4), res(dev, count * 4), gate(dev, count * 4), y(dev, count * 4);
  mkComm_t comm = mkt::one_rank();
  mkFusion_t f{};
  f.name = "test.rt_gated";
  f.operands[0] = res.ptr();
  f.operands[1] = gate.ptr();
  f.operands[2] = res.ptr();  // y == residual: read before written, the same results
  REQUIRE_MESSAGE(mkAllReduceFused(in.ptr(), out.ptr(), count, mkFloat32, mkSum, &f, comm, dev.stream) == mkSuccess,
                  mkGetLastError(comm));
  const int64_t launches = mkt::counts().launches;
  f.operands[2] = gate.ptr();  // y == gate: the gate is read after y is written there
  CHECK(mkAllReduceFused(in.ptr(), out.ptr(), count, mkFloat32, mkSum, &f, comm, dev.stream) == mkInvalidArgument);
  const std::string msg = mkGetLastError(comm);
  CHECK_MESSAGE(msg.find("operands[2] (y) is operands[1] (gate), which fusion test.rt_gated's code does not allow") !=
                    std::string::npos,
                msg);
  CHECK_MESSAGE(msg.find("pass separate buffers") != std::string::npos, msg);
  CHECK(mkt::counts().launches == launches);
  REQUIRE(mkCommDestroy(comm) == mkSuccess);
}
