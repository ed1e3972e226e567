// The p2p transport: peers in this process reach this rank's arena by its own
// address once their GPUs are granted access; peers in other processes import
// it from a POSIX fd (VMM shareable handle) passed over a local socket.
#include <fmt/format.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "runtime/bootstrap/bootstrap.hpp"
#include "runtime/bootstrap/crypto.hpp"
#include "runtime/driver/cuda_driver.hpp"
#include "runtime/memory/ipc.hpp"
#include "runtime/memory/memory.hpp"
#include "runtime/api/status.hpp"
#include "runtime/transport/transport.hpp"

namespace mk::rt {

void check_peer_access(CUdevice a, CUdevice b) {
  if (a == b) return;
  int can = 0;
  MK_CU(cu().cuDeviceCanAccessPeer(&can, a, b), "cuDeviceCanAccessPeer");
  if (!can)
    fail(mkSystemError, fmt::format("GPUs {} and {} cannot access each other's memory (no NVLink or PCIe peer "
                                    "access); mKernel's intra-node transport needs peer access",
                                    a, b));
}

namespace {
std::mutex& arenas_mutex() {
  static std::mutex m;
  return m;
}
std::map<CUdeviceptr, std::weak_ptr<Arena>>& arenas() {
  static auto* m = new std::map<CUdeviceptr, std::weak_ptr<Arena>>;
  return *m;
}
// A live arena of this process by base address, or null.
std::shared_ptr<Arena> find_arena(CUdeviceptr base) {
  std::lock_guard<std::mutex> lock(arenas_mutex());
  auto it = arenas().find(base);
  return it == arenas().end() ? nullptr : it->second.lock();
}
}  // namespace

void publish_arena(const std::shared_ptr<Arena>& a) {
  std::lock_guard<std::mutex> lock(arenas_mutex());
  for (auto it = arenas().begin(); it != arenas().end();)  // forget the dead ones
    it = it->second.expired() ? arenas().erase(it) : std::next(it);
  arenas()[a->base()] = a;
}

uint64_t process_token() {
  static std::mutex mu;
  static pid_t pid = 0;
  static uint64_t token = 0;
  std::lock_guard<std::mutex> lock(mu);
  if (pid != ::getpid()) {
    random_bytes(&token, sizeof token);
    pid = ::getpid();
  }
  return token;
}

namespace {

class P2pTransport final : public Transport {
 public:
  const char* name() const override { return "p2p"; }
  bool can_reach(const RankInfo& me, const RankInfo& peer) const override { return same_node(me, peer); }
  CUdeviceptr peer_base(int r) const override { return base_.at(size_t(r)); }
  int remote_peers() const override { return remote_; }

  void connect(const TransportSetup& s) override {
    const std::vector<RankInfo>& all = *s.all;
    const RankInfo& me = all[size_t(s.rank)];
    base_.assign(size_t(s.nranks), 0);
    std::vector<CUdevice> local_devices;
    for (int r = 0; r < s.nranks; ++r) {
      const RankInfo& p = all[size_t(r)];
      if (p.token == me.token) {
        base_[size_t(r)] = p.arena_base;
        if (r != s.rank) {
          // Held for as long as this rank addresses it (see publish_arena).
          std::shared_ptr<Arena> a = find_arena(CUdeviceptr(p.arena_base));
          if (!a || a->base() != CUdeviceptr(p.arena_base))
            fail(mkInvalidUsage, fmt::format("rank {}'s symmetric memory is gone (was it destroyed during init?)", r));
          local_.push_back(std::move(a));
        }
        if (p.device != me.device) {
          check_peer_access(s.cudev, CUdevice(p.device));
          local_devices.push_back(CUdevice(p.device));
        }
      } else if (same_node(p, me)) {
        ++remote_;
      }  // (a rank on another node: the network reaches it, base 0)
    }
    {
      CtxGuard g(s.ctx);
      s.arena->grant(local_devices);
    }
    if (remote_ == 0) return;
    if (!s.boot) fail(mkInternalError, "p2p: peers in other processes but no bootstrap");
    const IdContents& id = s.boot->id();
    const int fd = s.arena->export_fd();
    struct CloseFd {
      int fd;
      ~CloseFd() { ::close(fd); }
    } close_fd{fd};
    std::vector<pid_t> pids;  // only the job's ranks may fetch our arena
    for (const RankInfo& p : all) pids.push_back(pid_t(p.pid));
    // Every rank learns that every fd server is up before anyone waits for
    // one: a rank that cannot bind its name (squatted) fails the job on every
    // rank now, with its reason, instead of leaving its peers to time out.
    std::unique_ptr<FdServer> server;
    std::string failed;
    try {
      server = std::make_unique<FdServer>(ipc_socket_name(id.secret, id.nonce, s.rank), fd, remote_, s.timeout_ms,
                                          pids, id.secret);
    } catch (const std::exception& e) {
      failed = e.what();
    }
    const std::vector<std::string> up = s.boot->allgather(failed);
    for (int r = 0; r < s.nranks; ++r)
      if (!up[size_t(r)].empty())
        fail(r == s.rank ? mkSystemError : mkRemoteError, fmt::format("rank {}: {}", r, up[size_t(r)]));
    CtxGuard g(s.ctx);
    for (int r = 0; r < s.nranks; ++r) {
      if (all[size_t(r)].token == me.token || !same_node(all[size_t(r)], me)) continue;
      const int peer_fd =
          fetch_fd(ipc_socket_name(id.secret, id.nonce, r), s.timeout_ms, pid_t(all[size_t(r)].pid), id.secret);
      auto m = std::make_unique<PeerMapping>();
      m->map(peer_fd, all[size_t(r)].arena_size, s.cudev);
      base_[size_t(r)] = m->base();
      mappings_.push_back(std::move(m));
    }
    server->wait();
  }

 private:
  std::vector<CUdeviceptr> base_;
  std::vector<std::unique_ptr<PeerMapping>> mappings_;  // peers in other processes
  std::vector<std::shared_ptr<Arena>> local_;           // peers in this process
  int remote_ = 0;
};

}  // namespace

std::unique_ptr<Transport> make_p2p_transport() { return std::make_unique<P2pTransport>(); }

bool same_node(const RankInfo& a, const RankInfo& b) {
  return std::strncmp(a.host, b.host, sizeof a.host) == 0 && std::strncmp(a.boot_id, b.boot_id, sizeof a.boot_id) == 0;
}

std::vector<std::unique_ptr<Transport>> make_transports() {
  std::vector<std::unique_ptr<Transport>> t;
  t.push_back(make_p2p_transport());
  return t;
}

Reach choose_transports(const std::vector<std::unique_ptr<Transport>>& transports, const std::vector<RankInfo>& all,
                        int rank) {
  auto first = [&](int from, int to) {
    for (size_t k = 0; k < transports.size(); ++k)
      if (from == to || transports[k]->can_reach(all[size_t(from)], all[size_t(to)])) return int(k);
    return -1;
  };
  Reach out;
  out.by_peer.resize(all.size(), -1);
  for (int r = 0; r < int(all.size()); ++r) out.by_peer[size_t(r)] = first(rank, r);
  for (int r = 1; r < int(all.size()) && out.a < 0; ++r)
    if (first(0, r) < 0) {
      out.a = 0;
      out.b = r;
    }
  return out;
}

}  // namespace mk::rt
