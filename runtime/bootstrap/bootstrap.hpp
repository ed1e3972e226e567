// Bootstrap: how ranks find each other before any GPU memory is shared.
//
// mkGetUniqueId starts a small TCP rendezvous server in the calling process
// (the "root", usually rank 0's) and writes its address, a random nonce and a
// 32-byte random secret into the 128-byte id. Every rank connects, proves it
// knows the secret (and checks that the server does: runtime/bootstrap/auth.hpp has the
// handshake and the threat model), says who it is and where its own peer
// listener is, and gets every rank's listener address back. After this
// rendezvous the ranks talk to each other directly (runtime/bootstrap/peers.hpp):
// all-gathers of small host blobs during communicator setup (device info,
// memory handles) run over rank-to-rank connections (each host's ranks
// through a leader of at most 64 of them, the leaders among themselves in
// ceil(log2 leaders) steps: Bootstrap::direct_allgather says why), and any
// two ranks can send each other messages; the root only watches who leaves
// (below).
// MK_BOOTSTRAP_RELAY=1 on every rank relays all-gathers through the root
// instead (the design before 2026-12-07: N^2 bytes through one socket; kept
// for comparison, bench/bootstrap_bench.cpp). Every message after the
// handshake, to the root and between ranks, carries a MAC with a sequence
// number under keys of its connection (frame.hpp): an altered, injected or
// replayed message fails the bootstrap naming the sender.
//
// Address: MK_BOOTSTRAP_ADDR=host[:port] or [IPv6]:port when set (the port,
// if given, decimal digits only, 1..65535); else the address of this host's
// first interface that is up and not loopback (nor docker*, virbr*, veth*),
// or of the interfaces MK_SOCKET_IFNAME names (NCCL_SOCKET_IFNAME's syntax),
// IPv4 unless MK_SOCKET_FAMILY=AF_INET6; loopback where there is none; an
// ephemeral port. So ranks on other hosts can reach it (multi-node needs a
// routable address: 127.0.0.1 in the id made every remote rank connect to
// itself). A rank's peer listener is on the address it reaches the root
// from (or on MK_SOCKET_IFNAME's interface of the root's family), ephemeral
// port. MK_COMM_ID=host:port (NCCL_COMM_ID's meaning): mkGetUniqueId starts
// no server and writes that address; rank 0 of the communicator starts the
// root there at init and every rank connects there, so no id needs to pass
// between processes. The secret then comes from MK_COMM_SECRET (64 hex
// characters, the same on every rank), not from the id.
// Every wait is bounded (MK_BOOTSTRAP_TIMEOUT_MS, default 120000).
//
// Trust: the unique id is the capability (with MK_COMM_ID: MK_COMM_SECRET).
// Whoever holds it can join the job, so pass it only over channels the job
// trusts (the launcher, MPI, a private store). Connections that cannot prove
// the secret are dropped before any of their bytes beyond the handshake are
// read, never take a rank slot, and cannot stall the real ranks: the root
// serves all connections from one poll loop, gives each a few seconds to
// authenticate and keeps at most kMaxPendingConnections unauthenticated
// ones. It never stops accepting before the rendezvous: when the table is
// full it evicts the oldest connection that has not sent its challenge
// (then the oldest that owes its proof), and a rank whose connection was
// closed during the handshake connects again, so a flood of idle, slow or
// garbage connections delays a rank by far less than one handshake
// deadline. A rank's peer listener authenticates the same way (its own
// channel in the proofs, a bounded table of pending connections). Every
// length read from a socket is bounded before anything is allocated.
//
// Lifetime of the rendezvous server: it ends when every rank has disconnected
// after the rendezvous, or when the rendezvous does not complete within the
// timeout (counted from its start, restarted by each rank that joins).
//
// A rank that leaves after the rendezvous (mkCommAbort sends an explicit
// abort message first, a destroy a goodbye; the end of its process just
// closes the connection) breaks the job: no later all-gather can complete.
// The root then tells every rank still connected which rank left, why, and
// how many all-gathers it had completed (none known when its process just
// ended), so that an all-gather in progress that can no longer complete, or
// started later (mkCommSplit, registration, ...), fails within about a
// round trip with mkRemoteError instead of waiting MK_BOOTSTRAP_TIMEOUT_MS;
// one the leaver had completed completes everywhere. A rank that finds a
// peer's message altered tells the root too, and every rank fails naming
// the sender. Calls that need no all-gather (a destroy) are unaffected.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mk.h"
#include "runtime/bootstrap/address.hpp"
#include "runtime/bootstrap/auth.hpp"
#include "runtime/bootstrap/frame.hpp"

namespace mk::rt {

constexpr int kMaxRanks = 65536;
constexpr uint64_t kMaxBlobBytes = uint64_t(64) << 20;        // one rank's contribution to one all-gather
constexpr uint64_t kMaxRoundBytes = uint64_t(1) << 30;        // all contributions of one all-gather
constexpr int kMaxPendingConnections = 128;                   // not yet authenticated, at the root

// The id's bytes: 0-3 "MKID", 4-7 IPv4 address, 8-9 port (both network byte
// order), 16-31 nonce (tags the job's hellos and, with the secret, its local
// IPC socket names; not secret), 32-63 secret (proves membership; never sent
// over a socket; zero in an MK_COMM_ID id), 64 address family (0: IPv4 in
// bytes 4-7, the layout of ids before IPv6; 6: IPv6 in bytes 80-95, its scope
// id in 68-71, network byte order, bytes 4-7 zero), 65 flags (bit 0: an
// MK_COMM_ID id: no server runs yet, rank 0 starts it at init, the secret is
// MK_COMM_SECRET), the rest zero.
struct IdContents {
  uint32_t ipv4 = 0;  // network byte order; 0 in an IPv6 id
  uint16_t port = 0;  // network byte order
  bool ipv6 = false;
  uint8_t ipv6_addr[16] = {};
  uint32_t scope_id = 0;  // host order
  bool comm_id = false;
  uint8_t nonce[16] = {};
  Secret secret = {};
  SockAddr address() const;
};

// Fills `id`: with MK_COMM_ID set, for that address without a server (not
// while a bootstrap made from such an id lives in this process: a split's
// child, or a second communicator made meanwhile, gets a fresh id with its
// own server, which must be passed as usual); else starts the rendezvous
// server. Throws mkInvalidArgument for a bad MK_BOOTSTRAP_ADDR, MK_COMM_ID,
// MK_COMM_SECRET, MK_SOCKET_IFNAME or MK_SOCKET_FAMILY.
void bootstrap_create_id(mkUniqueId* id);
// Decodes an id; throws mkInvalidArgument if it is not one of ours (or, for
// an MK_COMM_ID id, when MK_COMM_SECRET is missing, malformed or not the
// secret the id was made with).
IdContents bootstrap_decode(const mkUniqueId& id);
std::string nonce_hex(const IdContents& c);
// MK_COMM_SECRET: 64 hex characters; throws mkInvalidArgument saying how to
// make one when missing or malformed (never echoing the value).
Secret comm_secret_from_env();

// Rendezvous server threads still running in this process (for tests).
int bootstrap_live_servers();
// For tests: the most ranks of one host in one group of the direct
// all-gather (Bootstrap::allgather; 0: the default, 64). Every rank of a job
// must use the same value: set it before the bootstraps exist.
void bootstrap_group_ranks_for_tests(int ranks);

// Lets another thread end a bootstrap's waits (mkCommAbort), also while the
// Bootstrap is still joining the rendezvous. Outlives the Bootstrap that uses
// it; the socket is shut down under the lock, never after it was closed.
class BootstrapCancel {
 public:
  void cancel();
  bool cancelled();
  // For Bootstrap: the socket to shut down from now on (-1: none); false if
  // cancel() came first. Every wait of the Bootstrap polls it.
  bool watch(int fd);
  // For Bootstrap: whether the watched socket has joined the rendezvous and
  // is between two of this rank's messages, and the abort message to send
  // then (sealed for the next sequence number). Then cancel() first tells
  // the rendezvous that this rank aborted, so that the other ranks' waits
  // fail at once naming it (otherwise they learn only that the connection
  // closed).
  void at_boundary(bool yes, std::string abort_message = {});

 private:
  std::mutex mu_;
  int fd_ = -1;
  bool cancelled_ = false;
  bool boundary_ = false;
  std::string abort_;
};

class PeerMesh;

class Bootstrap {
 public:
  // Joins the rendezvous as `rank` of `nranks` (1..kMaxRanks); throws RtError
  // with the reason when the id is foreign, the server cannot prove the
  // secret, the ranks disagree on nranks (or on MK_BOOTSTRAP_RELAY), or the
  // rendezvous times out, or when `cancel` (may be null) is cancelled.
  Bootstrap(const mkUniqueId& id, int nranks, int rank, BootstrapCancel* cancel = nullptr);
  ~Bootstrap();
  Bootstrap(const Bootstrap&) = delete;
  Bootstrap& operator=(const Bootstrap&) = delete;

  // Every rank contributes `mine` (at most kMaxBlobBytes); returns all
  // contributions in rank order. Throws RtError (mkRemoteError) within about
  // a round trip, naming the rank and why, once a rank has left the job
  // after the rendezvous (aborted, destroyed its communicator, its process
  // ended) before completing this all-gather, or a message failed its
  // integrity check: every later call fails the same way.
  std::vector<std::string> allgather(const std::string& mine);
  void barrier() { allgather(std::string()); }
  // Point to point: `peer` calls recv(rank()) for each send(peer) of this
  // rank, in order (messages between two ranks arrive in the order sent);
  // at most kMaxBlobBytes. send returns once the bytes are with the kernel.
  // Throws RtError like allgather when the peer left or a message was
  // altered (another rank leaving does not fail them).
  void send(int peer, const std::string& bytes);
  std::string recv(int peer);
  // Point to point for recovery (mkCommShrink) between two ranks that are
  // both still here, whatever happened to the rest of this bootstrap: a
  // rank left, an exchange failed, the rendezvous ended (none of which fails
  // these, nor shortens their wait). Messages of earlier exchanges the
  // receiver has not read are skipped. Fails only when `peer` itself is
  // gone, the communicator was aborted, or MK_BOOTSTRAP_TIMEOUT_MS passes.
  void send_recovery(int peer, const std::string& bytes);
  std::string recv_recovery(int peer);
  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  const IdContents& id() const { return id_; }
  // Whether all-gathers go through the rendezvous (MK_BOOTSTRAP_RELAY=1).
  bool relay() const { return relay_; }

 private:
  struct Verdict;
  // The call in progress: an all-gather (collective) or a send/recv with `peer`.
  struct Op {
    bool collective = true;
    int peer = -1;
    Clock::time_point deadline;
  };
  IdContents id_;
  int nranks_, rank_;
  bool relay_ = false;
  int fd_ = -1;  // to the rendezvous
  Link root_;
  BootstrapCancel* cancel_ = nullptr;
  int listen_fd_ = -1;  // this rank's peer listener until peers_ owns it
  std::unique_ptr<PeerMesh> peers_;
  int32_t ops_ = 0;  // all-gathers completed
  Op op_;
  std::unique_ptr<Verdict> verdict_;  // the rendezvous's word that a rank left (the smallest count)
  // The direct all-gather's groups: per rank its group, per group its ranks
  // (the first leads).
  std::vector<int> group_of_;
  std::vector<std::vector<int>> groups_;
  std::string gone_;                  // set once this bootstrap can no longer work: every call fails so
  mkResult_t gone_code_ = mkRemoteError;
  std::vector<int> lost_;             // ranks whose connection failed (recovery calls to them fail)
  bool recovering_ = false;           // a recovery call runs: the rendezvous's end does not shorten it
  void begin_recovery(int peer);
  void close_fd();
  void join(const SockAddr& root, const std::string& where);
  void begin(bool collective, int peer);
  std::vector<std::string> relay_allgather(const std::string& mine);
  std::vector<std::string> direct_allgather(const std::string& mine);
  void on_root();
  bool take_verdict(const FrameHeader& h, Clock::time_point until);
  void drain_root();
  void check_verdict();
  void arm_abort();
  void report_fault(int32_t sender, int32_t cause);
  [[noreturn]] void broken(mkResult_t code, const std::string& what);
  [[noreturn]] void root_altered();
  [[noreturn]] void on_peer_error(const std::exception& e);
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
// The address the rendezvous listens on when MK_BOOTSTRAP_ADDR is unset and
// MK_SOCKET_FAMILY is not AF_INET6:
// `spec` (MK_SOCKET_IFNAME) is NCCL_SOCKET_IFNAME's syntax: comma-separated
// name prefixes to use ("eth,ens"), or to avoid with a leading '^'
// ("^docker,lo"), '=' before the list for exact names ("=eth0"). Empty: the
// first up, non-loopback interface not named docker*, virbr* or veth*, else
// 127.0.0.1. Only up interfaces count; loopback only when `spec` names it.
// Throws mkInvalidArgument when `spec` matches none, naming what exists.
uint32_t choose_bootstrap_ipv4(const std::vector<NetIface>& ifaces, const std::string& spec);

}  // namespace mk::rt
