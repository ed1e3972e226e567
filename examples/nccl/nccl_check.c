/*
 * nccl_check: a program written against nccl.h alone. Every collective, for
 * ten dtypes and every op, in-place and out-of-place, each call of every
 * rank in one group; one line per case with whether the result equals a
 * float64 reference and a hash of every rank's result bytes. Run it against
 * NCCL and against mKernel's libnccl.so.2 and compare the lines:
 *
 *   nccl_check 0          > nccl.txt      # the real NCCL, one rank on GPU 0
 *   mkernel-run nccl_check 0 > mk.txt     # the same program on mKernel
 *   diff nccl.txt mk.txt
 *   mkernel-run nccl_check 0,0            # two ranks sharing GPU 0 (mKernel only:
 *                                         # NCCL refuses a GPU twice)
 *   mkernel-run nccl_check 0,0 --abort    # then calls racing an abort from a second
 *                                         # thread (mKernel: they fail; NCCL frees an
 *                                         # aborted communicator, so a call after it is
 *                                         # undefined there)
 *
 * Inputs are small integers, so every dtype and op has an exact answer.
 * Build: cc -O2 nccl_check.c -I$CUDA/include -L$CUDA/lib64 -lnccl -lcudart -lpthread
 */
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAXR 8
#define COUNT 999 /* per rank; odd, so that tails are exercised */

#define CUDA(x)                                                                             \
  do {                                                                                      \
    cudaError_t e_ = (x);                                                                   \
    if (e_ != cudaSuccess) {                                                                \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));   \
      exit(1);                                                                              \
    }                                                                                       \
  } while (0)

static int nranks, devs[MAXR];
static ncclComm_t comms[MAXR];
static cudaStream_t streams[MAXR];

static const struct {
  ncclDataType_t t;
  const char* name;
  int size, is_float;
} kTypes[] = {{ncclInt8, "int8", 1, 0},     {ncclUint8, "uint8", 1, 0},   {ncclInt32, "int32", 4, 0},
              {ncclUint32, "uint32", 4, 0}, {ncclInt64, "int64", 8, 0},   {ncclUint64, "uint64", 8, 0},
              {ncclFloat16, "fp16", 2, 1},  {ncclBfloat16, "bf16", 2, 1}, {ncclFloat32, "fp32", 4, 1},
              {ncclFloat64, "fp64", 8, 1}};
static const char* kOps[] = {"sum", "prod", "max", "min", "avg"};

/* Small integers to and from every dtype (exact for |x| < 256). */
static uint16_t to_half(double x) {
  if (x == 0) return 0;
  int sign = x < 0;
  double a = sign ? -x : x;
  int e = 0;
  while (a >= 2) a /= 2, e++;
  while (a < 1) a *= 2, e--;
  uint16_t m = (uint16_t)((a - 1) * 1024 + 0.5);
  return (uint16_t)((sign << 15) | ((e + 15) << 10) | m);
}
static double from_half(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? m / 1024.0 * (1.0 / 16384) : (1 + m / 1024.0) * ((e >= 15) ? (double)(1 << (e - 15)) : 1.0 / (1 << (15 - e)));
  return (h >> 15) ? -v : v;
}
static void put(void* p, size_t i, int type, double x) {
  switch (kTypes[type].t) {
    case ncclInt8: ((int8_t*)p)[i] = (int8_t)x; break;
    case ncclUint8: ((uint8_t*)p)[i] = (uint8_t)x; break;
    case ncclInt32: ((int32_t*)p)[i] = (int32_t)x; break;
    case ncclUint32: ((uint32_t*)p)[i] = (uint32_t)x; break;
    case ncclInt64: ((int64_t*)p)[i] = (int64_t)x; break;
    case ncclUint64: ((uint64_t*)p)[i] = (uint64_t)x; break;
    case ncclFloat16: ((uint16_t*)p)[i] = to_half(x); break;
    case ncclBfloat16: {
      float f = (float)x;
      uint32_t u;
      memcpy(&u, &f, 4);
      ((uint16_t*)p)[i] = (uint16_t)(u >> 16);
      break;
    }
    case ncclFloat32: ((float*)p)[i] = (float)x; break;
    default: ((double*)p)[i] = x; break;
  }
}
static double get(const void* p, size_t i, int type) {
  switch (kTypes[type].t) {
    case ncclInt8: return ((const int8_t*)p)[i];
    case ncclUint8: return ((const uint8_t*)p)[i];
    case ncclInt32: return ((const int32_t*)p)[i];
    case ncclUint32: return ((const uint32_t*)p)[i];
    case ncclInt64: return (double)((const int64_t*)p)[i];
    case ncclUint64: return (double)((const uint64_t*)p)[i];
    case ncclFloat16: return from_half(((const uint16_t*)p)[i]);
    case ncclBfloat16: {
      uint32_t u = (uint32_t)((const uint16_t*)p)[i] << 16;
      float f;
      memcpy(&f, &u, 4);
      return f;
    }
    case ncclFloat32: return ((const float*)p)[i];
    default: return ((const double*)p)[i];
  }
}

/* Rank r's input element i: 1..4 (prod stays small), a multiple of nranks for avg. */
static double input(int r, size_t i, int op) {
  double v = (double)((r * 7 + i * 3) % 4 + 1);
  if (op == 1) v = (r + i) % 3 == 0 ? 2 : 1;
  if (op == 4) v *= nranks;
  return v;
}
static double combine(double a, double b, int op) {
  switch (op) {
    case 1: return a * b;
    case 2: return a > b ? a : b;
    case 3: return a < b ? a : b;
    default: return a + b;
  }
}

enum { kAllReduce, kBroadcast, kReduce, kAllGather, kReduceScatter, kAlltoAll };
static const char* kColls[] = {"allreduce", "broadcast", "reduce", "allgather", "reducescatter", "alltoall"};

/* Elements of a rank's input and output buffers. */
static size_t in_count(int c) { return c == kReduceScatter || c == kAlltoAll ? (size_t)COUNT * nranks : COUNT; }
static size_t out_count(int c) { return c == kAllGather || c == kAlltoAll ? (size_t)COUNT * nranks : COUNT; }

/* The reference: rank r's output element j. */
static double expect(int c, int r, size_t j, int op) {
  const int root_b = nranks - 1, root_r = 0;
  double acc;
  switch (c) {
    case kBroadcast: return input(root_b, j, op);
    case kAllGather: return input((int)(j / COUNT), j % COUNT, op);
    case kAlltoAll: return input((int)(j / COUNT), (size_t)r * COUNT + j % COUNT, op);
    case kReduce:
      if (r != root_r) return -1; /* not checked */
      /* fall through */
    case kAllReduce:
    case kReduceScatter: {
      size_t at = c == kReduceScatter ? (size_t)r * COUNT + j : j;
      acc = input(0, at, op);
      for (int q = 1; q < nranks; ++q) acc = combine(acc, input(q, at, op), op);
      return op == 4 ? acc / nranks : acc;
    }
  }
  return 0;
}

static int run_case(int c, int type, int op, int inplace) {
  const int sz = kTypes[type].size;
  void *send[MAXR], *recv[MAXR];
  size_t nin = in_count(c), nout = out_count(c), bytes = (nin > nout ? nin : nout) * (size_t)sz;
  unsigned char* host = malloc(bytes);
  for (int r = 0; r < nranks; ++r) {
    CUDA(cudaSetDevice(devs[r]));
    CUDA(cudaMalloc(&recv[r], bytes));
    CUDA(cudaMemset(recv[r], 0, bytes));
    send[r] = recv[r];
    if (!inplace) CUDA(cudaMalloc(&send[r], bytes));
    /* in-place as NCCL defines it: allgather's input is the rank's slice of the
       output, reducescatter's output the rank's slice of the input */
    size_t off = inplace && c == kAllGather ? (size_t)r * COUNT * sz : 0;
    for (size_t i = 0; i < nin; ++i) put(host, i, type, input(r, i, op));
    CUDA(cudaMemcpy((char*)send[r] + off, host, nin * sz, cudaMemcpyHostToDevice));
  }
  ncclResult_t res = ncclGroupStart();
  for (int r = 0; r < nranks && res == ncclSuccess; ++r) {
    CUDA(cudaSetDevice(devs[r]));
    const void* s = send[r];
    void* d = recv[r];
    if (inplace && c == kAllGather) s = (char*)recv[r] + (size_t)r * COUNT * sz;
    if (inplace && c == kReduceScatter) d = (char*)send[r] + (size_t)r * COUNT * sz;
    ncclDataType_t t = kTypes[type].t;
    switch (c) {
      case kAllReduce: res = ncclAllReduce(s, d, COUNT, t, (ncclRedOp_t)op, comms[r], streams[r]); break;
      case kBroadcast: res = ncclBroadcast(s, d, COUNT, t, nranks - 1, comms[r], streams[r]); break;
      case kReduce: res = ncclReduce(s, d, COUNT, t, (ncclRedOp_t)op, 0, comms[r], streams[r]); break;
      case kAllGather: res = ncclAllGather(s, d, COUNT, t, comms[r], streams[r]); break;
      case kReduceScatter: res = ncclReduceScatter(s, d, COUNT, t, (ncclRedOp_t)op, comms[r], streams[r]); break;
      case kAlltoAll: res = ncclAlltoAll(s, d, COUNT, t, comms[r], streams[r]); break;
    }
  }
  ncclResult_t end = ncclGroupEnd();
  if (res == ncclSuccess) res = end;
  uint64_t hash = 1469598103934665603ull;
  int bad = 0;
  if (res == ncclSuccess) {
    for (int r = 0; r < nranks; ++r) {
      CUDA(cudaSetDevice(devs[r]));
      CUDA(cudaStreamSynchronize(streams[r]));
      const void* out = recv[r];
      if (inplace && c == kReduceScatter) out = (char*)send[r] + (size_t)r * COUNT * sz;
      CUDA(cudaMemcpy(host, out, nout * sz, cudaMemcpyDeviceToHost));
      for (size_t j = 0; j < nout; ++j) {
        double want = expect(c, r, j, op);
        if (want >= 0 && get(host, j, type) != want) ++bad;
      }
      if (c == kReduce && r != 0) continue; /* only the root's output is defined */
      for (size_t k = 0; k < nout * (size_t)sz; ++k) hash = (hash ^ host[k]) * 1099511628211ull;
    }
  }
  for (int r = 0; r < nranks; ++r) {
    CUDA(cudaSetDevice(devs[r]));
    CUDA(cudaFree(recv[r]));
    if (!inplace) CUDA(cudaFree(send[r]));
  }
  free(host);
  const int reduces = c == kAllReduce || c == kReduce || c == kReduceScatter;
  printf("%-13s %-6s %-4s %-12s %s hash=%016llx\n", kColls[c], kTypes[type].name, reduces ? kOps[op] : "-",
         inplace ? "in-place" : "out-of-place",
         res != ncclSuccess ? ncclGetErrorString(res) : bad ? "WRONG" : "ok", (unsigned long long)hash);
  if (res != ncclSuccess) fprintf(stderr, "  %s\n", ncclGetLastError(NULL));
  return res != ncclSuccess || bad;
}

static void* aborter(void* arg) {
  (void)arg;
  usleep(20000);
  for (int r = 0; r < nranks; ++r) ncclCommAbort(comms[r]);
  return NULL;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: nccl_check DEVLIST [--abort]   (DEVLIST: 0 or 0,1 or 0,0)\n");
    return 2;
  }
  for (char* s = argv[1]; *s && nranks < MAXR;) {
    devs[nranks++] = (int)strtol(s, &s, 10);
    if (*s == ',') ++s;
  }
  int version = 0;
  ncclGetVersion(&version);
  fprintf(stderr, "nccl_check: %d rank(s), NCCL version %d\n", nranks, version);
  if (ncclCommInitAll(comms, nranks, devs) != ncclSuccess) {
    fprintf(stderr, "ncclCommInitAll: %s\n", ncclGetLastError(NULL));
    return 1;
  }
  for (int r = 0; r < nranks; ++r) {
    CUDA(cudaSetDevice(devs[r]));
    CUDA(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking));
  }
  int failed = 0, cases = 0;
  for (int c = 0; c < 6; ++c)
    for (int type = 0; type < (int)(sizeof kTypes / sizeof kTypes[0]); ++type)
      for (int op = 0; op < 5; ++op) {
        const int reduces = c == kAllReduce || c == kReduce || c == kReduceScatter;
        if (!reduces && op > 0) break;
        if (op == 4 && !kTypes[type].is_float) continue; /* avg: floating types */
        for (int inplace = 0; inplace < (c == kAlltoAll ? 1 : 2); ++inplace, ++cases)  /* no in-place all-to-all */
          failed += run_case(c, type, op, inplace);
      }
  fprintf(stderr, "nccl_check: %d case(s), %d failed\n", cases, failed);
  if (argc > 2 && strcmp(argv[2], "--abort") == 0) {
    /* calls race an abort from a second thread: they fail, nothing crashes */
    pthread_t t;
    pthread_create(&t, NULL, aborter, NULL);
    void* buf[MAXR];
    for (int r = 0; r < nranks; ++r) {
      CUDA(cudaSetDevice(devs[r]));
      CUDA(cudaMalloc(&buf[r], 1 << 20));
    }
    int issued = 0;
    ncclResult_t res = ncclSuccess;
    for (int k = 0; k < 100000 && res == ncclSuccess; ++k) {
      res = ncclGroupStart();
      for (int r = 0; r < nranks && res == ncclSuccess; ++r)
        res = ncclAllReduce(buf[r], buf[r], 1 << 18, ncclFloat32, ncclSum, comms[r], streams[r]);
      ncclResult_t e = ncclGroupEnd();
      if (res == ncclSuccess) res = e;
      if (res == ncclSuccess) ++issued;
    }
    pthread_join(t, NULL);
    fprintf(stderr, "nccl_check: abort from a second thread: %d group(s) issued, then %s\n", issued,
            ncclGetErrorString(res));
    return failed ? 1 : 0; /* aborted communicators are not destroyed again */
  }
  for (int r = 0; r < nranks; ++r) ncclCommDestroy(comms[r]);
  return failed ? 1 : 0;
}
