#include "compiler/verify/executor.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "compiler/verify/reference.hpp"
#include "compiler/verify/typed.hpp"
#include "compiler/verify/verify.hpp"
#include "mk/fusion.hpp"
#include "templates/layout.cuh"

namespace mk::verify {

using ir::Buf;
using ir::Op;
using ir::OpKind;
using ir::Ref;
using ir::Schedule;

namespace {

struct RankMem {
  std::vector<uint8_t> in_store, out_store;
  uint8_t* in = nullptr;   // null: this rank has no send buffer
  uint8_t* out = nullptr;  // null: no receive buffer
  int64_t in_bytes = 0, out_bytes = 0;
  std::vector<uint8_t> scratch;
  std::vector<uint64_t> flags;     // [inst][slot]
  std::vector<uint64_t> ll_ready;  // [inst][depth][slot]: step value the LL data carries;
                                   // Lamport: 1 while data no reader took is there, 0 at rest
  std::vector<uint64_t> seq;       // [inst][tb]
  int32_t launch = 0;
  int32_t running = 0;  // threads of the current launch still running
};

struct Thread {
  int32_t rank, inst, tb;
  const std::vector<size_t>* prog;
  int64_t step = 0;
  size_t pc = 0;
  uint64_t base = 0;
  bool done = false;
};

class Sim {
 public:
  Sim(const Schedule& s, const SimOptions& o) : s_(s), o_(o), rng_(o.seed * 7919 + 17) {
    es_ = int32_t(dtype_size(o.dtype));
    const int64_t tile = o.tile_bytes > 0 ? o.tile_bytes
                                          : dev::pick_tile_bytes(o.count, s.chunks, s.instances, es_, s.tile_bytes);
    MK_CHECK(tile % 16 == 0 && tile <= s.tile_bytes, "tile must be a multiple of 16 within the plan's maximum");
    L_ = dev::make_layout(o.count, s.chunks, tile, s.instances, es_);
    // The kernel strides scratch by the plan's largest tile; the same layout
    // function with this launch's tile as the stride keeps host memory small.
    slot_bytes_ = tile * (s.proto == ir::Proto::ll && !s.lamport ? 2 : 1);
    progs_.assign(size_t(s.nranks) * s.tbs, {});
    for (size_t i = 0; i < s.ops.size(); ++i) {
      const Op& op = s.ops[i];
      if (op.kind == OpKind::nop) continue;
      // one-pass kernels run the data ops alone (passes/one_pass.cpp): so
      // does the simulation, and a launch order that does not do what the
      // dropped waits did shows up as a deadlock or a wrong result
      if (s.one_pass && (op.kind == OpKind::wait || op.kind == OpKind::signal)) continue;
      progs_[size_t(op.rank) * s.tbs + op.tb].push_back(i);
    }
    mem_.resize(s.nranks);
    const int64_t in_el = input_elems(s.coll, s.nranks, o.count);
    const int64_t out_el = output_elems(s.coll, s.nranks, o.count);
    for (int32_t r = 0; r < s.nranks; ++r) {
      RankMem& m = mem_[r];
      m.in_bytes = in_el * es_;
      m.out_bytes = out_el * es_;
      bool hin = ir::has_input(s, r), hout = ir::has_output(s, r);
      if (o.inplace && hin && hout) {
        // one allocation; input and output overlap as NCCL defines in-place
        int64_t total = std::max(m.in_bytes, m.out_bytes);
        m.out_store.resize(size_t(total));
        uint8_t* base = m.out_store.data();
        const int64_t block_bytes = o.count * es_;
        m.in = base + inplace_input_block(s.coll, r) * block_bytes;
        m.out = base + inplace_output_block(s.coll, r) * block_bytes;
      } else {
        if (hin) {
          m.in_store.resize(size_t(m.in_bytes));
          m.in = m.in_store.data();
        }
        if (hout) {
          m.out_store.resize(size_t(m.out_bytes));
          m.out = m.out_store.data();
        }
      }
      m.scratch.assign(size_t(slot_bytes_) * s.scratch * s.depth * s.instances, 0xEE);
      m.flags.assign(size_t(std::max(s.slots, 1)) * s.instances, 0);
      m.ll_ready.assign(size_t(std::max(s.scratch, 1)) * s.depth * s.instances, 0);
      m.seq.assign(size_t(s.tbs) * s.instances, 0);
    }
  }

  SimResult run() {
    SimResult& res = res_;
    res.steps = L_.steps;
    for (int32_t r = 0; r < s_.nranks; ++r) start_launch(r);
    while (!threads_.empty()) {
      // Pick a random runnable thread: start at a random index, take the first.
      size_t n = threads_.size();
      size_t start = std::uniform_int_distribution<size_t>(0, n - 1)(rng_);
      size_t pick = n;
      for (size_t k = 0; k < n; ++k) {
        size_t i = (start + k) % n;
        if (runnable(threads_[i])) {
          pick = i;
          break;
        }
      }
      if (pick == n) throw_deadlock();
      // Run a few ops of that thread in a row (keeps runs realistic and fast).
      Thread& t = threads_[pick];
      int burst = std::uniform_int_distribution<int>(1, 4)(rng_);
      while (burst-- > 0 && !t.done && runnable(t)) {
        step(t);
        ++res.ops_run;
      }
      if (t.done) {
        int32_t r = t.rank;
        threads_.erase(threads_.begin() + std::ptrdiff_t(pick));
        if (--mem_[r].running == 0) finish_launch(r);
      }
    }
    res.ok = res.mismatches == 0 && res.rank_diffs == 0;
    return res;
  }

 private:
  void start_launch(int32_t r) {
    RankMem& m = mem_[r];
    DataSpec d{o_.dtype, o_.op, o_.seed, m.launch, s_.nranks, o_.inexact};
    if (m.out) std::memset(m.out, 0xA5, size_t(m.out_bytes));  // poison
    if (m.in && o_.io) {
      const std::vector<uint8_t>& src = o_.io->in.at(size_t(r));
      MK_CHECK(int64_t(src.size()) == m.in_bytes, "SimIO: an input of the wrong size");
      std::memcpy(m.in, src.data(), src.size());
    } else if (m.in) {
      fill_input(d, r, 0, m.in_bytes / es_, m.in);
    }
    for (int32_t i = 0; i < s_.instances; ++i)
      for (int32_t tb = 0; tb < s_.tbs; ++tb) {
        Thread t;
        t.rank = r;
        t.inst = i;
        t.tb = tb;
        t.prog = &progs_[size_t(r) * s_.tbs + tb];
        t.base = m.seq[size_t(i) * s_.tbs + tb];
        t.done = L_.steps == 0 || t.prog->empty();
        if (t.done) {
          m.seq[size_t(i) * s_.tbs + tb] = t.base + uint64_t(L_.steps);
          continue;
        }
        threads_.push_back(t);
        ++m.running;
      }
    if (m.running == 0) finish_launch(r);
  }

  // Zero-copy kernels enter and leave together (entry and exit barriers), so
  // a launch starts on every rank once every rank has finished the last one.
  void finish_launch(int32_t r) {
    if (s_.zero_copy && o_.zc_barriers) {
      if (++zc_finished_ < s_.nranks) return;
      zc_finished_ = 0;
      bool more = false;
      for (int32_t q = 0; q < s_.nranks; ++q) {
        check_launch(q);
        more = ++mem_[q].launch < o_.launches;
      }
      if (more)
        for (int32_t q = 0; q < s_.nranks; ++q) start_launch(q);
      return;
    }
    check_launch(r);
    if (++mem_[r].launch < o_.launches) start_launch(r);
  }

  void check_launch(int32_t r) {
    SimResult& res = res_;
    RankMem& m = mem_[r];
    if (o_.io) {  // the caller checks
      o_.io->out.resize(size_t(s_.nranks));
      o_.io->out[size_t(r)].assign(m.out, m.out ? m.out + m.out_bytes : m.out);
      return;
    }
    if (m.out) {
      DataSpec d{o_.dtype, o_.op, o_.seed, m.launch, s_.nranks, o_.inexact};
      auto c = check_output(s_.coll, d, s_.nranks, s_.root, o_.count, r, m.out, m.out_bytes / es_);
      if (c.mismatches && res.mismatches == 0)
        res.first_bad = fmt::format("launch {} {}", m.launch, c.first_bad);
      res.mismatches += c.mismatches;
      if (c.max_err > res.max_err || std::isnan(c.max_err)) {
        res.max_err = c.max_err;
        res.max_tol = c.max_tol;
      }
      // Every rank's all-reduce result is the same bits (DESIGN: semantics),
      // whatever rounding the tolerance above allows.
      if (s_.coll == Collective::allreduce) {
        auto& first = same_[m.launch];
        if (first.second.empty()) {
          first = {r, std::vector<uint8_t>(m.out, m.out + m.out_bytes)};
        } else {
          int64_t differ = 0, at = -1;
          for (int64_t e = 0; e < m.out_bytes / es_; ++e)
            if (std::memcmp(m.out + e * es_, first.second.data() + e * es_, size_t(es_)) != 0) {
              if (at < 0) at = e;
              ++differ;
            }
          if (differ && res.rank_diffs == 0)
            res.first_diff = fmt::format("launch {}: rank {} element {} differs bit-wise from rank {}'s ({} element(s))",
                                         m.launch, r, at, first.first, differ);
          res.rank_diffs += differ;
        }
      }
    }
  }
  std::map<int32_t, std::pair<int32_t, std::vector<uint8_t>>> same_;  // launch -> (first rank checked, its output)

  uint64_t& flag(int32_t rank, int32_t inst, int32_t slot) {
    return mem_[rank].flags[size_t(inst) * s_.slots + slot];
  }
  // `gstep`: the step counted across launches (base + step), which is what
  // rotates scratch: the kernel keeps it in device memory between launches.
  uint64_t& ll_ready(int32_t rank, int32_t inst, uint64_t gstep, int32_t slot) {
    return mem_[rank].ll_ready[(size_t(inst) * s_.depth + size_t(gstep % uint64_t(s_.depth))) * s_.scratch + slot];
  }

  bool runnable(const Thread& t) {
    const Op& op = s_.ops[(*t.prog)[t.pc]];
    const uint64_t value = t.base + uint64_t(t.step) + 1;
    if (op.kind == OpKind::wait) {
      int64_t target = int64_t(value) + op.iter;
      return target <= 0 || flag(t.rank, t.inst, op.slot) >= uint64_t(target);
    }
    if (op.is_data() && s_.proto == ir::Proto::ll) {
      const int64_t tile = t.step * s_.instances + t.inst;
      for (const Ref& r : op.srcs) {
        if (r.buf != Buf::scratch) continue;
        for (int32_t k = 0; k < r.count; ++k) {
          if (dev::tile_elems(L_, op.pos[size_t(k)], tile) == 0) continue;
          const uint64_t have = ll_ready(r.rank, t.inst, t.base + uint64_t(t.step), r.index + k);
          if (s_.lamport ? have == 0 : have != value) return false;
        }
      }
    }
    return true;
  }

  uint8_t* addr(const Thread& t, const Ref& r, int32_t k, int64_t tile, int64_t len, int32_t pos) {
    RankMem& m = mem_[r.rank];
    if (r.buf == Buf::scratch) {
      int64_t off = dev::scratch_offset(slot_bytes_, s_.scratch, s_.depth, t.inst,
                                         int64_t(t.base) + t.step, r.index + k);
      MK_CHECK(off + len * es_ <= int64_t(m.scratch.size()), "scratch access out of range");
      return m.scratch.data() + off;
    }
    const int32_t index = r.index + k;
    MK_CHECK(index % s_.chunks == pos, "chunk position disagrees with the analysis");
    uint8_t* base = r.buf == Buf::input ? m.in : m.out;
    int64_t bytes = r.buf == Buf::input ? m.in_bytes : m.out_bytes;
    if (!base)
      throw InternalError(fmt::format("simulated op touches rank {}'s missing {} buffer", r.rank,
                                      name(r.buf)));
    int64_t off = dev::data_offset(L_, index, tile) * es_;
    MK_CHECK(off >= 0 && off + len * es_ <= bytes, "user buffer access out of range");
    return base + off;
  }

  template <typename T, int K>
  void compute(const Op& op, std::vector<uint8_t*>& src, std::vector<uint8_t*>& dst, int64_t len) {
    using C = typename dev::Compute<T>::type;
    // PreMulSum's prologue: a source that is an input chunk is scaled by its
    // rank's scalar (the kernel's rule, templates/kernel.cuh run_op).
    std::vector<C> scale(src.size(), C(1));
    if constexpr (K == dev::kRedPreMulSum)
      for (size_t k = 0; k < src.size(); ++k)
        if (op.srcs[k].buf == Buf::input)
          scale[k] = dev::Compute<T>::load(Typed<T>::from_double(prescale_of(o_.dtype, op.srcs[k].rank)));
    for (int64_t e = 0; e < len; ++e) {
      auto load = [&](size_t k) {
        T v;
        std::memcpy(&v, src[k] + e * sizeof(T), sizeof(T));
        C x = dev::Compute<T>::load(v);
        if (o_.prologue && op.srcs[k].buf == Buf::input)  // a fusion's prologue, rounded to the dtype
          x = C(dsl::run_prologue_host(*o_.prologue, o_.dtype, double(x),
                                       o_.pre_scalars[size_t(op.srcs[k].rank)].data()));
        if constexpr (K == dev::kRedPreMulSum)
          if (op.srcs[k].buf == Buf::input)  // rounded to the dtype, as the kernel does (every rank adds the same terms)
            x = dev::Compute<T>::load(dev::Compute<T>::store(dev::red_pre<C>(x, scale[k])));
        return x;
      };
      C acc = load(0);
      for (size_t k = 1; k < src.size(); ++k) acc = dev::red_apply<K, C>(acc, load(k));
      if (op.final) acc = dev::red_finalize<K, C>(acc, s_.nranks);
      T out = dev::Compute<T>::store(acc);
      for (uint8_t* d : dst) std::memcpy(d + e * sizeof(T), &out, sizeof(T));
    }
  }

  // Lamport packets (passes/one_pass.cpp), after an op's chunk k moved `len`
  // elements between `src` and `dst` (its operands' addresses): the reader
  // puts the sentinel back (here: bytes no value has, so a read of them shows
  // as a wrong result), and the writer stores an all-ones 32-bit word as
  // 0x7fffffff; a write into a slot whose data no reader took yet is the
  // hazard the scheme rules out.
  void lamport_after(const Thread& t, const Op& op, int32_t k, const std::vector<uint8_t*>& src,
                     const std::vector<uint8_t*>& dst, int64_t len) {
    const uint64_t gstep = t.base + uint64_t(t.step);
    for (size_t i = 0; i < op.srcs.size(); ++i) {
      const Ref& r = op.srcs[i];
      if (r.buf != Buf::scratch) continue;
      ll_ready(r.rank, t.inst, gstep, r.index + k) = 0;
      std::memset(src[i], 0xFF, size_t(len * es_));
    }
    for (size_t i = 0; i < op.dsts.size(); ++i) {
      const Ref& r = op.dsts[i];
      if (r.buf != Buf::scratch) continue;
      for (int64_t w = 0; w + 4 <= len * es_; w += 4) {
        uint32_t word;
        std::memcpy(&word, dst[i] + w, 4);
        if (word == 0xffffffffu) {
          word = 0x7fffffffu;
          std::memcpy(dst[i] + w, &word, 4);
        }
      }
      uint64_t& full = ll_ready(r.rank, t.inst, gstep, r.index + k);
      if (full)
        throw Error(ErrId::verify_E014,
                    fmt::format("{}: rank {} writes scratch slot {} of rank {} (instance {}, step {}) before its "
                                "reader took the Lamport packets written there before",
                                s_.name, t.rank, r.index + k, r.rank, t.inst, gstep),
                    {}, "Lamport packets need each slot read once per write, the reuse ordered by launches");
      full = 1;
    }
  }

  void step(Thread& t) {
    const Op& op = s_.ops[(*t.prog)[t.pc]];
    const uint64_t value = t.base + uint64_t(t.step) + 1;
    if (op.kind == OpKind::signal) {
      flag(op.peer, t.inst, op.slot) = value;
    } else if (op.is_data()) {
      const int64_t tile = t.step * s_.instances + t.inst;
      for (int32_t k = 0; k < op.count(); ++k) {
        const int32_t pos = op.pos[size_t(k)];
        const int64_t len = dev::tile_elems(L_, pos, tile);
        if (len > 0) {
          std::vector<uint8_t*> src, dst;
          for (const Ref& r : op.srcs) src.push_back(addr(t, r, k, tile, len, pos));
          for (const Ref& r : op.dsts) dst.push_back(addr(t, r, k, tile, len, pos));
          const bool scales = (o_.op == RedOp::premulsum || o_.prologue) && op.srcs[0].buf == Buf::input;
          if (op.is_copy() && !op.final && !scales) {
            for (uint8_t* d : dst)
              if (d != src[0]) std::memmove(d, src[0], size_t(len * es_));
          } else {
            dispatch_dtype(o_.dtype, [&]<typename T>() {
              dispatch_red(o_.op, [&]<int K>() { compute<T, K>(op, src, dst, len); });
            });
          }
          if (s_.lamport) lamport_after(t, op, k, src, dst, len);
        }
        if (s_.proto == ir::Proto::ll && !s_.lamport)
          for (const Ref& r : op.dsts)
            if (r.buf == Buf::scratch) ll_ready(r.rank, t.inst, t.base + uint64_t(t.step), r.index + k) = value;
      }
    }
    if (++t.pc == t.prog->size()) {
      t.pc = 0;
      if (++t.step == L_.steps) {
        t.done = true;
        mem_[t.rank].seq[size_t(t.inst) * s_.tbs + t.tb] = t.base + uint64_t(L_.steps);
      }
    }
  }

  [[noreturn]] void throw_deadlock() {
    std::string who;
    for (size_t i = 0; i < threads_.size() && i < 6; ++i) {
      const Thread& t = threads_[i];
      const Op& op = s_.ops[(*t.prog)[t.pc]];
      who += fmt::format("\n    rank {} instance {} tb {} step {} blocked at {}", t.rank, t.inst, t.tb,
                         t.step, ir::print_op(op));
    }
    throw Error(ErrId::verify_E005,
                fmt::format("{}: simulated run deadlocked with {} thread block(s) waiting:{}", s_.name,
                            threads_.size(), who),
                {}, "a wait has no signal that can ever arrive");
  }

  const Schedule& s_;
  SimOptions o_;
  std::mt19937_64 rng_;
  int32_t es_;
  dev::Layout L_;
  int64_t slot_bytes_;
  std::vector<std::vector<size_t>> progs_;
  std::vector<RankMem> mem_;
  std::vector<Thread> threads_;
  int32_t zc_finished_ = 0;  // zero-copy: ranks done with the current launch
  SimResult res_;
};

}  // namespace

SimResult simulate(const Schedule& lowered, const SimOptions& o) {
  MK_CHECK(lowered.synced && lowered.tile_bytes > 0, "simulate needs a lowered schedule");
  // Puts and flushes run as their network model (verify/network.cpp): each
  // connection a thread block of its own, interleaved at random with the
  // rest, so deliveries come late and out of order across connections.
  if (has_network_ops(lowered)) return simulate(network_model(lowered), o);
  if (o.count < 0) throw Error(ErrId::cli_E011, "count must be >= 0");
  // The prologue scales what the kernel would: only where that is sound.
  if (o.op == RedOp::premulsum) verify_prologue(lowered);
  if (o.prologue) {
    if (!o.io) throw Error(ErrId::cli_E011, "a simulation with a fusion prologue takes caller-provided data (SimIO)");
    if (o.op == RedOp::premulsum)
      throw Error(ErrId::cli_E013, "a PreMulSum run has its own prologue; a fusion prologue runs with op sum");
    if (int32_t(o.pre_scalars.size()) != lowered.nranks)
      throw Error(ErrId::cli_E011, fmt::format("a fusion prologue needs every rank's scalars ({} given for {} ranks)",
                                               o.pre_scalars.size(), lowered.nranks));
    for (const auto& v : o.pre_scalars)
      if (v.size() < size_t(dsl::kMaxScalars))
        throw Error(ErrId::cli_E011, "a rank's prologue scalars hold fewer than 4 values");
    verify_prologue(lowered, "prologue of fusion " + o.prologue->name);
  }
  {  // host memory the simulation needs: every rank's buffers
    const int64_t limit = 8ll << 30;
    const int64_t per_elem = int64_t(dtype_size(o.dtype)) * 2 * lowered.nranks * lowered.nranks;
    if (o.count > limit / per_elem)
      throw Error(ErrId::cli_E011,
                  fmt::format("count {} is too large to simulate ({} ranks need more than {} GiB of host memory)",
                              o.count, lowered.nranks, limit >> 30),
                  {}, "simulate a smaller count: the schedule's behaviour does not depend on it beyond a few tiles");
  }
  if (o.io && (o.launches != 1 || int32_t(o.io->in.size()) != lowered.nranks))
    throw Error(ErrId::cli_E011, "a simulation with caller-provided data runs one launch, with an input per rank");
  if (o.root < 0 || o.root >= lowered.nranks)
    throw Error(ErrId::cli_E011, fmt::format("root {} is not a rank of {}", o.root, lowered.nranks));
  if (collective_rooted(lowered.coll) || o.root == 0) {
    Schedule s = rotate_root(lowered, o.root);
    if (o.inplace && inplace_rule(s.coll) == InPlace::unsupported)
      throw Error(ErrId::cli_E013, fmt::format("{} has no in-place form", name(s.coll)), {},
                  "simulate it out-of-place (without --inplace)");
    Sim sim(s, o);
    return sim.run();
  }
  throw Error(ErrId::cli_E011, "--root applies to broadcast and reduce only");
}

}  // namespace mk::verify
