// libnccl-net-mkernel.so: mKernel's socket transport as an NCCL net plugin.
// The real NCCL loads it with NCCL_NET_PLUGIN=mkernel (or the file's path) and
// then moves its inter-node traffic over our transport: a client nobody here
// wrote testing runtime/transport/net/socket.cpp. mKernel's own loader
// (runtime/transport/net/plugin.cpp) loads it too, in the contract suite.
//
// Exports ncclNetPlugin_v8, v9, v10 and v11 (NCCL 2.19 and later pick the
// newest they know). Settings: MK_SOCKET_IFNAME, MK_SOCKET_FAMILY,
// MK_SOCKET_NSTREAMS, as for mKernel itself. Built from socket.cpp and
// iface.cpp alone, libstdc++ linked in, only the four tables exported.
#include <climits>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>

#include "runtime/api/status.hpp"
#include "runtime/transport/net/nccl_net_abi.h"
#include "runtime/transport/net/net.hpp"

namespace {

namespace abi = mk::rt::net::abi;
using mk::rt::net::Net;

std::mutex g_mu;
std::unique_ptr<Net> g_net;
abi::Logger g_log = nullptr;
std::string g_name, g_pci;
int g_ctx_tag;  // v11's context: one for every init (the transport keeps no per-context state)

abi::Result result_of(mkResult_t c) {
  switch (c) {
    case mkRemoteError: return abi::kRemoteError;
    case mkSystemError: return abi::kSystemError;
    case mkInvalidArgument: return abi::kInvalidArgument;
    case mkInvalidUsage: return abi::kInvalidUsage;
    default: return abi::kInternalError;
  }
}

// Runs `f`; an exception becomes a result code and a warning through NCCL's logger.
template <class F>
abi::Result guard(const char* fn, F&& f) {
  try {
    f();
    return abi::kSuccess;
  } catch (const mk::rt::RtError& e) {
    if (g_log) g_log(2 /* NCCL_LOG_WARN */, ~0ul, "mkernel-net", 0, "%s: %s", fn, e.what());
    return result_of(e.code());
  } catch (const std::bad_alloc&) {
    return abi::kSystemError;
  } catch (const std::exception& e) {
    if (g_log) g_log(2, ~0ul, "mkernel-net", 0, "%s: %s", fn, e.what());
    return abi::kInternalError;
  } catch (...) {
    return abi::kInternalError;
  }
}

Net& net() {
  if (!g_net) mk::rt::fail(mkInvalidUsage, "the plugin was not initialised");
  return *g_net;
}

abi::Result init_common(abi::Logger log) {
  std::lock_guard<std::mutex> lk(g_mu);
  g_log = log;
  return guard("init", [] {
    if (!g_net) g_net = mk::rt::net::make_socket_net(mk::rt::net::socket_options_from_env());
  });
}

abi::Result init_v8(abi::Logger log) { return init_common(log); }
abi::Result init_v10(abi::Logger log, abi::ProfilerCallback) { return init_common(log); }
abi::Result init_v11(void** ctx, uint64_t, abi::CommConfig*, abi::Logger log, abi::ProfilerCallback) {
  if (ctx) *ctx = &g_ctx_tag;
  return init_common(log);
}
abi::Result finalize_v11(void*) { return abi::kSuccess; }
abi::Result devices(int* n) {
  return guard("devices", [&] { *n = net().devices(); });
}

template <class P>
abi::Result get_props(int dev, P* p) {
  return guard("getProperties", [&] {
    const mk::rt::net::Props o = net().properties(dev);
    std::lock_guard<std::mutex> lk(g_mu);
    g_name = o.name;  // one device: the strings stay valid until the next call
    g_pci = o.pci_path;
    std::memset(p, 0, sizeof *p);
    p->name = const_cast<char*>(g_name.c_str());
    p->pciPath = g_pci.empty() ? nullptr : const_cast<char*>(g_pci.c_str());
    p->guid = o.guid;
    p->ptrSupport = o.ptr_support;
    p->regIsGlobal = o.reg_is_global;
    p->speed = o.speed_mbps;
    p->port = o.port;
    p->latency = o.latency_us;
    p->maxComms = o.max_comms;
    p->maxRecvs = o.max_recvs;
    if constexpr (sizeof(P) > sizeof(abi::PropsV8)) {
      p->forceFlush = o.force_flush;
      p->vProps.ndevs = 1;
      p->vProps.devs[0] = dev;
      p->maxP2pBytes = o.max_p2p_bytes;
      p->maxCollBytes = o.max_p2p_bytes;
    }
  });
}
abi::Result props_v8(int dev, abi::PropsV8* p) { return get_props(dev, p); }
abi::Result props_v9(int dev, abi::PropsV9* p) { return get_props(dev, p); }
abi::Result props_v11(int dev, abi::PropsV11* p) {
  const abi::Result r = get_props(dev, p);
  if (r == abi::kSuccess) p->maxMultiRequestSize = 1;
  return r;
}

abi::Result listen(int dev, void* handle, void** lc) {
  return guard("listen", [&] {
    mk::rt::net::Handle h;
    *lc = net().listen(dev, &h);
    std::memcpy(handle, h.bytes, mk::rt::net::kHandleBytes);
  });
}
abi::Result listen_v11(void*, int dev, void* handle, void** lc) { return listen(dev, handle, lc); }
abi::Result connect(int dev, void* handle, void** sc, abi::DeviceHandle**) {
  return guard("connect", [&] {
    mk::rt::net::Handle h;
    std::memcpy(h.bytes, handle, mk::rt::net::kHandleBytes);
    *sc = net().connect(dev, h);
  });
}
abi::Result connect_v10(int dev, abi::CommConfig*, void* handle, void** sc, abi::DeviceHandle** d) {
  return connect(dev, handle, sc, d);
}
abi::Result connect_v11(void*, int dev, void* handle, void** sc, abi::DeviceHandle** d) {
  return connect(dev, handle, sc, d);
}
abi::Result accept(void* lc, void** rc, abi::DeviceHandle**) {
  return guard("accept", [&] { *rc = net().accept(lc); });
}
abi::Result reg_mr(void* comm, void* data, size_t size, int type, void** mh) {
  return guard("regMr", [&] { *mh = net().reg_mr(comm, data, size, type); });
}
abi::Result reg_dmabuf(void* comm, void* data, size_t size, int type, uint64_t off, int fd, void** mh) {
  return guard("regMrDmaBuf", [&] { *mh = net().reg_mr_dmabuf(comm, data, size, type, off, fd); });
}
abi::Result dereg_mr(void* comm, void* mh) {
  return guard("deregMr", [&] { net().dereg_mr(comm, mh); });
}
abi::Result isend(void* sc, void* data, size_t size, int tag, void* mh, void** req) {
  return guard("isend", [&] { *req = net().isend(sc, data, size, tag, mh); });
}
abi::Result isend_v8(void* sc, void* data, int size, int tag, void* mh, void** req) {
  if (size < 0) return abi::kInvalidArgument;
  return isend(sc, data, size_t(size), tag, mh, req);
}
abi::Result isend_v10(void* sc, void* data, size_t size, int tag, void* mh, void*, void** req) {
  return isend(sc, data, size, tag, mh, req);
}
abi::Result irecv(void* rc, int n, void** data, size_t size, int* tags, void** mhs, void** req) {
  if (n != 1) return abi::kInvalidUsage;  // maxRecvs is 1: no grouped receives
  return guard("irecv", [&] { *req = net().irecv(rc, data[0], size, tags[0], mhs ? mhs[0] : nullptr); });
}
abi::Result irecv_v8(void* rc, int n, void** data, int* sizes, int* tags, void** mhs, void** req) {
  if (n != 1 || sizes[0] < 0) return abi::kInvalidUsage;
  return irecv(rc, n, data, size_t(sizes[0]), tags, mhs, req);
}
abi::Result irecv_v9(void* rc, int n, void** data, size_t* sizes, int* tags, void** mhs, void** req) {
  if (n != 1) return abi::kInvalidUsage;
  return irecv(rc, n, data, sizes[0], tags, mhs, req);
}
abi::Result irecv_v10(void* rc, int n, void** data, size_t* sizes, int* tags, void** mhs, void**, void** req) {
  return irecv_v9(rc, n, data, sizes, tags, mhs, req);
}
abi::Result iflush(void*, int, void**, int*, void**, void** req) {
  *req = nullptr;  // host memory: nothing to flush
  return abi::kSuccess;
}
abi::Result test(void* req, int* done, int* size) {
  return guard("test", [&] {
    size_t bytes = 0;
    *done = net().test(req, &bytes) ? 1 : 0;
    if (*done && size) *size = int(bytes > size_t(INT_MAX) ? INT_MAX : bytes);
  });
}
abi::Result close_send(void* c) {
  return guard("closeSend", [&] { net().close_send(c); });
}
abi::Result close_recv(void* c) {
  return guard("closeRecv", [&] { net().close_recv(c); });
}
abi::Result close_listen(void* c) {
  return guard("closeListen", [&] { net().close_listen(c); });
}

}  // namespace

#define MK_EXPORT extern "C" __attribute__((visibility("default")))

MK_EXPORT const abi::NetV8 ncclNetPlugin_v8 = {
    "mkernel-socket", init_v8, devices, props_v8, listen, connect, accept, reg_mr, reg_dmabuf, dereg_mr,
    isend_v8, irecv_v8, iflush, test, close_send, close_recv, close_listen, nullptr, nullptr};
MK_EXPORT const abi::NetV9 ncclNetPlugin_v9 = {
    "mkernel-socket", init_v8, devices, props_v9, listen, connect, accept, reg_mr, reg_dmabuf, dereg_mr,
    isend, irecv_v9, iflush, test, close_send, close_recv, close_listen, nullptr, nullptr, nullptr};
MK_EXPORT const abi::NetV10 ncclNetPlugin_v10 = {
    "mkernel-socket", init_v10, devices, props_v9, listen, connect_v10, accept, reg_mr, reg_dmabuf, dereg_mr,
    isend_v10, irecv_v10, iflush, test, close_send, close_recv, close_listen, nullptr, nullptr, nullptr};
MK_EXPORT const abi::NetV11 ncclNetPlugin_v11 = {
    "mkernel-socket", init_v11, devices, props_v11, listen_v11, connect_v11, accept, reg_mr, reg_dmabuf, dereg_mr,
    isend_v10, irecv_v10, iflush, test, close_send, close_recv, close_listen, nullptr, nullptr, nullptr,
    finalize_v11, nullptr};
