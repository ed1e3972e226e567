// The kernel ABI: what the runtime passes to every generated kernel and what a
// kernel reports back. Compiled by the host (runtime/) and by NVRTC; keep
// fixed-width fields and explicit padding so both see one layout.
#pragma once
#include "common.cuh"

namespace mk {
namespace dev {

enum ErrorCode : int32_t {
  kErrNone = 0,
  kErrWaitTimeout = 1,  // a flag wait ran past the timeout
  kErrLLTimeout = 2,    // an LL packet never arrived
  kErrStopped = 3,      // gave up because another block, rank or the host aborted
  kErrZcMismatch = 4,   // zero-copy: a peer's call does not match this one (slot: what, see ZcWhat)
  kErrOnePassSteps = 5, // a one-pass kernel was launched for a size that needs more steps (have: the steps)
  kErrNoConn = 6,       // a put or signal to a rank on another node has no network connection (peer: that rank)
};

// ErrorRecord::slot of a kErrStopped record written at kernel entry: the
// communicator's abort word was already set, so the kernel did nothing.
constexpr int32_t kStoppedAtEntry = -3;
// ErrorRecord::slot of a kErrWaitTimeout in a fused kernel's tail barrier
// (templates/fused.cuh): a block of this rank never finished its ops (have:
// the blocks that arrived, want: the grid).
constexpr int32_t kTailBarrierSlot = -4;
// ErrorRecord::slot of a kErrWaitTimeout in a group kernel's chain barrier
// (kernel.cuh chain_barrier): a block of this rank never finished the
// collective before the next one on the same blocks (have: the blocks that
// arrived, want: the collective's grid).
constexpr int32_t kChainBarrierSlot = -5;
// ErrorRecord::slot of a kErrWaitTimeout while a put or signal to another
// node waited for a free trigger FIFO entry (templates/net.cuh): the
// proxy sent nothing for that long (peer: the rank on the other node).
constexpr int32_t kNetFifoSlot = -6;

// Zero-copy mismatches (ErrorRecord::slot).
enum ZcWhat : int32_t {
  kZcCount = 1,   // the peer's count differs (have: the peer's, want: ours)
  kZcWindow = 2,  // the peer named a registered window this rank does not know
  kZcBounds = 3,  // the peer's buffer runs past the end of its registered window
  kZcCall = 4,    // the peer's call differs (collective, dtype, op or root; have/want: signatures)
};

// A registered window as one rank sees it on one peer: where it is mapped
// here, and its size. The runtime keeps a table [window][nranks] per rank.
struct ZcPeerWindow {
  char* base;     // null: not registered on that peer
  int64_t bytes;
};

// One per thread block and launch slot (instance * tbs + tb); written once by
// the block that fails, `code` last.
struct ErrorRecord {
  int32_t code;
  int32_t rank;
  int32_t instance;
  int32_t tb;
  int32_t slot;   // flag slot (wait) or scratch slot (LL)
  int32_t peer;   // the rank expected to signal / send
  int32_t op;     // op id in the plan's IR (`mkc show` lists them)
  int32_t pad;
  int64_t step;   // step within the launch
  uint64_t have;  // flag value seen
  uint64_t want;  // flag value needed
  uint64_t waited_ns;
};

struct Args {
  const void* input;
  void* output;
  int64_t count;       // elements per rank (the collective's count)
  int64_t tile_bytes;  // this launch's tile: a multiple of 16, at most the plan's maximum
  int32_t rank;
  int32_t root;   // rooted collectives; 0 otherwise
  char* const* scratch;     // [nranks] this plan's scratch region on every rank
  uint64_t* const* flags;   // [nranks] this plan's flag region on every rank
  uint64_t* seq;            // [instances * tbs] this rank's per-block step counters
  ErrorRecord* errors;      // [instances * tbs] (host-mapped)
  // Host-mapped words of this rank (runtime HostFlags): [0] set by mkCommAbort
  // (read in every bounded wait), [1] set by a kernel that wrote an error
  // record (the host's cheap sticky-error check). May be null.
  volatile int32_t* host_abort;
  uint64_t timeout_ns;      // 0: never time out
  // Zero-copy plans only: this rank's buffers as (registered window, offset);
  // window -1: no buffer (a rooted collective's unused side). Peers learn
  // them at kernel entry and map them through their own `windows` table.
  const ZcPeerWindow* windows;  // [max_windows][nranks]
  int32_t max_windows;
  int32_t in_window;
  int32_t out_window;
  int32_t pad_;
  int64_t in_offset;
  int64_t out_offset;
  int64_t in_bytes;   // bytes of input / output the collective touches on every rank
  int64_t out_bytes;
  uint64_t call_sig;  // collective, dtype, op and root of this call: must match on every rank
  // Byte offset of this plan's flag region from the start of the arena's
  // flags on every rank; the arena's first word there is the communicator's
  // abort word (any rank or the host sets it; every kernel of the
  // communicator checks it at entry and in every bounded wait).
  int64_t flag_offset;
  // PreMulSum kernels only (reduce.cuh kRedPreMulSum): this rank's scalar,
  // read at kernel entry from `prescale_ptr` (device memory, the op's
  // dtype) when that is set, else the low bytes of `prescale` (the value in
  // the op's dtype, as NCCL's ncclScalarHostImmediate copies it).
  uint64_t prescale;
  const void* prescale_ptr;
  // Fused kernels only (templates/fused.cuh): the fusion's operands (device
  // pointers, in the order the fusion declares them), its scalars, and the
  // row length the output is cut into (the last row may be shorter);
  // epi_mode 0: the kernel's tail runs the epilogue, 1: the kernel skips it
  // and the runtime launches the plan's epilogue kernel (<name>_epi) next.
  const void* epi_ops[6];
  double epi_scalars[4];
  int64_t epi_row;
  int64_t epi_mode;
  // Plans with network operations only (templates/net.cuh NetTable): this
  // rank's connections to ranks on other nodes and where its scratch and
  // flags lie in its arena (the same offsets on every rank). Null otherwise.
  const void* net;
};

// A group kernel's argument (codegen group_source): one Args per member,
// in member order. `members` is N (read by tools that see only the bytes).
constexpr int kMaxGroupMembers = 32;
template <int N>
struct GroupArgs {
  int64_t members;
  int64_t pad_;
  Args a[N];
};
// Its size in bytes for n members (kernel parameters: at most 32764 bytes).
MK_HD constexpr size_t group_args_bytes(int n) { return 16 + size_t(n) * 280; }

// The host fills Args and the kernel reads it; both compile this file.
static_assert(sizeof(ErrorRecord) == 64, "ErrorRecord is 64 bytes on host and device");
static_assert(sizeof(ZcPeerWindow) == 16, "ZcPeerWindow is 16 bytes on host and device");
static_assert(sizeof(Args) == 280, "Args is 280 bytes on host and device (fixed-width fields, explicit padding)");
static_assert(sizeof(GroupArgs<3>) == group_args_bytes(3), "GroupArgs is a header and the members' Args");
static_assert(group_args_bytes(kMaxGroupMembers) <= 32764, "a group kernel's argument fits a kernel parameter");

// Flag region of one plan on one rank: [instance][slot] step values, then the
// tail word (fused kernels' grid barrier, templates/fused.cuh; the abort word
// is communicator-wide: Args::flag_offset).
MK_HD int64_t flag_words(int32_t instances, int32_t slots) { return int64_t(instances) * slots + 1; }

// Zero-copy: what rank q announced to this rank for a launch (templates/
// zero_copy.cuh). `epoch` is written last, with release semantics: the other
// fields describe that launch.
struct ZcMailbox {
  uint64_t epoch;
  uint64_t windows;  // in_window | out_window << 32 (each a uint32; -1: no buffer)
  int64_t in_offset;
  int64_t out_offset;
  int64_t count;
  uint64_t call_sig;
  uint64_t pad[2];
};
static_assert(sizeof(ZcMailbox) == 64, "a mailbox is 8 words");

// Zero-copy plans append, after the abort word, per rank: a mailbox per rank
// (what that rank announced for the current launch), an exit flag per rank,
// then this rank's launch epoch and a counter of finished blocks.
constexpr int64_t kZcBoxWords = int64_t(sizeof(ZcMailbox) / 8);
MK_HD int64_t zc_words(int32_t nranks) { return int64_t(nranks) * (kZcBoxWords + 1) + 2; }

}  // namespace dev
}  // namespace mk
