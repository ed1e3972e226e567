/*
 * mKernel C API: NCCL-shaped collectives that run as compiled, fused kernels.
 *
 * Migrating from NCCL is mechanical: nccl -> mk, ncclComm_t -> mkComm_t, same
 * arguments, same semantics (counts in elements, in-place when the buffers
 * alias as NCCL defines, stream-ordered, CUDA-graph capturable).
 *
 *   mkUniqueId id;
 *   if (rank == 0) mkGetUniqueId(&id);          // then share id (MPI, torchrun, ...)
 *   mkComm_t comm;
 *   mkCommInitRank(&comm, nranks, id, rank);    // after cudaSetDevice(local GPU)
 *   mkAllReduce(send, recv, count, mkBfloat16, mkSum, comm, stream);
 *   mkCommDestroy(comm);
 *
 * Every call returns mkSuccess or an error code; mkGetLastError(comm) says
 * what went wrong in words. Environment: MK_TIMEOUT_MS (watchdog, default
 * 60000; 0 disables), MK_PLAN_DIR (precompiled plans from `mkc compile`),
 * MK_CACHE_DIR (JIT cache), MK_PREBUILT_DIR (plans shipped with the library,
 * compiled by `mkc prebuild`), MK_SCRATCH_BYTES (symmetric scratch per
 * communicator), MK_ALGO (force schedules, e.g. "allreduce=allreduce.ring"),
 * MK_BOOTSTRAP_ADDR (host:port for the rendezvous), MK_DEBUG=1 (log to stderr).
 */
#ifndef MK_H_
#define MK_H_

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MK_MAJOR 0
#define MK_MINOR 1
#define MK_PATCH 0
#define MK_VERSION_CODE (MK_MAJOR * 10000 + MK_MINOR * 100 + MK_PATCH)

typedef struct mkComm* mkComm_t;

/* Communicator configuration: the same fields, order and rules as NCCL 2.28's
 * ncclConfig_t. Initialise with MK_CONFIG_INITIALIZER, then set fields; a
 * field left at MK_CONFIG_UNDEF_INT / NULL takes its default. Only the first
 * `size` bytes are read, so a struct from an older header works; the magic and
 * version are checked. NULL config: every default.
 *   blocking    1 (default): init and calls return when done; 0: init returns
 *               mkInProgress at once and completes in the background (poll
 *               mkCommGetAsyncError until it stops returning mkInProgress).
 *   maxCTAs     thread blocks per kernel at most: plans are compiled with
 *               fewer parallel instances to fit; a call whose plan cannot
 *               fit (one instance needs more) fails with mkInvalidUsage.
 *   cgaClusterSize, minCTAs, trafficClass, collnetEnable, CTAPolicy,
 *   shrinkShare, nvlsCTAs, nChannelsPerNetPeer, nvlinkCentricSched: checked
 *               for range and kept (minCTAs is a hint plans do not need).
 *   netName     NULL or a transport name ("p2p"); unknown names fail init.
 *   splitShare  1: children of mkCommSplit use part of this communicator's
 *               symmetric memory (the upper half of what is free at the
 *               split) instead of allocating their own; parent and children
 *               still run concurrently (their regions are disjoint).
 *   commName    copied and kept; at most 128 characters (a longer one
 *               fails init with mkInvalidArgument).
 *   schedules   NULL or schedule files, ':'-separated (.cpp DSL files, .so
 *               plugins, MSCCL .xml, MSCCL++ or mKernel IR .json), loaded
 *               next to MK_SCHEDULES's at init and proved for this
 *               communicator's rank count; MK_ALGO and MK_SELECT_FILE can
 *               then name them. Every rank must give the same files
 *               (docs/schedules.md). An mKernel field after NCCL's.
 *   spanNodes   what init does when the ranks sit on more than one node
 *               (host name plus boot id, or MK_HOST_ID) and mKernel cannot
 *               reach every peer (this build has no network transport):
 *               MK_SPAN_NODES_FAIL (default) fails init on every rank with
 *               mkInvalidUsage naming two ranks' hosts;
 *               MK_SPAN_NODES_BOOTSTRAP makes a bootstrap-only communicator:
 *               it answers mkCommCount, mkCommUserRank, mkCommCuDevice,
 *               mkCommNodeCount, mkCommBootstrapBroadcast, mkCommSplit
 *               (children on one node are full communicators), finalize,
 *               destroy and abort; collectives, registration, prewarm and
 *               PreMulSum ops fail with mkInvalidUsage. Every rank reaches
 *               the same answer from the facts all ranks exchanged, so the
 *               NCCL-compatible library can hand such a communicator to the
 *               real NCCL on every rank. Every rank must give the same
 *               value. Children of mkCommSplit inherit it. An mKernel field. */
#define MK_CONFIG_UNDEF_INT (-2147483647 - 1)
#define MK_CONFIG_UNDEF_PTR NULL
#define MK_SPLIT_NOCOLOR -1
#define MK_CONFIG_MAGIC 0xcafebeefu
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
  int trafficClass;
  const char* commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
  const char* schedules;
  int spanNodes;
} mkConfig_t;
#define MK_SPAN_NODES_FAIL 0
#define MK_SPAN_NODES_BOOTSTRAP 1
#define MK_CONFIG_INITIALIZER                                                                          \
  {                                                                                                    \
    sizeof(mkConfig_t), MK_CONFIG_MAGIC, MK_VERSION_CODE, MK_CONFIG_UNDEF_INT, MK_CONFIG_UNDEF_INT,    \
        MK_CONFIG_UNDEF_INT, MK_CONFIG_UNDEF_INT, MK_CONFIG_UNDEF_PTR, MK_CONFIG_UNDEF_INT,            \
        MK_CONFIG_UNDEF_INT, MK_CONFIG_UNDEF_PTR, MK_CONFIG_UNDEF_INT, MK_CONFIG_UNDEF_INT,            \
        MK_CONFIG_UNDEF_INT, MK_CONFIG_UNDEF_INT, MK_CONFIG_UNDEF_INT, MK_CONFIG_UNDEF_INT,            \
        MK_CONFIG_UNDEF_PTR, MK_CONFIG_UNDEF_INT                                                       \
  }

#define MK_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[MK_UNIQUE_ID_BYTES];
} mkUniqueId;

/* Values match ncclResult_t. */
typedef enum {
  mkSuccess = 0,
  mkUnhandledCudaError = 1,
  mkSystemError = 2,
  mkInternalError = 3,
  mkInvalidArgument = 4,
  mkInvalidUsage = 5,
  mkRemoteError = 6,
  mkInProgress = 7,
  mkNumResults = 8
} mkResult_t;

/* Values match ncclDataType_t. */
typedef enum {
  mkInt8 = 0,
  mkChar = 0,
  mkUint8 = 1,
  mkInt32 = 2,
  mkInt = 2,
  mkUint32 = 3,
  mkInt64 = 4,
  mkUint64 = 5,
  mkFloat16 = 6,
  mkHalf = 6,
  mkFloat32 = 7,
  mkFloat = 7,
  mkFloat64 = 8,
  mkDouble = 8,
  mkBfloat16 = 9,
  mkFloat8e4m3 = 10,
  mkFloat8e5m2 = 11,
  mkNumTypes = 12
} mkDataType_t;

/* Values match ncclRedOp_t. */
/* mkNumOps and above: PreMulSum handles (mkRedOpCreatePreMulSum). */
typedef enum { mkSum = 0, mkProd = 1, mkMax = 2, mkMin = 3, mkAvg = 4, mkNumOps = 5, mkMaxRedOp = 0x7fffffff } mkRedOp_t;

mkResult_t mkGetVersion(int* version);
const char* mkGetErrorString(mkResult_t result);
/* The last error of this communicator in words (comm may be NULL: the calling
 * thread's last error). Never NULL. */
const char* mkGetLastError(mkComm_t comm);

/* Communicators. */
mkResult_t mkGetUniqueId(mkUniqueId* uniqueId);
mkResult_t mkCommInitRank(mkComm_t* comm, int nranks, mkUniqueId commId, int rank);
/* mkCommInitRank with a configuration (NULL: defaults). With blocking = 0 it
 * returns mkInProgress and *comm at once; the communicator is usable once
 * mkCommGetAsyncError reports mkSuccess (an init error is reported there). */
mkResult_t mkCommInitRankConfig(mkComm_t* comm, int nranks, mkUniqueId commId, int rank,
                                const mkConfig_t* config);
/* Collective over `comm`: ranks passing the same color form a new
 * communicator, ranked by (key, rank in comm); MK_SPLIT_NOCOLOR gives NULL.
 * The child inherits comm's configuration; `config` (may be NULL) overrides
 * it. Nonblocking (blocking = 0): returns mkInProgress and *newcomm at once;
 * comm takes no calls and reports mkInProgress until the split is done; the
 * child reports its progress and errors through mkCommGetAsyncError. Ranks
 * of one process created by mkCommInitAll call it from their own threads, or
 * from one thread inside mkGroupStart/End (mkGroupEnd waits and returns the
 * split's error). Aborting comm ends a split in progress. */
mkResult_t mkCommSplit(mkComm_t comm, int color, int key, mkComm_t* newcomm, const mkConfig_t* config);
/* mkCommShrink flags (NCCL_SHRINK_*'s values). */
#define MK_SHRINK_DEFAULT 0x00 /* shrink: the parent's kernels are left as they are */
#define MK_SHRINK_ABORT 0x01   /* stop the parent's kernels first (after a failure: they may wait on a dead rank) */
/* A communicator of comm's ranks without excludeRanksList[0..count) (ranks
 * of comm, e.g. ranks that died or hang), called by every remaining rank and
 * by none of the excluded ones (ncclCommShrink's semantics). The remaining
 * ranks keep their order; the new one inherits comm's configuration, `config`
 * (may be NULL) overrides it. It works on a communicator that failed (a peer
 * died: mkCommGetAsyncError reports it): only the remaining ranks talk.
 * Blocking. Ranks of one process (mkCommInitAll) cannot shrink yet
 * (mkInvalidUsage). comm stays to be destroyed or aborted by the caller. */
mkResult_t mkCommShrink(mkComm_t comm, int* excludeRanksList, int excludeRanksCount, mkComm_t* newcomm,
                        const mkConfig_t* config, int shrinkFlags);
/* Waits (bounded) for every collective issued on comm to complete; afterwards
 * only mkCommDestroy is allowed. */
mkResult_t mkCommFinalize(mkComm_t comm);
/* One process, `ndev` ranks on devices devlist[0..ndev) (NULL: 0..ndev-1). A
 * device may appear more than once (several ranks per GPU, for testing). */
mkResult_t mkCommInitAll(mkComm_t* comms, int ndev, const int* devlist);
/* Destroy and abort are safe from any thread while other threads are inside
 * calls on comm (those calls then fail; the memory is freed when the last of
 * them returns). Destroy waits for this communicator's kernels (bounded by the
 * watchdog); abort stops them, tells every peer (their kernels stop within
 * microseconds, their next calls fail) and never waits on other work. */
mkResult_t mkCommDestroy(mkComm_t comm);
mkResult_t mkCommAbort(mkComm_t comm);
/* mkSuccess; mkInProgress while a nonblocking init runs; or the error that
 * ended an earlier collective (mkRemoteError when a peer stopped answering:
 * the watchdog fired, or a peer aborted). Errors are sticky: once one is
 * recorded, every later call and graph replay on comm fails with it. Cheap
 * and thread-safe: a watchdog thread may poll it every millisecond. */
mkResult_t mkCommGetAsyncError(mkComm_t comm, mkResult_t* asyncError);
mkResult_t mkCommCount(const mkComm_t comm, int* count);
mkResult_t mkCommCuDevice(const mkComm_t comm, int* device);
mkResult_t mkCommUserRank(const mkComm_t comm, int* rank);
/* The nodes the communicator's ranks sit on (1 on one node), and whether it
 * is bootstrap-only (config spanNodes = MK_SPAN_NODES_BOOTSTRAP on a
 * communicator spanning nodes: see mkConfig_t). The same on every rank.
 * mkInProgress while a nonblocking init runs. */
mkResult_t mkCommNodeCount(const mkComm_t comm, int* nodes);
mkResult_t mkCommIsBootstrapOnly(const mkComm_t comm, int* bootstrapOnly);
/* Zero-copy registration. A registered buffer is mapped into every peer
 * (CUDA IPC between processes, peer access within one), so a collective whose
 * send and receive buffers lie in registered buffers on every rank runs a
 * zero-copy plan: peers read and write those buffers directly instead of
 * staging through scratch (used from MK_ZERO_COPY_MIN_BYTES, default 4 MiB,
 * of the larger buffer). Each rank may use any offset inside its buffer.
 * - Collective between ranks of different processes, like
 *   ncclCommWindowRegister: every rank calls it, in the same order; a failure
 *   on any rank fails it on every rank. Within one process (mkCommInitAll)
 *   each rank registers alone.
 * - buff: memory from cudaMalloc / cuMemAlloc on the communicator's GPU (not
 *   from a stream-ordered pool or a VMM allocation); [buff, buff+size) must
 *   lie in one allocation and not overlap another registered buffer.
 * - Every rank must pass registered buffers to a call, or none; a rank that
 *   does while a peer does not makes both report an error after
 *   MK_TIMEOUT_MS. Calls that differ between ranks (count, collective,
 *   dtype, op, root) are reported at kernel entry (mkInvalidUsage from
 *   mkCommGetAsyncError) before any data moves. MK_ZERO_COPY and
 *   MK_ZERO_COPY_MIN_BYTES must be the same on every rank.
 * - Calls are checked against registered sizes (a buffer that starts inside
 *   one must end inside it). MK_MAX_REGISTRATIONS (256) at a time.
 * mkCommDeregister is collective the same way; the calls that use the buffer
 * must have completed (it waits for the GPU between processes). */
mkResult_t mkCommRegister(const mkComm_t comm, void* buff, size_t size, void** handle);
mkResult_t mkCommDeregister(const mkComm_t comm, void* handle);

/* Host-side broadcast of `bytes` bytes (at most 4096) from rank `root`'s
 * `buf` into every rank's `buf`, over the communicator's bootstrap
 * connection (no GPU work). Collective and blocking: every rank calls it
 * with the same bytes and root, from the thread that drives the
 * communicator. For out-of-band setup, e.g. the NCCL-compatible library
 * sharing the unique id of the NCCL communicator it creates for fallbacks.
 * Ranks of one process (mkCommInitAll) have no bootstrap: mkInvalidUsage. */
mkResult_t mkCommBootstrapBroadcast(mkComm_t comm, void* buf, size_t bytes, int root);

/* Compiles (or loads) every plan this communicator may pick for the six
 * collectives in `dtypes` x `ops` (ops: sum when nops is 0; a PreMulSum op
 * stands for PreMulSum in every dtype, whatever its scalar; collectives that
 * do not reduce take one plan for all ops), on `nthreads` threads (0: one per
 * core), so that the first collectives do not wait for NVRTC; for
 * copy-engine schedules it compiles their kernels into the cache. Plans shipped
 * with the library (MK_PREBUILT_DIR) and plans in the kernel cache load in
 * milliseconds. Local: no communication, call it on any rank any time. */
mkResult_t mkCommPrewarm(mkComm_t comm, const mkDataType_t* dtypes, int ndtypes, const mkRedOp_t* ops, int nops,
                         int nthreads);

/* PreMulSum (NCCL's ncclRedOpCreatePreMulSum): a reduction op that sums each
 * rank's input multiplied by that rank's own scalar first, e.g. a gradient
 * divided by the world size in the same pass. `scalar` has type `datatype`;
 * with mkScalarHostImmediate its value is copied now, with mkScalarDevice it
 * points to device memory of the communicator's GPU that every call using
 * the op reads when its kernel runs (keep it alive until the op is
 * destroyed). The op serves mkAllReduce, mkReduce and mkReduceScatter of
 * `datatype` on this communicator only; each rank creates its own, with its
 * own scalar, in the same order. Local: no communication. Such calls never
 * take the zero-copy or copy-engine paths (only a rank's own kernel can scale
 * its input). mkRedOpDestroy frees the handle; calls already enqueued keep
 * their scalar. */
typedef enum { mkScalarDevice = 0, mkScalarHostImmediate = 1 } mkScalarResidence_t;
mkResult_t mkRedOpCreatePreMulSum(mkRedOp_t* op, void* scalar, mkDataType_t datatype,
                                  mkScalarResidence_t residence, mkComm_t comm);
mkResult_t mkRedOpDestroy(mkRedOp_t op, mkComm_t comm);

/* Collectives. `op` is a built-in mkRedOp_t or a PreMulSum handle. */
mkResult_t mkAllReduce(const void* sendbuff, void* recvbuff, size_t count, mkDataType_t datatype,
                       mkRedOp_t op, mkComm_t comm, cudaStream_t stream);
/* Fused all-reduce: the all-reduce, with the fusion's prologue on every
 * element of each rank's input as it is read and its epilogue on every row
 * of recvbuff, in the same kernel (include/mk/fusion.hpp; built-ins in
 * schedules/fused/, docs/fusions.md). `fusion` names a registered fusion and
 * passes its operands (device pointers of the communicator's GPU, in the
 * fusion's order), scalars and row length; NULL is plain mkAllReduce.
 * Built-ins (fp16, bf16, fp32; row 1..16384 elements, count a multiple of it):
 *   "allreduce.rmsnorm"  operands {residual, residual_out, weight}, scalars {eps}:
 *       residual_out = allreduce(x) + residual;
 *       recvbuff = rmsnorm(residual_out) * weight  (per row)
 *   "allreduce.fp8_rows" operands {q (fp8 e4m3), scales (fp32, one per row)}:
 *       scales[r] = amax(row r) / 448; q = e4m3(recvbuff / scales[r])
 *   "allreduce.premulsum" (a prologue; no operands, no row), scalars {scale}:
 *       recvbuff = sum over ranks of sendbuff * that rank's scale
 * A fusion's prologue runs before any op (sum, prod, max, min, avg: the max
 * of clipped inputs is valid), but not with a PreMulSum op, which is a
 * prologue of its own (mkInvalidArgument).
 * Operands may alias each other only exactly (residual_out == residual) and
 * must not overlap sendbuff or recvbuff. Every rank passes the same fusion,
 * row and count. Capturable in CUDA graphs like every call. */
#define MK_FUSION_MAX_OPERANDS 6
#define MK_FUSION_MAX_SCALARS 4
typedef struct {
  const char* name;
  const void* operands[MK_FUSION_MAX_OPERANDS];
  double scalars[MK_FUSION_MAX_SCALARS];
  int64_t row; /* elements per row */
} mkFusion_t;
mkResult_t mkAllReduceFused(const void* sendbuff, void* recvbuff, size_t count, mkDataType_t datatype,
                            mkRedOp_t op, const mkFusion_t* fusion, mkComm_t comm, cudaStream_t stream);
mkResult_t mkBroadcast(const void* sendbuff, void* recvbuff, size_t count, mkDataType_t datatype,
                       int root, mkComm_t comm, cudaStream_t stream);
mkResult_t mkReduce(const void* sendbuff, void* recvbuff, size_t count, mkDataType_t datatype,
                    mkRedOp_t op, int root, mkComm_t comm, cudaStream_t stream);
mkResult_t mkAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                       mkDataType_t datatype, mkComm_t comm, cudaStream_t stream);
mkResult_t mkReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                           mkDataType_t datatype, mkRedOp_t op, mkComm_t comm,
                           cudaStream_t stream);
mkResult_t mkAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                      mkDataType_t datatype, mkComm_t comm, cudaStream_t stream);

/* Composites (include/mk/composite.hpp, docs/composites.md): several
 * collectives written as one program in a schedule file (MK_COMPOSITE) and
 * run as one kernel. `buffers` holds one pointer per buffer the composite
 * declares, in declaration order (`mkc composite NAME` lists them); `count`
 * is every stage's count (elements per block, as each collective's own call
 * takes it); `op` serves the stages that reduce. Stages that depend on each
 * other run in program order on the same thread blocks, the others side by
 * side; where no group kernel can be built the stages run one launch each.
 * Every rank passes the same name, count, datatype and op. Inside
 * mkGroupStart/End the stages join that group (which then runs as group
 * kernels whatever MK_GROUP_FUSE says). */
mkResult_t mkCompositeRun(const char* name, void* const* buffers, int nbuffers, size_t count,
                          mkDataType_t datatype, mkRedOp_t op, mkComm_t comm, cudaStream_t stream);

/* Groups: one host thread driving several communicators. Calls between
 * mkGroupStart and mkGroupEnd are issued at mkGroupEnd. All or nothing: if any
 * call of the group failed (its own return code says why), mkGroupEnd returns
 * that error and launches none of the group's calls. */
mkResult_t mkGroupStart(void);
mkResult_t mkGroupEnd(void);

#ifdef __cplusplus
}
#endif

#endif /* MK_H_ */
