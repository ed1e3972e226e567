// mKernel C++ API: RAII and exceptions over the C API (mk.h).
//
//   mk::UniqueId id = rank == 0 ? mk::UniqueId::create() : receive_from_rank0();
//   mk::Communicator comm = mk::Communicator::init_rank(nranks, id, rank);
//   comm.all_reduce(send, recv, count, mk::Op::sum, stream);   // typed: float*, double*, int32_t*, ...
//   comm.all_reduce(send, recv, count, mkBfloat16, mkSum, stream);  // any dtype
//
// Errors throw mk::RuntimeError with the code and mkGetLastError's message.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "mk.h"

namespace mk {

class RuntimeError : public std::runtime_error {
 public:
  RuntimeError(mkResult_t code, const std::string& what) : std::runtime_error(what), code_(code) {}
  mkResult_t code() const { return code_; }

 private:
  mkResult_t code_;
};

inline void check(mkResult_t r, mkComm_t comm = nullptr) {
  if (r != mkSuccess) throw RuntimeError(r, std::string(mkGetErrorString(r)) + ": " + mkGetLastError(comm));
}

enum class Op { sum = mkSum, prod = mkProd, max = mkMax, min = mkMin, avg = mkAvg };

// The mkDataType_t of a C++ element type (for the typed overloads).
template <typename T>
struct DataType;
#define MK_CXX_DTYPE(T, V) \
  template <>              \
  struct DataType<T> {     \
    static constexpr mkDataType_t value = V; \
  };
MK_CXX_DTYPE(int8_t, mkInt8)
MK_CXX_DTYPE(uint8_t, mkUint8)
MK_CXX_DTYPE(int32_t, mkInt32)
MK_CXX_DTYPE(uint32_t, mkUint32)
MK_CXX_DTYPE(int64_t, mkInt64)
MK_CXX_DTYPE(uint64_t, mkUint64)
MK_CXX_DTYPE(float, mkFloat32)
MK_CXX_DTYPE(double, mkFloat64)
#undef MK_CXX_DTYPE

class UniqueId {
 public:
  UniqueId() { std::memset(&id_, 0, sizeof id_); }
  explicit UniqueId(const mkUniqueId& raw) : id_(raw) {}
  static UniqueId create() {
    UniqueId u;
    check(mkGetUniqueId(&u.id_));
    return u;
  }
  const mkUniqueId& raw() const { return id_; }
  // 128 bytes to send to the other ranks (MPI_Bcast, a file, a TCP store, ...).
  std::string bytes() const { return std::string(id_.internal, sizeof id_.internal); }
  static UniqueId from_bytes(const std::string& b) {
    if (b.size() != sizeof(mkUniqueId)) throw RuntimeError(mkInvalidArgument, "a unique id is 128 bytes");
    UniqueId u;
    std::memcpy(u.id_.internal, b.data(), sizeof u.id_.internal);
    return u;
  }

 private:
  mkUniqueId id_;
};

// Calls between construction and destruction are one group (mkGroupStart/End).
class Group {
 public:
  Group() { check(mkGroupStart()); }
  ~Group() noexcept(false) {
    if (!done_) check(mkGroupEnd());
  }
  void end() {
    done_ = true;
    check(mkGroupEnd());
  }
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

 private:
  bool done_ = false;
};

// A buffer registered with a communicator (mkCommRegister): calls whose
// buffers lie in registered buffers on every rank run zero-copy plans (from
// MK_ZERO_COPY_MIN_BYTES on). Registering and deregistering are collective
// across processes: every rank does them in the same order. Destruction
// deregisters; the calls using the buffer must have completed by then.
class Registration {
 public:
  Registration() = default;
  Registration(mkComm_t c, void* handle) : c_(c), h_(handle) {}
  ~Registration() {
    if (c_) mkCommDeregister(c_, h_);
  }
  Registration(Registration&& o) noexcept : c_(std::exchange(o.c_, nullptr)), h_(o.h_) {}
  Registration& operator=(Registration&& o) noexcept {
    if (this != &o) {
      if (c_) mkCommDeregister(c_, h_);
      c_ = std::exchange(o.c_, nullptr);
      h_ = o.h_;
    }
    return *this;
  }
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;
  // Deregisters now, with errors as exceptions.
  void release() {
    if (c_) {
      mkComm_t c = std::exchange(c_, nullptr);
      check(mkCommDeregister(c, h_), c);
    }
  }

 private:
  mkComm_t c_ = nullptr;
  void* h_ = nullptr;
};

// A PreMulSum op of one communicator (mkRedOpCreatePreMulSum): calls with it
// sum each rank's input times that rank's own scalar. Destruction frees it
// (mkRedOpDestroy); calls already made keep their scalar.
class PreMulSum {
 public:
  PreMulSum() = default;
  PreMulSum(mkComm_t c, mkRedOp_t op) : c_(c), op_(op) {}
  ~PreMulSum() {
    if (c_) mkRedOpDestroy(op_, c_);
  }
  PreMulSum(PreMulSum&& o) noexcept : c_(std::exchange(o.c_, nullptr)), op_(o.op_) {}
  PreMulSum& operator=(PreMulSum&& o) noexcept {
    if (this != &o) {
      if (c_) mkRedOpDestroy(op_, c_);
      c_ = std::exchange(o.c_, nullptr);
      op_ = o.op_;
    }
    return *this;
  }
  PreMulSum(const PreMulSum&) = delete;
  PreMulSum& operator=(const PreMulSum&) = delete;
  mkRedOp_t op() const { return op_; }

 private:
  mkComm_t c_ = nullptr;
  mkRedOp_t op_ = mkSum;
};

// A fused epilogue for all_reduce_fused (mkFusion_t, mk.h): the fusion's
// registered name, the row length, then its operands and scalars in the
// order the fusion declares them.
//   mk::Fusion f("allreduce.rmsnorm", hidden);
//   f.operand(residual).operand(residual_out).operand(weight).scalar(1e-6);
class Fusion {
 public:
  Fusion(std::string name, int64_t row) : name_(std::move(name)) {
    f_.row = row;
  }
  Fusion& operand(const void* p) {
    if (nops_ >= MK_FUSION_MAX_OPERANDS) throw RuntimeError(mkInvalidArgument, "mk::Fusion: more than 6 operands");
    f_.operands[nops_++] = p;
    return *this;
  }
  Fusion& scalar(double v) {
    if (nscalars_ >= MK_FUSION_MAX_SCALARS) throw RuntimeError(mkInvalidArgument, "mk::Fusion: more than 4 scalars");
    f_.scalars[nscalars_++] = v;
    return *this;
  }
  const mkFusion_t* get() const {
    f_.name = name_.c_str();
    return &f_;
  }

 private:
  std::string name_;
  mutable mkFusion_t f_{};
  int nops_ = 0, nscalars_ = 0;
};

class Communicator {
 public:
  Communicator() = default;
  explicit Communicator(mkComm_t c) : c_(c) {}
  ~Communicator() {
    if (c_) mkCommDestroy(c_);
  }
  Communicator(Communicator&& o) noexcept : c_(std::exchange(o.c_, nullptr)) {}
  Communicator& operator=(Communicator&& o) noexcept {
    if (this != &o) {
      if (c_) mkCommDestroy(c_);
      c_ = std::exchange(o.c_, nullptr);
    }
    return *this;
  }
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // Call after cudaSetDevice(your GPU).
  static Communicator init_rank(int nranks, const UniqueId& id, int rank) {
    mkComm_t c = nullptr;
    check(mkCommInitRank(&c, nranks, id.raw(), rank));
    return Communicator(c);
  }
  // With a configuration; nonblocking (config.blocking = 0) returns at once:
  // wait until async_error() is no longer mkInProgress.
  static Communicator init_rank(int nranks, const UniqueId& id, int rank, const mkConfig_t& config) {
    mkComm_t c = nullptr;
    const mkResult_t r = mkCommInitRankConfig(&c, nranks, id.raw(), rank, &config);
    if (r != mkInProgress) check(r);
    return Communicator(c);
  }
  // Collective: ranks with the same color form a communicator ordered by key.
  // MK_SPLIT_NOCOLOR: an empty Communicator (get() == nullptr). The child
  // inherits this communicator's config (`config` overrides it); when that is
  // nonblocking, split returns at once: wait until the child's (and this
  // communicator's) async_error() is no longer mkInProgress.
  Communicator split(int color, int key, const mkConfig_t* config = nullptr) const {
    mkComm_t c = nullptr;
    const mkResult_t r = mkCommSplit(c_, color, key, &c, config);
    if (r != mkInProgress) check(r, c_);
    return Communicator(c);
  }
  // Waits for every collective issued on this communicator; then only
  // destruction is allowed.
  void finalize() { check(mkCommFinalize(c_), c_); }
  static std::vector<Communicator> init_all(const std::vector<int>& devices) {
    std::vector<mkComm_t> raw(devices.size());
    check(mkCommInitAll(raw.data(), int(devices.size()), devices.data()));
    std::vector<Communicator> out;
    for (mkComm_t c : raw) out.emplace_back(c);
    return out;
  }

  mkComm_t get() const { return c_; }
  int size() const {
    int n = 0;
    check(mkCommCount(c_, &n), c_);
    return n;
  }
  int rank() const {
    int r = 0;
    check(mkCommUserRank(c_, &r), c_);
    return r;
  }
  int device() const {
    int d = 0;
    check(mkCommCuDevice(c_, &d), c_);
    return d;
  }
  // mkSuccess, mkInProgress (nonblocking init), or the sticky error a
  // collective hit (watchdog, a peer's abort). Cheap; any thread.
  mkResult_t async_error() const {
    mkResult_t e = mkSuccess;
    check(mkCommGetAsyncError(c_, &e), c_);
    return e;
  }
  void abort() {
    if (c_) check(mkCommAbort(std::exchange(c_, nullptr)));
  }

  // Registers [p, p + bytes) for zero-copy (see Registration).
  [[nodiscard]] Registration register_buffer(void* p, size_t bytes) {
    void* h = nullptr;
    check(mkCommRegister(c_, p, bytes, &h), c_);
    return Registration(c_, h);
  }

  // PreMulSum ops: the scalar's value now (T is the dtype the op serves:
  // premul_sum(0.5f) for fp32 calls; 0.5 would make an fp64 op), or
  // a scalar in GPU memory that each call's kernel reads when it runs.
  template <typename T>
  [[nodiscard]] PreMulSum premul_sum(T scalar) {
    mkRedOp_t op = mkSum;
    check(mkRedOpCreatePreMulSum(&op, &scalar, DataType<T>::value, mkScalarHostImmediate, c_), c_);
    return PreMulSum(c_, op);
  }
  template <typename T>
  [[nodiscard]] PreMulSum premul_sum_device(const T* scalar) {
    mkRedOp_t op = mkSum;
    check(mkRedOpCreatePreMulSum(&op, const_cast<T*>(scalar), DataType<T>::value, mkScalarDevice, c_), c_);
    return PreMulSum(c_, op);
  }

  // Untyped (any dtype, e.g. mkBfloat16, mkFloat8e4m3).
  void all_reduce(const void* send, void* recv, size_t count, mkDataType_t t, mkRedOp_t op, cudaStream_t s) {
    check(mkAllReduce(send, recv, count, t, op, c_, s), c_);
  }
  void all_gather(const void* send, void* recv, size_t count, mkDataType_t t, cudaStream_t s) {
    check(mkAllGather(send, recv, count, t, c_, s), c_);
  }
  void reduce_scatter(const void* send, void* recv, size_t count, mkDataType_t t, mkRedOp_t op, cudaStream_t s) {
    check(mkReduceScatter(send, recv, count, t, op, c_, s), c_);
  }
  void broadcast(const void* send, void* recv, size_t count, mkDataType_t t, int root, cudaStream_t s) {
    check(mkBroadcast(send, recv, count, t, root, c_, s), c_);
  }
  void reduce(const void* send, void* recv, size_t count, mkDataType_t t, mkRedOp_t op, int root, cudaStream_t s) {
    check(mkReduce(send, recv, count, t, op, root, c_, s), c_);
  }
  void all_to_all(const void* send, void* recv, size_t count, mkDataType_t t, cudaStream_t s) {
    check(mkAllToAll(send, recv, count, t, c_, s), c_);
  }

  // Fused: the all-reduce, then the fusion's epilogue on every row of recv
  // (mkAllReduceFused).
  void all_reduce_fused(const void* send, void* recv, size_t count, mkDataType_t t, mkRedOp_t op, const Fusion& f,
                        cudaStream_t s) {
    check(mkAllReduceFused(send, recv, count, t, op, f.get(), c_, s), c_);
  }
  template <typename T>
  void all_reduce_fused(const T* send, T* recv, size_t count, Op op, const Fusion& f, cudaStream_t s) {
    all_reduce_fused(send, recv, count, DataType<T>::value, mkRedOp_t(op), f, s);
  }

  // A composite's stages as one kernel (mkCompositeRun): one buffer per name
  // the composite declares, in its order.
  //   comm.composite("composite.zero_step", {grads, grad_shard, param_shard, params}, n, mkBfloat16, mkSum, s);
  void composite(const char* name, std::initializer_list<void*> buffers, size_t count, mkDataType_t t,
                 mkRedOp_t op, cudaStream_t s) {
    check(mkCompositeRun(name, buffers.begin(), int(buffers.size()), count, t, op, c_, s), c_);
  }

  // Typed.
  template <typename T>
  void all_reduce(const T* send, T* recv, size_t count, Op op, cudaStream_t s) {
    all_reduce(send, recv, count, DataType<T>::value, mkRedOp_t(op), s);
  }
  template <typename T>
  void all_reduce(const T* send, T* recv, size_t count, const PreMulSum& op, cudaStream_t s) {
    all_reduce(send, recv, count, DataType<T>::value, op.op(), s);
  }
  template <typename T>
  void reduce_scatter(const T* send, T* recv, size_t count, const PreMulSum& op, cudaStream_t s) {
    reduce_scatter(send, recv, count, DataType<T>::value, op.op(), s);
  }
  template <typename T>
  void reduce(const T* send, T* recv, size_t count, const PreMulSum& op, int root, cudaStream_t s) {
    reduce(send, recv, count, DataType<T>::value, op.op(), root, s);
  }
  template <typename T>
  void all_gather(const T* send, T* recv, size_t count, cudaStream_t s) {
    all_gather(send, recv, count, DataType<T>::value, s);
  }
  template <typename T>
  void reduce_scatter(const T* send, T* recv, size_t count, Op op, cudaStream_t s) {
    reduce_scatter(send, recv, count, DataType<T>::value, mkRedOp_t(op), s);
  }
  template <typename T>
  void broadcast(const T* send, T* recv, size_t count, int root, cudaStream_t s) {
    broadcast(send, recv, count, DataType<T>::value, root, s);
  }
  template <typename T>
  void reduce(const T* send, T* recv, size_t count, Op op, int root, cudaStream_t s) {
    reduce(send, recv, count, DataType<T>::value, mkRedOp_t(op), root, s);
  }
  template <typename T>
  void all_to_all(const T* send, T* recv, size_t count, cudaStream_t s) {
    all_to_all(send, recv, count, DataType<T>::value, s);
  }

 private:
  mkComm_t c_ = nullptr;
};

}  // namespace mk
