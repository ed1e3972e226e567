// The verbs transport (runtime/transport/net/verbs.cpp) against the fake
// libibverbs (tests/fake_ibverbs): what the contract suite (test_net.cpp)
// cannot see. Failures injected into queue pairs, peers that die with data in
// flight, the setup errors a host without RDMA gives, address vectors for
// InfiniBand and RoCE, dma-buf registration. What this exercises: fake verbs
// (shared memory between processes of one machine), never a real HCA.
#include <doctest/doctest.h>

#ifdef MKT_FAKE_IBVERBS

#include <infiniband/verbs.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

#include "runtime/api/status.hpp"
#include "runtime/transport/net/net.hpp"
#include "tests/fake_ibverbs/fake_ibverbs.h"

namespace {

using namespace mk::rt::net;
using Clock = std::chrono::steady_clock;

// The fake's environment: `link` ib or roce, `devices` fake HCAs, this process's fabric.
void fake_env(const char* link, const char* devices = "1") {
  setenv("MKFAKE_IB_LINK", link, 1);
  setenv("MKFAKE_IB_DEVICES", devices, 1);
  setenv("MKFAKE_IB_NAME", ("mkt-ib-" + std::to_string(::getpid())).c_str(), 1);
  unsetenv("MKFAKE_IB_FAIL");
  unsetenv("MKFAKE_IB_DOWN");
  setenv("MK_SOCKET_IFNAME", "=lo", 1);
}
VerbsOptions fake_lib() {
  VerbsOptions o;
  o.lib = MKT_FAKE_IBVERBS;
  return o;
}
std::unique_ptr<Net> fake_net(const char* link = "ib", VerbsOptions o = fake_lib()) {
  fake_env(link);
  return make_verbs_net(o);
}

template <class F>
F* control(const char* name) {
  F* f = mkfake_ib_fn<F>(MKT_FAKE_IBVERBS, name);
  if (!f) FAIL("the fake libibverbs lacks " << name);
  return f;
}
mkfake_ib_counts counts() {
  mkfake_ib_counts c{};
  control<decltype(mkfake_ib_get_counts)>("mkfake_ib_get_counts")(&c);
  return c;
}

// Calls `f` until it gives something (a comm, a request, true), for at most `ms`.
template <class F>
auto until(F&& f, int ms = 8000) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(ms);
  for (;;) {
    if (auto v = f()) return v;
    if (Clock::now() > deadline) throw std::runtime_error("nothing within " + std::to_string(ms) + " ms");
    std::this_thread::yield();
  }
}
size_t done(Net& n, Request* r, int ms = 8000) {
  size_t bytes = 0;
  until([&] { return n.test(r, &bytes); }, ms);
  return bytes;
}

// The error `f` throws ("" and mkSuccess when none).
struct Thrown {
  mkResult_t code = mkSuccess;
  std::string what;
};
template <class F>
Thrown thrown(F&& f) {
  try {
    f();
  } catch (const mk::rt::RtError& e) {
    return {e.code(), e.what()};
  }
  return {};
}
bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A child process whose body's text ("ok", or what went wrong) comes back
// through a pipe when it is joined.
struct Child {
  pid_t pid = -1;
  int fd = -1;
};
Child spawn(const std::function<std::string()>& body) {
  int p[2];
  REQUIRE(::pipe(p) == 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    std::string text;
    try {
      text = body();
    } catch (const std::exception& e) {
      text = std::string("threw: ") + e.what();
    }
    [[maybe_unused]] ssize_t w = ::write(p[1], text.data(), text.size());
    _exit(0);
  }
  ::close(p[1]);
  REQUIRE(pid > 0);
  return {pid, p[0]};
}
std::string join(Child c, bool kill_it = false) {
  if (kill_it) ::kill(c.pid, SIGKILL);
  std::string text;
  char buf[512];
  for (ssize_t n; (n = ::read(c.fd, buf, sizeof buf)) > 0;) text.append(buf, size_t(n));
  ::close(c.fd);
  ::waitpid(c.pid, nullptr, 0);
  return text;
}

// Sends (or receives) one 8-byte message and checks it: the connection is up.
std::string exchange(Net& n, void* comm, bool send, uint64_t value) {
  uint64_t x = send ? value : 0;
  Request* r = until([&] { return send ? n.isend(comm, &x, 8, 0, nullptr) : n.irecv(comm, &x, 8, 0, nullptr); });
  if (done(n, r) != 8 || x != value) return "message " + std::to_string(value) + " came as " + std::to_string(x);
  return "ok";
}

// One message from `s` to `r`, both comms of this process.
std::string exchange(Net& n, SendComm* s, RecvComm* r, uint64_t value) {
  uint64_t x = value, y = 0;
  Request* qs = until([&] { return n.isend(s, &x, 8, 0, nullptr); });
  Request* qr = until([&] { return n.irecv(r, &y, 8, 0, nullptr); });
  size_t sent = 0, got = 0;
  until([&] {
    qs = qs && n.test(qs, &sent) ? nullptr : qs;
    qr = qr && n.test(qr, &got) ? nullptr : qr;
    return !qs && !qr;
  });
  if (sent != 8 || got != 8 || y != value) return "message " + std::to_string(value) + " came as " + std::to_string(y);
  return "ok";
}

// Connected send and receive comms of one process (the fake serves both ends).
struct Pair {
  Net& net;
  ListenComm* l = nullptr;
  SendComm* s = nullptr;
  RecvComm* r = nullptr;
  explicit Pair(Net& n) : net(n) {
    Handle h;
    l = net.listen(0, &h);
    s = until([&] { return net.connect(0, h); });
    r = until([&] { return net.accept(l); });
  }
  ~Pair() {
    if (s) net.close_send(s);
    if (r) net.close_recv(r);
    net.close_listen(l);
  }
};

}  // namespace

TEST_CASE("net verbs: a retry-exceeded completion fails the pending requests of both sides naming the peer and the status") {
  auto net = fake_net("ib");
  Handle h;
  ListenComm* l = net->listen(0, &h);
  const Child sender = spawn([&]() -> std::string {
    SendComm* s = until([&] { return net->connect(0, h); });
    if (std::string e = exchange(*net, s, true, 7); e != "ok") return e;
    control<decltype(mkfake_ib_fail_next_send)>("mkfake_ib_fail_next_send")(0, IBV_WC_RETRY_EXC_ERR);
    std::vector<uint8_t> a(70000, 1), b(10, 2);
    Request* r1 = until([&] { return net->isend(s, a.data(), a.size(), 0, nullptr); });
    Request* r2 = until([&] { return net->isend(s, b.data(), b.size(), 0, nullptr); });
    const Thrown t1 = thrown([&] { done(*net, r1); });
    const Thrown t2 = thrown([&] { done(*net, r2); });  // the one behind it: the same sticky error
    if (t2.what != t1.what) return "not sticky: '" + t1.what + "' then '" + t2.what + "'";
    return t1.what;
  });
  RecvComm* r = until([&] { return net->accept(l); });
  CHECK(exchange(*net, r, false, 7) == "ok");
  std::vector<uint8_t> buf(70000, 0);
  Request* q = until([&] { return net->irecv(r, buf.data(), buf.size(), 0, nullptr); });
  const auto t0 = Clock::now();
  const Thrown t = thrown([&] { done(*net, q); });
  CHECK(Clock::now() - t0 < std::chrono::seconds(5));
  CHECK(t.code == mkRemoteError);
  CHECK_MESSAGE(has(t.what, "connection from 127.0.0.1:"), t.what);  // the peer, by address
  CHECK_MESSAGE(has(t.what, "the peer failed: a data write (message 1) completed with IBV_WC_RETRY_EXC_ERR"), t.what);
  CHECK(thrown([&] { net->irecv(r, buf.data(), 1, 0, nullptr); }).what == t.what);  // sticky
  const std::string child = join(sender);
  CHECK_MESSAGE(has(child, "connection to 127.0.0.1:"), child);
  CHECK_MESSAGE(has(child, "a data write (message 1) completed with IBV_WC_RETRY_EXC_ERR"), child);
  CHECK_MESSAGE(has(child, "on mkfake_0:1"), child);  // and the peer QP's device
  net->close_recv(r);
  net->close_listen(l);
}

TEST_CASE("net verbs: a queue pair forced into the error state flushes the pending receive and fails the peer") {
  auto net = fake_net("roce");
  Handle h;
  ListenComm* l = net->listen(0, &h);
  int go[2];
  REQUIRE(::pipe(go) == 0);
  const Child sender = spawn([&]() -> std::string {
    SendComm* s = until([&] { return net->connect(0, h); });
    if (std::string e = exchange(*net, s, true, 1); e != "ok") return e;
    char c;
    if (::read(go[0], &c, 1) != 1) return "no go";
    uint64_t x = 2;
    return thrown([&] { done(*net, until([&] { return net->isend(s, &x, 8, 0, nullptr); })); }).what;
  });
  RecvComm* r = until([&] { return net->accept(l); });
  CHECK(exchange(*net, r, false, 1) == "ok");
  uint64_t x = 0;
  Request* q = until([&] { return net->irecv(r, &x, 8, 0, nullptr); });
  size_t bytes = 0;
  CHECK_FALSE(net->test(q, &bytes));
  uint32_t qpn = 0;
  REQUIRE(control<decltype(mkfake_ib_qps)>("mkfake_ib_qps")(&qpn, 1) == 1);
  REQUIRE(control<decltype(mkfake_ib_set_qp_error)>("mkfake_ib_set_qp_error")(qpn) == 0);
  const Thrown t = thrown([&] { done(*net, q); });
  CHECK(t.code == mkRemoteError);
  CHECK_MESSAGE(has(t.what, "(message 1) completed with IBV_WC_WR_FLUSH_ERR"), t.what);  // the CTS or the receive
  CHECK_MESSAGE(has(t.what, "connection from 127.0.0.1:"), t.what);
  REQUIRE(::write(go[1], "x", 1) == 1);
  const std::string child = join(sender);  // its send fails instead of hanging, saying why
  CHECK_MESSAGE(has(child, "the peer failed: "), child);
  CHECK_MESSAGE(has(child, "(message 1) completed with IBV_WC_WR_FLUSH_ERR"), child);
  ::close(go[0]);
  ::close(go[1]);
  net->close_recv(r);
  net->close_listen(l);
}

TEST_CASE("net verbs: a receiver killed with data in flight fails the send with the retry-exceeded status") {
  auto net = fake_net("ib");
  Handle h;
  ListenComm* l = net->listen(0, &h);
  const Child receiver = spawn([&]() -> std::string {
    RecvComm* r = until([&] { return net->accept(l); });
    if (std::string e = exchange(*net, r, false, 5); e != "ok") return e;
    static uint64_t x;
    net->irecv(r, &x, 8, 0, nullptr);  // its clear-to-send goes out; then this process stops polling
    ::pause();
    return "not killed";
  });
  SendComm* s = until([&] { return net->connect(0, h); });
  CHECK(exchange(*net, s, true, 5) == "ok");
  uint64_t x = 6;
  Request* q = until([&] { return net->isend(s, &x, 8, 0, nullptr); });
  size_t bytes = 0;
  for (int i = 0; i < 100; ++i) CHECK_FALSE(net->test(q, &bytes));  // written, never applied: pending
  join(receiver, true);
  const auto t0 = Clock::now();
  const Thrown t = thrown([&] { done(*net, q); });
  CHECK(Clock::now() - t0 < std::chrono::seconds(5));
  CHECK(t.code == mkRemoteError);
  CHECK_MESSAGE(has(t.what, "connection to 127.0.0.1:"), t.what);
  CHECK_MESSAGE(has(t.what, "a data write (message 1) completed with IBV_WC_RETRY_EXC_ERR"), t.what);
  net->close_send(s);
  net->close_listen(l);
}

TEST_CASE("net verbs: a message larger than its receive or with another tag names sizes and tags on both sides") {
  for (bool tag_mismatch : {false, true}) {
    CAPTURE(tag_mismatch);
    auto net = fake_net("roce");
    Pair p(*net);
    std::vector<uint8_t> out(1000, 1), in(tag_mismatch ? 1000 : 999, 0);
    Request* qs = until([&] { return net->isend(p.s, out.data(), out.size(), 5, nullptr); });
    Request* qr = until([&] { return net->irecv(p.r, in.data(), in.size(), tag_mismatch ? 6 : 5, nullptr); });
    Thrown ts, tr;
    size_t bytes;
    until([&] {  // both fail; neither hangs
      if (ts.what.empty()) ts = thrown([&] { net->test(qs, &bytes); });
      if (tr.what.empty()) tr = thrown([&] { net->test(qr, &bytes); });
      return !ts.what.empty() && !tr.what.empty();
    });
    CHECK(tr.code == mkRemoteError);
    CHECK(ts.code == mkRemoteError);
    if (tag_mismatch) {
      CHECK_MESSAGE(has(tr.what, "a message with tag 5 arrived for a receive with tag 6"), tr.what);
      CHECK_MESSAGE(has(ts.what, "the peer's receive 0 has tag 6 and the message tag 5"), ts.what);
    } else {
      CHECK_MESSAGE(has(tr.what, "a message of 1000 bytes arrived for a receive of 999 bytes"), tr.what);
      CHECK_MESSAGE(has(ts.what, "the peer's receive 0 has 999 bytes, too few for a message of 1000 bytes"), ts.what);
    }
    CHECK(std::count(in.begin(), in.end(), 0) == long(in.size()));  // nothing was written into the receive
  }
}

TEST_CASE("net verbs: a host without RDMA devices gets a clear error") {
  fake_env("ib", "0");
  const VerbsOptions o = fake_lib();
  Thrown t = thrown([&] { make_verbs_net(o); });
  CHECK(t.code == mkSystemError);
  CHECK(t.what == std::string("verbs transport: no RDMA device ('") + MKT_FAKE_IBVERBS + "' lists none)");
  setenv("MKFAKE_IB_DEVICES", "2", 1);
  setenv("MKFAKE_IB_DOWN", "mkfake_0,mkfake_1", 1);
  t = thrown([&] { make_verbs_net(o); });
  CHECK(t.code == mkSystemError);
  CHECK(t.what == "verbs transport: no active RDMA port; this host has: mkfake_0:1 (not active, InfiniBand), "
                  "mkfake_1:1 (not active, InfiniBand)");
  unsetenv("MKFAKE_IB_DOWN");
  CHECK(counts().contexts == 0);  // what was opened to look is closed again
}

TEST_CASE("net verbs: MK_IB_HCA naming nothing lists the ports this host has") {
  fake_env("roce", "2");
  setenv("MKFAKE_IB_DOWN", "mkfake_1", 1);
  VerbsOptions o = fake_lib();
  const char* have = "this host has: mkfake_0:1 (active, RoCE), mkfake_1:1 (not active, RoCE)";
  for (const char* spec : {"=mlx5_0", "mkfake_1", "^mkfake_0", "=mkfake_0:2", "mkfake_"}) {
    CAPTURE(spec);
    o.hca = spec;
    if (std::string(spec) == "mkfake_") {  // names both: only the active one is a device
      auto net = make_verbs_net(o);
      REQUIRE(net->devices() == 1);
      const Props p = net->properties(0);
      CHECK(p.name == "mkfake_0");
      CHECK(p.port == 1);
      CHECK(p.speed_mbps == 200000);  // 4x HDR
      CHECK(p.guid == 0x0002c90300fa0000ull);
      CHECK(p.ptr_support == (kPtrHost | kPtrCuda | kPtrDmabuf));  // the fake has ibv_reg_dmabuf_mr
      CHECK(thrown([&] { net->properties(1); }).code == mkInvalidArgument);
      continue;
    }
    const Thrown t = thrown([&] { make_verbs_net(o); });
    CHECK(t.code == mkInvalidArgument);
    CHECK_MESSAGE(has(t.what, "MK_IB_HCA='" + std::string(spec) + "' matches no active port; " + have), t.what);
  }
  o.hca = "mkfake_0:x";
  CHECK(has(thrown([&] { make_verbs_net(o); }).what, "has no port number 1..255"));
  unsetenv("MKFAKE_IB_DOWN");
  setenv("MK_IB_HCA", "^mkfake_1", 1);
  setenv("MK_IB_GID_INDEX", "3", 1);
  setenv("MK_IBVERBS_LIB", "libibverbs-x.so", 1);
  const VerbsOptions e = verbs_options_from_env();
  CHECK(e.hca == "^mkfake_1");
  CHECK(e.gid_index == 3);
  CHECK(e.lib == "libibverbs-x.so");
  setenv("MK_IB_GID_INDEX", "three", 1);
  CHECK(thrown([] { verbs_options_from_env(); }).code == mkInvalidArgument);
  for (const char* v : {"MK_IB_HCA", "MK_IB_GID_INDEX", "MK_IBVERBS_LIB"}) unsetenv(v);
}

TEST_CASE("net verbs: a missing or foreign MK_IBVERBS_LIB is named in the error") {
  VerbsOptions o;
  o.lib = "/nonexistent/dir/libibverbs.so.1";
  Thrown t = thrown([&] { make_verbs_net(o); });
  CHECK(t.code == mkSystemError);
  CHECK_MESSAGE(has(t.what, "cannot load '/nonexistent/dir/libibverbs.so.1' (MK_IBVERBS_LIB)"), t.what);
  CHECK(has(t.what, "no RDMA verbs library on this machine"));
  o.lib = "libc.so.6";
  t = thrown([&] { make_verbs_net(o); });
  CHECK(t.code == mkSystemError);
  CHECK_MESSAGE(has(t.what, "'libc.so.6' lacks ibv_get_device_list@IBVERBS_1.1"), t.what);
}

TEST_CASE("net verbs: MK_IB_GID_INDEX out of range or naming an empty entry is refused") {
  VerbsOptions o = fake_lib();
  o.gid_index = 8;
  Thrown t = thrown([&] { fake_net("roce", o); });
  CHECK(t.code == mkInvalidArgument);
  CHECK(t.what == "MK_IB_GID_INDEX=8 is out of range: mkfake_0:1 has 8 GIDs (0..7)");
  o.gid_index = 5;
  t = thrown([&] { fake_net("roce", o); });
  CHECK(t.what == "MK_IB_GID_INDEX=5: mkfake_0:1 has no GID at that index (the entry is empty)");
  o.gid_index = 1;  // InfiniBand ports of the fake have one GID
  CHECK(thrown([&] { fake_net("ib", o); }).code == mkInvalidArgument);
  CHECK(counts().contexts == 0);
}

TEST_CASE("net verbs: RoCE peers are addressed by the RoCE v2 IPv4-mapped GID and InfiniBand peers by LID") {
  struct Want {
    const char* link;
    int gid_index, is_global, sgid_index, mtu;
  };
  for (const Want w : {Want{"roce", -1, 1, 3, IBV_MTU_1024}, Want{"roce", 1, 1, 1, IBV_MTU_1024},
                       Want{"ib", -1, 0, 0, IBV_MTU_4096}, Want{"ib", 0, 1, 0, IBV_MTU_4096}}) {
    CAPTURE(w.link);
    CAPTURE(w.gid_index);
    VerbsOptions o = fake_lib();
    o.gid_index = w.gid_index;
    auto net = fake_net(w.link, o);
    Pair p(*net);
    CHECK(exchange(*net, p.s, p.r, 11) == "ok");
    uint32_t qpn[2] = {};
    REQUIRE(control<decltype(mkfake_ib_qps)>("mkfake_ib_qps")(qpn, 2) == 2);
    auto* info = control<decltype(mkfake_ib_qp_info)>("mkfake_ib_qp_info");
    mkfake_ib_qp a{}, b{};
    REQUIRE(info(qpn[0], &a) == 0);
    REQUIRE(info(qpn[1], &b) == 0);
    CHECK(a.dest_qpn == qpn[1]);
    CHECK(b.dest_qpn == qpn[0]);
    CHECK(a.sq_psn == b.rq_psn);
    CHECK(b.sq_psn == a.rq_psn);
    for (const mkfake_ib_qp& q : {a, b}) {
      CHECK(q.state == IBV_QPS_RTS);
      CHECK(q.path_mtu == w.mtu);
      CHECK(q.is_global == w.is_global);
      if (w.is_global) CHECK(q.sgid_index == w.sgid_index);
      if (std::string(w.link) == "ib") CHECK(q.dlid == 1);
      const uint8_t v4[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 1};
      if (w.sgid_index == 3) CHECK(std::memcmp(q.dgid, v4, 16) == 0);  // ::ffff:10.77.0.1
    }
  }
}

TEST_CASE("net verbs: a verb failing at setup gives a clean error and leaks nothing") {
  for (const char* at_make : {"query_port:1", "alloc_pd:1", "query_gid:1"}) {
    CAPTURE(at_make);
    auto quiet = fake_net("ib");  // sets the environment; its objects are the baseline
    quiet.reset();
    setenv("MKFAKE_IB_FAIL", at_make, 1);
    const Thrown t = thrown([&] { make_verbs_net(fake_lib()); });
    CHECK(t.code == mkSystemError);
    CHECK_MESSAGE(has(t.what, "verbs transport: ibv_" + std::string(at_make).substr(0, std::strlen(at_make) - 2)), t.what);
    const mkfake_ib_counts c = counts();
    CHECK(c.contexts + c.pds + c.mrs + c.cqs + c.qps == 0);
  }
  // At connect: the CQ, the QP, the control block's MR, the QP's move to INIT.
  for (const char* at_connect : {"create_cq:1", "create_qp:1", "reg_mr:1", "modify_qp:1"}) {
    CAPTURE(at_connect);
    auto net = fake_net("roce");
    const mkfake_ib_counts base = counts();
    Handle h;
    ListenComm* l = net->listen(0, &h);
    setenv("MKFAKE_IB_FAIL", at_connect, 1);
    const Thrown t = thrown([&] { net->connect(0, h); });
    CHECK(t.code == mkSystemError);
    CHECK_MESSAGE(has(t.what, "verbs transport: ibv_" + std::string(at_connect).substr(0, std::strlen(at_connect) - 2)), t.what);
    const mkfake_ib_counts c = counts();
    CHECK(c.cqs == base.cqs);
    CHECK(c.qps == base.qps);
    CHECK(c.mrs == base.mrs);
    CHECK(net->accept(l) == nullptr);  // the stream it may have opened carries no hello: no connection
    net->close_listen(l);
  }
  // At accept (the receiver's move to RTR): accept fails, the sender's request
  // fails instead of hanging.
  auto net = fake_net("ib");
  Handle h;
  ListenComm* l = net->listen(0, &h);
  SendComm* s = until([&] { return net->connect(0, h); });
  const mkfake_ib_counts base = counts();
  setenv("MKFAKE_IB_FAIL", "modify_qp:2", 1);
  const Thrown t = thrown([&] { until([&] { return net->accept(l); }); });
  CHECK(t.code == mkSystemError);
  CHECK_MESSAGE(has(t.what, "ibv_modify_qp to RTR"), t.what);
  const mkfake_ib_counts c = counts();
  CHECK(c.qps == base.qps);
  CHECK(c.cqs == base.cqs);
  CHECK(c.mrs == base.mrs);
  unsetenv("MKFAKE_IB_FAIL");
  uint64_t x = 1;
  const Thrown ts = thrown([&] { done(*net, until([&] { return net->isend(s, &x, 8, 0, nullptr); }), 5000); });
  CHECK_MESSAGE(has(ts.what, "closed by the peer before the connection was set up"), ts.what);
  net->close_send(s);
  net->close_listen(l);
  net.reset();
  const mkfake_ib_counts end = counts();
  CHECK(end.contexts + end.pds + end.mrs + end.cqs + end.qps == 0);
}

TEST_CASE("net verbs: registered host memory and dma-buf memory carry messages") {
  auto net = fake_net("ib");
  Pair p(*net);
  const size_t n = 300000;  // several RDMA writes (the fake's max_msg_sz is 1 MiB) of many cells
  const int fd = ::memfd_create("mkt-dmabuf", MFD_CLOEXEC);  // stands in for a GPU's dma-buf
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, 1 << 20) == 0);
  auto* dst = static_cast<uint8_t*>(::mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  REQUIRE(dst != MAP_FAILED);
  std::memset(dst, 0xee, 1 << 20);
  std::vector<uint8_t> src(n);
  for (size_t i = 0; i < n; ++i) src[i] = uint8_t(i * 7 + (i >> 9));
  MemHandle* ms = net->reg_mr(p.s, src.data(), n, kPtrHost);
  MemHandle* mr = net->reg_mr_dmabuf(p.r, dst + 4096, n + 100, kPtrCuda, 4096, fd);
  CHECK(thrown([&] { net->reg_mr(p.r, dst, 64, kPtrCuda); }).code == mkInvalidUsage);
  Request* qs = until([&] { return net->isend(p.s, src.data(), n, 3, ms); });
  Request* qr = until([&] { return net->irecv(p.r, dst + 4096, n + 100, 3, mr); });
  const auto deadline = Clock::now() + std::chrono::seconds(8);
  size_t got = 0, sent = 0;
  for (bool a = false, b = false; !(a && b) && Clock::now() < deadline;) {
    a = a || net->test(qs, &sent);
    b = b || net->test(qr, &got);
  }
  CHECK(sent == n);
  CHECK(got == n);
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += dst[4096 + i] != src[i];
  for (size_t i = 0; i < 4096; ++i) bad += dst[i] != 0xee;  // nothing around it was written
  for (size_t i = 4096 + n; i < (1 << 20); ++i) bad += dst[i] != 0xee;
  CHECK(bad == 0);
  net->dereg_mr(p.s, ms);
  net->dereg_mr(p.r, mr);
  ::munmap(dst, 1 << 20);
  ::close(fd);
}

#else

TEST_CASE("net verbs: skipped") { MESSAGE("SKIPPED: the fake libibverbs was not built (no infiniband/verbs.h)"); }

#endif
