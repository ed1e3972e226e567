// A stand-in for the real NCCL in the tests of mKernel's NCCL-compatible
// library: the functions the library forwards to, each recording its call
// (mkt_fake_nccl_log) and succeeding. Its communicators are plain counters.
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <mutex>
#include <string>

#include "nccl.h"

#define EXPORT extern "C" __attribute__((visibility("default")))

namespace {
std::mutex mu;
std::string log_text;
int next_comm = 1;
void note(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void note(const char* fmt, ...) {
  char line[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  std::lock_guard<std::mutex> g(mu);
  log_text += line;
  log_text += "\n";
}
ncclComm_t make() {
  std::lock_guard<std::mutex> g(mu);
  return reinterpret_cast<ncclComm_t>(static_cast<intptr_t>(0x1000 * next_comm++));
}
long id(ncclComm_t c) { return long(reinterpret_cast<intptr_t>(c) / 0x1000); }
}  // namespace

// The calls so far, one per line ("AllReduce comm=1 count=256 op=0"); reset
// empties it and numbers the next communicator 1 again.
EXPORT const char* mkt_fake_nccl_log(int reset) {
  static std::string copy;
  std::lock_guard<std::mutex> g(mu);
  copy = log_text;
  if (reset) {
    log_text.clear();
    next_comm = 1;
  }
  return copy.c_str();
}

EXPORT ncclResult_t pncclGetVersion(int* v) { *v = 22805; return ncclSuccess; }
EXPORT ncclResult_t ncclGetVersion(int* v) { return pncclGetVersion(v); }
EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId* u) { memset(u, 7, sizeof *u); note("GetUniqueId"); return ncclSuccess; }
EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* c, int n, ncclUniqueId, int r) {
  *c = make();
  note("CommInitRank comm=%ld nranks=%d rank=%d", id(*c), n, r);
  return ncclSuccess;
}
EXPORT ncclResult_t ncclCommInitAll(ncclComm_t* c, int n, const int* devs) {
  for (int i = 0; i < n; ++i) c[i] = make();
  note("CommInitAll n=%d first=%ld dev0=%d", n, id(c[0]), devs ? devs[0] : -1);
  return ncclSuccess;
}
EXPORT ncclResult_t ncclCommFinalize(ncclComm_t c) { note("CommFinalize comm=%ld", id(c)); return ncclSuccess; }
EXPORT ncclResult_t ncclCommDestroy(ncclComm_t c) { note("CommDestroy comm=%ld", id(c)); return ncclSuccess; }
EXPORT ncclResult_t ncclCommAbort(ncclComm_t c) { note("CommAbort comm=%ld", id(c)); return ncclSuccess; }
EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t* e) { *e = ncclSuccess; return ncclSuccess; }
EXPORT ncclResult_t ncclCommCount(const ncclComm_t, int* n) { *n = 2; return ncclSuccess; }
EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t, int* d) { *d = 0; return ncclSuccess; }
EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t, int* r) { *r = 0; return ncclSuccess; }
EXPORT const char* ncclGetLastError(ncclComm_t) { return "fake NCCL: no error"; }
EXPORT ncclResult_t ncclAllReduce(const void*, void*, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c, cudaStream_t) {
  note("AllReduce comm=%ld count=%zu dtype=%d op=%d", id(c), n, int(t), int(op));
  return ncclSuccess;
}
EXPORT ncclResult_t ncclBroadcast(const void*, void*, size_t n, ncclDataType_t, int root, ncclComm_t c, cudaStream_t) {
  note("Broadcast comm=%ld count=%zu root=%d", id(c), n, root);
  return ncclSuccess;
}
EXPORT ncclResult_t ncclReduce(const void*, void*, size_t n, ncclDataType_t, ncclRedOp_t op, int root, ncclComm_t c, cudaStream_t) {
  note("Reduce comm=%ld count=%zu op=%d root=%d", id(c), n, int(op), root);
  return ncclSuccess;
}
EXPORT ncclResult_t ncclAllGather(const void*, void*, size_t n, ncclDataType_t, ncclComm_t c, cudaStream_t) {
  note("AllGather comm=%ld count=%zu", id(c), n);
  return ncclSuccess;
}
EXPORT ncclResult_t ncclReduceScatter(const void*, void*, size_t n, ncclDataType_t, ncclRedOp_t op, ncclComm_t c, cudaStream_t) {
  note("ReduceScatter comm=%ld count=%zu op=%d", id(c), n, int(op));
  return ncclSuccess;
}
EXPORT ncclResult_t ncclAlltoAll(const void*, void*, size_t n, ncclDataType_t, ncclComm_t c, cudaStream_t) {
  note("AlltoAll comm=%ld count=%zu", id(c), n);
  return ncclSuccess;
}
EXPORT ncclResult_t ncclSend(const void*, size_t n, ncclDataType_t, int peer, ncclComm_t c, cudaStream_t) {
  note("Send comm=%ld count=%zu peer=%d", id(c), n, peer);
  return ncclSuccess;
}
EXPORT ncclResult_t ncclRecv(void*, size_t n, ncclDataType_t, int peer, ncclComm_t c, cudaStream_t) {
  note("Recv comm=%ld count=%zu peer=%d", id(c), n, peer);
  return ncclSuccess;
}
EXPORT ncclResult_t ncclGroupStart() { note("GroupStart"); return ncclSuccess; }
EXPORT ncclResult_t ncclGroupEnd() { note("GroupEnd"); return ncclSuccess; }
EXPORT ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void*, ncclDataType_t, ncclScalarResidence_t, ncclComm_t c) {
  *op = ncclRedOp_t(5);
  note("RedOpCreatePreMulSum comm=%ld", id(c));
  return ncclSuccess;
}
EXPORT ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t c) {
  note("RedOpDestroy comm=%ld op=%d", id(c), int(op));
  return ncclSuccess;
}
