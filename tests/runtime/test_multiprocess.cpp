// Two processes, one rank each, over the bootstrap: arenas and registered
// buffers are really shared (the fake maps the same memfd / shm bytes).
// The ranks are this binary started again (fresh processes, as with a
// launcher), so nothing of the parent's runtime state leaks into them.
#include <dlfcn.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm.hpp"
#include "tests/runtime/fake.hpp"
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

// A rank's context (GPU `rank`), a stream and its communicator; nonzero on failure.
int open_rank(int rank, int nranks, const mkUniqueId& id, CUstream* stream, mkComm_t* comm) {
  g_rank = rank;
  CUcontext ctx = nullptr;
  CHILD_CHECK(cu().cuDevicePrimaryCtxRetain(&ctx, rank) == CUDA_SUCCESS);
  CHILD_CHECK(cu().cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
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
  auto* c = reinterpret_cast<mk::rt::Comm*>(comm);
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

  CHILD_CHECK(mkCommDeregister(comm, handle) == mkSuccess);
  CHILD_CHECK(mkCommDestroy(comm) == mkSuccess);
  CHILD_CHECK(cu().cuMemFree(buf) == CUDA_SUCCESS);
  CHILD_CHECK(cu().cuMemFree(reg) == CUDA_SUCCESS);
  CHILD_CHECK(cu().cuStreamDestroy(stream) == CUDA_SUCCESS);
  CHILD_CHECK(cu().cuDevicePrimaryCtxRelease(rank) == CUDA_SUCCESS);
  const std::string leaked = mkt::leaks(before, mkt::counts());
  if (!leaked.empty()) std::fprintf(stderr, "rank %d leaked: %s\n", rank, leaked.c_str());
  CHILD_CHECK(leaked.empty());
  return 0;
}

// Init must fail on every rank, with a message that has every piece of `want`.
int expect_init_failure(int rank, int nranks, const mkUniqueId& id, mkResult_t code,
                        const std::vector<std::string>& want) {
  g_rank = rank;
  CUcontext ctx = nullptr;
  CHILD_CHECK(cu().cuDevicePrimaryCtxRetain(&ctx, rank) == CUDA_SUCCESS);
  CHILD_CHECK(cu().cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
  mkComm_t comm = nullptr;
  const mkResult_t r = mkCommInitRank(&comm, nranks, id, rank);
  const std::string msg = mkGetLastError(nullptr);
  std::fprintf(stderr, "rank %d: %s\n", rank, msg.c_str());
  CHILD_CHECK(r == code);
  CHILD_CHECK(comm == nullptr);
  for (const auto& w : want) CHILD_CHECK(msg.find(w) != std::string::npos);
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
  CHILD_CHECK(mkAllGather(p, reinterpret_cast<char*>(p) + 2048, 64, mkFloat32, comm, stream) == mkSuccess);
  CHILD_CHECK(mkfake_fn<decltype(mkfake_last_launch)>("mkfake_last_launch")(&l) == 1);
  CHILD_CHECK(std::string(l.function).find("allgather_direct") != std::string::npos);
  CHILD_CHECK(mkCommDestroy(comm) == mkSuccess);
  CHILD_CHECK(cu().cuMemFree(buf) == CUDA_SUCCESS);
  CHILD_CHECK(cu().cuStreamDestroy(stream) == CUDA_SUCCESS);
  return 0;
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
// environment; every one must exit 0 within 120 s.
void run_ranks(int nranks, const std::string& scenario, const std::vector<std::vector<std::string>>& env) {
  mkUniqueId id;
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
  if (scenario == "bcast") return bootstrap_broadcast(rank, nranks, id);
  if (scenario == "select") return selected(rank, nranks, id);
  if (scenario == "select_knobs") return selected_knobs(rank, nranks, id);
  if (scenario == "select_differs")
    return expect_init_failure(rank, nranks, id, mkInvalidUsage, {"ranks disagree on MK_SELECT_FILE", "rank 0 has 'none'"});
  if (scenario == "select_bad")
    return expect_init_failure(rank, nranks, id, rank == 1 ? mkInvalidArgument : mkInvalidUsage,
                               {"rank 1:", "MK_SELECT_FILE=", "$.entries[0].schedule", "implements allgather, not allreduce"});
#ifdef MKT_SHIM
  if (scenario == "shim") return shim_fallback(rank, nranks, id);
  if (scenario == "shim_eager") return shim_eager(rank, nranks, id);
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

TEST_CASE("two processes: a setting that shapes plans differs between ranks: init fails on both, naming it") {
  MKT_REQUIRE_FAKE();
  run_ranks(2, "settings", {{}, {"MK_ALGO=allreduce=allreduce.ring"}});
}

TEST_CASE("two processes: a malformed setting on one rank fails init on both, with that rank's message") {
  MKT_REQUIRE_FAKE();
  run_ranks(2, "bad_env", {{}, {"MK_TUNE=simple_instances=2abc"}});
}

namespace {
std::string write_select(const std::string& name, const std::string& text) {
  const std::string path = (std::filesystem::temp_directory_path() / (name + "." + std::to_string(::getpid()))).string();
  std::ofstream(path) << text;
  return path;
}
}  // namespace

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

TEST_CASE("two processes: mkCommBootstrapBroadcast carries rank 0's bytes and refuses bad arguments") {
  MKT_REQUIRE_FAKE();
  run_ranks(2, "bcast", {});
}

#ifdef MKT_SHIM
TEST_CASE("two processes: nccl shim creates the real NCCL communicator for a send, its id shared by mKernel") {
  MKT_REQUIRE_FAKE();
  run_ranks(2, "shim", {});
}
#endif

#ifdef MKT_SHIM
TEST_CASE("two processes: nccl shim with MK_NCCL_EAGER=1 makes the real NCCL communicator at init") {
  MKT_REQUIRE_FAKE();
  run_ranks(2, "shim_eager", {});
}
#endif
