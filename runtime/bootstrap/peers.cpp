#include "runtime/bootstrap/peers.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "runtime/api/status.hpp"
#include "runtime/bootstrap/bootstrap.hpp"
#include "runtime/bootstrap/protocol.hpp"

namespace mk::rt {

struct PeerMesh::Conn {
  // Opener's side: kConnecting -> kHandshake -> kWelcome -> kReady.
  // Listener's side: kServerHs -> kHello -> kReady (then in in_).
  enum class St { kConnecting, kHandshake, kWelcome, kReady, kServerHs, kHello, kDead };
  St st = St::kConnecting;
  bool opener = false;
  int peer = -1;  // opener: where to; listener: known from the hello
  NbConn io;
  std::optional<ClientHandshake> chs;
  std::optional<ServerHandshake> shs;
  Link link;
  bool body = false;  // reading a frame's payload; `head` is its checked head
  FrameHeader head;
  std::deque<Frame> frames;  // listener's side: checked messages not yet taken (at most one)
  struct Msg {
    uint32_t type;
    int32_t a, b, c;
    std::shared_ptr<const std::string> payload;
    Digest digest;
  };
  std::deque<Msg> queued;  // opener's side: posted before the handshake ended
  std::deque<Msg> unwelcomed;  // opener's side: sent after its hello, before the welcome came (sent again
                               // on a new connection if the listener closed this one first)
  Clock::time_point deadline;   // listener's side: until the hello
  Clock::time_point retry_at;   // opener's side: connect again then (io.fd < 0)
  int attempt = 0;
  std::string lost;  // why it is kDead

  ~Conn() {
    if (io.fd >= 0) ::close(io.fd);
  }
  bool busy() const { return !io.out.empty() || !queued.empty() || (st != St::kReady && !unwelcomed.empty()); }
  void kill(const std::string& why) {
    if (io.fd >= 0) ::close(io.fd);
    io.fd = -1;
    st = St::kDead;
    lost = why;
  }
};

namespace {

std::string errno_text(int e) { return std::strerror(e); }

}  // namespace

PeerMesh::PeerMesh(const IdContents& id, int nranks, int rank, int listen_fd, std::vector<SockAddr> table,
                   int root_fd, std::function<void()> root_readable, std::function<bool()> cancelled)
    : secret_(id.secret), nranks_(nranks), rank_(rank), listen_fd_(listen_fd), root_fd_(root_fd),
      table_(std::move(table)), root_readable_(std::move(root_readable)), cancelled_(std::move(cancelled)),
      handshake_ms_(handshake_timeout_ms(bootstrap_timeout_ms())) {
  std::memcpy(nonce_, id.nonce, sizeof nonce_);
  set_nonblocking(listen_fd_);
}

PeerMesh::~PeerMesh() {
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (dropped_ > 0)
    debug_log("bootstrap: rank " + std::to_string(rank_) + " dropped " + std::to_string(dropped_) +
              " connection(s) to its peer listener that did not authenticate");
}

uint64_t PeerMesh::max_len(const FrameHeader& h) const {
  switch (h.type) {
    case proto::kGather:
      // b parts, each at most kMaxBlobBytes with its 8-byte length, all
      // together within one all-gather's limit
      if (h.b < 1 || h.b > nranks_) return 0;
      return std::min(uint64_t(h.b) * (8 + kMaxBlobBytes), kMaxRoundBytes + 8 * uint64_t(h.b));
    case proto::kSend:
    case proto::kRecover: return kMaxBlobBytes;
    default: return 0;
  }
}

PeerMesh::Conn& PeerMesh::out_conn(int peer) {
  auto& slot = out_[peer];
  if (!slot) {
    slot = std::make_unique<Conn>();
    slot->opener = true;
    slot->peer = peer;
    start_connect(*slot);
  }
  return *slot;
}

// Messages to `peer` go over the connection this rank opened to it; where
// there is none but `peer` opened one to this rank, they go back over that
// one (a leader answering its group, say: one connection instead of two).
// Either way all messages to a peer take one connection, so they stay in
// order: once this rank has answered over the peer's connection it opens
// none of its own while that one lives.
PeerMesh::Conn& PeerMesh::channel_to(int peer) {
  if (auto it = out_.find(peer); it != out_.end()) return *it->second;
  if (auto it = in_.find(peer); it != in_.end() && it->second->st == Conn::St::kReady) return *it->second;
  return out_conn(peer);
}

// A message from `peer` that arrived (over either connection), or null;
// *lost: a connection with it closed, so nothing more comes.
PeerMesh::Conn* PeerMesh::arrived(int peer, bool* lost) {
  *lost = false;
  Conn* dead = nullptr;
  for (auto* m : {&in_, &out_}) {
    auto it = m->find(peer);
    if (it == m->end()) continue;
    if (!it->second->frames.empty()) return it->second.get();
    if (it->second->st == Conn::St::kDead) dead = it->second.get();
  }
  *lost = dead != nullptr;
  return dead;
}

void PeerMesh::start_connect(Conn& c) {
  const SockAddr& a = table_[size_t(c.peer)];
  int fd = ::socket(a.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) throw Error(Error::kLost, c.peer, "socket(): " + errno_text(errno));
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  c.io = NbConn{};
  c.io.fd = fd;
  c.st = Conn::St::kConnecting;
  c.body = false;
  if (::connect(fd, a.sa(), a.len()) != 0 && errno != EINPROGRESS && errno != EINTR) {
    const int e = errno;
    c.kill("cannot connect to its listener at " + a.text() + ": " + errno_text(e));
    throw Error(Error::kLost, c.peer, c.lost);
  }
}

void PeerMesh::post(int peer, uint32_t type, int32_t a, int32_t b, int32_t c, std::string payload) {
  const Digest d = sha256(payload.data(), payload.size());
  post(peer, type, a, b, c, std::make_shared<const std::string>(std::move(payload)), d);
}

void PeerMesh::post(int peer, uint32_t type, int32_t a, int32_t b, int32_t c,
                    std::shared_ptr<const std::string> payload, const Digest& digest) {
  Conn& k = channel_to(peer);
  if (k.st == Conn::St::kDead) throw Error(Error::kLost, peer, k.lost);
  k.queued.push_back({type, a, b, c, std::move(payload), digest});
  if (k.st == Conn::St::kReady || k.st == Conn::St::kWelcome) {
    release_queued(k);
    on_writable(k);
  }
}

// Seals and sends what was posted. Messages follow the opener's hello at
// once, without waiting for the welcome (a round trip less on every new
// connection); until the welcome they are kept, to be sent again if the
// listener closes the connection first (it read none of them then: it
// evicts only connections that have not said who they are).
void PeerMesh::release_queued(Conn& c) {
  for (Conn::Msg& m : c.queued) {
    c.io.send(c.link.seal_head(m.type, m.a, m.b, m.c, m.payload->size(), m.digest));
    if (!m.payload->empty()) c.io.out.push_back(m.payload);
    if (c.st == Conn::St::kWelcome) c.unwelcomed.push_back(std::move(m));
  }
  c.queued.clear();
}

PeerMesh::Frame PeerMesh::next(int peer, const Clock::time_point& deadline) {
  return std::move(next_each({peer}, deadline)[0]);
}

std::vector<PeerMesh::Frame> PeerMesh::next_each(const std::vector<int>& peers, const Clock::time_point& deadline) {
  bool lost = false;
  auto ready = [&] {
    for (int peer : peers)
      if (!arrived(peer, &lost)) return false;
    return true;
  };
  pump(ready, deadline, peers);
  std::vector<Frame> out;
  for (int peer : peers) {
    Conn& c = *arrived(peer, &lost);
    if (c.frames.empty()) throw Error(Error::kLost, peer, c.lost);
    out.push_back(std::move(c.frames.front()));
    c.frames.pop_front();
  }
  return out;
}

void PeerMesh::flush(const Clock::time_point& deadline) {
  auto done = [&] {
    for (auto* m : {&out_, &in_})
      for (auto& [peer, c] : *m) {
        if (c->st == Conn::St::kDead && c->busy()) throw Error(Error::kLost, peer, c->lost);
        if (c->st != Conn::St::kDead && c->busy()) return false;
      }
    return true;
  };
  pump(done, deadline, {});
}

void PeerMesh::pump(const std::function<bool()>& done, const Clock::time_point& deadline,
                    const std::vector<int>& awaited) {
  std::vector<pollfd> fds;
  std::vector<Conn*> who;
  for (;;) {
    if (done()) return;
    if (root_fd_ < 0 && cancelled_()) root_readable_();  // throws: nothing else would wake us
    const auto now = Clock::now();
    if (now >= deadline) {
      for (int peer : awaited) {
        auto it = in_.find(peer);
        if (it == in_.end() || it->second->frames.empty()) throw Error(Error::kTimeout, peer, "timed out");
      }
      for (auto* m : {&out_, &in_})
        for (auto& [peer, c] : *m)
          if (c->busy()) throw Error(Error::kTimeout, peer, "timed out sending");
      throw Error(Error::kTimeout, -1, "timed out");
    }
    fds.clear();
    who.clear();
    fds.push_back({root_fd_, POLLIN, 0});  // fd -1: ignored by poll
    const bool listening = now >= listen_pause_until_;
    fds.push_back({listening ? listen_fd_ : -1, POLLIN, 0});
    Clock::time_point wake = listening ? deadline : std::min(deadline, listen_pause_until_);
    auto add = [&](Conn& c) {
      if (c.st == Conn::St::kDead) return;
      if (c.io.fd < 0) {  // waiting to connect again
        wake = std::min(wake, c.retry_at);
        return;
      }
      short ev = 0;
      if (c.st == Conn::St::kConnecting || !c.io.out.empty()) ev |= POLLOUT;
      // Handshakes are read as they come. After them a connection reads one
      // message ahead at most: from a peer awaited, and while this rank's
      // own sends are stuck (two ranks sending each other more than a socket
      // holds must take each other's message to finish); else only to see
      // the peer close while this rank has messages for it.
      const bool reading = c.st != Conn::St::kReady ||
                           (c.frames.empty() && (c.busy() || awaited.empty() ||
                                                 std::find(awaited.begin(), awaited.end(), c.peer) != awaited.end()));
      if (c.st != Conn::St::kConnecting && reading) ev |= POLLIN;
      if (ev == 0) return;  // a hang-up would wake poll at once: look again once its message was taken
      fds.push_back({c.io.fd, ev, 0});
      who.push_back(&c);
      if (c.st == Conn::St::kServerHs || c.st == Conn::St::kHello) wake = std::min(wake, c.deadline);
    };
    for (auto& [p, c] : out_) add(*c);
    for (auto& [p, c] : in_) add(*c);
    for (auto& c : pending_) add(*c);
    if (root_fd_ < 0) wake = std::min(wake, now + std::chrono::milliseconds(100));  // to see an abort
    const int r = ::poll(fds.data(), nfds_t(fds.size()), std::max(1, ms_left(wake)));
    if (r < 0 && errno != EINTR) throw Error(Error::kLost, -1, "poll: " + errno_text(errno));
    if (r > 0) {
      if (fds[0].revents) root_readable_();  // throws, or returns when the call may go on
      if (fds[1].revents & POLLIN) accept_new();
      for (size_t k = 0; k < who.size(); ++k)
        if (fds[k + 2].revents && who[k]->st != Conn::St::kDead) service(*who[k], fds[k + 2].revents);
    }
    const auto after = Clock::now();
    for (auto& [p, c] : out_)
      if (c->st == Conn::St::kConnecting && c->io.fd < 0 && after >= c->retry_at) start_connect(*c);
    for (auto& c : pending_)
      if (c && c->st != Conn::St::kDead && after >= c->deadline) drop_pending(*c, "did not authenticate in time");
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                  [](const std::unique_ptr<Conn>& c) { return !c || c->st == Conn::St::kDead; }),
                   pending_.end());
  }
}

void PeerMesh::service(Conn& c, short revents) {
  if (c.st == Conn::St::kConnecting) {
    int err = 0;
    socklen_t len = sizeof err;
    if (::getsockopt(c.io.fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err == EINPROGRESS || err == EALREADY || (err == 0 && !(revents & (POLLOUT | POLLERR | POLLHUP)))) return;
    if (err != 0) {
      c.kill("cannot connect to its listener at " + table_[size_t(c.peer)].text() + ": " + errno_text(err) +
             (err == ECONNREFUSED ? " (the rank has left?)" : ""));
      throw Error(Error::kLost, c.peer, c.lost);
    }
    c.chs.emplace(secret_, Channel::kPeer);
    c.io.send(c.chs->hello());
    c.io.expect(kServerReplyBytes);
    c.st = Conn::St::kHandshake;
    on_writable(c);
    return;
  }
  if (revents & (POLLIN | POLLHUP | POLLERR)) on_readable(c, (revents & (POLLHUP | POLLERR)) != 0);
  if (c.st != Conn::St::kDead && (revents & POLLOUT)) on_writable(c);
}

void PeerMesh::on_writable(Conn& c) {
  if (c.st == Conn::St::kDead || c.io.fd < 0) return;
  std::string why;
  if (c.io.flush(&why)) return;
  if (c.opener && (c.st == Conn::St::kHandshake || c.st == Conn::St::kWelcome)) return on_handshake_closed(c, why);
  if (!c.opener && c.st != Conn::St::kReady) return drop_pending(c, why);
  c.kill("its connection failed: " + why + " (the rank has left?)");
  if (c.opener) throw Error(Error::kLost, c.peer, c.lost);
}

// The listener closed our connection before it welcomed us: under a flood of
// connections that do not know the secret it evicts the oldest pending ones,
// ours too if its proof had not arrived yet. Connect again (a listener that
// is gone refuses, and we fail then).
void PeerMesh::on_handshake_closed(Conn& c, const std::string& why) {
  c.queued.insert(c.queued.begin(), std::make_move_iterator(c.unwelcomed.begin()),
                  std::make_move_iterator(c.unwelcomed.end()));
  c.unwelcomed.clear();
  if (c.io.fd >= 0) ::close(c.io.fd);
  c.io.fd = -1;
  c.st = Conn::St::kConnecting;
  ++c.attempt;
  c.retry_at = Clock::now() + std::chrono::milliseconds(std::min(c.attempt, 20));
  if (debug_enabled() && (c.attempt == 1 || c.attempt % 100 == 0))
    debug_log("bootstrap: rank " + std::to_string(rank_) + ": rank " + std::to_string(c.peer) +
              "'s listener closed our connection before it welcomed us (" + why + "), attempt " +
              std::to_string(c.attempt) + "; connecting again");
}

void PeerMesh::on_readable(Conn& c, bool hangup) {
  std::string why;
  if (c.st == Conn::St::kReady) {
    // A message not taken yet: read no further (the kernel's buffers push
    // back on the sender), unless the connection broke: then nothing more
    // comes, and what it holds is read now.
    if (!c.frames.empty() && !hangup) return;
    read_frames(c, /*all=*/hangup);
    if (c.st == Conn::St::kDead && c.busy()) throw Error(Error::kLost, c.peer, c.lost);  // messages to it cannot arrive
    return;
  }
  if (!c.io.read_some(&why)) {
    if (c.opener) return on_handshake_closed(c, why);
    return drop_pending(c, why);
  }
  if (!c.io.complete()) return;
  const auto* bytes = reinterpret_cast<const uint8_t*>(c.io.in.data());
  switch (c.st) {
    case Conn::St::kHandshake: {
      std::string answer = c.chs->feed(bytes);
      if (c.chs->failed())
        throw Error(Error::kProtocol, c.peer,
                    "whoever listens at " + table_[size_t(c.peer)].text() +
                        ", its announced address, could not prove it knows the unique id's secret");
      c.link = Link(c.chs->keys());
      c.io.send(std::move(answer));
      c.io.send(c.link.seal(proto::kPeerHello, rank_, nranks_, 0,
                            std::string_view(reinterpret_cast<const char*>(nonce_), sizeof nonce_)));
      c.io.expect(kFrameHeadBytes);
      c.st = Conn::St::kWelcome;
      release_queued(c);
      return on_writable(c);
    }
    case Conn::St::kWelcome: {
      FrameHeader h;
      if (!c.link.open_head(bytes, &h)) throw Error(Error::kIntegrity, c.peer, "its welcome");
      if (h.type != proto::kPeerWelcome || h.len != 0)
        throw Error(Error::kProtocol, c.peer, "it answered our hello with message type " + std::to_string(h.type));
      c.st = Conn::St::kReady;
      c.attempt = 0;
      c.unwelcomed.clear();
      c.io.expect(kFrameHeadBytes);  // answers may follow (channel_to)
      release_queued(c);
      return on_writable(c);
    }
    case Conn::St::kServerHs: {
      std::string reply = c.shs->feed(bytes);
      if (c.shs->failed()) return drop_pending(c, "failed the secret challenge");
      if (!reply.empty()) c.io.send(std::move(reply));
      if (c.shs->done()) {
        c.link = Link(c.shs->keys());
        c.st = Conn::St::kHello;
        c.io.expect(kFrameHeadBytes);
      } else {
        c.io.expect(c.shs->want());
      }
      return on_writable(c);
    }
    case Conn::St::kHello: {
      if (!c.body) {
        // The hello of a connection that proved the secret: a head that
        // fails its tag is an altered stream, not a rank to trust.
        if (!c.link.open_head(bytes, &c.head)) return drop_pending(c, "sent a hello that failed its integrity check");
        if (c.head.type != proto::kPeerHello || c.head.len != sizeof nonce_)
          return drop_pending(c, "sent a malformed hello");
        c.body = true;
        c.io.expect(sizeof nonce_);
        return;
      }
      c.body = false;
      const int from = c.head.a;
      if (!Link::payload_ok(c.head, c.io.in) || std::memcmp(c.io.in.data(), nonce_, sizeof nonce_) != 0 ||
          c.head.b != nranks_ || from < 0 || from >= nranks_ || from == rank_)
        return drop_pending(c, "sent a hello for another job or rank");
      auto& slot = in_[from];
      if (slot && slot->st != Conn::St::kDead) return drop_pending(c, "says it is rank " + std::to_string(from) +
                                                                   ", which is connected already");
      c.peer = from;
      c.st = Conn::St::kReady;
      c.io.send(c.link.seal(proto::kPeerWelcome, 0, 0, 0));
      c.io.expect(kFrameHeadBytes);
      for (auto& p : pending_)
        if (p.get() == &c) slot = std::move(p);  // leaves a null in pending_, erased by pump()
      return on_writable(*slot);
    }
    default: return;
  }
}

// A rank's messages on a connection (either side, after the handshake):
// head (checked before its length is used) then payload (checked against
// the head's digest), one message ahead of the caller at most.
void PeerMesh::read_frames(Conn& c, bool all) {
  std::string why;
  while (all || c.frames.empty()) {
    if (!c.io.read_some(&why)) {
      c.kill(why == "connection closed" ? "it closed its connection" : "its connection failed: " + why);
      return;
    }
    if (!c.io.complete()) return;
    if (!c.body) {
      if (!c.link.open_head(c.io.in.data(), &c.head)) throw Error(Error::kIntegrity, c.peer, "a message's head");
      const uint64_t limit = max_len(c.head);
      if (limit == 0 && (c.head.type != proto::kGather && c.head.type != proto::kSend && c.head.type != proto::kRecover))
        throw Error(Error::kProtocol, c.peer, "it sent message type " + std::to_string(c.head.type));
      if (c.head.len > limit)
        throw Error(Error::kProtocol, c.peer,
                    "it announced a " + std::to_string(c.head.len) + "-byte message, over the limit of " +
                        std::to_string(limit) + " bytes for it");
      c.body = true;
      c.io.expect(c.head.len);  // (none: complete at once)
      c.io.in.reserve(c.head.len);  // checked and bounded above
      if (c.head.len > 0) continue;
    }
    c.body = false;
    if (!Link::payload_ok(c.head, c.io.in)) throw Error(Error::kIntegrity, c.peer, "a message's payload");
    c.frames.push_back({c.head, std::move(c.io.in)});
    c.io.expect(kFrameHeadBytes);
  }
}

void PeerMesh::drop_pending(Conn& c, const std::string& why) {
  ++dropped_;
  if (debug_enabled() && dropped_ <= 10)
    debug_log("bootstrap: rank " + std::to_string(rank_) + ": dropped a connection to its peer listener that " + why);
  c.kill(why);
}

// Accepts what is waiting; when kMaxPendingPeers connections have not said
// who they are, the oldest goes (those that have not sent their challenge
// first): a flood costs the real peers a reconnect, not a deadline.
void PeerMesh::accept_new() {
  for (int k = 0; k < kMaxPendingPeers / 4; ++k) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      // Out of descriptors or memory: do not spin on a backlog we cannot take
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
        listen_pause_until_ = Clock::now() + std::chrono::milliseconds(20);
      return;
    }
    // Only connections still in the handshake count and go: one that proved
    // the secret (waiting for its hello) is a rank's, never evicted (a
    // group's leader takes up to 63 members and its Bruck partners at once).
    size_t live = 0;
    for (auto& p : pending_) live += p && p->st == Conn::St::kServerHs;
    if (live >= size_t(kMaxPendingPeers)) {
      Conn* victim = nullptr;
      for (auto& p : pending_)
        if (p && p->st == Conn::St::kServerHs && p->shs->want() == kClientHelloBytes && !victim) victim = p.get();
      for (auto& p : pending_)
        if (p && p->st == Conn::St::kServerHs && !victim) victim = p.get();
      if (victim) drop_pending(*victim, "was evicted: too many connections had not authenticated");
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    auto c = std::make_unique<Conn>();
    c->io.fd = fd;
    c->st = Conn::St::kServerHs;
    c->shs.emplace(secret_, Channel::kPeer);
    c->io.expect(c->shs->want());
    c->deadline = Clock::now() + std::chrono::milliseconds(handshake_ms_);
    Conn& q = *c;
    pending_.push_back(std::move(c));
    on_readable(q, false);  // a real peer's challenge comes with its connect
  }
}

}  // namespace mk::rt
