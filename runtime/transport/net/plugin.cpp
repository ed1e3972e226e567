// Loads an installed NCCL net plugin (aws-ofi-nccl, vendors' plugins,
// libnccl-net-mkernel.so) and drives it through net.hpp's interface. The ABI
// is runtime/transport/net/nccl_net_abi.h; the newest table the plugin
// exports among v11 .. v8 is used (or the one asked for).
#include <dlfcn.h>

#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "runtime/api/status.hpp"
#include "runtime/transport/net/nccl_net_abi.h"
#include "runtime/transport/net/net.hpp"

namespace mk::rt::net {
namespace {

void plugin_log(int level, unsigned long, const char* file, int line, const char* fmt, ...) {
  if (!debug_enabled() || !fmt) return;
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  debug_log(std::string("net plugin (level ") + std::to_string(level) + ", " + (file ? file : "?") + ":" +
            std::to_string(line) + "): " + buf);
}

mkResult_t code_of(abi::Result r) {
  switch (r) {
    case abi::kRemoteError: return mkRemoteError;
    case abi::kSystemError: return mkSystemError;
    case abi::kInvalidArgument: return mkInvalidArgument;
    case abi::kInvalidUsage: return mkInvalidUsage;
    default: return mkInternalError;
  }
}

template <int V>
struct Table;
template <>
struct Table<8> {
  using T = abi::NetV8;
  using P = abi::PropsV8;
};
template <>
struct Table<9> {
  using T = abi::NetV9;
  using P = abi::PropsV9;
};
template <>
struct Table<10> {
  using T = abi::NetV10;
  using P = abi::PropsV10;
};
template <>
struct Table<11> {
  using T = abi::NetV11;
  using P = abi::PropsV11;
};

template <int V>
class PluginNet final : public Net {
  using T = typename Table<V>::T;
  using P = typename Table<V>::P;

 public:
  PluginNet(std::string file, const T* t) : file_(std::move(file)), t_(t) {
    for (auto fn : {(void*)t->init, (void*)t->devices, (void*)t->getProperties, (void*)t->listen, (void*)t->connect,
                    (void*)t->accept, (void*)t->regMr, (void*)t->deregMr, (void*)t->isend, (void*)t->irecv,
                    (void*)t->test, (void*)t->closeSend, (void*)t->closeRecv, (void*)t->closeListen})
      if (!fn) fail(mkSystemError, "NCCL net plugin " + label() + ": its table lacks a required function");
    if constexpr (V == 11) {
      abi::CommConfig cfg{-1};
      check(t->init(&ctx_, 0, &cfg, plugin_log, nullptr), "init");
    } else if constexpr (V == 10) {
      check(t->init(plugin_log, nullptr), "init");
    } else {
      check(t->init(plugin_log), "init");
    }
  }
  ~PluginNet() override {
    if constexpr (V == 11) {
      if (t_->finalize) t_->finalize(ctx_);
    }
    // The library stays loaded: plugins keep threads and state NCCL never unloads either.
  }

  std::string name() const override { return label(); }
  int devices() override {
    int n = 0;
    check(t_->devices(&n), "devices");
    return n;
  }
  Props properties(int dev) override {
    P p{};
    check(t_->getProperties(dev, &p), "getProperties");
    Props o;
    o.name = p.name ? p.name : "";
    o.pci_path = p.pciPath ? p.pciPath : "";
    o.guid = p.guid;
    o.ptr_support = p.ptrSupport;
    o.reg_is_global = p.regIsGlobal != 0;
    o.speed_mbps = p.speed;
    o.port = p.port;
    o.latency_us = p.latency;
    o.max_comms = p.maxComms;
    o.max_recvs = p.maxRecvs;
    if constexpr (V >= 9) {
      o.force_flush = p.forceFlush != 0;
      o.max_p2p_bytes = p.maxP2pBytes;
    } else {
      o.max_p2p_bytes = size_t(INT_MAX);
    }
    return o;
  }
  ListenComm* listen(int dev, Handle* h) override {
    void* lc = nullptr;
    if constexpr (V == 11)
      check(t_->listen(ctx_, dev, h->bytes, &lc), "listen");
    else
      check(t_->listen(dev, h->bytes, &lc), "listen");
    return lc;
  }
  SendComm* connect(int dev, const Handle& h) override {
    Handle copy = h;  // the plugin's argument is not const
    void* sc = nullptr;
    abi::DeviceHandle* dh = nullptr;
    if constexpr (V == 11) {
      check(t_->connect(ctx_, dev, copy.bytes, &sc, &dh), "connect");
    } else if constexpr (V == 10) {
      abi::CommConfig cfg{-1};
      check(t_->connect(dev, &cfg, copy.bytes, &sc, &dh), "connect");
    } else {
      check(t_->connect(dev, copy.bytes, &sc, &dh), "connect");
    }
    return sc;
  }
  RecvComm* accept(ListenComm* lc) override {
    void* rc = nullptr;
    abi::DeviceHandle* dh = nullptr;
    check(t_->accept(lc, &rc, &dh), "accept");
    return rc;
  }
  MemHandle* reg_mr(void* comm, void* data, size_t bytes, int type) override {
    void* mh = nullptr;
    check(t_->regMr(comm, data, bytes, type, &mh), "regMr");
    return mh;
  }
  MemHandle* reg_mr_dmabuf(void* comm, void* data, size_t bytes, int type, uint64_t offset, int fd) override {
    if (!t_->regMrDmaBuf) fail(mkInvalidUsage, "NCCL net plugin " + label() + " has no dma-buf registration");
    void* mh = nullptr;
    check(t_->regMrDmaBuf(comm, data, bytes, type, offset, fd, &mh), "regMrDmaBuf");
    return mh;
  }
  void dereg_mr(void* comm, MemHandle* mh) override { check(t_->deregMr(comm, mh), "deregMr"); }
  Request* isend(SendComm* comm, void* data, size_t bytes, int tag, MemHandle* mh) override {
    void* req = nullptr;
    if constexpr (V == 8) {
      if (bytes > size_t(INT_MAX)) fail(mkInvalidUsage, "NCCL net plugin " + label() + ": a message above 2 GiB");
      check(t_->isend(comm, data, int(bytes), tag, mh, &req), "isend");
    } else if constexpr (V == 9) {
      check(t_->isend(comm, data, bytes, tag, mh, &req), "isend");
    } else {
      check(t_->isend(comm, data, bytes, tag, mh, nullptr, &req), "isend");
    }
    return req;
  }
  Request* irecv(RecvComm* comm, void* data, size_t bytes, int tag, MemHandle* mh) override {
    void* req = nullptr;
    void* datas[1] = {data};
    int tags[1] = {tag};
    void* mhs[1] = {mh};
    if constexpr (V == 8) {
      if (bytes > size_t(INT_MAX)) fail(mkInvalidUsage, "NCCL net plugin " + label() + ": a receive above 2 GiB");
      int sizes[1] = {int(bytes)};
      check(t_->irecv(comm, 1, datas, sizes, tags, mhs, &req), "irecv");
    } else if constexpr (V == 9) {
      size_t sizes[1] = {bytes};
      check(t_->irecv(comm, 1, datas, sizes, tags, mhs, &req), "irecv");
    } else {
      size_t sizes[1] = {bytes};
      void* ph[1] = {nullptr};
      check(t_->irecv(comm, 1, datas, sizes, tags, mhs, ph, &req), "irecv");
    }
    return req;
  }
  Request* iflush(RecvComm* comm, void* data, size_t bytes, MemHandle* mh) override {
    if (!t_->iflush) return nullptr;
    void* req = nullptr;
    void* datas[1] = {data};
    int sizes[1] = {int(std::min<size_t>(bytes, INT_MAX))};
    void* mhs[1] = {mh};
    check(t_->iflush(comm, 1, datas, sizes, mhs, &req), "iflush");
    return req;
  }
  bool test(Request* req, size_t* bytes) override {
    int done = 0, size = 0;
    check(t_->test(req, &done, &size), "test");
    if (done && bytes) *bytes = size_t(size < 0 ? 0 : size);
    return done != 0;
  }
  void close_send(SendComm* c) override { check(t_->closeSend(c), "closeSend"); }
  void close_recv(RecvComm* c) override { check(t_->closeRecv(c), "closeRecv"); }
  void close_listen(ListenComm* c) override { check(t_->closeListen(c), "closeListen"); }

 private:
  std::string file_;
  const T* t_;
  void* ctx_ = nullptr;

  std::string label() const {
    return file_ + " (" + (t_->name ? t_->name : "?") + ", ncclNetPlugin_v" + std::to_string(V) + ")";
  }
  void check(abi::Result r, const char* fn) const {
    if (r != abi::kSuccess)
      fail(code_of(r), "NCCL net plugin " + label() + ": " + fn + " failed (ncclResult_t " + std::to_string(r) + ")");
  }
};

}  // namespace

std::unique_ptr<Net> load_nccl_plugin(const std::string& name, int version) {
  if (name.empty()) fail(mkInvalidArgument, "MK_NET_PLUGIN is empty");
  if (version != 0 && (version < 8 || version > 11))
    fail(mkInvalidArgument, "NCCL net plugin interface v" + std::to_string(version) + ": mKernel drives v8 to v11");
  const bool file = name.find('/') != std::string::npos || name.find(".so") != std::string::npos;
  const std::string path = file ? name : "libnccl-net-" + name + ".so";
  ::dlerror();
  void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = ::dlerror();
    fail(mkSystemError, "cannot load the NCCL net plugin '" + path + "': " + (e ? e : "unknown error") +
                            " (MK_NET_PLUGIN takes a path, a file name on the library path, or NAME for "
                            "libnccl-net-NAME.so)");
  }
  for (int v = 11; v >= 8; --v) {
    if (version && v != version) continue;
    const std::string sym = "ncclNetPlugin_v" + std::to_string(v);
    void* t = ::dlsym(lib, sym.c_str());
    if (!t) continue;
    switch (v) {
      case 11: return std::make_unique<PluginNet<11>>(path, static_cast<const abi::NetV11*>(t));
      case 10: return std::make_unique<PluginNet<10>>(path, static_cast<const abi::NetV10*>(t));
      case 9: return std::make_unique<PluginNet<9>>(path, static_cast<const abi::NetV9*>(t));
      default: return std::make_unique<PluginNet<8>>(path, static_cast<const abi::NetV8*>(t));
    }
  }
  ::dlclose(lib);
  fail(mkSystemError, "the NCCL net plugin '" + path + "' exports " +
                          (version ? "no ncclNetPlugin_v" + std::to_string(version)
                                   : std::string("none of ncclNetPlugin_v11, v10, v9, v8")) +
                          " (older plugins are not supported)");
}

}  // namespace mk::rt::net
