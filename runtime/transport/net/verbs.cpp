// The verbs backend of the network transport (runtime/transport/net/net.hpp):
// RDMA over InfiniBand and RoCE through libibverbs, opened with dlopen
// (MK_IBVERBS_LIB, default libibverbs.so.1) and never linked, so binaries
// load where rdma-core is missing. NCCL's IB transport is the model.
//
// Ports: every active port of every device MK_IB_HCA allows is one net device
// (NCCL_IB_HCA's syntax: "mlx5_0:1,mlx5_1", "^mlx5_3", "=mlx5_0"). RoCE ports
// address peers by GID (MK_IB_GID_INDEX, else the RoCE v2 IPv4-mapped GID,
// else index 0); InfiniBand ports by LID, with a GRH only when a GID index is
// set or the peer is on another subnet.
//
// A connection is one RC queue pair on each side (one CQ each). listen()
// opens a TCP socket; its handle carries the address and a random 16-byte
// token. connect() sends the sender's QP number, PSN, LID, GID, MTU and the
// address and key of its control block; accept() checks the token, brings
// its QP to RTS and replies with its own; the sender brings its QP to RTS
// when it next makes progress and says "ready" (the receiver posts nothing
// into a QP that may not be in RTR yet). The TCP stream stays open: its end
// tells a side that the peer closed or died, and a side that fails sends the
// peer one note saying why (so both name the verbs status).
//
// Messages (in order; n is the message number):
//   irecv n   posts a receive WR (no buffer) and RDMA-writes a clear-to-send
//             entry (address, rkey, size, tag, n+1 last) into the sender's
//             FIFO slot n % kMaxRequests (its control block).
//   isend n   waits for FIFO slot n to say n+1, then RDMA-writes the data
//             into the posted buffer in WRs of at most the port's
//             max_msg_sz, the last WITH_IMM carrying the size; 0 bytes is one
//             0-length WRITE_WITH_IMM. A message larger than its receive or
//             with another tag (or of 2^31 bytes or more) first RDMA-writes an
//             info record (size, tag, status) into the receiver's info slot n;
//             the immediate then says "see the info record" (kImmInfo).
//   the n-th RECV_RDMA_WITH_IMM completion finishes irecv n.
// A slot is reused only after its request was tested done, so neither FIFO
// nor info entries are overwritten while in use. Every WR is signalled.
//
// Memory: a buffer inside a MemHandle from reg_mr is used as registered; any
// other buffer is registered for the time of its request. Host memory only,
// or dma-buf (reg_mr_dmabuf) where the library has ibv_reg_dmabuf_mr.
//
// Processes: verbs resources belong to the process that made them. A Net
// used after fork() opens its devices again in the child (the parent's
// contexts are left alone); listen comms hold no verbs resources, so a child
// may accept on its parent's.
#include <arpa/inet.h>
#include <dlfcn.h>
#include <endian.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "compiler/common/env_parse.hpp"
#include "runtime/api/status.hpp"
#include "runtime/transport/net/iface.hpp"
#include "runtime/transport/net/net.hpp"

#if __has_include(<infiniband/verbs.h>)
#include <infiniband/verbs.h>
#define MK_HAVE_VERBS 1
#else
#define MK_HAVE_VERBS 0
#endif

namespace mk::rt::net {

VerbsOptions verbs_options_from_env() {
  VerbsOptions o;
  if (const char* v = std::getenv("MK_IBVERBS_LIB"); v && *v) o.lib = v;
  if (const char* v = std::getenv("MK_IB_HCA")) o.hca = v;
  if (const char* v = std::getenv("MK_IB_GID_INDEX"); v && *v) {
    int64_t x = 0;
    if (!env_parse::parse_int(v, -1, 65535, &x))
      fail(mkInvalidArgument, std::string("MK_IB_GID_INDEX='") + v + "': expected an integer in -1..65535");
    o.gid_index = int(x);
  }
  return o;
}

#if !MK_HAVE_VERBS

std::unique_ptr<Net> make_verbs_net(const VerbsOptions&) {
  fail(mkSystemError, "verbs transport: mKernel was built without <infiniband/verbs.h> (install libibverbs-dev "
                      "and rebuild to use RDMA)");
}

#else

namespace {

using Clock = std::chrono::steady_clock;

constexpr char kHandleMagic[4] = {'M', 'K', 'V', 'B'};
constexpr char kInfoMagic[4] = {'M', 'K', 'V', 'Q'};
constexpr char kNoteMagic[4] = {'M', 'K', 'V', 'N'};
constexpr uint8_t kWireVersion = 1;
constexpr size_t kMaxPending = 64;       // unauthenticated streams kept by a listen comm
constexpr int kSendDepth = 128;          // send WRs per QP
constexpr int kCqDepth = kSendDepth + kMaxRequests;
constexpr size_t kMaxWrBytes = size_t(1) << 30;
constexpr uint32_t kImmInfo = 1u << 31;  // immediate: "read the info record"
constexpr uint8_t kQpTimeout = 18;       // 4.096 us * 2^18 = 1.07 s per try
constexpr uint8_t kRetries = 7;

// Entry points, by the version the real library defines them with.
#define MK_IBV_FUNCS(X)                 \
  X(ibv_get_device_list, "IBVERBS_1.1") \
  X(ibv_free_device_list, "IBVERBS_1.1") \
  X(ibv_get_device_name, "IBVERBS_1.1") \
  X(ibv_get_device_guid, "IBVERBS_1.1") \
  X(ibv_open_device, "IBVERBS_1.1")     \
  X(ibv_close_device, "IBVERBS_1.1")    \
  X(ibv_query_device, "IBVERBS_1.1")    \
  X(ibv_query_port, "IBVERBS_1.1")      \
  X(ibv_query_gid, "IBVERBS_1.1")       \
  X(ibv_alloc_pd, "IBVERBS_1.1")        \
  X(ibv_dealloc_pd, "IBVERBS_1.1")      \
  X(ibv_reg_mr, "IBVERBS_1.1")          \
  X(ibv_dereg_mr, "IBVERBS_1.1")        \
  X(ibv_create_cq, "IBVERBS_1.1")       \
  X(ibv_destroy_cq, "IBVERBS_1.1")      \
  X(ibv_create_qp, "IBVERBS_1.1")       \
  X(ibv_modify_qp, "IBVERBS_1.1")       \
  X(ibv_destroy_qp, "IBVERBS_1.1")

struct Ibv {
#define MK_IBV_FIELD(name, ver) decltype(&::name) name = nullptr;
  MK_IBV_FUNCS(MK_IBV_FIELD)
#undef MK_IBV_FIELD
  // Optional: rdma-core 32+ (GID types) and 34+ (dma-buf).
  decltype(&::_ibv_query_gid_ex) query_gid_ex = nullptr;
  decltype(&::ibv_reg_dmabuf_mr) reg_dmabuf_mr = nullptr;
};

void* symbol(void* h, const char* name, const char* version) {
  if (void* p = ::dlvsym(h, name, version)) return p;
  return ::dlsym(h, name);  // a library without symbol versions
}

Ibv load_ibv(const std::string& lib) {
  void* h = ::dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h)
    fail(mkSystemError, "verbs transport: cannot load '" + lib + "' (MK_IBVERBS_LIB): " + ::dlerror() +
                            "; no RDMA verbs library on this machine (install rdma-core's libibverbs1)");
  Ibv f;
#define MK_IBV_LOAD(name, ver)                                                                          \
  f.name = reinterpret_cast<decltype(f.name)>(symbol(h, #name, ver));                                   \
  if (!f.name)                                                                                          \
    fail(mkSystemError, "verbs transport: '" + lib + "' lacks " #name "@" ver " (is it libibverbs?)");
  MK_IBV_FUNCS(MK_IBV_LOAD)
#undef MK_IBV_LOAD
  f.query_gid_ex = reinterpret_cast<decltype(f.query_gid_ex)>(::dlvsym(h, "_ibv_query_gid_ex", "IBVERBS_1.11"));
  f.reg_dmabuf_mr = reinterpret_cast<decltype(f.reg_dmabuf_mr)>(::dlvsym(h, "ibv_reg_dmabuf_mr", "IBVERBS_1.12"));
  return f;  // never dlclosed: verbs objects may outlive a Net
}

std::string errno_text(int e) { return std::strerror(e); }

const char* wc_status_name(int s) {
  static const char* const names[] = {
      "IBV_WC_SUCCESS",         "IBV_WC_LOC_LEN_ERR",        "IBV_WC_LOC_QP_OP_ERR",     "IBV_WC_LOC_EEC_OP_ERR",
      "IBV_WC_LOC_PROT_ERR",    "IBV_WC_WR_FLUSH_ERR",       "IBV_WC_MW_BIND_ERR",       "IBV_WC_BAD_RESP_ERR",
      "IBV_WC_LOC_ACCESS_ERR",  "IBV_WC_REM_INV_REQ_ERR",    "IBV_WC_REM_ACCESS_ERR",    "IBV_WC_REM_OP_ERR",
      "IBV_WC_RETRY_EXC_ERR",   "IBV_WC_RNR_RETRY_EXC_ERR",  "IBV_WC_LOC_RDD_VIOL_ERR",  "IBV_WC_REM_INV_RD_REQ_ERR",
      "IBV_WC_REM_ABORT_ERR",   "IBV_WC_INV_EECN_ERR",       "IBV_WC_INV_EEC_STATE_ERR", "IBV_WC_FATAL_ERR",
      "IBV_WC_RESP_TIMEOUT_ERR", "IBV_WC_GENERAL_ERR",       "IBV_WC_TM_ERR",            "IBV_WC_TM_RNDV_INCOMPLETE"};
  return s >= 0 && size_t(s) < std::size(names) ? names[s] : "IBV_WC_(unknown status)";
}
static_assert(IBV_WC_RETRY_EXC_ERR == 12 && IBV_WC_TM_RNDV_INCOMPLETE == 23, "the status names follow verbs.h");

void random_bytes(void* out, size_t n) {
  for (auto* p = static_cast<uint8_t*>(out); n;) {
    const ssize_t r = ::getrandom(p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail(mkSystemError, "verbs transport: getrandom(): " + errno_text(errno));
    p += r;
    n -= size_t(r);
  }
}

std::string hex(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

bool ipv4_mapped(const ibv_gid& g) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(g.raw, prefix, 12) == 0;
}
bool zero_gid(const ibv_gid& g) {
  static const uint8_t zero[16] = {};
  return std::memcmp(g.raw, zero, 16) == 0;
}

// Megabits per second of a port (IB's width and per-lane speed encodings).
int port_mbps(const ibv_port_attr& a) {
  int lanes = 1;
  switch (a.active_width) {
    case 2: lanes = 4; break;
    case 4: lanes = 8; break;
    case 8: lanes = 12; break;
    case 16: lanes = 2; break;
    default: lanes = 1;
  }
  int lane = 2500;
  switch (a.active_speed) {
    case 2: lane = 5000; break;
    case 4: case 8: lane = 10000; break;
    case 16: lane = 14000; break;
    case 32: lane = 25000; break;
    case 64: lane = 50000; break;
    case 128: lane = 100000; break;
    default: lane = 2500;
  }
  return lanes * lane;
}

// MK_IB_HCA: NCCL_IB_HCA's syntax. Entries "device[:port]", comma separated;
// '^' first excludes them, '=' (after any '^') makes names exact, not prefixes.
struct HcaSpec {
  bool avoid = false, exact = false;
  std::vector<std::pair<std::string, int>> items;  // port 0: any
  explicit HcaSpec(const std::string& text) {
    std::string s = text;
    avoid = !s.empty() && s[0] == '^';
    if (avoid) s.erase(0, 1);
    exact = !s.empty() && s[0] == '=';
    if (exact) s.erase(0, 1);
    for (size_t at = 0; at <= s.size();) {
      const size_t comma = std::min(s.find(',', at), s.size());
      std::string item = s.substr(at, comma - at);
      at = comma + 1;
      if (item.empty()) continue;
      int port = 0;
      if (const size_t colon = item.find(':'); colon != std::string::npos) {
        int64_t p = 0;
        if (!env_parse::parse_int(item.substr(colon + 1), 1, 255, &p))
          fail(mkInvalidArgument, "MK_IB_HCA='" + text + "': '" + item + "' has no port number 1..255 after ':'");
        port = int(p);
        item.resize(colon);
      }
      items.emplace_back(item, port);
    }
    if (!text.empty() && items.empty())
      fail(mkInvalidArgument, "MK_IB_HCA='" + text + "' names no device (expected e.g. mlx5_0:1,mlx5_1 or ^mlx5_2)");
  }
  bool allows(const std::string& dev, int port) const {
    if (items.empty()) return true;
    bool named = false;
    for (const auto& [name, p] : items)
      if ((exact ? dev == name : dev.rfind(name, 0) == 0) && (p == 0 || p == port)) named = true;
    return named != avoid;
  }
};

// One usable port: a net device.
struct Port {
  int device = 0;  // index into VerbsNet::opened_
  std::string dev_name;
  int port = 1;
  ibv_port_attr attr{};
  bool roce = false;
  int gid_index = 0;
  ibv_gid gid{};
  uint64_t guid = 0;
  int max_qp = 0;
  std::string pci_path;
  std::string text() const { return dev_name + ":" + std::to_string(port); }
};

// The most one RDMA write of this port moves.
size_t wr_limit(const Port& p) { return p.attr.max_msg_sz ? std::min<size_t>(p.attr.max_msg_sz, kMaxWrBytes) : kMaxWrBytes; }

// What a side sends about its QP at setup (connect: the hello; accept: the reply).
struct QpInfo {
  char magic[4];
  uint8_t version;
  uint8_t is_reply;
  uint8_t link_layer;
  uint8_t mtu;
  uint8_t token[16];
  uint32_t qpn;
  uint32_t psn;
  uint16_t lid;
  uint16_t port;
  uint32_t max_wr_bytes;
  uint8_t gid[16];
  uint64_t ctrl_addr;
  uint32_t ctrl_rkey;
  uint32_t pad;
  char dev[56];
  uint8_t reserved[128];
};
// What flows on the TCP stream after setup: "ready" (sender) and one failure note.
struct Note {
  char magic[4];
  uint32_t kind;  // kReady, kFailed
  char text[248];
};
enum : uint32_t { kReady = 1, kFailed = 2 };
constexpr size_t kRecordBytes = 256;
static_assert(sizeof(QpInfo) == kRecordBytes && sizeof(Note) == kRecordBytes, "TCP records are 256 bytes");

struct WireHandle {
  char magic[4];
  uint8_t version;
  uint8_t salen;  // the listener's sockaddr_in or sockaddr_in6 (Linux layout), as bytes
  uint16_t pad;
  uint8_t token[16];
  uint8_t sa[sizeof(sockaddr_in6)];
};
static_assert(sizeof(WireHandle) <= kHandleBytes, "the handle must fit NCCL's 128 bytes");

// Control block of a connection, registered for remote writes: the sender's
// FIFO of clear-to-send entries, the receiver's info records. Each side also
// uses its unused half as the local source of what it writes to the peer.
struct Cts {
  uint64_t addr;
  uint64_t size;
  uint32_t rkey;
  int32_t tag;
  uint64_t seq1;  // message number + 1, written last
};
struct MsgInfo {
  uint64_t size;
  int32_t tag;
  uint32_t status;  // kInfoOk, kInfoTooLarge, kInfoTagMismatch
  uint64_t seq1;
  uint64_t pad;
};
enum : uint32_t { kInfoOk = 0, kInfoTooLarge = 1, kInfoTagMismatch = 2 };
struct Ctrl {
  Cts fifo[kMaxRequests];
  MsgInfo info[kMaxRequests];
};

enum WrKind : uint64_t { kWrSend = 1, kWrCts = 2, kWrRecv = 3 };
uint64_t wr_id(uint64_t seq, WrKind k) { return seq << 2 | k; }

struct Mr {  // a MemHandle
  ibv_mr* mr = nullptr;
  uintptr_t base = 0;
  size_t bytes = 0;
  int device = -1;
  pid_t pid = 0;
};

struct Conn;

struct Req {
  Conn* conn = nullptr;
  bool in_use = false;
  uint64_t seq = 0;
  char* data = nullptr;
  size_t cap = 0;   // send: the size; recv: the posted size
  size_t size = 0;  // bytes moved
  int tag = 0;
  uint32_t lkey = 0, rkey = 0;
  ibv_mr* temp = nullptr;  // registered for this request alone
  int wrs = 0;             // posted, not completed
  bool done = false;
  // send
  bool matched = false, info_posted = false, imm_posted = false;
  size_t written = 0;
  Cts cts{};
  uint32_t status = kInfoOk;
  // recv
  bool posted = false, got = false, cts_done = false;
};

struct Conn {
  bool sending = false;
  pid_t pid = 0;
  const Port* port = nullptr;
  ibv_context* ctx = nullptr;
  std::string peer;  // address (and QP once known), for errors
  int fd = -1;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  Ctrl* ctrl = nullptr;
  ibv_mr* ctrl_mr = nullptr;
  uint64_t remote_ctrl = 0;
  uint32_t remote_rkey = 0;
  size_t wr_bytes = kMaxWrBytes;  // the smaller max_msg_sz of both ports
  uint8_t token[16] = {};
  uint32_t psn = 0;
  bool ready = false;
  bool peer_closed = false;
  uint8_t rbuf[kRecordBytes];
  size_t rgot = 0;
  Req reqs[kMaxRequests];
  uint64_t next_seq = 0;   // next request claimed
  uint64_t next_post = 0;  // send: next to match a CTS; recv: next to post
  uint64_t next_got = 0;   // recv: next RECV_RDMA_WITH_IMM expected
  int send_free = kSendDepth;
  std::string error;  // sticky

  Req* at(uint64_t seq) {
    Req& r = reqs[seq % kMaxRequests];
    return r.in_use && r.seq == seq ? &r : nullptr;
  }
  bool pending() const {
    for (const Req& r : reqs)
      if (r.in_use && !r.done) return true;
    return false;
  }
  [[noreturn]] void broken(const std::string& what) {
    if (error.empty()) {
      error = "verbs transport: connection " + std::string(sending ? "to " : "from ") + peer + ": " + what;
      if (fd >= 0) {  // tell the peer, once, best effort
        Note n{};
        std::memcpy(n.magic, kNoteMagic, 4);
        n.kind = kFailed;
        std::snprintf(n.text, sizeof n.text, "%s", what.c_str());
        [[maybe_unused]] ssize_t w = ::send(fd, &n, sizeof n, MSG_NOSIGNAL | MSG_DONTWAIT);
      }
    }
    fail(mkRemoteError, error);
  }
  void check() {
    if (!error.empty()) fail(mkRemoteError, error);
  }
  // Reads one record from the TCP stream without blocking.
  bool read_record(void* out) {
    while (fd >= 0 && !peer_closed) {
      const ssize_t g = ::recv(fd, rbuf + rgot, kRecordBytes - rgot, MSG_DONTWAIT);
      if (g > 0) {
        rgot += size_t(g);
        if (rgot < kRecordBytes) continue;
        std::memcpy(out, rbuf, kRecordBytes);
        rgot = 0;
        return true;
      }
      if (g < 0 && errno == EINTR) continue;
      if (g < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
      peer_closed = true;  // end of stream or reset
    }
    return false;
  }
};

struct Pending {
  int fd = -1;
  Clock::time_point deadline;
  size_t got = 0;
  QpInfo hello{};
};

struct Listen {
  int fd = -1;
  int dev = 0;
  WireHandle handle{};
  std::vector<Pending> pending;  // streams whose hello is not complete
  ~Listen() {
    if (fd >= 0) ::close(fd);
    for (Pending& p : pending) ::close(p.fd);
  }
};

void write_all(int fd, const void* data, size_t n, int timeout_ms, const std::string& peer) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (auto* p = static_cast<const char*>(data); n;) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      p += w;
      n -= size_t(w);
    } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      pollfd pf{fd, POLLOUT, 0};
      if (left <= 0 || ::poll(&pf, 1, int(left)) == 0)
        fail(mkRemoteError, "verbs transport: " + peer + " takes no data (connection setup timed out)");
    } else {
      fail(mkRemoteError, "verbs transport: connection setup with " + peer + ": " + errno_text(errno));
    }
  }
}

class VerbsNet final : public Net {
 public:
  explicit VerbsNet(const VerbsOptions& o) : opts_(o) {
    ibv_ = load_ibv(o.lib);
    // Connection setup runs over TCP on the interface the socket transport would use.
    const char* ifname = std::getenv("MK_SOCKET_IFNAME");
    const char* family = std::getenv("MK_SOCKET_FAMILY");
    iface_ = choose_iface(list_ifaces(), IfnameSpec(ifname ? ifname : "", "MK_SOCKET_IFNAME"),
                          parse_family(family ? family : "", "MK_SOCKET_FAMILY"));
    const HcaSpec spec(o.hca);
    int ndev = 0;
    list_ = (ibv_.ibv_get_device_list)(&ndev);
    if (!list_)
      fail(mkSystemError, "verbs transport: ibv_get_device_list: " + errno_text(errno) + " (no RDMA support in '" +
                              o.lib + "' or the kernel)");
    try {
      scan(ndev, spec);
    } catch (...) {
      release();
      throw;
    }
  }
  ~VerbsNet() override { release(); }

  std::string name() const override { return opts_.lib == "libibverbs.so.1" ? "verbs" : "verbs:" + opts_.lib; }
  int devices() override { return int(ports_.size()); }
  Props properties(int dev) override {
    const Port& pt = port(dev);
    Props p;
    p.name = pt.dev_name;
    p.pci_path = pt.pci_path;
    p.guid = pt.guid;
    p.ptr_support = kPtrHost | (ibv_.reg_dmabuf_mr ? kPtrCuda | kPtrDmabuf : 0);
    p.reg_is_global = true;  // an MR belongs to the device's PD: any connection on it may use it
    p.speed_mbps = port_mbps(pt.attr);
    p.port = pt.port;
    p.latency_us = 0;
    p.max_comms = pt.max_qp;
    p.max_recvs = 1;
    p.max_p2p_bytes = size_t(1) << 31;
    return p;
  }

  ListenComm* listen(int dev, Handle* handle) override {
    port(dev);
    auto l = std::make_unique<Listen>();
    l->dev = dev;
    l->fd = ::socket(iface_.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (l->fd < 0) fail(mkSystemError, "verbs transport: socket(): " + errno_text(errno));
    sockaddr_storage sa = iface_.addr;
    socklen_t len = iface_.family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (::bind(l->fd, reinterpret_cast<sockaddr*>(&sa), len) != 0 || ::listen(l->fd, 256) != 0 ||
        ::getsockname(l->fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0)
      fail(mkSystemError, "verbs transport: cannot listen on " + iface_.name + ": " + errno_text(errno));
    WireHandle& h = l->handle;
    std::memcpy(h.magic, kHandleMagic, 4);
    h.version = kWireVersion;
    h.salen = uint8_t(len);
    std::memcpy(h.sa, &sa, len);
    random_bytes(h.token, sizeof h.token);
    std::memset(handle->bytes, 0, kHandleBytes);
    std::memcpy(handle->bytes, &h, sizeof h);
    return l.release();
  }

  SendComm* connect(int dev, const Handle& handle) override {
    const Port& pt = port(dev);
    WireHandle h;
    std::memcpy(&h, handle.bytes, sizeof h);
    sockaddr_storage sa{};
    const socklen_t len = std::min<socklen_t>(h.salen, sizeof h.sa);
    std::memcpy(&sa, h.sa, len);
    if (std::memcmp(h.magic, kHandleMagic, 4) != 0 || h.version != kWireVersion ||
        !((sa.ss_family == AF_INET && len == sizeof(sockaddr_in)) || (sa.ss_family == AF_INET6 && len == sizeof(sockaddr_in6))))
      fail(mkInvalidArgument, "verbs transport: the connection handle is not one of mKernel's verbs transport "
                              "(of this version)");
    auto c = make_conn(pt, true, addr_text(reinterpret_cast<sockaddr*>(&sa)));
    std::memcpy(c->token, h.token, 16);
    c->fd = tcp_connect(sa, len, c->peer);
    const QpInfo hello = local_info(*c, false);
    write_all(c->fd, &hello, sizeof hello, opts_.timeout_ms, c->peer);
    return c.release();  // set up further by progress(): connect never waits for the peer's accept
  }

  RecvComm* accept(ListenComm* lc) override {
    auto* l = static_cast<Listen*>(lc);
    const auto now = Clock::now();
    for (;;) {
      const int fd = ::accept4(l->fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        fail(mkSystemError, "verbs transport: accept(): " + errno_text(errno));
      }
      if (l->pending.size() >= kMaxPending) {  // a flood: the oldest unauthenticated stream goes
        ::close(l->pending.front().fd);
        l->pending.erase(l->pending.begin());
      }
      Pending p;
      p.fd = fd;
      p.deadline = now + std::chrono::milliseconds(opts_.timeout_ms);
      l->pending.push_back(p);
    }
    for (size_t i = 0; i < l->pending.size();) {
      Pending& p = l->pending[i];
      ssize_t g = 1;
      while (p.got < sizeof p.hello &&
             (g = ::recv(p.fd, reinterpret_cast<char*>(&p.hello) + p.got, sizeof p.hello - p.got, MSG_DONTWAIT)) > 0)
        p.got += size_t(g);
      const bool complete = p.got == sizeof p.hello;
      const bool gone = !complete && (g == 0 || (g < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR));
      const bool valid = complete && std::memcmp(p.hello.magic, kInfoMagic, 4) == 0 &&
                         p.hello.version == kWireVersion && !p.hello.is_reply &&
                         std::memcmp(p.hello.token, l->handle.token, 16) == 0;
      if (!complete && !gone && now <= p.deadline) {
        ++i;
        continue;
      }
      const Pending taken = p;
      l->pending.erase(l->pending.begin() + ptrdiff_t(i));
      if (valid) return finish_accept(*l, taken);
      ::close(taken.fd);  // a stranger, a dead or a silent stream
    }
    return nullptr;
  }

  MemHandle* reg_mr(void* comm, void* data, size_t bytes, int type) override {
    if (type != kPtrHost)
      fail(mkInvalidUsage, "verbs transport: reg_mr registers host memory only; GPU memory goes through "
                           "reg_mr_dmabuf (dma-buf)");
    auto* c = static_cast<Conn*>(comm);
    ibv_pd* pd = opened(c->port->device).pd;
    auto m = std::make_unique<Mr>();
    m->mr = (ibv_.ibv_reg_mr)(pd, data, bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    if (!m->mr)
      fail(mkSystemError, "verbs transport: ibv_reg_mr(" + std::to_string(bytes) + " bytes) on " + c->port->text() +
                              ": " + errno_text(errno));
    m->base = reinterpret_cast<uintptr_t>(data);
    m->bytes = bytes;
    m->device = c->port->device;
    m->pid = ::getpid();
    return m.release();
  }
  MemHandle* reg_mr_dmabuf(void* comm, void* data, size_t bytes, int type, uint64_t offset, int fd) override {
    auto* c = static_cast<Conn*>(comm);
    if (!ibv_.reg_dmabuf_mr)
      fail(mkInvalidUsage, "verbs transport: '" + opts_.lib + "' has no ibv_reg_dmabuf_mr (rdma-core 34 or newer "
                           "registers dma-buf memory)");
    ibv_pd* pd = opened(c->port->device).pd;
    auto m = std::make_unique<Mr>();
    m->mr = ibv_.reg_dmabuf_mr(pd, offset, bytes, reinterpret_cast<uintptr_t>(data), fd,
                               IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    if (!m->mr)
      fail(mkSystemError, "verbs transport: ibv_reg_dmabuf_mr(" + std::to_string(bytes) + " bytes, fd " +
                              std::to_string(fd) + ") on " + c->port->text() + ": " + errno_text(errno));
    m->base = reinterpret_cast<uintptr_t>(data);
    m->bytes = bytes;
    m->device = c->port->device;
    m->pid = ::getpid();
    return m.release();
  }
  void dereg_mr(void*, MemHandle* mh) override {
    auto* m = static_cast<Mr*>(mh);
    if (!m) return;
    if (m->pid == ::getpid()) ibv_.ibv_dereg_mr(m->mr);
    delete m;
  }

  Request* isend(SendComm* comm, void* data, size_t bytes, int tag, MemHandle* mh) override {
    auto* c = static_cast<Conn*>(comm);
    Req* r = claim(*c, data, bytes, tag, static_cast<Mr*>(mh));
    if (!r) return nullptr;
    r->size = bytes;
    progress(*c);
    return r;
  }
  Request* irecv(RecvComm* comm, void* data, size_t bytes, int tag, MemHandle* mh) override {
    auto* c = static_cast<Conn*>(comm);
    Req* r = claim(*c, data, bytes, tag, static_cast<Mr*>(mh));
    if (r) progress(*c);
    return r;
  }
  // Host memory needs no flush; GPU memory would need NCCL's RDMA-read flush (not done yet).
  Request* iflush(RecvComm*, void*, size_t, MemHandle*) override { return nullptr; }

  bool test(Request* req, size_t* bytes) override {
    auto* r = static_cast<Req*>(req);
    Conn& c = *r->conn;
    if (!r->done) progress(c);
    if (!r->done) return false;
    if (bytes) *bytes = r->size;
    release_req(c, *r);
    return true;
  }

  void close_send(SendComm* comm) override { destroy(static_cast<Conn*>(comm)); }
  void close_recv(RecvComm* comm) override { destroy(static_cast<Conn*>(comm)); }
  void close_listen(ListenComm* comm) override { delete static_cast<Listen*>(comm); }

 private:
  struct Opened {  // a device opened by one process
    ibv_device* dev = nullptr;
    pid_t pid = 0;
    ibv_context* ctx = nullptr;
    ibv_pd* pd = nullptr;
  };

  VerbsOptions opts_;
  Ibv ibv_;
  Iface iface_;
  ibv_device** list_ = nullptr;
  std::vector<Opened> opened_;
  std::vector<Port> ports_;
  std::mutex mu_;

  const Port& port(int dev) const {
    if (dev < 0 || dev >= int(ports_.size()))
      fail(mkInvalidArgument, "verbs transport: device " + std::to_string(dev) + " does not exist (it has " +
                                  std::to_string(ports_.size()) + ")");
    return ports_[size_t(dev)];
  }

  ibv_port_attr query_port(ibv_context* ctx, int port) {
    ibv_port_attr a{};
    // As verbs.h's inline ibv_query_port: the provider's extended entry where
    // it has one, else the exported function (which fills the older, shorter struct).
    int rc;
    if (verbs_context* v = verbs_get_ctx_op(ctx, query_port))
      rc = v->query_port(ctx, uint8_t(port), &a, sizeof a);
    else
      rc = (ibv_.ibv_query_port)(ctx, uint8_t(port), reinterpret_cast<_compat_ibv_port_attr*>(&a));
    if (rc) fail(mkSystemError, "verbs transport: ibv_query_port(port " + std::to_string(port) + "): " + errno_text(rc > 0 ? rc : errno));
    return a;
  }

  // The GID type of an entry: from the library (rdma-core 32+), else sysfs; -1 unknown.
  int gid_type(ibv_context* ctx, const std::string& dev, int port, int index) {
    if (ibv_.query_gid_ex) {
      ibv_gid_entry e{};
      if (ibv_.query_gid_ex(ctx, uint32_t(port), uint32_t(index), &e, 0, sizeof e) == 0) return int(e.gid_type);
      return -1;
    }
    const std::string path = "/sys/class/infiniband/" + dev + "/ports/" + std::to_string(port) +
                             "/gid_attrs/types/" + std::to_string(index);
    char buf[32] = {};
    if (FILE* f = std::fopen(path.c_str(), "r")) {
      const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
      std::fclose(f);
      buf[n] = 0;
      if (std::strstr(buf, "v2")) return IBV_GID_TYPE_ROCE_V2;
      if (std::strstr(buf, "RoCE")) return IBV_GID_TYPE_ROCE_V1;
    }
    return -1;
  }

  void choose_gid(Port& pt, ibv_context* ctx) {
    const int n = pt.attr.gid_tbl_len;
    auto read = [&](int i, ibv_gid* g) { return ibv_.ibv_query_gid(ctx, uint8_t(pt.port), i, g) == 0 && !zero_gid(*g); };
    if (opts_.gid_index >= 0) {
      if (opts_.gid_index >= n)
        fail(mkInvalidArgument, "MK_IB_GID_INDEX=" + std::to_string(opts_.gid_index) + " is out of range: " +
                                    pt.text() + " has " + std::to_string(n) + " GIDs (0.." + std::to_string(n - 1) + ")");
      if (!read(opts_.gid_index, &pt.gid))
        fail(mkInvalidArgument, "MK_IB_GID_INDEX=" + std::to_string(opts_.gid_index) + ": " + pt.text() +
                                    " has no GID at that index (the entry is empty)");
      pt.gid_index = opts_.gid_index;
      return;
    }
    if (pt.roce) {  // RoCE v2 with an IPv4-mapped address, as NCCL picks by default
      ibv_gid g;
      for (int i = 0; i < n; ++i) {
        if (!read(i, &g) || !ipv4_mapped(g)) continue;
        const int t = gid_type(ctx, pt.dev_name, pt.port, i);
        if (t == IBV_GID_TYPE_ROCE_V2 || t == -1) {
          pt.gid_index = i;
          pt.gid = g;
          return;
        }
      }
    }
    pt.gid_index = 0;
    if (ibv_.ibv_query_gid(ctx, uint8_t(pt.port), 0, &pt.gid) != 0)
      fail(mkSystemError, "verbs transport: ibv_query_gid(" + pt.text() + ", 0): " + errno_text(errno));
  }

  void scan(int ndev, const HcaSpec& spec) {
    std::string have;
    for (int d = 0; d < ndev; ++d) {
      ibv_device* dev = list_[d];
      const std::string name = ibv_.ibv_get_device_name(dev);
      Opened o;
      o.dev = dev;
      o.pid = ::getpid();
      o.ctx = ibv_.ibv_open_device(dev);
      if (!o.ctx) {
        have += (have.empty() ? "" : ", ") + name + " (cannot be opened: " + errno_text(errno) + ")";
        continue;
      }
      opened_.push_back(o);
      ibv_device_attr da{};
      if (int rc = ibv_.ibv_query_device(o.ctx, &da))
        fail(mkSystemError, "verbs transport: ibv_query_device(" + name + "): " + errno_text(rc > 0 ? rc : errno));
      for (int p = 1; p <= da.phys_port_cnt; ++p) {
        Port pt;
        pt.device = int(opened_.size()) - 1;
        pt.dev_name = name;
        pt.port = p;
        pt.attr = query_port(o.ctx, p);
        pt.roce = pt.attr.link_layer == IBV_LINK_LAYER_ETHERNET;
        const bool active = pt.attr.state == IBV_PORT_ACTIVE;
        have += (have.empty() ? "" : ", ") + pt.text() + " (" + (active ? "active" : "not active") + ", " +
                (pt.roce ? "RoCE" : "InfiniBand") + ")";
        if (!active || !spec.allows(name, p)) continue;
        pt.guid = be64toh(ibv_.ibv_get_device_guid(dev));
        pt.max_qp = da.max_qp;
        char path[4096];
        if (::realpath((std::string(dev->ibdev_path) + "/device").c_str(), path)) pt.pci_path = path;
        choose_gid(pt, o.ctx);
        ports_.push_back(pt);
      }
    }
    if (ndev == 0)
      fail(mkSystemError, "verbs transport: no RDMA device ('" + opts_.lib + "' lists none)");
    if (ports_.empty()) {
      if (!opts_.hca.empty())
        fail(mkInvalidArgument, "verbs transport: MK_IB_HCA='" + opts_.hca + "' matches no active port; this host has: " + have);
      fail(mkSystemError, "verbs transport: no active RDMA port; this host has: " + have);
    }
    for (Opened& o : opened_) {
      o.pd = ibv_.ibv_alloc_pd(o.ctx);
      if (!o.pd) fail(mkSystemError, "verbs transport: ibv_alloc_pd: " + errno_text(errno));
    }
  }

  void release() {
    const pid_t me = ::getpid();
    for (Opened& o : opened_) {
      if (o.pid != me) continue;  // a parent's, inherited through fork
      if (o.pd) ibv_.ibv_dealloc_pd(o.pd);
      if (o.ctx) ibv_.ibv_close_device(o.ctx);
      o = Opened{o.dev};
    }
    if (list_ && list_pid_ == me) ibv_.ibv_free_device_list(list_);
    list_ = nullptr;
  }
  pid_t list_pid_ = ::getpid();

  // The device as this process opened it (a forked child opens it again).
  Opened& opened(int device) {
    std::lock_guard<std::mutex> lock(mu_);
    Opened& o = opened_[size_t(device)];
    if (o.pid != ::getpid()) {
      Opened fresh;
      fresh.dev = o.dev;
      fresh.pid = ::getpid();
      fresh.ctx = ibv_.ibv_open_device(o.dev);
      if (!fresh.ctx)
        fail(mkSystemError, std::string("verbs transport: ibv_open_device(") + ibv_.ibv_get_device_name(o.dev) +
                                "): " + errno_text(errno));
      fresh.pd = ibv_.ibv_alloc_pd(fresh.ctx);
      if (!fresh.pd) {
        const int e = errno;
        ibv_.ibv_close_device(fresh.ctx);
        fail(mkSystemError, "verbs transport: ibv_alloc_pd: " + errno_text(e));
      }
      o = fresh;
    }
    return o;
  }

  int tcp_connect(const sockaddr_storage& sa, socklen_t len, const std::string& peer) {
    const int fd = ::socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) fail(mkSystemError, "verbs transport: socket(): " + errno_text(errno));
    timeval tv{opts_.timeout_ms / 1000, (opts_.timeout_ms % 1000) * 1000};
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);  // bounds the blocking connect()
    int rc;
    while ((rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&sa), len)) != 0 && errno == EINTR) {
    }
    if (rc != 0) {
      const int e = errno;
      ::close(fd);
      if (e == EINPROGRESS) fail(mkRemoteError, "verbs transport: connecting to " + peer + " timed out");
      fail(mkRemoteError, "verbs transport: cannot connect to " + peer + ": " + errno_text(e));
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
  }

  // A connection's QP, CQ and control block, the QP in INIT. On failure
  // everything made so far is released (the unique_ptr's deleter).
  struct ConnDeleter {
    VerbsNet* net;
    void operator()(Conn* c) const { net->destroy(c); }
  };
  using ConnPtr = std::unique_ptr<Conn, ConnDeleter>;

  ConnPtr make_conn(const Port& pt, bool sending, const std::string& peer) {
    Opened& o = opened(pt.device);
    ConnPtr c(new Conn, ConnDeleter{this});
    c->sending = sending;
    c->pid = ::getpid();
    c->port = &pt;
    c->ctx = o.ctx;
    c->peer = peer;
    c->cq = ibv_.ibv_create_cq(o.ctx, kCqDepth, nullptr, nullptr, 0);
    if (!c->cq) fail(mkSystemError, "verbs transport: ibv_create_cq on " + pt.text() + ": " + errno_text(errno));
    ibv_qp_init_attr qa{};
    qa.send_cq = qa.recv_cq = c->cq;
    qa.qp_type = IBV_QPT_RC;
    qa.cap.max_send_wr = kSendDepth;
    qa.cap.max_recv_wr = kMaxRequests;
    qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
    c->qp = ibv_.ibv_create_qp(o.pd, &qa);
    if (!c->qp) fail(mkSystemError, "verbs transport: ibv_create_qp on " + pt.text() + ": " + errno_text(errno));
    const size_t ctrl_bytes = (sizeof(Ctrl) + 4095) & ~size_t(4095);
    c->ctrl = static_cast<Ctrl*>(std::aligned_alloc(4096, ctrl_bytes));
    if (!c->ctrl) throw std::bad_alloc();
    std::memset(static_cast<void*>(c->ctrl), 0, ctrl_bytes);
    c->ctrl_mr = (ibv_.ibv_reg_mr)(o.pd, c->ctrl, ctrl_bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!c->ctrl_mr) fail(mkSystemError, "verbs transport: ibv_reg_mr (control block) on " + pt.text() + ": " + errno_text(errno));
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = uint8_t(pt.port);
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    modify(*c, a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT");
    random_bytes(&c->psn, sizeof c->psn);
    c->psn &= 0xffffff;
    return c;
  }

  void modify(Conn& c, ibv_qp_attr& a, int mask, const char* state) {
    if (int rc = ibv_.ibv_modify_qp(c.qp, &a, mask))
      fail(mkSystemError, "verbs transport: ibv_modify_qp to " + std::string(state) + " (QP " + hex(c.qp->qp_num) +
                              " on " + c.port->text() + ", peer " + c.peer + "): " + errno_text(rc > 0 ? rc : errno));
  }

  QpInfo local_info(const Conn& c, bool reply) const {
    QpInfo q{};
    std::memcpy(q.magic, kInfoMagic, 4);
    q.version = kWireVersion;
    q.is_reply = reply;
    q.link_layer = c.port->attr.link_layer;
    q.mtu = uint8_t(c.port->attr.active_mtu);
    std::memcpy(q.token, c.token, 16);
    q.qpn = c.qp->qp_num;
    q.psn = c.psn;
    q.lid = c.port->attr.lid;
    q.port = uint16_t(c.port->port);
    q.max_wr_bytes = uint32_t(wr_limit(*c.port));
    std::memcpy(q.gid, c.port->gid.raw, 16);
    q.ctrl_addr = reinterpret_cast<uintptr_t>(c.ctrl);
    q.ctrl_rkey = c.ctrl_mr->rkey;
    std::snprintf(q.dev, sizeof q.dev, "%s", c.port->dev_name.c_str());
    return q;
  }

  // INIT -> RTR -> RTS towards the peer's QP.
  void connect_qp(Conn& c, const QpInfo& r) {
    const Port& pt = *c.port;
    c.peer += " (QP " + hex(r.qpn) + " on " + std::string(r.dev, strnlen(r.dev, sizeof r.dev)) + ":" +
              std::to_string(r.port) + ")";
    if (r.link_layer != pt.attr.link_layer)
      c.broken(std::string("the peer's port is ") + (r.link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand") +
               " and " + pt.text() + " is " + (pt.roce ? "RoCE" : "InfiniBand"));
    c.remote_ctrl = r.ctrl_addr;
    c.remote_rkey = r.ctrl_rkey;
    c.wr_bytes = std::max<size_t>(1, std::min<size_t>(r.max_wr_bytes, wr_limit(pt)));
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = ibv_mtu(std::min<int>(r.mtu, pt.attr.active_mtu));
    a.dest_qp_num = r.qpn;
    a.rq_psn = r.psn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.port_num = uint8_t(pt.port);
    a.ah_attr.dlid = r.lid;
    ibv_gid rgid;
    std::memcpy(rgid.raw, r.gid, 16);
    const bool other_subnet = rgid.global.subnet_prefix != pt.gid.global.subnet_prefix;
    if (pt.roce || opts_.gid_index >= 0 || other_subnet) {
      a.ah_attr.is_global = 1;
      a.ah_attr.grh.dgid = rgid;
      a.ah_attr.grh.sgid_index = uint8_t(pt.gid_index);
      a.ah_attr.grh.hop_limit = 255;
    }
    modify(c, a,
           IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
               IBV_QP_MIN_RNR_TIMER,
           "RTR");
    a = ibv_qp_attr{};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = c.psn;
    a.timeout = kQpTimeout;
    a.retry_cnt = kRetries;
    a.rnr_retry = 7;  // infinite: receives are always posted before their clear-to-send
    a.max_rd_atomic = 1;
    modify(c, a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC,
           "RTS");
  }

  RecvComm* finish_accept(Listen& l, const Pending& p) {
    sockaddr_storage sa{};
    socklen_t len = sizeof sa;
    ::getpeername(p.fd, reinterpret_cast<sockaddr*>(&sa), &len);
    ConnPtr c;
    try {
      c = make_conn(port(l.dev), false, addr_text(reinterpret_cast<sockaddr*>(&sa)));
    } catch (...) {
      ::close(p.fd);  // the peer sees the stream end
      throw;
    }
    c->fd = p.fd;
    std::memcpy(c->token, l.handle.token, 16);
    connect_qp(*c, p.hello);
    const QpInfo reply = local_info(*c, true);
    write_all(c->fd, &reply, sizeof reply, opts_.timeout_ms, c->peer);
    return c.release();
  }

  // Sender: reads the receiver's reply, connects the QP, says ready.
  void finish_connect(Conn& c) {
    QpInfo r;
    if (!c.read_record(&r)) return;
    if (std::memcmp(r.magic, kInfoMagic, 4) != 0 || r.version != kWireVersion || !r.is_reply ||
        std::memcmp(r.token, c.token, 16) != 0)
      c.broken("protocol violation: the peer's reply is not a verbs transport QP description");
    try {
      connect_qp(c, r);
    } catch (const RtError& e) {
      c.broken(e.what());
    }
    Note n{};
    std::memcpy(n.magic, kNoteMagic, 4);
    n.kind = kReady;
    try {
      write_all(c.fd, &n, sizeof n, opts_.timeout_ms, c.peer);
    } catch (const RtError& e) {
      c.broken(e.what());
    }
    c.ready = true;
  }

  // Reads notes: the receiver's "ready" and a failing peer's reason.
  void read_notes(Conn& c) {
    Note n;
    while (c.read_record(&n)) {
      if (std::memcmp(n.magic, kNoteMagic, 4) != 0) c.broken("protocol violation: garbage on the setup stream");
      if (n.kind == kReady && !c.sending) {
        c.ready = true;
      } else if (n.kind == kFailed) {
        n.text[sizeof n.text - 1] = 0;
        c.broken(std::string("the peer failed: ") + n.text);
      } else {
        c.broken("protocol violation: unexpected note " + std::to_string(n.kind));
      }
    }
  }

  Req* claim(Conn& c, void* data, size_t bytes, int tag, Mr* mh) {
    c.check();
    Req& r = c.reqs[c.next_seq % kMaxRequests];
    if (r.in_use) return nullptr;
    r = Req{};
    r.conn = &c;
    r.seq = c.next_seq;
    r.data = static_cast<char*>(data);
    r.cap = bytes;
    r.tag = tag;
    const auto a = reinterpret_cast<uintptr_t>(data);
    if (bytes == 0) {
    } else if (mh && mh->pid == c.pid && mh->device == c.port->device && a >= mh->base && a + bytes <= mh->base + mh->bytes) {
      r.lkey = mh->mr->lkey;
      r.rkey = mh->mr->rkey;
    } else {
      r.temp = (ibv_.ibv_reg_mr)(opened(c.port->device).pd, data, bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
      if (!r.temp)
        fail(mkSystemError, "verbs transport: ibv_reg_mr(" + std::to_string(bytes) + " bytes) on " + c.port->text() +
                                ": " + errno_text(errno));
      r.lkey = r.temp->lkey;
      r.rkey = r.temp->rkey;
    }
    r.in_use = true;
    ++c.next_seq;
    return &r;
  }

  void release_req(Conn& c, Req& r) {
    if (r.temp && c.pid == ::getpid()) ibv_.ibv_dereg_mr(r.temp);
    r.temp = nullptr;
    r.in_use = false;
  }

  void post_write(Conn& c, Req& r, const void* local, uint32_t lkey, size_t n, uint64_t raddr, uint32_t rkey,
                  bool with_imm, uint32_t imm, WrKind kind) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(local), uint32_t(n), lkey};
    ibv_send_wr wr{};
    wr.wr_id = wr_id(r.seq, kind);
    wr.sg_list = n ? &sge : nullptr;
    wr.num_sge = n ? 1 : 0;
    wr.opcode = with_imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(imm);
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr* bad = nullptr;
    if (int rc = ibv_post_send(c.qp, &wr, &bad)) c.broken("ibv_post_send: " + errno_text(rc > 0 ? rc : errno));
    --c.send_free;
    ++r.wrs;
  }

  // Posts what is left of send `r`; false when the send queue is full.
  bool post_send_req(Conn& c, Req& r) {
    const size_t slot = r.seq % kMaxRequests;
    const bool info = r.status != kInfoOk || r.cap >= kImmInfo;
    const uint32_t imm = info ? kImmInfo : uint32_t(r.cap);
    if (info && !r.info_posted) {
      if (c.send_free < 1) return false;
      MsgInfo& m = c.ctrl->info[slot];
      m = MsgInfo{uint64_t(r.cap), r.tag, r.status, r.seq + 1, 0};
      post_write(c, r, &m, c.ctrl_mr->lkey, sizeof m, c.remote_ctrl + offsetof(Ctrl, info) + slot * sizeof(MsgInfo),
                 c.remote_rkey, false, 0, kWrSend);
      r.info_posted = true;
    }
    if (r.status == kInfoOk) {
      while (r.written < r.cap) {
        if (c.send_free < 1) return false;
        const size_t n = std::min(c.wr_bytes, r.cap - r.written);
        const bool last = r.written + n == r.cap;
        post_write(c, r, r.data + r.written, r.lkey, n, r.cts.addr + r.written, r.cts.rkey, last, imm, kWrSend);
        r.written += n;
        r.imm_posted = last;
      }
    }
    if (!r.imm_posted) {  // 0 bytes, or a failure: the immediate alone
      if (c.send_free < 1) return false;
      post_write(c, r, nullptr, 0, 0, r.cts.addr, r.cts.rkey, true, imm, kWrSend);
      r.imm_posted = true;
    }
    return true;
  }

  void post_recv_req(Conn& c, Req& r) {
    ibv_recv_wr wr{};
    wr.wr_id = wr_id(r.seq, kWrRecv);
    ibv_recv_wr* bad = nullptr;
    if (int rc = ibv_post_recv(c.qp, &wr, &bad)) c.broken("ibv_post_recv: " + errno_text(rc > 0 ? rc : errno));
    const size_t slot = r.seq % kMaxRequests;
    Cts& e = c.ctrl->fifo[slot];
    e = Cts{reinterpret_cast<uintptr_t>(r.data), uint64_t(r.cap), r.rkey, r.tag, r.seq + 1};
    post_write(c, r, &e, c.ctrl_mr->lkey, sizeof e, c.remote_ctrl + slot * sizeof(Cts), c.remote_rkey, false, 0, kWrCts);
    r.posted = true;
  }

  void completed(Conn& c, const ibv_wc& wc) {
    const uint64_t seq = wc.wr_id >> 2;
    const auto kind = WrKind(wc.wr_id & 3);
    const char* what = kind == kWrRecv ? "a receive" : kind == kWrCts ? "a clear-to-send write" : "a data write";
    if (wc.status != IBV_WC_SUCCESS)
      c.broken(std::string(what) + " (message " + std::to_string(seq) + ") completed with " + wc_status_name(wc.status) +
               " (vendor error " + hex(wc.vendor_err) + ", QP " + hex(c.qp->qp_num) + " on " + c.port->text() + ")");
    if (kind != kWrRecv) ++c.send_free;
    Req* r = c.at(seq);
    if (!r) c.broken("protocol violation: a completion for message " + std::to_string(seq) + ", which is not pending");
    if (kind == kWrSend) {
      if (--r->wrs == 0 && r->imm_posted) {
        r->done = true;
        if (r->status == kInfoTooLarge)
          c.broken("the peer's receive " + std::to_string(seq) + " has " + std::to_string(r->cts.size) +
                   " bytes, too few for a message of " + std::to_string(r->cap) + " bytes");
        if (r->status == kInfoTagMismatch)
          c.broken("the peer's receive " + std::to_string(seq) + " has tag " + std::to_string(r->cts.tag) +
                   " and the message tag " + std::to_string(r->tag));
      }
      return;
    }
    if (kind == kWrCts) {
      --r->wrs;
      r->cts_done = true;
    } else {
      if (wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM || seq != c.next_got)
        c.broken("protocol violation: receive completion for message " + std::to_string(seq) + " where " +
                 std::to_string(c.next_got) + " was due");
      ++c.next_got;
      const uint32_t imm = ntohl(wc.imm_data);
      uint64_t size = imm;
      if (imm & kImmInfo) {
        const MsgInfo& m = c.ctrl->info[seq % kMaxRequests];
        std::atomic_thread_fence(std::memory_order_acquire);
        if (m.seq1 != seq + 1) c.broken("protocol violation: no info record for message " + std::to_string(seq));
        if (m.status == kInfoTooLarge)
          c.broken("a message of " + std::to_string(m.size) + " bytes arrived for a receive of " +
                   std::to_string(r->cap) + " bytes");
        if (m.status == kInfoTagMismatch)
          c.broken("a message with tag " + std::to_string(m.tag) + " arrived for a receive with tag " +
                   std::to_string(r->tag));
        size = m.size;
      }
      if (size > r->cap)
        c.broken("protocol violation: " + std::to_string(size) + " bytes written into a receive of " +
                 std::to_string(r->cap));
      r->size = size;
      r->got = true;
    }
    r->done = r->got && r->cts_done;
  }

  void poll(Conn& c) {
    ibv_wc wc[16];
    for (;;) {
      const int n = ibv_poll_cq(c.cq, 16, wc);
      if (n < 0) c.broken("ibv_poll_cq failed (" + std::to_string(n) + ")");
      for (int i = 0; i < n; ++i) completed(c, wc[i]);
      if (n < 16) return;
    }
  }

  void progress(Conn& c) {
    c.check();
    if (c.pid != ::getpid())
      fail(mkInvalidUsage, "verbs transport: a connection made by process " + std::to_string(c.pid) +
                               " used in process " + std::to_string(::getpid()) + " (verbs resources do not cross fork)");
    if (c.sending && !c.ready) finish_connect(c);
    if (c.ready) poll(c);                      // this side's completions say the most: before the peer's note
    if (c.ready || !c.sending) read_notes(c);  // a sender's first record is the reply
    if (c.ready) {
      if (c.sending) {
        for (; c.next_post < c.next_seq; ++c.next_post) {  // match clear-to-send entries in order
          Req& r = *c.at(c.next_post);
          if (!r.matched) {
            const Cts& e = c.ctrl->fifo[r.seq % kMaxRequests];
            if (reinterpret_cast<const volatile uint64_t&>(e.seq1) != r.seq + 1) break;
            std::atomic_thread_fence(std::memory_order_acquire);
            r.cts = e;
            r.matched = true;
            r.status = r.cap > r.cts.size ? kInfoTooLarge : r.tag != r.cts.tag ? kInfoTagMismatch : kInfoOk;
          }
          if (!post_send_req(c, r)) break;
        }
      } else {
        for (; c.next_post < c.next_seq && c.send_free > 0; ++c.next_post) post_recv_req(c, *c.at(c.next_post));
      }
    }
    if (c.peer_closed && c.pending()) {
      if (c.ready) poll(c);  // what completed before the stream ended
      if (c.pending())
        c.broken(std::string("closed by the peer") + (c.ready ? "" : " before the connection was set up") +
                 (c.sending ? "" : " (message " + std::to_string(c.next_got) + ")"));
    }
  }

  void destroy(Conn* c) {
    if (!c) return;
    if (c->pid == ::getpid()) {  // verbs resources of another process are not ours to free
      if (c->qp) ibv_.ibv_destroy_qp(c->qp);  // first: nothing lands in memory released below
      for (Req& r : c->reqs)
        if (r.in_use) release_req(*c, r);
      if (c->ctrl_mr) ibv_.ibv_dereg_mr(c->ctrl_mr);
      if (c->cq) ibv_.ibv_destroy_cq(c->cq);
    }
    std::free(c->ctrl);
    if (c->fd >= 0) ::close(c->fd);
    delete c;
  }
};

}  // namespace

std::unique_ptr<Net> make_verbs_net(const VerbsOptions& opts) {
  if (opts.timeout_ms < 1) fail(mkInvalidArgument, "verbs transport: timeout_ms must be positive");
  return std::make_unique<VerbsNet>(opts);
}

#endif  // MK_HAVE_VERBS

}  // namespace mk::rt::net
