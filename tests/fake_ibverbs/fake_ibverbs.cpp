// The fake libibverbs: see README.md and fake_ibverbs.h.
//
// One POSIX shm object (the "fabric", named by MKFAKE_IB_NAME) is shared by
// every process using the fake: a table of QP slots, each with the QP's state,
// owner pid, address (LID, GIDs), peer and PSNs, the counters its peer writes
// back (WRs applied, a NAK) and an inbound ring of 8 KiB cells. An RDMA write
// is cut into cells that the requester pushes into the responder's ring; the
// responder's process applies them (copies into its registered memory, checks
// the rkey and bounds, consumes a posted receive for WITH_IMM) when it next
// polls a CQ of that QP, and then marks the WR applied, which the requester
// turns into a send completion. Everything else (MRs, CQs, WR queues) lives
// in the process that made it.
#include "tests/fake_ibverbs/fake_ibverbs.h"

#include <endian.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kMagic = 0x4d4b46414b454942ull;  // "MKFAKEIB"
constexpr uint32_t kVersion = 1;
constexpr int kMaxQps = 128;
constexpr int kCells = 16;
constexpr size_t kCellBytes = 8192;
constexpr int kMaxAttach = 64;
constexpr int kGids = 8;
constexpr uint32_t kMaxMsg = 1u << 20;  // small, so that callers' splitting is exercised
constexpr int kMaxWr = 4096;
constexpr int kMaxSge = 4;
constexpr int kMaxCqe = 65536;
constexpr auto kNotReadyRetry = std::chrono::milliseconds(200);  // a responder not in RTR: retries run out

constexpr uint32_t kLast = 1, kImm = 2;  // cell flags

struct CellHead {
  uint32_t src_qpn, dst_qpn;
  uint64_t wr_index;
  uint64_t raddr;
  uint64_t total;  // bytes of the whole WR
  uint32_t rkey, len, imm, flags;
};
constexpr size_t kCellData = kCellBytes - sizeof(CellHead);
struct Cell {
  CellHead h;
  uint8_t data[kCellData];
};
static_assert(sizeof(Cell) == kCellBytes);

struct Slot {
  std::atomic<uint32_t> qpn;  // 0: free
  std::atomic<int32_t> pid;
  std::atomic<int32_t> state;
  // the owner's port, for peers checking their address vector
  int32_t dev_index, roce;
  uint16_t lid;
  uint8_t gids[kGids][16];
  // set by ibv_modify_qp
  std::atomic<uint32_t> dest_qpn, sq_psn, rq_psn;
  int32_t path_mtu, is_global, sgid_index;
  uint16_t dlid;
  uint8_t dgid[16];
  // written by the peer (the responder of this QP's writes)
  std::atomic<uint64_t> acked;  // WRs applied
  std::atomic<uint64_t> nak_index;
  std::atomic<uint32_t> nak_status;
  // control
  std::atomic<int32_t> inject_status;
  // inbound ring: the peer produces, the owner consumes
  std::atomic<uint64_t> head, tail;
  Cell cells[kCells];
};

struct Fabric {
  std::atomic<uint64_t> magic;
  uint32_t version, slots;
  pthread_mutex_t lock;
  uint32_t gen;
  int32_t attached[kMaxAttach];
  Slot slot[kMaxQps];
};

// --- process-local objects --------------------------------------------------

struct Dev {
  ibv_device dev;
  int index;
  bool roce, down;
};
struct Ctx {
  verbs_context v;  // the ibv_context is its last member, as with real providers
  Dev* dev;
};
struct Pd {
  ibv_pd pd;
  int users = 0;
};
struct Mr {
  ibv_mr mr;
  Pd* pd;
  uint64_t iova;
  char* local;
  size_t len;
  int access;
  void* map = nullptr;
  size_t map_len = 0;
};
struct Cq {
  ibv_cq cq;
  std::deque<ibv_wc> q;
  int users = 0;
  bool overrun_said = false;
};
struct SendWr {
  uint64_t wr_id, index, raddr, total;
  uint32_t rkey, imm;
  bool signaled, with_imm;
  int err;  // a local error found at post: completes with it
  std::vector<std::pair<char*, uint32_t>> segs;
};
struct Qp {
  ibv_qp qp;
  int slot;
  Pd* pd;
  Cq *scq, *rcq;
  int max_send, max_recv;
  bool sig_all;
  std::deque<SendWr> sq;
  std::deque<uint64_t> rq;  // wr_ids
  uint64_t posted = 0;      // send WRs posted
  uint64_t tx = 0;          // next send WR to transmit
  uint64_t tx_off = 0;      // bytes of it transmitted
  Clock::time_point stalled{};
  Clock::time_point zombie_checked{};
};

struct Proc {
  std::recursive_mutex mu;
  pid_t pid = 0;
  Fabric* fab = nullptr;
  std::string fab_name;
  std::unordered_map<ibv_context*, Ctx*> ctxs;
  std::unordered_map<ibv_pd*, Pd*> pds;
  std::unordered_map<ibv_mr*, Mr*> mrs;
  std::unordered_map<uint32_t, Mr*> keys;
  std::unordered_map<ibv_cq*, Cq*> cqs;
  std::vector<Qp*> qps;  // oldest first
  uint32_t next_key = 0x1000;
  std::string fail_text;
  std::map<std::string, long> fail_at, calls;
};

Proc& P() {
  static Proc* p = new Proc;  // never destroyed: objects may outlive static destruction
  return *p;
}

// Every entry point holds the process lock; a forked child starts afresh
// (its parent's objects are not its own), keeping the fabric mapping.
struct Lock {
  std::lock_guard<std::recursive_mutex> g{P().mu};
  Lock() {
    Proc& p = P();
    if (p.pid == ::getpid()) return;
    p.pid = ::getpid();
    p.ctxs.clear();
    p.pds.clear();
    p.mrs.clear();
    p.keys.clear();
    p.cqs.clear();
    p.qps.clear();
    p.fail_text.clear();
    p.fail_at.clear();
    p.calls.clear();
  }
};

void say(const char* fmt, const char* a = "", const char* b = "") {
  std::fprintf(stderr, "mkfake_ib: ");
  std::fprintf(stderr, fmt, a, b);
  std::fprintf(stderr, "\n");
}

// MKFAKE_IB_FAIL="create_qp:1,ibv_modify_qp:3": the N-th call (per process) fails.
bool injected(const char* verb) {
  Proc& p = P();
  const char* env = std::getenv("MKFAKE_IB_FAIL");
  const std::string text = env ? env : "";
  if (text != p.fail_text) {
    p.fail_text = text;
    p.fail_at.clear();
    p.calls.clear();
    for (size_t at = 0; at < text.size();) {
      const size_t comma = std::min(text.find(',', at), text.size());
      std::string item = text.substr(at, comma - at);
      at = comma + 1;
      const size_t colon = item.rfind(':');
      if (colon == std::string::npos) continue;
      std::string name = item.substr(0, colon);
      if (name.rfind("ibv_", 0) == 0) name.erase(0, 4);
      p.fail_at[name] = std::atol(item.c_str() + colon + 1);
    }
  }
  const long n = ++p.calls[verb];
  const auto it = p.fail_at.find(verb);
  return it != p.fail_at.end() && it->second == n;
}

bool pid_alive(pid_t pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  char path[64], buf[512];
  std::snprintf(path, sizeof path, "/proc/%d/stat", int(pid));
  FILE* f = std::fopen(path, "r");
  if (!f) return false;
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = 0;
  const char* paren = std::strrchr(buf, ')');
  return !(paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X'));  // a zombie is dead
}

// --- the fabric -------------------------------------------------------------

struct FabLock {
  Fabric* f;
  explicit FabLock(Fabric* fab) : f(fab) {
    if (pthread_mutex_lock(&f->lock) == EOWNERDEAD) pthread_mutex_consistent(&f->lock);
  }
  ~FabLock() { pthread_mutex_unlock(&f->lock); }
};

std::string fabric_name() {
  const char* n = std::getenv("MKFAKE_IB_NAME");
  std::string name = n && *n ? n : "mkfake-ib-" + std::to_string(::getuid());
  return "/" + name + "-v" + std::to_string(kVersion);
}

bool attach() {
  Proc& p = P();
  if (!p.fab) {
    const std::string name = fabric_name();
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    Fabric* f = nullptr;
    while (!f) {
      if (Clock::now() > deadline) {
        say("the fabric %s never became ready", name.c_str());
        errno = ETIMEDOUT;
        return false;
      }
      bool created = true;
      int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      if (fd < 0 && errno == EEXIST) {
        created = false;
        fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
      }
      if (fd < 0) {
        if (errno == ENOENT) continue;  // unlinked meanwhile
        say("shm_open(%s): %s", name.c_str(), std::strerror(errno));
        return false;
      }
      struct stat st{};
      if (created ? ::ftruncate(fd, sizeof(Fabric)) != 0 : (::fstat(fd, &st) != 0 || size_t(st.st_size) < sizeof(Fabric))) {
        ::close(fd);
        if (created) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));  // its creator is sizing it
        continue;
      }
      void* m = ::mmap(nullptr, sizeof(Fabric), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      ::close(fd);
      if (m == MAP_FAILED) return false;
      f = static_cast<Fabric*>(m);
      if (created) {
        pthread_mutexattr_t a;
        pthread_mutexattr_init(&a);
        pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
        pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
        pthread_mutex_init(&f->lock, &a);
        f->version = kVersion;
        f->slots = kMaxQps;
        f->magic.store(kMagic, std::memory_order_release);
      }
      while (f->magic.load(std::memory_order_acquire) != kMagic && Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (f->magic.load() != kMagic || f->version != kVersion || f->slots != kMaxQps) {
        say("%s is not a fabric of this version (remove it from /dev/shm)", name.c_str());
        ::munmap(f, sizeof(Fabric));
        errno = EPROTO;
        return false;
      }
    }
    p.fab = f;
    p.fab_name = name;
  }
  FabLock l(p.fab);
  int free_at = -1;
  for (int i = 0; i < kMaxAttach; ++i) {
    if (p.fab->attached[i] == p.pid) return true;
    if (free_at < 0 && !pid_alive(p.fab->attached[i])) free_at = i;
  }
  if (free_at >= 0) p.fab->attached[free_at] = p.pid;
  return true;
}

// The last context of this process closed: the fabric goes when no attached
// process lives.
void detach() {
  Proc& p = P();
  if (!p.fab || !p.ctxs.empty()) return;
  bool others = false;
  {
    FabLock l(p.fab);
    for (int32_t& a : p.fab->attached) {
      if (a == p.pid) a = 0;
      else if (pid_alive(a)) others = true;
    }
  }
  if (!others) ::shm_unlink(p.fab_name.c_str());
  if (p.qps.empty()) {
    ::munmap(p.fab, sizeof(Fabric));
    p.fab = nullptr;
  }
}

Slot* slot_of(uint32_t qpn) {
  Fabric* f = P().fab;
  if (!f || !qpn) return nullptr;
  Slot& s = f->slot[qpn % kMaxQps];
  return s.qpn.load(std::memory_order_acquire) == qpn ? &s : nullptr;
}

// --- devices ------------------------------------------------------------------

uint64_t guid(int index) { return 0x0002c90300fa0000ull + uint64_t(index); }

void gid_of(const Dev& d, int i, uint8_t out[16]) {
  std::memset(out, 0, 16);
  if (!d.roce) {
    if (i != 0) return;
    out[0] = 0xfe;
    out[1] = 0x80;
    const uint64_t g = htobe64(guid(d.index));
    std::memcpy(out + 8, &g, 8);
    return;
  }
  if (i < 2) {  // link-local from a MAC (RoCE v1, v2)
    const uint8_t ll[16] = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x00, 0x5e, 0xff, 0xfe, 0x00, 0x00, uint8_t(d.index + 1)};
    std::memcpy(out, ll, 16);
  } else if (i < 4) {  // IPv4-mapped 10.77.0.N (RoCE v1, v2)
    const uint8_t v4[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, uint8_t(d.index + 1)};
    std::memcpy(out, v4, 16);
  }
}
bool zero_gid(const uint8_t g[16]) {
  return std::all_of(g, g + 16, [](uint8_t b) { return b == 0; });
}
int gid_count(const Dev& d) { return d.roce ? kGids : 4; }
int gid_type(const Dev& d, int i) { return !d.roce ? IBV_GID_TYPE_IB : i % 2 ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_ROCE_V1; }

ibv_port_attr port_attr(const Dev& d) {
  ibv_port_attr a{};
  a.state = d.down ? IBV_PORT_DOWN : IBV_PORT_ACTIVE;
  a.max_mtu = IBV_MTU_4096;
  a.active_mtu = d.roce ? IBV_MTU_1024 : IBV_MTU_4096;
  a.gid_tbl_len = gid_count(d);
  a.max_msg_sz = kMaxMsg;
  a.pkey_tbl_len = 1;
  a.lid = d.roce ? 0 : uint16_t(d.index + 1);
  a.sm_lid = d.roce ? 0 : 1;
  a.max_vl_num = 4;
  a.active_width = 2;   // 4x
  a.active_speed = 64;  // HDR: 50 Gb/s a lane
  a.phys_state = d.down ? 3 : 5;
  a.link_layer = d.roce ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND;
  return a;
}

Ctx* ctx_of(ibv_context* c, const char* verb) {
  const auto it = P().ctxs.find(c);
  if (it != P().ctxs.end()) return it->second;
  say("%s: not a context of this process (closed, or another process's)", verb);
  return nullptr;
}
Dev& dev_of(ibv_context* c) { return *reinterpret_cast<Dev*>(c->device); }

// A creating verb's start: a context of this process, and no injected failure.
bool may_create(ibv_context* c, const char* verb) {
  if (!ctx_of(c, (std::string("ibv_") + verb).c_str())) {
    errno = EINVAL;
    return false;
  }
  if (injected(verb)) {
    errno = ENOMEM;
    return false;
  }
  return true;
}

// Frees a PD or CQ of this process: EBUSY while MRs or QPs use it, as the kernel says.
template <class Map, class Key>
int release(Map& objects, Key key) {
  const auto it = objects.find(key);
  if (it == objects.end()) return EINVAL;
  if (it->second->users) return EBUSY;
  delete it->second;
  objects.erase(it);
  return 0;
}

int query_port_ex(ibv_context* c, uint8_t port, ibv_port_attr* out, size_t len) {
  Lock lock;
  if (!ctx_of(c, "ibv_query_port")) return EINVAL;
  if (injected("query_port")) return EIO;
  if (port != 1) return EINVAL;
  const ibv_port_attr a = port_attr(dev_of(c));
  std::memcpy(out, &a, std::min(len, sizeof a));
  return 0;
}

// --- work ---------------------------------------------------------------------

void push_wc(Cq* cq, const ibv_wc& wc) {
  if (int(cq->q.size()) >= cq->cq.cqe && !cq->overrun_said) {
    say("CQ overrun: more than %s completions not polled", std::to_string(cq->cq.cqe).c_str());
    cq->overrun_said = true;
  }
  cq->q.push_back(wc);
}

void complete_send(Qp* q, int status) {
  SendWr& w = q->sq.front();
  if (w.signaled || status != IBV_WC_SUCCESS) {
    ibv_wc wc{};
    wc.wr_id = w.wr_id;
    wc.status = ibv_wc_status(status);
    wc.opcode = IBV_WC_RDMA_WRITE;
    wc.vendor_err = status == IBV_WC_SUCCESS ? 0 : 0x81;
    wc.byte_len = uint32_t(w.total);
    wc.qp_num = q->qp.qp_num;
    push_wc(q->scq, wc);
  }
  if (q->tx == w.index) q->tx_off = 0;
  q->tx = std::max(q->tx, w.index + 1);
  q->sq.pop_front();
}

void flush(Qp* q) {
  while (!q->sq.empty()) complete_send(q, IBV_WC_WR_FLUSH_ERR);
  q->tx = q->posted;
  q->tx_off = 0;
  for (uint64_t id : q->rq) {
    ibv_wc wc{};
    wc.wr_id = id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.opcode = IBV_WC_RECV;
    wc.qp_num = q->qp.qp_num;
    push_wc(q->rcq, wc);
  }
  q->rq.clear();
}

// Applies what arrived for this QP.
void respond(Qp* q, Slot& me) {
  Proc& p = P();
  for (;;) {
    const uint64_t tail = me.tail.load(std::memory_order_relaxed);
    if (tail == me.head.load(std::memory_order_acquire)) return;
    const int st = me.state.load();
    if (st == IBV_QPS_ERR) {  // dropped: the requester's retries run out
      me.tail.store(me.head.load(), std::memory_order_release);
      return;
    }
    if (st != IBV_QPS_RTR && st != IBV_QPS_RTS) return;
    const Cell& c = me.cells[tail % kCells];
    Slot* req = slot_of(c.h.src_qpn);
    const bool last = c.h.flags & kLast, imm = c.h.flags & kImm;
    if (c.h.dst_qpn == me.qpn.load() && c.h.src_qpn == me.dest_qpn.load()) {
      if (last && imm && q->rq.empty()) return;  // receiver not ready: retried until a receive is posted
      bool ok = true;
      if (c.h.len) {
        const auto it = p.keys.find(c.h.rkey);
        const Mr* m = it == p.keys.end() ? nullptr : it->second;
        ok = m && m->pd == q->pd && (m->access & IBV_ACCESS_REMOTE_WRITE) && c.h.raddr >= m->iova &&
             c.h.raddr + c.h.len <= m->iova + m->len;
        if (ok) std::memcpy(m->local + (c.h.raddr - m->iova), c.data, c.h.len);
      }
      if (!ok && req) {
        req->nak_index.store(c.h.wr_index);
        req->nak_status.store(IBV_WC_REM_ACCESS_ERR, std::memory_order_release);
      } else if (last) {
        if (imm) {
          ibv_wc wc{};
          wc.wr_id = q->rq.front();
          q->rq.pop_front();
          wc.status = IBV_WC_SUCCESS;
          wc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
          wc.byte_len = uint32_t(c.h.total);
          wc.imm_data = c.h.imm;
          wc.wc_flags = IBV_WC_WITH_IMM;
          wc.qp_num = q->qp.qp_num;
          wc.src_qp = c.h.src_qpn;
          push_wc(q->rcq, wc);
        }
        if (req && req->acked.load() < c.h.wr_index + 1) req->acked.store(c.h.wr_index + 1, std::memory_order_release);
      }
    }
    me.tail.store(tail + 1, std::memory_order_release);
  }
}

// Why the peer of this QP cannot take its writes (null: it can, or may soon).
const char* peer_problem(Qp* q, Slot& me) {
  Slot* peer = slot_of(me.dest_qpn.load());
  if (!peer) return "the peer QP does not exist";
  if (peer->dest_qpn.load() != me.qpn.load()) return "the peer QP is connected to another QP";
  const auto now = Clock::now();
  if (::kill(peer->pid.load(), 0) != 0 && errno == ESRCH) return "the peer process is gone";
  if (now - q->zombie_checked > std::chrono::milliseconds(5)) {
    q->zombie_checked = now;
    if (!pid_alive(peer->pid.load())) return "the peer process is gone";
  }
  if (me.sq_psn.load() != peer->rq_psn.load()) return "the PSNs do not match (sq_psn != the peer's rq_psn)";
  const int st = peer->state.load();
  if (st == IBV_QPS_ERR) return "the peer QP is in the error state";
  if (st == IBV_QPS_RTR || st == IBV_QPS_RTS) {
    q->stalled = {};
    return nullptr;
  }
  if (q->stalled == Clock::time_point{}) q->stalled = now;
  return now - q->stalled > kNotReadyRetry ? "the peer QP never reached RTR" : nullptr;
}

// Moves the send queue: completions, then transmission.
void request(Qp* q, Slot& me) {
  if (me.state.load() != IBV_QPS_RTS) return;
  while (!q->sq.empty()) {
    SendWr& w = q->sq.front();
    if (const int inj = me.inject_status.exchange(0)) {
      complete_send(q, inj);
      me.state.store(IBV_QPS_ERR);
      return;
    }
    if (w.err) {
      complete_send(q, w.err);
      me.state.store(IBV_QPS_ERR);
      return;
    }
    if (const uint32_t nak = me.nak_status.load(std::memory_order_acquire); nak && me.nak_index.load() == w.index) {
      complete_send(q, int(nak));
      me.state.store(IBV_QPS_ERR);
      return;
    }
    if (me.acked.load(std::memory_order_acquire) > w.index) {
      complete_send(q, IBV_WC_SUCCESS);
      continue;
    }
    const char* why = peer_problem(q, me);
    if (why && me.acked.load(std::memory_order_acquire) > w.index) continue;  // applied before the peer failed
    if (why) {
      if (std::getenv("MKFAKE_IB_VERBOSE")) say("QP %s: retries exceeded: %s", std::to_string(q->qp.qp_num).c_str(), why);
      complete_send(q, IBV_WC_RETRY_EXC_ERR);
      me.state.store(IBV_QPS_ERR);
      return;
    }
    break;
  }
  Slot* peer = slot_of(me.dest_qpn.load());
  if (!peer || q->sq.empty() || me.sq_psn.load() != peer->rq_psn.load()) return;
  while (q->tx < q->posted) {
    SendWr& w = q->sq[size_t(q->tx - q->sq.front().index)];
    if (w.err) return;
    do {
      const uint64_t head = peer->head.load(std::memory_order_relaxed);
      if (head - peer->tail.load(std::memory_order_acquire) >= kCells) return;  // full: later
      Cell& c = peer->cells[head % kCells];
      const uint64_t n = std::min<uint64_t>(kCellData, w.total - q->tx_off);
      c.h.src_qpn = me.qpn.load();
      c.h.dst_qpn = me.dest_qpn.load();
      c.h.wr_index = w.index;
      c.h.raddr = w.raddr + q->tx_off;
      c.h.total = w.total;
      c.h.rkey = w.rkey;
      c.h.len = uint32_t(n);
      c.h.imm = w.imm;
      const bool last = q->tx_off + n == w.total;
      c.h.flags = (last ? kLast : 0) | (last && w.with_imm ? kImm : 0);
      uint64_t skip = q->tx_off, put = 0;  // gather [tx_off, tx_off + n) from the segments
      for (const auto& [ptr, len] : w.segs) {
        if (put == n) break;
        if (skip >= len) {
          skip -= len;
          continue;
        }
        const uint64_t k = std::min<uint64_t>(len - skip, n - put);
        std::memcpy(c.data + put, ptr + skip, k);
        put += k;
        skip = 0;
      }
      peer->head.store(head + 1, std::memory_order_release);
      q->tx_off += n;
    } while (q->tx_off < w.total);
    ++q->tx;
    q->tx_off = 0;
  }
}

void progress(Qp* q) {
  Slot& me = P().fab->slot[q->slot];
  respond(q, me);
  request(q, me);
  if (me.state.load() == IBV_QPS_ERR) flush(q);
}

Qp* qp_of(ibv_qp* qp, const char* verb) {
  for (Qp* q : P().qps)
    if (&q->qp == qp) return q;
  say("%s: not a QP of this process (destroyed, or another process's)", verb);
  return nullptr;
}

int post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  Lock lock;
  Qp* q = qp_of(qp, "ibv_post_send");
  *bad = wr;
  if (!q) return EINVAL;
  if (injected("post_send")) return ENOMEM;
  const int st = P().fab->slot[q->slot].state.load();
  if (st != IBV_QPS_RTS && st != IBV_QPS_ERR) return EINVAL;
  Proc& p = P();
  for (; wr; wr = wr->next) {
    *bad = wr;
    if (int(q->sq.size()) >= q->max_send) return ENOMEM;
    if (wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM) {
      say("ibv_post_send: only RDMA_WRITE and RDMA_WRITE_WITH_IMM are modelled");
      return EINVAL;
    }
    if (wr->num_sge < 0 || wr->num_sge > kMaxSge) return EINVAL;
    SendWr w{};
    w.wr_id = wr->wr_id;
    w.index = q->posted;
    w.raddr = wr->wr.rdma.remote_addr;
    w.rkey = wr->wr.rdma.rkey;
    w.imm = wr->imm_data;
    w.with_imm = wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
    w.signaled = (wr->send_flags & IBV_SEND_SIGNALED) != 0 || q->sig_all;
    for (int i = 0; i < wr->num_sge; ++i) {
      const ibv_sge& s = wr->sg_list[i];
      if (!s.length) continue;
      const auto it = p.keys.find(s.lkey);
      const Mr* m = it == p.keys.end() ? nullptr : it->second;
      if (!m || m->pd != q->pd || s.addr < m->iova || s.addr + s.length > m->iova + m->len) {
        w.err = IBV_WC_LOC_PROT_ERR;
        break;
      }
      w.segs.emplace_back(m->local + (s.addr - m->iova), s.length);
      w.total += s.length;
    }
    if (!w.err && w.total > kMaxMsg) w.err = IBV_WC_LOC_LEN_ERR;
    q->sq.push_back(std::move(w));
    ++q->posted;
  }
  *bad = nullptr;
  progress(q);
  return 0;
}

int post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  Lock lock;
  Qp* q = qp_of(qp, "ibv_post_recv");
  *bad = wr;
  if (!q) return EINVAL;
  if (injected("post_recv")) return ENOMEM;
  if (P().fab->slot[q->slot].state.load() == IBV_QPS_RESET) return EINVAL;
  for (; wr; wr = wr->next) {
    *bad = wr;
    if (int(q->rq.size()) >= q->max_recv) return ENOMEM;
    q->rq.push_back(wr->wr_id);
  }
  *bad = nullptr;
  progress(q);
  return 0;
}

int poll_cq(ibv_cq* cq, int n, ibv_wc* wc) {
  Lock lock;
  Proc& p = P();
  const auto it = p.cqs.find(cq);
  if (it == p.cqs.end()) {
    say("ibv_poll_cq: not a CQ of this process (destroyed, or another process's)");
    return -1;
  }
  if (injected("poll_cq")) return -1;
  Cq* c = it->second;
  for (Qp* q : std::vector<Qp*>(p.qps))
    if (q->scq == c || q->rcq == c) progress(q);
  int k = 0;
  for (; k < n && !c->q.empty(); ++k) {
    wc[k] = c->q.front();
    c->q.pop_front();
  }
  return k;
}

int req_notify_cq(ibv_cq*, int) { return EOPNOTSUPP; }

bool valid_transition(int from, int to, int mask) {
  constexpr int init = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  constexpr int rtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  constexpr int rts = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                      IBV_QP_MAX_QP_RD_ATOMIC;
  if (to == IBV_QPS_RESET || to == IBV_QPS_ERR) return true;
  if (from == IBV_QPS_RESET && to == IBV_QPS_INIT) return (mask & init) == init;
  if (from == IBV_QPS_INIT && to == IBV_QPS_RTR) return (mask & rtr) == rtr;
  if (from == IBV_QPS_RTR && to == IBV_QPS_RTS) return (mask & rts) == rts;
  return false;
}

// The address vector must reach the peer QP's port (when that QP exists).
bool check_av(Qp* q, const ibv_qp_attr& a) {
  Slot& me = P().fab->slot[q->slot];
  const Dev& d = dev_of(q->qp.context);
  if (a.path_mtu > port_attr(d).active_mtu) {
    say("ibv_modify_qp(RTR): path_mtu above the port's active MTU");
    return false;
  }
  const ibv_ah_attr& ah = a.ah_attr;
  if (ah.port_num != 1) {
    say("ibv_modify_qp(RTR): ah_attr.port_num is not 1");
    return false;
  }
  if (d.roce && !ah.is_global) {
    say("ibv_modify_qp(RTR): a RoCE address vector needs a GRH (is_global)");
    return false;
  }
  int stype = -1;
  if (ah.is_global) {
    if (ah.grh.sgid_index >= gid_count(d) || zero_gid(me.gids[ah.grh.sgid_index])) {
      say("ibv_modify_qp(RTR): sgid_index %s is not a valid GID of the port", std::to_string(ah.grh.sgid_index).c_str());
      return false;
    }
    stype = gid_type(d, ah.grh.sgid_index);
  }
  const Slot* peer = slot_of(a.dest_qp_num);
  if (!peer) return true;  // not created yet: packets would go nowhere, so writes fail later
  if (peer->roce != me.roce) {
    say("ibv_modify_qp(RTR): the peer QP is on a port of another link layer");
    return false;
  }
  if (!ah.is_global) {
    if (ah.dlid != peer->lid) {
      say("ibv_modify_qp(RTR): dlid %s is not the peer port's LID %s", std::to_string(ah.dlid).c_str(),
          std::to_string(peer->lid).c_str());
      return false;
    }
    return true;
  }
  for (int i = 0; i < kGids; ++i) {
    if (!zero_gid(peer->gids[i]) && std::memcmp(peer->gids[i], ah.grh.dgid.raw, 16) == 0 && gid_type(d, i) == stype) return true;
  }
  say("ibv_modify_qp(RTR): the GRH's dgid is not a GID (of the same type as sgid_index) of the peer port");
  return false;
}

}  // namespace

// --- exported verbs -------------------------------------------------------------

extern "C" {

ibv_device** (ibv_get_device_list)(int* num) {
  Lock lock;
  if (injected("get_device_list")) {
    errno = ENOSYS;
    return nullptr;
  }
  const char* n = std::getenv("MKFAKE_IB_DEVICES");
  const int count = n && *n ? std::clamp(std::atoi(n), 0, 16) : 1;
  const char* link = std::getenv("MKFAKE_IB_LINK");
  const bool roce = link && std::strcmp(link, "roce") == 0;
  const char* down = std::getenv("MKFAKE_IB_DOWN");
  auto** list = static_cast<ibv_device**>(std::calloc(size_t(count) + 1, sizeof(ibv_device*)));
  for (int i = 0; i < count; ++i) {
    auto* d = new Dev{};  // kept: contexts may outlive the list, as with real devices
    d->index = i;
    d->roce = roce;
    d->dev.node_type = IBV_NODE_CA;
    d->dev.transport_type = IBV_TRANSPORT_IB;
    std::snprintf(d->dev.name, sizeof d->dev.name, "mkfake_%d", i);
    std::snprintf(d->dev.dev_name, sizeof d->dev.dev_name, "uverbs%d", i);
    std::snprintf(d->dev.dev_path, sizeof d->dev.dev_path, "/nonexistent/mkfake/uverbs%d", i);
    std::snprintf(d->dev.ibdev_path, sizeof d->dev.ibdev_path, "/nonexistent/mkfake/mkfake_%d", i);
    if (down) {
      const std::string list_text = std::string(",") + down + ",";
      d->down = list_text.find(std::string(",") + d->dev.name + ",") != std::string::npos;
    }
    list[i] = &d->dev;
  }
  if (num) *num = count;
  return list;
}

void ibv_free_device_list(ibv_device** list) { std::free(list); }

const char* ibv_get_device_name(ibv_device* dev) { return dev->name; }

__be64 ibv_get_device_guid(ibv_device* dev) { return htobe64(guid(reinterpret_cast<Dev*>(dev)->index)); }

ibv_context* ibv_open_device(ibv_device* dev) {
  Lock lock;
  if (injected("open_device")) {
    errno = ENODEV;
    return nullptr;
  }
  if (!attach()) return nullptr;
  auto* c = new Ctx{};
  c->dev = reinterpret_cast<Dev*>(dev);
  c->v.sz = sizeof(verbs_context);
  c->v.query_port = query_port_ex;
  ibv_context& ctx = c->v.context;
  ctx.device = dev;
  ctx.cmd_fd = ctx.async_fd = -1;
  ctx.num_comp_vectors = 1;
  ctx.abi_compat = __VERBS_ABI_IS_EXTENDED;
  ctx.ops.poll_cq = poll_cq;
  ctx.ops.req_notify_cq = req_notify_cq;
  ctx.ops.post_send = post_send;
  ctx.ops.post_recv = post_recv;
  pthread_mutex_init(&ctx.mutex, nullptr);
  P().ctxs[&ctx] = c;
  return &ctx;
}

int ibv_close_device(ibv_context* ctx) {
  Lock lock;
  Ctx* c = ctx_of(ctx, "ibv_close_device");
  if (!c) return EINVAL;
  P().ctxs.erase(ctx);
  delete c;
  detach();
  return 0;
}

int ibv_query_device(ibv_context* ctx, ibv_device_attr* a) {
  Lock lock;
  if (!ctx_of(ctx, "ibv_query_device")) return EINVAL;
  if (injected("query_device")) return EIO;
  const Dev& d = dev_of(ctx);
  *a = ibv_device_attr{};
  std::snprintf(a->fw_ver, sizeof a->fw_ver, "mkfake-1.0");
  a->node_guid = a->sys_image_guid = htobe64(guid(d.index));
  a->max_mr_size = uint64_t(1) << 40;
  a->page_size_cap = 4096;
  a->vendor_id = 0x02c9;
  a->vendor_part_id = 4129;
  a->max_qp = kMaxQps;
  a->max_qp_wr = kMaxWr;
  a->max_sge = kMaxSge;
  a->max_cq = 1024;
  a->max_cqe = kMaxCqe;
  a->max_mr = 1 << 20;
  a->max_pd = 1024;
  a->max_qp_rd_atom = a->max_qp_init_rd_atom = 16;
  a->max_pkeys = 1;
  a->phys_port_cnt = 1;
  return 0;
}

// The exported entry fills the older struct, through `flags` (rdma-core's
// _compat_ibv_port_attr); verbs.h's inline prefers the extended op above.
int (ibv_query_port)(ibv_context* ctx, uint8_t port, _compat_ibv_port_attr* out) {
  return query_port_ex(ctx, port, reinterpret_cast<ibv_port_attr*>(out), offsetof(ibv_port_attr, port_cap_flags2));
}

int ibv_query_gid(ibv_context* ctx, uint8_t port, int index, ibv_gid* gid) {
  Lock lock;
  if (!ctx_of(ctx, "ibv_query_gid")) return -1;
  const Dev& d = dev_of(ctx);
  if (injected("query_gid") || port != 1 || index < 0 || index >= gid_count(d)) {
    errno = EINVAL;
    return -1;
  }
  gid_of(d, index, gid->raw);
  return 0;
}

int _ibv_query_gid_ex(ibv_context* ctx, uint32_t port, uint32_t index, ibv_gid_entry* entry, uint32_t flags,
                      size_t entry_size) {
  Lock lock;
  if (!ctx_of(ctx, "ibv_query_gid_ex")) return EINVAL;
  const Dev& d = dev_of(ctx);
  if (injected("query_gid_ex") || port != 1 || index >= uint32_t(gid_count(d))) return EINVAL;
  ibv_gid_entry e{};
  gid_of(d, int(index), e.gid.raw);
  if (zero_gid(e.gid.raw)) return ENODATA;
  e.gid_index = index;
  e.port_num = port;
  e.gid_type = uint32_t(gid_type(d, int(index)));
  std::memcpy(entry, &e, std::min(entry_size, sizeof e));
  return 0;
}

ibv_pd* ibv_alloc_pd(ibv_context* ctx) {
  Lock lock;
  if (!may_create(ctx, "alloc_pd")) return nullptr;
  auto* p = new Pd{};
  p->pd.context = ctx;
  P().pds[&p->pd] = p;
  return &p->pd;
}

int ibv_dealloc_pd(ibv_pd* pd) {
  Lock lock;
  return release(P().pds, pd);
}

static ibv_mr* new_mr(ibv_pd* pd, uint64_t iova, char* local, size_t len, int access, const char* verb) {
  Proc& p = P();
  const auto it = p.pds.find(pd);
  if (it == p.pds.end()) {
    say("%s: not a PD of this process", verb);
    errno = EINVAL;
    return nullptr;
  }
  if (len == 0 || ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE))) {
    errno = EINVAL;
    return nullptr;
  }
  auto* m = new Mr{};
  m->pd = it->second;
  m->iova = iova;
  m->local = local;
  m->len = len;
  m->access = access;
  const uint32_t key = (p.next_key++ << 8) | uint32_t(p.pid & 0xff);
  m->mr.context = pd->context;
  m->mr.pd = pd;
  m->mr.addr = reinterpret_cast<void*>(iova);
  m->mr.length = len;
  m->mr.lkey = m->mr.rkey = key;
  ++m->pd->users;
  p.mrs[&m->mr] = m;
  p.keys[key] = m;
  return &m->mr;
}

ibv_mr* (ibv_reg_mr)(ibv_pd* pd, void* addr, size_t len, int access) {
  Lock lock;
  if (injected("reg_mr")) {
    errno = ENOMEM;
    return nullptr;
  }
  return new_mr(pd, reinterpret_cast<uintptr_t>(addr), static_cast<char*>(addr), len, access, "ibv_reg_mr");
}

// dma-buf: the fd is mapped here (a memfd or shm fd stands in for a GPU's
// dma-buf); remote writes to [iova, iova + len) land in that mapping.
ibv_mr* ibv_reg_dmabuf_mr(ibv_pd* pd, uint64_t offset, size_t len, uint64_t iova, int fd, int access) {
  Lock lock;
  if (injected("reg_dmabuf_mr")) {
    errno = ENOMEM;
    return nullptr;
  }
  const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE));
  const uint64_t at = offset & ~(page - 1);
  const size_t map_len = size_t(offset - at) + len;
  void* m = ::mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, off_t(at));
  if (m == MAP_FAILED) return nullptr;
  ibv_mr* mr = new_mr(pd, iova, static_cast<char*>(m) + (offset - at), len, access, "ibv_reg_dmabuf_mr");
  if (!mr) {
    ::munmap(m, map_len);
    return nullptr;
  }
  Mr* x = P().mrs[mr];
  x->map = m;
  x->map_len = map_len;
  return mr;
}

int ibv_dereg_mr(ibv_mr* mr) {
  Lock lock;
  Proc& p = P();
  const auto it = p.mrs.find(mr);
  if (it == p.mrs.end()) {
    say("ibv_dereg_mr: not an MR of this process");
    return EINVAL;
  }
  Mr* m = it->second;
  if (m->map) ::munmap(m->map, m->map_len);
  --m->pd->users;
  p.keys.erase(mr->lkey);
  p.mrs.erase(it);
  delete m;
  return 0;
}

ibv_cq* ibv_create_cq(ibv_context* ctx, int cqe, void* cq_context, ibv_comp_channel* channel, int) {
  Lock lock;
  if (!may_create(ctx, "create_cq")) return nullptr;
  if (cqe < 1 || cqe > kMaxCqe || channel) {
    errno = EINVAL;
    return nullptr;
  }
  auto* c = new Cq{};
  c->cq.context = ctx;
  c->cq.cq_context = cq_context;
  c->cq.cqe = cqe;
  P().cqs[&c->cq] = c;
  return &c->cq;
}

int ibv_destroy_cq(ibv_cq* cq) {
  Lock lock;
  return release(P().cqs, cq);
}

ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* a) {
  Lock lock;
  Proc& p = P();
  const auto pit = p.pds.find(pd);
  const auto sit = p.cqs.find(a->send_cq), rit = p.cqs.find(a->recv_cq);
  if (pit == p.pds.end() || sit == p.cqs.end() || rit == p.cqs.end()) {
    say("ibv_create_qp: a PD or CQ that is not this process's");
    errno = EINVAL;
    return nullptr;
  }
  if (injected("create_qp")) {
    errno = ENOMEM;
    return nullptr;
  }
  if (a->qp_type != IBV_QPT_RC || a->srq || a->cap.max_send_wr > uint32_t(kMaxWr) ||
      a->cap.max_recv_wr > uint32_t(kMaxWr) || a->cap.max_send_sge > uint32_t(kMaxSge) ||
      a->cap.max_recv_sge > uint32_t(kMaxSge) || a->cap.max_inline_data > 0) {
    if (a->qp_type != IBV_QPT_RC) say("ibv_create_qp: only RC QPs are modelled");
    errno = EINVAL;
    return nullptr;
  }
  const Dev& d = dev_of(pd->context);
  int idx = -1;
  uint32_t qpn = 0;
  {
    FabLock l(p.fab);
    for (int i = 0; i < kMaxQps && idx < 0; ++i) {
      Slot& s = p.fab->slot[i];
      if (s.qpn.load() == 0 || !pid_alive(s.pid.load())) idx = i;
    }
    if (idx >= 0) {
      Slot& s = p.fab->slot[idx];
      const uint32_t gen = ++p.fab->gen % 0xffff + 1;
      qpn = (gen * kMaxQps + uint32_t(idx)) & 0xffffff;
      s.state.store(IBV_QPS_RESET);
      s.pid.store(p.pid);
      s.dev_index = d.index;
      s.roce = d.roce;
      s.lid = port_attr(d).lid;
      for (int g = 0; g < kGids; ++g) gid_of(d, g, s.gids[g]);
      s.dest_qpn = 0;
      s.sq_psn = s.rq_psn = 0;
      s.path_mtu = s.is_global = s.sgid_index = 0;
      s.dlid = 0;
      std::memset(s.dgid, 0, 16);
      s.acked = 0;
      s.nak_index = 0;
      s.nak_status = 0;
      s.inject_status = 0;
      s.head = s.tail = 0;
      s.qpn.store(qpn, std::memory_order_release);
    }
  }
  if (idx < 0) {
    errno = ENOMEM;
    return nullptr;
  }
  auto* q = new Qp{};
  q->slot = idx;
  q->pd = pit->second;
  q->scq = sit->second;
  q->rcq = rit->second;
  q->max_send = int(std::max(1u, a->cap.max_send_wr));
  q->max_recv = int(std::max(1u, a->cap.max_recv_wr));
  q->qp.context = pd->context;
  q->qp.qp_context = a->qp_context;
  q->qp.pd = pd;
  q->qp.send_cq = a->send_cq;
  q->qp.recv_cq = a->recv_cq;
  q->qp.qp_num = qpn;
  q->qp.state = IBV_QPS_RESET;
  q->qp.qp_type = IBV_QPT_RC;
  q->sig_all = a->sq_sig_all != 0;
  ++q->pd->users;
  ++q->scq->users;
  ++q->rcq->users;
  p.qps.push_back(q);
  return &q->qp;
}

int ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* a, int mask) {
  Lock lock;
  Qp* q = qp_of(qp, "ibv_modify_qp");
  if (!q) return EINVAL;
  if (injected("modify_qp")) return EINVAL;
  Slot& me = P().fab->slot[q->slot];
  const int from = me.state.load();
  const int to = (mask & IBV_QP_STATE) ? a->qp_state : from;
  if (!valid_transition(from, to, mask)) {
    say("ibv_modify_qp: %s", ("no transition " + std::to_string(from) + " -> " + std::to_string(to) +
                              " with attribute mask " + std::to_string(mask)).c_str());
    return EINVAL;
  }
  if (to == IBV_QPS_INIT && a->port_num != 1) return EINVAL;
  if (to == IBV_QPS_RTR) {
    if (!check_av(q, *a)) return EINVAL;
    me.dest_qpn = a->dest_qp_num;
    me.rq_psn = a->rq_psn;
    me.path_mtu = a->path_mtu;
    me.is_global = a->ah_attr.is_global;
    me.sgid_index = a->ah_attr.grh.sgid_index;
    me.dlid = a->ah_attr.dlid;
    std::memcpy(me.dgid, a->ah_attr.grh.dgid.raw, 16);
  }
  if (to == IBV_QPS_RTS) me.sq_psn = a->sq_psn;
  if (to == IBV_QPS_RESET) {
    q->sq.clear();
    q->rq.clear();
    q->tx = q->posted;
  }
  me.state.store(to);
  qp->state = ibv_qp_state(to);
  if (to == IBV_QPS_ERR) flush(q);
  return 0;
}

int ibv_destroy_qp(ibv_qp* qp) {
  Lock lock;
  Proc& p = P();
  Qp* q = qp_of(qp, "ibv_destroy_qp");
  if (!q) return EINVAL;
  {
    FabLock l(p.fab);
    Slot& s = p.fab->slot[q->slot];
    s.state.store(IBV_QPS_RESET);
    s.qpn.store(0, std::memory_order_release);
    s.pid.store(0);
  }
  --q->pd->users;
  --q->scq->users;
  --q->rcq->users;
  p.qps.erase(std::find(p.qps.begin(), p.qps.end(), q));
  delete q;
  return 0;
}

// --- control calls ----------------------------------------------------------------

int mkfake_ib_is_fake(void) { return 1; }

int mkfake_ib_qps(uint32_t* qpns, int max) {
  Lock lock;
  const auto& qps = P().qps;
  for (int i = 0; i < max && i < int(qps.size()); ++i) qpns[i] = qps[size_t(i)]->qp.qp_num;
  return int(qps.size());
}

int mkfake_ib_qp_info(uint32_t qpn, mkfake_ib_qp* out) {
  Lock lock;
  if (!attach()) return -1;
  const Slot* s = slot_of(qpn);
  if (!s) return -1;
  *out = mkfake_ib_qp{};
  out->qpn = qpn;
  out->pid = s->pid.load();
  out->state = s->state.load();
  out->dest_qpn = s->dest_qpn.load();
  out->sq_psn = s->sq_psn.load();
  out->rq_psn = s->rq_psn.load();
  out->path_mtu = s->path_mtu;
  out->is_global = s->is_global;
  out->sgid_index = s->sgid_index;
  out->dlid = s->dlid;
  std::memcpy(out->dgid, s->dgid, 16);
  return 0;
}

static int each_qp(uint32_t qpn, void (*f)(Slot&, int), int arg) {
  Lock lock;
  if (!P().fab) return -1;
  if (qpn) {
    Slot* s = slot_of(qpn);
    if (!s) return -1;
    f(*s, arg);
    return 0;
  }
  for (Qp* q : P().qps) f(P().fab->slot[q->slot], arg);
  return 0;
}

int mkfake_ib_fail_next_send(uint32_t qpn, int status) {
  return each_qp(qpn, [](Slot& s, int st) { s.inject_status.store(st); }, status);
}

int mkfake_ib_set_qp_error(uint32_t qpn) {
  return each_qp(qpn, [](Slot& s, int) { s.state.store(IBV_QPS_ERR); }, 0);
}

void mkfake_ib_get_counts(mkfake_ib_counts* out) {
  Lock lock;
  Proc& p = P();
  out->contexts = int(p.ctxs.size());
  out->pds = int(p.pds.size());
  out->mrs = int(p.mrs.size());
  out->cqs = int(p.cqs.size());
  out->qps = int(p.qps.size());
}

}  // extern "C"
