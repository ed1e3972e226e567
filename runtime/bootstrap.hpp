// Bootstrap: how ranks find each other before any GPU memory is shared.
//
// mkGetUniqueId starts a small TCP rendezvous server in the calling process
// (the "root", usually rank 0's) and writes its address and a random nonce
// into the 128-byte id. Every rank connects, says who it is, and then uses
// the connection for all-gathers of small host blobs (device info, memory
// handles) during communicator setup. Address: 127.0.0.1 on an ephemeral port
// unless MK_BOOTSTRAP_ADDR=host:port (multi-node needs a routable address).
// Every wait is bounded (MK_BOOTSTRAP_TIMEOUT_MS, default 120000).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mk.h"

namespace mk::rt {

struct IdContents {
  uint32_t ipv4 = 0;  // network byte order
  uint16_t port = 0;  // network byte order
  uint8_t nonce[16] = {};
};

// Starts the rendezvous server and fills `id`.
void bootstrap_create_id(mkUniqueId* id);
// Decodes an id; throws mkInvalidArgument if it is not one of ours.
IdContents bootstrap_decode(const mkUniqueId& id);
std::string nonce_hex(const IdContents& c);

class Bootstrap {
 public:
  Bootstrap(const mkUniqueId& id, int nranks, int rank);
  ~Bootstrap();
  Bootstrap(const Bootstrap&) = delete;
  Bootstrap& operator=(const Bootstrap&) = delete;

  // Every rank contributes `mine`; returns all contributions in rank order.
  std::vector<std::string> allgather(const std::string& mine);
  void barrier() { allgather(std::string()); }
  // Makes a wait in allgather() on another thread fail now (abort).
  void interrupt();
  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  const IdContents& id() const { return id_; }

 private:
  IdContents id_;
  int nranks_, rank_;
  int fd_ = -1;
};

int bootstrap_timeout_ms();

}  // namespace mk::rt
