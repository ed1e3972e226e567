// Bootstrap: how ranks find each other before any GPU memory is shared.
//
// mkGetUniqueId starts a small TCP rendezvous server in the calling process
// (the "root", usually rank 0's) and writes its address, a random nonce and a
// 32-byte random secret into the 128-byte id. Every rank connects, proves it
// knows the secret (and checks that the server does: runtime/bootstrap/auth.hpp has the
// handshake and the threat model), says who it is, and then uses the
// connection for all-gathers of small host blobs (device info, memory
// handles) during communicator setup. Address: MK_BOOTSTRAP_ADDR=host[:port]
// when set (the port, if given, decimal digits only, 1..65535); else the
// IPv4 address of this host's first interface that is up and not loopback
// (nor docker*, virbr*, veth*), or of the interfaces MK_SOCKET_IFNAME names
// (NCCL_SOCKET_IFNAME's syntax); 127.0.0.1 where there is none; an ephemeral
// port. So ranks on other hosts can reach it (multi-node needs a routable
// address: 127.0.0.1 in the id made every remote rank connect to itself).
// The handshake below is what keeps other hosts' connections out.
// Every wait is bounded (MK_BOOTSTRAP_TIMEOUT_MS, default 120000).
//
// Trust: the unique id is the capability. Whoever holds it can join the job,
// so pass it only over channels the job trusts (the launcher, MPI, a private
// store). Connections that cannot prove the secret are dropped before any of
// their bytes beyond the handshake are read, never take a rank slot, and
// cannot stall the real ranks: the root serves all connections from one poll
// loop, gives each a few seconds to authenticate and keeps at most
// kMaxPendingConnections unauthenticated ones. It never stops accepting
// before the rendezvous: when the table is full it evicts the oldest
// connection that has not sent its challenge (then the oldest that owes its
// proof), and a rank whose connection was closed during the handshake
// connects again, so a flood of idle, slow or garbage connections delays a
// rank by far less than one handshake deadline. Every length read from a
// socket is bounded before anything is allocated.
//
// Lifetime of the rendezvous server: it ends when every rank has disconnected
// after the rendezvous, or when the rendezvous does not complete within the
// timeout (counted from mkGetUniqueId, restarted by each rank that joins).
//
// A rank that leaves after the rendezvous (mkCommAbort sends an explicit
// abort mark first; a destroy or the end of its process just closes the
// connection) breaks the job: no all-gather can complete any more. The root
// then tells every rank still connected which rank left and why, so that an
// all-gather in progress or started later (mkCommSplit, registration, ...)
// fails within about a round trip with mkRemoteError instead of waiting
// MK_BOOTSTRAP_TIMEOUT_MS. Calls that need no all-gather (a destroy) are
// unaffected.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "mk.h"
#include "runtime/bootstrap/auth.hpp"

namespace mk::rt {

constexpr int kMaxRanks = 65536;
constexpr uint64_t kMaxBlobBytes = uint64_t(64) << 20;        // one rank's contribution to one all-gather
constexpr uint64_t kMaxRoundBytes = uint64_t(1) << 30;        // all contributions of one all-gather
constexpr int kMaxPendingConnections = 128;                   // not yet authenticated, at the root

// The id's bytes: 0-3 "MKID", 4-7 IPv4 address, 8-9 port (both network byte
// order), 16-31 nonce (tags the job's hellos and, with the secret, its local
// IPC socket names; not secret), 32-63
// secret (proves membership; never sent over a socket), the rest zero.
struct IdContents {
  uint32_t ipv4 = 0;  // network byte order
  uint16_t port = 0;  // network byte order
  uint8_t nonce[16] = {};
  Secret secret = {};
};

// Starts the rendezvous server and fills `id`.
void bootstrap_create_id(mkUniqueId* id);
// Decodes an id; throws mkInvalidArgument if it is not one of ours.
IdContents bootstrap_decode(const mkUniqueId& id);
std::string nonce_hex(const IdContents& c);

// Rendezvous server threads still running in this process (for tests).
int bootstrap_live_servers();

// Lets another thread end a bootstrap's waits (mkCommAbort), also while the
// Bootstrap is still joining the rendezvous. Outlives the Bootstrap that uses
// it; the socket is shut down under the lock, never after it was closed.
class BootstrapCancel {
 public:
  void cancel();
  bool cancelled();
  // For Bootstrap: the socket to shut down from now on (-1: none); false if
  // cancel() came first.
  bool watch(int fd);
  // For Bootstrap: whether the watched socket has joined the rendezvous and
  // is between two of this rank's messages. Then cancel() first tells the
  // rendezvous that this rank aborted, so that the other ranks' waits fail at
  // once naming it (otherwise they learn only that the connection closed).
  void at_boundary(bool yes);

 private:
  std::mutex mu_;
  int fd_ = -1;
  bool cancelled_ = false;
  bool boundary_ = false;
};

class Bootstrap {
 public:
  // Joins the rendezvous as `rank` of `nranks` (1..kMaxRanks); throws RtError
  // with the reason when the id is foreign, the server cannot prove the
  // secret, the ranks disagree on nranks, or the rendezvous times out, or
  // when `cancel` (may be null) is cancelled.
  Bootstrap(const mkUniqueId& id, int nranks, int rank, BootstrapCancel* cancel = nullptr);
  ~Bootstrap();
  Bootstrap(const Bootstrap&) = delete;
  Bootstrap& operator=(const Bootstrap&) = delete;

  // Every rank contributes `mine` (at most kMaxBlobBytes); returns all
  // contributions in rank order. Throws RtError (mkRemoteError) within about
  // a round trip, naming the rank and why, once any rank has left the job
  // after the rendezvous (aborted, destroyed its communicator, its process
  // ended): every later call fails the same way.
  std::vector<std::string> allgather(const std::string& mine);
  void barrier() { allgather(std::string()); }
  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  const IdContents& id() const { return id_; }

 private:
  IdContents id_;
  int nranks_, rank_;
  int fd_ = -1;
  BootstrapCancel* cancel_ = nullptr;
  std::string gone_;  // set once the rendezvous said that a rank left
  void close_fd();
  [[noreturn]] void on_gone(Clock::time_point deadline);
};

int bootstrap_timeout_ms();

// One network interface as getifaddrs reports it (IPv4 only).
struct NetIface {
  std::string name;
  uint32_t ipv4 = 0;  // network byte order
  bool up = false;
  bool loopback = false;
};
// This host's IPv4 interfaces, in getifaddrs order.
std::vector<NetIface> net_ifaces();
// The address the rendezvous listens on when MK_BOOTSTRAP_ADDR is unset:
// `spec` (MK_SOCKET_IFNAME) is NCCL_SOCKET_IFNAME's syntax: comma-separated
// name prefixes to use ("eth,ens"), or to avoid with a leading '^'
// ("^docker,lo"), '=' before the list for exact names ("=eth0"). Empty: the
// first up, non-loopback interface not named docker*, virbr* or veth*, else
// 127.0.0.1. Only up interfaces count; loopback only when `spec` names it.
// Throws mkInvalidArgument when `spec` matches none, naming what exists.
uint32_t choose_bootstrap_ipv4(const std::vector<NetIface>& ifaces, const std::string& spec);

}  // namespace mk::rt
