// The C API (include/mk.h): thin extern "C" wrappers. Each turns exceptions
// into an mkResult_t and records the message for mkGetLastError; the work is
// in enqueue.cpp (collectives, groups), lifecycle.cpp (communicators) and
// register.cpp (registration).
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "compiler/common/side_by_side.hpp"
#include "mk.h"
#include "mk/error.hpp"
#include "compiler/jit/jit.hpp"
#include "mk/dsl.hpp"
#include "runtime/launch/ce.hpp"
#include "runtime/comm/comm.hpp"
#include "runtime/launch/enqueue.hpp"
#include "runtime/api/handles.hpp"
#include "runtime/comm/lifecycle.hpp"
#include "runtime/api/status.hpp"

namespace mk::rt {

namespace {

thread_local std::string t_last_error = "no error";

// Runs f; the message of a failure goes to the thread's last error and, when
// `comm` is a live communicator, to its last error too.
template <typename F>
mkResult_t guard(mkComm_t comm, F&& f) {
  auto record = [&](mkResult_t code, const std::string& msg) {
    t_last_error = msg;
    if (comm) {
      try {
        acquire(comm)->set_last_error(msg);
      } catch (...) {
      }
    }
    debug_log("error: " + msg);
    return code;
  };
  try {
    f();
    return mkSuccess;
  } catch (...) {
    const CaughtError e = caught_error();
    return record(e.code, e.what);
  }
}

// Queries on a communicator: usable once its init is done.
std::shared_ptr<Comm> ready(mkComm_t comm, const char* api) {
  auto c = acquire(comm);
  if (c->state.load() == int(CommState::initializing))
    fail(mkInProgress, std::string(api) + ": the communicator is still being initialised (nonblocking init)");
  if (c->state.load() == int(CommState::failed)) fail(mkResult_t(c->async_error.load()), std::string(api) + ": " + c->error_message());
  return c;
}

mkResult_t collective(const Call& k, mkComm_t comm, cudaStream_t stream) {
  const mkResult_t r = guard(comm, [&] { enqueue(k, comm, stream); });
  if (r != mkSuccess) group_fail(r, t_last_error);
  return r;
}

}  // namespace
}  // namespace mk::rt

using namespace mk;
using namespace mk::rt;

extern "C" {

mkResult_t mkGetVersion(int* version) {
  return guard(nullptr, [&] {
    if (!version) fail(mkInvalidArgument, "mkGetVersion: version is NULL");
    *version = MK_VERSION_CODE;
  });
}

const char* mkGetErrorString(mkResult_t result) {
  switch (result) {
    case mkSuccess: return "no error";
    case mkUnhandledCudaError: return "unhandled cuda error (run with MK_DEBUG=1 for details)";
    case mkSystemError: return "unhandled system error (network, memory, driver)";
    case mkInternalError: return "internal error - please report this issue";
    case mkInvalidArgument: return "invalid argument (run with MK_DEBUG=1 for details)";
    case mkInvalidUsage: return "invalid usage (run with MK_DEBUG=1 for details)";
    case mkRemoteError: return "remote process exited or there was a network error";
    case mkInProgress: return "operation in progress";
    default: return "unknown result code";
  }
}

const char* mkGetLastError(mkComm_t comm) {
  // A copy per thread: the communicator's own string may change or go away.
  thread_local std::string copy;
  copy = t_last_error;
  if (comm) {
    try {
      std::string s = acquire(comm)->last_error();
      if (!s.empty()) copy = std::move(s);
    } catch (...) {
    }
  }
  return copy.c_str();
}

mkResult_t mkGetUniqueId(mkUniqueId* uniqueId) {
  return guard(nullptr, [&] {
    if (!uniqueId) fail(mkInvalidArgument, "mkGetUniqueId: uniqueId is NULL");
    bootstrap_create_id(uniqueId);
  });
}

mkResult_t mkCommInitRankConfig(mkComm_t* comm, int nranks, mkUniqueId commId, int rank, const mkConfig_t* config) {
  bool in_progress = false;
  const mkResult_t r = guard(nullptr, [&] {
    if (!comm) fail(mkInvalidArgument, "mkCommInitRank: comm is NULL");
    *comm = nullptr;
    *comm = lifecycle_init_rank(nranks, commId, rank, config, &in_progress);
  });
  return r == mkSuccess && in_progress ? mkInProgress : r;
}

mkResult_t mkCommInitRank(mkComm_t* comm, int nranks, mkUniqueId commId, int rank) {
  return mkCommInitRankConfig(comm, nranks, commId, rank, nullptr);
}

mkResult_t mkCommInitAll(mkComm_t* comms, int ndev, const int* devlist) {
  return guard(nullptr, [&] {
    if (!comms) fail(mkInvalidArgument, "mkCommInitAll: comms is NULL");
    auto all = lifecycle_init_all(ndev, devlist);
    for (int i = 0; i < ndev; ++i) comms[i] = all[size_t(i)];
  });
}

mkResult_t mkCommSplit(mkComm_t comm, int color, int key, mkComm_t* newcomm, const mkConfig_t* config) {
  bool in_progress = false;
  const mkResult_t r = guard(comm, [&] {
    if (!newcomm) fail(mkInvalidArgument, "mkCommSplit: newcomm is NULL");
    *newcomm = nullptr;
    *newcomm = lifecycle_split(comm, color, key, config, &in_progress);
  });
  return r == mkSuccess && in_progress ? mkInProgress : r;
}

mkResult_t mkCommShrink(mkComm_t comm, int* excludeRanksList, int excludeRanksCount, mkComm_t* newcomm,
                        const mkConfig_t* config, int shrinkFlags) {
  return guard(comm, [&] {
    if (!newcomm) fail(mkInvalidArgument, "mkCommShrink: newcomm is NULL");
    *newcomm = nullptr;
    *newcomm = lifecycle_shrink(comm, excludeRanksList, excludeRanksCount, config, shrinkFlags);
  });
}

mkResult_t mkCommFinalize(mkComm_t comm) {
  return guard(comm, [&] { lifecycle_finalize(comm); });
}

mkResult_t mkCommDestroy(mkComm_t comm) {
  return guard(nullptr, [&] { lifecycle_close(comm, false); });
}

mkResult_t mkCommAbort(mkComm_t comm) {
  return guard(nullptr, [&] { lifecycle_close(comm, true); });
}

mkResult_t mkCommGetAsyncError(mkComm_t comm, mkResult_t* asyncError) {
  return guard(comm, [&] {
    if (!asyncError) fail(mkInvalidArgument, "mkCommGetAsyncError: asyncError is NULL");
    std::string msg;
    *asyncError = lifecycle_async_error(comm, &msg);
    if (!msg.empty()) t_last_error = msg;
  });
}

mkResult_t mkCommCount(const mkComm_t comm, int* count) {
  return guard(nullptr, [&] {
    auto c = ready(comm, "mkCommCount");
    if (!count) fail(mkInvalidArgument, "mkCommCount: count is NULL");
    *count = c->nranks;
  });
}

mkResult_t mkCommCuDevice(const mkComm_t comm, int* device) {
  return guard(nullptr, [&] {
    auto c = ready(comm, "mkCommCuDevice");
    if (!device) fail(mkInvalidArgument, "mkCommCuDevice: device is NULL");
    *device = c->device;
  });
}

mkResult_t mkCommUserRank(const mkComm_t comm, int* rank) {
  return guard(nullptr, [&] {
    auto c = ready(comm, "mkCommUserRank");
    if (!rank) fail(mkInvalidArgument, "mkCommUserRank: rank is NULL");
    *rank = c->rank;
  });
}

mkResult_t mkCommNodeCount(const mkComm_t comm, int* nodes) {
  return guard(nullptr, [&] {
    auto c = ready(comm, "mkCommNodeCount");
    if (!nodes) fail(mkInvalidArgument, "mkCommNodeCount: nodes is NULL");
    *nodes = c->nodes;
  });
}

mkResult_t mkCommIsBootstrapOnly(const mkComm_t comm, int* bootstrapOnly) {
  return guard(nullptr, [&] {
    auto c = ready(comm, "mkCommIsBootstrapOnly");
    if (!bootstrapOnly) fail(mkInvalidArgument, "mkCommIsBootstrapOnly: bootstrapOnly is NULL");
    *bootstrapOnly = c->bootstrap_only ? 1 : 0;
  });
}

mkResult_t mkCommBootstrapBroadcast(mkComm_t comm, void* buf, size_t bytes, int root) {
  return guard(comm, [&] {
    auto c = ready(comm, "mkCommBootstrapBroadcast");
    c->check_usable("mkCommBootstrapBroadcast");
    if (!buf && bytes) fail(mkInvalidArgument, "mkCommBootstrapBroadcast: buf is NULL");
    if (bytes > 4096) fail(mkInvalidArgument, fmt::format("mkCommBootstrapBroadcast: {} bytes (at most 4096)", bytes));
    if (root < 0 || root >= c->nranks)
      fail(mkInvalidArgument, fmt::format("mkCommBootstrapBroadcast: root {} is not a rank of {}", root, c->nranks));
    if (c->nranks == 1) return;
    if (!c->boot)
      fail(mkInvalidUsage, "mkCommBootstrapBroadcast: the ranks of this communicator share one process "
                           "(mkCommInitAll) and have no bootstrap connection");
    const std::string mine = c->rank == root ? std::string(static_cast<const char*>(buf), bytes) : std::string();
    const auto all = c->boot->allgather(mine);
    if (all.size() != size_t(c->nranks) || all[size_t(root)].size() != bytes)
      fail(mkInvalidUsage, fmt::format("mkCommBootstrapBroadcast: root {} sent {} bytes, this rank expected {}", root,
                                       all.size() > size_t(root) ? all[size_t(root)].size() : 0, bytes));
    std::memcpy(buf, all[size_t(root)].data(), bytes);
  });
}

mkResult_t mkCommPrewarm(mkComm_t comm, const mkDataType_t* dtypes, int ndtypes, const mkRedOp_t* ops, int nops,
                         int nthreads) {
  return guard(comm, [&] {
    auto c = ready(comm, "mkCommPrewarm");
    c->check_serves("mkCommPrewarm");
    if (ndtypes < 0 || nops < 0 || nthreads < 0)
      fail(mkInvalidArgument, "mkCommPrewarm: ndtypes, nops and nthreads must not be negative");
    if ((ndtypes > 0 && !dtypes) || (nops > 0 && !ops))
      fail(mkInvalidArgument, "mkCommPrewarm: dtypes or ops is NULL");
    std::vector<DType> dts;
    for (int i = 0; i < ndtypes; ++i) {
      if (int(dtypes[i]) < 0 || int(dtypes[i]) >= mkNumTypes)
        fail(mkInvalidArgument, fmt::format("mkCommPrewarm: datatype {} is not an mkDataType_t", int(dtypes[i])));
      if (std::find(dts.begin(), dts.end(), DType(dtypes[i])) == dts.end()) dts.push_back(DType(dtypes[i]));
    }
    std::vector<RedOp> rops;
    for (int i = 0; i < nops; ++i) {
      RedOp op = RedOp::sum;
      if (int(ops[i]) >= int(mkNumOps)) {  // a PreMulSum handle: its kernels are one plan per dtype, whatever the scalar
        std::lock_guard<std::mutex> lock(c->mu);
        if (!c->premul(int(ops[i])))
          fail(mkInvalidArgument, fmt::format("mkCommPrewarm: reduction op {} is neither a built-in mkRedOp_t nor a "
                                              "PreMulSum op of this communicator",
                                              int(ops[i])));
        op = RedOp::premulsum;
      } else if (int(ops[i]) < 0) {
        fail(mkInvalidArgument, fmt::format("mkCommPrewarm: reduction op {} is not an mkRedOp_t", int(ops[i])));
      } else {
        op = RedOp(ops[i]);
      }
      if (std::find(rops.begin(), rops.end(), op) == rops.end()) rops.push_back(op);
    }
    if (rops.empty()) rops.push_back(RedOp::sum);
    struct Job {
      Choice choice;
      Collective coll;
      DType dtype;
      RedOp op;
      std::string source, name;  // a copy-engine kernel to compile instead of a plan
    };
    std::vector<Job> jobs;
    bool ce_sync = false;
    for (int ci = 0; ci < kNumCollectives; ++ci) {
      const Collective coll = Collective(ci);
      for (const Choice& s : schedules_for(coll, c->topo))
        for (DType dt : dts)
          for (RedOp op : rops) {
            if (!collective_reduces(coll) && op != rops.front()) continue;  // one plan serves every op
            // and every type of its size (kernel_dtype): the first type of each size only
            auto same_size = [&](DType x) { return kernel_dtype(coll, x) == kernel_dtype(coll, dt); };
            if (!collective_reduces(coll) && *std::find_if(dts.begin(), dts.end(), same_size) != dt) continue;
            if (!collective_reduces(coll) && op == RedOp::premulsum) op = RedOp::sum;
            // PreMulSum never runs on copy engines (create_instance takes the built-in table's choice)
            const dsl::ScheduleInfo* info = op == RedOp::premulsum ? dsl::find_schedule(s.schedule) : nullptr;
            if (info && info->copy_engine) continue;
            jobs.push_back({s, coll, dt, op, "", ""});
          }
      // Copy-engine schedules compile no plan, but their kernels (the sync
      // kernel, and the reduce kernel per dtype and op) go into the cache.
      if (schedules_for(coll, c->topo, true).empty()) continue;
      ce_sync = true;
      if (collective_reduces(coll))
        for (DType dt : dts)
          for (RedOp op : rops) {
            if (op == RedOp::premulsum) continue;
            Job j{{}, coll, dt, op, "", ""};
            j.source = ce::reduce_source(dt, op, &j.name);
            if (std::none_of(jobs.begin(), jobs.end(), [&](const Job& x) { return x.name == j.name; })) jobs.push_back(j);
          }
    }
    if (ce_sync) jobs.push_back({{}, Collective::allgather, DType::uint8, RedOp::sum, ce::sync_source(), "mk_ce_sync"});
    const int32_t max_grid = c->grid_cap();
    const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
    const size_t workers = std::min<size_t>(jobs.size(), nthreads > 0 ? size_t(nthreads) : hw);
    std::mutex err_mu;
    std::optional<RtError> first;
    work_queue(jobs.size(), workers, [&](size_t i) {
      const Job& j = jobs[i];
      try {
        c->check_usable("mkCommPrewarm");  // stops early once the communicator is aborted or destroyed
        if (!j.source.empty()) {
          try {
            jit::compile(j.source, j.name, c->arch);
          } catch (const Error& e) {
            throw RtError(mkSystemError, std::string("mkCommPrewarm: compiling ") + j.name + ": " + e.what());
          }
          return;
        }
        get_plan(j.choice.schedule, j.coll, c->topo, j.dtype, j.op, c->arch, false, max_grid, c->rank, j.choice.tune);
      } catch (const ScheduleRefused&) {
        // a schedule PreMulSum calls do not use: they take the built-in table's (prewarmed with it)
      } catch (const RtError& e) {
        std::lock_guard<std::mutex> g(err_mu);
        if (!first) first = e;
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> g(err_mu);
        if (!first) first = RtError(mkInternalError, std::string("mkCommPrewarm: ") + e.what());
      }
    });
    if (first) throw *first;
    debug_log(fmt::format("rank {}: prewarmed {} plans on {} threads", c->rank, jobs.size(), workers));
  });
}

mkResult_t mkCommRegister(const mkComm_t comm, void* buff, size_t size, void** handle) {
  return guard(comm, [&] {
    auto c = acquire(comm);
    c->check_serves("mkCommRegister");
    comm_register(*c, buff, size, handle);
  });
}

mkResult_t mkCommDeregister(const mkComm_t comm, void* handle) {
  return guard(comm, [&] {
    auto c = acquire(comm);
    c->check_serves("mkCommDeregister");
    comm_deregister(*c, handle);
  });
}

mkResult_t mkRedOpCreatePreMulSum(mkRedOp_t* op, void* scalar, mkDataType_t datatype, mkScalarResidence_t residence,
                                  mkComm_t comm) {
  return guard(comm, [&] {
    auto c = ready(comm, "mkRedOpCreatePreMulSum");
    c->check_serves("mkRedOpCreatePreMulSum");
    if (!op) fail(mkInvalidArgument, "mkRedOpCreatePreMulSum: op is NULL");
    if (!scalar) fail(mkInvalidArgument, "mkRedOpCreatePreMulSum: scalar is NULL");
    if (int(datatype) < 0 || int(datatype) >= mkNumTypes)
      fail(mkInvalidArgument,
           fmt::format("mkRedOpCreatePreMulSum: datatype {} is not an mkDataType_t", int(datatype)));
    if (residence != mkScalarDevice && residence != mkScalarHostImmediate)
      fail(mkInvalidArgument, fmt::format("mkRedOpCreatePreMulSum: residence {} is neither mkScalarDevice (0) nor "
                                          "mkScalarHostImmediate (1)",
                                          int(residence)));
    Comm::PreMul m;
    m.dtype = DType(datatype);
    const size_t es = dtype_size(m.dtype);
    if (residence == mkScalarHostImmediate) {
      std::memcpy(&m.value, scalar, es);  // little-endian: the kernel reads the low bytes
    } else {
      check_scalar_pointer(*c, scalar, es, "mkRedOpCreatePreMulSum");
      m.ptr = scalar;
    }
    // Never reused (runtime/comm/comm.hpp): a stale handle fails forever.
    static std::atomic<int64_t> next{int64_t(mkNumOps)};
    const int64_t h = next.fetch_add(1);
    if (h >= int64_t(mkMaxRedOp)) {
      next.store(int64_t(mkMaxRedOp));
      fail(mkInvalidUsage, "mkRedOpCreatePreMulSum: this process has created 2^31 PreMulSum ops; handles are never "
                           "reused, so no more can be created");
    }
    std::lock_guard<std::mutex> lock(c->mu);
    if (c->premuls.size() >= size_t(1) << 20)
      fail(mkInvalidUsage, "mkRedOpCreatePreMulSum: 2^20 ops of this communicator are live; destroy some first");
    c->premuls.emplace(int(h), m);
    *op = mkRedOp_t(h);
  });
}

mkResult_t mkRedOpDestroy(mkRedOp_t op, mkComm_t comm) {
  return guard(comm, [&] {
    auto c = acquire(comm);  // also on a communicator that failed: the handle is freed
    if (int(op) >= 0 && int(op) < mkNumOps)
      fail(mkInvalidArgument, fmt::format("mkRedOpDestroy: op {} is a built-in op, not one from "
                                          "mkRedOpCreatePreMulSum",
                                          int(op)));
    std::lock_guard<std::mutex> lock(c->mu);
    Comm::PreMul* m = c->premul(int(op));
    if (!m)
      fail(mkInvalidArgument, fmt::format("mkRedOpDestroy: op {} is not a live PreMulSum op of this communicator "
                                          "(destroyed twice, or created on another communicator?)",
                                          int(op)));
    c->premuls.erase(int(op));
  });
}

mkResult_t mkAllReduce(const void* sendbuff, void* recvbuff, size_t count, mkDataType_t datatype, mkRedOp_t op,
                       mkComm_t comm, cudaStream_t stream) {
  return collective({Collective::allreduce, sendbuff, recvbuff, count, int(datatype), int(op), 0}, comm, stream);
}

mkResult_t mkAllReduceFused(const void* sendbuff, void* recvbuff, size_t count, mkDataType_t datatype, mkRedOp_t op,
                            const mkFusion_t* fusion, mkComm_t comm, cudaStream_t stream) {
  return collective({Collective::allreduce, sendbuff, recvbuff, count, int(datatype), int(op), 0, fusion}, comm, stream);
}

mkResult_t mkBroadcast(const void* sendbuff, void* recvbuff, size_t count, mkDataType_t datatype, int root,
                       mkComm_t comm, cudaStream_t stream) {
  return collective({Collective::broadcast, sendbuff, recvbuff, count, int(datatype), 0, root}, comm, stream);
}

mkResult_t mkReduce(const void* sendbuff, void* recvbuff, size_t count, mkDataType_t datatype, mkRedOp_t op, int root,
                    mkComm_t comm, cudaStream_t stream) {
  return collective({Collective::reduce, sendbuff, recvbuff, count, int(datatype), int(op), root}, comm, stream);
}

mkResult_t mkAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, mkDataType_t datatype, mkComm_t comm,
                       cudaStream_t stream) {
  return collective({Collective::allgather, sendbuff, recvbuff, sendcount, int(datatype), 0, 0}, comm, stream);
}

mkResult_t mkReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, mkDataType_t datatype,
                           mkRedOp_t op, mkComm_t comm, cudaStream_t stream) {
  return collective({Collective::reducescatter, sendbuff, recvbuff, recvcount, int(datatype), int(op), 0}, comm,
                    stream);
}

mkResult_t mkAllToAll(const void* sendbuff, void* recvbuff, size_t count, mkDataType_t datatype, mkComm_t comm,
                      cudaStream_t stream) {
  return collective({Collective::alltoall, sendbuff, recvbuff, count, int(datatype), 0, 0}, comm, stream);
}

mkResult_t mkCompositeRun(const char* name, void* const* buffers, int nbuffers, size_t count, mkDataType_t datatype,
                          mkRedOp_t op, mkComm_t comm, cudaStream_t stream) {
  const mkResult_t r =
      guard(comm, [&] { composite_run(name, buffers, nbuffers, count, int(datatype), int(op), comm, stream); });
  if (r != mkSuccess) group_fail(r, t_last_error);  // inside the caller's own group: that group fails too
  return r;
}

mkResult_t mkGroupStart(void) {
  return guard(nullptr, [] { group_start(); });
}

mkResult_t mkGroupEnd(void) {
  return guard(nullptr, [] { group_end(); });
}

}  // extern "C"
