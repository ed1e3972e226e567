#include "runtime/proxy/proxy.hpp"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include "runtime/api/status.hpp"
#include "runtime/driver/cuda_driver.hpp"
#include "templates/net.cuh"

namespace mk::rt {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kWireMagic = 0x58504b4d;  // "MKPX"
enum WireKind : uint32_t { kHello = 0, kPut = dev::kNetPut, kSignal = dev::kNetSignal, kBye = 3 };

struct WireHeader {
  uint32_t magic;
  uint32_t kind;
  uint64_t seq;   // this connection's message number (the hello is 0)
  uint64_t arg;   // put: destination offset; signal: value
  uint32_t arg2;  // put: bytes; signal: flag index
  int32_t rank;   // hello: the sender's rank
  int32_t tb;     // hello: the sender's block
  int32_t nranks; // hello: the sender's communicator size
  uint8_t pad[24];
};
static_assert(sizeof(WireHeader) == dev::kNetHeaderBytes, "the wire header fills the staging prefix");

std::string kind_name(uint32_t k) {
  return k == kPut ? "put" : k == kSignal ? "signal" : k == kHello ? "hello" : k == kBye ? "goodbye" : "kind-" + std::to_string(k);
}

// Host-pinned memory mapped into the GPU.
struct Pinned {
  void* host = nullptr;
  CUdeviceptr dev = 0;
  void alloc(size_t bytes) {
    MK_CU(cu().cuMemHostAlloc(&host, bytes, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE),
          "proxy: allocating pinned host memory");
    std::memset(host, 0, bytes);
    MK_CU(cu().cuMemHostGetDevicePointer(&dev, host, 0), "proxy: mapping pinned host memory");
  }
  ~Pinned() {
    if (host) cu().cuMemFreeHost(host);
  }
};

}  // namespace

// One transport connection to a peer: the FIFOs of every block with puts of
// one size (or signals only) to that peer share it. Messages carry the
// wire's own sequence numbers; each FIFO's messages stay in its order.
struct Proxy::Wire {
  int peer = 0, kind = 0, tb = 0;  // tb: the first FIFO's block (for messages)
  uint64_t max_put = 0;
  net::Net* net = nullptr;
  void* comm = nullptr;
  uint64_t seq = 1;  // the next message's number (the hello is 0)
  WireHeader hello{};
  net::MemHandle* mh_hello = nullptr;
  net::Request* hello_req = nullptr;
  bool hello_done = false;
  net::Request* bye_req = nullptr;
  bool bye_done = false;
  std::vector<SendConn*> fifos;
  ~Wire() {
    try {  // a plugin's close may fail: never from a destructor
      if (comm && mh_hello) net->dereg_mr(comm, mh_hello);
      if (comm) net->close_send(comm);
    } catch (...) {
    }
  }
};

// A block's trigger FIFO to one peer (one producer), sent over its wire.
struct Proxy::SendConn {
  int tb = 0, peer = 0;
  int kind = 0;  // the transport (index into the proxy's list)
  uint32_t index = 0;
  uint64_t max_put = 0;
  Wire* wire = nullptr;
  Pinned fifo, staging, done;
  CUdeviceptr posted = 0;
  dev::NetConnDev view{};
  uint64_t taken = 0;    // entries taken from the FIFO (sent or sending)
  uint64_t finished = 0; // entries whose send completed (mirrors *done)
  net::MemHandle* mh_staging = nullptr;  // on the wire's connection (NCCL plugins need a registration per send)
  struct InFlight {
    net::Request* req;
    uint64_t entry;
  };
  std::vector<InFlight> flight;  // in order
  Clock::time_point last_progress = Clock::now();
  ~SendConn() {
    try {
      if (wire && wire->comm && mh_staging) wire->net->dereg_mr(wire->comm, mh_staging);
    } catch (...) {
    }
    if (posted) cu().cuMemFree(posted);
  }
};

struct Proxy::RecvConn {
  net::Net* net = nullptr;
  void* comm = nullptr;
  int rank = -1, tb = -1;  // learnt from the hello
  uint64_t seq = 0;        // next message expected
  std::vector<char> hello;  // the first message's buffer
  net::MemHandle* mh_hello = nullptr;
  net::Request* hello_req = nullptr;
  // After the hello: a ring of pinned buffers, message k in buffer k % n.
  // Receives are posted in ring order (the n-th receive posted gets the
  // n-th message); a received message is copied into the arena on the
  // proxy's stream and its buffer is posted again once its event says the
  // copy read it. landed <= received <= posted <= landed + n.
  uint64_t stride = 0;
  Pinned bufs;
  std::vector<net::MemHandle*> mhs;  // per buffer: the transport's registrations
  std::vector<net::Request*> reqs;   // per buffer
  std::vector<CUevent> evs;          // per buffer: its copy into the arena
  uint64_t posted = 0, received = 0, landed = 0;
  bool ended = false;  // the peer said goodbye
  char* buf(uint64_t k) { return static_cast<char*>(bufs.host) + (k % reqs.size()) * stride; }
  ~RecvConn() {
    try {
      if (comm && mh_hello) net->dereg_mr(comm, mh_hello);
      for (net::MemHandle* m : mhs)
        if (m && comm) net->dereg_mr(comm, m);
      if (comm) net->close_recv(comm);
    } catch (...) {
    }
    for (CUevent e : evs)
      if (e) cu().cuEventDestroy(e);
  }
};

Proxy::Proxy(net::Net& net, int dev, const ProxyConfig& cfg) : Proxy(std::vector<net::Net*>{&net}, dev, cfg) {}

Proxy::Proxy(std::vector<net::Net*> nets, int dev, const ProxyConfig& cfg)
    : nets_(std::move(nets)), dev_(dev), cfg_(cfg) {
  if (cfg.entries < 2 || cfg.entries > 16 || (cfg.entries & (cfg.entries - 1)))
    fail(mkInvalidArgument, "proxy: FIFO entries must be a power of two in 2..16, not " + std::to_string(cfg.entries));
  if (cfg.flag_bytes > cfg.arena_bytes)
    fail(mkInternalError, "proxy: the flag region is larger than the arena");
  if (std::none_of(nets_.begin(), nets_.end(), [](net::Net* n) { return n != nullptr; }))
    fail(mkInternalError, "proxy: no transport");
  listens_.assign(nets_.size(), nullptr);
  handles_.assign(nets_.size(), net::Handle{});
  try {
    for (size_t k = 0; k < nets_.size(); ++k)
      if (nets_[k]) listens_[k] = nets_[k]->listen(dev_, &handles_[k]);
    CtxGuard g(cfg_.ctx);
    MK_CU(cu().cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), "proxy: creating its stream");
  } catch (...) {  // no destructor runs: what was opened closes here
    for (size_t k = 0; k < nets_.size(); ++k)
      if (listens_[k]) nets_[k]->close_listen(listens_[k]);
    throw;
  }
  thread_ = std::thread([this] { run(); });
}

Proxy::~Proxy() {
  stop();
  CtxGuard g(cfg_.ctx);
  std::lock_guard<std::mutex> lk(mu_);
  // Copies into the arena still queued read the receive buffers freed below
  // (bounded: the stream holds only the proxy's own copies).
  if (stream_) cu().cuStreamSynchronize(stream_);
  sends_.clear();  // before their wires (registrations on the wires' connections)
  wires_.clear();
  recvs_.clear();
  for (size_t k = 0; k < nets_.size(); ++k)
    if (listens_[k]) nets_[k]->close_listen(listens_[k]);
  if (stream_) cu().cuStreamDestroy(stream_);
}

void Proxy::stop() {
  stop_.store(true);
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void Proxy::finish(int64_t bound_ms) {
  finishing_.store(true);
  const auto deadline = Clock::now() + std::chrono::milliseconds(bound_ms);
  while (thread_.joinable() && Clock::now() < deadline) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!error_.empty()) break;
      bool all = true;
      for (auto& w : wires_) all = all && w->bye_done;
      if (all) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  stop();
}

void Proxy::abort() {
  stop();
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& w : wires_)
    if (w->comm) {
      try {
        w->net->close_send(w->comm);
      } catch (...) {
      }
      w->comm = nullptr;
    }
  for (auto& c : recvs_)
    if (c->comm) {
      try {
        c->net->close_recv(c->comm);
      } catch (...) {
      }
      c->comm = nullptr;
    }
  if (error_.empty()) error_ = "rank " + std::to_string(cfg_.rank) + ": network proxy: aborted (mkCommAbort, a failure, or mkCommShrink with MK_SHRINK_ABORT)";
}

void Proxy::set_peer_handles(std::vector<net::Handle> all) {
  std::vector<std::vector<net::Handle>> by_rank;
  for (const net::Handle& h : all) by_rank.push_back({h});
  set_peer_handles(std::move(by_rank));
}

void Proxy::set_peer_handles(std::vector<std::vector<net::Handle>> all) {
  if (int(all.size()) != cfg_.nranks) fail(mkInternalError, "proxy: one handle list per rank expected");
  for (const auto& h : all)
    if (h.size() != nets_.size()) fail(mkInternalError, "proxy: one handle per transport expected");
  std::lock_guard<std::mutex> lk(mu_);
  peers_ = std::move(all);
}

namespace {
bool present(const net::Handle& h) {
  return std::any_of(std::begin(h.bytes), std::end(h.bytes), [](auto b) { return b != 0; });
}
}  // namespace

std::vector<std::pair<int, int>> Proxy::send_transports() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<std::pair<int, int>> v;
  for (const auto& c : sends_) v.emplace_back(c->peer, c->kind);
  return v;
}

std::string Proxy::error() const {
  std::lock_guard<std::mutex> lk(mu_);
  return error_;
}

Proxy::Stats Proxy::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  Stats s = stats_;
  s.send_conns = int(sends_.size());
  s.wires = int(wires_.size());
  s.recv_conns = int(recvs_.size());
  return s;
}

dev::NetConnDev Proxy::add_send(int tb, int peer, uint64_t max_put) {
  if (max_put > cfg_.max_put_bytes)
    fail(mkInternalError, fmt::format("proxy: puts of {} bytes, above the largest ({})", max_put, cfg_.max_put_bytes));
  net::Handle h;
  int kind = -1;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!error_.empty()) fail(mkRemoteError, error_);
    if (peer < 0 || peer >= int(peers_.size()) || peer == cfg_.rank)
      fail(mkInternalError, "proxy: no handle for rank " + std::to_string(peer));
    // The first transport both ends have (the list is in order of preference).
    for (size_t k = 0; k < nets_.size() && kind < 0; ++k)
      if (nets_[k] && present(peers_[size_t(peer)][k])) kind = int(k);
    if (kind < 0)
      fail(mkInvalidUsage, "rank " + std::to_string(cfg_.rank) + ": proxy: rank " + std::to_string(peer) +
                               " has none of this rank's network transports");
    h = peers_[size_t(peer)][size_t(kind)];
  }
  std::lock_guard<std::mutex> adding(add_mu_);  // one add_send at a time: wires are found or made once
  auto c = std::make_unique<SendConn>();
  c->tb = tb;
  c->peer = peer;
  c->kind = kind;
  {
    CtxGuard g(cfg_.ctx);
    const uint64_t stride = dev::kNetHeaderBytes + ((max_put + 63) & ~uint64_t(63));
    c->max_put = max_put;
    c->fifo.alloc(sizeof(dev::NetDesc) * cfg_.entries);
    c->staging.alloc(stride * cfg_.entries);
    c->done.alloc(64);
    MK_CU(cu().cuMemAlloc(&c->posted, 8), "proxy: allocating a connection's counter");
    // On the proxy's stream: never behind the user's kernels (the legacy stream would be)
    MK_CU(cu().cuMemsetD8Async(c->posted, 0, 8, stream_), "proxy: clearing a connection's counter");
    MK_CU(cu().cuStreamSynchronize(stream_), "proxy: clearing a connection's counter");
    c->view.fifo = reinterpret_cast<dev::NetDesc*>(c->fifo.dev);
    c->view.staging = reinterpret_cast<char*>(c->staging.dev);
    c->view.done = reinterpret_cast<const volatile uint64_t*>(c->done.dev);
    c->view.posted = reinterpret_cast<uint64_t*>(c->posted);
    c->view.stride = stride;
    c->view.entries = cfg_.entries;
  }
  // The wire to this peer for puts of this size: found, or made (outside
  // the lock: connecting may take a while; the thread sees it once listed).
  Wire* w = nullptr;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& x : wires_)
      if (x->peer == peer && x->kind == kind && x->max_put == max_put) w = x.get();
  }
  std::unique_ptr<Wire> made;
  if (!w) {
    made = std::make_unique<Wire>();
    made->peer = peer;
    made->kind = kind;
    made->tb = tb;
    made->max_put = max_put;
    made->net = nets_[size_t(kind)];
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    while (!(made->comm = made->net->connect(dev_, h))) {
      if (Clock::now() > deadline)
        fail(mkRemoteError, "rank " + std::to_string(cfg_.rank) + ": proxy: connecting to rank " +
                                std::to_string(peer) + " did not complete within 30 s");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    made->hello = WireHeader{kWireMagic, kHello, 0, 0, uint32_t(max_put), cfg_.rank, tb, cfg_.nranks, {}};
    made->mh_hello = made->net->reg_mr(made->comm, &made->hello, sizeof made->hello, net::kPtrHost);
    // The hello goes out now, before any plan can use the wire: a peer then
    // knows who it is even if this rank aborts right after (its errors name us).
    made->hello_req = nullptr;
    size_t n = 0;
    while (!made->hello_req || !made->net->test(made->hello_req, &n)) {
      if (!made->hello_req) made->hello_req = made->net->isend(made->comm, &made->hello, sizeof made->hello, 0, made->mh_hello);
      if (Clock::now() > deadline)
        fail(mkRemoteError, "rank " + std::to_string(cfg_.rank) + ": proxy: rank " + std::to_string(peer) +
                                " did not take this rank's hello within 30 s");
      std::this_thread::yield();
    }
    made->hello_done = true;
    w = made.get();
  }
  // Registered once on the wire (NCCL plugins need a registration for every
  // send); on a listed wire under the lock: the thread uses its connection.
  std::lock_guard<std::mutex> lk(mu_);
  if (!made && !w->comm) fail(mkRemoteError, error_.empty() ? "proxy: the connection was closed" : error_);
  c->mh_staging = w->net->reg_mr(w->comm, c->staging.host, c->view.stride * cfg_.entries, net::kPtrHost);
  c->wire = w;
  if (made) wires_.push_back(std::move(made));
  c->index = uint32_t(sends_.size());
  c->view.conn = c->index;
  w->fifos.push_back(c.get());
  sends_.push_back(std::move(c));
  return sends_.back()->view;
}

void Proxy::failed(const std::string& what) {
  // Called with mu_ held, from the thread.
  if (error_.empty()) {
    error_ = "rank " + std::to_string(cfg_.rank) + ": network proxy: " + what;
    debug_log(error_);
  }
  if (cfg_.abort_word) *cfg_.abort_word = 1;
}

bool Proxy::step_wire(Wire& w) {
  bool moved = false;
  try {
    if (!w.hello_done) {
      if (!w.hello_req) w.hello_req = w.net->isend(w.comm, &w.hello, sizeof w.hello, 0, w.mh_hello);
      size_t n;
      if (w.hello_req && w.net->test(w.hello_req, &n)) {
        w.hello_done = true;
        moved = true;
      }
      if (!w.hello_done) return moved;
    }
  } catch (const std::exception& e) {
    failed("connecting to rank " + std::to_string(w.peer) + ": " + e.what());
    return false;
  }
  bool idle = true;  // every FIFO of the wire sent all it committed
  for (SendConn* c : w.fifos) {
    if (!error_.empty()) return moved;
    moved |= step_send(*c, &idle);
  }
  // finish(): once everything committed went out, a goodbye (in the hello's
  // buffer, long sent).
  if (finishing_.load() && !w.bye_done && idle && error_.empty()) {
    try {
      if (!w.bye_req) {
        w.hello = WireHeader{kWireMagic, kBye, w.seq, 0, 0, cfg_.rank, w.tb, cfg_.nranks, {}};
        w.bye_req = w.net->isend(w.comm, &w.hello, sizeof w.hello, 1, w.mh_hello);
      }
      size_t n;
      if (w.bye_req && w.net->test(w.bye_req, &n)) {
        w.bye_done = true;
        moved = true;
      }
    } catch (const std::exception& e) {
      failed("saying goodbye to rank " + std::to_string(w.peer) + ": " + e.what());
    }
  }
  return moved;
}

bool Proxy::step_send(SendConn& c, bool* idle) {
  bool moved = false;
  Wire& w = *c.wire;
  auto who = [&] { return "rank " + std::to_string(c.peer) + " (block " + std::to_string(c.tb) + ")"; };  // errors only
  auto* fifo = static_cast<dev::NetDesc*>(c.fifo.host);
  try {
    // Take newly committed entries (in order) while the wire takes them.
    while (c.flight.size() < size_t(cfg_.entries)) {
      dev::NetDesc& d = fifo[c.taken & (cfg_.entries - 1)];
      const uint32_t tag = __atomic_load_n(&d.tag, __ATOMIC_ACQUIRE);
      const uint32_t want = dev::net_tag(0, c.index, c.taken);
      if ((tag & ~3u) != want) break;
      const uint32_t kind = dev::net_tag_kind(tag);
      char* slot = static_cast<char*>(c.staging.host) + (c.taken & (cfg_.entries - 1)) * c.view.stride;
      auto* h = reinterpret_cast<WireHeader*>(slot);
      *h = WireHeader{kWireMagic, kind, w.seq, d.arg, d.arg2, cfg_.rank, c.tb, cfg_.nranks, {}};
      size_t bytes = sizeof(WireHeader);
      if (kind == kPut) {
        if (d.arg2 > c.max_put) {
          failed("block " + std::to_string(c.tb) + " posted a put of " + std::to_string(d.arg2) + " bytes to " + who() +
                 ", above its connection's largest (" + std::to_string(c.max_put) + ")");
          return false;
        }
        bytes += d.arg2;
      } else if (kind != kSignal) {
        failed("block " + std::to_string(c.tb) + " posted a trigger of unknown kind " + std::to_string(kind));
        return false;
      }
      net::Request* r = w.net->isend(w.comm, slot, bytes, 1, c.mh_staging);
      if (!r) break;  // the connection is full: later
      c.flight.push_back({r, c.taken});
      ++c.taken;
      ++w.seq;
      moved = true;
      if (kind == kPut) {
        ++stats_.puts_sent;
        stats_.bytes_sent += d.arg2;
      } else {
        ++stats_.signals_sent;
      }
    }
    // Retire completed sends in order; each frees its FIFO entry.
    while (!c.flight.empty()) {
      size_t n;
      if (!w.net->test(c.flight.front().req, &n)) break;
      c.flight.erase(c.flight.begin());
      ++c.finished;
      __atomic_store_n(static_cast<uint64_t*>(c.done.host), c.finished, __ATOMIC_RELEASE);
      moved = true;
    }
  } catch (const std::exception& e) {
    failed("sending to " + who() + ": " + e.what());
    return false;
  }
  const dev::NetDesc& next = fifo[c.taken & (cfg_.entries - 1)];
  const bool pending = (__atomic_load_n(&next.tag, __ATOMIC_ACQUIRE) & ~3u) == dev::net_tag(0, c.index, c.taken);
  if (!c.flight.empty() || pending) *idle = false;
  const auto now = Clock::now();
  if (moved || c.flight.empty()) {
    c.last_progress = now;
  } else if (cfg_.timeout_ms > 0 && now - c.last_progress > std::chrono::milliseconds(cfg_.timeout_ms)) {
    failed("sending to " + who() + ": no progress for " + std::to_string(cfg_.timeout_ms) +
           " ms (the peer stopped reading; MK_TIMEOUT_MS)");
  }
  return moved;
}

bool Proxy::step_recv(RecvConn& c) {
  if (c.ended) return false;
  bool moved = false;
  auto who = [&] {
    return c.rank < 0 ? std::string("a peer (before its hello)")
                      : "rank " + std::to_string(c.rank) + " (block " + std::to_string(c.tb) + ")";
  };
  try {
    if (c.rank < 0) {  // the hello: who this connection comes from
      if (!c.mh_hello) c.mh_hello = c.net->reg_mr(c.comm, c.hello.data(), c.hello.size(), net::kPtrHost);
      if (!c.hello_req) c.hello_req = c.net->irecv(c.comm, c.hello.data(), c.hello.size(), 0, c.mh_hello);
      if (!c.hello_req) return false;
      size_t n = 0;
      if (!c.net->test(c.hello_req, &n)) return false;
      c.hello_req = nullptr;
      WireHeader h;
      std::memcpy(&h, c.hello.data(), sizeof h);
      if (n != sizeof h || h.magic != kWireMagic || h.kind != kHello || h.seq != 0 || h.nranks != cfg_.nranks ||
          h.rank < 0 || h.rank >= cfg_.nranks || h.rank == cfg_.rank || h.tb < 0 || h.arg2 > cfg_.max_put_bytes) {
        failed("a connection opened with a message that is not a hello of this communicator (" + std::to_string(n) +
               " bytes)");
        return false;
      }
      c.rank = h.rank;
      c.tb = h.tb;
      c.seq = 1;
      CtxGuard g(cfg_.ctx);
      c.stride = dev::kNetHeaderBytes + ((uint64_t(h.arg2) + 63) & ~uint64_t(63));  // its largest put
      // A wire carries the FIFOs of several blocks: as many receives posted
      // as the transport takes (32), within 32 MiB of buffers, at least
      // one FIFO's depth.
      const uint64_t depth = std::clamp<uint64_t>((uint64_t(32) << 20) / c.stride, cfg_.entries, net::kMaxRequests);
      c.bufs.alloc(c.stride * depth);
      c.mhs.assign(depth, nullptr);
      c.reqs.assign(depth, nullptr);
      c.evs.assign(depth, nullptr);
      for (CUevent& e : c.evs) MK_CU(cu().cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "proxy: creating an event");
      moved = true;
    }
    const uint64_t n_bufs = c.reqs.size();
    // Buffers whose copy finished are free again (copies finish in order: one stream).
    while (c.landed < c.received) {
      const CUresult r = cu().cuEventQuery(c.evs[c.landed % n_bufs]);
      if (r == CUDA_ERROR_NOT_READY) break;
      MK_CU(r, "proxy: waiting for a copy into the arena");
      ++c.landed;
      moved = true;
    }
    // Every free buffer waits for a message, in ring order (a transport may
    // refuse one for now: the rest wait behind it). A post may fail because
    // the peer closed: its goodbye may still wait in a receive posted
    // earlier, so the failure counts only once those were taken.
    std::string post_error;
    try {
      while (c.posted < c.landed + n_bufs) {
        const size_t i = c.posted % n_bufs;
        if (!c.mhs[i]) c.mhs[i] = c.net->reg_mr(c.comm, c.buf(c.posted), c.stride, net::kPtrHost);
        c.reqs[i] = c.net->irecv(c.comm, c.buf(c.posted), c.stride, 1, c.mhs[i]);
        if (!c.reqs[i]) break;
        ++c.posted;
      }
    } catch (const std::exception& e) {
      post_error = e.what();
    }
    CtxGuard g(cfg_.ctx);
    while (c.received < c.posted) {
      const size_t i = c.received % n_bufs;
      size_t n = 0;
      if (!c.net->test(c.reqs[i], &n)) break;
      c.reqs[i] = nullptr;
      WireHeader h;
      char* buf = c.buf(c.received);
      std::memcpy(&h, buf, sizeof h);
      auto refuse = [&](const std::string& why) {
        failed("from " + who() + ": " + kind_name(h.kind) + " message " + std::to_string(c.seq) + ": " + why);
      };
      if (n < sizeof h || h.magic != kWireMagic || h.seq != c.seq) {
        refuse("not the message due (" + std::to_string(n) + " bytes, sequence " + std::to_string(h.seq) + ")");
        return false;
      }
      if (h.kind == kBye) {  // the peer ends cleanly: its close is no failure
        c.ended = true;
        return true;
      }
      if (h.kind == kPut) {
        const uint64_t bytes = n - sizeof h;
        if (bytes != h.arg2 || h.arg < cfg_.flag_bytes || h.arg > cfg_.arena_bytes ||
            bytes > cfg_.arena_bytes - h.arg) {
          refuse("a put of " + std::to_string(h.arg2) + " bytes (" + std::to_string(bytes) + " arrived) at offset " +
                 std::to_string(h.arg) + " lies outside this rank's scratch");
          return false;
        }
        MK_CU(cu().cuMemcpyHtoDAsync(cfg_.arena + h.arg, buf + sizeof h, bytes, stream_), "proxy: landing a put");
        ++stats_.puts_landed;
      } else if (h.kind == kSignal) {
        if (n != sizeof h || uint64_t(h.arg2) * 8 + 8 > cfg_.flag_bytes) {
          refuse("flag word " + std::to_string(h.arg2) + " lies outside this rank's flags");
          return false;
        }
        std::memcpy(buf, &h.arg, 8);  // the value, where the copy reads it
        MK_CU(cu().cuMemcpyHtoDAsync(cfg_.arena + uint64_t(h.arg2) * 8, buf, 8, stream_), "proxy: landing a signal");
        ++stats_.signals_landed;
      } else {
        refuse("unknown kind");
        return false;
      }
      // One stream: a put's data lands before any later signal (of any
      // connection). The buffer is posted again once the copy read it.
      MK_CU(cu().cuEventRecord(c.evs[i], stream_), "proxy: recording a copy's event");
      ++c.seq;
      ++c.received;
      moved = true;
    }
    if (!post_error.empty() && c.received == c.posted) {
      failed("receiving from " + who() + ": " + post_error);
      return false;
    }
  } catch (const std::exception& e) {
    failed("receiving from " + who() + ": " + e.what());
    return false;
  }
  return moved;
}

bool Proxy::accept_new() {
  bool any = false;
  for (size_t k = 0; k < nets_.size(); ++k) {
    if (!nets_[k]) continue;
    void* comm = nullptr;
    try {
      comm = nets_[k]->accept(listens_[k]);
    } catch (const std::exception& e) {
      failed(std::string("accepting a connection (") + nets_[k]->name() + "): " + e.what());
      return false;
    }
    if (!comm) continue;
    auto c = std::make_unique<RecvConn>();
    c->net = nets_[k];
    c->comm = comm;
    c->hello.assign(dev::kNetHeaderBytes, 0);  // the hello; then pinned buffers for its puts
    recvs_.push_back(std::move(c));
    any = true;
  }
  return any;
}

void Proxy::run() {
  if (cfg_.ctx) cu().cuCtxSetCurrent(cfg_.ctx);
  auto idle_since = Clock::now();
  while (!stop_.load(std::memory_order_relaxed)) {
    bool moved = false;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (error_.empty()) {
        moved |= accept_new();
        for (auto& w : wires_)
          if (error_.empty()) moved |= step_wire(*w);
        for (auto& c : recvs_)
          if (error_.empty()) moved |= step_recv(*c);
      }
    }
    bool tell = false;
    {
      std::lock_guard<std::mutex> lk(mu_);
      tell = !error_.empty() && !told_;
    }
    if (tell) {
      told_ = true;
      if (cfg_.on_failure && !finishing_.load()) cfg_.on_failure();
      continue;  // (it may have stopped the loop)
    }
    const auto now = Clock::now();
    if (moved) {
      idle_since = now;
    } else if (now - idle_since > std::chrono::seconds(1)) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));  // long idle: give the core back
    } else {
      sched_yield();
    }
  }
}

}  // namespace mk::rt
