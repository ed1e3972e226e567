// NCCL, loaded at run time (the benchmarks compare with it when it is there
// and run mKernel alone when it is not): the entry points mk_bench and
// mk_group_bench call, from libnccl.so.2 on the library path or CUDA's.
#pragma once

#include <dlfcn.h>
#include <nccl.h>

#include <string>

namespace mkbench {

struct Nccl {
  decltype(&ncclGetUniqueId) getUniqueId = nullptr;
  decltype(&ncclCommInitRank) commInitRank = nullptr;
  decltype(&ncclCommInitAll) commInitAll = nullptr;
  decltype(&ncclCommDestroy) commDestroy = nullptr;
  decltype(&ncclAllReduce) allReduce = nullptr;
  decltype(&ncclAllGather) allGather = nullptr;
  decltype(&ncclReduceScatter) reduceScatter = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
  decltype(&ncclReduce) reduce = nullptr;
  decltype(&ncclAlltoAll) alltoAll = nullptr;
  decltype(&ncclGroupStart) groupStart = nullptr;
  decltype(&ncclGroupEnd) groupEnd = nullptr;
  decltype(&ncclGetErrorString) errorString = nullptr;
  decltype(&ncclGetVersion) getVersion = nullptr;
  decltype(&ncclMemAlloc) memAlloc = nullptr;
  decltype(&ncclMemFree) memFree = nullptr;
  decltype(&ncclCommWindowRegister) windowRegister = nullptr;
  decltype(&ncclCommWindowDeregister) windowDeregister = nullptr;
  decltype(&ncclRedOpCreatePreMulSum) redOpCreatePreMulSum = nullptr;
};

// Fills *n; false (and *why) when there is no NCCL or it lacks the basics
// (communicator init and destroy, all-reduce, all-gather, groups). Entry
// points of newer NCCL versions (windows, ncclMemAlloc) may stay null.
inline bool load_nccl(Nccl* n, std::string* why) {
  void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
  if (!h) h = dlopen("/usr/local/cuda/lib64/libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
  if (!h) {
    *why = dlerror();
    return false;
  }
#define MKB_LD(f, s) n->f = reinterpret_cast<decltype(n->f)>(dlsym(h, s))
  MKB_LD(getUniqueId, "ncclGetUniqueId");
  MKB_LD(commInitRank, "ncclCommInitRank");
  MKB_LD(commInitAll, "ncclCommInitAll");
  MKB_LD(commDestroy, "ncclCommDestroy");
  MKB_LD(allReduce, "ncclAllReduce");
  MKB_LD(allGather, "ncclAllGather");
  MKB_LD(reduceScatter, "ncclReduceScatter");
  MKB_LD(broadcast, "ncclBroadcast");
  MKB_LD(reduce, "ncclReduce");
  MKB_LD(alltoAll, "ncclAlltoAll");
  MKB_LD(groupStart, "ncclGroupStart");
  MKB_LD(groupEnd, "ncclGroupEnd");
  MKB_LD(errorString, "ncclGetErrorString");
  MKB_LD(getVersion, "ncclGetVersion");
  MKB_LD(memAlloc, "ncclMemAlloc");
  MKB_LD(memFree, "ncclMemFree");
  MKB_LD(windowRegister, "ncclCommWindowRegister");
  MKB_LD(windowDeregister, "ncclCommWindowDeregister");
  MKB_LD(redOpCreatePreMulSum, "ncclRedOpCreatePreMulSum");
#undef MKB_LD
  if (!n->getUniqueId || !n->commInitRank || !n->commInitAll || !n->commDestroy || !n->allReduce || !n->allGather ||
      !n->reduceScatter || !n->groupStart || !n->groupEnd) {
    *why = "libnccl.so.2 lacks ncclCommInitRank/ncclCommInitAll/ncclAllReduce/ncclAllGather/ncclReduceScatter/groups";
    return false;
  }
  return true;
}

}  // namespace mkbench
