#include "compiler/codegen/codegen.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <map>

#include "templates/abi.cuh"

namespace mk::codegen {

using ir::Buf;
using ir::Op;
using ir::OpKind;
using ir::Ref;
using ir::Schedule;

std::string identifier(std::string_view s) {
  std::string out;
  for (char c : s) out += (std::isalnum(static_cast<unsigned char>(c)) ? c : '_');
  if (out.empty() || std::isdigit(static_cast<unsigned char>(out[0]))) out = "s_" + out;
  return out;
}

namespace {

int32_t mod(int64_t a, int64_t m) { return int32_t(((a % m) + m) % m); }

// The op list of virtual rank v, rewritten relative to v (what rank classes compare).
std::string canonical(const Schedule& s, int32_t v, int32_t M) {
  const int32_t N = s.nranks, K = s.chunks;
  auto ref = [&](const Ref& r) {
    std::string t = fmt::format("{}:{}:", mod(r.rank - v, N), int(r.buf));
    if (r.buf == Buf::scratch) return t + fmt::format("{}+{}", r.index, r.count);
    int32_t B = ir::buf_blocks(s.coll, N, r.buf);
    int32_t b = r.index / K, p = r.index % K;
    if (B == N) b = mod(b - v, N);
    if (M) p = mod(p - int64_t(v) * M, K);
    return t + fmt::format("{}.{}+{}", b, p, r.count);
  };
  // Thread block by thread block: how the blocks' ops interleave in program
  // order does not change the generated code, so it must not split classes.
  std::vector<const Op*> mine;
  for (const Op& op : s.ops)
    if (op.rank == v) mine.push_back(&op);
  std::stable_sort(mine.begin(), mine.end(), [](const Op* a, const Op* b) { return a->tb < b->tb; });
  std::string out;
  for (const Op* opp : mine) {
    const Op& op = *opp;
    out += fmt::format("{}|{}|{}|", int(op.kind), op.tb, op.final);
    for (const Ref& r : op.srcs) out += ref(r) + ",";
    out += ">";
    for (const Ref& r : op.dsts) out += ref(r) + ",";
    for (int32_t p : op.pos) out += fmt::format("p{}", M ? mod(p - int64_t(v) * M, K) : p);
    if (op.kind == OpKind::signal) out += fmt::format("|{}|{}", mod(op.peer - v, N), op.slot);
    if (op.kind == OpKind::wait) out += fmt::format("|{}|{}", op.slot, op.iter);
    out += "\n";
  }
  return out;
}

RankClasses classes_with(const Schedule& s, int32_t M) {
  RankClasses rc;
  rc.pos_rot = M;
  std::map<std::string, int32_t> seen;
  for (int32_t v = 0; v < s.nranks; ++v) {
    auto [it, fresh] = seen.emplace(canonical(s, v, M), int32_t(rc.representative.size()));
    if (fresh) rc.representative.push_back(v);
    rc.class_of.push_back(it->second);
  }
  return rc;
}

class Emitter {
 public:
  Emitter(const Schedule& s, int32_t bucket, const RankClasses& rc, std::string& out)
      : s_(s), b_(bucket), rc_(rc), o_(out) {}

  std::string P() const { return fmt::format("P{}", b_); }

  // ---- items: a data op with the waits before it and the signals after it.
  // Everything but the numbers is the item's shape; runs of items whose
  // numbers form arithmetic progressions become loops (rerolling), which keeps
  // kernels for many ranks as small as for few.
  struct RefShape {
    int kind;  // 0 input, 1 output, 2 scratch
    bool rot_b, rot_p;
  };
  struct Item {
    int nwait = 0, nsig = 0;
    bool data = false;
    int ns = 0, nd = 0;
    bool red = false, fin = false;
    unsigned sll = 0, dll = 0;
    std::vector<RefShape> refs;  // per chunk k: srcs then dsts
    bool pos_rot = false;
    std::string comment;
    std::vector<int64_t> nums;  // waits (slot, iter, peer)*, then refs (a, b)*, pos, then signals (peer, slot)*
    std::string shape() const {
      std::string t = fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}", nwait, nsig, data, ns, nd, red, fin, sll, dll,
                                  pos_rot, refs.size());
      for (auto& r : refs) t += fmt::format("/{}{}{}", r.kind, r.rot_b, r.rot_p);
      return t;
    }
  };

  void add_ref(Item& it, const Op& op, const Ref& r, int32_t k, int32_t v0) const {
    const int32_t N = s_.nranks, K = s_.chunks, M = rc_.pos_rot;
    if (r.buf == Buf::scratch) {
      it.refs.push_back({2, false, false});
      it.nums.push_back(mod(r.rank - v0, N));
      it.nums.push_back(r.index + k);
      return;
    }
    if (r.rank != op.rank && !s_.zero_copy)
      throw InternalError("codegen: op %" + std::to_string(op.id) +
                          " touches another rank's user buffer (stage_remote must run first)");
    const int32_t i = r.index + k;
    const int32_t b = i / K, p = i % K;
    // The address comes from this position and the length from op.pos: the
    // verifier (E008) proved they agree; a kernel must never rely on it silently.
    if (p != op.pos.at(size_t(k)))
      throw InternalError("codegen: op %" + std::to_string(op.id) + " addresses chunk position " + std::to_string(p) +
                          " but its data has position " + std::to_string(op.pos.at(size_t(k))));
    const bool rot_b = ir::buf_blocks(s_.coll, N, r.buf) == N && N > 1;
    it.refs.push_back({r.buf == Buf::input ? 0 : 1, rot_b, M != 0});
    if (s_.zero_copy) it.nums.push_back(mod(r.rank - v0, N));  // whose buffer, relative
    it.nums.push_back(rot_b ? mod(b - v0, N) : b);
    it.nums.push_back(M ? mod(p - int64_t(v0) * M, K) : p);
  }

  // Splits a thread block's ops (one class representative) into items; a data
  // op of count > 1 becomes one item per chunk.
  std::vector<Item> items_of(const std::vector<const Op*>& ops, int32_t v0) const {
    std::vector<Item> out;
    Item cur;
    const int32_t K = s_.chunks, M = rc_.pos_rot;
    auto close = [&] {
      out.push_back(std::move(cur));
      cur = Item{};
    };
    for (const Op* op : ops) {
      if (op->kind == OpKind::wait) {
        if (cur.data || cur.nsig) close();
        ++cur.nwait;
        cur.nums.push_back(op->slot);
        cur.nums.push_back(op->iter);
        cur.nums.push_back(waiter_peer(*op, v0));
      } else if (op->kind == OpKind::signal) {
        ++cur.nsig;
        cur.nums.push_back(mod(op->peer - v0, s_.nranks));
        cur.nums.push_back(op->slot);
      } else if (op->is_data()) {
        for (int32_t k = 0; k < op->count(); ++k) {
          if (cur.data || cur.nsig) close();
          cur.data = true;
          cur.ns = int(op->srcs.size());
          cur.nd = int(op->dsts.size());
          cur.red = op->kind == OpKind::reduce;
          cur.fin = op->final;
          if (s_.proto == ir::Proto::ll) {
            for (int i = 0; i < cur.ns; ++i)
              if (op->srcs[size_t(i)].buf == Buf::scratch) cur.sll |= 1u << i;
            for (int i = 0; i < cur.nd; ++i)
              if (op->dsts[size_t(i)].buf == Buf::scratch) cur.dll |= 1u << i;
          }
          for (const Ref& r : op->srcs) add_ref(cur, *op, r, k, v0);
          for (const Ref& r : op->dsts) add_ref(cur, *op, r, k, v0);
          const int32_t p = op->pos.at(size_t(k));
          cur.pos_rot = M != 0;
          cur.nums.push_back(M ? mod(p - int64_t(v0) * M, K) : p);
          cur.comment = ir::print_op(*op) + (op->loc.valid() ? "  (" + op->loc.str() + ")" : "");
        }
      }
    }
    if (cur.data || cur.nwait || cur.nsig) out.push_back(std::move(cur));
    return out;
  }

  std::string render(const Item& it, const std::vector<std::string>& e, const std::string& ind) const {
    std::string o;
    size_t k = 0;
    if (it.nwait) {
      std::string list;
      for (int w = 0; w < it.nwait; ++w, k += 3)
        list += fmt::format("{}{{{}, {}, {}}}", w ? ", " : "", e[k], e[k + 1], e[k + 2]);
      o += ind + "if (!c.wait_all({" + list + "})) return;\n";
    }
    if (it.data) {
      if (!it.comment.empty()) o += ind + "// " + it.comment + "\n";
      std::string refs[2];
      for (size_t r = 0; r < it.refs.size(); ++r) {
        const RefShape& sh = it.refs[r];
        std::string x;
        if (sh.kind == 2) {
          x = fmt::format("mk::dev::scratch_ref({}, {})", e[k], e[k + 1]);
          k += 2;
        } else if (s_.zero_copy) {  // any rank's user buffer
          x = fmt::format("mk::dev::peer_data_ref(mk::dev::{}, {}, {}, {}, {}, {})", sh.kind == 0 ? "kRefIn" : "kRefOut",
                          e[k], e[k + 1], sh.rot_b ? "true" : "false", e[k + 2], sh.rot_p ? "true" : "false");
          k += 3;
        } else {
          x = fmt::format("mk::dev::data_ref(mk::dev::{}, {}, {}, {}, {})", sh.kind == 0 ? "kRefIn" : "kRefOut", e[k],
                          sh.rot_b ? "true" : "false", e[k + 1], sh.rot_p ? "true" : "false");
          k += 2;
        }
        std::string& list = refs[r < size_t(it.ns) ? 0 : 1];
        list += (list.empty() ? "" : ", ") + x;
      }
      o += ind + fmt::format("if (!c.template op<{}, {}, {}, {}, {}u, {}u>({{{}}}, {{{}}}, mk::dev::pos_code({}, {}))) return;\n",
                             it.ns, it.nd, it.red ? "true" : "false", it.fin ? "true" : "false", it.sll, it.dll, refs[0],
                             refs[1], e[k], it.pos_rot ? "true" : "false");
      ++k;
    }
    if (it.nsig) {
      std::string list;
      for (int g = 0; g < it.nsig; ++g, k += 2) list += fmt::format("{}{{{}, {}}}", g ? ", " : "", e[k], e[k + 1]);
      o += ind + "c.signal_all({" + list + "});\n";
    }
    MK_CHECK(k == it.nums.size(), "codegen: item numbers and shape disagree");
    return o;
  }

  static std::vector<std::string> constants(const Item& it) {
    std::vector<std::string> e;
    for (int64_t v : it.nums) e.push_back(std::to_string(v));
    return e;
  }

  // Emits items, rerolling runs of groups of P items (P = 1..4) that repeat
  // with a constant numeric stride, at least 3 times.
  void emit_items(const std::vector<Item>& items) {
    const std::string ind = "    ";
    size_t i = 0;
    while (i < items.size()) {
      size_t best_p = 0, best_r = 0;
      std::vector<int64_t> best_delta;
      for (size_t P = 1; P <= 4 && i + 2 * P <= items.size(); ++P) {
        auto group_nums = [&](size_t at) {
          std::vector<int64_t> v;
          for (size_t j = 0; j < P; ++j) v.insert(v.end(), items[at + j].nums.begin(), items[at + j].nums.end());
          return v;
        };
        auto same_shape = [&](size_t a, size_t b) {
          for (size_t j = 0; j < P; ++j)
            if (items[a + j].shape() != items[b + j].shape()) return false;
          return true;
        };
        if (!same_shape(i, i + P)) continue;
        auto g0 = group_nums(i), g1 = group_nums(i + P);
        std::vector<int64_t> delta(g0.size());
        for (size_t k = 0; k < g0.size(); ++k) delta[k] = g1[k] - g0[k];
        size_t R = 2;
        while (i + (R + 1) * P <= items.size() && same_shape(i, i + R * P)) {
          auto gr = group_nums(i + R * P), gp = group_nums(i + (R - 1) * P);
          bool ok = true;
          for (size_t k = 0; k < gr.size() && ok; ++k) ok = gr[k] - gp[k] == delta[k];
          if (!ok) break;
          ++R;
        }
        if (R >= 3 && R * P > best_r * best_p) {
          best_p = P;
          best_r = R;
          best_delta = delta;
        }
      }
      if (best_r == 0) {
        o_ += render(items[i], constants(items[i]), ind);
        ++i;
        continue;
      }
      o_ += fmt::format("{}for (int i = 0; i < {}; ++i) {{  // {} x {} op group(s)\n", ind, best_r, best_r, best_p);
      size_t off = 0;
      for (size_t j = 0; j < best_p; ++j) {
        const Item& it = items[i + j];
        std::vector<std::string> e;
        for (size_t k = 0; k < it.nums.size(); ++k) {
          int64_t base = it.nums[k], d = best_delta[off + k];
          if (d == 0)
            e.push_back(std::to_string(base));
          else if (d == 1)
            e.push_back(fmt::format("{} + i", base));
          else if (d == -1)
            e.push_back(fmt::format("{} - i", base));
          else
            e.push_back(fmt::format("{} + ({}) * i", base, d));
        }
        off += it.nums.size();
        Item shown = it;
        shown.comment = "first of " + std::to_string(best_r) + ": " + it.comment;
        if (!it.data) shown.comment.clear();
        o_ += render(shown, e, ind + "  ");
      }
      o_ += ind + "}\n";
      i += best_r * best_p;
    }
  }

  void emit_tb(int32_t cls, int32_t tb, const std::vector<const Op*>& ops, bool inline_fn) {
    const int32_t v0 = rc_.representative[size_t(cls)];
    o_ += fmt::format("static __device__ {} void b{}_c{}_tb{}(mk::dev::Ctx<{}>& c) {{\n",
                      inline_fn ? "__forceinline__" : "__noinline__", b_, cls, tb, P());
    o_ += "  do {\n";
    emit_items(items_of(ops, v0));
    o_ += "  } while (c.next());\n}\n\n";
  }

  // For error reports: which rank (relative) should signal this wait.
  int32_t waiter_peer(const Op& w, int32_t v0) const {
    auto it = signaller_.find({w.rank, w.slot});
    return it == signaller_.end() ? 0 : mod(it->second - v0, s_.nranks);
  }

  KernelInfo emit(const std::string& kernel_name) {
    for (const Op& op : s_.ops)
      if (op.kind == OpKind::signal) signaller_[{op.peer, op.slot}] = op.rank;
    const int32_t nclasses = int32_t(rc_.representative.size());
    size_t total_ops = 0;
    std::vector<std::vector<std::vector<const Op*>>> prog(size_t(nclasses),
                                                          std::vector<std::vector<const Op*>>(size_t(s_.tbs)));
    for (int32_t c = 0; c < nclasses; ++c) {
      const int32_t v0 = rc_.representative[size_t(c)];
      for (const Op& op : s_.ops)
        if (op.rank == v0 && op.kind != OpKind::nop) {
          prog[size_t(c)][size_t(op.tb)].push_back(&op);
          ++total_ops;
        }
    }
    const bool inline_fns = total_ops <= 64;
    for (int32_t c = 0; c < nclasses; ++c)
      for (int32_t tb = 0; tb < s_.tbs; ++tb)
        if (!prog[size_t(c)][size_t(tb)].empty()) emit_tb(c, tb, prog[size_t(c)][size_t(tb)], inline_fns);

    const int32_t threads = s_.proto == ir::Proto::ll ? 256 : 512;
    o_ += fmt::format("extern \"C\" __global__ void __launch_bounds__({}, 1) {}(const mk::dev::Args a) {{\n",
                      threads, kernel_name);
    o_ += fmt::format("  __shared__ mk::dev::Shared<{}> sh;\n", s_.nranks);
    o_ += fmt::format("  mk::dev::Ctx<{}> c(a, sh);\n", P());
    o_ += "  if (c.L.steps == 0) return;\n";
    // Zero-copy: learn every peer's buffers and wait until every peer's kernel
    // has started (its buffers are ready and free to overwrite).
    if (s_.zero_copy) o_ += "  if (!c.zc_enter()) return;\n";
    std::string cls;
    for (int32_t v = 0; v < s_.nranks; ++v) cls += (v ? "," : "") + std::to_string(rc_.class_of[size_t(v)]);
    o_ += fmt::format("  static constexpr short kClassOf[{}] = {{{}}};\n", s_.nranks, cls);
    o_ += "  switch (kClassOf[c.vrank]) {\n";
    for (int32_t c = 0; c < nclasses; ++c) {
      o_ += fmt::format("    case {}:\n      switch (c.tb) {{\n", c);
      for (int32_t tb = 0; tb < s_.tbs; ++tb)
        if (!prog[size_t(c)][size_t(tb)].empty())
          o_ += fmt::format("        case {}: b{}_c{}_tb{}(c); break;\n", tb, b_, c, tb);
      o_ += "        default: break;\n      }\n      break;\n";
    }
    o_ += "    default: break;\n  }\n";
    if (s_.zero_copy)  // no rank returns while a peer may still touch its buffers
      o_ += "  if (!__syncthreads_or(c.aborted)) {\n    c.finish();\n    c.zc_exit();\n  }\n}\n\n";
    else
      o_ += "  if (!__syncthreads_or(c.aborted)) c.finish();\n}\n\n";
    KernelInfo k;
    k.name = kernel_name;
    k.grid = s_.tbs * s_.instances;
    k.block = threads;
    k.classes = nclasses;
    return k;
  }

 private:
  const Schedule& s_;
  int32_t b_;
  const RankClasses& rc_;
  std::string& o_;
  std::map<std::pair<int32_t, int32_t>, int32_t> signaller_;
};

}  // namespace

RankClasses rank_classes(const Schedule& s) {
  RankClasses best = classes_with(s, 0);
  if (s.nranks > 1 && s.chunks % s.nranks == 0) {
    RankClasses rot = classes_with(s, s.chunks / s.nranks);
    if (rot.representative.size() < best.representative.size()) best = std::move(rot);
  }
  return best;
}

std::vector<Unit> generate(const std::vector<Schedule>& variants, DType dtype, RedOp op, const std::string& tag) {
  MK_CHECK(!variants.empty(), "nothing to generate");
  std::vector<Unit> units;
  const Schedule& first = variants.front();
  for (size_t b = 0; b < variants.size(); ++b) {
    const Schedule& s = variants[b];
    MK_CHECK(s.synced && s.tbs > 0 && s.tile_bytes > 0, "codegen needs lowered schedules");
    MK_CHECK(s.nranks == first.nranks && s.coll == first.coll, "variants of one plan differ");
    Unit u;
    std::string& o = u.source;
    RankClasses rc = rank_classes(s);
    const bool rooted = collective_rooted(s.coll);
    o += fmt::format(
        "// Generated by mKernel codegen. Do not edit: regenerate with `mkc compile`.\n"
        "// schedule {} ({}), {} ranks, dtype {}, op {}, bucket {} of {}\n"
        "// proto {}, tiles up to {} B, {} instance(s), {} block(s) per instance, depth {}, {} scratch slot(s),\n"
        "// {} flag slot(s), {} rank class(es)\n"
        "#include \"kernel.cuh\"\n\n",
        s.name, name(s.coll), s.nranks, name(dtype), name(op), b, variants.size(), ir::name(s.proto), s.tile_bytes,
        s.instances, s.tbs, s.depth, s.scratch, s.slots, rc.representative.size());
    o += fmt::format(
        "struct P{} {{\n  using T = {};\n  static constexpr int kRed = {};\n"
        "  static constexpr int kRanks = {}, kChunks = {}, kTbs = {}, kInstances = {}, kDepth = {};\n"
        "  static constexpr int kScratch = {}, kSlots = {}, kThreads = {}, kPosRot = {};\n"
        "  static constexpr long long kMaxTileBytes = {};\n"
        "  static constexpr bool kLL = {}, kRooted = {}, kZeroCopy = {};\n}};\n\n",
        b, dtype_device_name(dtype), int(op), s.nranks, s.chunks, s.tbs, s.instances, s.depth,
        std::max(s.scratch, 1), std::max(s.slots, 1), s.proto == ir::Proto::ll ? 256 : 512, rc.pos_rot,
        s.tile_bytes, s.proto == ir::Proto::ll ? "true" : "false", rooted ? "true" : "false",
        s.zero_copy ? "true" : "false");
    Emitter e(s, int32_t(b), rc, o);
    u.kernel = e.emit(fmt::format("mk_{}_b{}", tag, b));
    units.push_back(std::move(u));
  }
  return units;
}

}  // namespace mk::codegen
