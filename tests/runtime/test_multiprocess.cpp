// Two processes, one rank each, over the bootstrap: arenas and registered
// buffers are really shared (the fake maps the same memfd / shm bytes).
// The ranks are this binary started again (fresh processes, as with a
// launcher), so nothing of the parent's runtime state leaks into them.
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/bootstrap/bootstrap.hpp"
#include "runtime/comm/comm.hpp"
#include "runtime/api/handles.hpp"
#include "runtime/api/status.hpp"
#include "runtime/memory/ipc.hpp"
#include "tests/runtime/fake.hpp"
#include "compiler/compile.hpp"
#include "compiler/jit/jit.hpp"
#include "compiler/plan/plan.hpp"
#include "mk/dsl.hpp"
#ifdef MKT_SHIM
#include "nccl.h"
#endif

using mkt::cu;

namespace {

std::string to_hex(const void* p, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s += "0123456789abcdef"[static_cast<const unsigned char*>(p)[i] >> 4],
                                 s += "0123456789abcdef"[static_cast<const unsigned char*>(p)[i] & 15];
  return s;
}

bool from_hex(const std::string& s, void* p, size_t n) {
  if (s.size() != 2 * n) return false;
  for (size_t i = 0; i < n; ++i) static_cast<unsigned char*>(p)[i] = (unsigned char)std::stoi(s.substr(2 * i, 2), nullptr, 16);
  return true;
}

int g_rank = -1;
#define CHILD_CHECK(cond)                                                                              \
  do {                                                                                                 \
    if (!(cond)) {                                                                                     \
      std::fprintf(stderr, "rank %d: %s:%d: CHECK(%s) failed; last error: %s\n", g_rank, __FILE__, __LINE__, \
                   #cond, mkGetLastError(nullptr));                                                    \
      return 1;                                                                                        \
    }                                                                                                  \
  } while (0)

// Reads `n` bytes at device address `p` and checks they all equal `v`.
bool all_bytes(CUdeviceptr p, size_t n, unsigned char v) {
  std::vector<unsigned char> got(n);
  if (cu().cuMemcpyDtoH(got.data(), p, n) != CUDA_SUCCESS) return false;
  for (unsigned char c : got)
    if (c != v) return false;
  return true;
}

// Makes GPU `rank`'s primary context current; nonzero on failure.
int use_gpu(int rank) {
  g_rank = rank;
  CUcontext ctx = nullptr;
  CHILD_CHECK(cu().cuDevicePrimaryCtxRetain(&ctx, rank) == CUDA_SUCCESS);
  CHILD_CHECK(cu().cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
  return 0;
}

// Every live count of the fake driver back where `before` had it; says what
// leaked otherwise.
bool leak_free(const mkfake_counts& before) {
  const std::string leaked = mkt::leaks(before, mkt::counts());
  if (!leaked.empty()) std::fprintf(stderr, "rank %d leaked: %s\n", g_rank, leaked.c_str());
  return leaked.empty();
}

// A rank's context (GPU `rank`), a stream and its communicator; nonzero on failure.
int open_rank(int rank, int nranks, const mkUniqueId& id, CUstream* stream, mkComm_t* comm) {
  if (use_gpu(rank)) return 1;
  CHILD_CHECK(cu().cuStreamCreate(stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CHILD_CHECK(mkCommInitRank(comm, nranks, id, rank) == mkSuccess);
  return 0;
}

int run_rank(int rank, int nranks, const mkUniqueId& id) {
  g_rank = rank;
  CHILD_CHECK(mkt::driver() == mkt::Driver::fake);
  mkfake_counts before{};
  mkfake_fn<decltype(mkfake_get_counts)>("mkfake_get_counts")(&before);
  CUstream stream = nullptr;
  mkComm_t comm = nullptr;
  if (open_rank(rank, nranks, id, &stream, &comm)) return 1;
  auto* c = mk::rt::acquire(comm).get();
  const int peer = 1 - rank;
  CHILD_CHECK(c->device == rank);

  // Arenas: the last KiB of each rank's scratch (no plan uses it) gets a
  // pattern; the peer reads it through its imported mapping.
  const size_t tail = 1024;
  const size_t at = c->arena->size() - tail;
  CHILD_CHECK(c->peer_base[size_t(peer)] != 0 && c->peer_base[size_t(peer)] != c->arena->base());
  CHILD_CHECK(cu().cuMemsetD8(c->arena->base() + at, (unsigned char)(0x50 + rank), tail) == CUDA_SUCCESS);
  c->boot->barrier();
  CHILD_CHECK(all_bytes(c->peer_base[size_t(peer)] + at, tail, (unsigned char)(0x50 + peer)));
  c->boot->barrier();

  // Registration: the peer's cuMemAlloc buffer is opened over CUDA IPC; its
  // bytes are visible here and our writes land there.
  const size_t bytes = 1 << 16;
  CUdeviceptr reg = 0;
  CHILD_CHECK(cu().cuMemAlloc(&reg, bytes) == CUDA_SUCCESS);
  CHILD_CHECK(cu().cuMemsetD8(reg, (unsigned char)(0xA0 + rank), bytes) == CUDA_SUCCESS);
  void* handle = nullptr;
  CHILD_CHECK(mkCommRegister(comm, reinterpret_cast<void*>(uintptr_t(reg)), bytes, &handle) == mkSuccess);
  const int w = c->regs.by_base.at(uintptr_t(reg)).window;
  mk::dev::ZcPeerWindow entry{};
  CHILD_CHECK(cu().cuMemcpyDtoH(&entry, c->regs.windows + sizeof entry * (size_t(w) * 2 + size_t(peer)), sizeof entry) ==
              CUDA_SUCCESS);
  CHILD_CHECK(entry.base != nullptr && entry.bytes == int64_t(bytes));
  const CUdeviceptr mapped = CUdeviceptr(uintptr_t(entry.base));
  CHILD_CHECK(mapped != reg);
  CHILD_CHECK(all_bytes(mapped, bytes, (unsigned char)(0xA0 + peer)));
  c->boot->barrier();
  CHILD_CHECK(cu().cuMemsetD8(mapped + 8 * size_t(rank), (unsigned char)(0xE0 + rank), 8) == CUDA_SUCCESS);
  c->boot->barrier();
  CHILD_CHECK(all_bytes(reg + 8 * size_t(peer), 8, (unsigned char)(0xE0 + peer)));

  // A collective launches on both ranks.
  CUdeviceptr buf = 0;
  CHILD_CHECK(cu().cuMemAlloc(&buf, 4096) == CUDA_SUCCESS);
  const int64_t launches = mkt::counts().launches;
  CHILD_CHECK(mkAllReduce(reinterpret_cast<void*>(uintptr_t(buf)), reinterpret_cast<void*>(uintptr_t(buf)), 256,
                          mkFloat32, mkSum, comm, stream) == mkSuccess);
  CHILD_CHECK(mkt::counts().launches == launches + 1);
  mkfake_launch l{};
  CHILD_CHECK(mkfake_fn<decltype(mkfake_last_launch)>("mkfake_last_launch")(&l) == 1);
  CHILD_CHECK(l.args.rank == rank && l.args.count == 256 && l.device == rank);
  // sm_90 plans wait for the previous grid first, so they are launched with
  // programmatic dependent launch, unless MK_PDL=0.
  const char* pdl = std::getenv("MK_PDL");
  CHILD_CHECK(l.pdl == (pdl && std::string(pdl) == "0" ? 0 : 1));
  // On the registered buffer: zero-copy from MK_ZERO_COPY_MIN_BYTES on, with
  // the schedule that reads and writes peers' buffers in place.
  const char* zc_min = std::getenv("MK_ZERO_COPY_MIN_BYTES");
  const bool zc = zc_min && std::string(zc_min) == "0";
  CHILD_CHECK(mkAllReduce(reinterpret_cast<void*>(uintptr_t(reg)), reinterpret_cast<void*>(uintptr_t(reg)), 256,
                          mkFloat32, mkSum, comm, stream) == mkSuccess);
  CHILD_CHECK(mkfake_fn<decltype(mkfake_last_launch)>("mkfake_last_launch")(&l) == 1);
  CHILD_CHECK(std::string(l.function).find(zc ? "allreduce_direct" : "allreduce_one_shot") != std::string::npos);
  CHILD_CHECK((l.args.windows != nullptr) == zc);
  // PreMulSum on the same registered buffer: never zero-copy (a peer cannot
  // scale this rank's input: only this rank has its scalar).
  mkRedOp_t pm = mkSum;
  float scale = 0.5f + 0.25f * float(rank);
  CHILD_CHECK(mkRedOpCreatePreMulSum(&pm, &scale, mkFloat32, mkScalarHostImmediate, comm) == mkSuccess);
  CHILD_CHECK(mkAllReduce(reinterpret_cast<void*>(uintptr_t(reg)), reinterpret_cast<void*>(uintptr_t(reg)), 256,
                          mkFloat32, pm, comm, stream) == mkSuccess);
  CHILD_CHECK(mkfake_fn<decltype(mkfake_last_launch)>("mkfake_last_launch")(&l) == 1);
  CHILD_CHECK(std::string(l.function).find("allreduce_one_shot") != std::string::npos);
  CHILD_CHECK(std::string(l.function).find("premulsum") != std::string::npos);
  CHILD_CHECK(l.args.windows == nullptr);
  CHILD_CHECK(mkRedOpDestroy(pm, comm) == mkSuccess);

  CHILD_CHECK(mkCommDeregister(comm, handle) == mkSuccess);
  CHILD_CHECK(mkCommDestroy(comm) == mkSuccess);
  CHILD_CHECK(cu().cuMemFree(buf) == CUDA_SUCCESS);
  CHILD_CHECK(cu().cuMemFree(reg) == CUDA_SUCCESS);
  CHILD_CHECK(cu().cuStreamDestroy(stream) == CUDA_SUCCESS);
  CHILD_CHECK(cu().cuDevicePrimaryCtxRelease(rank) == CUDA_SUCCESS);
  CHILD_CHECK(leak_free(before));
  return 0;
}

// Init (with the config's schedule list MKT_CONFIG_SCHEDULES, when set) must
// fail on every rank, with a message that has every piece of `want`.
int expect_init_failure(int rank, int nranks, const mkUniqueId& id, mkResult_t code,
                        const std::vector<std::string>& want) {
  if (use_gpu(rank)) return 1;
  mkComm_t comm = nullptr;
  mkConfig_t cfg = MK_CONFIG_INITIALIZER;
  cfg.schedules = std::getenv("MKT_CONFIG_SCHEDULES");  // the communicator's own list, when a test gives one
  const mkResult_t r = cfg.schedules ? mkCommInitRankConfig(&comm, nranks, id, rank, &cfg)
                                     : mkCommInitRank(&comm, nranks, id, rank);
  const std::string msg = mkGetLastError(nullptr);
  std::fprintf(stderr, "rank %d: %s\n", rank, msg.c_str());
  CHILD_CHECK(r == code);
  CHILD_CHECK(comm == nullptr);
  for (const auto& w : want) CHILD_CHECK(msg.find(w) != std::string::npos);
  return 0;
}

// An all-gather on `comm` takes the built-in choice; then `comm`, `buf` and
// `stream` are released.
int builtin_allgather_then_close(mkComm_t comm, CUdeviceptr buf, CUstream stream) {
  void* p = reinterpret_cast<void*>(uintptr_t(buf));
  mkfake_launch l{};
  CHILD_CHECK(mkAllGather(p, reinterpret_cast<char*>(p) + 2048, 64, mkFloat32, comm, stream) == mkSuccess);
  CHILD_CHECK(mkfake_fn<decltype(mkfake_last_launch)>("mkfake_last_launch")(&l) == 1);
  CHILD_CHECK(std::string(l.function).find("allgather_direct") != std::string::npos);
  CHILD_CHECK(mkCommDestroy(comm) == mkSuccess);
  CHILD_CHECK(cu().cuMemFree(buf) == CUDA_SUCCESS);
  CHILD_CHECK(cu().cuStreamDestroy(stream) == CUDA_SUCCESS);
  return 0;
}

// MK_SELECT_FILE picks the schedule and its knobs: a small all-reduce runs
// two_shot with 2 LL instances instead of the built-in one-shot with 16.
int selected(int rank, int nranks, const mkUniqueId& id) {
  CUstream stream = nullptr;
  mkComm_t comm = nullptr;
  if (open_rank(rank, nranks, id, &stream, &comm)) return 1;
  CUdeviceptr buf = 0;
  CHILD_CHECK(cu().cuMemAlloc(&buf, 4096) == CUDA_SUCCESS);
  void* p = reinterpret_cast<void*>(uintptr_t(buf));
  CHILD_CHECK(mkAllReduce(p, p, 256, mkFloat32, mkSum, comm, stream) == mkSuccess);
  mkfake_launch l{};
  CHILD_CHECK(mkfake_fn<decltype(mkfake_last_launch)>("mkfake_last_launch")(&l) == 1);
  std::fprintf(stderr, "rank %d launched %s grid %u\n", rank, l.function, l.grid[0]);
  CHILD_CHECK(std::string(l.function).find("allreduce_two_shot") != std::string::npos);
  CHILD_CHECK(l.grid[0] <= 2 * 4);  // 2 instances of at most 4 blocks (the built-in: 16 instances)
  // the other collectives keep the built-in choices
  return builtin_allgather_then_close(comm, buf, stream);
}

// A user schedule (MK_SCHEDULES, or the config's own list when
// MKT_CONFIG_SCHEDULES is set) named by MK_ALGO serves mkAllReduce: the kernel
// launched is the one compiled from it; the other collectives keep the
// built-in choices.
int user_schedule(int rank, int nranks, const mkUniqueId& id) {
  if (use_gpu(rank)) return 1;
  CUstream stream = nullptr;
  CHILD_CHECK(cu().cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  mkComm_t comm = nullptr;
  mkConfig_t cfg = MK_CONFIG_INITIALIZER;
  cfg.schedules = std::getenv("MKT_CONFIG_SCHEDULES");
  CHILD_CHECK(mkCommInitRankConfig(&comm, nranks, id, rank, &cfg) == mkSuccess);
  CUdeviceptr buf = 0;
  CHILD_CHECK(cu().cuMemAlloc(&buf, 1 << 16) == CUDA_SUCCESS);
  void* p = reinterpret_cast<void*>(uintptr_t(buf));
  mkfake_launch l{};
  for (int64_t count : {64, 4096, 8192}) {  // every size: MK_ALGO overrides the tables
    CHILD_CHECK(mkAllReduce(p, p, size_t(count), mkFloat32, mkSum, comm, stream) == mkSuccess);
    CHILD_CHECK(mkfake_fn<decltype(mkfake_last_launch)>("mkfake_last_launch")(&l) == 1);
    std::fprintf(stderr, "rank %d: all-reduce of %lld launched %s\n", rank, (long long)count, l.function);
    CHILD_CHECK(std::string(l.function).find(std::getenv("MKT_WANT_KERNEL")) != std::string::npos);
  }
  return builtin_allgather_then_close(comm, buf, stream);
}

// MK_ALGO forces a copy-engine schedule, which cannot scale a PreMulSum
// call's input: the call runs the built-in table's schedule instead, the
// same on every rank.
int premul_fallback(int rank, int nranks, const mkUniqueId& id) {
  CUstream stream = nullptr;
  mkComm_t comm = nullptr;
  if (open_rank(rank, nranks, id, &stream, &comm)) return 1;
  CUdeviceptr buf = 0;
  CHILD_CHECK(cu().cuMemAlloc(&buf, 1 << 16) == CUDA_SUCCESS);
  void* p = reinterpret_cast<void*>(uintptr_t(buf));
  mkRedOp_t pm = mkSum;
  float scale = 2.0f;
  CHILD_CHECK(mkRedOpCreatePreMulSum(&pm, &scale, mkFloat32, mkScalarHostImmediate, comm) == mkSuccess);
  CHILD_CHECK(mkAllReduce(p, p, 256, mkFloat32, pm, comm, stream) == mkSuccess);
  mkfake_launch l{};
  CHILD_CHECK(mkfake_fn<decltype(mkfake_last_launch)>("mkfake_last_launch")(&l) == 1);
  std::fprintf(stderr, "rank %d: PreMulSum all-reduce launched %s\n", rank, l.function);
  CHILD_CHECK(std::string(l.function).find("allreduce_one_shot") != std::string::npos);
  CHILD_CHECK(std::string(l.function).find("premulsum") != std::string::npos);
  CHILD_CHECK(mkRedOpDestroy(pm, comm) == mkSuccess);
  CHILD_CHECK(mkCommDestroy(comm) == mkSuccess);
  CHILD_CHECK(cu().cuMemFree(buf) == CUDA_SUCCESS);
  return 0;
}

// The same for a fused all-reduce: copy engines run no epilogue.
int fused_fallback(int rank, int nranks, const mkUniqueId& id) {
  CUstream stream = nullptr;
  mkComm_t comm = nullptr;
  if (open_rank(rank, nranks, id, &stream, &comm)) return 1;
  CUdeviceptr buf = 0, res = 0, w = 0;
  CHILD_CHECK(cu().cuMemAlloc(&buf, 1 << 16) == CUDA_SUCCESS);
  CHILD_CHECK(cu().cuMemAlloc(&res, 1 << 16) == CUDA_SUCCESS);
  CHILD_CHECK(cu().cuMemAlloc(&w, 1 << 10) == CUDA_SUCCESS);
  void* p = reinterpret_cast<void*>(uintptr_t(buf));
  mkFusion_t f{};
  f.name = "allreduce.rmsnorm";
  f.operands[0] = f.operands[1] = reinterpret_cast<void*>(uintptr_t(res));
  f.operands[2] = reinterpret_cast<void*>(uintptr_t(w));
  f.scalars[0] = 1e-6;
  f.row = 128;
  CHILD_CHECK(mkAllReduceFused(p, p, 256, mkFloat32, mkSum, &f, comm, stream) == mkSuccess);
  mkfake_launch l{};
  CHILD_CHECK(mkfake_fn<decltype(mkfake_last_launch)>("mkfake_last_launch")(&l) == 1);
  std::fprintf(stderr, "rank %d: fused all-reduce launched %s\n", rank, l.function);
  CHILD_CHECK(std::string(l.function).find("allreduce_rmsnorm") != std::string::npos);
  CHILD_CHECK(std::string(l.function).find("_ce") == std::string::npos);
  CHILD_CHECK(mkCommDestroy(comm) == mkSuccess);
  for (CUdeviceptr x : {buf, res, w}) CHILD_CHECK(cu().cuMemFree(x) == CUDA_SUCCESS);
  return 0;
}

// Init, one all-reduce, destroy.
int init_allreduce(int rank, int nranks, const mkUniqueId& id) {
  CUstream stream = nullptr;
  mkComm_t comm = nullptr;
  if (open_rank(rank, nranks, id, &stream, &comm)) return 1;
  CUdeviceptr buf = 0;
  CHILD_CHECK(cu().cuMemAlloc(&buf, 4096) == CUDA_SUCCESS);
  void* p = reinterpret_cast<void*>(uintptr_t(buf));
  CHILD_CHECK(mkAllReduce(p, p, 256, mkFloat32, mkSum, comm, stream) == mkSuccess);
  CHILD_CHECK(mkCommDestroy(comm) == mkSuccess);
  CHILD_CHECK(cu().cuMemFree(buf) == CUDA_SUCCESS);
  CHILD_CHECK(cu().cuStreamDestroy(stream) == CUDA_SUCCESS);
  return 0;
}

// A 1-rank communicator whose own list (MKT_FIRST_LIST) loads a schedule
// into this process's registry; then MK_ALGO selects it for a 2-rank
// communicator that does not list it. Ranks whose processes loaded different
// files under that name must fail init, not run different kernels.
int divergent_registry(int rank, int nranks, const mkUniqueId& id) {
  if (use_gpu(rank)) return 1;
  mkUniqueId solo;
  CHILD_CHECK(mkGetUniqueId(&solo) == mkSuccess);
  mkConfig_t cfg = MK_CONFIG_INITIALIZER;
  cfg.schedules = std::getenv("MKT_FIRST_LIST");
  mkComm_t one = nullptr;
  CHILD_CHECK(mkCommInitRankConfig(&one, 1, solo, 0, &cfg) == mkSuccess);
  CHILD_CHECK(mkCommDestroy(one) == mkSuccess);
  setenv("MK_ALGO", "allreduce=my.x", 1);
  return expect_init_failure(rank, nranks, id, mkInvalidUsage,
                             {"ranks disagree on the user schedules it can run (name@IR hash)", "my.x@"});
}

// Two entries of one schedule with different knobs are two plans whose
// kernels have the same names: each size range gets its own (regression: the
// first size's plan served both).
int selected_knobs(int rank, int nranks, const mkUniqueId& id) {
  CUstream stream = nullptr;
  mkComm_t comm = nullptr;
  if (open_rank(rank, nranks, id, &stream, &comm)) return 1;
  CUdeviceptr buf = 0;
  CHILD_CHECK(cu().cuMemAlloc(&buf, 1 << 16) == CUDA_SUCCESS);
  void* p = reinterpret_cast<void*>(uintptr_t(buf));
  mkfake_launch l{};
  CHILD_CHECK(mkAllReduce(p, p, 64, mkFloat32, mkSum, comm, stream) == mkSuccess);  // 256 B: ll_instances=2
  CHILD_CHECK(mkfake_fn<decltype(mkfake_last_launch)>("mkfake_last_launch")(&l) == 1);
  CHILD_CHECK(l.grid[0] == 2);
  CHILD_CHECK(mkAllReduce(p, p, 4096, mkFloat32, mkSum, comm, stream) == mkSuccess);  // 16 KiB: ll_instances=8
  CHILD_CHECK(mkfake_fn<decltype(mkfake_last_launch)>("mkfake_last_launch")(&l) == 1);
  std::fprintf(stderr, "rank %d: 16 KiB launched %s grid %u\n", rank, l.function, l.grid[0]);
  CHILD_CHECK(l.grid[0] == 8);
  CHILD_CHECK(mkAllReduce(p, p, 64, mkFloat32, mkSum, comm, stream) == mkSuccess);  // and back
  CHILD_CHECK(mkfake_fn<decltype(mkfake_last_launch)>("mkfake_last_launch")(&l) == 1);
  CHILD_CHECK(l.grid[0] == 2);
  CHILD_CHECK(mkCommDestroy(comm) == mkSuccess);
  CHILD_CHECK(cu().cuMemFree(buf) == CUDA_SUCCESS);
  return 0;
}

// The copy-engine schedules move real bytes in the fake (its copies run):
// every collective, sizes around the tile (MK_TUNE=ce_tile=65536 in the
// environment), in place and out of place, every broadcast root, and a CUDA
// graph replayed with new inputs. Bytes differ per rank, call and index.
unsigned char ce_byte(int call, int rank, size_t i) { return (unsigned char)(call * 29 + rank * 101 + i * 7 + (i >> 9)); }

// Regular files under `dir` (the JIT cache), recursively.
size_t files_under(const std::string& dir) {
  size_t n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec); !ec && it != std::filesystem::end(it);
       it.increment(ec))
    n += it->is_regular_file();
  return n;
}

int copy_engine(int rank, int nranks, const mkUniqueId& id) {
  CUstream stream = nullptr;
  mkComm_t comm = nullptr;
  if (open_rank(rank, nranks, id, &stream, &comm)) return 1;
  // mkCommPrewarm compiles the copy-engine kernels these calls use (no plan:
  // every collective here is a copy-engine one), so the calls compile nothing.
  const mkDataType_t pdt[] = {mkUint8, mkInt32};
  const mkRedOp_t pop[] = {mkSum, mkMax};
  CHILD_CHECK(mkCommPrewarm(comm, pdt, 2, pop, 2, 0) == mkSuccess);
  mk::rt::acquire(comm).get()->boot->barrier();
  const char* cache = std::getenv("MK_CACHE_DIR");
  CHILD_CHECK(cache != nullptr);
  const size_t cached = files_under(cache);
  CHILD_CHECK(cached >= 5);  // the sync kernel, reduce kernels for {uint8, int32} x {sum, max}
  const size_t max_count = 3 * 65536 + 777;
  CUdeviceptr in = 0, out = 0;
  CHILD_CHECK(cu().cuMemAlloc(&in, max_count * size_t(nranks)) == CUDA_SUCCESS);
  CHILD_CHECK(cu().cuMemAlloc(&out, max_count * size_t(nranks)) == CUDA_SUCCESS);
  void* pin = reinterpret_cast<void*>(uintptr_t(in));
  void* pout = reinterpret_cast<void*>(uintptr_t(out));
  int call = 0;
  std::vector<unsigned char> host(max_count * size_t(nranks));
  auto fill = [&](CUdeviceptr p, size_t n, int c) {
    for (size_t i = 0; i < n; ++i) host[i] = ce_byte(c, rank, i);
    return cu().cuMemcpyHtoD(p, host.data(), n) == CUDA_SUCCESS;
  };
  auto poison = [&](CUdeviceptr p, size_t n) { return cu().cuMemsetD8(p, 0xEE, n) == CUDA_SUCCESS; };
  const int64_t launches0 = mkt::counts().launches;
  for (size_t count : {size_t(1), size_t(65535), size_t(65536), size_t(65537), size_t(3 * 65536 + 777)}) {
    for (int inplace = 0; inplace < 2; ++inplace) {
      // all-gather
      ++call;
      CHILD_CHECK(poison(out, count * size_t(nranks)));
      void* src = pin;
      if (inplace) {
        src = static_cast<char*>(pout) + size_t(rank) * count;
        CHILD_CHECK(fill(out + size_t(rank) * count, count, call));
      } else {
        CHILD_CHECK(fill(in, count, call));
      }
      CHILD_CHECK(mkAllGather(src, pout, count, mkUint8, comm, stream) == mkSuccess);
      CHILD_CHECK(cu().cuStreamSynchronize(stream) == CUDA_SUCCESS);
      CHILD_CHECK(cu().cuMemcpyDtoH(host.data(), out, count * size_t(nranks)) == CUDA_SUCCESS);
      for (int q = 0; q < nranks; ++q)
        for (size_t i = 0; i < count; ++i)
          if (host[size_t(q) * count + i] != ce_byte(call, q, i)) {
            std::fprintf(stderr, "rank %d: allgather count %zu inplace %d: block %d byte %zu wrong\n", rank, count,
                         inplace, q, i);
            return 1;
          }
      // broadcast, every root
      for (int root = 0; root < nranks; ++root) {
        ++call;
        CHILD_CHECK(poison(out, count));
        void* bsrc = pin;
        if (inplace) {
          bsrc = pout;
          if (rank == root) CHILD_CHECK(fill(out, count, call));
        } else {
          CHILD_CHECK(fill(in, count, call));
        }
        CHILD_CHECK(mkBroadcast(bsrc, pout, count, mkUint8, root, comm, stream) == mkSuccess);
        CHILD_CHECK(cu().cuStreamSynchronize(stream) == CUDA_SUCCESS);
        CHILD_CHECK(cu().cuMemcpyDtoH(host.data(), out, count) == CUDA_SUCCESS);
        for (size_t i = 0; i < count; ++i)
          if (host[i] != ce_byte(call, root, i)) {
            std::fprintf(stderr, "rank %d: broadcast root %d count %zu inplace %d: byte %zu wrong\n", rank, root,
                         count, inplace, i);
            return 1;
          }
      }
    }
    // all-to-all (no in-place form)
    ++call;
    CHILD_CHECK(poison(out, count * size_t(nranks)));
    CHILD_CHECK(fill(in, count * size_t(nranks), call));
    CHILD_CHECK(mkAllToAll(pin, pout, count, mkUint8, comm, stream) == mkSuccess);
    CHILD_CHECK(cu().cuStreamSynchronize(stream) == CUDA_SUCCESS);
    CHILD_CHECK(cu().cuMemcpyDtoH(host.data(), out, count * size_t(nranks)) == CUDA_SUCCESS);
    for (int q = 0; q < nranks; ++q)
      for (size_t i = 0; i < count; ++i)
        if (host[size_t(q) * count + i] != ce_byte(call, q, size_t(rank) * count + i)) {
          std::fprintf(stderr, "rank %d: alltoall count %zu: block %d byte %zu wrong\n", rank, count, q, i);
          return 1;
        }
  }
  // Only the one-warp sync kernel ran (no data kernel was loaded).
  mkfake_launch l{};
  CHILD_CHECK(mkfake_fn<decltype(mkfake_last_launch)>("mkfake_last_launch")(&l) == 1);
  CHILD_CHECK(std::string(l.function) == "mk_ce_sync");

  // Reduce-scatter and all-reduce: copy engines carry the tiles, a kernel
  // reduces them (the fake runs it for int32 and uint8); sums wrap like the
  // GPU's; all-reduce chunks of ceil(count / nranks) elements, some empty.
  auto ival = [&](int c, int r, size_t i) { return int32_t(uint32_t(ce_byte(c, r, i)) * 16777619u + uint32_t(i)); };
  std::vector<int32_t> iv(max_count * size_t(nranks));
  for (size_t count : {size_t(1), size_t(2), size_t(16383), size_t(16384), size_t(16385), size_t(3 * 16384 + 77)}) {
    for (int inplace = 0; inplace < 2; ++inplace) {
      for (int which = 0; which < 2; ++which) {  // 0: reduce-scatter, 1: all-reduce
        ++call;
        const size_t in_elems = which == 0 ? count * size_t(nranks) : count;
        for (size_t i = 0; i < in_elems; ++i) iv[i] = ival(call, rank, i);
        CHILD_CHECK(cu().cuMemcpyHtoD(in, iv.data(), in_elems * 4) == CUDA_SUCCESS);
        CHILD_CHECK(poison(out, count * 4));
        void* src = pin;
        void* dst = pout;
        if (inplace) dst = which == 0 ? static_cast<char*>(pin) + size_t(rank) * count * 4 : pin;
        if (which == 0) CHILD_CHECK(mkReduceScatter(src, dst, count, mkInt32, mkSum, comm, stream) == mkSuccess);
        else CHILD_CHECK(mkAllReduce(src, dst, count, mkInt32, mkSum, comm, stream) == mkSuccess);
        CHILD_CHECK(cu().cuStreamSynchronize(stream) == CUDA_SUCCESS);
        CHILD_CHECK(cu().cuMemcpyDtoH(iv.data(), reinterpret_cast<CUdeviceptr>(dst), count * 4) == CUDA_SUCCESS);
        for (size_t i = 0; i < count; ++i) {
          uint32_t want = 0;
          for (int q = 0; q < nranks; ++q) want += uint32_t(ival(call, q, (which == 0 ? size_t(rank) * count : 0) + i));
          if (uint32_t(iv[i]) != want) {
            std::fprintf(stderr, "rank %d: %s count %zu inplace %d: element %zu is %d, want %d\n", rank,
                         which == 0 ? "reducescatter" : "allreduce", count, inplace, i, iv[i], int32_t(want));
            return 1;
          }
        }
      }
    }
  }
  // max on bytes, all-reduce
  {
    ++call;
    const size_t count = 5000;
    CHILD_CHECK(fill(in, count, call));
    CHILD_CHECK(poison(out, count));
    CHILD_CHECK(mkAllReduce(pin, pout, count, mkUint8, mkMax, comm, stream) == mkSuccess);
    CHILD_CHECK(cu().cuStreamSynchronize(stream) == CUDA_SUCCESS);
    CHILD_CHECK(cu().cuMemcpyDtoH(host.data(), out, count) == CUDA_SUCCESS);
    for (size_t i = 0; i < count; ++i) {
      unsigned char want = 0;
      for (int q = 0; q < nranks; ++q) want = std::max(want, ce_byte(call, q, i));
      if (host[i] != want) {
        std::fprintf(stderr, "rank %d: allreduce max byte %zu wrong\n", rank, i);
        return 1;
      }
    }
    CHILD_CHECK(mkfake_fn<decltype(mkfake_last_launch)>("mkfake_last_launch")(&l) == 1);
    CHILD_CHECK(std::string(l.function) == "mk_ce_sync");  // the last op of a call: the consumed signal
  }
  CHILD_CHECK(mkt::counts().launches > launches0);

  // A graph: captured once, replayed with new inputs (the counters live in
  // device memory, so replays continue the sequence). Its all-reduce is the
  // first int32 max (its reduce kernel loads inside the capture, in global
  // mode), and two copy-engine calls share the capture's receive stream.
  const size_t count = 2 * 65536 + 3, rcount = 40000;
  CUdeviceptr rin = 0, rout = 0;
  CHILD_CHECK(cu().cuMemAlloc(&rin, rcount * 4) == CUDA_SUCCESS);
  CHILD_CHECK(cu().cuMemAlloc(&rout, rcount * 4) == CUDA_SUCCESS);
  auto* c = mk::rt::acquire(comm).get();
  const size_t streams_before = c->ce_streams.size();
  CUgraph g = nullptr;
  CUgraphExec x = nullptr;
  CHILD_CHECK(MKT_FN(cuStreamBeginCapture)(stream, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  CHILD_CHECK(mkAllGather(pin, pout, count, mkUint8, comm, stream) == mkSuccess);
  CHILD_CHECK(mkAllReduce(reinterpret_cast<void*>(uintptr_t(rin)), reinterpret_cast<void*>(uintptr_t(rout)), rcount,
                          mkInt32, mkMax, comm, stream) == mkSuccess);
  CHILD_CHECK(MKT_FN(cuStreamEndCapture)(stream, &g) == CUDA_SUCCESS);
  CHILD_CHECK(c->ce_streams.size() <= std::max<size_t>(streams_before, 1) + 1);
  CHILD_CHECK(MKT_FN(cuGraphInstantiate)(&x, g, 0) == CUDA_SUCCESS);
  for (int replay = 0; replay < 3; ++replay) {
    ++call;
    CHILD_CHECK(poison(out, count * size_t(nranks)));
    CHILD_CHECK(fill(in, count, call));
    for (size_t i = 0; i < rcount; ++i) iv[i] = ival(call, rank, i);
    CHILD_CHECK(cu().cuMemcpyHtoD(rin, iv.data(), rcount * 4) == CUDA_SUCCESS);
    CHILD_CHECK(poison(rout, rcount * 4));
    CHILD_CHECK(MKT_FN(cuGraphLaunch)(x, stream) == CUDA_SUCCESS);
    CHILD_CHECK(cu().cuStreamSynchronize(stream) == CUDA_SUCCESS);
    CHILD_CHECK(cu().cuMemcpyDtoH(host.data(), out, count * size_t(nranks)) == CUDA_SUCCESS);
    for (int q = 0; q < nranks; ++q)
      for (size_t i = 0; i < count; ++i)
        if (host[size_t(q) * count + i] != ce_byte(call, q, i)) {
          std::fprintf(stderr, "rank %d: graph replay %d: block %d byte %zu wrong\n", rank, replay, q, i);
          return 1;
        }
    CHILD_CHECK(cu().cuMemcpyDtoH(iv.data(), rout, rcount * 4) == CUDA_SUCCESS);
    for (size_t i = 0; i < rcount; ++i) {
      int32_t want = ival(call, 0, i);
      for (int q = 1; q < nranks; ++q) want = std::max(want, ival(call, q, i));
      if (iv[i] != want) {
        std::fprintf(stderr, "rank %d: graph replay %d: all-reduce max element %zu wrong\n", rank, replay, i);
        return 1;
      }
    }
  }
  CHILD_CHECK(MKT_FN(cuGraphExecDestroy)(x) == CUDA_SUCCESS);
  CHILD_CHECK(MKT_FN(cuGraphDestroy)(g) == CUDA_SUCCESS);
  if (files_under(cache) != cached) {
    std::fprintf(stderr, "rank %d: the calls compiled %zu more kernel(s) after mkCommPrewarm\n", rank,
                 files_under(cache) - cached);
    return 1;
  }
  CHILD_CHECK(cu().cuMemFree(rin) == CUDA_SUCCESS);
  CHILD_CHECK(cu().cuMemFree(rout) == CUDA_SUCCESS);
  CHILD_CHECK(mkCommDestroy(comm) == mkSuccess);
  CHILD_CHECK(cu().cuMemFree(in) == CUDA_SUCCESS);
  CHILD_CHECK(cu().cuMemFree(out) == CUDA_SUCCESS);
  CHILD_CHECK(cu().cuStreamDestroy(stream) == CUDA_SUCCESS);
  return 0;
}

// One thread drives three ranks (mkCommInitAll) with grouped copy-engine
// calls: mkGroupEnd issues the ranks' calls step by step in turn, so a driver
// that runs work as it is enqueued (this fake) never waits for a peer's step
// that was not issued yet; the bytes must come out right.
int copy_engine_group(int rank, int, const mkUniqueId&) {
  g_rank = rank;
  const int n = 3;
  mkComm_t comms[n];
  int devs[n] = {0, 1, 2};
  CHILD_CHECK(mkCommInitAll(comms, n, devs) == mkSuccess);
  std::vector<CUcontext> ctx(n);
  std::vector<CUstream> st(n);
  std::vector<CUdeviceptr> in(n), out(n);
  const size_t count = 2 * 65536 + 99;
  for (int r = 0; r < n; ++r) {
    CHILD_CHECK(cu().cuDevicePrimaryCtxRetain(&ctx[size_t(r)], r) == CUDA_SUCCESS);
    CHILD_CHECK(cu().cuCtxSetCurrent(ctx[size_t(r)]) == CUDA_SUCCESS);
    CHILD_CHECK(cu().cuStreamCreate(&st[size_t(r)], CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    CHILD_CHECK(cu().cuMemAlloc(&in[size_t(r)], count * n) == CUDA_SUCCESS);
    CHILD_CHECK(cu().cuMemAlloc(&out[size_t(r)], count * n + 64) == CUDA_SUCCESS);
  }
  std::vector<unsigned char> host(count * n + 64);
  const size_t top = (count * size_t(n - 1) + 15) / 16 * 16;  // a second output, 16-byte aligned
  // One group a call; then groups of two calls a rank (a broadcast, whose
  // root has no receive side, before an all-gather; an all-reduce before a
  // reduce-scatter): every rank's call takes the same number of steps.
  for (int call = 1; call <= 5; ++call) {
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count * n; ++i) host[i] = ce_byte(call, r, i);
      CHILD_CHECK(cu().cuMemcpyHtoD(in[size_t(r)], host.data(), count * n) == CUDA_SUCCESS);
      CHILD_CHECK(cu().cuMemsetD8(out[size_t(r)], 0xEE, count * n) == CUDA_SUCCESS);
    }
    CHILD_CHECK(mkGroupStart() == mkSuccess);
    for (int r = 0; r < n; ++r) {
      void* i = reinterpret_cast<void*>(uintptr_t(in[size_t(r)]));
      void* o = reinterpret_cast<void*>(uintptr_t(out[size_t(r)]));
      // the second call of a two-call group writes the spare upper part of `out`
      void* o2 = reinterpret_cast<void*>(uintptr_t(out[size_t(r)] + top));
      void* i2 = reinterpret_cast<void*>(uintptr_t(in[size_t(r)] + count));
      if (call == 1) CHILD_CHECK(mkAllGather(i, o, count, mkUint8, comms[r], st[size_t(r)]) == mkSuccess);
      if (call == 2) CHILD_CHECK(mkAllToAll(i, o, count, mkUint8, comms[r], st[size_t(r)]) == mkSuccess);
      if (call == 3) CHILD_CHECK(mkBroadcast(i, o, count, mkUint8, 1, comms[r], st[size_t(r)]) == mkSuccess);
      if (call == 4) {
        CHILD_CHECK(mkBroadcast(i, o2, count, mkUint8, 1, comms[r], st[size_t(r)]) == mkSuccess);
        CHILD_CHECK(mkAllGather(i2, o, count / size_t(n), mkUint8, comms[r], st[size_t(r)]) == mkSuccess);
      }
      if (call == 5) {
        CHILD_CHECK(mkAllReduce(i, o, count / 4, mkInt32, mkSum, comms[r], st[size_t(r)]) == mkSuccess);
        CHILD_CHECK(mkReduceScatter(i, o2, count / 4 / size_t(n), mkInt32, mkSum, comms[r], st[size_t(r)]) ==
                    mkSuccess);
      }
    }
    CHILD_CHECK(mkGroupEnd() == mkSuccess);
    for (int r = 0; r < n; ++r) {
      CHILD_CHECK(cu().cuStreamSynchronize(st[size_t(r)]) == CUDA_SUCCESS);
      CHILD_CHECK(cu().cuMemcpyDtoH(host.data(), out[size_t(r)], count * n + 64) == CUDA_SUCCESS);
      if (call == 4) {  // broadcast of rank 1's first `count` bytes into the top; all-gather of the next count/n
        const size_t per = count / size_t(n);
        for (size_t k = 0; k < count; ++k)
          if (host[top + k] != ce_byte(call, 1, k)) {
            std::fprintf(stderr, "call 4 rank %d: broadcast byte %zu wrong\n", r, k);
            return 1;
          }
        for (int q = 0; q < n; ++q)
          for (size_t k = 0; k < per; ++k)
            if (host[size_t(q) * per + k] != ce_byte(call, q, count + k)) {
              std::fprintf(stderr, "call 4 rank %d: all-gather block %d byte %zu wrong\n", r, q, k);
              return 1;
            }
        continue;
      }
      if (call == 5) {  // int32 sums of everyone's input words (wrapping)
        auto word = [&](int q, size_t k) {
          uint32_t w = 0;
          for (int b = 0; b < 4; ++b) w |= uint32_t(ce_byte(call, q, 4 * k + size_t(b))) << (8 * b);
          return w;
        };
        auto got = [&](size_t at) {
          uint32_t w;
          std::memcpy(&w, host.data() + at, 4);
          return w;
        };
        const size_t words = count / 4, per = words / size_t(n);
        for (size_t k = 0; k < words; ++k) {
          uint32_t want = 0;
          for (int q = 0; q < n; ++q) want += word(q, k);
          if (got(4 * k) != want) {
            std::fprintf(stderr, "call 5 rank %d: all-reduce word %zu wrong\n", r, k);
            return 1;
          }
        }
        for (size_t k = 0; k < per; ++k) {
          uint32_t want = 0;
          for (int q = 0; q < n; ++q) want += word(q, size_t(r) * per + k);
          if (got(top + 4 * k) != want) {
            std::fprintf(stderr, "call 5 rank %d: reduce-scatter word %zu wrong\n", r, k);
            return 1;
          }
        }
        continue;
      }
      const int blocks = call == 3 ? 1 : n;
      for (int q = 0; q < blocks; ++q)
        for (size_t i = 0; i < count; ++i) {
          const unsigned char want = call == 1   ? ce_byte(call, q, i)
                                     : call == 2 ? ce_byte(call, q, size_t(r) * count + i)
                                                 : ce_byte(call, 1, i);
          if (host[size_t(q) * count + i] != want) {
            std::fprintf(stderr, "call %d rank %d block %d byte %zu wrong\n", call, r, q, i);
            return 1;
          }
        }
    }
  }
  for (int r = 0; r < n; ++r) CHILD_CHECK(mkCommDestroy(comms[r]) == mkSuccess);
  return 0;
}

// Copy-engine scratch that does not fit (MK_SCRATCH_BYTES=1 MiB, the default
// tile 16 MiB at one rank: 48 MiB): a clear error saying what to change.
int copy_engine_scratch(int rank, int nranks, const mkUniqueId& id) {
  CUstream stream = nullptr;
  mkComm_t comm = nullptr;
  if (open_rank(rank, nranks, id, &stream, &comm)) return 1;
  CUdeviceptr buf = 0;
  CHILD_CHECK(cu().cuMemAlloc(&buf, 1 << 16) == CUDA_SUCCESS);
  void* in = reinterpret_cast<void*>(uintptr_t(buf));
  void* out = reinterpret_cast<void*>(uintptr_t(buf + (1 << 15)));
  CHILD_CHECK(mkAllGather(in, out, 1 << 14, mkUint8, comm, stream) == mkSystemError);
  const std::string msg = mkGetLastError(comm);
  std::fprintf(stderr, "%s\n", msg.c_str());
  CHILD_CHECK(msg.find("symmetric scratch exhausted: the copy-engine path needs 50331648 more bytes (1 ranks x 3 "
                       "slots x tile 16777216)") != std::string::npos);
  CHILD_CHECK(msg.find("raise MK_SCRATCH_BYTES or lower MK_TUNE=ce_tile (on every rank)") != std::string::npos);
  CHILD_CHECK(mkCommDestroy(comm) == mkSuccess);
  CHILD_CHECK(cu().cuMemFree(buf) == CUDA_SUCCESS);
  return 0;
}

// A peer that never makes the call: the copy-engine transfer's wait is
// bounded (MK_TIMEOUT_MS), the error is sticky and names the side, the tile
// and the peer; the peer aborts and leaves.
int copy_engine_stall(int rank, int nranks, const mkUniqueId& id) {
  CUstream stream = nullptr;
  mkComm_t comm = nullptr;
  if (open_rank(rank, nranks, id, &stream, &comm)) return 1;
  auto* c = mk::rt::acquire(comm).get();
  CUdeviceptr in = 0, out = 0;
  CHILD_CHECK(cu().cuMemAlloc(&in, 1 << 16) == CUDA_SUCCESS);
  CHILD_CHECK(cu().cuMemAlloc(&out, 1 << 17) == CUDA_SUCCESS);
  if (rank == 0) {
    const auto t0 = std::chrono::steady_clock::now();
    CHILD_CHECK(mkAllGather(reinterpret_cast<void*>(uintptr_t(in)), reinterpret_cast<void*>(uintptr_t(out)), 1 << 16,
                            mkUint8, comm, stream) == mkSuccess);
    CHILD_CHECK(cu().cuStreamSynchronize(stream) == CUDA_SUCCESS);
    CHILD_CHECK(mkt::ms_since(t0) < 20000);
    mkResult_t async = mkSuccess;
    CHILD_CHECK(mkCommGetAsyncError(comm, &async) == mkSuccess);
    CHILD_CHECK(async == mkRemoteError);
    const std::string msg = mkGetLastError(comm);
    std::fprintf(stderr, "%s\n", msg.c_str());
    CHILD_CHECK(msg.find("copy-engine transfer's send side waited") != std::string::npos ||
                msg.find("copy-engine transfer's receive side waited") != std::string::npos);
    CHILD_CHECK(msg.find("for rank 1") != std::string::npos);
    CHILD_CHECK(msg.find("allgather.ce") != std::string::npos);
    // sticky: the next call fails at once
    CHILD_CHECK(mkAllGather(reinterpret_cast<void*>(uintptr_t(in)), reinterpret_cast<void*>(uintptr_t(out)), 1 << 16,
                            mkUint8, comm, stream) == mkRemoteError);
  }
  c->boot->barrier();
  CHILD_CHECK(mkCommAbort(comm) == mkSuccess);
  CHILD_CHECK(cu().cuMemFree(in) == CUDA_SUCCESS);
  CHILD_CHECK(cu().cuMemFree(out) == CUDA_SUCCESS);
  return 0;
}

// mkCommBootstrapBroadcast: rank 0's bytes reach every rank; bad arguments
// fail on the rank that passed them, before any exchange.
int bootstrap_broadcast(int rank, int nranks, const mkUniqueId& id) {
  g_rank = rank;
  CUcontext ctx = nullptr;
  CHILD_CHECK(cu().cuDevicePrimaryCtxRetain(&ctx, rank) == CUDA_SUCCESS);
  CHILD_CHECK(cu().cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
  mkComm_t comm = nullptr;
  CHILD_CHECK(mkCommInitRank(&comm, nranks, id, rank) == mkSuccess);
  unsigned char buf[128];
  for (int i = 0; i < 128; ++i) buf[i] = rank == 0 ? (unsigned char)(i * 7 + 3) : 0;
  CHILD_CHECK(mkCommBootstrapBroadcast(comm, buf, sizeof buf, 0) == mkSuccess);
  for (int i = 0; i < 128; ++i) CHILD_CHECK(buf[i] == (unsigned char)(i * 7 + 3));
  CHILD_CHECK(mkCommBootstrapBroadcast(comm, buf, sizeof buf, nranks) == mkInvalidArgument);
  CHILD_CHECK(std::string(mkGetLastError(comm)).find("root 2 is not a rank of 2") != std::string::npos);
  static unsigned char big[5000];
  CHILD_CHECK(mkCommBootstrapBroadcast(comm, big, sizeof big, 0) == mkInvalidArgument);
  CHILD_CHECK(mkCommBootstrapBroadcast(comm, nullptr, 8, 0) == mkInvalidArgument);
  CHILD_CHECK(mkCommDestroy(comm) == mkSuccess);
  return 0;
}

// The links between GPUs of one node, learnt at init (MKFAKE_LINK says what
// the fake driver answers) and given to the compiler: the communicator's
// topology and the selection table's "intra" key (MK_SELECT_FILE has an
// entry for PCIe nodes only). MKT_LINK: what to expect.
int machine_links(int rank, int nranks, const mkUniqueId& id) {
  g_rank = rank;
  if (use_gpu(rank)) return 1;
  const char* want = std::getenv("MKT_LINK");
  CHILD_CHECK(want != nullptr);
  const bool pcie = std::string(want) == "pcie";
  mkComm_t comm = nullptr;
  CHILD_CHECK(mkCommInitRank(&comm, nranks, id, rank) == mkSuccess);
  auto c = mk::rt::acquire(comm);
  CHILD_CHECK(c->machine.link(0, 1) == (pcie ? mk::rt::PairLink::pcie : mk::rt::PairLink::nvlink));
  CHILD_CHECK(c->topo == mk::topology::single(nranks, pcie ? mk::topology::Link::pcie : mk::topology::Link::nvlink));
  CUdeviceptr buf = 0;
  CHILD_CHECK(cu().cuMemAlloc(&buf, 4096) == CUDA_SUCCESS);
  void* p = reinterpret_cast<void*>(uintptr_t(buf));
  CHILD_CHECK(mkAllReduce(p, p, 250, mkFloat32, mkSum, comm, nullptr) == mkSuccess);
  const mk::rt::PlanInstance* inst = nullptr;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    inst = c->find(mk::Collective::allreduce, mk::DType::fp32, mk::RedOp::sum, 1000, false);
  }
  CHILD_CHECK(inst != nullptr);
  std::fprintf(stderr, "rank %d: %s plan %s for %s\n", rank, pcie ? "PCIe" : "NVLink", inst->plan->schedule.c_str(),
               (inst->plan->topology ? inst->plan->topology->name() : std::string("one NVLink node")).c_str());
  CHILD_CHECK(inst->plan->schedule == (pcie ? "allreduce.ring" : "allreduce.one_shot"));
  // one node, whatever its link: built without a topology, as before (the
  // shipped plans' keys; lowering does not read the link, selection does)
  CHILD_CHECK(!inst->plan->topology.has_value());
  CHILD_CHECK(cu().cuMemFree(buf) == CUDA_SUCCESS);
  c.reset();
  CHILD_CHECK(mkCommDestroy(comm) == mkSuccess);
  return 0;
}

// Rank 0's process ends while it is part of a split's first round (it sent
// its part from a nonblocking split); rank 1 waits in that round and rank 2
// comes later. Both fail within about a second, naming rank 0, instead of
// waiting MK_BOOTSTRAP_TIMEOUT_MS (20 s here), and still destroy cleanly.
int split_peer_exit(int rank, int nranks, const mkUniqueId& id) {
  g_rank = rank;
  if (use_gpu(rank)) return 1;
  mkComm_t comm = nullptr;
  CHILD_CHECK(mkCommInitRank(&comm, nranks, id, rank) == mkSuccess);
  mk::rt::acquire(comm)->boot->barrier();
  if (rank == 0) {
    mkConfig_t cfg = MK_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    mkComm_t child = nullptr;
    CHILD_CHECK(mkCommSplit(comm, 0, 0, &child, &cfg) == mkInProgress);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    _exit(0);  // no destroy: the process just ends
  }
  if (rank == 2) std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto t0 = std::chrono::steady_clock::now();
  mkComm_t child = nullptr;
  const mkResult_t r = mkCommSplit(comm, 0, 0, &child, nullptr);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  const std::string msg = mkGetLastError(comm);
  if (r != mkRemoteError || ms >= mkt::bound_ms(3000))
    std::fprintf(stderr, "rank %d: the split returned %d after %lld ms: %s\n", rank, int(r), (long long)ms, msg.c_str());
  CHILD_CHECK(r == mkRemoteError);
  CHILD_CHECK(child == nullptr);
  CHILD_CHECK(ms < mkt::bound_ms(3000));
  CHILD_CHECK(msg.find("rank 0's connection closed (process ended or communicator destroyed)") != std::string::npos);
  CHILD_CHECK(mkCommDestroy(comm) == mkSuccess);
  return 0;
}

// Ranks on two "nodes" (MK_HOST_ID: node-a or node-b as MKT_PLACEMENT says,
// node-major or not) with config spanNodes = MK_SPAN_NODES_BOOTSTRAP: every rank gets a
// bootstrap-only communicator that refuses what needs a transport, clearly;
// its bootstrap works; a split by node gives full communicators that run
// collectives; nothing leaks.
// Ranks on two (MK_HOST_ID) nodes with MK_NET=socket: a full communicator
// whose ranks of the other node are reached through the network proxy. The
// fake driver runs no kernel, so this checks the wiring: init, a plan across
// nodes compiled and loaded with its connections made, Args::net set, the
// peers' connections accepted, an abort reaching the other node's proxy
// (loopback TCP; a GPU moves the data, tests/gpu).
// Waits (at most 10 s) until a connection from another node has arrived at
// this rank's proxy; true when one did.
bool net_accepted(const mk::rt::Proxy& p) {
  const auto t0 = std::chrono::steady_clock::now();
  while (p.stats().recv_conns == 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10))
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return p.stats().recv_conns > 0;
}

// A rank of a communicator across MK_NET nodes whose first all-reduce (1 MiB,
// in place) was issued: its plan's connections are made.
int net_start(int rank, int nranks, const mkUniqueId& id, CUstream* stream, mkComm_t* comm, CUdeviceptr* buf) {
  CHILD_CHECK(cu().cuStreamCreate(stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CHILD_CHECK(mkCommInitRank(comm, nranks, id, rank) == mkSuccess);
  CHILD_CHECK(cu().cuMemAlloc(buf, 1 << 20) == CUDA_SUCCESS);
  CHILD_CHECK(mkAllReduce(reinterpret_cast<void*>(uintptr_t(*buf)), reinterpret_cast<void*>(uintptr_t(*buf)), 1 << 18,
                          mkFloat32, mkSum, *comm, *stream) == mkSuccess);
  return 0;
}

int net_span(int rank, int nranks, const mkUniqueId& id) {
  g_rank = rank;
  if (use_gpu(rank)) return 1;
  CUstream stream = nullptr;
  CHILD_CHECK(cu().cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  mkComm_t comm = nullptr;
  CHILD_CHECK(mkCommInitRank(&comm, nranks, id, rank) == mkSuccess);
  int nodes = 0, only = 1;
  CHILD_CHECK(mkCommNodeCount(comm, &nodes) == mkSuccess && nodes == 2);
  CHILD_CHECK(mkCommIsBootstrapOnly(comm, &only) == mkSuccess && only == 0);
  auto c = mk::rt::acquire(comm);
  CHILD_CHECK(c->spans_network && c->proxy != nullptr);
  CHILD_CHECK(c->topo.nodes == 2 && c->topo.gpus_per_node == nranks / 2);
  const int local = nranks / 2;
  for (int r = 0; r < nranks; ++r)  // memory reaches this node's ranks only
    CHILD_CHECK((c->peer_base[size_t(r)] != 0) == (r / local == rank / local));
  CUdeviceptr buf = 0;
  CHILD_CHECK(cu().cuMemAlloc(&buf, 1 << 20) == CUDA_SUCCESS);
  CHILD_CHECK(mkAllReduce(reinterpret_cast<void*>(uintptr_t(buf)), reinterpret_cast<void*>(uintptr_t(buf)), 1 << 18,
                          mkFloat32, mkSum, comm, stream) == mkSuccess);
  mkfake_launch l{};
  CHILD_CHECK(mkfake_fn<decltype(mkfake_last_launch)>("mkfake_last_launch")(&l) == 1);
  CHILD_CHECK(l.args.net != nullptr);  // a plan across nodes, with its connection table
  if (local > 1) {  // a root that is not a node's first rank: refused clearly (relabelling would break the shape)
    CHILD_CHECK(mkBroadcast(reinterpret_cast<void*>(uintptr_t(buf)), reinterpret_cast<void*>(uintptr_t(buf)), 16,
                            mkFloat32, 1, comm, stream) == mkInvalidUsage);
    CHILD_CHECK(std::string(mkGetLastError(comm)).find("a root on a node's first rank") != std::string::npos);
  }
  const auto st = c->proxy->stats();
  CHILD_CHECK(st.send_conns > 0);
  // Every (instance, block) FIFO to a peer shares one transport connection
  // per put size: far fewer connections than FIFOs.
  CHILD_CHECK(st.wires > 0 && st.wires <= 2 * (nranks / 2) && st.wires < st.send_conns);
  // Every rank's connections arrive at their peers (the other node's ranks).
  CHILD_CHECK(net_accepted(*c->proxy));
  CHILD_CHECK(c->proxy->error().empty());
  CHILD_CHECK(mkCommBootstrapBroadcast(comm, &nodes, sizeof nodes, 0) == mkSuccess);  // everyone got this far
  if (rank == 0) {
    CHILD_CHECK(mkCommAbort(comm) == mkSuccess);
    return 0;
  }
  // Rank 0's abort reaches every rank within seconds: its node's ranks
  // through their abort words, its peer on the other node as its connections
  // close (that rank's proxy fails naming rank 0 and aborts in turn), the
  // rest of that node through their abort words. A call shows it (the fake
  // driver's kernels stop at entry on a raised abort word).
  mkResult_t async = mkSuccess;
  const auto t1 = std::chrono::steady_clock::now();
  while (async == mkSuccess && std::chrono::steady_clock::now() - t1 < std::chrono::seconds(10)) {
    mkAllReduce(reinterpret_cast<void*>(uintptr_t(buf)), reinterpret_cast<void*>(uintptr_t(buf)), 1 << 18, mkFloat32,
                mkSum, comm, stream);
    CHILD_CHECK(mkCommGetAsyncError(comm, &async) == mkSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CHILD_CHECK(async == mkRemoteError);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
  std::fprintf(stderr, "rank %d learnt of rank 0's abort after %.0f ms: %s\n", rank, ms, mkGetLastError(comm));
  if (rank == local)  // rank 0's peer across nodes: its proxy names rank 0
    CHILD_CHECK(std::string(mkGetLastError(comm)).find("rank 0") != std::string::npos);
  mkCommAbort(comm);
  return 0;
}

// A plain destroy on one node is no failure for the other: its proxy sends
// what was committed and a goodbye on every connection, so the peer's proxy
// retires them instead of reporting a closed connection.
int net_destroy(int rank, int nranks, const mkUniqueId& id) {
  g_rank = rank;
  if (use_gpu(rank)) return 1;
  CUstream stream = nullptr;
  mkComm_t comm = nullptr;
  CUdeviceptr buf = 0;
  if (net_start(rank, nranks, id, &stream, &comm, &buf) != 0) return 1;
  net_accepted(*mk::rt::acquire(comm)->proxy);  // every rank's connections are up
  int x = 0;
  CHILD_CHECK(mkCommBootstrapBroadcast(comm, &x, sizeof x, 0) == mkSuccess);
  if (rank == 0) {
    CHILD_CHECK(mkCommDestroy(comm) == mkSuccess);
    return 0;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // rank 0 is gone by now
  mkResult_t async = mkInProgress;
  CHILD_CHECK(mkCommGetAsyncError(comm, &async) == mkSuccess);
  CHILD_CHECK(async == mkSuccess);
  CHILD_CHECK(mkCommDestroy(comm) == mkSuccess);
  return 0;
}

// MK_NET=auto: ranks whose env says MKT_VERBS=1 have a (fake) RDMA device;
// a connection uses verbs when both ends have one, the socket transport
// otherwise. One rank per node; the connections are what an all-reduce's
// plan makes (its goodbyes on destroy cross both kinds).
int net_auto(int rank, int nranks, const mkUniqueId& id) {
  g_rank = rank;
  if (use_gpu(rank)) return 1;
  CUstream stream = nullptr;
  mkComm_t comm = nullptr;
  CUdeviceptr buf = 0;
  if (net_start(rank, nranks, id, &stream, &comm, &buf) != 0) return 1;
  auto has_verbs = [](int r) { return std::string(std::getenv("MKT_VERBS_RANKS")).find(char('0' + r)) != std::string::npos; };
  auto c = mk::rt::acquire(comm);
  CHILD_CHECK(c->nets.size() == 2 && (c->nets[0] != nullptr) == has_verbs(rank) && c->nets[1] != nullptr);
  const auto kinds = c->proxy->send_transports();
  CHILD_CHECK(!kinds.empty());
  for (auto [peer, kind] : kinds) {
    std::fprintf(stderr, "rank %d -> rank %d: %s\n", rank, peer, kind == 0 ? "verbs" : "socket");
    CHILD_CHECK(kind == (has_verbs(rank) && has_verbs(peer) ? 0 : 1));
  }
  CHILD_CHECK(net_accepted(*c->proxy));  // every rank's connections arrive
  CHILD_CHECK(c->proxy->error().empty());
  c.reset();
  int x = 0;
  CHILD_CHECK(mkCommBootstrapBroadcast(comm, &x, sizeof x, 0) == mkSuccess);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the hellos have landed everywhere
  mkResult_t async = mkInProgress;
  CHILD_CHECK(mkCommGetAsyncError(comm, &async) == mkSuccess);
  CHILD_CHECK(async == mkSuccess);
  CHILD_CHECK(mkCommBootstrapBroadcast(comm, &x, sizeof x, 0) == mkSuccess);
  CHILD_CHECK(mkCommDestroy(comm) == mkSuccess);
  return 0;
}

// mkCommShrink: the last rank leaves without a word (its process ends);
// the others get a communicator without it, which runs, and bad exclude
// lists are refused without touching anyone.
int shrink(int rank, int nranks, const mkUniqueId& id) {
  g_rank = rank;
  if (use_gpu(rank)) return 1;
  CUstream stream = nullptr;
  CHILD_CHECK(cu().cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  mkComm_t comm = nullptr;
  CHILD_CHECK(mkCommInitRank(&comm, nranks, id, rank) == mkSuccess);
  int x = 0;
  CHILD_CHECK(mkCommBootstrapBroadcast(comm, &x, sizeof x, 0) == mkSuccess);
  const int gone = nranks - 1;
  // dies (no destroy, no goodbye) once the others surely finished that
  // broadcast: a process that ends without a word fails an exchange still
  // in progress elsewhere (its count of completed ones is unknown)
  if (rank == gone) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    _exit(0);
  }
  mkComm_t bad = reinterpret_cast<mkComm_t>(uintptr_t(1));
  int self[1] = {rank}, outside[1] = {nranks}, twice[2] = {gone, gone}, list[1] = {gone};
  CHILD_CHECK(mkCommShrink(comm, self, 1, &bad, nullptr, MK_SHRINK_DEFAULT) == mkInvalidArgument);
  CHILD_CHECK(std::string(mkGetLastError(comm)).find("in its own exclude list") != std::string::npos);
  CHILD_CHECK(bad == nullptr);
  CHILD_CHECK(mkCommShrink(comm, outside, 1, &bad, nullptr, MK_SHRINK_DEFAULT) == mkInvalidArgument);
  CHILD_CHECK(mkCommShrink(comm, twice, 2, &bad, nullptr, MK_SHRINK_DEFAULT) == mkInvalidArgument);
  CHILD_CHECK(mkCommShrink(comm, list, 1, &bad, nullptr, 7) == mkInvalidArgument);
  CHILD_CHECK(mkCommShrink(comm, nullptr, 1, &bad, nullptr, MK_SHRINK_DEFAULT) == mkInvalidArgument);
  mkComm_t small = nullptr;
  CHILD_CHECK(mkCommShrink(comm, list, 1, &small, nullptr, MK_SHRINK_ABORT) == mkSuccess);
  int n = 0, me = -1;
  CHILD_CHECK(mkCommCount(small, &n) == mkSuccess && n == nranks - 1);
  CHILD_CHECK(mkCommUserRank(small, &me) == mkSuccess && me == rank);
  x = rank == 0 ? 4242 : 0;
  CHILD_CHECK(mkCommBootstrapBroadcast(small, &x, sizeof x, 0) == mkSuccess && x == 4242);
  CUdeviceptr buf = 0;
  CHILD_CHECK(cu().cuMemAlloc(&buf, 1 << 20) == CUDA_SUCCESS);
  CHILD_CHECK(mkAllReduce(reinterpret_cast<void*>(uintptr_t(buf)), reinterpret_cast<void*>(uintptr_t(buf)), 1 << 16,
                          mkFloat32, mkSum, small, stream) == mkSuccess);
  mkfake_launch l{};
  CHILD_CHECK(mkfake_fn<decltype(mkfake_last_launch)>("mkfake_last_launch")(&l) == 1);
  CHILD_CHECK(l.args.rank == rank);
  CHILD_CHECK(mkCommBootstrapBroadcast(small, &x, sizeof x, 0) == mkSuccess);
  CHILD_CHECK(mkCommDestroy(small) == mkSuccess);
  mkCommAbort(comm);
  return 0;
}

int span_bootstrap(int rank, int nranks, const mkUniqueId& id) {
  g_rank = rank;
  mkfake_counts before{};
  mkfake_fn<decltype(mkfake_get_counts)>("mkfake_get_counts")(&before);
  if (use_gpu(rank)) return 1;
  CUstream stream = nullptr;
  CHILD_CHECK(cu().cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  mkConfig_t cfg = MK_CONFIG_INITIALIZER;
  cfg.spanNodes = MK_SPAN_NODES_BOOTSTRAP;
  cfg.blocking = rank % 2 == 1 ? 0 : 1;  // odd ranks: nonblocking init, polled until done
  mkComm_t comm = nullptr;
  const mkResult_t made = mkCommInitRankConfig(&comm, nranks, id, rank, &cfg);
  CHILD_CHECK(made == (rank % 2 == 1 ? mkInProgress : mkSuccess) || made == mkSuccess);
  for (mkResult_t st = mkInProgress; st == mkInProgress;) {
    CHILD_CHECK(mkCommGetAsyncError(comm, &st) == mkSuccess);
    CHILD_CHECK(st == mkSuccess || st == mkInProgress);
    if (st == mkInProgress) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  int nodes = 0, only = 0, n = 0;
  CHILD_CHECK(mkCommNodeCount(comm, &nodes) == mkSuccess && nodes == 2);
  CHILD_CHECK(mkCommIsBootstrapOnly(comm, &only) == mkSuccess && only == 1);
  CHILD_CHECK(mkCommCount(comm, &n) == mkSuccess && n == nranks);
  CHILD_CHECK(mk::rt::acquire(comm)->arena->base() == 0);  // its symmetric memory went back at init
  // The machine every rank learnt at init: MKT_PLACEMENT ("aabb", "abab")
  // names each rank's node; nodes are numbered by their lowest rank, local
  // indices in rank order, and the node-major order lists node 0's ranks first.
  const char* placed = std::getenv("MKT_PLACEMENT");
  CHILD_CHECK(placed != nullptr);
  const std::string placement = placed;
  CHILD_CHECK(int(placement.size()) == nranks);
  const bool uneven = std::count(placement.begin(), placement.end(), 'a') * 2 != nranks;
  if (uneven) {
    // nodes of different rank counts: a bootstrap all the same, and the
    // machine's node-major shape refused by name (what plans across nodes
    // would need), never a hang
    const mk::rt::Machine& m = mk::rt::acquire(comm)->machine;
    CHILD_CHECK(m.nodes == 2 && !m.uniform() && m.ranks_per_node() == -1);
    std::string why;
    try {
      (void)m.topology();
    } catch (const mk::rt::RtError& e) {
      why = e.what();
    }
    CHILD_CHECK(why.find("different numbers of ranks: node 'node-a' has") != std::string::npos);
  } else {
    const mk::rt::Machine& m = mk::rt::acquire(comm)->machine;
    CHILD_CHECK(m.nodes == 2 && m.uniform() && m.ranks_per_node() == nranks / 2);
    std::vector<int> order;
    for (char node : {placement[0], placement[0] == 'a' ? 'b' : 'a'})
      for (int r = 0; r < nranks; ++r)
        if (placement[size_t(r)] == node) order.push_back(r);
    CHILD_CHECK(m.order == order);
    CHILD_CHECK(m.node_major() == (placement == "aabb"));
    for (int r = 0; r < nranks; ++r) {
      CHILD_CHECK(m.node_of[size_t(r)] == (placement[size_t(r)] == placement[0] ? 0 : 1));
      CHILD_CHECK(m.order[size_t(m.position[size_t(r)])] == r);
      CHILD_CHECK(m.local_of[size_t(r)] == int(std::count(placement.begin(), placement.begin() + r, placement[size_t(r)])));
      CHILD_CHECK(m.node_name[size_t(m.node_of[size_t(r)])] == std::string("node-") + placement[size_t(r)]);
    }
    const auto t = m.topology();
    CHILD_CHECK(t.nodes == 2 && t.gpus_per_node == nranks / 2);
  }
  CUdeviceptr buf = 0;
  CHILD_CHECK(cu().cuMemAlloc(&buf, 4096) == CUDA_SUCCESS);
  void* p = reinterpret_cast<void*>(uintptr_t(buf));
  const int64_t launches = mkt::counts().launches;
  auto refused = [&](mkResult_t r, const char* api) {
    const std::string msg = mkGetLastError(comm);
    CHILD_CHECK(r == mkInvalidUsage);
    CHILD_CHECK(msg.find(api) != std::string::npos);
    CHILD_CHECK(msg.find("spans 2 nodes and is bootstrap-only") != std::string::npos);
    return 0;
  };
  if (refused(mkAllReduce(p, p, 64, mkFloat32, mkSum, comm, stream), "mkAllReduce")) return 1;
  if (refused(mkAllGather(p, p, 8, mkFloat32, comm, stream), "mkAllGather")) return 1;
  void* handle = nullptr;
  if (refused(mkCommRegister(comm, p, 4096, &handle), "mkCommRegister")) return 1;
  mkRedOp_t pm = mkSum;
  float scale = 0.5f;
  if (refused(mkRedOpCreatePreMulSum(&pm, &scale, mkFloat32, mkScalarHostImmediate, comm), "mkRedOpCreatePreMulSum"))
    return 1;
  const mkDataType_t dt = mkFloat32;
  if (refused(mkCommPrewarm(comm, &dt, 1, nullptr, 0, 1), "mkCommPrewarm")) return 1;
  CHILD_CHECK(mkt::counts().launches == launches);
  // A refusal is not a communicator error: it still works as a bootstrap.
  mkResult_t async = mkInternalError;
  CHILD_CHECK(mkCommGetAsyncError(comm, &async) == mkSuccess && async == mkSuccess);
  int32_t word = rank == 0 ? 4242 : 0;
  CHILD_CHECK(mkCommBootstrapBroadcast(comm, &word, sizeof word, 0) == mkSuccess);
  CHILD_CHECK(word == 4242);
  // Split by node (splitShare asked for: ignored, there is nothing to share).
  mkConfig_t share = MK_CONFIG_INITIALIZER;
  share.splitShare = 1;
  const int node = placement[size_t(rank)] == 'a' ? 0 : 1;
  const int on_node = int(std::count(placement.begin(), placement.end(), placement[size_t(rank)]));
  mkComm_t local = nullptr;
  CHILD_CHECK(mkCommSplit(comm, node, rank, &local, &share) == mkSuccess);
  CHILD_CHECK(mkCommNodeCount(local, &nodes) == mkSuccess && nodes == 1);
  CHILD_CHECK(mkCommIsBootstrapOnly(local, &only) == mkSuccess && only == 0);
  CHILD_CHECK(mkCommCount(local, &n) == mkSuccess && n == on_node);
  // what its plans are compiled for: one NVLink node of its ranks
  CHILD_CHECK(mk::rt::acquire(local)->topo == mk::topology::single(on_node));
  CHILD_CHECK(mkAllReduce(p, p, 64, mkFloat32, mkSum, local, stream) == mkSuccess);
  CHILD_CHECK(mkt::counts().launches == launches + 1);
  CHILD_CHECK(cu().cuStreamSynchronize(stream) == CUDA_SUCCESS);
  CHILD_CHECK(mkCommDestroy(local) == mkSuccess);
  CHILD_CHECK(mkCommFinalize(comm) == mkSuccess);  // nothing ran on it: nothing to wait for
  CHILD_CHECK(mkCommDestroy(comm) == mkSuccess);
  CHILD_CHECK(cu().cuMemFree(buf) == CUDA_SUCCESS);
  CHILD_CHECK(cu().cuStreamDestroy(stream) == CUDA_SUCCESS);
  CHILD_CHECK(cu().cuDevicePrimaryCtxRelease(rank) == CUDA_SUCCESS);
  CHILD_CHECK(leak_free(before));
  return 0;
}

// spanNodes must be the same on every rank.
int span_differs(int rank, int nranks, const mkUniqueId& id) {
  if (use_gpu(rank)) return 1;
  mkConfig_t cfg = MK_CONFIG_INITIALIZER;
  cfg.spanNodes = rank == 0 ? MK_SPAN_NODES_BOOTSTRAP : MK_SPAN_NODES_FAIL;
  mkComm_t comm = nullptr;
  CHILD_CHECK(mkCommInitRankConfig(&comm, nranks, id, rank, &cfg) == mkInvalidUsage);
  const std::string msg = mkGetLastError(nullptr);
  std::fprintf(stderr, "rank %d: %s\n", rank, msg.c_str());
  CHILD_CHECK(msg.find("ranks disagree on the communicator's spanNodes (config): rank 0 has '1', rank 1 has '0'") !=
              std::string::npos);
  CHILD_CHECK(comm == nullptr);
  return 0;
}

#ifdef MKT_SHIM
// This rank's GPU current, mKernel's libnccl.so.2 opened over the stand-in
// NCCL (MKT_FAKE_NCCL), and its ncclCommInitRank called with mKernel's id.
int open_shim_comm(int rank, int nranks, const mkUniqueId& id, void** h, ncclComm_t* comm) {
  g_rank = rank;
  CUcontext ctx = nullptr;
  CHILD_CHECK(cu().cuDevicePrimaryCtxRetain(&ctx, rank) == CUDA_SUCCESS);
  CHILD_CHECK(cu().cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
  setenv("MK_LIBMKERNEL", MKT_LIBMKERNEL, 1);
  setenv("MK_NCCL_LIB", MKT_FAKE_NCCL, 1);
  *h = dlopen(MKT_SHIM, RTLD_NOW | RTLD_LOCAL);
  CHILD_CHECK(*h != nullptr);
  using Init = ncclResult_t (*)(ncclComm_t*, int, ncclUniqueId, int);
  auto init = reinterpret_cast<Init>(dlsym(*h, "ncclCommInitRank"));
  CHILD_CHECK(init != nullptr);
  ncclUniqueId nid;
  memcpy(&nid, &id, sizeof nid);
  CHILD_CHECK(init(comm, nranks, nid, rank) == ncclSuccess);
  return 0;
}

// The stand-in NCCL's log of calls so far.
std::string fake_nccl_log() {
  void* fake = dlopen(MKT_FAKE_NCCL, RTLD_NOW | RTLD_LOCAL);
  auto log = fake ? reinterpret_cast<const char* (*)(int)>(dlsym(fake, "mkt_fake_nccl_log")) : nullptr;
  return log ? log(0) : "(mkt_fake_nccl_log not found)";
}

// Across MK_NET nodes of two ranks: a broadcast or reduce whose root is not
// a node's first rank goes to NCCL (mKernel refuses such roots there), one
// rooted on a node's first rank stays on mKernel; every rank routes alike.
int shim_net_roots(int rank, int nranks, const mkUniqueId& id) {
  void* h = nullptr;
  ncclComm_t comm = nullptr;
  if (open_shim_comm(rank, nranks, id, &h, &comm) != 0) return 1;
  using Bcast = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  using Reduce = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t);
  using Destroy = ncclResult_t (*)(ncclComm_t);
  auto bcast = reinterpret_cast<Bcast>(dlsym(h, "ncclBroadcast"));
  auto reduce = reinterpret_cast<Reduce>(dlsym(h, "ncclReduce"));
  auto destroy = reinterpret_cast<Destroy>(dlsym(h, "ncclCommDestroy"));
  CHILD_CHECK(bcast && reduce && destroy);
  CUdeviceptr b = 0;
  CHILD_CHECK(cu().cuMemAlloc(&b, 4096) == CUDA_SUCCESS);
  void* p = reinterpret_cast<void*>(uintptr_t(b));
  const int64_t launches = mkt::counts().launches;
  CHILD_CHECK(bcast(p, p, 16, ncclFloat32, 2, comm, nullptr) == ncclSuccess);  // node b's first rank
  CHILD_CHECK(mkt::counts().launches == launches + 1);
  CHILD_CHECK(fake_nccl_log().find("Broadcast") == std::string::npos);
  CHILD_CHECK(bcast(p, p, 16, ncclFloat32, 1, comm, nullptr) == ncclSuccess);  // node a's second rank
  CHILD_CHECK(reduce(p, p, 8, ncclFloat32, ncclSum, 3, comm, nullptr) == ncclSuccess);
  CHILD_CHECK(mkt::counts().launches == launches + 1);  // both on NCCL
  const std::string got = fake_nccl_log();
  CHILD_CHECK(got.find("Broadcast comm=1 count=16 root=1\n") != std::string::npos);
  CHILD_CHECK(got.find("Reduce comm=1 count=8") != std::string::npos);
  CHILD_CHECK(destroy(comm) == ncclSuccess);
  return 0;
}

// ncclCommShrink through mKernel's libnccl.so.2: the last rank dies, the
// others shrink on mKernel (the real NCCL is never asked: it would need
// every rank) and run an all-reduce on the new communicator.
int shim_shrink(int rank, int nranks, const mkUniqueId& id) {
  void* h = nullptr;
  ncclComm_t comm = nullptr;
  if (open_shim_comm(rank, nranks, id, &h, &comm) != 0) return 1;
  using Shrink = ncclResult_t (*)(ncclComm_t, int*, int, ncclComm_t*, ncclConfig_t*, int);
  using AllReduce = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
  using Count = ncclResult_t (*)(const ncclComm_t, int*);
  using Destroy = ncclResult_t (*)(ncclComm_t);
  auto shrink = reinterpret_cast<Shrink>(dlsym(h, "ncclCommShrink"));
  auto allreduce = reinterpret_cast<AllReduce>(dlsym(h, "ncclAllReduce"));
  auto count = reinterpret_cast<Count>(dlsym(h, "ncclCommCount"));
  auto destroy = reinterpret_cast<Destroy>(dlsym(h, "ncclCommDestroy"));
  auto abort_ = reinterpret_cast<Destroy>(dlsym(h, "ncclCommAbort"));
  CHILD_CHECK(shrink && allreduce && count && destroy && abort_);
  CUdeviceptr b = 0;
  CHILD_CHECK(cu().cuMemAlloc(&b, 4096) == CUDA_SUCCESS);
  void* p = reinterpret_cast<void*>(uintptr_t(b));
  CHILD_CHECK(allreduce(p, p, 16, ncclFloat32, ncclSum, comm, nullptr) == ncclSuccess);
  const int gone = nranks - 1;
  if (rank == gone) {  // (after the others' all-reduce launched: it needs no exchange)
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    _exit(0);
  }
  int list[1] = {gone};
  ncclComm_t small = nullptr;
  CHILD_CHECK(shrink(comm, list, 1, &small, nullptr, NCCL_SHRINK_ABORT) == ncclSuccess);
  int n = 0;
  CHILD_CHECK(count(small, &n) == ncclSuccess && n == nranks - 1);
  CHILD_CHECK(allreduce(p, p, 16, ncclFloat32, ncclSum, small, nullptr) == ncclSuccess);
  CHILD_CHECK(fake_nccl_log().find("CommShrink") == std::string::npos);  // never NCCL's
  CHILD_CHECK(destroy(small) == ncclSuccess);
  abort_(comm);
  return 0;
}

// mKernel's libnccl.so.2 in two processes: a send needs the real NCCL, whose
// communicator the library creates at that call on both ranks, sharing its
// unique id through mKernel's bootstrap.
int shim_fallback(int rank, int nranks, const mkUniqueId& id) {
  void* h = nullptr;
  ncclComm_t comm = nullptr;
  if (open_shim_comm(rank, nranks, id, &h, &comm) != 0) return 1;
  using Send = ncclResult_t (*)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  using Destroy = ncclResult_t (*)(ncclComm_t);
  auto send = reinterpret_cast<Send>(dlsym(h, "ncclSend"));
  auto destroy = reinterpret_cast<Destroy>(dlsym(h, "ncclCommDestroy"));
  CHILD_CHECK(send && destroy);
  CUdeviceptr p = 0;
  CHILD_CHECK(cu().cuMemAlloc(&p, 256) == CUDA_SUCCESS);
  CHILD_CHECK(send(reinterpret_cast<void*>(p), 16, ncclFloat32, 1 - rank, comm, nullptr) == ncclSuccess);
  const std::string got = fake_nccl_log();
  std::fprintf(stderr, "rank %d: fake NCCL log:\n%s", rank, got.c_str());
  CHILD_CHECK(got.find(rank == 0 ? "GetUniqueId\n" : "CommInitRank") != std::string::npos);
  CHILD_CHECK(got.find("CommInitRank comm=1 nranks=2 rank=" + std::to_string(rank) + "\n") != std::string::npos);
  CHILD_CHECK(got.find("Send comm=1 count=16 peer=" + std::to_string(1 - rank) + "\n") != std::string::npos);
  // NCCL's registration is local: a rank registers while its peer does not,
  // and neither waits (mKernel's own registration is collective).
  using Reg = ncclResult_t (*)(const ncclComm_t, void*, size_t, void**);
  using Dereg = ncclResult_t (*)(const ncclComm_t, void*);
  auto reg = reinterpret_cast<Reg>(dlsym(h, "ncclCommRegister"));
  auto dereg = reinterpret_cast<Dereg>(dlsym(h, "ncclCommDeregister"));
  CHILD_CHECK(reg && dereg);
  if (rank == 0) {
    void* handle = nullptr;
    const auto t0 = std::chrono::steady_clock::now();
    CHILD_CHECK(reg(comm, reinterpret_cast<void*>(p), 256, &handle) == ncclSuccess);
    CHILD_CHECK(dereg(comm, handle) == ncclSuccess);
    CHILD_CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  }
  CHILD_CHECK(destroy(comm) == ncclSuccess);
  CHILD_CHECK(cu().cuMemFree(p) == CUDA_SUCCESS);
  return 0;
}

// mKernel's libnccl.so.2 on ranks of two "nodes" (MK_HOST_ID; ranks
// 0..n/2-1 on one): the world communicator spans them, so NCCL runs it whole
// on every rank (its communicator made at init; collectives, PreMulSum ops
// and all, go there, none to mKernel), said with MK_DEBUG; its split by node
// runs on mKernel and never reaches NCCL.
int shim_two_nodes(int rank, int nranks, const mkUniqueId& id) {
  // MK_DEBUG's lines of this rank, in a file (stderr is the test's).
  const std::string log = (std::filesystem::temp_directory_path() /
                           ("mkt-two-nodes-" + std::to_string(::getpid()) + ".log")).string();
  const int saved = ::dup(2);
  CHILD_CHECK(saved >= 0);
  const int fd = ::open(log.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
  CHILD_CHECK(fd >= 0 && ::dup2(fd, 2) == 2);
  ::close(fd);
  setenv("MK_DEBUG", "1", 1);
  void* h = nullptr;
  ncclComm_t world = nullptr;
  const int opened = open_shim_comm(rank, nranks, id, &h, &world);
  ::dup2(saved, 2);
  ::close(saved);
  if (opened != 0) return 1;
  std::string debug;
  {
    std::ifstream in(log);
    std::stringstream ss;
    ss << in.rdbuf();
    debug = ss.str();
  }
  std::remove(log.c_str());
  std::fprintf(stderr, "rank %d: MK_DEBUG said:\n%s", rank, debug.c_str());
  CHILD_CHECK(debug.find("its ranks span 2 nodes: NCCL runs it whole") != std::string::npos);
  const std::string me = std::to_string(rank), n = std::to_string(nranks);
  std::string got = fake_nccl_log();
  CHILD_CHECK(got.find("CommInitRank comm=1 nranks=" + n + " rank=" + me + "\n") != std::string::npos);
  using AllReduce = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
  using Split = ncclResult_t (*)(ncclComm_t, int, int, ncclComm_t*, ncclConfig_t*);
  using Destroy = ncclResult_t (*)(ncclComm_t);
  using PreMul = ncclResult_t (*)(ncclRedOp_t*, void*, ncclDataType_t, ncclScalarResidence_t, ncclComm_t);
  auto allreduce = reinterpret_cast<AllReduce>(dlsym(h, "ncclAllReduce"));
  auto split = reinterpret_cast<Split>(dlsym(h, "ncclCommSplit"));
  auto destroy = reinterpret_cast<Destroy>(dlsym(h, "ncclCommDestroy"));
  auto premul = reinterpret_cast<PreMul>(dlsym(h, "ncclRedOpCreatePreMulSum"));
  CHILD_CHECK(allreduce && split && destroy && premul);
  CUdeviceptr b = 0;
  CHILD_CHECK(cu().cuMemAlloc(&b, 4096) == CUDA_SUCCESS);
  void* p = reinterpret_cast<void*>(uintptr_t(b));
  const int64_t launches = mkt::counts().launches;
  CHILD_CHECK(allreduce(p, p, 64, ncclFloat32, ncclSum, world, nullptr) == ncclSuccess);
  ncclRedOp_t op = ncclSum;
  float scale = 0.5f;
  CHILD_CHECK(premul(&op, &scale, ncclFloat32, ncclScalarHostImmediate, world) == ncclSuccess);
  CHILD_CHECK(allreduce(p, p, 32, ncclFloat32, op, world, nullptr) == ncclSuccess);
  CHILD_CHECK(mkt::counts().launches == launches);  // nothing ran on mKernel
  got = fake_nccl_log();
  CHILD_CHECK(got.find("AllReduce comm=1 count=64 dtype=7 op=0\n") != std::string::npos);
  CHILD_CHECK(got.find("RedOpCreatePreMulSum comm=1") != std::string::npos);
  CHILD_CHECK(got.find("AllReduce comm=1 count=32 dtype=7 op=5\n") != std::string::npos);
  // The ranks of one node: a communicator mKernel runs.
  ncclComm_t local = nullptr;
  CHILD_CHECK(split(world, rank < nranks / 2 ? 0 : 1, rank, &local, nullptr) == ncclSuccess);
  CHILD_CHECK(allreduce(p, p, 64, ncclFloat32, ncclSum, local, nullptr) == ncclSuccess);
  CHILD_CHECK(mkt::counts().launches == launches + 1);
  const std::string after = fake_nccl_log();
  CHILD_CHECK(after == got);  // NCCL saw nothing of it, not even an init
  CHILD_CHECK(destroy(local) == ncclSuccess);
  CHILD_CHECK(destroy(world) == ncclSuccess);
  CHILD_CHECK(fake_nccl_log().find("CommDestroy comm=1\n") != std::string::npos);
  return 0;
}

// One process per "node" (MK_HOST_ID), two ranks each, made by one thread in
// a group (ncclGroupStart, ncclCommInitRank per GPU, ncclGroupEnd): the world
// communicator of four ranks spans both nodes, so ncclGroupEnd makes NCCL's
// communicator of each rank, the two of this process at once (one after the
// other they would wait for each other); calls go to NCCL; a split by node in
// a group gives two-rank communicators that run on mKernel. `nprocs`: 2.
int shim_group_nodes(int proc, int nprocs, const mkUniqueId& id) {
  g_rank = proc;
  const int nranks = 2 * nprocs;
  CUcontext ctx[2] = {nullptr, nullptr};
  for (int d = 0; d < 2; ++d) CHILD_CHECK(cu().cuDevicePrimaryCtxRetain(&ctx[d], d) == CUDA_SUCCESS);
  setenv("MK_LIBMKERNEL", MKT_LIBMKERNEL, 1);
  setenv("MK_NCCL_LIB", MKT_FAKE_NCCL, 1);
  void* h = dlopen(MKT_SHIM, RTLD_NOW | RTLD_LOCAL);
  CHILD_CHECK(h != nullptr);
  using Init = ncclResult_t (*)(ncclComm_t*, int, ncclUniqueId, int);
  using Group = ncclResult_t (*)();
  using AllReduce = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
  using Split = ncclResult_t (*)(ncclComm_t, int, int, ncclComm_t*, ncclConfig_t*);
  using Destroy = ncclResult_t (*)(ncclComm_t);
  using LastError = const char* (*)(ncclComm_t);
  auto init = reinterpret_cast<Init>(dlsym(h, "ncclCommInitRank"));
  auto start = reinterpret_cast<Group>(dlsym(h, "ncclGroupStart"));
  auto end = reinterpret_cast<Group>(dlsym(h, "ncclGroupEnd"));
  auto allreduce = reinterpret_cast<AllReduce>(dlsym(h, "ncclAllReduce"));
  auto split = reinterpret_cast<Split>(dlsym(h, "ncclCommSplit"));
  auto destroy = reinterpret_cast<Destroy>(dlsym(h, "ncclCommDestroy"));
  auto last = reinterpret_cast<LastError>(dlsym(h, "ncclGetLastError"));
  CHILD_CHECK(init && start && end && allreduce && split && destroy && last);
  ncclUniqueId nid;
  memcpy(&nid, &id, sizeof nid);
  ncclComm_t world[2] = {nullptr, nullptr}, local[2] = {nullptr, nullptr};
  const auto t0 = std::chrono::steady_clock::now();
  CHILD_CHECK(start() == ncclSuccess);
  for (int d = 0; d < 2; ++d) {
    CHILD_CHECK(cu().cuCtxSetCurrent(ctx[d]) == CUDA_SUCCESS);
    CHILD_CHECK(init(&world[d], nranks, nid, 2 * proc + d) == ncclSuccess);
  }
  const ncclResult_t made = end();
  if (made != ncclSuccess) std::fprintf(stderr, "proc %d: ncclGroupEnd: %s\n", proc, last(nullptr));
  CHILD_CHECK(made == ncclSuccess);
  CHILD_CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));  // no wait for a timeout
  std::string got = fake_nccl_log();
  std::fprintf(stderr, "proc %d: fake NCCL log:\n%s", proc, got.c_str());
  for (int d = 0; d < 2; ++d)
    CHILD_CHECK(got.find("nranks=" + std::to_string(nranks) + " rank=" + std::to_string(2 * proc + d) + "\n") !=
                std::string::npos);
  CUdeviceptr b[2] = {0, 0};
  for (int d = 0; d < 2; ++d) {
    CHILD_CHECK(cu().cuCtxSetCurrent(ctx[d]) == CUDA_SUCCESS);
    CHILD_CHECK(cu().cuMemAlloc(&b[d], 4096) == CUDA_SUCCESS);
  }
  const int64_t launches = mkt::counts().launches;
  CHILD_CHECK(start() == ncclSuccess);
  for (int d = 0; d < 2; ++d) {
    void* p = reinterpret_cast<void*>(uintptr_t(b[d]));
    CHILD_CHECK(allreduce(p, p, 64, ncclFloat32, ncclSum, world[d], nullptr) == ncclSuccess);
  }
  CHILD_CHECK(end() == ncclSuccess);
  CHILD_CHECK(mkt::counts().launches == launches);
  got = fake_nccl_log();
  size_t at = 0, n = 0;
  while ((at = got.find("AllReduce", at)) != std::string::npos) ++n, ++at;
  CHILD_CHECK(n == 2);
  // by node, in a group: communicators of this process's two ranks, on mKernel
  CHILD_CHECK(start() == ncclSuccess);
  for (int d = 0; d < 2; ++d) {
    CHILD_CHECK(cu().cuCtxSetCurrent(ctx[d]) == CUDA_SUCCESS);
    CHILD_CHECK(split(world[d], proc, d, &local[d], nullptr) == ncclSuccess);
  }
  const ncclResult_t split_done = end();
  if (split_done != ncclSuccess) std::fprintf(stderr, "proc %d: ncclGroupEnd (split): %s\n", proc, last(nullptr));
  CHILD_CHECK(split_done == ncclSuccess);
  CHILD_CHECK(start() == ncclSuccess);
  for (int d = 0; d < 2; ++d) {
    void* p = reinterpret_cast<void*>(uintptr_t(b[d]));
    CHILD_CHECK(allreduce(p, p, 64, ncclFloat32, ncclSum, local[d], nullptr) == ncclSuccess);
  }
  CHILD_CHECK(end() == ncclSuccess);
  CHILD_CHECK(mkt::counts().launches == launches + 2);
  CHILD_CHECK(fake_nccl_log() == got);  // NCCL saw nothing of the split or its calls
  for (int d = 0; d < 2; ++d) {
    CHILD_CHECK(destroy(local[d]) == ncclSuccess);
    CHILD_CHECK(destroy(world[d]) == ncclSuccess);
  }
  return 0;
}

// Rank 1 has no real NCCL (MK_NCCL_LIB names nothing): a send needs NCCL's
// communicator on both ranks; rank 1 fails with the reason and aborts
// mKernel's communicator, so rank 0, waiting for rank 1 in the id broadcast,
// fails at once naming it (not at the 30 s bootstrap timeout). Both handles
// still destroy.
int shim_no_real_on_one(int rank, int nranks, const mkUniqueId& id) {
  void* h = nullptr;
  ncclComm_t comm = nullptr;
  if (open_shim_comm(rank, nranks, id, &h, &comm) != 0) return 1;
  if (rank == 1) setenv("MK_NCCL_LIB", "/nonexistent/libnccl.so.2", 1);  // read when the real NCCL is first loaded
  using Send = ncclResult_t (*)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  using Destroy = ncclResult_t (*)(ncclComm_t);
  using LastError = const char* (*)(ncclComm_t);
  auto send = reinterpret_cast<Send>(dlsym(h, "ncclSend"));
  auto destroy = reinterpret_cast<Destroy>(dlsym(h, "ncclCommDestroy"));
  auto last = reinterpret_cast<LastError>(dlsym(h, "ncclGetLastError"));
  CHILD_CHECK(send && destroy && last);
  CUdeviceptr p = 0;
  CHILD_CHECK(cu().cuMemAlloc(&p, 256) == CUDA_SUCCESS);
  const auto t0 = std::chrono::steady_clock::now();
  const ncclResult_t r = send(reinterpret_cast<void*>(p), 16, ncclFloat32, 1 - rank, comm, nullptr);
  const std::string msg = last(nullptr);
  std::fprintf(stderr, "rank %d: send -> %d: %s\n", rank, int(r), msg.c_str());
  CHILD_CHECK(r != ncclSuccess);
  CHILD_CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
  if (rank == 1) {
    CHILD_CHECK(msg.find("needs the real NCCL") != std::string::npos);
  } else {
    CHILD_CHECK(msg.find("rank 1") != std::string::npos);
    CHILD_CHECK(msg.find("abort") != std::string::npos);
  }
  CHILD_CHECK(destroy(comm) == ncclSuccess);
  CHILD_CHECK(cu().cuMemFree(p) == CUDA_SUCCESS);
  return 0;
}

// MK_NCCL_EAGER=1: NCCL's communicator is made with mKernel's, before any call.
int shim_eager(int rank, int nranks, const mkUniqueId& id) {
  setenv("MK_NCCL_EAGER", "1", 1);
  void* h = nullptr;
  ncclComm_t comm = nullptr;
  if (open_shim_comm(rank, nranks, id, &h, &comm) != 0) return 1;
  using Destroy = ncclResult_t (*)(ncclComm_t);
  auto destroy = reinterpret_cast<Destroy>(dlsym(h, "ncclCommDestroy"));
  CHILD_CHECK(destroy != nullptr);
  const std::string got = fake_nccl_log();
  CHILD_CHECK(got.find("CommInitRank comm=1 nranks=2 rank=" + std::to_string(rank) + "\n") != std::string::npos);
  CHILD_CHECK(destroy(comm) == ncclSuccess);
  return 0;
}
#endif

// Ranks started again as fresh processes, each with its own extra
// environment; every one must exit 0 within 120 s. `given`: their id (by
// default a fresh one).
void run_ranks(int nranks, const std::string& scenario, const std::vector<std::vector<std::string>>& env,
               const mkUniqueId* given = nullptr) {
  mkUniqueId id;
  if (given)
    id = *given;
  else
    REQUIRE(mkGetUniqueId(&id) == mkSuccess);
  const std::string hex = to_hex(&id, sizeof id);
  const std::string n = std::to_string(nranks);
  std::vector<pid_t> pids;
  for (int r = 0; r < nranks; ++r) {
    const std::string rank = std::to_string(r);
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      // A rank whose peer failed gives up at the next all-gather, well before our deadline.
      setenv("MK_BOOTSTRAP_TIMEOUT_MS", "30000", 0);
      if (size_t(r) < env.size())
        for (const auto& kv : env[size_t(r)]) putenv(const_cast<char*>(kv.c_str()));
      const char* args[] = {"mk_runtime_tests", "--mkt-child", rank.c_str(), n.c_str(), hex.c_str(),
                            scenario.c_str(), nullptr};
      ::execv("/proc/self/exe", const_cast<char* const*>(args));
      _exit(127);
    }
    pids.push_back(pid);
  }
  // Bounded: a hang fails the test instead of hanging ctest.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  std::vector<int> status(pids.size(), -1);
  for (size_t done = 0; done < pids.size();) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (status[i] != -1) continue;
      int st = 0;
      if (::waitpid(pids[i], &st, WNOHANG) == pids[i]) {
        status[i] = st;
        ++done;
      }
    }
    if (done < pids.size() && std::chrono::steady_clock::now() > deadline) {
      for (size_t i = 0; i < pids.size(); ++i)
        if (status[i] == -1) {
          ::kill(pids[i], SIGKILL);
          ::waitpid(pids[i], &status[i], 0);
        }
      FAIL("the ranks did not finish within 120 s (killed)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    INFO("rank " << i << " (its stderr says what failed)");
    CHECK(WIFEXITED(status[i]));
    CHECK(WEXITSTATUS(status[i]) == 0);
  }
}

}  // namespace

// argv: --mkt-child RANK NRANKS ID_HEX [SCENARIO]
int mkt_child_main(int argc, char** argv) {
  mkUniqueId id;
  if ((argc != 5 && argc != 6) || !from_hex(argv[4], &id, sizeof id)) {
    std::fprintf(stderr, "usage: --mkt-child RANK NRANKS ID_HEX [SCENARIO]\n");
    return 2;
  }
  const int rank = std::atoi(argv[2]), nranks = std::atoi(argv[3]);
  const std::string scenario = argc == 6 ? argv[5] : "share";
  if (scenario == "share") return run_rank(rank, nranks, id);
  if (scenario == "settings")
    return expect_init_failure(rank, nranks, id, mkInvalidUsage,
                               {"ranks disagree on MK_ALGO", "rank 0 has (unset)", "rank 1 has 'allreduce=allreduce.ring'"});
  if (scenario == "bad_env")
    return expect_init_failure(rank, nranks, id, rank == 1 ? mkInvalidArgument : mkInvalidUsage,
                               {"rank 1:", "MK_TUNE"});
  if (scenario == "fast_compile_differs")  // kernels of other levels differ in speed (and may round a fusion otherwise)
    return expect_init_failure(rank, nranks, id, mkInvalidUsage,
                               {"ranks disagree on MK_FAST_COMPILE", "rank 0 has '0'", "rank 1 has 'max'"});
  if (scenario == "fast_compile_bad")
    return expect_init_failure(rank, nranks, id, rank == 1 ? mkInvalidArgument : mkInvalidUsage,
                               {"rank 1:", "mk.jit.E007", "MK_FAST_COMPILE='fastest'"});
  if (scenario == "host_ids_differ")  // processes of one machine standing in for two nodes
    return expect_init_failure(rank, nranks, id, mkInvalidUsage,
                               {"the ranks sit on 2 nodes: rank 0 runs on host 'node-a' and rank 1 on 'node-b' (MK_HOST_ID)",
                                "set MK_NET=socket", "MK_SPAN_NODES_BOOTSTRAP"});
  if (scenario == "host_id_bad")
    return expect_init_failure(rank, nranks, id, rank == 1 ? mkInvalidArgument : mkInvalidUsage,
                               {"rank 1:", "MK_HOST_ID='node b'", "without spaces"});
  if (scenario == "bcast") return bootstrap_broadcast(rank, nranks, id);
  if (scenario == "machine_links") return machine_links(rank, nranks, id);
  if (scenario == "span_bootstrap") return span_bootstrap(rank, nranks, id);
  if (scenario == "net_span") return net_span(rank, nranks, id);
  if (scenario == "net_destroy") return net_destroy(rank, nranks, id);
  if (scenario == "net_auto") return net_auto(rank, nranks, id);
  if (scenario == "shrink") return shrink(rank, nranks, id);
  if (scenario == "span_differs") return span_differs(rank, nranks, id);
  if (scenario == "split_peer_exit") return split_peer_exit(rank, nranks, id);
  if (scenario == "copy_engine") return copy_engine(rank, nranks, id);
  if (scenario == "copy_engine_scratch") return copy_engine_scratch(rank, nranks, id);
  if (scenario == "copy_engine_group") return copy_engine_group(rank, nranks, id);
  if (scenario == "copy_engine_stall") return copy_engine_stall(rank, nranks, id);
  if (scenario == "select") return selected(rank, nranks, id);
  if (scenario == "select_knobs") return selected_knobs(rank, nranks, id);
  if (scenario == "select_differs")
    return expect_init_failure(rank, nranks, id, mkInvalidUsage, {"ranks disagree on MK_SELECT_FILE", "rank 0 has 'none'"});
  if (scenario == "select_bad")
    return expect_init_failure(rank, nranks, id, rank == 1 ? mkInvalidArgument : mkInvalidUsage,
                               {"rank 1:", "MK_SELECT_FILE=", "$.entries[0].schedule", "implements allgather, not allreduce"});
  if (scenario == "user_schedule") return user_schedule(rank, nranks, id);
  if (scenario == "init_allreduce") return init_allreduce(rank, nranks, id);
  if (scenario == "premul_fallback") return premul_fallback(rank, nranks, id);
  if (scenario == "fused_fallback") return fused_fallback(rank, nranks, id);
  if (scenario == "divergent_registry") return divergent_registry(rank, nranks, id);
  if (scenario == "user_schedule_differs")
    return expect_init_failure(rank, nranks, id, mkInvalidUsage,
                               {"ranks disagree on MK_SCHEDULES", "rank 0 has (unset)", "rank 1 has 'my.good@"});
  if (scenario == "user_schedule_missing")
    return expect_init_failure(rank, nranks, id, rank == 1 ? mkInvalidArgument : mkInvalidUsage,
                               {"rank 1:", "MK_SCHEDULES=", "mk.cli.E009", "does not exist"});
  if (scenario == "user_schedule_unproved")
    return expect_init_failure(rank, nranks, id, rank == 0 ? mkInvalidArgument : mkInvalidUsage,
                               {"rank 0:", "user schedule 'my.wrong'", "is not proved for 2 ranks", "mk.verify.E"});
  if (scenario == "user_schedule_wrong_ranks")
    return expect_init_failure(rank, nranks, id, rank == 0 ? mkInvalidArgument : mkInvalidUsage,
                               {"MK_ALGO selects schedule 'my.good' for 3 ranks", "mk.dsl.E008", "for 2 ranks"});
  if (scenario == "ipc_squat")
    return expect_init_failure(rank, nranks, id, rank == 1 ? mkSystemError : mkRemoteError,
                               {"rank 1:", "local IPC socket name", "squatting"});
  if (scenario == "config_schedules_differ")
    return expect_init_failure(rank, nranks, id, mkInvalidUsage,
                               {"ranks disagree on the communicator's schedules (config)"});
#ifdef MKT_SHIM
  if (scenario == "shim") return shim_fallback(rank, nranks, id);
  if (scenario == "shim_eager") return shim_eager(rank, nranks, id);
  if (scenario == "shim_two_nodes") return shim_two_nodes(rank, nranks, id);
  if (scenario == "shim_shrink") return shim_shrink(rank, nranks, id);
  if (scenario == "shim_net_roots") return shim_net_roots(rank, nranks, id);
  if (scenario == "shim_group_nodes") return shim_group_nodes(rank, nranks, id);
  if (scenario == "shim_no_real_on_one") return shim_no_real_on_one(rank, nranks, id);
#endif
  std::fprintf(stderr, "unknown scenario %s\n", scenario.c_str());
  return 2;
}

TEST_CASE("two processes: ranks share arenas and registered buffers, launch, and destroy cleanly") {
  MKT_REQUIRE_FAKE();
  run_ranks(2, "share", {});
}

TEST_CASE("two processes: registered buffers go zero-copy with allreduce.direct") {
  MKT_REQUIRE_FAKE();
  run_ranks(2, "share", {{"MK_ZERO_COPY_MIN_BYTES=0"}, {"MK_ZERO_COPY_MIN_BYTES=0"}});
}

TEST_CASE("two processes: MK_PDL=0 launches without programmatic dependent launch") {
  MKT_REQUIRE_FAKE();
  run_ranks(2, "share", {{"MK_PDL=0"}, {"MK_PDL=0"}});
}

TEST_CASE("two processes: a process squatting on a rank's local IPC socket name fails init on both ranks at once, "
          "naming it") {
  MKT_REQUIRE_FAKE();
  // A squatter that only binds (peers that connect are refused: before, rank
  // 0 retried until its timeout) and one that also listens.
  for (const bool listening : {false, true}) {
    CAPTURE(listening);
    mkUniqueId id;
    REQUIRE(mkGetUniqueId(&id) == mkSuccess);
    // This process holds the id (only a holder of its secret can compute the
    // name) and binds rank 1's name before the ranks start.
    const mk::rt::IdContents c = mk::rt::bootstrap_decode(id);
    const std::string name = mk::rt::ipc_socket_name(c.secret, c.nonce, 1);
    int squat = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path + 1, name.data(), name.size());
    const socklen_t len = socklen_t(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    REQUIRE(::bind(squat, reinterpret_cast<sockaddr*>(&a), len) == 0);
    if (listening) REQUIRE(::listen(squat, 4) == 0);
    const auto t0 = std::chrono::steady_clock::now();
    run_ranks(2, "ipc_squat", {}, &id);  // their bootstrap timeout is 30 s
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(15));
    ::close(squat);
  }
}

TEST_CASE("two processes: a setting that shapes plans differs between ranks: init fails on both, naming it") {
  MKT_REQUIRE_FAKE();
  run_ranks(2, "settings", {{}, {"MK_ALGO=allreduce=allreduce.ring"}});
}

TEST_CASE("two processes: a malformed setting on one rank fails init on both, with that rank's message") {
  MKT_REQUIRE_FAKE();
  run_ranks(2, "bad_env", {{}, {"MK_TUNE=simple_instances=2abc"}});
}

// MK_HOST_ID: processes of one machine stand in for nodes. Ranks of two
// "nodes" fail init on every rank without MK_NET, naming both and MK_NET;
// ranks of one id are one node; a bad id fails init on every rank, with the
// message of the rank that has it (never a wait for it).
TEST_CASE("two processes: MK_HOST_ID places ranks on nodes and two nodes fail init on both ranks clearly") {
  MKT_REQUIRE_FAKE();
  run_ranks(2, "host_ids_differ", {{"MK_HOST_ID=node-a"}, {"MK_HOST_ID=node-b"}});
  run_ranks(2, "bcast", {{"MK_HOST_ID=node-a"}, {"MK_HOST_ID=node-a"}});
  run_ranks(2, "host_id_bad", {{"MK_HOST_ID=node-a"}, {"MK_HOST_ID=node b"}});
}

TEST_CASE("two processes: the links inside a node are learnt at init and shape selection and plans") {
  MKT_REQUIRE_FAKE();
  const std::string table = (std::filesystem::temp_directory_path() /
                             ("mkt-select-pcie-" + std::to_string(::getpid()) + ".json")).string();
  std::ofstream(table) << R"({"mkernel_select": 1, "entries": [{"collective": "allreduce", "min_ranks": 2,
      "max_ranks": 2, "intra": "pcie", "schedule": "allreduce.ring"}]})";
  const std::string sel = "MK_SELECT_FILE=" + table;
  run_ranks(2, "machine_links", {{"MKFAKE_LINK=pcie", "MKT_LINK=pcie", sel}, {"MKFAKE_LINK=pcie", "MKT_LINK=pcie", sel}});
  run_ranks(2, "machine_links", {{"MKT_LINK=nvlink", sel}, {"MKT_LINK=nvlink", sel}});
  std::remove(table.c_str());
}

// What a communicator spanning nodes becomes when its init asks for it
// (spanNodes): bootstrap-only on every rank, split into full communicators
// per node. Four processes, two "nodes" of two.
TEST_CASE("ranks on two nodes with MK_NET=socket: a full communicator whose plans reach the other node through the proxy") {
  MKT_REQUIRE_FAKE();
  auto env = [](const char* node) {
    return std::vector<std::string>{std::string("MK_HOST_ID=") + node, "MK_NET=socket", "MK_SOCKET_IFNAME==lo",
                                    "MK_SCRATCH_BYTES=67108864", "MK_TUNE=simple_instances=2"};
  };
  run_ranks(2, "net_span", {env("node-a"), env("node-b")});
  run_ranks(4, "net_span", {env("node-a"), env("node-a"), env("node-b"), env("node-b")});
  run_ranks(2, "net_destroy", {env("node-a"), env("node-b")});  // a plain destroy is no failure for the other node
}

#ifdef MKT_FAKE_IBVERBS
// One communicator, two transports: nodes a and b have a (fake) RDMA
// device, node c has none; with MK_NET=auto a-b connections run on verbs,
// those with c on the socket transport (NCCL picks one for the whole job).
TEST_CASE("three nodes with MK_NET=auto: verbs between the nodes that both have an RDMA device, socket with the one that has none") {
  MKT_REQUIRE_FAKE();
  const std::string fabric = "MKFAKE_IB_NAME=mkt-ib-auto-" + std::to_string(::getpid());
  auto env = [&](const char* node, const char* devices) {
    return std::vector<std::string>{std::string("MK_HOST_ID=") + node, "MK_NET=auto", "MK_SOCKET_IFNAME==lo",
                                    "MK_SCRATCH_BYTES=67108864", "MK_TUNE=simple_instances=2",
                                    std::string("MK_IBVERBS_LIB=") + MKT_FAKE_IBVERBS, "MKFAKE_IB_LINK=roce",
                                    std::string("MKFAKE_IB_DEVICES=") + devices, fabric, "MKT_VERBS_RANKS=01"};
  };
  run_ranks(3, "net_auto", {env("node-a", "1"), env("node-b", "1"), env("node-c", "0")});
}
#else
TEST_CASE("three nodes with MK_NET=auto: skipped") { MESSAGE("SKIPPED: the fake libibverbs was not built (no infiniband/verbs.h)"); }
#endif

TEST_CASE("mkCommShrink: the ranks left after one died make a communicator without it, on one node and across nodes") {
  MKT_REQUIRE_FAKE();
  run_ranks(3, "shrink", {});
  auto env = [](const char* node) {
    return std::vector<std::string>{std::string("MK_HOST_ID=") + node, "MK_NET=socket", "MK_SOCKET_IFNAME==lo",
                                    "MK_SCRATCH_BYTES=67108864", "MK_TUNE=simple_instances=2"};
  };
  run_ranks(3, "shrink", {env("node-a"), env("node-b"), env("node-c")});
}

TEST_CASE("four processes on two nodes: spanNodes makes a bootstrap-only communicator whose split by node runs") {
  MKT_REQUIRE_FAKE();
  const std::vector<std::string> a = {"MK_HOST_ID=node-a"}, b = {"MK_HOST_ID=node-b"};
  auto placed = [](std::vector<std::string> env, const char* placement) {
    env.push_back(std::string("MKT_PLACEMENT=") + placement);
    return env;
  };
  run_ranks(4, "span_bootstrap", {placed(a, "aabb"), placed(a, "aabb"), placed(b, "aabb"), placed(b, "aabb")});
  // ranks not numbered node-major (MPI's --map-by node): the runtime keeps the permutation
  run_ranks(4, "span_bootstrap", {placed(a, "abab"), placed(b, "abab"), placed(a, "abab"), placed(b, "abab")});
  // nodes of different sizes: three ranks on one, one on the other
  run_ranks(4, "span_bootstrap", {placed(a, "aaba"), placed(a, "aaba"), placed(b, "aaba"), placed(a, "aaba")});
  run_ranks(2, "span_differs", {a, b});
}

TEST_CASE("two processes: ranks of different fast-compile levels (MK_FAST_COMPILE) fail init, naming it" *
          doctest::skip(mk::jit::nvrtc_version() > 0 && mk::jit::nvrtc_version() < 12080)) {  // no levels before 12.8
  MKT_REQUIRE_FAKE();
  run_ranks(2, "fast_compile_differs", {{}, {"MK_FAST_COMPILE=max"}});
}

TEST_CASE("two processes: an unknown MK_FAST_COMPILE on one rank fails init on both (mk.jit.E007)") {
  MKT_REQUIRE_FAKE();
  run_ranks(2, "fast_compile_bad", {{}, {"MK_FAST_COMPILE=fastest"}});
}

namespace {
std::string write_select(const std::string& name, const std::string& text) {
  const std::string path = (std::filesystem::temp_directory_path() / (name + "." + std::to_string(::getpid()))).string();
  std::ofstream(path) << text;
  return path;
}
}  // namespace

namespace {
// A 2-rank all-reduce in mKernel IR JSON (what `mkc import -o` writes): every
// rank pushes its input into the peer's scratch and adds it to its own. With
// `wrong`, rank 1 adds its own input twice instead of rank 0's.
std::string ir_allreduce_2(bool wrong) {
  return std::string(R"({"mk_ir_version": 1, "name": "from_file", "collective": "allreduce", "ranks": 2,
  "root": 0, "chunks": 1, "instances": 1, "scratch": 2, "depth": 1, "proto": "simple", "slots": 0, "tbs": 0,
  "tile_bytes": 0, "staged": false, "synced": false, "ops": [
  {"id": 0, "kind": "copy", "rank": 0, "tb": -1, "dsts": ["r1.sc[0]"], "srcs": ["r0.in[0]"]},
  {"id": 1, "kind": "copy", "rank": 1, "tb": -1, "dsts": ["r0.sc[1]"], "srcs": ["r1.in[0]"]},
  {"id": 2, "kind": "reduce", "rank": 0, "tb": -1, "dsts": ["r0.out[0]"], "srcs": ["r0.in[0]", "r0.sc[1]"]},
  {"id": 3, "kind": "reduce", "rank": 1, "tb": -1, "dsts": ["r1.out[0]"], "srcs": [)") +
         (wrong ? R"("r1.in[0]", "r1.in[0]")" : R"("r1.sc[0]", "r1.in[0]")") + "]}]}";
}
}  // namespace

TEST_CASE("two processes: a schedule from MK_SCHEDULES or the config's list serves mkAllReduce, and init fails on every rank "
          "when the lists differ, a file is missing, a schedule is not proved, or MK_ALGO picks it for other ranks") {
  MKT_REQUIRE_FAKE();
  const std::string good = write_select("mkt_user_good.json", ir_allreduce_2(false));
  const std::string wrong = write_select("mkt_user_wrong.json", ir_allreduce_2(true));
  const std::string sched = "MK_SCHEDULES=my.good=" + good;
  const std::vector<std::string> both = {sched, "MK_ALGO=allreduce=my.good", "MKT_WANT_KERNEL=my_good"};
  run_ranks(2, "user_schedule", {both, both});
  run_ranks(2, "user_schedule_differs", {{}, {sched}});
  run_ranks(2, "user_schedule_missing", {{}, {"MK_SCHEDULES=/nonexistent/mine.xml"}});
  run_ranks(2, "user_schedule_unproved", {{"MK_SCHEDULES=my.wrong=" + wrong}, {"MK_SCHEDULES=my.wrong=" + wrong}});
  run_ranks(3, "user_schedule_wrong_ranks", {both, both, both});
  // Loaded but not selected, for a rank count it does not build for: not a
  // candidate, not an error.
  run_ranks(3, "init_allreduce", {{sched}, {sched}, {sched}});
  // The config's own list; its schedule is named from the file ("from_file").
  const std::vector<std::string> cfg = {"MKT_CONFIG_SCHEDULES=" + good, "MK_ALGO=allreduce=from_file",
                                        "MKT_WANT_KERNEL=from_file"};
  run_ranks(2, "user_schedule", {cfg, cfg});
  run_ranks(2, "config_schedules_differ", {{"MKT_CONFIG_SCHEDULES=" + good}, {}});
  // Loaded by another communicator of each process, different files under one
  // name, selected by MK_ALGO: the IR they build differs, init fails on both
  // (before: both ranks initialised and ran different kernels).
  std::string other_text = ir_allreduce_2(false);
  const std::string from = R"("r1.sc[0]", "r1.in[0]")", to = R"("r1.in[0]", "r1.sc[0]")";
  other_text.replace(other_text.find(from), from.size(), to);  // also correct, another order
  const std::string other = write_select("mkt_user_other.json", other_text);
  run_ranks(2, "divergent_registry", {{"MKT_FIRST_LIST=my.x=" + good}, {"MKT_FIRST_LIST=my.x=" + other}});
  std::filesystem::remove(good);
  std::filesystem::remove(wrong);
  std::filesystem::remove(other);
}

TEST_CASE("two processes: a PreMulSum all-reduce that MK_ALGO sends to copy engines runs the built-in kernel instead") {
  MKT_REQUIRE_FAKE();
  const std::vector<std::string> env = {"MK_ALGO=allreduce=allreduce.ce"};
  run_ranks(2, "premul_fallback", {env, env});
}

TEST_CASE("two processes: a fused all-reduce that MK_ALGO sends to copy engines runs the built-in table's fused kernel") {
  MKT_REQUIRE_FAKE();
  const std::vector<std::string> env = {"MK_ALGO=allreduce=allreduce.ce"};
  run_ranks(2, "fused_fallback", {env, env});
}

TEST_CASE("two processes: a schedule known only from MK_PLAN_DIR's plans serves mkAllReduce when MK_ALGO names it") {
  MKT_REQUIRE_FAKE();
  if (mk::jit::nvrtc_version() <= 0) {
    MESSAGE("skipped: no NVRTC to compile the plan");
    return;
  }
  // A plan compiled from a schedule this process has, shipped under a name no
  // process has a source for (the fake driver checks kernel names in the cubin).
  const auto dir = std::filesystem::temp_directory_path() / ("mkt_plandir." + std::to_string(::getpid()));
  mk::compiler::CompileOptions o;
  o.dtype = mk::DType::fp32;
  o.use_cache = false;
  auto plan = mk::compiler::compile_plan(mk::dsl::build(*mk::dsl::find_schedule("allreduce.two_shot"), 2), o);
  plan.schedule = "shipped.allreduce";
  mk::plan::write_dir(plan, (dir / "ar").string());
  const std::vector<std::string> env = {"MK_PLAN_DIR=" + dir.string(), "MK_ALGO=allreduce=shipped.allreduce",
                                        "MKT_WANT_KERNEL=mk_allreduce_two_shot_n2_fp32_sum_b"};
  run_ranks(2, "user_schedule", {env, env});
  std::filesystem::remove_all(dir);
}

TEST_CASE("two processes: MK_SELECT_FILE picks schedules and knobs, and init fails on both when it differs or is malformed") {
  MKT_REQUIRE_FAKE();
  const std::string good = write_select("mkt_select_good.json", R"({"mkernel_select": 1, "entries": [
    {"collective": "allreduce", "min_ranks": 2, "max_ranks": 2, "min_bytes": 0, "max_bytes": 1048576,
     "schedule": "allreduce.two_shot", "tune": "ll_instances=2"}]})");
  const std::string bad = write_select("mkt_select_bad.json", R"({"mkernel_select": 1, "entries": [
    {"collective": "allreduce", "schedule": "allgather.direct"}]})");
  run_ranks(2, "select", {{"MK_SELECT_FILE=" + good}, {"MK_SELECT_FILE=" + good}});
  run_ranks(2, "select_differs", {{}, {"MK_SELECT_FILE=" + good}});
  run_ranks(2, "select_bad", {{}, {"MK_SELECT_FILE=" + bad}});
  const std::string knobs = write_select("mkt_select_knobs.json", R"({"mkernel_select": 1, "entries": [
    {"collective": "allreduce", "min_ranks": 2, "min_bytes": 0, "max_bytes": 1024, "schedule": "allreduce.one_shot",
     "tune": "ll_instances=2"},
    {"collective": "allreduce", "min_ranks": 2, "min_bytes": 1025, "max_bytes": 262144, "schedule": "allreduce.one_shot",
     "tune": "ll_instances=8"}]})");
  run_ranks(2, "select_knobs", {{"MK_SELECT_FILE=" + knobs}, {"MK_SELECT_FILE=" + knobs}});
  std::filesystem::remove(good);
  std::filesystem::remove(bad);
  std::filesystem::remove(knobs);
}

TEST_CASE("processes: copy-engine all-gather, all-to-all, broadcast, reduce-scatter and all-reduce compute the right bytes, also in a graph") {
  MKT_REQUIRE_FAKE();
  const std::vector<std::string> env = {
      "MK_ALGO=allgather=allgather.ce,alltoall=alltoall.ce,broadcast=broadcast.ce,reducescatter=reducescatter.ce,"
      "allreduce=allreduce.ce",
      "MK_TUNE=ce_tile=65536"};
  // a cache of their own: mkCommPrewarm must fill it, the calls must not add to it
  const std::string cache = (std::filesystem::temp_directory_path() / ("mkt-ce-cache-" + std::to_string(::getpid()))).string();
  std::vector<std::string> env2 = env;
  env2.push_back("MK_CACHE_DIR=" + cache + "-2");
  std::vector<std::string> env3 = env;
  env3.push_back("MK_CACHE_DIR=" + cache + "-3");
  run_ranks(2, "copy_engine", {env2, env2});
  run_ranks(3, "copy_engine", {env3, env3, env3});
  std::filesystem::remove_all(cache + "-2");
  std::filesystem::remove_all(cache + "-3");
  run_ranks(1, "copy_engine_group", {env});
}

TEST_CASE("one process: copy-engine scratch that does not fit is a clear error naming the knobs") {
  MKT_REQUIRE_FAKE();
  run_ranks(1, "copy_engine_scratch", {{"MK_ALGO=allgather=allgather.ce", "MK_SCRATCH_BYTES=1048576"}});
}

TEST_CASE("two processes: a peer that never calls stops a copy-engine transfer at the timeout, sticky and named") {
  MKT_REQUIRE_FAKE();
  const std::vector<std::string> env = {"MK_ALGO=allgather=allgather.ce", "MK_TUNE=ce_tile=65536", "MK_TIMEOUT_MS=300"};
  run_ranks(2, "copy_engine_stall", {env, env});
}

TEST_CASE("two processes: mkCommBootstrapBroadcast carries rank 0's bytes and refuses bad arguments") {
  MKT_REQUIRE_FAKE();
  run_ranks(2, "bcast", {});
}

TEST_CASE("three processes: rank 0's process ends during a split, the others' splits fail within a second naming it") {
  MKT_REQUIRE_FAKE();
  const std::vector<std::string> env = {"MK_BOOTSTRAP_TIMEOUT_MS=20000"};
  const auto t0 = std::chrono::steady_clock::now();
  run_ranks(3, "split_peer_exit", {env, env, env});
  CHECK(mkt::ms_since(t0) < mkt::bound_ms(10000));
}

#ifdef MKT_SHIM
TEST_CASE("two processes: nccl shim creates the real NCCL communicator for a send, its id shared by mKernel") {
  MKT_REQUIRE_FAKE();
  run_ranks(2, "shim", {});
}
#endif

#ifdef MKT_SHIM
TEST_CASE("four processes on two MK_NET nodes: the shim sends a broadcast or reduce rooted off a node's first rank to NCCL") {
  MKT_REQUIRE_FAKE();
  auto env = [](const char* node) {
    return std::vector<std::string>{std::string("MK_HOST_ID=") + node, "MK_NET=socket", "MK_SOCKET_IFNAME==lo",
                                    "MK_SCRATCH_BYTES=67108864", "MK_TUNE=simple_instances=2"};
  };
  run_ranks(4, "shim_net_roots", {env("node-a"), env("node-a"), env("node-b"), env("node-b")});
}
#endif

#ifdef MKT_SHIM
TEST_CASE("three processes: ncclCommShrink through the NCCL-compatible library leaves out a dead rank on mKernel") {
  MKT_REQUIRE_FAKE();
  run_ranks(3, "shim_shrink", {});
}
#endif

#ifdef MKT_SHIM
TEST_CASE("four processes on two nodes: nccl shim hands the spanning communicator to NCCL and its node split to mKernel") {
  MKT_REQUIRE_FAKE();
  const std::vector<std::string> a = {"MK_HOST_ID=node-a"}, b = {"MK_HOST_ID=node-b"};
  run_ranks(4, "shim_two_nodes", {a, a, b, b});
}

TEST_CASE("two processes of two ranks on two nodes: nccl shim group init hands the world to NCCL without a deadlock") {
  MKT_REQUIRE_FAKE();
  run_ranks(2, "shim_group_nodes", {{"MK_HOST_ID=node-a"}, {"MK_HOST_ID=node-b"}});
}

TEST_CASE("two processes: nccl shim on a rank without a real NCCL fails its peer at once, not at a timeout") {
  MKT_REQUIRE_FAKE();
  run_ranks(2, "shim_no_real_on_one", {});
}

TEST_CASE("two processes: nccl shim with MK_NCCL_EAGER=1 makes the real NCCL communicator at init") {
  MKT_REQUIRE_FAKE();
  run_ranks(2, "shim_eager", {});
}
#endif
