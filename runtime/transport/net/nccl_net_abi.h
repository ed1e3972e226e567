// The binary interface of NCCL's net plugins, versions 8 to 11: the tables a
// plugin exports as ncclNetPlugin_vN (NCCL's src/include/plugin/net/net_vN.h
// describes them; this is our own rendering of that ABI, field by field in the
// same order and types). Used by the loader (plugin.cpp: mKernel drives any
// installed plugin) and by libnccl-net-mkernel.so (nccl/net_plugin.cpp:
// NCCL drives mKernel's socket transport).
#pragma once

#include <cstddef>
#include <cstdint>

namespace mk::rt::net::abi {

using Result = int;  // ncclResult_t
enum : Result {
  kSuccess = 0,
  kUnhandledCudaError = 1,
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6,
  kInProgress = 7,
};
// ncclDebugLogger_t: (level, flags, file, line, fmt, ...)
using Logger = void (*)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);
// ncclProfilerCallback_t (v10, v11): mKernel passes none.
using ProfilerCallback = Result (*)(void** handle, int type, void* phandle, int64_t plugin_id, void* data);
using DeviceType = int;  // ncclNetDeviceType (an enum: host 0, unpack 1)
struct DeviceHandle;     // ncclNetDeviceHandle_vN_t: device offload, unused (never requested)

constexpr int kMaxDevsPerNic = 4;  // NCCL_NET_MAX_DEVS_PER_NIC

struct PropsV8 {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  DeviceType netDeviceType;
  int netDeviceVersion;
};
struct VDeviceProps {
  int ndevs;
  int devs[kMaxDevsPerNic];
};
struct PropsV9 {  // also v10's
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  DeviceType netDeviceType;
  int netDeviceVersion;
  VDeviceProps vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
};
using PropsV10 = PropsV9;
struct PropsV11 {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  DeviceType netDeviceType;
  int netDeviceVersion;
  VDeviceProps vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
  int maxMultiRequestSize;
};
struct CommConfig {  // ncclNetCommConfig_v10_t / v11
  int trafficClass;  // -1: undefined
};
struct NetAttr;  // ncclNetAttr_v11_t (setNetAttr), unused

struct NetV8 {
  const char* name;
  Result (*init)(Logger);
  Result (*devices)(int*);
  Result (*getProperties)(int, PropsV8*);
  Result (*listen)(int, void*, void**);
  Result (*connect)(int, void*, void**, DeviceHandle**);
  Result (*accept)(void*, void**, DeviceHandle**);
  Result (*regMr)(void*, void*, size_t, int, void**);
  Result (*regMrDmaBuf)(void*, void*, size_t, int, uint64_t, int, void**);
  Result (*deregMr)(void*, void*);
  Result (*isend)(void*, void*, int, int, void*, void**);
  Result (*irecv)(void*, int, void**, int*, int*, void**, void**);
  Result (*iflush)(void*, int, void**, int*, void**, void**);
  Result (*test)(void*, int*, int*);
  Result (*closeSend)(void*);
  Result (*closeRecv)(void*);
  Result (*closeListen)(void*);
  Result (*getDeviceMr)(void*, void*, void**);
  Result (*irecvConsumed)(void*, int, void*);
};

struct NetV9 {
  const char* name;
  Result (*init)(Logger);
  Result (*devices)(int*);
  Result (*getProperties)(int, PropsV9*);
  Result (*listen)(int, void*, void**);
  Result (*connect)(int, void*, void**, DeviceHandle**);
  Result (*accept)(void*, void**, DeviceHandle**);
  Result (*regMr)(void*, void*, size_t, int, void**);
  Result (*regMrDmaBuf)(void*, void*, size_t, int, uint64_t, int, void**);
  Result (*deregMr)(void*, void*);
  Result (*isend)(void*, void*, size_t, int, void*, void**);
  Result (*irecv)(void*, int, void**, size_t*, int*, void**, void**);
  Result (*iflush)(void*, int, void**, int*, void**, void**);
  Result (*test)(void*, int*, int*);
  Result (*closeSend)(void*);
  Result (*closeRecv)(void*);
  Result (*closeListen)(void*);
  Result (*getDeviceMr)(void*, void*, void**);
  Result (*irecvConsumed)(void*, int, void*);
  Result (*makeVDevice)(int*, VDeviceProps*);
};

struct NetV10 {
  const char* name;
  Result (*init)(Logger, ProfilerCallback);
  Result (*devices)(int*);
  Result (*getProperties)(int, PropsV10*);
  Result (*listen)(int, void*, void**);
  Result (*connect)(int, CommConfig*, void*, void**, DeviceHandle**);
  Result (*accept)(void*, void**, DeviceHandle**);
  Result (*regMr)(void*, void*, size_t, int, void**);
  Result (*regMrDmaBuf)(void*, void*, size_t, int, uint64_t, int, void**);
  Result (*deregMr)(void*, void*);
  Result (*isend)(void*, void*, size_t, int, void*, void*, void**);
  Result (*irecv)(void*, int, void**, size_t*, int*, void**, void**, void**);
  Result (*iflush)(void*, int, void**, int*, void**, void**);
  Result (*test)(void*, int*, int*);
  Result (*closeSend)(void*);
  Result (*closeRecv)(void*);
  Result (*closeListen)(void*);
  Result (*getDeviceMr)(void*, void*, void**);
  Result (*irecvConsumed)(void*, int, void*);
  Result (*makeVDevice)(int*, VDeviceProps*);
};

struct NetV11 {
  const char* name;
  Result (*init)(void** ctx, uint64_t comm_id, CommConfig*, Logger, ProfilerCallback);
  Result (*devices)(int*);
  Result (*getProperties)(int, PropsV11*);
  Result (*listen)(void* ctx, int, void*, void**);
  Result (*connect)(void* ctx, int, void*, void**, DeviceHandle**);
  Result (*accept)(void*, void**, DeviceHandle**);
  Result (*regMr)(void*, void*, size_t, int, void**);
  Result (*regMrDmaBuf)(void*, void*, size_t, int, uint64_t, int, void**);
  Result (*deregMr)(void*, void*);
  Result (*isend)(void*, void*, size_t, int, void*, void*, void**);
  Result (*irecv)(void*, int, void**, size_t*, int*, void**, void**, void**);
  Result (*iflush)(void*, int, void**, int*, void**, void**);
  Result (*test)(void*, int*, int*);
  Result (*closeSend)(void*);
  Result (*closeRecv)(void*);
  Result (*closeListen)(void*);
  Result (*getDeviceMr)(void*, void*, void**);
  Result (*irecvConsumed)(void*, int, void*);
  Result (*makeVDevice)(int*, VDeviceProps*);
  Result (*finalize)(void* ctx);
  Result (*setNetAttr)(void* ctx, NetAttr*);
};

// Layouts on LP64 (pointers and size_t 8 bytes), checked so that an edit
// cannot silently shift a field.
static_assert(sizeof(PropsV8) == 64, "ncclNetProperties_v8_t");
static_assert(offsetof(PropsV9, vProps) == 64 && offsetof(PropsV9, maxP2pBytes) == 88 && sizeof(PropsV9) == 104,
              "ncclNetProperties_v9_t");
static_assert(offsetof(PropsV11, maxMultiRequestSize) == 104 && sizeof(PropsV11) == 112, "ncclNetProperties_v11_t");
static_assert(sizeof(NetV8) == 19 * 8 && sizeof(NetV9) == 20 * 8 && sizeof(NetV10) == 20 * 8 && sizeof(NetV11) == 22 * 8,
              "ncclNet_vN_t: one pointer per member");

}  // namespace mk::rt::net::abi
