// The device side of the network (GPU-initiated networking, NCCL GIN's and
// MSCCL++ port channels' semantics): a kernel puts a tile into a peer's
// scratch on another node, or signals one of its flag words, by writing a
// 16-byte descriptor into the connection's trigger FIFO in host-pinned
// memory; the proxy thread (runtime/proxy/proxy.hpp) moves it over the
// network, and the peer's proxy writes the data, then the signal, into the
// peer's arena. The peer's kernel waits on that flag word like on any other.
//
// A connection is one thread block's path to one peer: its puts and signals
// arrive in the order they were posted. Each FIFO entry owns a staging area
// in host-pinned memory: a put copies its source there (so the source may be
// written again as soon as the copy is done: a flush has nothing to wait for
// beyond it) and then commits the descriptor. An entry is reused once the
// proxy reports it done (sent): `done` counts them.
//
// Counters are 64-bit and live across launches and graph replays (posted in
// device memory, done in host memory): they never wrap in practice.
//
// One thread per connection posts (the block's thread 0, after the block
// copied the data); compiled by the host too (the proxy's tests drive the
// real proxy with these functions from CPU threads).
#pragma once
#include "common.cuh"

#if !MK_DEVICE_CODE
#include <atomic>
#include <cstring>
#endif

namespace mk {
namespace dev {

enum NetKind : uint32_t {
  kNetPut = 1,     // arg: destination byte offset in the peer's arena; arg2: bytes
  kNetSignal = 2,  // arg: the value; arg2: the flag word's index in the peer's arena
};

// Bytes in front of each staging area that the proxy uses for the wire header.
constexpr uint64_t kNetHeaderBytes = 64;

// One trigger. `tag` is written last, after a system-wide fence: the proxy
// takes the entry once tag holds its kind, the connection's index and the
// entry's sequence number (so an old entry in the same place never looks new).
struct NetDesc {
  uint64_t arg;
  uint32_t arg2;
  uint32_t tag;
};
static_assert(sizeof(NetDesc) == 16, "a trigger is 16 bytes");

MK_HD uint32_t net_tag(uint32_t kind, uint32_t conn, uint64_t seq) {
  return (kind & 3u) | ((conn & 0xfffu) << 2) | (uint32_t((seq + 1) & 0x3ffffu) << 14);
}
MK_HD uint32_t net_tag_kind(uint32_t tag) { return tag & 3u; }

// What a kernel knows of one connection (device memory, filled by the host).
struct NetConnDev {
  NetDesc* fifo;                  // [entries], host-pinned, mapped into the GPU
  char* staging;                  // [entries] x stride, host-pinned, mapped
  const volatile uint64_t* done;  // entries the proxy finished (host-pinned)
  uint64_t* posted;               // entries posted (device memory)
  uint64_t stride;                // kNetHeaderBytes + the largest put
  uint32_t entries;               // a power of two
  uint32_t conn;                  // the connection's index (checked by the proxy)
};
static_assert(sizeof(NetConnDev) == 48, "NetConnDev is 48 bytes on host and device");

// What a kernel of a plan with network operations gets (Args::net, device
// memory): where its scratch and flag regions lie in the arena (byte
// offsets, equal on every rank: puts and signals name places on the peer by
// them), and its connections, one per (instance, block, peer): conns[(inst *
// tbs + tb) * nranks + peer], null where the plan has none.
struct NetTable {
  int64_t scratch_off;
  int64_t flag_off;
  // followed by const NetConnDev* conns[instances * tbs * nranks]
};
static_assert(sizeof(NetTable) == 16, "the connection pointers follow 16 bytes of header");
MK_HD uint64_t net_table_bytes(int64_t conns) { return 16 + 8 * uint64_t(conns < 1 ? 1 : conns); }
MK_HD const NetConnDev* const* net_conns(const NetTable* t) {
  return reinterpret_cast<const NetConnDev* const*>(reinterpret_cast<const char*>(t) + sizeof(NetTable));
}
MK_HD const NetConnDev** net_conns(NetTable* t) {
  return reinterpret_cast<const NetConnDev**>(reinterpret_cast<char*>(t) + sizeof(NetTable));
}

MK_HD void net_fence_system() {
#if MK_DEVICE_CODE
  __threadfence_system();
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

MK_HD uint64_t net_load(const volatile uint64_t* p) {
#if MK_DEVICE_CODE
  return *p;
#else
  return __atomic_load_n(const_cast<const uint64_t*>(p), __ATOMIC_ACQUIRE);
#endif
}

// Whether entry `seq` (the next to post) is free.
MK_HD bool net_free(const NetConnDev& c, uint64_t seq) { return seq - net_load(c.done) < c.entries; }

// The next entry's sequence number (the caller waits for net_free first).
MK_HD uint64_t net_next(const NetConnDev& c) { return *c.posted; }

// Where entry `seq` stages its data.
MK_HD char* net_data(const NetConnDev& c, uint64_t seq) {
  return c.staging + (seq & (c.entries - 1)) * c.stride + kNetHeaderBytes;
}

// Posts entry `seq` (its data, for a put, already in net_data).
MK_HD void net_commit(const NetConnDev& c, uint64_t seq, uint32_t kind, uint64_t arg, uint32_t arg2) {
  NetDesc* d = c.fifo + (seq & (c.entries - 1));
  d->arg = arg;
  d->arg2 = arg2;
  net_fence_system();  // the data and the body before the tag
#if MK_DEVICE_CODE
  *reinterpret_cast<volatile uint32_t*>(&d->tag) = net_tag(kind, c.conn, seq);
#else
  __atomic_store_n(&d->tag, net_tag(kind, c.conn, seq), __ATOMIC_RELEASE);
#endif
  *c.posted = seq + 1;
}

#if !MK_DEVICE_CODE
// A block's put and signal as its thread 0 would issue them, for CPU threads
// standing in for kernels (the proxy's tests, mk_net_bench proxy). `wait`
// spins on its predicate (true: it holds; false: give up, e.g. aborted).
template <class Wait>
bool net_host_put(const NetConnDev& c, const void* src, uint32_t bytes, uint64_t dst, Wait&& wait) {
  const uint64_t s = net_next(c);
  if (!wait([&] { return net_free(c, s); })) return false;
  std::memcpy(net_data(c, s), src, bytes);
  net_commit(c, s, kNetPut, dst, bytes);
  return true;
}
template <class Wait>
bool net_host_signal(const NetConnDev& c, uint32_t idx, uint64_t value, Wait&& wait) {
  const uint64_t s = net_next(c);
  if (!wait([&] { return net_free(c, s); })) return false;
  net_commit(c, s, kNetSignal, value, idx);
  return true;
}
#endif

}  // namespace dev
}  // namespace mk
