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
 * MK_CACHE_DIR (JIT cache), MK_SCRATCH_BYTES (symmetric scratch per
 * communicator), MK_ALGO (force schedules, e.g. "allreduce=allreduce.ring"),
 * MK_BOOTSTRAP_ADDR (host:port for the rendezvous), MK_DEBUG=1 (log to stderr).
 */
#ifndef MK_H_
#define MK_H_

#include <cuda_runtime_api.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MK_MAJOR 0
#define MK_MINOR 1
#define MK_PATCH 0
#define MK_VERSION_CODE (MK_MAJOR * 10000 + MK_MINOR * 100 + MK_PATCH)

typedef struct mkComm* mkComm_t;

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
typedef enum { mkSum = 0, mkProd = 1, mkMax = 2, mkMin = 3, mkAvg = 4, mkNumOps = 5 } mkRedOp_t;

mkResult_t mkGetVersion(int* version);
const char* mkGetErrorString(mkResult_t result);
/* The last error of this communicator in words (comm may be NULL: the calling
 * thread's last error). Never NULL. */
const char* mkGetLastError(mkComm_t comm);

/* Communicators. */
mkResult_t mkGetUniqueId(mkUniqueId* uniqueId);
mkResult_t mkCommInitRank(mkComm_t* comm, int nranks, mkUniqueId commId, int rank);
/* One process, `ndev` ranks on devices devlist[0..ndev) (NULL: 0..ndev-1). A
 * device may appear more than once (several ranks per GPU, for testing). */
mkResult_t mkCommInitAll(mkComm_t* comms, int ndev, const int* devlist);
mkResult_t mkCommDestroy(mkComm_t comm);
mkResult_t mkCommAbort(mkComm_t comm);
/* mkSuccess, or the error that ended an earlier collective (mkRemoteError when
 * a peer stopped answering: the watchdog fired). */
mkResult_t mkCommGetAsyncError(mkComm_t comm, mkResult_t* asyncError);
mkResult_t mkCommCount(const mkComm_t comm, int* count);
mkResult_t mkCommCuDevice(const mkComm_t comm, int* device);
mkResult_t mkCommUserRank(const mkComm_t comm, int* rank);
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

/* Collectives. */
mkResult_t mkAllReduce(const void* sendbuff, void* recvbuff, size_t count, mkDataType_t datatype,
                       mkRedOp_t op, mkComm_t comm, cudaStream_t stream);
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

/* Groups: one host thread driving several communicators. Calls between
 * mkGroupStart and mkGroupEnd are issued at mkGroupEnd. */
mkResult_t mkGroupStart(void);
mkResult_t mkGroupEnd(void);

#ifdef __cplusplus
}
#endif

#endif /* MK_H_ */
