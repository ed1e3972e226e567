// Handles stay dead: a destroyed communicator's handle, a destroyed PreMulSum
// op and a deregistered buffer's handle fail with mkInvalidArgument forever,
// even when a new object takes the old one's memory (or the same buffer is
// registered again). Against the fake driver.
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "mk.h"
#include "tests/runtime/fake.hpp"

using mkt::one_rank;

TEST_CASE("a destroyed communicator's handle fails forever, whatever reuses its memory") {
  MKT_REQUIRE_FAKE();
  mkt::Device dev(0);
  std::vector<mkComm_t> dead;
  std::set<mkComm_t> seen;
  for (int i = 0; i < 8; ++i) {
    mkComm_t c = one_rank();
    REQUIRE(c);
    CHECK(seen.insert(c).second);  // never a handle given before (the old one was the Comm's address)
    for (mkComm_t d : dead) {
      int n = -1;
      CHECK(mkCommCount(d, &n) == mkInvalidArgument);
      CHECK(n == -1);
      CHECK(mkCommDestroy(d) == mkInvalidArgument);
      CHECK(mkCommAbort(d) == mkInvalidArgument);
    }
    int n = 0;
    CHECK(mkCommCount(c, &n) == mkSuccess);  // the live one was not destroyed by a stale destroy
    CHECK(n == 1);
    if (i % 2) {
      CHECK(mkCommDestroy(c) == mkSuccess);
    } else {
      CHECK(mkCommAbort(c) == mkSuccess);
    }
    dead.push_back(c);
  }
  const std::string err = mkGetLastError(nullptr);
  CHECK(err.find("invalid communicator") != std::string::npos);
}

TEST_CASE("a destroyed PreMulSum op, or one of another communicator, fails forever") {
  MKT_REQUIRE_FAKE();
  mkt::Device dev(0);
  mkt::Buffer buf(dev, 1 << 16);
  mkComm_t a = one_rank(), b = one_rank();
  float s = 0.5f;
  mkRedOp_t op1{}, op2{}, opb{};
  REQUIRE(mkRedOpCreatePreMulSum(&op1, &s, mkFloat32, mkScalarHostImmediate, a) == mkSuccess);
  REQUIRE(mkRedOpDestroy(op1, a) == mkSuccess);
  REQUIRE(mkRedOpCreatePreMulSum(&op2, &s, mkFloat32, mkScalarHostImmediate, a) == mkSuccess);
  CHECK(op2 != op1);  // the freed slot is not handed out again
  CHECK(mkAllReduce(buf.ptr(), buf.ptr(), 64, mkFloat32, op1, a, dev.stream) == mkInvalidArgument);
  CHECK(mkRedOpDestroy(op1, a) == mkInvalidArgument);
  // b's first op is not a's: neither answers on the other communicator
  REQUIRE(mkRedOpCreatePreMulSum(&opb, &s, mkFloat32, mkScalarHostImmediate, b) == mkSuccess);
  CHECK(opb != op2);
  CHECK(mkAllReduce(buf.ptr(), buf.ptr(), 64, mkFloat32, op2, b, dev.stream) == mkInvalidArgument);
  CHECK(mkRedOpDestroy(op2, b) == mkInvalidArgument);
  CHECK(mkRedOpDestroy(op2, a) == mkSuccess);
  CHECK(mkRedOpDestroy(opb, b) == mkSuccess);
  CHECK(mkCommDestroy(a) == mkSuccess);
  CHECK(mkCommDestroy(b) == mkSuccess);
}

TEST_CASE("a deregistered buffer's handle fails forever, also when the buffer is registered again") {
  MKT_REQUIRE_FAKE();
  mkt::Device dev(0);
  mkt::Buffer buf(dev, 1 << 20);
  mkComm_t c = one_rank();
  void* h1 = nullptr;
  void* h2 = nullptr;
  REQUIRE(mkCommRegister(c, buf.ptr(), 1 << 20, &h1) == mkSuccess);
  CHECK(h1 != buf.ptr());  // a token, not the address
  REQUIRE(mkCommDeregister(c, h1) == mkSuccess);
  REQUIRE(mkCommRegister(c, buf.ptr(), 1 << 20, &h2) == mkSuccess);
  CHECK(h2 != h1);
  CHECK(mkCommDeregister(c, h1) == mkInvalidArgument);  // stale: h2's registration stays
  CHECK(mkCommDeregister(c, buf.ptr()) == mkInvalidArgument);  // the address is no handle
  CHECK(mkCommDeregister(c, h2) == mkSuccess);
  CHECK(mkCommDeregister(c, h2) == mkInvalidArgument);
  CHECK(mkCommDestroy(c) == mkSuccess);
}
