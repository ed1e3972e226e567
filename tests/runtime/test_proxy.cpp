// The network proxy (runtime/proxy/proxy.hpp) between processes that stand
// in for nodes, through the socket transport on loopback, with the kernel's
// side played by CPU threads calling the device API itself
// (templates/net.cuh, compiled for the host) and the fake driver's memory as
// GPU memory. What this exercises: loopback TCP, the real proxy, an emulated
// device; not a GPU.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

#include <doctest/doctest.h>

#include "runtime/api/status.hpp"
#include "runtime/bootstrap/bootstrap.hpp"
#include "runtime/driver/cuda_driver.hpp"
#include "runtime/proxy/proxy.hpp"
#include "runtime/transport/net/net.hpp"
#include "tests/runtime/forked.hpp"
#include "templates/net.cuh"
#include "tests/runtime/fake.hpp"

namespace {

using namespace mk;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kFlagBytes = 4096;
constexpr uint64_t kArenaBytes = kFlagBytes + (uint64_t(4) << 20);
constexpr uint64_t kMaxPut = 256 << 10;

uint8_t pattern(int rank, uint64_t k, size_t i) { return uint8_t((i * 7 + k * 131 + size_t(rank) * 61 + (i >> 9)) & 0xff); }

// One rank: its arena (fake device memory, readable here), its proxy.
struct Rank {
  int rank, nranks;
  CUcontext ctx = nullptr;
  CUdeviceptr arena = 0;
  volatile int32_t abort_word = 0;
  std::unique_ptr<rt::net::Net> net;
  std::unique_ptr<rt::net::Net> verbs;  // `verbs_lib`: (fake) verbs first where this rank has it, then socket
  std::unique_ptr<rt::Proxy> proxy;
  std::unique_ptr<rt::Bootstrap> boot;

  Rank(const mkUniqueId& id, int r, int n, int64_t timeout_ms = 20000, const char* verbs_lib = nullptr)
      : rank(r), nranks(n) {
    const auto& d = rt::cu();
    CUdevice dev;
    MK_CU(d.cuDeviceGet(&dev, r % 4), "device");
    MK_CU(d.cuDevicePrimaryCtxRetain(&ctx, dev), "ctx");
    rt::CtxGuard g(ctx);
    MK_CU(d.cuMemAlloc(&arena, kArenaBytes), "arena");
    MK_CU(d.cuMemsetD8(arena, 0, kArenaBytes), "arena");
    rt::net::SocketOptions o;
    o.ifname = "=lo";
    net = rt::net::make_socket_net(o);
    rt::ProxyConfig cfg;
    cfg.rank = r;
    cfg.nranks = n;
    cfg.ctx = ctx;
    cfg.arena = arena;
    cfg.arena_bytes = kArenaBytes;
    cfg.flag_bytes = kFlagBytes;
    cfg.entries = 4;
    cfg.max_put_bytes = kMaxPut;
    cfg.timeout_ms = timeout_ms;
    cfg.abort_word = &abort_word;
    std::vector<rt::net::Net*> nets = {net.get()};
    if (verbs_lib) {
      rt::net::VerbsOptions vo;
      vo.lib = verbs_lib;
      try {
        verbs = rt::net::make_verbs_net(vo);
      } catch (const rt::RtError&) {  // no device on this rank
      }
      nets.insert(nets.begin(), verbs.get());
    }
    proxy = std::make_unique<rt::Proxy>(nets, 0, cfg);
    boot = std::make_unique<rt::Bootstrap>(id, n, r);
    std::string mine;
    for (const auto& h : proxy->handles()) mine.append(reinterpret_cast<const char*>(h.bytes), rt::net::kHandleBytes);
    std::vector<std::vector<rt::net::Handle>> all(static_cast<size_t>(n), std::vector<rt::net::Handle>(nets.size()));
    const auto got = boot->allgather(mine);
    for (int i = 0; i < n; ++i) {
      if (got[size_t(i)].size() != mine.size()) throw std::runtime_error("a rank sent no handle");
      for (size_t k = 0; k < nets.size(); ++k)
        std::memcpy(all[size_t(i)][k].bytes, got[size_t(i)].data() + k * rt::net::kHandleBytes, rt::net::kHandleBytes);
    }
    proxy->set_peer_handles(all);
  }
  ~Rank() {
    proxy.reset();
    rt::CtxGuard g(ctx);
    rt::cu().cuMemFree(arena);
  }
  char* mem() { return reinterpret_cast<char*>(arena); }
  volatile uint64_t* flag(uint32_t idx) { return reinterpret_cast<volatile uint64_t*>(mem()) + idx; }
};

// The kernel's side, as a thread block's thread 0 would run it.
bool spin(const std::function<bool()>& ready, const volatile int32_t* abort_word, int ms = 20000) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(ms);
  while (!ready()) {
    if ((abort_word && *abort_word) || Clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}
bool dev_put(const dev::NetConnDev& c, const void* src, uint32_t bytes, uint64_t dst, const volatile int32_t* ab) {
  return dev::net_host_put(c, src, bytes, dst, [&](const std::function<bool()>& ready) { return spin(ready, ab); });
}
bool dev_signal(const dev::NetConnDev& c, uint32_t idx, uint64_t value, const volatile int32_t* ab) {
  return dev::net_host_signal(c, idx, value, [&](const std::function<bool()>& ready) { return spin(ready, ab); });
}
bool dev_wait(Rank& r, uint32_t idx, uint64_t value, int ms = 20000) {
  return spin([&] { return __atomic_load_n(const_cast<uint64_t*>(r.flag(idx)), __ATOMIC_ACQUIRE) >= value; },
              &r.abort_word, ms);
}

pid_t fork_rank(const std::function<int()>& body) { return mkt::fork_child(body, "rank process"); }
int join(pid_t pid, int ms = 60000) { return mkt::join_child(pid, ms); }

// Flag words: 8 + r (data from rank r landed: the tile number), 16 + r
// (credit from rank r: it consumed that tile). Scratch: two slots per sender.
uint64_t slot_offset(int from, uint64_t k) { return kFlagBytes + (uint64_t(from) * 2 + (k & 1)) * kMaxPut; }

// Every rank sends `tiles` tiles to every other rank through the proxy, two
// scratch slots deep with credits, and checks every byte that lands.
int exchange(Rank& me, int tiles) {
  const int n = me.nranks;
  std::vector<std::thread> blocks;
  std::atomic<int> bad{0};
  for (int peer = 0; peer < n; ++peer) {
    if (peer == me.rank) continue;
    // block `peer` sends to `peer`; block n + peer receives from `peer` and returns credits.
    const dev::NetConnDev out = me.proxy->add_send(peer, peer, kMaxPut);
    const dev::NetConnDev back = me.proxy->add_send(n + peer, peer, kMaxPut);
    blocks.emplace_back([&, peer, out] {
      std::vector<uint8_t> tile(kMaxPut);
      for (uint64_t k = 1; k <= uint64_t(tiles); ++k) {
        const uint32_t bytes = uint32_t(k * 4099 % kMaxPut) + 1;  // 1 B .. 256 KiB, odd sizes
        for (size_t i = 0; i < bytes; ++i) tile[i] = pattern(me.rank, k, i);
        if (k > 2 && !dev_wait(me, 16 + uint32_t(peer), k - 2)) return (void)++bad;  // slot free again
        if (!dev_put(out, tile.data(), bytes, slot_offset(me.rank, k), &me.abort_word)) return (void)++bad;
        if (!dev_signal(out, 8 + uint32_t(me.rank), k, &me.abort_word)) return (void)++bad;
      }
    });
    blocks.emplace_back([&, peer, back] {
      for (uint64_t k = 1; k <= uint64_t(tiles); ++k) {
        if (!dev_wait(me, 8 + uint32_t(peer), k)) return (void)++bad;
        const uint32_t bytes = uint32_t(k * 4099 % kMaxPut) + 1;
        const char* got = me.mem() + slot_offset(peer, k);
        for (size_t i = 0; i < bytes; ++i)
          if (uint8_t(got[i]) != pattern(peer, k, i)) return (void)++bad;
        if (!dev_signal(back, 16 + uint32_t(me.rank), k, &me.abort_word)) return (void)++bad;
      }
    });
  }
  for (auto& t : blocks) t.join();
  if (bad) std::fprintf(stderr, "rank %d: %d block(s) failed; proxy: %s\n", me.rank, bad.load(), me.proxy->error().c_str());
  return bad ? 2 : 0;
}

}  // namespace

TEST_CASE("proxy: ranks on two and four fake nodes exchange tiles with signals and credits through the socket transport") {
  if (!mkt::use_fake()) return;
  for (int n : {2, 4}) {
    CAPTURE(n);
    mkUniqueId id;
    REQUIRE(mkGetUniqueId(&id) == mkSuccess);
    std::vector<pid_t> pids;
    for (int r = 0; r < n; ++r)
      pids.push_back(fork_rank([&, r] {
        Rank me(id, r, n);
        const int rc = exchange(me, 60);
        // The last credits may still be on the wire: every count reaches its total.
        const bool counted = spin(
            [&] {
              const auto st = me.proxy->stats();
              return st.puts_landed == uint64_t(60 * (n - 1)) && st.signals_landed == uint64_t(120 * (n - 1)) &&
                     st.puts_sent == uint64_t(60 * (n - 1)) && st.signals_sent == uint64_t(120 * (n - 1));
            },
            nullptr, 10000);
        // Both blocks' FIFOs to a peer (tiles and credits, one size) share one transport connection.
        const auto st = me.proxy->stats();
        const bool shared = st.send_conns == 2 * (n - 1) && st.wires == n - 1 && st.recv_conns == n - 1;
        if (!shared) std::fprintf(stderr, "rank %d: %d FIFOs, %d wires, %d accepted\n", r, st.send_conns, st.wires, st.recv_conns);
        const bool ok = counted && shared && me.proxy->error().empty();
        me.boot->barrier();  // nobody closes while a peer's credits are still on the wire (a close is an error)
        return rc ? rc : ok ? 0 : 3;
      }));
    for (pid_t p : pids) CHECK(join(p) == 0);
  }
}

#ifdef MKT_FAKE_IBVERBS
// The proxy over two transports at once: ranks 0-2 have a (fake) RDMA
// device, rank 3 none; pairs that both have one run on verbs, the rest on
// the socket transport; the same tiles, signals and credits arrive.
TEST_CASE("proxy: four fake nodes, three with verbs, exchange tiles over verbs and socket connections at once") {
  if (!mkt::use_fake()) return;
  const int n = 4;
  setenv("MKFAKE_IB_NAME", ("mkt-ib-proxy-" + std::to_string(::getpid())).c_str(), 1);
  setenv("MKFAKE_IB_LINK", "roce", 1);
  setenv("MK_SOCKET_IFNAME", "=lo", 1);
  mkUniqueId id;
  REQUIRE(mkGetUniqueId(&id) == mkSuccess);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r)
    pids.push_back(fork_rank([&, r] {
      setenv("MKFAKE_IB_DEVICES", r < 3 ? "1" : "0", 1);
      Rank me(id, r, n, 20000, MKT_FAKE_IBVERBS);
      if ((me.verbs != nullptr) != (r < 3)) return 4;
      const int rc = exchange(me, 40);
      for (auto [peer, kind] : me.proxy->send_transports())
        if (kind != (r < 3 && peer < 3 ? 0 : 1)) return 5;  // 0: verbs, 1: socket
      const bool counted = spin(
          [&] {
            const auto st = me.proxy->stats();
            return st.puts_landed == uint64_t(40 * (n - 1)) && st.signals_landed == uint64_t(80 * (n - 1));
          },
          nullptr, 10000);
      const bool ok = counted && me.proxy->error().empty();
      if (!ok) std::fprintf(stderr, "rank %d: %s\n", r, me.proxy->error().c_str());
      me.boot->barrier();
      return rc ? rc : ok ? 0 : 3;
    }));
  for (pid_t p : pids) CHECK(join(p) == 0);
  unsetenv("MKFAKE_IB_DEVICES");
}
#endif

TEST_CASE("proxy: a killed peer fails the survivor's proxy naming it and sets the abort word") {
  if (!mkt::use_fake()) return;
  mkUniqueId id;
  REQUIRE(mkGetUniqueId(&id) == mkSuccess);
  int up[2], go[2], got[2];  // victim -> parent: its messages left; parent -> survivor: the victim is dead;
                             // survivor -> parent: the victim's messages arrived (a kill could drop them)
  REQUIRE(::pipe(up) == 0);
  REQUIRE(::pipe(go) == 0);
  REQUIRE(::pipe(got) == 0);
  const pid_t victim = fork_rank([&] {
    Rank me(id, 1, 2);
    const dev::NetConnDev out = me.proxy->add_send(0, 0, kMaxPut);
    std::vector<uint8_t> x(64, 1);
    dev_put(out, x.data(), 64, kFlagBytes, &me.abort_word);
    dev_signal(out, 9, 1, &me.abort_word);
    if (!dev_wait(me, 9, 1)) return 2;  // the survivor's signal: both connections are up
    if (!spin([&] { return dev::net_load(out.done) >= 2; }, &me.abort_word)) return 3;  // ours left too
    (void)!::write(up[1], "r", 1);
    ::pause();
    return 0;
  });
  const pid_t survivor = fork_rank([&] {
    Rank me(id, 0, 2);
    const dev::NetConnDev out = me.proxy->add_send(0, 1, kMaxPut);
    dev_signal(out, 9, 1, &me.abort_word);
    if (!dev_wait(me, 9, 1)) return 2;
    (void)!::write(got[1], "s", 1);
    char c;
    if (::read(go[0], &c, 1) != 1) return 3;
    const auto t0 = Clock::now();  // keep sending until the proxy notices
    std::vector<uint8_t> tile(kMaxPut, 7);
    while (!me.abort_word && Clock::now() - t0 < std::chrono::seconds(10))
      if (!dev_put(out, tile.data(), uint32_t(kMaxPut), kFlagBytes, &me.abort_word)) break;
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    const std::string e = me.proxy->error();
    std::fprintf(stderr, "survivor: after %.0f ms: %s\n", ms, e.c_str());
    if (!me.abort_word) return 4;
    if (e.find("rank 0: network proxy:") == std::string::npos || e.find("rank 1") == std::string::npos) return 5;
    return ms < 5000 ? 0 : 6;
  });
  char c;
  REQUIRE(::read(up[0], &c, 1) == 1);
  REQUIRE(::read(got[0], &c, 1) == 1);
  ::kill(victim, SIGKILL);
  join(victim);
  (void)!::write(go[1], "r", 1);
  CHECK(join(survivor) == 0);
  for (int fd : {up[0], up[1], go[0], go[1], got[0], got[1]}) ::close(fd);
}

TEST_CASE("proxy: a peer that stops reading fails the sender within the timeout instead of hanging it") {
  if (!mkt::use_fake()) return;
  mkUniqueId id;
  REQUIRE(mkGetUniqueId(&id) == mkSuccess);
  const pid_t stalled = fork_rank([&] {
    Rank me(id, 1, 2, 300);
    me.proxy->stop();  // alive, connected, never reads again
    me.boot->barrier();
    me.boot->barrier();  // until the sender is done
    return 0;
  });
  const pid_t sender = fork_rank([&] {
    Rank me(id, 0, 2, 300);
    me.boot->barrier();
    const dev::NetConnDev out = me.proxy->add_send(0, 1, kMaxPut);
    std::vector<uint8_t> tile(kMaxPut, 7);
    const auto t0 = Clock::now();
    while (!me.abort_word && Clock::now() - t0 < std::chrono::seconds(20))
      if (!dev_put(out, tile.data(), uint32_t(kMaxPut), kFlagBytes, &me.abort_word)) break;
    const std::string e = me.proxy->error();
    std::fprintf(stderr, "sender: %s\n", e.c_str());
    me.boot->barrier();
    return e.find("no progress for 300 ms") != std::string::npos && e.find("rank 1") != std::string::npos ? 0 : 2;
  });
  CHECK(join(sender) == 0);
  CHECK(join(stalled) == 0);
}

TEST_CASE("proxy: a hostile peer's messages cannot write outside this rank's scratch and flags") {
  if (!mkt::use_fake()) return;
  mkUniqueId id;
  REQUIRE(mkGetUniqueId(&id) == mkSuccess);
  struct Case {
    const char* name;
    uint32_t kind;
    uint64_t arg;
    uint32_t arg2;
    uint32_t data;
    const char* says;
  };
  const Case cases[] = {
      {"a put past the arena", dev::kNetPut, kArenaBytes - 16, 64, 64, "outside this rank's scratch"},
      {"a put into the flags", dev::kNetPut, 0, 64, 64, "outside this rank's scratch"},
      {"a put whose size lies", dev::kNetPut, kFlagBytes, 4096, 64, "outside this rank's scratch"},
      {"a put with a wrapping offset", dev::kNetPut, ~uint64_t(0) - 8, 64, 64, "outside this rank's scratch"},
      {"a signal past the flags", dev::kNetSignal, 1, uint32_t(kFlagBytes / 8), 0, "outside this rank's flags"},
      {"an unknown kind", 7, 0, 0, 0, "unknown kind"},
  };
  for (const Case& k : cases) {
    CAPTURE(k.name);
    mkUniqueId cid;
    REQUIRE(mkGetUniqueId(&cid) == mkSuccess);
    const pid_t victim = fork_rank([&] {
      Rank me(cid, 0, 2);
      me.boot->barrier();
      spin([&] { return !me.proxy->error().empty(); }, nullptr, 10000);
      const std::string e = me.proxy->error();
      std::fprintf(stderr, "victim: %s\n", e.c_str());
      bool clean = true;
      for (uint64_t i = 0; i < kArenaBytes; ++i) clean &= me.mem()[i] == 0;  // nothing landed anywhere
      me.boot->barrier();
      std::fprintf(stderr, "victim: says it %d, arena clean %d, abort %d\n", int(e.find(k.says) != std::string::npos),
                   int(clean), int(me.abort_word));
      return e.find(k.says) != std::string::npos && clean && me.abort_word ? 0 : 2;
    });
    const pid_t attacker = fork_rank([&] {
      // A member of the job (it has the id) that speaks the wire format by hand.
      auto boot = std::make_unique<rt::Bootstrap>(cid, 2, 1);
      const auto got = boot->allgather(std::string(rt::net::kHandleBytes, '\0'));
      rt::net::Handle h;
      std::memcpy(h.bytes, got[0].data(), rt::net::kHandleBytes);
      rt::net::SocketOptions o;
      o.ifname = "=lo";
      auto net = rt::net::make_socket_net(o);
      void* s = net->connect(0, h);
      struct {
        uint32_t magic, kind;
        uint64_t seq, arg;
        uint32_t arg2;
        int32_t rank, tb, nranks;
        uint8_t pad[24];
      } hello{0x58504b4d, 0, 0, 0, 65536, 1, 0, 2, {}}, msg{0x58504b4d, k.kind, 1, k.arg, k.arg2, 1, 0, 2, {}};
      std::vector<char> wire(sizeof msg + k.data, 0x55);
      std::memcpy(wire.data(), &msg, sizeof msg);
      size_t b;
      for (auto* req : {net->isend(s, &hello, sizeof hello, 0, nullptr), net->isend(s, wire.data(), wire.size(), 1, nullptr)})
        while (req && !net->test(req, &b)) std::this_thread::yield();
      boot->barrier();
      boot->barrier();
      net->close_send(s);
      return 0;
    });
    CHECK(join(attacker) == 0);
    CHECK(join(victim) == 0);
  }
}

TEST_CASE("proxy: destroying it with connections live and requests pending returns promptly") {
  if (!mkt::use_fake()) return;
  mkUniqueId id;
  REQUIRE(mkGetUniqueId(&id) == mkSuccess);
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r)
    pids.push_back(fork_rank([&, r] {
      Rank me(id, r, 2);
      const dev::NetConnDev out = me.proxy->add_send(0, 1 - r, kMaxPut);
      std::vector<uint8_t> tile(kMaxPut, 1);
      for (int k = 0; k < 4; ++k) dev_put(out, tile.data(), uint32_t(kMaxPut), kFlagBytes, &me.abort_word);
      me.boot->barrier();
      const auto t0 = Clock::now();
      me.proxy.reset();
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      return ms < 1000 ? 0 : 2;
    }));
  for (pid_t p : pids) CHECK(join(p) == 0);
}
