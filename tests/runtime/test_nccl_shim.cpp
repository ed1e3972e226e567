// mKernel's NCCL-compatible library (nccl/shim.cpp) against the fake driver
// and a stand-in for the real NCCL (tests/nccl/fake_nccl.cpp, which records
// what reaches it). Each test loads its own copy of the library (a fresh
// state: which real NCCL it found, its settings) through dlopen, as a
// program that LD_PRELOADs it would call it.
#ifdef MKT_SHIM
#include <dlfcn.h>
#include <doctest/doctest.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "nccl.h"
#include "tests/runtime/fake.hpp"
#include "tests/capture.hpp"

namespace fs = std::filesystem;

using mkt::occurrences;
using mkt::stderr_of;

namespace {

// A fresh copy of the library and its functions.
struct Shim {
  explicit Shim(const char* real = MKT_FAKE_NCCL) {
    dir = fs::temp_directory_path() / ("mkt-shim-" + std::to_string(::getpid()) + "-" + std::to_string(seq++));
    fs::create_directories(dir);
    fs::copy_file(MKT_SHIM, dir / "libnccl.so.2");
    setenv("MK_LIBMKERNEL", MKT_LIBMKERNEL, 1);
    setenv("MK_NCCL_LIB", real, 1);
    h = dlopen((dir / "libnccl.so.2").c_str(), RTLD_NOW | RTLD_LOCAL);
    REQUIRE_MESSAGE(h, dlerror());
  }
  ~Shim() {
    std::error_code ec;
    fs::remove_all(dir, ec);  // stays mapped; never dlclosed (its communicators live on)
  }
  template <class F>
  F* fn(const char* name) {
    void* p = dlsym(h, name);
    REQUIRE_MESSAGE(p, name);
    return reinterpret_cast<F*>(p);
  }
  static inline int seq = 0;
  fs::path dir;
  void* h = nullptr;
};
#define SHIM_FN(s, name) (s).fn<decltype(::name)>(#name)

std::string fake_log(bool reset = true) {
  void* h = dlopen(MKT_FAKE_NCCL, RTLD_NOW | RTLD_LOCAL);
  REQUIRE(h);
  auto get = reinterpret_cast<const char* (*)(int)>(dlsym(h, "mkt_fake_nccl_log"));
  REQUIRE(reinterpret_cast<void*>(get) != nullptr);
  return get(reset ? 1 : 0);
}

bool has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

// The functions nccl.h declares (every nccl* name; pnccl* are their twins).
std::vector<std::string> header_functions() {
  std::ifstream in(MKT_NCCL_H);
  REQUIRE(in);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  static const std::regex decl(R"((?:ncclResult_t|const char\*|void)\s+(nccl[A-Z]\w*)\s*\()");
  std::set<std::string> names;
  for (std::sregex_iterator it(text.begin(), text.end(), decl), end; it != end; ++it) names.insert((*it)[1]);
  return {names.begin(), names.end()};
}

// Two ranks in this process on fake GPUs 0 and 1, through the library.
struct Pair {
  explicit Pair(Shim& s) : shim(s) {
    for (int d : {0, 1}) {
      devs.push_back(std::make_unique<mkt::Device>(d));
      bufs.push_back(std::make_unique<mkt::Buffer>(*devs.back(), 4096));
    }
    const int devlist[2] = {0, 1};
    REQUIRE_MESSAGE(SHIM_FN(shim, ncclCommInitAll)(comms, 2, devlist) == ncclSuccess,
                    SHIM_FN(shim, ncclGetLastError)(nullptr));
  }
  ~Pair() {
    for (ncclComm_t c : comms) CHECK(SHIM_FN(shim, ncclCommDestroy)(c) == ncclSuccess);
  }
  // A grouped all-reduce on both ranks; the launches it made on mKernel.
  int64_t allreduce(ncclRedOp_t op = ncclSum, bool with_send = false) {
    const int64_t before = mkt::counts().launches;
    REQUIRE(SHIM_FN(shim, ncclGroupStart)() == ncclSuccess);
    for (int r = 0; r < 2; ++r) {
      void* p = bufs[size_t(r)]->ptr();
      CHECK(SHIM_FN(shim, ncclAllReduce)(p, p, 64, ncclFloat32, op, comms[r], devs[size_t(r)]->stream) == ncclSuccess);
      if (with_send)
        CHECK(SHIM_FN(shim, ncclSend)(p, 16, ncclFloat32, 1 - r, comms[r], devs[size_t(r)]->stream) == ncclSuccess);
    }
    const ncclResult_t e = SHIM_FN(shim, ncclGroupEnd)();
    CHECK_MESSAGE(e == ncclSuccess, SHIM_FN(shim, ncclGetLastError)(nullptr));
    return mkt::counts().launches - before;
  }
  Shim& shim;
  std::vector<std::unique_ptr<mkt::Device>> devs;
  std::vector<std::unique_ptr<mkt::Buffer>> bufs;
  ncclComm_t comms[2] = {nullptr, nullptr};
};

}  // namespace

TEST_CASE("nccl shim: exports every function of nccl.h under its nccl and pnccl names, as NCCL does") {
  const auto names = header_functions();
  REQUIRE(names.size() >= 40);  // NCCL 2.28's nccl.h
  void* shim = dlopen(MKT_SHIM, RTLD_LAZY | RTLD_LOCAL);
  REQUIRE_MESSAGE(shim, dlerror());
  void* real = fs::exists(MKT_REAL_NCCL) ? dlopen(MKT_REAL_NCCL, RTLD_LAZY | RTLD_LOCAL) : nullptr;
  if (!real) MESSAGE("SKIPPED part: no real NCCL at " MKT_REAL_NCCL " to compare with");
  for (const auto& n : names) {
    CAPTURE(n);
    CHECK(dlsym(shim, n.c_str()) != nullptr);
    CHECK(dlsym(shim, ("p" + n).c_str()) != nullptr);
    if (real) {
      CHECK(dlsym(real, n.c_str()) != nullptr);  // the list is NCCL's own
      CHECK(dlsym(real, ("p" + n).c_str()) != nullptr);
    }
  }
  // the library's own dependencies: libc alone (it is preloaded everywhere)
  FILE* p = popen("readelf -d " MKT_SHIM " 2>/dev/null", "r");
  REQUIRE(p);
  std::string out;
  char line[512];
  while (fgets(line, sizeof line, p)) out += line;
  pclose(p);
  if (out.empty()) {
    MESSAGE("SKIPPED part: no readelf");
  } else {
    static const std::regex needed(R"(\(NEEDED\)\s+Shared library: \[([^\]]+)\])");
    for (std::sregex_iterator it(out.begin(), out.end(), needed), end; it != end; ++it) {
      const std::string lib = (*it)[1];
      CAPTURE(lib);
      CHECK((lib == "libc.so.6" || lib == "libdl.so.2" || lib.rfind("ld-linux", 0) == 0));
    }
    CHECK(has(out, "Library soname: [libnccl.so.2]"));
  }
}

TEST_CASE("nccl shim: collectives run on mKernel, sends and fallbacks on the real NCCL, a mixed group split between them") {
  MKT_REQUIRE_FAKE();
  Shim s;
  fake_log();
  int v = 0;
  CHECK(SHIM_FN(s, ncclGetVersion)(&v) == ncclSuccess);
  CHECK(v == 22805);  // the real (stand-in) NCCL's: callers gate features on it
  {
    Pair pair(s);
    CHECK(pair.allreduce() == 2);  // one kernel per rank, on mKernel
    CHECK(fake_log() == "");       // nothing reached NCCL, not even its init
    // A send needs NCCL: in a group with all-reduces, they still run on
    // mKernel (issued first), the sends on NCCL in a group of their own.
    CHECK(pair.allreduce(ncclSum, /*with_send=*/true) == 2);
    const std::string log = fake_log();
    CHECK(has(log, "CommInitAll n=2 first=1 dev0=0\n"));  // the fallback communicators, made once, together
    CHECK(has(log, "GroupStart\nSend comm=1 count=16 peer=1\nSend comm=2 count=16 peer=0\nGroupEnd\n"));
    CHECK_FALSE(has(log, "AllReduce"));
    // A PreMulSum op (one per communicator, each rank its scalar) runs on
    // mKernel too: its kernel scales the rank's input as it reads it.
    ncclRedOp_t op = ncclSum;
    float scale[2] = {0.5f, 0.25f};
    for (int r = 0; r < 2; ++r) {
      CHECK(SHIM_FN(s, ncclRedOpCreatePreMulSum)(&op, &scale[r], ncclFloat32, ncclScalarHostImmediate,
                                                 pair.comms[r]) == ncclSuccess);
      CHECK(int(op) == 5);
    }
    CHECK(pair.allreduce(op) == 2);
    const mkfake_launch l = mkt::last_launch();
    CHECK(std::string(l.function).find("premulsum") != std::string::npos);
    uint32_t bits = 0;
    std::memcpy(&bits, &scale[1], 4);
    CHECK(uint32_t(l.args.prescale) == bits);  // rank 1's own scalar
    CHECK_FALSE(has(fake_log(), "AllReduce"));
    CHECK_FALSE(has(fake_log(), "RedOpCreatePreMulSum"));
    // Another dtype, or an op this communicator never made: refused, as NCCL does.
    void* p = pair.bufs[0]->ptr();
    CHECK(SHIM_FN(s, ncclAllReduce)(p, p, 64, ncclFloat16, op, pair.comms[0], pair.devs[0]->stream) ==
          ncclInvalidArgument);
    CHECK(SHIM_FN(s, ncclAllReduce)(p, p, 64, ncclFloat32, ncclRedOp_t(9), pair.comms[0], pair.devs[0]->stream) ==
          ncclInvalidArgument);
    for (int r = 0; r < 2; ++r) CHECK(SHIM_FN(s, ncclRedOpDestroy)(op, pair.comms[r]) == ncclSuccess);
    CHECK(SHIM_FN(s, ncclRedOpDestroy)(op, pair.comms[0]) == ncclInvalidArgument);
    // Inside a group, a call keeps its op: destroyed right after the call
    // (as torch's coalesced calls do) and another op made in its slot, each
    // call still runs with its own scalar at ncclGroupEnd.
    {
      const float a[2] = {0.5f, 0.75f}, b[2] = {0.25f, 0.125f};
      REQUIRE(SHIM_FN(s, ncclGroupStart)() == ncclSuccess);
      for (int r = 0; r < 2; ++r) {
        void* q = pair.bufs[size_t(r)]->ptr();
        ncclRedOp_t x = ncclSum, y = ncclSum;
        CHECK(SHIM_FN(s, ncclRedOpCreatePreMulSum)(&x, const_cast<float*>(&a[r]), ncclFloat32, ncclScalarHostImmediate,
                                                   pair.comms[r]) == ncclSuccess);
        CHECK(SHIM_FN(s, ncclAllReduce)(q, q, 64, ncclFloat32, x, pair.comms[r], pair.devs[size_t(r)]->stream) ==
              ncclSuccess);
        CHECK(SHIM_FN(s, ncclRedOpDestroy)(x, pair.comms[r]) == ncclSuccess);
        CHECK(SHIM_FN(s, ncclRedOpCreatePreMulSum)(&y, const_cast<float*>(&b[r]), ncclFloat32, ncclScalarHostImmediate,
                                                   pair.comms[r]) == ncclSuccess);
        CHECK(int(y) != int(x));  // the slot is still held by the group's call
        CHECK(SHIM_FN(s, ncclAllReduce)(q, q, 32, ncclFloat32, y, pair.comms[r], pair.devs[size_t(r)]->stream) ==
              ncclSuccess);
        CHECK(SHIM_FN(s, ncclRedOpDestroy)(y, pair.comms[r]) == ncclSuccess);
      }
      const int64_t before = mkt::counts().launches;
      REQUIRE_MESSAGE(SHIM_FN(s, ncclGroupEnd)() == ncclSuccess, SHIM_FN(s, ncclGetLastError)(nullptr));
      CHECK(mkt::counts().launches == before + 4);
      const mkfake_launch last = mkt::last_launch();  // rank 1's second call
      uint32_t want = 0;
      std::memcpy(&want, &b[1], 4);
      CHECK(uint32_t(last.args.prescale) == want);
      CHECK(last.args.count == 32);
      // after the group both ops are gone: their handles are free again
      ncclRedOp_t z = ncclSum;
      CHECK(SHIM_FN(s, ncclRedOpCreatePreMulSum)(&z, const_cast<float*>(&a[0]), ncclFloat32, ncclScalarHostImmediate,
                                                 pair.comms[0]) == ncclSuccess);
      CHECK(int(z) == 5);
      CHECK(SHIM_FN(s, ncclRedOpDestroy)(z, pair.comms[0]) == ncclSuccess);
    }
    CHECK(pair.allreduce() == 2);  // and plain ones stay on mKernel
    CHECK_FALSE(has(fake_log(), "AllReduce"));
  }
  CHECK(has(fake_log(), "CommDestroy comm=1\nCommDestroy comm=2\n"));
  {
    // With all-reduce in the fallback list, a PreMulSum all-reduce goes to
    // NCCL, whose op is made from the kept scalar on first use.
    setenv("MK_NCCL_FALLBACK", "allreduce", 1);
    Pair pair(s);
    unsetenv("MK_NCCL_FALLBACK");
    fake_log();
    ncclRedOp_t op = ncclSum;
    float scale = 0.5f;
    for (int r = 0; r < 2; ++r)
      CHECK(SHIM_FN(s, ncclRedOpCreatePreMulSum)(&op, &scale, ncclFloat32, ncclScalarHostImmediate, pair.comms[r]) ==
            ncclSuccess);
    CHECK(pair.allreduce(op) == 0);
    const std::string log = fake_log();
    CHECK(has(log, "RedOpCreatePreMulSum comm=1"));
    CHECK(has(log, "AllReduce comm=1 count=64 dtype=7 op=5\n"));
    for (int r = 0; r < 2; ++r) CHECK(SHIM_FN(s, ncclRedOpDestroy)(op, pair.comms[r]) == ncclSuccess);
  }
}

TEST_CASE("nccl shim: one thread creates two ranks with ncclCommInitRank inside a group, then drives them") {
  MKT_REQUIRE_FAKE();
  Shim s;
  std::vector<std::unique_ptr<mkt::Device>> devs;
  std::vector<std::unique_ptr<mkt::Buffer>> bufs;
  for (int d : {0, 1}) {
    devs.push_back(std::make_unique<mkt::Device>(d));
    bufs.push_back(std::make_unique<mkt::Buffer>(*devs.back(), 4096));
  }
  ncclUniqueId id;
  REQUIRE(SHIM_FN(s, ncclGetUniqueId)(&id) == ncclSuccess);
  ncclComm_t comms[2] = {nullptr, nullptr};
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;  // blocking by default: done at ncclGroupEnd
  REQUIRE(SHIM_FN(s, ncclGroupStart)() == ncclSuccess);
  for (int r = 0; r < 2; ++r) {
    REQUIRE(mkt::cu().cuCtxSetCurrent(devs[size_t(r)]->ctx) == CUDA_SUCCESS);  // as cudaSetDevice(r)
    CHECK(SHIM_FN(s, ncclCommInitRankConfig)(&comms[r], 2, id, r, r == 0 ? &cfg : nullptr) == ncclSuccess);
  }
  REQUIRE_MESSAGE(SHIM_FN(s, ncclGroupEnd)() == ncclSuccess, SHIM_FN(s, ncclGetLastError)(nullptr));
  for (int r = 0; r < 2; ++r) {
    int n = 0, me = -1;
    CHECK(SHIM_FN(s, ncclCommCount)(comms[r], &n) == ncclSuccess);
    CHECK(SHIM_FN(s, ncclCommUserRank)(comms[r], &me) == ncclSuccess);
    CHECK(n == 2);
    CHECK(me == r);
  }
  const int64_t before = mkt::counts().launches;
  REQUIRE(SHIM_FN(s, ncclGroupStart)() == ncclSuccess);
  for (int r = 0; r < 2; ++r)
    CHECK(SHIM_FN(s, ncclAllReduce)(bufs[size_t(r)]->ptr(), bufs[size_t(r)]->ptr(), 64, ncclFloat32, ncclSum,
                                    comms[r], devs[size_t(r)]->stream) == ncclSuccess);
  CHECK(SHIM_FN(s, ncclGroupEnd)() == ncclSuccess);
  CHECK(mkt::counts().launches == before + 2);
  for (ncclComm_t c : comms) CHECK(SHIM_FN(s, ncclCommDestroy)(c) == ncclSuccess);
}

TEST_CASE("nccl shim: MK_NCCL_FALLBACK sends a collective to NCCL on communicators made after it is set") {
  MKT_REQUIRE_FAKE();
  Shim s;
  fake_log();
  setenv("MK_NCCL_FALLBACK", "broadcast,allreduce", 1);
  {
    Pair pair(s);
    unsetenv("MK_NCCL_FALLBACK");
    CHECK(pair.allreduce() == 0);
    CHECK(has(fake_log(), "AllReduce comm=1 count=64"));
  }
  setenv("MK_NCCL_FALLBACK", "allreduce,bogus", 1);
  ncclComm_t comms[2] = {nullptr, nullptr};
  const int devlist[2] = {0, 1};
  CHECK(SHIM_FN(s, ncclCommInitAll)(comms, 2, devlist) == ncclInvalidArgument);
  CHECK(has(SHIM_FN(s, ncclGetLastError)(nullptr), "MK_NCCL_FALLBACK='allreduce,bogus' names 'bogus'"));
  unsetenv("MK_NCCL_FALLBACK");
}

TEST_CASE("nccl shim: ncclConfig_t is checked as NCCL checks it, NULL takes every default") {
  MKT_REQUIRE_FAKE();
  Shim s;
  mkt::Device dev(0);
  ncclUniqueId id;
  REQUIRE(SHIM_FN(s, ncclGetUniqueId)(&id) == ncclSuccess);
  auto init = [&](ncclConfig_t* cfg) {
    ncclComm_t c = nullptr;
    const ncclResult_t r = SHIM_FN(s, ncclCommInitRankConfig)(&c, 1, id, 0, cfg);
    if (r == ncclSuccess) {
      int n = 0;
      CHECK(SHIM_FN(s, ncclCommCount)(c, &n) == ncclSuccess);
      CHECK(n == 1);
      CHECK(SHIM_FN(s, ncclCommDestroy)(c) == ncclSuccess);
    } else {
      CHECK(c == nullptr);
    }
    return r;
  };
  CHECK(init(nullptr) == ncclSuccess);
  ncclConfig_t good = NCCL_CONFIG_INITIALIZER;
  CHECK(init(&good) == ncclSuccess);
  ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
  bad.magic = 0x12345678;
  CHECK(init(&bad) == ncclInvalidArgument);
  CHECK(has(SHIM_FN(s, ncclGetLastError)(nullptr), "magic"));
  // An older header's shorter struct: only `size` bytes are read.
  ncclConfig_t older = NCCL_CONFIG_INITIALIZER;
  older.size = offsetof(ncclConfig_t, commName);
  older.collnetEnable = 12345;  // past `size`: never read (out of range if it were)
  CHECK(init(&older) == ncclSuccess);
  ncclConfig_t tiny = NCCL_CONFIG_INITIALIZER;
  tiny.size = 4;
  CHECK(init(&tiny) == ncclInvalidArgument);
  ncclConfig_t blocking = NCCL_CONFIG_INITIALIZER;
  blocking.blocking = 7;  // NCCL: 0 or 1
  CHECK(init(&blocking) == ncclInvalidArgument);
  // A newer NCCL's larger struct (2.29 appends int fields after
  // nvlinkCentricSched, NCCL_CONFIG_UNDEF_INT in its initializer): read as
  // NCCL 2.28's, never as mkConfig_t's own fields there (a crash before).
  struct Newer {
    ncclConfig_t c;
    int graphUsageMode, numRmaCtx, more[8];
  } newer{NCCL_CONFIG_INITIALIZER, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, {}};
  for (int& m : newer.more) m = NCCL_CONFIG_UNDEF_INT;
  newer.c.size = sizeof newer;
  CHECK(init(&newer.c) == ncclSuccess);
  // the same through ncclCommSplit of a communicator made with it
  ncclComm_t parent = nullptr;
  REQUIRE(SHIM_FN(s, ncclCommInitRankConfig)(&parent, 1, id, 0, &newer.c) == ncclSuccess);
  ncclComm_t child = nullptr;
  CHECK(SHIM_FN(s, ncclCommSplit)(parent, 0, 0, &child, &newer.c) == ncclSuccess);
  CHECK(child != nullptr);
  if (child) CHECK(SHIM_FN(s, ncclCommDestroy)(child) == ncclSuccess);
  CHECK(SHIM_FN(s, ncclCommDestroy)(parent) == ncclSuccess);
}

TEST_CASE("nccl shim: bad input gets NCCL's error codes and a readable ncclGetLastError") {
  MKT_REQUIRE_FAKE();
  Shim s;
  mkt::Device dev(0);
  mkt::Buffer buf(dev, 1024);
  CHECK(SHIM_FN(s, ncclAllReduce)(buf.ptr(), buf.ptr(), 4, ncclFloat32, ncclSum, nullptr, dev.stream) ==
        ncclInvalidArgument);
  CHECK(has(SHIM_FN(s, ncclGetLastError)(nullptr), "ncclAllReduce: comm is NULL"));
  int not_a_comm[16] = {0};
  CHECK(SHIM_FN(s, ncclAllReduce)(buf.ptr(), buf.ptr(), 4, ncclFloat32, ncclSum,
                                  reinterpret_cast<ncclComm_t>(not_a_comm), dev.stream) == ncclInvalidArgument);
  CHECK(SHIM_FN(s, ncclGroupEnd)() == ncclInvalidUsage);  // no group open
  ncclUniqueId id;
  REQUIRE(SHIM_FN(s, ncclGetUniqueId)(&id) == ncclSuccess);
  ncclComm_t c = nullptr;
  REQUIRE(SHIM_FN(s, ncclCommInitRank)(&c, 1, id, 0) == ncclSuccess);
  // mKernel's own checks come through with its message: a host pointer
  std::vector<float> host(16);
  CHECK(SHIM_FN(s, ncclAllReduce)(host.data(), host.data(), 16, ncclFloat32, ncclSum, c, dev.stream) ==
        ncclInvalidArgument);
  CHECK(std::string(SHIM_FN(s, ncclGetLastError)(c)).size() > 10);
  CHECK(SHIM_FN(s, ncclAllReduce)(buf.ptr(), buf.ptr(), 4, ncclFloat32, ncclRedOp_t(4), c, dev.stream) == ncclSuccess);
  // registration is a local hint here (mKernel's own is collective): nothing to wait for
  void* handle = nullptr;
  CHECK(SHIM_FN(s, ncclCommRegister)(c, buf.ptr(), 1024, &handle) == ncclSuccess);
  CHECK(handle != nullptr);
  CHECK(SHIM_FN(s, ncclCommDeregister)(c, handle) == ncclSuccess);
  CHECK(SHIM_FN(s, ncclCommDeregister)(c, &handle) == ncclInvalidArgument);
  CHECK(SHIM_FN(s, ncclCommDestroy)(c) == ncclSuccess);
  CHECK(SHIM_FN(s, ncclCommDestroy)(c) == ncclInvalidUsage);  // destroyed already: an error, not a crash
  ncclResult_t async = ncclSuccess;
  CHECK(SHIM_FN(s, ncclCommGetAsyncError)(c, &async) == ncclInvalidUsage);  // nor does asking it
  CHECK(SHIM_FN(s, ncclCommDestroy)(nullptr) == ncclSuccess);                 // as NCCL
  CHECK(SHIM_FN(s, ncclCommAbort)(nullptr) == ncclSuccess);
  CHECK(has(SHIM_FN(s, ncclGetErrorString)(ncclInvalidUsage), "invalid usage"));
}

TEST_CASE("nccl shim: without a real NCCL only what needs one fails, and says how to give one") {
  MKT_REQUIRE_FAKE();
  Shim s("/nonexistent/libnccl.so.2");
  mkt::Device dev(0);
  mkt::Buffer buf(dev, 1024);
  ncclUniqueId id;
  REQUIRE(SHIM_FN(s, ncclGetUniqueId)(&id) == ncclSuccess);
  ncclComm_t c = nullptr;
  REQUIRE(SHIM_FN(s, ncclCommInitRank)(&c, 1, id, 0) == ncclSuccess);
  const int64_t before = mkt::counts().launches;
  CHECK(SHIM_FN(s, ncclAllReduce)(buf.ptr(), buf.ptr(), 64, ncclBfloat16, ncclMax, c, dev.stream) == ncclSuccess);
  CHECK(mkt::counts().launches == before + 1);
  CHECK(SHIM_FN(s, ncclSend)(buf.ptr(), 4, ncclFloat32, 0, c, dev.stream) == ncclSystemError);
  const std::string why = SHIM_FN(s, ncclGetLastError)(c);
  CHECK(has(why, "send needs the real NCCL"));
  CHECK(has(why, "/nonexistent/libnccl.so.2"));
  int v = 0;
  CHECK(SHIM_FN(s, ncclGetVersion)(&v) == ncclSuccess);
  CHECK(v == NCCL_VERSION_CODE);  // none to ask: the header's
  CHECK(SHIM_FN(s, ncclCommDestroy)(c) == ncclSuccess);
}

TEST_CASE("nccl shim: the real NCCL is never this library itself") {
  MKT_REQUIRE_FAKE();
  Shim s(MKT_SHIM);  // MK_NCCL_LIB naming mKernel's library
  mkt::Device dev(0);
  ncclUniqueId id;
  REQUIRE(SHIM_FN(s, ncclGetUniqueId)(&id) == ncclSuccess);
  ncclComm_t c = nullptr;
  REQUIRE(SHIM_FN(s, ncclCommInitRank)(&c, 1, id, 0) == ncclSuccess);
  mkt::Buffer buf(dev, 1024);
  CHECK(SHIM_FN(s, ncclSend)(buf.ptr(), 4, ncclFloat32, 0, c, dev.stream) == ncclSystemError);
  CHECK(has(SHIM_FN(s, ncclGetLastError)(c), "mKernel's NCCL library itself"));
  CHECK(SHIM_FN(s, ncclCommDestroy)(c) == ncclSuccess);
}
TEST_CASE("nccl shim: a datatype, op, root, peer or count NCCL refuses is refused before either library sees it") {
  MKT_REQUIRE_FAKE();
  Shim s;
  setenv("MK_NCCL_FALLBACK", "all", 1);  // every collective would go to the (fake) real NCCL
  Pair pair(s);
  unsetenv("MK_NCCL_FALLBACK");
  fake_log();
  void* p = pair.bufs[0]->ptr();
  ncclComm_t c = pair.comms[0];
  cudaStream_t st = pair.devs[0]->stream;
  auto last = [&] { return std::string(SHIM_FN(s, ncclGetLastError)(c)); };
  CHECK(SHIM_FN(s, ncclAllReduce)(p, p, 64, ncclDataType_t(77), ncclSum, c, st) == ncclInvalidArgument);
  CHECK(has(last(), "ncclAllReduce: invalid type 77 (an ncclDataType_t is 0..11)"));
  CHECK(SHIM_FN(s, ncclAllReduce)(p, p, 64, ncclDataType_t(-1), ncclSum, c, st) == ncclInvalidArgument);
  CHECK(SHIM_FN(s, ncclAllReduce)(p, p, 64, ncclDataType_t(ncclNumTypes), ncclSum, c, st) == ncclInvalidArgument);
  CHECK(SHIM_FN(s, ncclAllReduce)(p, p, 64, ncclFloat32, ncclRedOp_t(-1), c, st) == ncclInvalidArgument);
  CHECK(has(last(), "ncclAllReduce: invalid reduction operation -1"));
  CHECK(SHIM_FN(s, ncclReduceScatter)(p, p, 8, ncclFloat32, ncclRedOp_t(77), c, st) == ncclInvalidArgument);
  CHECK(has(last(), "reduction op 77 is neither a built-in ncclRedOp_t nor a PreMulSum op"));
  CHECK(SHIM_FN(s, ncclBroadcast)(p, p, 64, ncclFloat32, 2, c, st) == ncclInvalidArgument);
  CHECK(has(last(), "ncclBroadcast: invalid root 2 (it should be in the 0..1 range)"));
  CHECK(SHIM_FN(s, ncclReduce)(p, p, 64, ncclFloat32, ncclSum, -1, c, st) == ncclInvalidArgument);
  CHECK(SHIM_FN(s, ncclSend)(p, 4, ncclFloat32, 2, c, st) == ncclInvalidArgument);
  CHECK(has(last(), "ncclSend: invalid peer 2"));
  CHECK(SHIM_FN(s, ncclRecv)(p, 4, ncclFloat32, -3, c, st) == ncclInvalidArgument);
  CHECK(SHIM_FN(s, ncclSend)(p, 4, ncclDataType_t(12), 1, c, st) == ncclInvalidArgument);
  CHECK(SHIM_FN(s, ncclGather)(p, p, 4, ncclFloat32, 5, c, st) == ncclInvalidArgument);
  CHECK(SHIM_FN(s, ncclAllGather)(p, p, SIZE_MAX / 4, ncclFloat32, c, st) == ncclInvalidArgument);
  CHECK(has(last(), "ncclAllGather: count"));
  CHECK(SHIM_FN(s, ncclAllReduce)(p, p, SIZE_MAX / 2, ncclFloat64, ncclSum, c, st) == ncclInvalidArgument);
  // inside a group too: the call is refused at once, the group has nothing of it
  REQUIRE(SHIM_FN(s, ncclGroupStart)() == ncclSuccess);
  CHECK(SHIM_FN(s, ncclAllReduce)(p, p, 64, ncclDataType_t(77), ncclSum, c, st) == ncclInvalidArgument);
  CHECK(SHIM_FN(s, ncclGroupEnd)() == ncclSuccess);
  CHECK(fake_log() == "");  // nothing reached NCCL, not even its init
  // the same calls in range still go where they went
  CHECK(SHIM_FN(s, ncclSend)(p, 4, ncclFloat32, 1, c, st) == ncclSuccess);
  CHECK(has(fake_log(), "Send comm=1 count=4 peer=1"));
}

TEST_CASE("nccl shim: MK_DEBUG and MK_NCCL_STATS are 0 or 1, another value is off with one warning") {
  MKT_REQUIRE_FAKE();
  auto null_call = [](Shim& s) {
    return SHIM_FN(s, ncclAllReduce)(nullptr, nullptr, 4, ncclFloat32, ncclSum, nullptr, nullptr);
  };
  {
    setenv("MK_DEBUG", "abc", 1);
    Shim s;  // a fresh copy: it reads MK_DEBUG once
    const std::string err = stderr_of([&] {
      CHECK(null_call(s) == ncclInvalidArgument);
      CHECK(null_call(s) == ncclInvalidArgument);
    });
    unsetenv("MK_DEBUG");
    // once, from this library ("mkernel-nccl[pid]: warning: ...")
    CHECK(occurrences(err, "]: warning: MK_DEBUG='abc' is not accepted (expected 0 or 1; unset or empty: 0); "
                           "MK_DEBUG is off") == 1);
    CHECK_FALSE(has(err, "error: ncclAllReduce"));  // off
  }
  {
    setenv("MK_DEBUG", "1", 1);
    Shim s;
    const std::string err = stderr_of([&] { CHECK(null_call(s) == ncclInvalidArgument); });
    unsetenv("MK_DEBUG");
    CHECK(has(err, "error: ncclAllReduce: comm is NULL"));
    CHECK_FALSE(has(err, "warning"));
  }
  {
    setenv("MK_NCCL_STATS", "yes", 1);
    Shim s;
    Pair pair(s);
    const std::string err = stderr_of([&] {
      CHECK(pair.allreduce() == 2);
      CHECK(pair.allreduce() == 2);
    });
    unsetenv("MK_NCCL_STATS");
    CHECK(occurrences(err, "]: warning: MK_NCCL_STATS='yes' is not accepted (expected 0 or 1") == 1);
  }
}

TEST_CASE("nccl shim: MK_NCCL_EAGER and MK_NCCL_FALLBACK are parsed strictly at init") {
  MKT_REQUIRE_FAKE();
  Shim s;
  mkt::Device dev(0);
  ncclUniqueId id;
  REQUIRE(SHIM_FN(s, ncclGetUniqueId)(&id) == ncclSuccess);
  auto init = [&] {
    ncclComm_t c = nullptr;
    const ncclResult_t r = SHIM_FN(s, ncclCommInitRank)(&c, 1, id, 0);
    if (r == ncclSuccess) CHECK(SHIM_FN(s, ncclCommDestroy)(c) == ncclSuccess);
    else CHECK(c == nullptr);
    return r;
  };
  fake_log();
  for (const char* bad : {"yes", "true", "2", " 1", "1 ", "01"}) {
    CAPTURE(bad);
    setenv("MK_NCCL_EAGER", bad, 1);
    CHECK(init() == ncclInvalidArgument);
    CHECK(has(SHIM_FN(s, ncclGetLastError)(nullptr), std::string("MK_NCCL_EAGER='") + bad + "': expected 0 or 1"));
  }
  setenv("MK_NCCL_EAGER", "0", 1);
  CHECK(init() == ncclSuccess);
  CHECK(fake_log() == "");
  setenv("MK_NCCL_EAGER", "1", 1);
  CHECK(init() == ncclSuccess);
  CHECK(has(fake_log(), "CommInitRank"));  // NCCL's communicator made at init
  unsetenv("MK_NCCL_EAGER");
  for (const char* bad : {"allreduce,", ",allreduce", "allreduce,,broadcast", " allreduce", "AllReduce",
                          "all,allreduce", "none,broadcast", "all,none", ","}) {
    CAPTURE(bad);
    setenv("MK_NCCL_FALLBACK", bad, 1);
    CHECK(init() == ncclInvalidArgument);
    const std::string why = SHIM_FN(s, ncclGetLastError)(nullptr);
    CHECK(has(why, std::string("MK_NCCL_FALLBACK='") + bad + "' names '"));
    CHECK(has(why, "or all or none alone"));
  }
  for (const char* good : {"allreduce", "allreduce,alltoall", "all", "none", ""}) {
    CAPTURE(good);
    setenv("MK_NCCL_FALLBACK", good, 1);
    CHECK(init() == ncclSuccess);
  }
  unsetenv("MK_NCCL_FALLBACK");
}

TEST_CASE("nccl shim: a commName longer than 128 characters fails the init with ncclInvalidArgument") {
  MKT_REQUIRE_FAKE();
  Shim s;
  mkt::Device dev(0);
  ncclUniqueId id;
  REQUIRE(SHIM_FN(s, ncclGetUniqueId)(&id) == ncclSuccess);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  std::string name(128, 'n');
  cfg.commName = name.c_str();
  ncclComm_t c = nullptr;
  REQUIRE(SHIM_FN(s, ncclCommInitRankConfig)(&c, 1, id, 0, &cfg) == ncclSuccess);
  CHECK(SHIM_FN(s, ncclCommDestroy)(c) == ncclSuccess);
  name += 'x';
  cfg.commName = name.c_str();
  c = nullptr;
  CHECK(SHIM_FN(s, ncclCommInitRankConfig)(&c, 1, id, 0, &cfg) == ncclInvalidArgument);
  CHECK(c == nullptr);
  CHECK(has(SHIM_FN(s, ncclGetLastError)(nullptr), "commName is longer than 128 characters"));
}
#endif
