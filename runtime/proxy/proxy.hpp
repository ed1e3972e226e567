// The network proxy: one thread per process and communicator rank that
// carries kernels' puts and signals between nodes (templates/net.cuh is the
// kernel's side). No host work per call: kernels write descriptors into
// trigger FIFOs in host-pinned memory, the proxy polls them, moves the data
// over any net::Net (socket, verbs, an NCCL net plugin) and, on the receiving
// rank, writes the data and then the signal into that rank's arena, so that
// graph replays work unchanged.
//
// Connections: a sending rank's thread block to one peer ((tb, peer): the
// IR's connection) has a trigger FIFO of its own (add_send, when a plan that
// uses it is loaded; one producer each). The FIFOs to one peer with puts of
// one size share a transport connection (a wire), made by the first of them:
// it connects to the peer's listen handle (exchanged at init) and sends a
// hello; the receiving proxy accepts it whenever it arrives and learns from
// the hello which rank it comes from. So plans load without any collective
// step beyond what every rank does anyway.
//
// Wire: every message starts with a 64-byte header (kind, sequence number,
// put: destination offset and bytes, signal: flag index and value), followed
// by a put's data. The receiving proxy checks every message before it
// touches memory: a put lands only in this rank's scratch (the arena past its
// flag region), a signal only on a flag word; a hostile or broken peer's
// message fails the connection (sticky error) instead of writing elsewhere.
//
// Without GPUDirect RDMA data is staged in host-pinned memory: the kernel
// copies a put's tile into its FIFO entry's staging area; the receiving
// proxy receives into pinned buffers and copies into the arena on a stream
// of its own (non-blocking, so it never waits for the user's kernels).
//
// Failures (a peer gone, a connection reset, a peer that stops reading for
// longer than the timeout, a message that breaks the rules) are recorded once
// (error(): naming this rank, the peer, the block and the operation), the
// abort word given in the config is set so that this rank's kernels stop in
// their bounded waits, and the proxy stops moving data. stop() and the
// destructor end the thread within milliseconds; nothing in the loop blocks.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/transport/net/net.hpp"

namespace mk::dev {
struct NetConnDev;
}

namespace mk::rt {

struct ProxyConfig {
  int rank = 0;
  int nranks = 1;
  CUcontext ctx = nullptr;          // for the copies into the arena
  CUdeviceptr arena = 0;            // this rank's arena: flags first, then scratch
  uint64_t arena_bytes = 0;
  uint64_t flag_bytes = 0;          // the flag region at the arena's start
  uint32_t entries = 8;             // FIFO entries per connection: a power of two, 2..16
  uint64_t max_put_bytes = 0;       // the largest put (a plan's largest tile)
  int64_t timeout_ms = 600000;      // a send with no progress this long fails (0: never)
  volatile int32_t* abort_word = nullptr;  // set on a failure (may be null)
  // Called once, from the proxy's thread with no lock held, after the first
  // failure was recorded (the communicator aborts: its node's ranks and, as
  // its connections close, the other nodes' learn it). May call abort().
  std::function<void()> on_failure;
};

class Proxy {
 public:
  // Listens on `net`'s device `dev`; starts the thread. Throws RtError.
  Proxy(net::Net& net, int dev, const ProxyConfig& cfg);
  // Several transports in order of preference (a null entry: one this rank
  // lacks); a connection takes the first that both ends have (MK_NET=auto:
  // verbs between ranks that both have an RDMA device, socket otherwise).
  Proxy(std::vector<net::Net*> nets, int dev, const ProxyConfig& cfg);
  ~Proxy();
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;

  // This rank's listen handles, one per transport (all zero for a null
  // one): every rank learns every rank's at init.
  const net::Handle& handle() const { return handles_[0]; }
  const std::vector<net::Handle>& handles() const { return handles_; }
  void set_peer_handles(std::vector<net::Handle> all);               // one transport
  void set_peer_handles(std::vector<std::vector<net::Handle>> all);  // by rank, by transport
  // (peer, transport index) of every connection this rank made, in order.
  std::vector<std::pair<int, int>> send_transports() const;

  // Makes a connection from this rank's block `tb` to `peer` (another node)
  // for puts of at most `max_put` bytes (0: signals only; at most the
  // config's max_put_bytes) and returns what its kernels need (pointers into
  // host-pinned and device memory, valid until the proxy is destroyed). Each
  // call makes a new one: a connection has one producer.
  dev::NetConnDev add_send(int tb, int peer, uint64_t max_put);

  // The first failure ("" while none); the proxy moves nothing after it.
  std::string error() const;
  // Ends the thread (idempotent); connections stay open until destruction.
  void stop();
  // mkCommAbort: ends the thread and closes every connection now, so that
  // the peers' proxies fail at once (and stop their ranks' kernels).
  void abort();
  // A clean end (destroy, after this rank's kernels finished): sends what
  // the kernels committed, then a goodbye on every connection (a peer's
  // proxy retires a connection that said goodbye instead of failing when it
  // closes), waits at most `bound_ms` for that, and ends the thread. No
  // on_failure call after it starts.
  void finish(int64_t bound_ms);

  // Counters for tests and MK_DEBUG.
  struct Stats {
    // landed: checked and queued on the proxy's stream into the arena
    uint64_t puts_sent = 0, signals_sent = 0, puts_landed = 0, signals_landed = 0, bytes_sent = 0;
    int send_conns = 0, recv_conns = 0;  // FIFOs this rank feeds; connections accepted
    int wires = 0;                        // transport connections this rank opened
  };
  Stats stats() const;

  struct SendConn;
  struct RecvConn;
  struct Wire;

 private:
  std::vector<net::Net*> nets_;
  int dev_;
  ProxyConfig cfg_;
  std::vector<net::Handle> handles_;
  std::vector<void*> listens_;
  CUstream stream_ = nullptr;
  std::vector<std::vector<net::Handle>> peers_;  // by rank, by transport

  mutable std::mutex mu_;  // guards the lists below (the thread takes new connections under it)
  std::vector<std::unique_ptr<SendConn>> sends_;
  std::vector<std::unique_ptr<Wire>> wires_;  // the transport connections the FIFOs share
  std::mutex add_mu_;                         // add_send: one at a time
  std::vector<std::unique_ptr<RecvConn>> recvs_;
  std::string error_;
  Stats stats_;

  std::atomic<bool> stop_{false};
  std::atomic<bool> finishing_{false};  // finish(): goodbyes go out, on_failure stays quiet
  bool told_ = false;  // on_failure was called (the thread's own)
  std::thread thread_;

  void run();
  bool step_wire(Wire& w);
  bool step_send(SendConn& c, bool* idle);
  bool step_recv(RecvConn& c);
  bool accept_new();
  void failed(const std::string& what);
};

}  // namespace mk::rt
