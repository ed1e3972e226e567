// Integrity after the handshake: every message on a bootstrap connection
// (a rank to the rendezvous, a rank to another rank) is a frame
//
//   header  type u32, a i32, b i32, c i32, len u64, SHA-256 of the payload  (56 bytes)
//   tag     HMAC-SHA256(this direction's key, seq u64 || header), first 16 bytes
//   payload len bytes
//
// under the connection's own keys (auth.hpp: session_keys, from the secret
// and both sides' handshake challenges, one key per direction). `seq` counts
// the frames of one direction from 0 and is never sent: a frame that was
// altered, injected, replayed, dropped, reordered or moved from another
// connection fails its tag. The head (header and tag) is checked before its
// length is used, so a flipped length is an integrity failure rather than
// an allocation; the payload is checked against the header's digest before
// it is used. Integers are little-endian (the hosts of one job are).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/bootstrap/auth.hpp"

namespace mk::rt {

struct FrameHeader {
  uint32_t type = 0;
  int32_t a = 0, b = 0, c = 0;  // meaning per type
  uint64_t len = 0;
  uint8_t digest[32] = {};
};
static_assert(sizeof(FrameHeader) == 56, "FrameHeader is a wire format");

constexpr size_t kFrameTagBytes = 16;
constexpr size_t kFrameHeadBytes = sizeof(FrameHeader) + kFrameTagBytes;

// The MACs of one connection, one side's view: frames this side sends and
// receives, each direction with its key and sequence number.
class Link {
 public:
  Link() = default;
  explicit Link(const SessionKeys& keys) : keys_(keys) {}

  // A whole frame: head and payload.
  std::string seal(uint32_t type, int32_t a, int32_t b, int32_t c, std::string_view payload = {});
  // Only the head, for a payload sent from a buffer shared with other
  // connections (`digest`: its SHA-256).
  std::string seal_head(uint32_t type, int32_t a, int32_t b, int32_t c, uint64_t len, const Digest& digest);
  // Checks a received head (kFrameHeadBytes); false when its tag is wrong.
  // On success the next frame is expected.
  bool open_head(const void* head, FrameHeader* out);
  // Whether `payload` is what the (checked) header announced.
  static bool payload_ok(const FrameHeader& h, std::string_view payload);

 private:
  Digest tag(const Digest& key, uint64_t seq, const FrameHeader& h) const;
  SessionKeys keys_;
  uint64_t sent_ = 0, received_ = 0;
};

}  // namespace mk::rt
