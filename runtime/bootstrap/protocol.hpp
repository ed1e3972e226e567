// The bootstrap's messages after the handshake (each one a frame:
// frame.hpp), to the rendezvous and between ranks. Internal to
// runtime/bootstrap/; tests speak it to play a misbehaving rank.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/bootstrap/address.hpp"

namespace mk::rt::proto {

enum Type : uint32_t {
  // A rank and the rendezvous (root).
  kHello = 1,   // rank -> root: HelloBody
  kStatus = 2,  // root -> rank: a = Status; kJoined: b = 1 when all-gathers relay, payload one WireAddr per rank
  kBlob = 3,    // rank -> root (relay): this rank's part of an all-gather
  kRound = 4,   // root -> rank (relay): every part, u64 length and bytes each, in rank order
  kAbort = 5,   // rank -> root: this rank aborted; c = the all-gathers it completed
  kBye = 6,     // rank -> root: this rank destroys its bootstrap; c = the all-gathers it completed
  kFault = 7,   // rank -> root: a message from rank a (-1: the root) failed; b = Gone cause; c = completed
  kGone = 8,    // root -> rank: rank a left or broke the job, b = Gone cause, c = the all-gathers it
                // completed (-1: unknown); payload int32: the rank that saw a bad message (-1: the root)
  // Two ranks: the connection's opener ("client") sends, the listener's side receives.
  kPeerHello = 16,    // client -> listener: a = its rank, b = nranks, payload the id's nonce
  kPeerWelcome = 17,  // listener -> client: accepted
  kGather = 18,       // a = step, b = how many parts: u64 length and bytes each
  kSend = 19,         // Bootstrap::send's bytes
  kRecover = 20,      // Bootstrap::send_recovery's bytes (mkCommShrink)
};

enum Status : int32_t { kJoined = 0, kMismatch = -1, kDuplicate = -2, kOutOfRange = -3, kRelayMismatch = -4, kCorrupted = -5 };
enum Gone : int32_t { kGoneDropped = 0, kGoneClosed = 1, kGoneAborted = 2, kGoneIntegrity = 3 };

constexpr uint32_t kHelloMagic = 0x4d4b4845;  // "MKHE"
constexpr uint32_t kHelloRelay = 1;           // HelloBody::flags: MK_BOOTSTRAP_RELAY=1

struct HelloBody {
  uint32_t magic = kHelloMagic;
  int32_t nranks = 0;
  int32_t rank = 0;
  uint32_t flags = 0;
  uint8_t nonce[16] = {};
  WireAddr listener;  // where this rank's peers connect
};
static_assert(sizeof(HelloBody) == 56, "HelloBody is a wire format");

inline std::string_view bytes_of(const void* p, size_t n) { return std::string_view(static_cast<const char*>(p), n); }

// The parts of an all-gather as one buffer (kRound, kGather): u64 length and
// bytes each.
void append_parts(std::string* out, const std::vector<std::string>& parts);
// Appends `count` parts read from `buf` to *into; every length is bounded
// before use, `bytes` counts the all-gather's bytes against kMaxRoundBytes,
// and nothing may be left over. "" or what is wrong.
std::string parse_parts(const std::string& buf, int count, std::vector<std::string>* into, uint64_t* bytes);

}  // namespace mk::rt::proto
