// Network transports: one interface with the semantics of NCCL's net plugin
// API (ncclNet_v8 .. v11), so that one proxy drives every backend:
//
//   socket   TCP streams, IPv4 and IPv6 (runtime/transport/net/socket.cpp)
//   plugin   any installed NCCL net plugin, loaded through its versioned
//            symbol (runtime/transport/net/plugin.cpp)
//
// and mKernel's socket backend is exported the other way round as an NCCL
// net plugin (nccl/net_plugin.cpp, libnccl-net-mkernel.so).
//
// The contract (what the contract suite, tests/runtime/test_net.cpp, checks
// against every backend):
// - listen() gives a handle of at most kHandleBytes bytes, passed to the peer
//   by the caller (the bootstrap); the peer's connect() with it and accept()
//   here make one one-way connection: a send comm there, a recv comm here.
//   connect() and accept() never block long; they return null to be called
//   again.
// - isend()/irecv() post one message each and return a request, or null when
//   the connection cannot take another now (kMaxRequests outstanding): call
//   again later. Messages arrive in the order they were sent; the n-th
//   irecv receives the n-th isend (0 bytes included), whose size must not
//   exceed the receive's, and whose tag must equal it.
// - test() progresses the connection and says whether the request is done
//   (with the bytes moved); a done request is gone. Any failure (the peer
//   closed or reset the connection, a message larger than its receive, a
//   protocol violation) throws RtError naming the peer, and every later call
//   on that connection throws it again (sticky).
// - Nothing blocks: a peer that stops reading or writing leaves requests
//   pending; the caller bounds its waits (the proxy: MK_TIMEOUT_MS).
// - close_*() release a connection at any time, also with requests pending
//   (they are dropped, never completed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace mk::rt::net {

constexpr size_t kHandleBytes = 128;  // NCCL_NET_HANDLE_MAXSIZE
constexpr int kMaxRequests = 32;      // per connection, NCCL_NET_MAX_REQUESTS

// What memory a backend reaches (NCCL_PTR_*).
enum : int { kPtrHost = 1, kPtrCuda = 2, kPtrDmabuf = 4 };

struct Props {
  std::string name;      // for logs: "eth0", "mlx5_0", ...
  std::string pci_path;  // /sys path of the NIC's PCI device ("" unknown)
  uint64_t guid = 0;
  int ptr_support = kPtrHost;
  bool reg_is_global = false;
  bool force_flush = false;
  int speed_mbps = 0;
  int port = 0;
  float latency_us = 0;
  int max_comms = 65536;
  int max_recvs = 1;
  size_t max_p2p_bytes = size_t(1) << 31;
};

struct Handle {
  uint8_t bytes[kHandleBytes] = {};
};

// Opaque objects of one backend (NCCL's void* comms, requests, mhandles).
using ListenComm = void;
using SendComm = void;
using RecvComm = void;
using Request = void;
using MemHandle = void;

class Net {
 public:
  virtual ~Net() = default;
  virtual std::string name() const = 0;  // "socket", "plugin:libnccl-net-aws-ofi.so (v10)", ...
  virtual int devices() = 0;
  virtual Props properties(int dev) = 0;
  virtual ListenComm* listen(int dev, Handle* handle) = 0;
  virtual SendComm* connect(int dev, const Handle& handle) = 0;  // null: call again
  virtual RecvComm* accept(ListenComm* listen) = 0;              // null: call again
  // `type`: kPtrHost or kPtrCuda; throws mkInvalidUsage when unsupported.
  virtual MemHandle* reg_mr(void* comm, void* data, size_t bytes, int type) = 0;
  virtual MemHandle* reg_mr_dmabuf(void* comm, void* data, size_t bytes, int type, uint64_t offset, int fd) = 0;
  virtual void dereg_mr(void* comm, MemHandle* mh) = 0;
  virtual Request* isend(SendComm* comm, void* data, size_t bytes, int tag, MemHandle* mh) = 0;  // null: busy
  virtual Request* irecv(RecvComm* comm, void* data, size_t bytes, int tag, MemHandle* mh) = 0;  // null: busy
  // Makes received data visible to the GPU (GPUDirect RDMA); null: nothing
  // to wait for.
  virtual Request* iflush(RecvComm* comm, void* data, size_t bytes, MemHandle* mh) = 0;
  // True when done (*bytes: the size sent or received); the request is gone then.
  virtual bool test(Request* req, size_t* bytes) = 0;
  virtual void close_send(SendComm* comm) = 0;
  virtual void close_recv(RecvComm* comm) = 0;
  virtual void close_listen(ListenComm* comm) = 0;
};

// The socket backend's settings (the runtime reads them from MK_SOCKET_*).
struct SocketOptions {
  std::string ifname;     // MK_SOCKET_IFNAME (NCCL_SOCKET_IFNAME's syntax); "" the default rule
  int family = 0;         // MK_SOCKET_FAMILY: AF_INET, AF_INET6, 0 either
  int nstreams = 2;       // MK_SOCKET_NSTREAMS: TCP streams per connection, 1..16
  int timeout_ms = 30000; // bound on a connect and on a stream's handshake
};
constexpr int kMaxStreams = 16;

// Throws mkInvalidArgument when the options name no usable interface.
std::unique_ptr<Net> make_socket_net(const SocketOptions& opts);
// From the environment (MK_SOCKET_IFNAME, MK_SOCKET_FAMILY, MK_SOCKET_NSTREAMS).
SocketOptions socket_options_from_env();

// Tests: socket connections made by `net` from now on number their messages
// from `base` (near 2^32, to cross the wire header's 32-bit wrap).
void socket_set_seq_base(Net* net, uint64_t base);

// An installed NCCL net plugin: `name` is a path or file name ("libnccl-net-
// aws-ofi.so"), or NAME for libnccl-net-NAME.so (as NCCL_NET_PLUGIN). The
// newest interface it exports among ncclNetPlugin_v11 .. v8 is used, or
// exactly `version` when it is not 0. Throws mkSystemError naming the file
// when it cannot be loaded, exports none of them, or its init fails.
std::unique_ptr<Net> load_nccl_plugin(const std::string& name, int version = 0);

// The verbs backend (runtime/transport/net/verbs.cpp): RDMA over InfiniBand
// and RoCE through libibverbs, opened with dlopen (never linked). Connection
// setup runs over TCP on the interface MK_SOCKET_IFNAME / MK_SOCKET_FAMILY choose.
struct VerbsOptions {
  std::string lib = "libibverbs.so.1";  // MK_IBVERBS_LIB
  std::string hca;                      // MK_IB_HCA: NCCL_IB_HCA's syntax (device[:port], comma list, ^ excludes, = exact)
  int gid_index = -1;                   // MK_IB_GID_INDEX; -1: the RoCE v2 IPv4-mapped GID if any, else 0
  int timeout_ms = 30000;               // bound on a connect and on the setup handshake
};
// Throws mkSystemError when the library cannot be loaded or has no device or
// active port, mkInvalidArgument when MK_IB_HCA or MK_IB_GID_INDEX names
// nothing usable (the message lists what this host has).
std::unique_ptr<Net> make_verbs_net(const VerbsOptions& opts);
// From the environment (MK_IBVERBS_LIB, MK_IB_HCA, MK_IB_GID_INDEX).
VerbsOptions verbs_options_from_env();

}  // namespace mk::rt::net
