// Direct connections between the ranks of one bootstrap (bootstrap.hpp), so
// that all-gathers and point-to-point messages after the rendezvous never
// pass through the root.
//
// Every rank listens on its own TCP port (announced at the rendezvous). Rank
// i sends to rank j over a connection that i opened to j's listener, made on
// first use, or back over the one j opened to i when i has none to j (a
// leader answering its group): all messages from i to j take one
// connection, so they arrive in order, and no two ranks race to open "the"
// connection between them. A connection authenticates like the root's
// (auth.hpp, channel kPeer: a proof of the secret both ways), then the
// opener says which rank it is (with the id's nonce) and the listener
// welcomes it; the opener's messages follow its hello without waiting for
// the welcome (kept until it comes, and sent again on a new connection if
// the listener closed this one first). Every message is a frame with a MAC
// (frame.hpp), both ways. The listener keeps at most
// kMaxPendingPeers connections that have not said who they are, each for
// the handshake deadline; when full, the oldest goes (an opener whose
// connection closes before the welcome connects again). Reads are bounded
// before allocation (by message type) and, per sender, at most one message
// is read ahead of the caller: the kernel's buffers push back on the rest.
//
// One poll loop (pump) drives every connection, the listener and the
// rendezvous's socket while a caller waits, so handshakes in both directions
// progress together and no two ranks can wait on each other's handshake.
#pragma once

#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/bootstrap/address.hpp"
#include "runtime/bootstrap/frame.hpp"

namespace mk::rt {

struct IdContents;

constexpr int kMaxPendingPeers = 256;

class PeerMesh {
 public:
  struct Frame {
    FrameHeader h;
    std::string payload;
  };
  // A failure of a call below, naming the peer it concerns (-1: none).
  struct Error : std::exception {
    enum Kind { kLost, kIntegrity, kProtocol, kTimeout } kind;
    int peer;
    std::string why;
    Error(Kind k, int p, std::string w) : kind(k), peer(p), why(std::move(w)) {}
    const char* what() const noexcept override { return why.c_str(); }
  };

  // `listen_fd` (owned from now on) is this rank's listener; `table` every
  // rank's listener address. `root_readable` is called when `root_fd`
  // becomes readable while a call waits (it reads what the rendezvous said
  // and throws, or returns to let the call go on), and when `cancelled`
  // says so once the rendezvous's socket is gone (an abort shuts that
  // socket down, which wakes the wait while it is there).
  PeerMesh(const IdContents& id, int nranks, int rank, int listen_fd, std::vector<SockAddr> table, int root_fd,
           std::function<void()> root_readable, std::function<bool()> cancelled);
  ~PeerMesh();
  PeerMesh(const PeerMesh&) = delete;
  PeerMesh& operator=(const PeerMesh&) = delete;

  // Queues a message to `peer` (connecting first if needed) and writes what
  // the socket takes now. The shared form sends one buffer to several peers
  // (hashed once: `digest` is its SHA-256).
  void post(int peer, uint32_t type, int32_t a, int32_t b, int32_t c, std::string payload);
  void post(int peer, uint32_t type, int32_t a, int32_t b, int32_t c, std::shared_ptr<const std::string> payload,
            const Digest& digest);
  // Waits for the next message from `peer`. `deadline` is read on every
  // round of the loop: the caller may bring it closer meanwhile (from
  // root_readable).
  Frame next(int peer, const Clock::time_point& deadline);
  // The next message from each of `peers` (distinct), in their order, taken
  // as they come.
  std::vector<Frame> next_each(const std::vector<int>& peers, const Clock::time_point& deadline);
  // Waits until every message posted is with the kernel.
  void flush(const Clock::time_point& deadline);
  // The rendezvous's socket is no longer polled (it closed).
  void forget_root() { root_fd_ = -1; }

 private:
  struct Conn;
  // Drives every connection until done(); `awaited`: the peers whose
  // messages are read ahead (empty: all of them, while this rank's sends
  // drain).
  void pump(const std::function<bool()>& done, const Clock::time_point& deadline, const std::vector<int>& awaited);
  Conn& out_conn(int peer);
  Conn& channel_to(int peer);
  Conn* arrived(int peer, bool* lost);
  void start_connect(Conn& c);
  void service(Conn& c, short revents);
  void on_readable(Conn& c, bool hangup);
  void on_writable(Conn& c);
  void read_frames(Conn& c, bool all);
  void on_handshake_closed(Conn& c, const std::string& why);
  void accept_new();
  void drop_pending(Conn& c, const std::string& why);
  void release_queued(Conn& c);
  uint64_t max_len(const FrameHeader& h) const;

  const Secret secret_;
  uint8_t nonce_[16];
  const int nranks_, rank_;
  int listen_fd_, root_fd_;
  std::vector<SockAddr> table_;
  std::function<void()> root_readable_;
  std::function<bool()> cancelled_;
  const int handshake_ms_;
  std::unordered_map<int, std::unique_ptr<Conn>> out_, in_;
  std::vector<std::unique_ptr<Conn>> pending_;  // accepted, not yet identified; oldest first
  long dropped_ = 0;
  Clock::time_point listen_pause_until_;
};

}  // namespace mk::rt
