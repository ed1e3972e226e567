#include "runtime/bootstrap/frame.hpp"

#include <cstring>

namespace mk::rt {

Digest Link::tag(const Digest& key, uint64_t seq, const FrameHeader& h) const {
  return hmac_sha256(key.data(), key.size(),
                     {std::string_view(reinterpret_cast<const char*>(&seq), sizeof seq),
                      std::string_view(reinterpret_cast<const char*>(&h), sizeof h)});
}

std::string Link::seal_head(uint32_t type, int32_t a, int32_t b, int32_t c, uint64_t len, const Digest& digest) {
  FrameHeader h;
  h.type = type;
  h.a = a;
  h.b = b;
  h.c = c;
  h.len = len;
  std::memcpy(h.digest, digest.data(), sizeof h.digest);
  const Digest t = tag(keys_.send, sent_++, h);
  std::string out(reinterpret_cast<const char*>(&h), sizeof h);
  out.append(reinterpret_cast<const char*>(t.data()), kFrameTagBytes);
  return out;
}

std::string Link::seal(uint32_t type, int32_t a, int32_t b, int32_t c, std::string_view payload) {
  std::string out = seal_head(type, a, b, c, payload.size(), sha256(payload.data(), payload.size()));
  out.append(payload);
  return out;
}

bool Link::open_head(const void* head, FrameHeader* out) {
  FrameHeader h;
  std::memcpy(&h, head, sizeof h);
  const Digest t = tag(keys_.recv, received_, h);
  if (!equal_constant_time(t.data(), static_cast<const uint8_t*>(head) + sizeof h, kFrameTagBytes)) return false;
  ++received_;
  *out = h;
  return true;
}

bool Link::payload_ok(const FrameHeader& h, std::string_view payload) {
  if (payload.size() != h.len) return false;
  const Digest d = sha256(payload.data(), payload.size());
  return equal_constant_time(d.data(), h.digest, sizeof h.digest);
}

}  // namespace mk::rt
