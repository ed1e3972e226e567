#include "compiler/codegen/codegen.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <limits>
#include <map>
#include <tuple>
#include <set>

#include "templates/abi.cuh"
#include "templates/ref.cuh"

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

// ---- items: a data op with the waits before it and the signals after it.
// Everything but the numbers is the item's shape. Ranks whose items have the
// same shapes share one code path (a rank class); the numbers of its members
// are kept side by side (member-major), and a number becomes a compile-time
// constant where every member agrees and a rank-indexed table entry where they
// do not. Runs of items whose numbers form arithmetic progressions become
// loops (rerolling), which keeps kernels for many ranks as small as for few.
struct RefShape {
  int kind;  // 0 input, 1 output, 2 scratch
  bool rot_b, rot_p;
};

// An op of more sources or destinations than this is wide: its operands are
// a runtime list of encoded operands it loops over (kernel.cuh op_wide), so
// NVRTC's work does not grow with their number (and the 32-bit LL masks of
// the unrolled primitive never see more than 8 operands). The kernel keeps
// the decoded list in shared memory: at most kWideMax operands.
constexpr int kWideFrom = 8;
constexpr int kWideMax = 1024;
struct Item {
  int nwait = 0, nsig = 0;
  bool data = false;
  int ns = 0, nd = 0;
  bool red = false, fin = false;
  bool wide = false;  // operands encoded (two numbers each), none in refs
  unsigned sll = 0, dll = 0;
  std::vector<RefShape> refs;  // per chunk k: srcs then dsts (none if wide)
  bool pos_rot = false;
  std::string comment;
  // waits (slot, iter, peer)*, then refs (a, b)*, pos, then signals (peer,
  // slot)*: `len` numbers per class member, members one after another
  std::vector<int64_t> nums;
  size_t len = 0;
  std::string shape() const {
    std::string t = fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}", nwait, nsig, data, ns, nd, red, fin, wide, sll,
                                dll, pos_rot, refs.size());
    for (auto& r : refs) t += fmt::format("/{}{}{}", r.kind, r.rot_b, r.rot_p);
    return t;
  }
};

// Splits one rank's ops into items, numbers relative to that rank (peers
// rotated by the rank, chunk positions by rank x pos_rot). `generic`: every
// reduce of two or more sources is wide too, so ranks whose reduces read
// sources of different kinds (one_shot: its own input among the peers'
// scratch, at its own place in the fixed order) can still share a code path.
class Splitter {
 public:
  Splitter(const Schedule& s, int32_t pos_rot, bool generic) : s_(s), M_(pos_rot), generic_(generic) {
    for (const Op& op : s_.ops)
      if (op.kind == OpKind::signal) signaller_[{op.peer, op.slot}] = op.rank;
  }

  // A data op of count > 1 becomes one item per chunk.
  std::vector<Item> items_of(const std::vector<const Op*>& ops, int32_t v0, bool comments) const {
    std::vector<Item> out;
    Item cur;
    const int32_t K = s_.chunks;
    auto close = [&] {
      cur.len = cur.nums.size();
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
          cur.wide = cur.ns > kWideFrom || cur.nd > kWideFrom || (generic_ && cur.red && cur.ns >= 2);
          if (cur.ns + cur.nd > kWideMax)
            throw Error(ErrId::jit_E005,
                        fmt::format("schedule '{}': op %{} has {} sources and {} destinations; a kernel's op has at "
                                    "most {} in all",
                                    s_.name, op->id, cur.ns, cur.nd, kWideMax),
                        op->loc, "split the op into several with fewer operands");
          if (s_.proto == ir::Proto::ll && !cur.wide) {  // a wide op's kernel tells from the operand
            for (int i = 0; i < cur.ns; ++i)
              if (op->srcs[size_t(i)].buf == Buf::scratch) cur.sll |= 1u << i;
            for (int i = 0; i < cur.nd; ++i)
              if (op->dsts[size_t(i)].buf == Buf::scratch) cur.dll |= 1u << i;
          }
          for (const auto* list : {&op->srcs, &op->dsts})
            for (const Ref& r : *list) {
              const auto [shape, nums] = ref_numbers(*op, r, k, v0);
              if (!cur.wide) {
                cur.refs.push_back(shape);
                cur.nums.insert(cur.nums.end(), nums.begin(), nums.end());
                continue;
              }
              const uint64_t e = encode(shape, nums);
              cur.nums.push_back(int32_t(uint32_t(e)));
              cur.nums.push_back(int32_t(uint32_t(e >> 32)));
            }
          const int32_t p = op->pos.at(size_t(k));
          cur.pos_rot = M_ != 0;
          cur.nums.push_back(M_ ? mod(p - int64_t(v0) * M_, K) : p);
          if (comments) cur.comment = ir::print_op(*op) + (op->loc.valid() ? "  (" + op->loc.str() + ")" : "");
        }
      }
    }
    if (cur.data || cur.nwait || cur.nsig) close();
    return out;
  }

 private:
  // The operand as the kernel's data_ref/peer_data_ref/scratch_ref (ref.cuh)
  // would build it from these numbers (the order render() passes them in).
  uint64_t encode(const RefShape& sh, const std::vector<int64_t>& n) const {
    auto i = [&](size_t k) { return int(n.at(k)); };
    if (sh.kind == 2) return dev::scratch_ref(i(0), i(1));
    if (s_.zero_copy) return dev::peer_data_ref(sh.kind, i(0), i(1), sh.rot_b, i(2), sh.rot_p);
    return dev::data_ref(sh.kind, i(0), sh.rot_b, i(1), sh.rot_p);
  }

  std::pair<RefShape, std::vector<int64_t>> ref_numbers(const Op& op, const Ref& r, int32_t k, int32_t v0) const {
    const int32_t N = s_.nranks, K = s_.chunks;
    if (r.buf == Buf::scratch) return {RefShape{2, false, false}, {mod(r.rank - v0, N), r.index + k}};
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
    std::vector<int64_t> nums;
    if (s_.zero_copy) nums.push_back(mod(r.rank - v0, N));  // whose buffer, relative
    nums.push_back(rot_b ? mod(b - v0, N) : b);
    nums.push_back(M_ ? mod(p - int64_t(v0) * M_, K) : p);
    return {RefShape{r.buf == Buf::input ? 0 : 1, rot_b, M_ != 0}, nums};
  }

  // For error reports: which rank (relative) should signal this wait.
  int32_t waiter_peer(const Op& w, int32_t v0) const {
    auto it = signaller_.find({w.rank, w.slot});
    return it == signaller_.end() ? 0 : mod(it->second - v0, s_.nranks);
  }

  const Schedule& s_;
  int32_t M_;
  bool generic_;
  std::map<std::pair<int32_t, int32_t>, int32_t> signaller_;
};

// Rank classes and, per class and thread block, the members' merged items.
struct ClassPlan {
  RankClasses rc;
  std::vector<std::vector<std::vector<Item>>> items;  // [class][tb]
  std::vector<std::vector<int32_t>> members;          // [class]: virtual ranks
  int64_t varying = 0;                                 // numbers the members disagree on
  int32_t wide = 0;                                    // operands of the widest wide op
};

// Why rank `v`'s items (`mine`) cannot share rank `v0`'s code path (`theirs`).
std::string why_apart(int32_t v, int32_t v0, const std::vector<std::vector<Item>>& mine,
                      const std::vector<std::vector<Item>>& theirs) {
  for (size_t tb = 0; tb < mine.size(); ++tb) {
    const auto &a = mine[tb], &b = theirs[tb];
    for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
      if (i < a.size() && i < b.size() && a[i].shape() == b[i].shape()) continue;
      auto what = [](const std::vector<Item>& x, size_t j) {
        if (j >= x.size()) return std::string("nothing");
        const Item& it = x[j];
        std::string w = fmt::format("{} wait(s), {} signal(s)", it.nwait, it.nsig);
        if (it.data) w += ", " + (it.comment.empty() ? std::string("a data op") : "`" + it.comment + "`");
        return w;
      };
      return fmt::format("rank {} differs from rank {} in thread block {}, step {}: {} vs {}", v, v0, tb, i,
                         what(a, i), what(b, i));
    }
  }
  return fmt::format("rank {} differs from rank {}", v, v0);
}

ClassPlan plan_classes(const Schedule& s, int32_t M, bool generic) {
  const Splitter sp(s, M, generic);
  const int32_t N = s.nranks, tbs = std::max(s.tbs, 1);
  std::vector<std::vector<std::vector<const Op*>>> ops(static_cast<size_t>(N));
  for (auto& r : ops) r.resize(static_cast<size_t>(tbs));
  for (const Op& op : s.ops)
    if (op.kind != OpKind::nop) ops[size_t(op.rank)][size_t(std::max(op.tb, 0))].push_back(&op);
  ClassPlan cp;
  cp.rc.pos_rot = M;
  std::map<std::string, int32_t> seen;
  std::vector<std::vector<std::vector<Item>>> per_rank(static_cast<size_t>(N));  // items without comments
  for (int32_t v = 0; v < N; ++v) {
    auto& mine = per_rank[size_t(v)];
    std::string key;
    for (int32_t tb = 0; tb < tbs; ++tb) {
      mine.push_back(sp.items_of(ops[size_t(v)][size_t(tb)], v, false));
      key += fmt::format("#{}", tb);
      for (const Item& it : mine.back()) key += ";" + it.shape();
    }
    auto [found, fresh] = seen.emplace(std::move(key), int32_t(cp.rc.representative.size()));
    if (fresh) {
      std::vector<std::vector<Item>> shown;  // the representative's items carry the source comments
      for (int32_t tb = 0; tb < tbs; ++tb) shown.push_back(sp.items_of(ops[size_t(v)][size_t(tb)], v, true));
      cp.rc.why.push_back(cp.items.empty() ? "" : why_apart(v, cp.rc.representative[0], shown, cp.items[0]));
      cp.rc.representative.push_back(v);
      cp.items.push_back(std::move(shown));
      cp.members.emplace_back();
    }
    cp.rc.class_of.push_back(found->second);
    cp.members[size_t(found->second)].push_back(v);
  }
  for (size_t c = 0; c < cp.items.size(); ++c)
    for (size_t tb = 0; tb < cp.items[c].size(); ++tb)
      for (size_t i = 0; i < cp.items[c][tb].size(); ++i) {
        Item& it = cp.items[c][tb][i];
        it.nums.clear();
        for (int32_t v : cp.members[c]) {
          const auto& n = per_rank[size_t(v)][tb][i].nums;
          it.nums.insert(it.nums.end(), n.begin(), n.end());
        }
        if (it.wide) cp.wide = std::max(cp.wide, int32_t(it.ns + it.nd));
        for (size_t k = 0; k < it.len; ++k)
          for (size_t m = 1; m < cp.members[c].size(); ++m)
            if (it.nums[m * it.len + k] != it.nums[k]) {
              ++cp.varying;
              break;
            }
      }
  return cp;
}

// The numbers a class's members disagree on: one row per member, one column
// per distinct list of values.
class Table {
 public:
  explicit Table(size_t members) : members_(members) {}
  int col(std::vector<int64_t> vals) {
    auto [it, fresh] = index_.emplace(std::move(vals), int(cols_.size()));
    if (fresh) cols_.push_back(&it->first);
    return it->second;
  }
  size_t width() const { return cols_.size(); }
  size_t members() const { return members_; }
  int64_t at(size_t m, size_t c) const { return (*cols_[c])[m]; }

 private:
  size_t members_;
  std::map<std::vector<int64_t>, int> index_;
  std::vector<const std::vector<int64_t>*> cols_;
};

class Emitter {
 public:
  // `served`: per class, whether to emit it (empty: every class).
  Emitter(const Schedule& s, int32_t bucket, const ClassPlan& cp, std::string& out, std::vector<char> served = {})
      : s_(s), b_(bucket), cp_(cp), o_(out), served_(std::move(served)) {
    if (served_.empty()) served_.assign(cp_.items.size(), 1);
  }

  std::string P() const { return fmt::format("P{}", b_); }

  std::string render(const Item& it, const std::vector<std::string>& e, const std::string& ind) {
    std::string o;
    count_size(it);
    size_t k = 0;
    if (it.nwait) {
      std::string list;
      for (int w = 0; w < it.nwait; ++w, k += 3)
        list += fmt::format("{}{{{}, {}, {}}}", w ? ", " : "", e[k], e[k + 1], e[k + 2]);
      o += ind + "if (!c.wait_all({" + list + "})) return;\n";
    }
    if (it.data) {
      if (!it.comment.empty()) o += ind + "// " + it.comment + "\n";
      std::string refs[2], wide;
      for (int w = 0; it.wide && w < it.ns + it.nd; ++w, k += 2)
        wide += fmt::format("{}mk::dev::ref_halves({}, {})", w ? ", " : "", e[k], e[k + 1]);
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
      if (it.wide)
        o += ind + fmt::format("{{\n{0}  const uint64_t r[{1}] = {{{2}}};\n{0}  if (!c.template op_wide<{3}, {4}>(r, {5}, {6}, "
                               "mk::dev::pos_code({7}, {8}))) return;\n{0}}}\n",
                               ind, it.ns + it.nd, wide, it.red ? "true" : "false", it.fin ? "true" : "false", it.ns,
                               it.nd, e[k], it.pos_rot ? "true" : "false");
      else
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
    MK_CHECK(k == it.len, "codegen: item numbers and shape disagree");
    return o;
  }

  // NVRTC's cost, roughly: every operand of every statement, and much more
  // for every distinct instantiation of the data primitive (each is unrolled
  // over its operands and compiled separately; a wide op's loop bodies
  // handle any number of operands, so it weighs as two, whatever ns and nd).
  void count_size(const Item& it) {
    const int64_t operands = it.data ? it.ns + it.nd : 1;
    size_ += operands;
    if (!it.data) return;
    const int64_t unrolled = it.wide ? 2 : operands;
    const std::string inst = it.wide ? fmt::format("wide|{}|{}", it.red, it.fin)
                                     : fmt::format("{}|{}|{}|{}|{}|{}", it.ns, it.nd, it.red, it.fin, it.sll, it.dll);
    if (instances_.insert(inst).second) size_ += 32 * unrolled;
  }

  // Number k of an item: a constant where all members agree, else a table
  // entry. `delta` (rerolled loops): the members' steps per iteration.
  std::string number(const Item& it, size_t k, const int64_t* delta, Table& t) {
    const size_t n = t.members();
    auto values = [&](auto f) {
      std::vector<int64_t> v(n);
      for (size_t m = 0; m < n; ++m) v[m] = f(m);
      return v;
    };
    auto show = [&](const std::vector<int64_t>& v) {
      for (int64_t x : v)
        if (x != v[0]) return fmt::format("t[{}]", t.col(v));
      return std::to_string(v[0]);
    };
    const std::string base = show(values([&](size_t m) { return it.nums[m * it.len + k]; }));
    if (!delta) return base;
    const auto d = values([&](size_t m) { return delta[m * it.len + k]; });
    const std::string ds = show(d);
    if (ds == "0") return base;
    if (ds == "1") return base + " + i";
    if (ds == "-1") return base + " - i";
    return fmt::format("{} + ({}) * i", base, ds);
  }

  std::vector<std::string> numbers(const Item& it, const int64_t* delta, Table& t) {
    std::vector<std::string> e;
    for (size_t k = 0; k < it.len; ++k) e.push_back(number(it, k, delta, t));
    return e;
  }

  // Emits items, rerolling runs of groups of P items (P = 1..4) that repeat
  // with a constant numeric stride (per member), at least 3 times.
  std::string emit_items(const std::vector<Item>& items, Table& t) {
    const std::string ind = "    ";
    std::string o;
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
        o += render(items[i], numbers(items[i], nullptr, t), ind);
        ++i;
        continue;
      }
      o += fmt::format("{}for (int i = 0; i < {}; ++i) {{  // {} x {} op group(s)\n", ind, best_r, best_r, best_p);
      size_t off = 0;
      for (size_t j = 0; j < best_p; ++j) {
        const Item& it = items[i + j];
        const auto e = numbers(it, best_delta.data() + off, t);
        off += it.nums.size();
        Item shown = it;
        shown.comment = "first of " + std::to_string(best_r) + ": " + it.comment;
        if (!it.data) shown.comment.clear();
        o += render(shown, e, ind + "  ");
      }
      o += ind + "}\n";
      i += best_r * best_p;
    }
    return o;
  }

  void emit_tb(int32_t cls, int32_t tb, const std::vector<Item>& items, bool inline_fn, Table& t) {
    const std::string body = emit_items(items, t);
    const bool tabled = t.width() > 0;  // the class's table so far; rows are per member, so any column needs it
    o_ += fmt::format("static __device__ {} void b{}_c{}_tb{}(mk::dev::Ctx<{}>& c{}) {{\n",
                      inline_fn ? "__forceinline__" : "__noinline__", b_, cls, tb, P(), tabled ? ", const int* t" : "");
    o_ += "  do {\n" + body + "  } while (c.next());\n}\n\n";
    tabled_[{cls, tb}] = tabled;
  }

  // The classes' tables: constant memory while they fit, else global memory.
  void emit_tables(const std::vector<Table>& tables) {
    size_t bytes = 0;
    for (const Table& t : tables) bytes += t.members() * t.width() * sizeof(int32_t);
    table_bytes_ = int64_t(bytes);
    if (bytes == 0) return;
    const char* space = bytes <= (32u << 10) ? "__constant__" : "__device__";
    std::string member;
    for (int32_t v = 0; v < s_.nranks; ++v) {
      const auto& mem = cp_.members[size_t(cp_.rc.class_of[size_t(v)])];
      member += fmt::format("{}{}", v ? "," : "", std::find(mem.begin(), mem.end(), v) - mem.begin());
    }
    o_ += fmt::format("// per rank: its row in its class's table\nstatic {} const short kMember{}[{}] = {{{}}};\n", space,
                      b_, s_.nranks, member);
    for (size_t c = 0; c < tables.size(); ++c) {
      const Table& t = tables[c];
      if (!t.width()) continue;
      o_ += fmt::format("static {} const int kT{}_c{}[{}][{}] = {{\n", space, b_, c, t.members(), t.width());
      for (size_t m = 0; m < t.members(); ++m) {
        o_ += "  {";
        for (size_t k = 0; k < t.width(); ++k) o_ += fmt::format("{}{}", k ? "," : "", t.at(m, k));
        o_ += "},\n";
      }
      o_ += "};\n";
    }
    o_ += "\n";
  }

  KernelInfo emit(const std::string& kernel_name, const Limits& lim) {
    const int32_t nclasses = int32_t(cp_.rc.representative.size());
    size_t total_items = 0;
    for (size_t c = 0; c < cp_.items.size(); ++c)
      for (const auto& tb : cp_.items[c]) total_items += served_[c] ? tb.size() : 0;
    const bool inline_fns = total_items <= 64;
    std::vector<Table> tables;
    for (int32_t c = 0; c < nclasses; ++c) {
      tables.emplace_back(cp_.members[size_t(c)].size());
      if (!served_[size_t(c)]) continue;
      for (int32_t tb = 0; tb < int32_t(cp_.items[size_t(c)].size()); ++tb)
        if (!cp_.items[size_t(c)][size_t(tb)].empty())
          emit_tb(c, tb, cp_.items[size_t(c)][size_t(tb)], inline_fns, tables.back());
    }
    emit_tables(tables);
    check_size(lim);

    const int32_t threads = s_.proto == ir::Proto::ll ? 256 : 512;
    o_ += fmt::format("extern \"C\" __global__ void __launch_bounds__({}, 1) {}(const mk::dev::Args a) {{\n",
                      threads, kernel_name);
    o_ += fmt::format("  __shared__ mk::dev::Shared<{}> sh;\n", s_.nranks);
    o_ += fmt::format("  mk::dev::Ctx<{}> c(a, sh);\n", P());
    o_ += "  if (c.L.steps == 0) return;\n";
    // Zero-copy: learn every peer's buffers and wait until every peer's kernel
    // has started (its buffers are ready and free to overwrite).
    if (s_.zero_copy) o_ += "  if (!c.zc_enter()) return;\n";
    std::string cls;  // -1: a class this kernel was not generated for
    for (int32_t v = 0; v < s_.nranks; ++v) {
      const int32_t c = cp_.rc.class_of[size_t(v)];
      cls += (v ? "," : "") + std::to_string(served_[size_t(c)] ? c : -1);
    }
    o_ += fmt::format("  static constexpr short kClassOf[{}] = {{{}}};\n", s_.nranks, cls);
    o_ += "  switch (kClassOf[c.vrank]) {\n";
    for (int32_t c = 0; c < nclasses; ++c) {
      if (!served_[size_t(c)]) continue;
      o_ += fmt::format("    case {}:\n      switch (c.tb) {{\n", c);
      for (int32_t tb = 0; tb < int32_t(cp_.items[size_t(c)].size()); ++tb) {
        if (cp_.items[size_t(c)][size_t(tb)].empty()) continue;
        const std::string row = tabled_[{c, tb}] ? fmt::format(", kT{}_c{}[kMember{}[c.vrank]]", b_, c, b_) : "";
        o_ += fmt::format("        case {}: b{}_c{}_tb{}(c{}); break;\n", tb, b_, c, tb, row);
      }
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
    k.size = size_;
    k.table_bytes = table_bytes_;
    return k;
  }

 private:
  // Refuses a kernel NVRTC would take minutes and gigabytes over, before it runs.
  void check_size(const Limits& lim) const {
    if (size_ <= lim.max_size && table_bytes_ <= lim.max_table_bytes) return;
    std::string hint;
    const auto& rc = cp_.rc;
    for (size_t c = 1; c < rc.representative.size() && c <= 3; ++c) hint += "\n  " + rc.why[c];
    if (rc.representative.size() > 4) hint += fmt::format("\n  ... ({} rank classes in all)", rc.representative.size());
    throw Error(ErrId::jit_E005,
                fmt::format("schedule '{}' for {} ranks: a kernel of size {} in {} rank class(es) with {} bytes of "
                            "rank tables (limits: size {}, {} bytes; size counts the operands of every "
                            "operation and of every distinct kind of operation)",
                            s_.name, s_.nranks, size_, rc.representative.size(), table_bytes_, lim.max_size,
                            lim.max_table_bytes),
                {},
                "ranks share code when their programs have the same steps (only peers and chunk numbers may "
                "differ); these could not:" +
                    (hint.empty() ? std::string(" (one class, but too many steps)") : hint) +
                    "\n  see `mkc show --classes`; write the schedule step-major so that every rank does the same "
                    "kind of operation at the same step, or use fewer ranks or chunks");
  }

  const Schedule& s_;
  int32_t b_;
  const ClassPlan& cp_;
  std::string& o_;
  int64_t size_ = 0, table_bytes_ = 0;
  std::vector<char> served_;
  std::set<std::string> instances_;
  std::map<std::pair<int32_t, int32_t>, bool> tabled_;
};

// Fewest classes, then the smallest kernel (rerolled loops need numbers that
// step evenly for every member: absolute chunk positions may, rotated ones
// wrap), then the smallest tables; chunk positions rotate with the rank when
// that wins.
//
// Reduces are generic (every one wide, its sources' kinds from the numbers)
// only where that merges classes: the unrolled primitive is faster for few
// sources. The choice never depends on which ranks a plan serves, so every
// rank of a class generates the same source.
ClassPlan best_plan(const Schedule& s) {
  auto cost = [&](const ClassPlan& p) {
    std::string scratch;
    Emitter e(s, 0, p, scratch);
    const Limits none{std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::max()};
    const KernelInfo k = e.emit("measure", none);
    return std::tuple(p.rc.representative.size(), k.size, k.table_bytes);
  };
  std::vector<int32_t> rots{0};
  if (s.nranks > 1 && s.chunks % s.nranks == 0) rots.push_back(s.chunks / s.nranks);
  ClassPlan best = plan_classes(s, 0, false);
  if (rots.size() == 1 && best.rc.representative.size() == 1) return best;  // nothing to choose
  auto best_cost = cost(best);
  const bool several = best.rc.representative.size() > 1;
  for (bool generic : {false, true}) {
    if (generic && !several) break;
    for (int32_t M : rots) {
      if (!generic && M == 0) continue;  // the starting point
      ClassPlan c = plan_classes(s, M, generic);
      auto cc = cost(c);
      if (cc < best_cost) {
        best = std::move(c);
        best_cost = cc;
      }
    }
  }
  return best;
}

}  // namespace

RankClasses rank_classes(const Schedule& s) { return best_plan(s).rc; }

std::string print_classes(const RankClasses& rc) {
  std::string out = fmt::format("{} rank class(es) (one code path each){}\n", rc.representative.size(),
                                rc.pos_rot ? fmt::format(", chunk positions rotate by {} per rank", rc.pos_rot) : "");
  for (size_t c = 0; c < rc.representative.size(); ++c) {
    std::string ranks;
    for (int32_t v = 0; v < int32_t(rc.class_of.size()); ++v) {
      if (rc.class_of[size_t(v)] != int32_t(c)) continue;
      int32_t e = v;
      while (e + 1 < int32_t(rc.class_of.size()) && rc.class_of[size_t(e) + 1] == int32_t(c)) ++e;
      ranks += fmt::format("{}{}", ranks.empty() ? "" : ",", e > v ? fmt::format("{}-{}", v, e) : std::to_string(v));
      v = e;
    }
    out += fmt::format("  class {}: ranks {}{}\n", c, ranks, c < rc.why.size() && !rc.why[c].empty() ? "; " + rc.why[c] : "");
  }
  return out;
}

std::vector<Unit> generate(const std::vector<Schedule>& variants, DType dtype, RedOp op, const std::string& tag,
                           const Limits& lim, int32_t rank) {
  MK_CHECK(!variants.empty(), "nothing to generate");
  std::vector<Unit> units;
  const Schedule& first = variants.front();
  for (size_t b = 0; b < variants.size(); ++b) {
    const Schedule& s = variants[b];
    MK_CHECK(s.synced && s.tbs > 0 && s.tile_bytes > 0, "codegen needs lowered schedules");
    MK_CHECK(s.nranks == first.nranks && s.coll == first.coll, "variants of one plan differ");
    Unit u;
    std::string& o = u.source;
    MK_CHECK(rank < s.nranks, "codegen: rank out of range");
    const ClassPlan cp = best_plan(s);
    const RankClasses& rc = cp.rc;
    const bool rooted = collective_rooted(s.coll);
    std::vector<char> served;
    if (rank >= 0 && !rooted) {
      const int32_t mine = rc.class_of[size_t(rank)];
      served.assign(rc.representative.size(), 0);
      served[size_t(mine)] = 1;
      u.serves = cp.members[size_t(mine)];
    }
    o += fmt::format(
        "// Generated by mKernel codegen. Do not edit: regenerate with `mkc compile`.\n"
        "// schedule {} ({}), {} ranks, dtype {}, op {}, bucket {} of {}\n"
        "// proto {}, tiles up to {} B, {} instance(s), {} block(s) per instance, depth {}, {} scratch slot(s),\n"
        "// {} flag slot(s), {} rank class(es){}\n"
        "#include \"kernel.cuh\"\n\n",
        s.name, name(s.coll), s.nranks, name(dtype), name(op), b, variants.size(), ir::name(s.proto), s.tile_bytes,
        s.instances, s.tbs, s.depth, s.scratch, s.slots, rc.representative.size(),
        served.empty() ? ""
                       : fmt::format("; only class {} ({} rank(s)): other ranks run nothing",
                                     rc.class_of[size_t(rank)], u.serves.size()));
    o += fmt::format(
        "struct P{} {{\n  using T = {};\n  static constexpr int kRed = {};\n"
        "  static constexpr int kRanks = {}, kChunks = {}, kTbs = {}, kInstances = {}, kDepth = {};\n"
        "  static constexpr int kScratch = {}, kSlots = {}, kThreads = {}, kPosRot = {}, kWide = {};\n"
        "  static constexpr long long kMaxTileBytes = {};\n"
        "  static constexpr bool kLL = {}, kRooted = {}, kZeroCopy = {};\n}};\n\n",
        b, dtype_device_name(dtype), int(op), s.nranks, s.chunks, s.tbs, s.instances, s.depth,
        std::max(s.scratch, 1), std::max(s.slots, 1), s.proto == ir::Proto::ll ? 256 : 512, rc.pos_rot, cp.wide,
        s.tile_bytes, s.proto == ir::Proto::ll ? "true" : "false", rooted ? "true" : "false",
        s.zero_copy ? "true" : "false");
    Emitter e(s, int32_t(b), cp, o, served);
    u.kernel = e.emit(fmt::format("mk_{}_b{}", tag, b), lim);
    units.push_back(std::move(u));
  }
  return units;
}

}  // namespace mk::codegen
