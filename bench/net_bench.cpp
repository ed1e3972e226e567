// mk_net_bench: the ceilings and unit costs of mKernel's network path, for
// the multi-node speed table and the cost model (docs/multi-node.md,
// "Speed"; bench/net_speed.sh runs them all on a GPU host).
//
//   mk_net_bench socket [--sizes 64K,1M,4M] [--mib 1024] [--depth 8] [--rounds 2000]
//     The raw rate of the transport the proxy uses (MK_NET=socket; its
//     settings from the environment: MK_SOCKET_NSTREAMS, MK_SOCKET_IFNAME,
//     ...), between two ranks of this process, each with its own Net and
//     thread like two proxies: one direction, then both at once (what an
//     all-reduce across two nodes needs), per message size; and the 8-byte
//     round trip (ping-pong). No GPU.
//   mk_net_bench proxy [--sizes 256K,1M] [--mib 512] [--depth 8] [--conns 4] [--rounds 2000]
//     Two proxies (runtime/proxy) over the socket transport, CPU threads as
//     the kernel's blocks (stage a tile into a FIFO entry, commit, poll
//     flags), host-pinned memory as the arena: the two-way rate with
//     credits, and the round trip of an 8-byte put and its signal.
//   mk_net_bench gpu [--mib 256] [--rounds 2000]
//     GPU stores into host-pinned memory mapped into the GPU (what a put's
//     staging copy does), against the same kernel storing into device
//     memory; and the trigger round trip: a kernel's thread writes a word
//     into pinned memory, a host thread polling it (as the proxy polls its
//     FIFOs) writes an answer into pinned memory, the kernel waits for it.
//
// Medians over runs; every number is of this machine's loopback and PCIe.
#include <cuda_runtime.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "compiler/jit/jit.hpp"
#include "mk_git_commit.hpp"
#include "runtime/api/status.hpp"
#include "runtime/driver/cuda_driver.hpp"
#include "runtime/proxy/proxy.hpp"
#include "runtime/transport/net/net.hpp"
#include "templates/net.cuh"

using namespace mk;
namespace net = mk::rt::net;
using Clock = std::chrono::steady_clock;

namespace {

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "mk_net_bench: %s\n", what.c_str());
  std::exit(1);
}

#define CK(x)                                                                                             \
  do {                                                                                                    \
    cudaError_t e_ = (x);                                                                                 \
    if (e_ != cudaSuccess) die(std::string(#x) + ": " + cudaGetErrorString(e_));                          \
  } while (0)

int64_t parse_size(const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  int64_t mult = 1;
  if (*end == 'K' || *end == 'k') mult = 1 << 10;
  if (*end == 'M' || *end == 'm') mult = 1 << 20;
  if (*end == 'G' || *end == 'g') mult = int64_t(1) << 30;
  if (end == s.c_str() || v <= 0) die("bad size '" + s + "'");
  return int64_t(v * double(mult));
}

std::string human(int64_t b) {
  if (b >= (1 << 20) && b % (1 << 20) == 0) return std::to_string(b >> 20) + " MiB";
  if (b >= 1024 && b % 1024 == 0) return std::to_string(b >> 10) + " KiB";
  return std::to_string(b) + " B";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}
double pct(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, size_t(p * double(v.size())))];
}

// ---- socket ----------------------------------------------------------------------

// One end: a transport instance for its sending connection and one for its
// receiving connection (a thread per direction never shares a Net).
struct Side {
  std::unique_ptr<net::Net> ns, nr;
  net::ListenComm* listen = nullptr;
  net::Handle handle{};
  net::SendComm* send = nullptr;
  net::RecvComm* recv = nullptr;
};

void wait_req(net::Net& n, net::Request* r) {
  size_t bytes;
  while (!n.test(r, &bytes)) {
  }
}

// Sends (or receives) `count` messages of `msg` bytes with up to `depth` outstanding.
void pump(Side& s, std::vector<char>& buf, int64_t msg, int64_t count, int depth, bool send) {
  void* comm = send ? static_cast<void*>(s.send) : static_cast<void*>(s.recv);
  net::Net& n = send ? *s.ns : *s.nr;
  net::MemHandle* mh = n.reg_mr(comm, buf.data(), buf.size(), net::kPtrHost);
  std::vector<net::Request*> q;
  int64_t posted = 0, done = 0;
  size_t head = 0;
  while (done < count) {
    while (posted < count && int64_t(q.size()) - int64_t(head) < depth) {
      char* p = buf.data() + (posted % depth) * msg;
      net::Request* r = send ? n.isend(s.send, p, size_t(msg), 1, mh) : n.irecv(s.recv, p, size_t(msg), 1, mh);
      if (!r) break;
      q.push_back(r);
      ++posted;
    }
    size_t got;
    if (head < q.size() && n.test(q[head], &got)) {
      if (!send && got != size_t(msg))
        die("a message of " + std::to_string(got) + " bytes, " + std::to_string(msg) + " expected");
      ++head;
      ++done;
    }
  }
  n.dereg_mr(comm, mh);
}

// Both directions on one thread (the proxy's shape: one thread per rank
// sends and receives).
void pump_duplex(Side& s, std::vector<char>& sbuf, std::vector<char>& rbuf, int64_t msg, int64_t count, int depth) {
  net::MemHandle* ms = s.ns->reg_mr(s.send, sbuf.data(), sbuf.size(), net::kPtrHost);
  net::MemHandle* mr = s.nr->reg_mr(s.recv, rbuf.data(), rbuf.size(), net::kPtrHost);
  std::vector<net::Request*> sq, rq;
  int64_t sposted = 0, sdone = 0, rposted = 0, rdone = 0;
  size_t sh = 0, rh = 0;
  while (sdone < count || rdone < count) {
    while (rposted < count && int64_t(rq.size()) - int64_t(rh) < depth) {
      net::Request* r = s.nr->irecv(s.recv, rbuf.data() + (rposted % depth) * msg, size_t(msg), 1, mr);
      if (!r) break;
      rq.push_back(r);
      ++rposted;
    }
    while (sposted < count && int64_t(sq.size()) - int64_t(sh) < depth) {
      net::Request* r = s.ns->isend(s.send, sbuf.data() + (sposted % depth) * msg, size_t(msg), 1, ms);
      if (!r) break;
      sq.push_back(r);
      ++sposted;
    }
    size_t n;
    if (sh < sq.size() && s.ns->test(sq[sh], &n)) {
      ++sh;
      ++sdone;
    }
    if (rh < rq.size() && s.nr->test(rq[rh], &n)) {
      if (n != size_t(msg)) die("a message of " + std::to_string(n) + " bytes, " + std::to_string(msg) + " expected");
      ++rh;
      ++rdone;
    }
  }
  s.ns->dereg_mr(s.send, ms);
  s.nr->dereg_mr(s.recv, mr);
}

int socket_mode(const std::vector<int64_t>& sizes, int64_t total, int depth, int rounds) {
  const net::SocketOptions opts = net::socket_options_from_env();
  Side a, b;
  for (Side* x : {&a, &b}) {
    x->ns = net::make_socket_net(opts);
    x->nr = net::make_socket_net(opts);
    x->listen = x->nr->listen(0, &x->handle);
  }
  auto link = [](Side& from, Side& to) {
    while (!(from.send = from.ns->connect(0, to.handle))) std::this_thread::sleep_for(std::chrono::microseconds(100));
    while (!(to.recv = to.nr->accept(to.listen))) std::this_thread::sleep_for(std::chrono::microseconds(100));
  };
  link(a, b);
  link(b, a);
  std::printf("# mk_net_bench socket (loopback TCP; MK_SOCKET_NSTREAMS=%d, %s), commit %s\n\n", opts.nstreams,
              a.ns->name().c_str(), MK_GIT_COMMIT);
  std::printf("| message | one direction GB/s | both directions, one thread per side (the proxy's shape) GB/s each | "
              "both directions, a thread per direction GB/s each |\n|---:|---:|---:|---:|\n");
  for (int64_t msg : sizes) {
    std::vector<char> sa(size_t(msg * depth), 1), ra(size_t(msg * depth)), sb(size_t(msg * depth), 2),
        rb(size_t(msg * depth));
    const int64_t count = std::max<int64_t>(total / msg, 4 * depth);
    auto once = [&](int how) {  // 0: one direction; 1: both, a thread per side; 2: both, a thread per direction
      const auto t0 = Clock::now();
      std::vector<std::thread> ts;
      if (how == 1) {
        ts.emplace_back([&] { pump_duplex(a, sa, ra, msg, count, depth); });
        ts.emplace_back([&] { pump_duplex(b, sb, rb, msg, count, depth); });
      } else {
        ts.emplace_back([&] { pump(a, sa, msg, count, depth, true); });
        ts.emplace_back([&] { pump(b, rb, msg, count, depth, false); });
        if (how == 2) {
          ts.emplace_back([&] { pump(b, sb, msg, count, depth, true); });
          ts.emplace_back([&] { pump(a, ra, msg, count, depth, false); });
        }
      }
      for (auto& t : ts) t.join();
      return double(msg) * double(count) / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9;
    };
    once(0);  // warm-up
    std::vector<double> one, duplex, two;
    for (int r = 0; r < 3; ++r) {
      one.push_back(once(0));
      duplex.push_back(once(1));
      two.push_back(once(2));
    }
    std::printf("| %s | %.2f | %.2f | %.2f |\n", human(msg).c_str(), median(one), median(duplex), median(two));
    std::fflush(stdout);
  }
  // Ping-pong: 8 bytes there and back, one at a time (separate buffers per direction).
  std::vector<char> pa_s(8), pa_r(8), pb(8);
  net::MemHandle* m1 = a.ns->reg_mr(a.send, pa_s.data(), 8, net::kPtrHost);
  net::MemHandle* m2 = b.nr->reg_mr(b.recv, pb.data(), 8, net::kPtrHost);
  net::MemHandle* m3 = b.ns->reg_mr(b.send, pb.data(), 8, net::kPtrHost);
  net::MemHandle* m4 = a.nr->reg_mr(a.recv, pa_r.data(), 8, net::kPtrHost);
  std::thread echo([&] {
    for (int i = 0; i < rounds + 100; ++i) {
      net::Request* r;
      while (!(r = b.nr->irecv(b.recv, pb.data(), 8, 1, m2))) {
      }
      wait_req(*b.nr, r);
      while (!(r = b.ns->isend(b.send, pb.data(), 8, 1, m3))) {
      }
      wait_req(*b.ns, r);
    }
  });
  std::vector<double> rtt;
  for (int i = 0; i < rounds + 100; ++i) {
    const auto t0 = Clock::now();
    net::Request* q;
    while (!(q = a.nr->irecv(a.recv, pa_r.data(), 8, 1, m4))) {
    }
    net::Request* r;
    while (!(r = a.ns->isend(a.send, pa_s.data(), 8, 1, m1))) {
    }
    wait_req(*a.ns, r);
    wait_req(*a.nr, q);
    if (i >= 100) rtt.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  echo.join();
  std::printf("\n8-byte round trip (ping-pong, %d rounds after 100 of warm-up): p10 %.1f us, median %.1f us, p90 %.1f us\n",
              rounds, pct(rtt, 0.1), median(rtt), pct(rtt, 0.9));
  a.ns->dereg_mr(a.send, m1);
  b.nr->dereg_mr(b.recv, m2);
  b.ns->dereg_mr(b.send, m3);
  a.nr->dereg_mr(a.recv, m4);
  for (Side* x : {&a, &b}) {
    x->ns->close_send(x->send);
    x->nr->close_recv(x->recv);
    x->nr->close_listen(x->listen);
  }
  return 0;
}

// ---- proxy (emulated device) ------------------------------------------------------

// Two ranks of this process, each with its own proxy and socket transport;
// CPU threads play the kernels' blocks (stage a tile into a FIFO entry,
// commit it, poll flags), and the arena is host-pinned memory mapped into
// the GPU, so that those threads can read what the proxy lands. What this
// leaves out of the GPU path: the kernel's stores over PCIe into the
// staging area and the receiving copy's DMA (the copy is a host-to-host one
// here, through the driver: cuMemcpyHtoDAsync into mapped memory).
struct ProxyRank {
  CUcontext ctx = nullptr;
  void* arena_host = nullptr;
  CUdeviceptr arena = 0;
  volatile int32_t abort_word = 0;
  std::unique_ptr<net::Net> net;
  std::unique_ptr<rt::Proxy> proxy;
  volatile uint64_t* flag(uint32_t i) { return static_cast<volatile uint64_t*>(arena_host) + i; }
  ~ProxyRank() {
    proxy.reset();
    rt::CtxGuard g(ctx);
    if (arena_host) rt::cu().cuMemFreeHost(arena_host);
  }
};

constexpr uint64_t kPxFlagBytes = 1 << 16;

bool px_spin(const std::function<bool()>& ready, const volatile int32_t* ab) {
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (!ready()) {
    if (*ab || Clock::now() > deadline) return false;
    sched_yield();  // the proxies' threads may share these cores
  }
  return true;
}
uint64_t px_load(volatile uint64_t* p) { return __atomic_load_n(const_cast<uint64_t*>(p), __ATOMIC_ACQUIRE); }
bool px_put(const dev::NetConnDev& c, const void* src, uint32_t bytes, uint64_t dst, const volatile int32_t* ab) {
  return dev::net_host_put(c, src, bytes, dst, [&](const std::function<bool()>& ready) { return px_spin(ready, ab); });
}
bool px_signal(const dev::NetConnDev& c, uint32_t idx, uint64_t value, const volatile int32_t* ab) {
  return dev::net_host_signal(c, idx, value, [&](const std::function<bool()>& ready) { return px_spin(ready, ab); });
}

int proxy_mode(const std::vector<int64_t>& sizes, int64_t total, int depth, int rounds, int conns) {
  const auto& d = rt::cu();
  MK_CU(d.cuInit(0), "cuInit");
  CUdevice dev;
  MK_CU(d.cuDeviceGet(&dev, 0), "cuDeviceGet");
  const int64_t max_msg = *std::max_element(sizes.begin(), sizes.end());
  const uint64_t arena_bytes = kPxFlagBytes + uint64_t(2 * conns * depth) * uint64_t(max_msg);
  const net::SocketOptions opts = net::socket_options_from_env();
  ProxyRank r[2];
  for (ProxyRank& x : r) {
    MK_CU(d.cuDevicePrimaryCtxRetain(&x.ctx, dev), "context");
    rt::CtxGuard g(x.ctx);
    MK_CU(d.cuMemHostAlloc(&x.arena_host, arena_bytes, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE), "arena");
    std::memset(x.arena_host, 0, arena_bytes);
    MK_CU(d.cuMemHostGetDevicePointer(&x.arena, x.arena_host, 0), "arena");
    x.net = net::make_socket_net(opts);
  }
  for (int i = 0; i < 2; ++i) {
    rt::ProxyConfig cfg;
    cfg.rank = i;
    cfg.nranks = 2;
    cfg.ctx = r[i].ctx;
    cfg.arena = r[i].arena;
    cfg.arena_bytes = arena_bytes;
    cfg.flag_bytes = kPxFlagBytes;
    cfg.entries = uint32_t(depth);
    cfg.max_put_bytes = uint64_t(max_msg);
    cfg.timeout_ms = 30000;
    cfg.abort_word = &r[i].abort_word;
    r[i].proxy = std::make_unique<rt::Proxy>(*r[i].net, 0, cfg);
  }
  for (ProxyRank& x : r) x.proxy->set_peer_handles({r[0].proxy->handle(), r[1].proxy->handle()});
  // Per rank and connection c: an "out" connection (tiles and their signals)
  // and a "back" one (credits).
  std::vector<dev::NetConnDev> out[2], back[2];
  for (int i = 0; i < 2; ++i)
    for (int c = 0; c < conns; ++c) {
      out[i].push_back(r[i].proxy->add_send(c, 1 - i, uint64_t(max_msg)));
      back[i].push_back(r[i].proxy->add_send(conns + c, 1 - i, 0));
    }
  std::printf("# mk_net_bench proxy (loopback TCP, emulated device: CPU threads as blocks, pinned memory as the "
              "arena; MK_SOCKET_NSTREAMS=%d, depth %d, %d connection(s) each way), commit %s\n\n",
              opts.nstreams, depth, conns, MK_GIT_COMMIT);
  uint64_t epoch = 0;  // flag values grow across runs
  auto run = [&](int64_t msg, int64_t count) {
    const uint64_t base = epoch;
    epoch += uint64_t(count);
    std::vector<std::thread> ts;
    std::atomic<int> bad{0};
    const auto t0 = Clock::now();
    for (int i = 0; i < 2; ++i)
      for (int c = 0; c < conns; ++c) {
        const uint32_t data_flag = uint32_t(8 + c), credit_flag = uint32_t(8 + conns + c);
        ts.emplace_back([&, i, c, data_flag, credit_flag] {  // sender: rank i's block c
          std::vector<char> tile(size_t(msg), char(i + 1));
          ProxyRank& me = r[i];
          for (int64_t k = 1; k <= count; ++k) {
            if (k > depth && !px_spin([&] { return px_load(me.flag(credit_flag)) >= base + uint64_t(k - depth); },
                                      &me.abort_word))
              return (void)++bad;
            const uint64_t slot = kPxFlagBytes + (uint64_t(c) * uint64_t(depth) + uint64_t(k % depth)) * uint64_t(msg);
            if (!px_put(out[i][size_t(c)], tile.data(), uint32_t(msg), slot, &me.abort_word) ||
                !px_signal(out[i][size_t(c)], data_flag, base + uint64_t(k), &me.abort_word))
              return (void)++bad;
          }
        });
        ts.emplace_back([&, i, c, data_flag, credit_flag] {  // receiver: rank i's block for c's tiles from the peer
          ProxyRank& me = r[i];
          for (int64_t k = 1; k <= count; ++k) {
            if (!px_spin([&] { return px_load(me.flag(data_flag)) >= base + uint64_t(k); }, &me.abort_word))
              return (void)++bad;
            if (!px_signal(back[i][size_t(c)], credit_flag, base + uint64_t(k), &me.abort_word)) return (void)++bad;
          }
        });
      }
    for (auto& t : ts) t.join();
    if (bad) die("the proxy exchange failed: " + r[0].proxy->error() + " / " + r[1].proxy->error());
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  std::printf("| message | proxy, both directions GB/s each |\n|---:|---:|\n");
  for (int64_t msg : sizes) {
    const int64_t count = std::max<int64_t>(total / msg / conns, 4 * depth);
    run(msg, std::min<int64_t>(count, 64));  // warm-up
    std::vector<double> gbs;
    for (int k = 0; k < 3; ++k) gbs.push_back(double(msg) * double(count) * conns / run(msg, count) / 1e9);
    std::printf("| %s | %.2f |\n", human(msg).c_str(), median(gbs));
    std::fflush(stdout);
  }
  // Round trip: an 8-byte put and its signal to the other rank, answered the same way.
  std::vector<double> rtt;
  std::vector<char> eight(8, 1);
  const uint32_t ping = 4, pong = 5;
  std::thread echo([&] {
    for (int k = 1; k <= rounds + 100; ++k) {
      if (!px_spin([&] { return px_load(r[1].flag(ping)) >= uint64_t(k); }, &r[1].abort_word)) return;
      if (!px_put(out[1][0], eight.data(), 8, kPxFlagBytes, &r[1].abort_word) ||
          !px_signal(out[1][0], pong, uint64_t(k), &r[1].abort_word))
        return;
    }
  });
  for (int k = 1; k <= rounds + 100; ++k) {
    const auto t0 = Clock::now();
    if (!px_put(out[0][0], eight.data(), 8, kPxFlagBytes, &r[0].abort_word) ||
        !px_signal(out[0][0], ping, uint64_t(k), &r[0].abort_word) ||
        !px_spin([&] { return px_load(r[0].flag(pong)) >= uint64_t(k); }, &r[0].abort_word))
      die("the proxy round trip failed: " + r[0].proxy->error());
    if (k > 100) rtt.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  echo.join();
  std::printf("\nproxy round trip (an 8-byte put and its signal each way, %d rounds after 100 of warm-up): p10 %.1f us, "
              "median %.1f us, p90 %.1f us\n",
              rounds, pct(rtt, 0.1), median(rtt), pct(rtt, 0.9));
  return 0;
}

// ---- GPU ------------------------------------------------------------------------

const char* kKernels = R"(
extern "C" __global__ void mkn_store(uint4* dst, long long n16, int reps) {
  const uint4 v = make_uint4(threadIdx.x, blockIdx.x, 7u, 9u);
  for (int r = 0; r < reps; ++r)
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n16; i += (long long)gridDim.x * blockDim.x)
      dst[i] = v;
}
// One thread: `rounds` triggers, each answered by the host.
extern "C" __global__ void mkn_ping(volatile unsigned long long* trig, volatile unsigned long long* ans, int rounds,
                                    unsigned long long* ns) {
  unsigned long long t0 = 0;
  for (int i = 1; i <= rounds; ++i) {
    if (i == 101) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    *trig = i;
    __threadfence_system();
    while (*ans != (unsigned long long)i) {
    }
  }
  unsigned long long t1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
  *ns = t1 - t0;
}
)";

int gpu_mode(int64_t bytes, int rounds) {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int arch = prop.major * 10 + prop.minor;
  jit::CompileResult r;
  try {
    r = jit::compile(std::string("typedef unsigned long long uint64_t;\n") + kKernels, "mk_net_bench", arch);
  } catch (const std::exception& e) {
    die(std::string("compiling: ") + e.what());
  }
  cudaLibrary_t lib;
  CK(cudaLibraryLoadData(&lib, r.cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
  cudaKernel_t store, ping;
  CK(cudaLibraryGetKernel(&store, lib, "mkn_store"));
  CK(cudaLibraryGetKernel(&ping, lib, "mkn_ping"));
  std::printf("# mk_net_bench gpu (%s), commit %s\n\n", prop.name, MK_GIT_COMMIT);
  void* host = nullptr;
  void* hdev = nullptr;
  void* dmem = nullptr;
  CK(cudaHostAlloc(&host, size_t(bytes), cudaHostAllocMapped | cudaHostAllocPortable));
  CK(cudaHostGetDevicePointer(&hdev, host, 0));
  CK(cudaMalloc(&dmem, size_t(bytes)));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  auto time_store = [&](void* dst, int blocks) {
    long long n16 = bytes / 16;
    int reps = 1;
    void* args[] = {&dst, &n16, &reps};
    CK(cudaLaunchKernel(reinterpret_cast<const void*>(store), dim3(unsigned(blocks)), dim3(512), args, 0, st));
    std::vector<double> gbs;
    for (int i = 0; i < 10; ++i) {
      CK(cudaEventRecord(e0, st));
      CK(cudaLaunchKernel(reinterpret_cast<const void*>(store), dim3(unsigned(blocks)), dim3(512), args, 0, st));
      CK(cudaEventRecord(e1, st));
      CK(cudaEventSynchronize(e1));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      gbs.push_back(double(bytes) / (double(ms) * 1e6));
    }
    return median(gbs);
  };
  std::printf("| stores of %s by | into pinned host memory GB/s | into device memory GB/s |\n|---|---:|---:|\n",
              human(bytes).c_str());
  for (int blocks : {1, 4, 16, prop.multiProcessorCount}) {
    std::printf("| %d block(s) of 512 threads | %.2f | %.1f |\n", blocks, time_store(hdev, blocks),
                time_store(dmem, blocks));
    std::fflush(stdout);
  }
  // The trigger round trip.
  auto* words = static_cast<volatile unsigned long long*>(host);
  words[0] = 0;
  words[8] = 0;
  unsigned long long* trig_d = static_cast<unsigned long long*>(hdev);
  unsigned long long* ans_d = trig_d + 8;
  unsigned long long* ns_d = nullptr;
  CK(cudaMalloc(&ns_d, 8));
  std::atomic<bool> stop{false};
  std::thread host_side([&] {
    unsigned long long seen = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      const unsigned long long t = __atomic_load_n(const_cast<unsigned long long*>(&words[0]), __ATOMIC_ACQUIRE);
      if (t != seen) {
        seen = t;
        __atomic_store_n(const_cast<unsigned long long*>(&words[8]), t, __ATOMIC_RELEASE);
      }
    }
  });
  int total = rounds + 100;
  void* args[] = {&trig_d, &ans_d, &total, &ns_d};
  CK(cudaLaunchKernel(reinterpret_cast<const void*>(ping), dim3(1), dim3(1), args, 0, st));
  CK(cudaStreamSynchronize(st));
  stop.store(true);
  host_side.join();
  unsigned long long ns = 0;
  CK(cudaMemcpy(&ns, ns_d, 8, cudaMemcpyDeviceToHost));
  std::printf("\ntrigger round trip (a kernel's store into pinned memory, seen by a polling host thread, answered "
              "into pinned memory, seen by the kernel): %.2f us (mean of %d after 100 of warm-up)\n",
              double(ns) / 1e3 / rounds, rounds);
  CK(cudaFreeHost(host));
  CK(cudaFree(dmem));
  CK(cudaFree(ns_d));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string m = argc > 1 ? argv[1] : "";
  if (m != "socket" && m != "gpu" && m != "proxy") {
    std::fprintf(stderr,
                 "usage: mk_net_bench socket [--sizes 64K,1M,4M] [--mib 1024] [--depth 8] [--rounds 2000]\n"
                 "       mk_net_bench proxy [--sizes 256K,1M] [--mib 512] [--depth 8] [--conns 4] [--rounds 2000]\n"
                 "       mk_net_bench gpu [--mib 256] [--rounds 2000]\n");
    return 2;
  }
  const std::string mode = argv[1];
  std::vector<int64_t> sizes = {64 << 10, 256 << 10, 1 << 20, 4 << 20};
  int64_t mib = mode == "socket" ? 1024 : 256;
  int depth = 8, rounds = 2000, conns = 4;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--sizes") {
      sizes.clear();
      std::string v = next();
      for (size_t at = 0; at <= v.size();) {
        const size_t c = std::min(v.find(',', at), v.size());
        sizes.push_back(parse_size(v.substr(at, c - at)));
        at = c + 1;
      }
    } else if (a == "--mib") {
      mib = std::atoll(next().c_str());
    } else if (a == "--depth") {
      depth = std::atoi(next().c_str());
    } else if (a == "--rounds") {
      rounds = std::atoi(next().c_str());
    } else if (a == "--conns") {
      conns = std::atoi(next().c_str());
    } else {
      die("unknown option " + a);
    }
  }
  if (mib < 1 || depth < 1 || depth > 32 || rounds < 1 || conns < 1 || conns > 64)
    die("--mib, --depth (1..32), --rounds and --conns (1..64) must be positive");
  if (mode == "proxy" && (depth & (depth - 1) || depth < 2 || depth > 16)) die("proxy: --depth must be a power of two in 2..16");
  try {
    if (mode == "proxy") return proxy_mode(sizes, mib << 20, depth, rounds, conns);
    return mode == "socket" ? socket_mode(sizes, mib << 20, depth, rounds) : gpu_mode(mib << 20, rounds);
  } catch (const std::exception& e) {
    die(e.what());
  }
}
