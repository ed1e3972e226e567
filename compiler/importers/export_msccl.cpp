// mKernel raw IR -> MSCCL XML.
//
// Every IR op becomes steps that touch only their own GPU's memory (as MSCCL
// requires): a copy to another rank is a send on the source's GPU and a
// receive on the destination's; a reduce gathers its remote sources into
// scratch on the executing rank, accumulates there with cpy + re (in the
// IR's source order), and sends the result where it goes. Thread blocks: one
// for local steps, one per (peer, direction), all on channel 0, steps in IR
// order, so the k-th send and the k-th receive of a connection belong to the
// same IR op. Ordering: all data flows through local memory or a transfer,
// so ordering every two steps of a GPU that touch the same chunk (one
// writing) in IR order reproduces the IR's meaning; those pairs in different
// thread blocks get a dependency (extra ones as nop steps, as MSCCL writers
// do). Chunks are compared with input/output aliasing, so the algorithm is
// right in-place as well and is declared for both uses.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "compiler/common/xml.hpp"
#include "compiler/importers/importers.hpp"

namespace mk::importers {

namespace {

using ir::Buf;
using ir::Ref;

struct XStep {
  std::string type;
  Ref src{}, dst{};  // src/dst as written to the file (the remote end of s/r is informational)
  bool has_src = false, has_dst = false;
  int32_t cnt = 0;
  std::vector<std::pair<int32_t, int32_t>> deps;  // (tb, real step index)
  bool hasdep = false;
};

struct XTb {
  int32_t send = -1, recv = -1;
  std::vector<XStep> steps;
};

struct Key {
  int32_t tb, step;
};

class Exporter {
 public:
  explicit Exporter(const ir::Schedule& s) : s_(s) {
    gpus_.resize(size_t(s.nranks));
    next_scratch_.assign(size_t(s.nranks), s.scratch);
  }

  std::string run() {
    for (const ir::Op& op : s_.ops) {
      if (op.kind == ir::OpKind::nop) continue;
      if (!op.is_data())
        throw Error(ErrId::cli_E011,
                    fmt::format("op %{} is a {}: only raw schedules (copy/reduce, before the compiler's passes) can be "
                                "exported",
                                op.id, ir::name(op.kind)),
                    op.loc);
      if (op.kind == ir::OpKind::copy) copy(op);
      else reduce(op);
    }
    return write();
  }

 private:
  struct Gpu {
    std::vector<XTb> tbs;
    int32_t local = -1;
    std::map<int32_t, int32_t> send_tb, recv_tb;
    // conflict state per chunk storage
    std::map<int64_t, Key> last_write;
    std::map<int64_t, std::vector<Key>> reads;
    int32_t max_scratch = 0;
  };

  int64_t canon(const Ref& r) const {
    int64_t space = 0, idx = r.index;
    if (r.buf == Buf::input) {
      if (auto o = ir::inplace_output_of_input(s_, r.rank, r.index)) {
        space = 1;
        idx = *o;
      }
    } else if (r.buf == Buf::output) {
      space = 1;
    } else {
      space = 2;
    }
    return (space << 32) | int64_t(uint32_t(idx));
  }

  int32_t tb_local(int32_t g) {
    Gpu& x = gpus_[size_t(g)];
    if (x.local < 0) {
      x.local = int32_t(x.tbs.size());
      x.tbs.push_back(XTb{});
    }
    return x.local;
  }
  int32_t tb_send(int32_t g, int32_t peer) {
    Gpu& x = gpus_[size_t(g)];
    auto it = x.send_tb.find(peer);
    if (it != x.send_tb.end()) return it->second;
    int32_t id = int32_t(x.tbs.size());
    x.tbs.push_back(XTb{peer, -1, {}});
    x.send_tb[peer] = id;
    return id;
  }
  int32_t tb_recv(int32_t g, int32_t peer) {
    Gpu& x = gpus_[size_t(g)];
    auto it = x.recv_tb.find(peer);
    if (it != x.recv_tb.end()) return it->second;
    int32_t id = int32_t(x.tbs.size());
    x.tbs.push_back(XTb{-1, peer, {}});
    x.recv_tb[peer] = id;
    return id;
  }

  Ref temp(int32_t rank, int32_t count) {
    Ref r{rank, Buf::scratch, next_scratch_[size_t(rank)], count};
    next_scratch_[size_t(rank)] += count;
    return r;
  }

  // Appends a step to thread block `tb` of gpu `g` with dependencies on the
  // latest conflicting steps of other thread blocks.
  void add(int32_t g, int32_t tb, XStep st, const std::vector<Ref>& reads, const std::vector<Ref>& writes) {
    Gpu& x = gpus_[size_t(g)];
    const int32_t idx = int32_t(x.tbs[size_t(tb)].steps.size());
    std::map<int32_t, int32_t> dep;  // tb -> latest step
    auto need = [&](const Key& k) {
      if (k.tb == tb) return;
      auto it = dep.find(k.tb);
      if (it == dep.end() || it->second < k.step) dep[k.tb] = k.step;
    };
    for (const Ref& r : reads)
      for (int32_t k = 0; k < r.count; ++k) {
        auto w = x.last_write.find(canon(r.at(k)));
        if (w != x.last_write.end()) need(w->second);
      }
    for (const Ref& r : writes)
      for (int32_t k = 0; k < r.count; ++k) {
        int64_t c = canon(r.at(k));
        auto w = x.last_write.find(c);
        if (w != x.last_write.end()) need(w->second);
        auto rd = x.reads.find(c);
        if (rd != x.reads.end())
          for (const Key& q : rd->second) need(q);
      }
    for (auto& [t, s] : dep) {
      st.deps.push_back({t, s});
      x.tbs[size_t(t)].steps[size_t(s)].hasdep = true;
    }
    for (const Ref& r : reads)
      for (int32_t k = 0; k < r.count; ++k) {
        auto& v = x.reads[canon(r.at(k))];
        if (v.empty() || v.back().tb != tb) v.push_back(Key{tb, idx});
        else v.back().step = idx;
      }
    for (const Ref& r : writes)
      for (int32_t k = 0; k < r.count; ++k) {
        int64_t c = canon(r.at(k));
        x.last_write[c] = Key{tb, idx};
        x.reads.erase(c);
      }
    for (const Ref* r : {st.has_src ? &st.src : nullptr, st.has_dst ? &st.dst : nullptr})
      if (r && r->rank == g && r->buf == Buf::scratch) x.max_scratch = std::max(x.max_scratch, r->index + r->count);
    for (const Ref& r : writes)
      if (r.buf == Buf::scratch) x.max_scratch = std::max(x.max_scratch, r.index + r.count);
    for (const Ref& r : reads)
      if (r.buf == Buf::scratch) x.max_scratch = std::max(x.max_scratch, r.index + r.count);
    x.tbs[size_t(tb)].steps.push_back(std::move(st));
  }

  bool overlap(const Ref& a, const Ref& b) const {
    if (a.rank != b.rank) return false;
    std::unordered_set<int64_t> in_b;
    for (int32_t j = 0; j < b.count; ++j) in_b.insert(canon(b.at(j)));
    for (int32_t i = 0; i < a.count; ++i)
      if (in_b.count(canon(a.at(i)))) return true;
    return false;
  }
  // An elementwise op dst := f(src) is safe in place only chunk for chunk:
  // chunk k of dst may be chunk k of src (an input and the output chunk it
  // aliases), but not another chunk of it.
  bool skewed(const Ref& dst, const Ref& src) const {
    if (dst.rank != src.rank) return false;
    std::unordered_map<int64_t, int32_t> at;
    for (int32_t j = 0; j < src.count; ++j) at.emplace(canon(src.at(j)), j);
    for (int32_t i = 0; i < dst.count; ++i) {
      auto it = at.find(canon(dst.at(i)));
      if (it != at.end() && it->second != i) return true;
    }
    return false;
  }

  void local_copy(const Ref& dst, const Ref& src) {
    if (dst == src) return;
    if (skewed(dst, src)) {  // cpy of overlapping ranges is undefined: go through scratch
      Ref t = temp(dst.rank, dst.count);
      local_copy(t, src);
      local_copy(dst, t);
      return;
    }
    XStep st{"cpy", src, dst, true, true, dst.count, {}, false};
    add(dst.rank, tb_local(dst.rank), st, {src}, {dst});
  }

  void transfer(const Ref& src, const Ref& dst) {
    XStep s{"s", src, dst, true, true, src.count, {}, false};
    add(src.rank, tb_send(src.rank, dst.rank), s, {src}, {});
    XStep r{"r", src, dst, true, true, dst.count, {}, false};
    add(dst.rank, tb_recv(dst.rank, src.rank), r, {}, {dst});
  }

  // dst (any rank) := value held in `v` on rank v.rank
  void deliver(const Ref& v, const std::vector<Ref>& dsts) {
    std::map<int32_t, Ref> first;  // per remote rank: where the value landed
    for (const Ref& d : dsts) {
      if (d.rank == v.rank) {
        local_copy(d, v);
        continue;
      }
      auto it = first.find(d.rank);
      if (it == first.end()) {
        transfer(v, d);
        first[d.rank] = d;
      } else {
        local_copy(d, it->second);
      }
    }
  }

  void copy(const ir::Op& op) {
    Ref src = op.srcs.at(0);
    // The IR reads the source before writing any destination: if a
    // destination overlaps the source (other than being it), stage the
    // source first.
    for (const Ref& d : op.dsts)
      if (skewed(d, src)) {
        Ref t = temp(src.rank, src.count);
        local_copy(t, src);
        src = t;
        break;
      }
    // transfers (which read the source) before local writes
    std::vector<Ref> remote, local;
    for (const Ref& d : op.dsts) (d.rank == src.rank ? local : remote).push_back(d);
    deliver(src, remote);
    for (const Ref& d : local) local_copy(d, src);
  }

  void reduce(const ir::Op& op) {
    const int32_t E = op.rank >= 0 ? op.rank : op.dsts.at(0).rank;
    const int32_t n = op.count();
    // 1. sources on E (remote ones received into scratch)
    std::vector<Ref> srcs;
    for (const Ref& x : op.srcs) {
      if (x.rank == E) {
        srcs.push_back(x);
      } else {
        Ref t = temp(E, n);
        transfer(x, t);
        srcs.push_back(t);
      }
    }
    // 2. accumulate into a target on E
    Ref target{};
    bool have = false;
    for (const Ref& d : op.dsts)
      if (d.rank == E) {
        target = d;
        have = true;
        break;
      }
    bool direct = false;
    if (have) {
      if (target == srcs[0]) {
        direct = true;
        for (size_t i = 1; i < srcs.size(); ++i) direct = direct && !overlap(target, srcs[i]);
      } else {
        direct = true;
        for (const Ref& x : srcs) direct = direct && !overlap(target, x);
      }
    }
    Ref acc = direct ? target : temp(E, n);
    if (!(acc == srcs[0])) local_copy(acc, srcs[0]);
    const int32_t tb = tb_local(E);
    for (size_t i = 1; i < srcs.size(); ++i) {
      XStep st{"re", srcs[i], acc, true, true, n, {}, false};
      add(E, tb, st, {srcs[i], acc}, {acc});
    }
    // 3. the result to every destination
    std::vector<Ref> rest;
    for (const Ref& d : op.dsts)
      if (!(direct && d == acc)) rest.push_back(d);
    deliver(acc, rest);
  }

  static std::string esc(const std::string& s) { return xml_escape(s); }
  static const char* letter(Buf b) { return b == Buf::input ? "i" : b == Buf::output ? "o" : "s"; }

  std::string write() {
    const int32_t in = ir::buf_chunks(s_, Buf::input), out = ir::buf_chunks(s_, Buf::output);
    const std::string coll(name(s_.coll));  // MSCCL spells the collectives as mKernel does
    const bool inplace = inplace_rule(s_.coll) != InPlace::unsupported;
    std::string x = "<?xml version=\"1.0\"?>\n";
    x += fmt::format(
        "<!-- written by mkc export from the mKernel schedule '{}' ({} ranks); docs/import.md -->\n",
        esc(s_.name), s_.nranks);
    x += fmt::format(
        "<algo name=\"{}\" proto=\"Simple\" nchannels=\"1\" nchunksperloop=\"{}\" ngpus=\"{}\" coll=\"{}\" "
        "inplace=\"{}\" outofplace=\"1\" minBytes=\"0\" maxBytes=\"9223372036854775807\"{}>\n",
        esc(s_.name.empty() ? "mkernel" : s_.name), std::max(in, out), s_.nranks, coll, inplace ? 1 : 0,
        s_.root != 0 ? fmt::format(" root=\"{}\"", s_.root) : "");
    // final s numbering: a step with k dependencies is preceded by k-1 nops
    std::vector<std::vector<std::vector<int32_t>>> final_s(gpus_.size());
    for (size_t g = 0; g < gpus_.size(); ++g) {
      final_s[g].resize(gpus_[g].tbs.size());
      for (size_t t = 0; t < gpus_[g].tbs.size(); ++t) {
        int32_t s = 0;
        for (const XStep& st : gpus_[g].tbs[t].steps) {
          s += std::max<int32_t>(0, int32_t(st.deps.size()) - 1);
          final_s[g][t].push_back(s++);
        }
      }
    }
    for (size_t g = 0; g < gpus_.size(); ++g) {
      const Gpu& G = gpus_[g];
      x += fmt::format("  <gpu id=\"{}\" i_chunks=\"{}\" o_chunks=\"{}\" s_chunks=\"{}\">\n", g, in, out,
                       G.max_scratch);
      for (size_t t = 0; t < G.tbs.size(); ++t) {
        const XTb& tb = G.tbs[t];
        x += fmt::format("    <tb id=\"{}\" send=\"{}\" recv=\"{}\" chan=\"0\">\n", t, tb.send, tb.recv);
        int32_t s = 0;
        for (const XStep& st : tb.steps) {
          for (size_t d = 0; d + 1 < st.deps.size(); ++d) {
            auto [dt, ds] = st.deps[d];
            x += fmt::format(
                "      <step s=\"{}\" type=\"nop\" srcbuf=\"i\" srcoff=\"-1\" dstbuf=\"o\" dstoff=\"-1\" cnt=\"0\" "
                "depid=\"{}\" deps=\"{}\" hasdep=\"0\"/>\n",
                s++, dt, final_s[g][size_t(dt)][size_t(ds)]);
          }
          int32_t depid = -1, deps = -1;
          if (!st.deps.empty()) {
            depid = st.deps.back().first;
            deps = final_s[g][size_t(depid)][size_t(st.deps.back().second)];
          }
          x += fmt::format(
              "      <step s=\"{}\" type=\"{}\" srcbuf=\"{}\" srcoff=\"{}\" dstbuf=\"{}\" dstoff=\"{}\" cnt=\"{}\" "
              "depid=\"{}\" deps=\"{}\" hasdep=\"{}\"/>\n",
              s++, st.type, letter(st.src.buf), st.src.index, letter(st.dst.buf), st.dst.index, st.cnt, depid, deps,
              st.hasdep ? 1 : 0);
        }
        x += "    </tb>\n";
      }
      x += "  </gpu>\n";
    }
    x += "</algo>\n";
    return x;
  }

  const ir::Schedule& s_;
  std::vector<Gpu> gpus_;
  std::vector<int32_t> next_scratch_;
};

}  // namespace

std::string export_msccl_xml(const ir::Schedule& raw) { return Exporter(raw).run(); }

}  // namespace mk::importers
