#include "compiler/codegen/codegen.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <limits>
#include <map>
#include <unordered_map>
#include <tuple>
#include <set>

#include "compiler/common/side_by_side.hpp"
#include "compiler/passes/passes.hpp"
#include "compiler/verify/verify.hpp"
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

// a mod m in 0..m-1 (m > 0); without a division in the common case (a is a
// difference of two ranks or positions), once per number of every rank's ops.
int32_t mod(int64_t a, int64_t m) {
  if (a >= 0 && a < m) return int32_t(a);
  if (a < 0 && a >= -m) return int32_t(a + m);
  const int64_t r = a % m;
  return int32_t(r < 0 ? r + m : r);
}

// ---- items: a data op with the waits before it and the signals after it.
// Everything but the numbers is the item's shape. Ranks whose items have the
// same shapes share one code path (a rank class); the numbers of its members
// are kept side by side (member-major), and a number becomes a compile-time
// constant where every member agrees and a rank-indexed table entry where they
// do not. At emission, consecutive chunks of a data op whose numbers step
// evenly become one item with a chunk count (a loop over the chunks, the
// count and the steps being numbers too), and runs of groups of items of the
// same shapes become loops whose per-iteration numbers step evenly or come
// from tables (rerolling), which keeps kernels for many ranks as small as for
// few.
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
  // A generic reduce of a one-pass kernel: operands encoded like a wide op's,
  // but a fixed number of them, run by the unrolled primitive (kernel.cuh
  // op_gpass); one-pass kernels have no wide ops.
  bool gen = false;
  bool encoded() const { return wide || gen; }
  unsigned sll = 0, dll = 0;
  std::vector<RefShape> refs;  // per chunk k: srcs then dsts (none if wide)
  bool pos_rot = false;
  std::string comment;
  // The representative rank's data op (its IR id, a constant for every
  // member: the error record names it and the host finds its comment, with
  // the DSL line, in the generated source); -1: none.
  int32_t op_id = -1;
  // waits (slot, iter, peer)*, then the data numbers (refs (a, b)* or the
  // encoded operands, then pos: `ndata` numbers), then signals (peer, slot)*,
  // then, once counted (count_chunks), the chunk count and the data numbers'
  // steps per chunk: `len` numbers per class member, members one after another
  std::vector<int64_t> nums;
  size_t len = 0;
  int ndata = 0;
  bool counted = false;
  size_t data_at() const { return size_t(3 * nwait); }
  size_t count_at() const { return data_at() + size_t(ndata) + size_t(2 * nsig); }
  std::string shape() const { return fmt::format("{}|{}|", nwait, nsig) + data_shape(); }
  // The shape without the waits and signals.
  std::string data_shape() const {
    std::string t = fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}", data, ns, nd, red, fin, wide, gen, sll, dll,
                                pos_rot, counted, refs.size());
    for (auto& r : refs) t += fmt::format("/{}{}{}", r.kind, r.rot_b, r.rot_p);
    return t;
  }
};

// Item shapes, interned: ranks compare their item lists by id, and a
// class's items are stored once per rank as numbers only (Stream).
class Shapes {
 public:
  // `base` with these waits, signals and numbers: an item without numbers
  // (base's ndata set). Once per op of every rank: the key is built in a
  // buffer and the item copied only when new.
  int32_t intern(const Item& base, int nwait, int nsig, size_t len) {
    data_key(base, key_);
    const int32_t d = data_ids_.try_emplace(key_, int32_t(data_ids_.size())).first->second;
    key_ += pack(nwait);
    key_ += pack(nsig);
    auto [pos, fresh] = ids_.try_emplace(key_, int32_t(items_.size()));
    if (fresh) {
      Item it = base;
      it.nwait = nwait;
      it.nsig = nsig;
      it.len = len;
      items_.push_back(std::move(it));
      data_.push_back(d);
    }
    return pos->second;
  }
  const Item& operator[](int32_t id) const { return items_[size_t(id)]; }
  // Equal for items of equal Item::data_shape().
  int32_t data_id(int32_t id) const { return data_[size_t(id)]; }
  // Operands of the widest wide op.
  int32_t widest() const {
    int32_t w = 0;
    for (const Item& it : items_)
      if (it.wide) w = std::max(w, int32_t(it.ns + it.nd));
    return w;
  }

 private:
  // Item::shape() and data_shape() as bytes, without formatting: interned
  // once per op of every rank.
  static std::string_view pack(const int64_t& x) { return {reinterpret_cast<const char*>(&x), sizeof x}; }
  static void data_key(const Item& it, std::string& k) {
    k.clear();
    for (int64_t x : {int64_t(it.ns), int64_t(it.nd), int64_t(it.sll), int64_t(it.dll), int64_t(it.refs.size())}) k += pack(x);
    for (bool b : {it.data, it.red, it.fin, it.wide, it.gen, it.pos_rot, it.counted}) k += char(b);
    for (const RefShape& r : it.refs) k += {char(r.kind), char(r.rot_b), char(r.rot_p)};
  }

  std::string key_;
  std::unordered_map<std::string, int32_t> ids_, data_ids_;
  std::vector<Item> items_;
  std::vector<int32_t> data_;
};

// One rank's items of one thread block, flat (one chunk of a data op is one
// item): item j has shape shape[j] and numbers nums[at[j] .. at[j + 1]).
// Flat because there are ranks x chunks of them: an Item each (vectors,
// shape strings) made code generation for 1024 ranks take 20-30 s.
struct Stream {
  std::vector<int32_t> shape;
  std::vector<uint32_t> at{0};
  std::vector<int32_t> nums;  // every number is an int (a wide operand's 64 bits are two)
  std::vector<const Op*> op;  // per item: its data op, for comments (nullptr: none)
  size_t size() const { return shape.size(); }
  bool empty() const { return shape.empty(); }
  int64_t num(size_t j, size_t x) const { return nums[at[j] + x]; }
};

// The source comment of a data op's statement.
std::string comment_of(const Op* op) {
  if (!op) return "";
  return ir::print_op(*op) + (op->loc.valid() ? "  (" + op->loc.str() + ")" : "");
}

// Splits one rank's ops into items, numbers relative to that rank (peers
// rotated by the rank, chunk positions by rank x pos_rot). `generic`: every
// reduce of two or more sources is wide too, so ranks whose reduces read
// sources of different kinds (one_shot: its own input among the peers'
// scratch, at its own place in the fixed order) can still share a code path.
class Splitter {
 public:
  Splitter(const Schedule& s, int32_t pos_rot, bool generic) : s_(s), M_(pos_rot), generic_(generic) {
    slots_ = std::max(s_.slots, 1);
    signaller_.assign(size_t(s_.nranks) * size_t(slots_), -1);
    for (const Op& op : s_.ops)
      if (op.kind == OpKind::signal && op.peer >= 0 && op.peer < s_.nranks && op.slot >= 0 && op.slot < slots_)
        signaller_[size_t(op.peer) * size_t(slots_) + size_t(op.slot)] = op.rank;
  }

  // Appends the items of `ops` (one thread block of rank v0) to `out`; a
  // data op of count > 1 becomes one item per chunk.
  void items_of(const std::vector<const Op*>& ops, int32_t v0, Shapes& shapes, Stream& out) const {
    int nwait = 0, nsig = 0;
    const Op* data = nullptr;  // the open item's data op
    Item shape;                // data's shape (per op: equal for its chunks)
    // The chunks of one op after the first share a shape: intern it once.
    const Op* last_op = nullptr;
    int last_nwait = -1, last_nsig = -1;
    int32_t last_id = -1;
    auto close = [&] {
      int32_t id = last_id;
      if (!data || data != last_op || nwait != last_nwait || nsig != last_nsig) {
        static const Item kNoData{};
        id = shapes.intern(data ? shape : kNoData, nwait, nsig, out.nums.size() - out.at.back());
        last_op = data;
        last_nwait = nwait;
        last_nsig = nsig;
        last_id = id;
      }
      out.shape.push_back(id);
      MK_CHECK(out.nums.size() < (size_t(1) << 32), "codegen: a thread block's numbers overflow");
      out.at.push_back(uint32_t(out.nums.size()));
      out.op.push_back(data);
      nwait = nsig = 0;
      data = nullptr;
    };
    for (const Op* op : ops) {
      // One pass (passes/one_pass.cpp): the launches order what the reuse
      // waits and signals ordered; the kernel runs the data ops alone.
      if (s_.one_pass && (op->kind == OpKind::wait || op->kind == OpKind::signal)) continue;
      if (op->kind == OpKind::wait) {
        if (data || nsig) close();
        ++nwait;
        out.nums.push_back(op->slot);
        out.nums.push_back(op->iter);
        out.nums.push_back(waiter_peer(*op, v0));
      } else if (op->kind == OpKind::signal) {
        ++nsig;
        out.nums.push_back(mod(op->peer - v0, s_.nranks));
        out.nums.push_back(op->slot);
      } else if (op->is_data()) {
        if (data || nsig) close();  // before `shape` changes
        shape = data_shape(*op);
        for (int32_t k = 0; k < op->count(); ++k) {
          if (data || nsig) close();
          data = op;
          const size_t data_from = out.nums.size();
          for (const auto* list : {&op->srcs, &op->dsts})
            for (const Ref& r : *list) {
              int64_t n[3];
              const RefShape sh = ref_numbers(*op, r, k, v0, n);
              if (!shape.encoded()) {
                out.nums.insert(out.nums.end(), n, n + nums_of(sh));
                continue;
              }
              const uint64_t e = encode(sh, n);
              out.nums.push_back(int32_t(uint32_t(e)));
              out.nums.push_back(int32_t(uint32_t(e >> 32)));
            }
          const int32_t p = op->pos.at(size_t(k));
          out.nums.push_back(M_ ? mod(p - int64_t(v0) * M_, s_.chunks) : p);
          shape.ndata = int(out.nums.size() - data_from);
        }
      }
    }
    if (data || nwait || nsig) close();
  }

 private:
  // A data op's item shape, without waits and signals (equal for its chunks).
  Item data_shape(const Op& op) const {
    Item it;
    it.data = true;
    it.ns = int(op.srcs.size());
    it.nd = int(op.dsts.size());
    it.red = op.kind == OpKind::reduce;
    it.fin = op.final;
    const bool generic = generic_ && it.red && it.ns >= 2;
    it.wide = it.ns > kWideFrom || it.nd > kWideFrom || (generic && !s_.one_pass);
    // (one_pass.cpp admits no op of more than 8 operands)
    it.gen = generic && !it.wide;
    if (it.ns + it.nd > kWideMax)
      throw Error(ErrId::jit_E005,
                  fmt::format("schedule '{}': op %{} has {} sources and {} destinations; a kernel's op has at "
                              "most {} in all",
                              s_.name, op.id, it.ns, it.nd, kWideMax),
                  op.loc, "split the op into several with fewer operands");
    if (s_.proto == ir::Proto::ll && !it.encoded()) {  // an encoded op's kernel tells from the operand
      for (int i = 0; i < it.ns; ++i)
        if (op.srcs[size_t(i)].buf == Buf::scratch) it.sll |= 1u << i;
      for (int i = 0; i < it.nd; ++i)
        if (op.dsts[size_t(i)].buf == Buf::scratch) it.dll |= 1u << i;
    }
    if (!it.encoded())
      for (const auto* list : {&op.srcs, &op.dsts})
        for (const Ref& r : *list) it.refs.push_back(ref_shape(r));
    it.pos_rot = M_ != 0;
    return it;
  }

  RefShape ref_shape(const Ref& r) const {
    if (r.buf == Buf::scratch) return RefShape{2, false, false};
    const bool rot_b = ir::buf_blocks(s_.coll, s_.nranks, r.buf) == s_.nranks && s_.nranks > 1;
    return RefShape{r.buf == Buf::input ? 0 : 1, rot_b, M_ != 0};
  }
  // How many numbers a reference of this shape has.
  size_t nums_of(const RefShape& sh) const { return sh.kind == 2 ? 2 : s_.zero_copy ? 3 : 2; }

  // The operand as the kernel's data_ref/peer_data_ref/scratch_ref (ref.cuh)
  // would build it from these numbers (the order render() passes them in).
  uint64_t encode(const RefShape& sh, const int64_t* n) const {
    auto i = [&](size_t k) { return int(n[k]); };
    if (sh.kind == 2) return dev::scratch_ref(i(0), i(1));
    if (s_.zero_copy) return dev::peer_data_ref(sh.kind, i(0), i(1), sh.rot_b, i(2), sh.rot_p);
    return dev::data_ref(sh.kind, i(0), sh.rot_b, i(1), sh.rot_p);
  }

  // The reference's shape; its nums_of(shape) numbers into `n`.
  RefShape ref_numbers(const Op& op, const Ref& r, int32_t k, int32_t v0, int64_t* n) const {
    const int32_t N = s_.nranks, K = s_.chunks;
    const RefShape sh = ref_shape(r);
    if (r.buf == Buf::scratch) {
      n[0] = mod(r.rank - v0, N);
      n[1] = r.index + k;
      return sh;
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
    size_t x = 0;
    if (s_.zero_copy) n[x++] = mod(r.rank - v0, N);  // whose buffer, relative
    n[x++] = sh.rot_b ? mod(b - v0, N) : b;
    n[x++] = M_ ? mod(p - int64_t(v0) * M_, K) : p;
    return sh;
  }

  // For error reports: which rank (relative) should signal this wait.
  int32_t waiter_peer(const Op& w, int32_t v0) const {
    if (w.slot < 0 || w.slot >= slots_) return 0;
    const int32_t r = signaller_[size_t(w.rank) * size_t(slots_) + size_t(w.slot)];
    return r < 0 ? 0 : mod(r - v0, s_.nranks);
  }

  const Schedule& s_;
  int32_t M_;
  bool generic_;
  int32_t slots_ = 1;
  std::vector<int32_t> signaller_;  // (rank, slot) -> the rank signalling it, -1 for none
};

// Rank classes and every rank's items.
struct ClassPlan {
  RankClasses rc;
  Shapes shapes;
  std::vector<std::vector<Stream>> items;    // [virtual rank][tb]
  std::vector<std::vector<int32_t>> members;  // [class]: virtual ranks
  int32_t tbs = 0;                            // thread blocks per rank
  int32_t wide = 0;                           // operands of the widest wide op
  // Items of class c's code path in thread block tb (every member has the same shapes).
  const Stream& path(size_t c, size_t tb) const { return items[size_t(members[c][0])][tb]; }
};

// Why rank `v`'s items cannot share rank `v0`'s code path.
std::string why_apart(const ClassPlan& cp, int32_t v, int32_t v0) {
  const auto &mine = cp.items[size_t(v)], &theirs = cp.items[size_t(v0)];
  for (size_t tb = 0; tb < mine.size(); ++tb) {
    const Stream &a = mine[tb], &b = theirs[tb];
    for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
      if (i < a.size() && i < b.size() && a.shape[i] == b.shape[i]) continue;
      auto what = [&](const Stream& x, size_t j) {
        if (j >= x.size()) return std::string("nothing");
        const Item& it = cp.shapes[x.shape[j]];
        std::string w = fmt::format("{} wait(s), {} signal(s)", it.nwait, it.nsig);
        if (it.data) w += ", `" + comment_of(x.op[j]) + "`";
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
  cp.tbs = tbs;
  cp.items.resize(size_t(N));
  std::map<std::vector<int32_t>, int32_t> seen;  // per thread block: -1, then its items' shapes
  for (int32_t v = 0; v < N; ++v) {
    auto& mine = cp.items[size_t(v)];
    mine.resize(size_t(tbs));
    std::vector<int32_t> key;
    for (int32_t tb = 0; tb < tbs; ++tb) {
      sp.items_of(ops[size_t(v)][size_t(tb)], v, cp.shapes, mine[size_t(tb)]);
      key.push_back(-1);
      key.insert(key.end(), mine[size_t(tb)].shape.begin(), mine[size_t(tb)].shape.end());
    }
    auto [found, fresh] = seen.emplace(std::move(key), int32_t(cp.rc.representative.size()));
    if (fresh) {
      cp.rc.why.push_back(cp.members.empty() ? "" : why_apart(cp, v, cp.rc.representative[0]));
      cp.rc.representative.push_back(v);
      cp.members.emplace_back();
    }
    cp.rc.class_of.push_back(found->second);
    cp.members[size_t(found->second)].push_back(v);
  }
  cp.wide = cp.shapes.widest();
  return cp;
}

// Rank v's program alone, as one class of one member: what a one-rank plan
// of many ranks is generated from (Limits::own_rank_from). Every number is
// the rank's own, so there are no rank tables and nothing of the other
// ranks' programs is split into items: code generation is O(one rank's
// program), not O(ranks x program). Chunk positions do not rotate
// (rotation only lets ranks share code).
ClassPlan own_plan(const Schedule& s, int32_t v) {
  const Splitter sp(s, 0, false);
  const int32_t N = s.nranks, tbs = std::max(s.tbs, 1);
  std::vector<std::vector<const Op*>> ops(static_cast<size_t>(tbs));
  for (const Op& op : s.ops)
    if (op.rank == v && op.kind != OpKind::nop) ops[size_t(std::max(op.tb, 0))].push_back(&op);
  ClassPlan cp;
  cp.tbs = tbs;
  cp.items.resize(size_t(N));
  auto& mine = cp.items[size_t(v)];
  mine.resize(size_t(tbs));
  for (int32_t tb = 0; tb < tbs; ++tb) sp.items_of(ops[size_t(tb)], v, cp.shapes, mine[size_t(tb)]);
  cp.rc.class_of.assign(size_t(N), -1);  // the other ranks: not generated
  cp.rc.class_of[size_t(v)] = 0;
  cp.rc.representative = {v};
  cp.rc.why = {""};
  cp.members = {{v}};
  cp.wide = cp.shapes.widest();
  return cp;
}

// The numbers a class's members disagree on: one row per member, one column
// per distinct list of values, or per distinct block of adjacent columns
// that a rerolled loop indexes by its counter. With one member: the numbers
// a loop reads per iteration that every member agrees on (kU<bucket>).
class Table {
 public:
  explicit Table(size_t members) : members_(members) {}
  int col(const std::vector<int64_t>& vals) { return block({vals}); }
  // The first of cols.size() adjacent columns holding `cols`.
  int block(const std::vector<std::vector<int64_t>>& cols) {
    auto [it, fresh] = index_.emplace(cols, int(cols_.size()));
    if (fresh) cols_.insert(cols_.end(), cols.begin(), cols.end());
    return it->second;
  }
  size_t width() const { return cols_.size(); }
  size_t members() const { return members_; }
  int64_t at(size_t m, size_t c) const { return cols_[c][m]; }

 private:
  size_t members_;
  std::map<std::vector<std::vector<int64_t>>, int> index_;
  std::vector<std::vector<int64_t>> cols_;
};

// Class c's items in thread block tb, the members' numbers side by side
// (member-major). Consecutive data items of one data shape, with no signal
// before and no wait after the first, whose data numbers step evenly (per
// member) from one to the next (the chunks of one op, or of ops a DSL loop
// wrote) become one counted item: the first's waits, a loop over `count`
// chunks, the last's signals; the statements run in the same order as
// before. Every data item gets a count and steps (1 and 0 where nothing
// merged), so that merged and single items have one shape and can reroll
// together. `merge` false: none merge (straight-line code). The
// representative's items carry the source comments.
std::vector<Item> count_chunks(const ClassPlan& cp, size_t c, size_t tb, bool merge) {
  std::vector<const Stream*> st;
  for (int32_t v : cp.members[c]) st.push_back(&cp.items[size_t(v)][tb]);
  const size_t members = st.size();
  const Stream& rep = *st[0];
  auto shape = [&](size_t j) -> const Item& { return cp.shapes[rep.shape[j]]; };
  std::vector<Item> out;
  for (size_t i = 0; i < rep.size();) {
    const Item& a = shape(i);
    Item c = a;
    c.comment = a.data ? comment_of(rep.op[i]) : "";
    c.op_id = a.data && rep.op[i] ? rep.op[i]->id : -1;
    if (!a.data) {
      for (const Stream* m : st) c.nums.insert(c.nums.end(), m->nums.begin() + int64_t(m->at[i]), m->nums.begin() + int64_t(m->at[i + 1]));
      out.push_back(std::move(c));
      ++i;
      continue;
    }
    const size_t D = size_t(a.ndata);
    const int32_t dshape = cp.shapes.data_id(rep.shape[i]);
    auto data = [&](size_t j, size_t m, size_t x) { return st[m]->num(j, shape(j).data_at() + x); };
    auto joins = [&](size_t j) {  // items[j] may continue the run that items[j - 1] ends
      const Item& b = shape(j);
      return b.data && b.nwait == 0 && shape(j - 1).nsig == 0 && cp.shapes.data_id(rep.shape[j]) == dshape;
    };
    std::vector<int64_t> step(members * D, 0);
    size_t e = i + 1;
    if (merge && e < rep.size() && joins(e)) {
      for (size_t m = 0; m < members; ++m)
        for (size_t x = 0; x < D; ++x) step[m * D + x] = data(e, m, x) - data(i, m, x);
      for (++e; e < rep.size() && joins(e); ++e) {
        bool even = true;
        for (size_t m = 0; m < members && even; ++m)
          for (size_t x = 0; x < D && even; ++x) even = data(e, m, x) - data(e - 1, m, x) == step[m * D + x];
        if (!even) break;
      }
    }
    const Item& z = shape(e - 1);
    c.nsig = z.nsig;
    c.counted = true;
    for (size_t m = 0; m < members; ++m) {
      const auto from = st[m]->nums.begin() + int64_t(st[m]->at[i]);
      c.nums.insert(c.nums.end(), from, from + int64_t(a.data_at() + D));  // waits and data
      const auto sig = st[m]->nums.begin() + int64_t(st[m]->at[e - 1] + z.data_at() + D);
      c.nums.insert(c.nums.end(), sig, sig + 2 * z.nsig);
      c.nums.push_back(int64_t(e - i));
      c.nums.insert(c.nums.end(), step.begin() + int64_t(m * D), step.begin() + int64_t((m + 1) * D));
    }
    c.len = c.nums.size() / members;
    out.push_back(std::move(c));
    i = e;
  }
  return out;
}
// Groups of at most this many items reroll.
constexpr size_t kMaxGroup = 8;

class Emitter {
 public:
  // `served`: per class, whether to emit it (empty: every class).
  // `only`: the one rank a plan is for (generate's `rank`), or -1; when its
  // class's tables would be large, only that rank's rows are emitted (row_only()).
  Emitter(const Schedule& s, int32_t bucket, const ClassPlan& cp, std::string& out, std::vector<char> served = {},
          bool reroll = true, int32_t only = -1, int64_t row_only_bytes = 0)
      : s_(s),
        b_(bucket),
        cp_(cp),
        o_(out),
        served_(std::move(served)),
        reroll_(reroll),
        only_(only),
        row_only_bytes_(row_only_bytes) {
    if (served_.empty()) served_.assign(cp_.members.size(), 1);
  }
  // The kernel holds one rank's table rows and serves that rank alone.
  bool row_only() const { return row_only_; }
  // Its ops are inlined (kernel.cuh P::kInlineOps), and its thread blocks'
  // functions: few statements (total_items).
  bool inline_ops() const {
    const auto [n, data] = total_items();
    // (a one-pass kernel's ops are inlined whatever P::kInlineOps says, and
    // its thread blocks' functions must be too, or its context leaves registers)
    return n <= kInlineItems && (data <= kInlineData || s_.one_pass);
  }

  std::string P() const { return fmt::format("P{}", b_); }
  // The kernel ends in a fused epilogue (namespace mk_fused_b<bucket>).
  void set_epilogue(bool on) { epi_ = on; }
  // Adjacent thread blocks of the same item shapes share one function (emit_group).
  void set_block_groups(bool on) { groups_ = on; }

  // `e`: an expression per number of the item (Item::nums' order). A counted
  // item of more than one chunk loops over its chunks (k).
  // `op`: the op id as an expression (thread-block groups: it differs per
  // block), else it.op_id.
  std::string render(const Item& it, const std::vector<std::string>& e, const std::string& ind,
                     const std::string& op = "") {
    const std::string id = op.empty() ? std::to_string(it.op_id) : op;
    std::string o;
    count_size(it);
    size_t k = 0;
    if (it.nwait) {
      std::string list;
      for (int w = 0; w < it.nwait; ++w, k += 3)
        list += fmt::format("{}{{{}, {}, {}, {}}}", w ? ", " : "", e[k], e[k + 1], e[k + 2], id);
      o += ind + "if (!c.wait_all({" + list + "})) return;\n";
    }
    if (it.data) {
      if (!it.comment.empty()) o += ind + "// " + it.comment + "\n";
      std::vector<std::string> d(e.begin() + int64_t(k), e.begin() + int64_t(k) + it.ndata);
      const std::string count = it.counted ? e[it.count_at()] : "1";
      std::string in = ind;
      if (count != "1") {
        for (size_t x = 0; x < d.size(); ++x) d[x] = chunk(d[x], e[it.count_at() + 1 + x]);
        o += ind + fmt::format("#pragma unroll 1\n{}for (int k = 0; k < {}; ++k) {{\n", ind, count);
        in += "  ";
      }
      o += op_call(it, d, in, id);
      if (count != "1") o += ind + "}\n";
      k += size_t(it.ndata);
    }
    if (it.nsig) {
      std::string list;
      for (int g = 0; g < it.nsig; ++g, k += 2) list += fmt::format("{}{{{}, {}}}", g ? ", " : "", e[k], e[k + 1]);
      o += ind + "c.signal_all({" + list + "});\n";
    }
    if (it.counted) k += 1 + size_t(it.ndata);
    MK_CHECK(k == it.len, "codegen: item numbers and shape disagree");
    return o;
  }

  // The data op of an item, from its data numbers `d`.
  std::string op_call(const Item& it, const std::vector<std::string>& d, const std::string& ind,
                      const std::string& id) const {
    size_t k = 0;
    std::string refs[2], wide;
    for (int w = 0; it.encoded() && w < it.ns + it.nd; ++w, k += 2) {
      const std::string x = fmt::format("mk::dev::ref_halves({}, {})", d[k], d[k + 1]);
      wide += (w ? ", " : "") + x;
      std::string& list = refs[w < it.ns ? 0 : 1];
      list += (list.empty() ? "" : ", ") + x;
    }
    for (size_t r = 0; r < it.refs.size(); ++r) {
      const RefShape& sh = it.refs[r];
      std::string x;
      if (sh.kind == 2) {
        x = fmt::format("mk::dev::scratch_ref({}, {})", d[k], d[k + 1]);
        k += 2;
      } else if (s_.zero_copy) {  // any rank's user buffer
        x = fmt::format("mk::dev::peer_data_ref(mk::dev::{}, {}, {}, {}, {}, {})", sh.kind == 0 ? "kRefIn" : "kRefOut",
                        d[k], d[k + 1], sh.rot_b ? "true" : "false", d[k + 2], sh.rot_p ? "true" : "false");
        k += 3;
      } else {
        x = fmt::format("mk::dev::data_ref(mk::dev::{}, {}, {}, {}, {})", sh.kind == 0 ? "kRefIn" : "kRefOut", d[k],
                        sh.rot_b ? "true" : "false", d[k + 1], sh.rot_p ? "true" : "false");
        k += 2;
      }
      std::string& list = refs[r < size_t(it.ns) ? 0 : 1];
      list += (list.empty() ? "" : ", ") + x;
    }
    MK_CHECK(k + 1 == d.size(), "codegen: item data numbers and shape disagree");
    if (it.wide)
      return ind + fmt::format("{{\n{0}  const uint64_t r[{1}] = {{{2}}};\n{0}  if (!c.template op_wide<{3}, {4}>(r, {5}, {6}, "
                               "mk::dev::pos_code({7}, {8}), {9})) return;\n{0}}}\n",
                               ind, it.ns + it.nd, wide, it.red ? "true" : "false", it.fin ? "true" : "false", it.ns,
                               it.nd, d[k], it.pos_rot ? "true" : "false", id);
    if (it.gen)
      return ind + fmt::format("if (!c.template op_gpass<{}, {}>({{{}}}, {{{}}}, mk::dev::pos_code({}, {}), {})) return;\n",
                               it.red ? "true" : "false", it.fin ? "true" : "false", refs[0], refs[1], d[k],
                               it.pos_rot ? "true" : "false", id);
    // Named forms (kernel.cuh): copy, reduce, reduce_final, and their _pass
    // forms in one-pass kernels; LL masks as template arguments where set.
    const std::string name =
        std::string(!it.red ? "copy" : it.fin ? "reduce_final" : "reduce") + (s_.one_pass ? "_pass" : "");
    const std::string masks = it.sll || it.dll ? fmt::format("template {}<{}u, {}u>", name, it.sll, it.dll) : name;
    return ind + fmt::format("if (!c.{}({{{}}}, {{{}}}, mk::dev::pos_code({}, {}), {})) return;\n", masks, refs[0],
                             refs[1], d[k], it.pos_rot ? "true" : "false", id);
  }

  // NVRTC's cost, roughly: every operand of every statement, and much more
  // for every distinct instantiation of the data primitive (each is unrolled
  // over its operands and compiled separately; a wide op's loop bodies
  // handle any number of operands, so it weighs as two, whatever ns and nd).
  // A loop's body (over chunks or over groups) counts once.
  void count_size(const Item& it) {
    const int64_t operands = it.data ? it.ns + it.nd : 1;
    size_ += operands;
    if (!it.data) return;
    const int64_t unrolled = it.wide ? 2 : operands;
    const std::string inst = it.wide  ? fmt::format("wide|{}|{}", it.red, it.fin)
                             : it.gen ? fmt::format("gen|{}|{}|{}|{}", it.ns, it.nd, it.red, it.fin)
                                      : fmt::format("{}|{}|{}|{}|{}|{}", it.ns, it.nd, it.red, it.fin, it.sll, it.dll);
    if (instances_.insert(inst).second) size_ += 32 * unrolled;
  }

  static constexpr size_t kRowInRegs = 64;
  // Every table entry the code reads is t[<constant>] (no loop counter).
  static bool constant_indices(const std::string& body) {
    for (size_t at = body.find("t["); at != std::string::npos; at = body.find("t[", at + 2)) {
      if (at > 0 && (std::isalnum(static_cast<unsigned char>(body[at - 1])) || body[at - 1] == '_')) continue;
      size_t e = at + 2;
      while (e < body.size() && std::isdigit(static_cast<unsigned char>(body[e]))) ++e;
      if (e == at + 2 || e >= body.size() || body[e] != ']') return false;
    }
    return true;
  }

  // `base` plus `step` per chunk k.
  static std::string chunk(const std::string& base, const std::string& step) {
    if (step == "0") return base;
    if (step == "1") return base + " + k";
    if (step == "-1") return base + " - k";
    return fmt::format("{} + ({}) * k", base, step);
  }

  // A number, given per member (member-major) and loop iteration (R of them,
  // 1 outside loops): a constant where all agree; a rank-table entry where
  // only members differ; where iterations differ and step evenly, the first
  // iteration's plus the loop counter i times the step (each a constant or a
  // rank-table entry); else an entry of a block of table columns indexed by
  // i (of the rank table where members differ, of the loop table kU where
  // they agree).
  std::string expr(const std::vector<int64_t>& v, size_t R, Table& t, const std::string& i = "i") {
    const size_t M = t.members();
    auto show = [&](const std::vector<int64_t>& w) {
      for (int64_t x : w)
        if (x != w[0]) return fmt::format("t[{}]", t.col(w));
      return std::to_string(w[0]);
    };
    auto iteration = [&](size_t r) {
      std::vector<int64_t> w(M);
      for (size_t m = 0; m < M; ++m) w[m] = v[m * R + r];
      return w;
    };
    if (R == 1) return show(iteration(0));
    std::vector<int64_t> d(M);
    bool even = true, agree = true;
    for (size_t m = 0; m < M; ++m) d[m] = v[m * R + 1] - v[m * R];
    for (size_t m = 0; m < M; ++m)
      for (size_t r = 0; r < R; ++r) {
        even = even && (r == 0 || v[m * R + r] - v[m * R + r - 1] == d[m]);
        agree = agree && v[m * R + r] == v[r];
      }
    if (even) {
      const std::string base = show(iteration(0)), ds = show(d);
      if (ds == "0") return base;
      if (ds == "1") return base + " + " + i;
      if (ds == "-1") return base + " - " + i;
      return fmt::format("{} + ({}) * {}", base, ds, i);
    }
    if (agree) {
      std::vector<std::vector<int64_t>> cols;
      for (size_t r = 0; r < R; ++r) cols.push_back({v[r]});
      return fmt::format("kU{}[{} + {}]", b_, loop_.block(cols), i);
    }
    std::vector<std::vector<int64_t>> cols;
    for (size_t r = 0; r < R; ++r) cols.push_back(iteration(r));
    return fmt::format("t[{} + {}]", t.block(cols), i);
  }

  // The expressions of items[at]'s numbers; R > 1: in a loop whose
  // iteration r runs items[at + r * stride].
  std::vector<std::string> numbers(const std::vector<Item>& items, size_t at, size_t stride, size_t R, Table& t) {
    const Item& it = items[at];
    const size_t M = t.members();
    std::vector<std::string> e;
    std::vector<int64_t> v(M * R);
    for (size_t k = 0; k < it.len; ++k) {
      for (size_t m = 0; m < M; ++m)
        for (size_t r = 0; r < R; ++r) v[m * R + r] = items[at + r * stride].nums[m * it.len + k];
      e.push_back(expr(v, R, t));
    }
    return e;
  }

  // The longest run of at least 3 groups of P items (P = 1..kMaxGroup) of
  // the same shapes starting at items[i] (sid: the items' shapes, interned):
  // {P, runs}, {0, 0} if none.
  std::pair<size_t, size_t> best_loop(const std::vector<int>& sid, size_t i) const {
    auto same = [&](size_t a, size_t b, size_t P) { return std::equal(sid.begin() + int64_t(a), sid.begin() + int64_t(a + P), sid.begin() + int64_t(b)); };
    size_t best_p = 0, best_r = 0;
    for (size_t P = 1; reroll_ && P <= kMaxGroup && i + 3 * P <= sid.size(); ++P) {
      size_t R = 1;
      while (i + (R + 1) * P <= sid.size() && same(i, i + R * P, P)) ++R;
      if (R >= 3 && R * P > best_r * best_p) {
        best_p = P;
        best_r = R;
      }
    }
    return {best_p, best_r};
  }
  static std::vector<int> shape_ids(const std::vector<Item>& items) {
    std::vector<int> sid;
    std::map<std::string, int> ids;
    for (const Item& it : items) sid.push_back(ids.emplace(it.shape(), int(ids.size())).first->second);
    return sid;
  }
  // Whether emit_items would reroll some of the items of shapes `sid` (any
  // interning: only which are equal matters) into a loop.
  bool rolls(const std::vector<int>& sid) const {
    for (size_t i = 0; i < sid.size(); ++i)
      if (best_loop(sid, i).second) return true;
    return false;
  }

  // Emits items: chunks merged (count_chunks), then runs of at least 3
  // groups of P items (P = 1..kMaxGroup) of the same shapes as one loop,
  // whose numbers step evenly or come from tables.
  std::string emit_items(const std::vector<Item>& items, Table& t) {
    const std::vector<int> sid = shape_ids(items);
    const std::string ind = "    ";
    std::string o;
    size_t i = 0;
    while (i < items.size()) {
      const auto [best_p, best_r] = best_loop(sid, i);
      if (best_r == 0) {
        o += render(items[i], numbers(items, i, 0, 1, t), ind);
        ++i;
        continue;
      }
      // Not unrolled: NVRTC's time is what the loops are for (unrolled, a 64-rank
      // halving-doubling kernel compiled 1.4x slower), and a tile's work
      // dwarfs the loop's.
      o += fmt::format("{0}#pragma unroll 1\n{0}for (int i = 0; i < {1}; ++i) {{  // {1} x {2} op group(s)\n", ind, best_r,
                       best_p);
      for (size_t j = 0; j < best_p; ++j) {
        const Item& it = items[i + j];
        const auto e = numbers(items, i + j, best_p, best_r, t);
        Item shown = it;
        shown.comment = it.data ? "first of " + std::to_string(best_r) + ": " + it.comment : "";
        o += render(shown, e, ind + "  ");
      }
      o += ind + "}\n";
      i += best_r * best_p;
    }
    return o;
  }

  // Thread blocks first..first+J-1 of a class whose items have the same
  // shapes (and that no loop rerolls): one function, the block's index j
  // among them a parameter; numbers that differ per block step with j or
  // come from table columns indexed by j (as a loop's by i). A kernel whose
  // ranks talk to each peer on a block of its own (direct all-to-all,
  // all-gather, two-shot's scatter) had a copy of the same op per peer.
  void emit_group(int32_t cls, int32_t first, const std::vector<std::vector<Item>>& per, bool inline_fn, Table& t) {
    const size_t J = per.size(), M = t.members();
    const std::string ind = "    ";
    std::string body;
    for (size_t p = 0; p < per[0].size(); ++p) {
      const Item& it = per[0][p];
      std::vector<std::string> e;
      std::vector<int64_t> v(M * J);
      for (size_t k = 0; k < it.len; ++k) {
        for (size_t m = 0; m < M; ++m)
          for (size_t j = 0; j < J; ++j) {
            MK_CHECK(per[j][p].len == it.len, "codegen: grouped thread blocks' items differ in length");
            v[m * J + j] = per[j][p].nums[m * it.len + k];
          }
        e.push_back(expr(v, J, t, "j"));
      }
      for (size_t m = 0; m < M; ++m)
        for (size_t j = 0; j < J; ++j) v[m * J + j] = per[j][p].op_id;
      const std::string id = expr(v, J, t, "j");
      Item shown = it;
      shown.comment.clear();
      // every block's op, one comment line each: an error names its block's op (op_comment)
      for (size_t j = 0; it.data && j < J; ++j)
        shown.comment += fmt::format("{}block {}: {}", j ? "\n" + ind + "// " : "", first + int32_t(j), per[j][p].comment);
      body += render(shown, e, ind, id);
    }
    const bool tabled = t.width() > 0;
    fns_ += fmt::format("static __device__ {} void b{}_c{}_tbs{}_{}(mk::dev::Ctx<{}>& c{}, const int j) {{\n",
                        inline_fn ? "__forceinline__" : "__noinline__", b_, cls, first, first + int32_t(J) - 1, P(),
                        tabled ? ", const int* t" : "");
    fns_ += "  do {\n" + body + "  } while (c.next());\n}\n\n";
    for (size_t j = 0; j < J; ++j) {
      tabled_[{cls, first + int32_t(j)}] = tabled;
      group_[{cls, first + int32_t(j)}] = {first, first + int32_t(J) - 1};
    }
  }

  // Class cls's thread blocks: runs of adjacent blocks of the same item
  // shapes as one function each (emit_group; not in one-pass kernels, whose
  // block functions read their numbers from registers, nor in straight-line
  // code), the others one function each.
  void emit_class(int32_t cls, bool inline_fns, Table& t) {
    const bool group = groups_ && reroll_ && !s_.one_pass;
    auto items_of = [&](int32_t tb) { return count_chunks(cp_, size_t(cls), size_t(tb), reroll_); };
    // The blocks' shapes first (empty: not groupable), their items kept only
    // while a group is emitted: a kernel of many blocks never holds them all.
    std::vector<std::vector<int>> sids(size_t(cp_.tbs));
    for (int32_t tb = 0; group && tb < cp_.tbs; ++tb) {
      if (cp_.path(size_t(cls), size_t(tb)).empty()) continue;
      std::vector<int>& sid = sids[size_t(tb)];
      for (const Item& it : items_of(tb)) sid.push_back(shape_id(it.shape()));
      if (rolls(sid)) sid.clear();
    }
    for (int32_t tb = 0; tb < cp_.tbs;) {
      if (cp_.path(size_t(cls), size_t(tb)).empty()) {
        ++tb;
        continue;
      }
      int32_t e = tb + 1;
      if (!sids[size_t(tb)].empty())
        while (e < cp_.tbs && sids[size_t(e)] == sids[size_t(tb)]) ++e;
      if (e - tb >= 2) {
        std::vector<std::vector<Item>> per;
        for (int32_t x = tb; x < e; ++x) per.push_back(items_of(x));
        emit_group(cls, tb, per, inline_fns, t);
      } else {
        emit_tb(cls, tb, inline_fns, items_of(tb), t);
      }
      tb = e;
    }
  }
  int shape_id(const std::string& shape) { return all_shapes_.emplace(shape, int(all_shapes_.size())).first->second; }

  void emit_tb(int32_t cls, int32_t tb, bool inline_fn, const std::vector<Item>& items, Table& t) {
    const std::string body = emit_items(items, t);
    const bool tabled = t.width() > 0;  // the class's table so far; rows are per member, so any column needs it
    // A one-pass kernel's short row, read at constant indices only, is loaded
    // into registers first (kernel.cuh Row): its latency then overlaps the
    // ops before the first that needs it.
    const bool in_regs = tabled && s_.one_pass && t.width() <= kRowInRegs && constant_indices(body);
    fns_ += fmt::format("static __device__ {} void b{}_c{}_tb{}(mk::dev::Ctx<{}>& c{}) {{\n",
                        inline_fn ? "__forceinline__" : "__noinline__", b_, cls, tb, P(),
                        !tabled ? "" : in_regs ? ", const int* row" : ", const int* t");
    if (in_regs) fns_ += fmt::format("  const mk::dev::Row<{}> t(row);\n", t.width());
    fns_ += "  do {\n" + body + "  } while (c.next());\n}\n\n";
    tabled_[{cls, tb}] = tabled;
  }

  // The classes' tables and the loop table (before the functions, which
  // read the loop table): constant memory while they fit, else global memory.
  void emit_tables(const std::vector<Table>& tables) {
    size_t bytes = loop_.width() * sizeof(int32_t);
    for (const Table& t : tables) bytes += t.members() * t.width() * sizeof(int32_t);
    // Rank tables of a big class (1024 ranks: megabytes of initialisers,
    // which NVRTC parses slowly) shrink to the one rank the plan is for.
    int64_t row = -1;  // that rank's row in its class's table
    if (only_ >= 0 && int64_t(bytes) > row_only_bytes_) {
      const auto& mem = cp_.members[size_t(cp_.rc.class_of[size_t(only_)])];
      row = std::find(mem.begin(), mem.end(), only_) - mem.begin();
      row_only_ = true;
      bytes = loop_.width() * sizeof(int32_t);
      for (const Table& t : tables) bytes += t.width() * sizeof(int32_t);
    }
    table_bytes_ = int64_t(bytes);
    if (bytes == 0) return;
    const char* space = bytes <= (32u << 10) ? "__constant__" : "__device__";
    if (loop_.width()) {
      o_ += fmt::format("// per loop iteration: numbers every rank agrees on\nstatic {} const int kU{}[{}] = {{", space, b_,
                        loop_.width());
      for (size_t k = 0; k < loop_.width(); ++k) o_ += fmt::format("{}{}", k ? "," : "", loop_.at(0, k));
      o_ += "};\n";
    }
    if (bytes == loop_.width() * sizeof(int32_t)) {
      o_ += "\n";
      return;
    }
    std::string member;
    for (int32_t v = 0; v < s_.nranks; ++v) {
      const int32_t c = cp_.rc.class_of[size_t(v)];  // -1: a rank an own plan was not generated for
      const auto* mem = c < 0 ? nullptr : &cp_.members[size_t(c)];
      member += fmt::format("{}{}", v ? "," : "",
                            row_only_ || !mem ? 0 : std::find(mem->begin(), mem->end(), v) - mem->begin());
    }
    o_ += fmt::format("// per rank: its row in its class's table{}\nstatic {} const short kMember{}[{}] = {{{}}};\n",
                      row_only_ ? fmt::format(" (only rank {}'s row is here)", only_) : "", space, b_, s_.nranks,
                      member);
    for (size_t c = 0; c < tables.size(); ++c) {
      const Table& t = tables[c];
      if (!t.width()) continue;
      const size_t first = row_only_ ? size_t(row) : 0, rows = row_only_ ? 1 : t.members();
      o_ += fmt::format("static {} const int kT{}_c{}[{}][{}] = {{\n", space, b_, c, rows, t.width());
      for (size_t m = first; m < first + rows; ++m) {
        o_ += "  {";
        for (size_t k = 0; k < t.width(); ++k) o_ += fmt::format("{}{}", k ? "," : "", t.at(m, k));
        o_ += "},\n";
      }
      o_ += "};\n";
    }
    o_ += "\n";
  }

  // Statements of the kernel (before merging and rerolling), and how many of
  // them are data ops: small kernels inline their thread blocks' functions
  // and their ops. Each inlined data op is a copy of its tile loop, the bulk
  // of NVRTC's work: a 64-rank one-shot's 32 thread blocks inlined 64 of
  // them (16 s of NVRTC); called, the ops share one body per kind.
  std::pair<size_t, size_t> total_items() const {
    size_t n = 0, data = 0;
    for (size_t c = 0; c < cp_.members.size(); ++c)
      for (size_t tb = 0; served_[c] && tb < size_t(cp_.tbs); ++tb) {
        const Stream& st = cp_.path(c, tb);
        n += st.size();
        for (int32_t sh : st.shape) data += cp_.shapes[sh].data ? 1 : 0;
      }
    return {n, data};
  }
  static constexpr size_t kInlineItems = 64, kInlineData = 32;

  KernelInfo emit(const std::string& kernel_name, const Limits& lim) {
    const int32_t nclasses = int32_t(cp_.rc.representative.size());
    const bool inline_fns = inline_ops();
    std::vector<Table> tables;
    for (int32_t c = 0; c < nclasses; ++c) {
      tables.emplace_back(cp_.members[size_t(c)].size());
      if (!served_[size_t(c)]) continue;
      emit_class(c, inline_fns, tables.back());
    }
    emit_tables(tables);
    o_ += fns_;
    check_size(lim);

    const int32_t threads = s_.proto == ir::Proto::ll ? 256 : 512;
    // The kernel's work is a function of (arguments, block, blocks), so that
    // a group kernel (group_source) can run it on a range of its blocks; the
    // plan's own kernel runs it on all of them.
    o_ += fmt::format("static __device__ __forceinline__ void {}_body(const mk::dev::Args& a, int bid, int nbid) {{\n",
                      kernel_name);
    o_ += fmt::format("  __shared__ mk::dev::Shared<{}> sh;\n", s_.nranks);
    o_ += fmt::format("  mk::dev::Ctx<{}> c(a, sh, bid, nbid);\n", P());
    o_ += "  if (c.L.steps == 0) return;\n";
    // Zero-copy: learn every peer's buffers and wait until every peer's kernel
    // has started (its buffers are ready and free to overwrite).
    if (s_.zero_copy) o_ += "  if (!c.zc_enter()) return;\n";
    std::string cls;  // -1: a class this kernel was not generated for
    for (int32_t v = 0; v < s_.nranks; ++v) {
      const int32_t c = cp_.rc.class_of[size_t(v)];
      cls += (v ? "," : "") + std::to_string(c >= 0 && served_[size_t(c)] && (!row_only_ || v == only_) ? c : -1);
    }
    o_ += fmt::format("  static constexpr short kClassOf[{}] = {{{}}};\n", s_.nranks, cls);
    o_ += "  switch (kClassOf[c.vrank]) {\n";
    for (int32_t c = 0; c < nclasses; ++c) {
      if (!served_[size_t(c)]) continue;
      o_ += fmt::format("    case {}:\n      switch (c.tb) {{\n", c);
      for (int32_t tb = 0; tb < cp_.tbs; ++tb) {
        if (cp_.path(size_t(c), size_t(tb)).empty()) continue;
        const std::string row = tabled_[{c, tb}] ? fmt::format(", kT{}_c{}[kMember{}[c.vrank]]", b_, c, b_) : "";
        if (auto g = group_.find({c, tb}); g != group_.end()) {  // one call for the group's blocks
          const auto [first, last] = g->second;
          o_ += "       ";
          for (int32_t x = first; x <= last; ++x) o_ += fmt::format(" case {}:", x);
          o_ += fmt::format(" b{}_c{}_tbs{}_{}(c{}, c.tb - {}); break;\n", b_, c, first, last, row, first);
          tb = last;
          continue;
        }
        o_ += fmt::format("        case {}: b{}_c{}_tb{}(c{}); break;\n", tb, b_, c, tb, row);
      }
      o_ += "        default: break;\n      }\n      break;\n";
    }
    o_ += "    default: break;\n  }\n";
    if (s_.zero_copy)  // no rank returns while a peer may still touch its buffers
      o_ += "  if (!__syncthreads_or(c.aborted)) {\n    c.finish();\n    c.zc_exit();\n  }\n}\n\n";
    else if (epi_)  // every block's ops done, then the rows (fused.cuh)
      o_ += fmt::format("  if (!__syncthreads_or(c.aborted)) {{\n    c.finish();\n"
                        "    mk::dev::epilogue_tail<mk::dev::Ctx<{}>, mk_fused_b{}::F, mk_fused_b{}::Epi>(c);\n  }}\n}}\n\n",
                        P(), b_, b_);
    else
      o_ += "  if (!__syncthreads_or(c.aborted)) c.finish();\n}\n\n";
    // Nothing of the previous kernel on this stream may be read or
    // overwritten before it completed: the runtime may launch this one early
    // (programmatic dependent launch, plan::Kernel::pdl).
    o_ += fmt::format("#ifndef MK_GROUP_MEMBER\n"
                      "extern \"C\" __global__ void __launch_bounds__({}, 1) {}(const mk::dev::Args a) {{\n"
                      "  mk::dev::grid_dependency_wait();\n  {}_body(a, int(blockIdx.x), int(gridDim.x));\n}}\n",
                      threads, kernel_name, kernel_name);
    if (epi_)  // the epilogue alone, for many rows (Args::epi_mode 1)
      o_ += fmt::format("extern \"C\" __global__ void __launch_bounds__({}) {}_epi(const mk::dev::Args a) {{\n"
                        "  mk::dev::grid_dependency_wait();\n"
                        "  mk::dev::epilogue_kernel<mk::dev::Ctx<{}>, mk_fused_b{}::F, mk_fused_b{}::Epi>(a);\n}}\n\n",
                        threads, kernel_name, P(), b_, b_);
    o_ += fmt::format("#else\n// between this collective and the next on the same blocks of a group kernel\n"
                      "static __device__ __forceinline__ bool {}_chain(const mk::dev::Args& a, int bid, int nbid) {{\n"
                      "  return mk::dev::chain_barrier<{}>(a, bid, nbid);\n}}\n",
                      kernel_name, P());
    o_ += "#endif  // MK_GROUP_MEMBER\n\n";
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
  bool reroll_;
  int32_t only_ = -1;
  int64_t row_only_bytes_ = 0;
  bool row_only_ = false;
  bool epi_ = false;
  bool groups_ = true;
  Table loop_{1};
  std::string fns_;  // the thread blocks' functions, emitted after the tables
  std::set<std::string> instances_;
  std::map<std::pair<int32_t, int32_t>, bool> tabled_;
  std::map<std::pair<int32_t, int32_t>, std::pair<int32_t, int32_t>> group_;  // (class, block) -> its group's blocks
  std::map<std::string, int> all_shapes_;
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
ClassPlan best_plan(const Schedule& s, bool one_pass_generic) {
  auto cost = [&](const ClassPlan& p) {
    std::string scratch;
    Emitter e(s, 0, p, scratch);
    Limits none;
    none.max_size = none.max_table_bytes = std::numeric_limits<int64_t>::max();
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
    if (generic && s.one_pass && !one_pass_generic) break;  // a code path per rank (Limits::one_pass_generic)
    // Generic plans are for ranks that cannot share a path otherwise; once
    // one class serves every rank, they are not tried (each try is a
    // plan_classes and a measuring emit: seconds at 1024 ranks).
    if (generic && (!several || best.rc.representative.size() == 1)) break;
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

RankClasses rank_classes(const Schedule& s, bool one_pass_generic) { return best_plan(s, one_pass_generic).rc; }

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

Unit generate_one(const Schedule& s, size_t b, size_t buckets, DType dtype, RedOp op, const std::string& tag,
                  const Limits& lim, int32_t rank) {
  // Network operations (templates/net.cuh): a put is a copy into the
  // scratch of a rank on another node, which the kernel stages for the
  // proxy; a flush has nothing left to wait for (the staging copy read the
  // source); signals to such ranks go through the same connection.
  const bool net = verify::has_network_ops(s);
  if (net) {
    if (s.proto != ir::Proto::simple || s.zero_copy || s.one_pass)
      throw Error(ErrId::jit_E008,
                  fmt::format("{} ({} ranks, topology {}): network operations need the simple protocol without "
                              "zero-copy (this variant: {}{})",
                              s.name, s.nranks, ir::topology_of(s).name(), ir::name(s.proto),
                              s.zero_copy ? ", zero-copy" : ""),
                  {}, "lower it with proto=simple across nodes");
    for (const Op& op : s.ops)
      if (op.kind == OpKind::put && (op.dsts.size() != 1 || op.srcs.size() != 1 || op.dsts[0].buf != Buf::scratch))
        throw Error(ErrId::jit_E008,
                    fmt::format("{}: put %{} must copy one chunk into one scratch slot (it has {} source(s) and {} "
                                "destination(s))",
                                s.name, op.id, op.srcs.size(), op.dsts.size()),
                    op.loc);
  }
  MK_CHECK(s.synced && s.tbs > 0 && s.tile_bytes > 0, "codegen needs lowered schedules");
  if (s.one_pass) {  // what the kernel relies on when it drops the waits (passes/one_pass.cpp)
    MK_CHECK(s.proto == ir::Proto::ll && s.tbs == 1 && s.depth >= 2 && !s.zero_copy, "codegen: not a one-pass schedule");
    for (const Op& op : s.ops)
      MK_CHECK(op.kind != OpKind::wait || op.iter == -s.depth, "codegen: a one-pass schedule with a true wait");
  }
  MK_CHECK(!s.lamport || (s.one_pass && passes::lamport_dtype(dtype)),
           "codegen: Lamport packets on a schedule or dtype without them");
  MK_CHECK(b < buckets, "codegen: bucket out of range");
  Unit u;
  std::string& o = u.source;
  MK_CHECK(rank < s.nranks, "codegen: rank out of range");
  const bool rooted = collective_rooted(s.coll);
  const bool own = rank >= 0 && !rooted && s.nranks >= lim.own_rank_from;
  const ClassPlan cp = own ? own_plan(s, rank) : best_plan(s, lim.one_pass_generic);
  const RankClasses& rc = cp.rc;
  std::vector<char> served;
  // A plan for one rank holds its class's code alone, one-pass kernels' too
  // (a class per distinct program, at most 8 ranks): a rank's first call
  // compiles one rank's code path, not every rank's (one-shot at 8 ranks:
  // an eighth of the work), and other ranks compile theirs.
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
      "// {} flag slot(s), {} rank class(es){}{}\n"
      "#include \"kernel.cuh\"\n\n",
      s.name, name(s.coll), s.nranks, name(dtype), name(op), b, buckets, ir::name(s.proto), s.tile_bytes,
      s.instances, s.tbs, s.depth, s.scratch, s.slots, rc.representative.size(),
      own              ? fmt::format("; rank {}'s own program: other ranks run nothing", rank)
      : served.empty() ? ""
                       : fmt::format("; only class {} ({} rank(s)): other ranks run nothing",
                                     rc.class_of[size_t(rank)], u.serves.size()),
      s.one_pass ? std::string("\n// one pass: each thread runs every op on its own units, no barrier or flag between "
                               "them (passes/one_pass.cpp)") +
                       (s.lamport ? "; Lamport packets: scratch holds the data, a sentinel where none arrived yet" : "")
                 : std::string());
  Emitter e(s, int32_t(b), cp, o, served, lim.reroll && !s.one_pass, rooted || (s.one_pass && !own) ? -1 : rank,
            lim.row_only_bytes);
  e.set_block_groups(lim.block_groups);
  // A fusion's prologue: its code in a namespace of its own, named by the
  // plan traits (P::Pre; templates/prims.cuh UserPre).
  const bool user_pre = !lim.prologue.source.empty();
  if (user_pre) {
    MK_CHECK(!s.zero_copy, "codegen: a fusion prologue on a zero-copy schedule (verify_prologue refuses it)");
    MK_CHECK(op != RedOp::premulsum, "codegen: a fusion prologue on a PreMulSum kernel");
    o += fmt::format("// fusion prologue {}\nnamespace mk_pro_b{} {{\n{}\n}}  // namespace\n\n", lim.prologue.name, b,
                     lim.prologue.source);
  }
  o += fmt::format(
      "struct P{} {{\n  using T = {};\n  static constexpr int kRed = {};\n  using Pre = {};\n"
      "  static constexpr int kRanks = {}, kChunks = {}, kTbs = {}, kInstances = {}, kDepth = {};\n"
      "  static constexpr int kScratch = {}, kSlots = {}, kThreads = {}, kPosRot = {}, kWide = {};\n"
      "  static constexpr long long kMaxTileBytes = {};\n"
      "  static constexpr int kLoads = {}, kLamportUnits = {};\n"
      "  static constexpr bool kLL = {}, kLamport = {}, kRooted = {}, kZeroCopy = {}, kPipeline = {}, kOnePass = {};\n"
      "  static constexpr bool kInlineOps = {}, kNet = {};\n}};\n\n",
      b, dtype_device_name(dtype), int(op),
      user_pre ? fmt::format("::mk::dev::UserPre<mk_pro_b{}::Pro>", b) : std::string("::mk::dev::NoPre"), s.nranks,
      s.chunks, s.tbs, s.instances, s.depth,
      std::max(s.scratch, 1), std::max(s.slots, 1), s.proto == ir::Proto::ll ? 256 : 512, rc.pos_rot, cp.wide,
      s.tile_bytes, std::max(lim.loads, 1), std::max(lim.lamport_units, 1), s.proto == ir::Proto::ll ? "true" : "false",
      s.lamport ? "true" : "false", rooted ? "true" : "false",
      s.zero_copy ? "true" : "false", lim.pipeline ? "true" : "false", s.one_pass ? "true" : "false",
      e.inline_ops() ? "true" : "false", net ? "true" : "false");
  if (!lim.epilogue.source.empty()) {
    MK_CHECK(!s.zero_copy, "codegen: a fused epilogue on a zero-copy schedule (verify_epilogue refuses it)");
    MK_CHECK(lim.epilogue.operands.size() <= 6, "codegen: more than 6 epilogue operands");
    // The fusion's code (include/mk/fusion.hpp MK_EPILOGUE), then its operand
    // types and shapes for the row context (templates/fused.cuh RowCtx).
    o += fmt::format("// fused epilogue {}\n#include \"fused.cuh\"\nnamespace mk_fused_b{} {{\n{}\nstruct F {{\n",
                     lim.epilogue.name, b, lim.epilogue.source);
    for (size_t k = 0; k < 6; ++k) {
      const bool has = k < lim.epilogue.operands.size();
      const auto& op_k = has ? lim.epilogue.operands[k] : std::pair<DType, int32_t>{DType::int8, 0};
      o += fmt::format("  using O{} = {};\n  static constexpr int kS{} = {};\n", k,
                       has ? std::string(dtype_device_name(op_k.first)) : std::string("char"), k, op_k.second);
    }
    if (lim.epilogue.check) {  // checked accessors (only then: unchecked plans keep their source, so their cubins)
      uint32_t outputs = 0;
      for (size_t k = 0; k < lim.epilogue.outputs.size(); ++k) outputs |= lim.epilogue.outputs[k] ? 1u << k : 0u;
      MK_CHECK(std::all_of(lim.epilogue.name.begin(), lim.epilogue.name.end(),
                           [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-'; }),
               "codegen: a fusion name that is not a name (the registry refuses those)");
      o += fmt::format(
          "  static constexpr bool kCheck = true;\n  static constexpr int kOps = {}, kScalars = {};\n"
          "  static constexpr unsigned kOutputs = {}u;\n  __device__ static const char* name() {{ return \"{}\"; }}\n",
          lim.epilogue.operands.size(), lim.epilogue.scalars, outputs, lim.epilogue.name);
    }
    o += "};\n}  // namespace\n\n";
    e.set_epilogue(true);
  }
  u.kernel = e.emit(fmt::format("mk_{}_b{}", tag, b), lim);
  if (e.row_only()) u.serves = {rank};
  return u;
}

std::vector<Unit> generate(const std::vector<Schedule>& variants, DType dtype, RedOp op, const std::string& tag,
                           const Limits& lim, int32_t rank) {
  MK_CHECK(!variants.empty(), "nothing to generate");
  const Schedule& first = variants.front();
  auto one = [&](size_t b) {
    const Schedule& s = variants[b];
    MK_CHECK(s.nranks == first.nranks && s.coll == first.coll, "variants of one plan differ");
    return generate_one(s, b, variants.size(), dtype, op, tag, lim, rank);
  };
  // Buckets side by side (two cores: codegen of a 1024-rank plan takes seconds
  // per bucket), the first failure in bucket order reported.
  std::vector<Unit> units(variants.size());
  side_by_side(variants.size(), [&](size_t b) { units[b] = one(b); });
  return units;
}

std::string group_source(const std::vector<GroupMember>& members, int32_t threads, const std::string& kernel_name) {
  if (members.empty() || members.size() > size_t(dev::kMaxGroupMembers))
    throw Error(ErrId::jit_E005, fmt::format("a group kernel of {} members (1..{})", members.size(),
                                             dev::kMaxGroupMembers));
  std::string o = fmt::format(
      "// Generated by mKernel codegen: {} collective(s) of one group as one kernel, each on its own\n"
      "// blocks with its own arguments (mk::dev::GroupArgs). Do not edit.\n"
      "#define MK_GROUP_MEMBER 1\n#include \"kernel.cuh\"\n#include \"fused.cuh\"\n\n",
      members.size());
  // Each distinct member kernel once, in a namespace of its own (every plan
  // source names its constants and functions by bucket only). Its includes
  // are above (and #pragma once): none may open inside a namespace.
  std::vector<std::string> ns(members.size());
  std::map<std::string, std::string> seen;
  for (size_t i = 0; i < members.size(); ++i) {
    const GroupMember& m = members[i];
    MK_CHECK(m.grid > 0 && !m.kernel.empty(), "group_source: a member without blocks or kernel name");
    auto [it, fresh] = seen.emplace(m.kernel, fmt::format("mk_m{}", seen.size()));
    ns[i] = it->second;
    if (!fresh) continue;
    MK_CHECK(m.source.find(m.kernel + "_body(") != std::string::npos,
             "group_source: member source without its kernel's body function");
    o += fmt::format("namespace {} {{\n", it->second);
    size_t at = 0;
    while (at < m.source.size()) {
      size_t end = m.source.find('\n', at);
      if (end == std::string::npos) end = m.source.size();
      const std::string_view line(m.source.data() + at, end - at);
      if (line.rfind("#include", 0) != 0) {
        o.append(line);
        o += '\n';
      }
      at = end + 1;
    }
    o += fmt::format("}}  // namespace {}\n\n", it->second);
  }
  o += fmt::format("extern \"C\" __global__ void __launch_bounds__({}, 1) {}(const __grid_constant__ mk::dev::GroupArgs<{}> g) {{\n"
                   "  mk::dev::grid_dependency_wait();\n  const int b = int(blockIdx.x);\n",
                   threads, kernel_name, members.size());
  std::vector<int32_t> lanes;  // in order of first appearance
  for (const GroupMember& m : members)
    if (std::find(lanes.begin(), lanes.end(), m.lane) == lanes.end()) lanes.push_back(m.lane);
  int64_t first = 0;
  for (int32_t lane : lanes) {
    // A lane has its largest member's blocks; a smaller member runs on the
    // first of them and the others only take part in the chain barriers.
    int32_t grid = 0;
    for (const GroupMember& m : members)
      if (m.lane == lane) grid = std::max(grid, m.grid);
    bool started = false;
    size_t prev = 0;
    std::string body;
    for (size_t i = 0; i < members.size(); ++i) {
      const GroupMember& m = members[i];
      if (m.lane != lane) continue;
      if (started)  // the previous member of the lane, on every block, first
        body += fmt::format("    if (!{}::{}_chain(g.a[{}], bid, {})) return;\n", ns[prev], members[prev].kernel, prev,
                            grid);
      started = true;
      prev = i;
      if (m.grid == grid)
        body += fmt::format("    {}::{}_body(g.a[{}], bid, {});\n", ns[i], m.kernel, i, m.grid);
      else
        body += fmt::format("    if (bid < {}) {}::{}_body(g.a[{}], bid, {});\n", m.grid, ns[i], m.kernel, i, m.grid);
    }
    o += fmt::format("  if (b < {}) {{\n    const int bid = b - {};\n{}    return;\n  }}\n", first + grid, first, body);
    first += grid;
  }
  o += "}\n";
  return o;
}

std::string op_comment(const std::string& source, int32_t op) {
  if (op < 0) return "";
  const std::string tag = fmt::format("%{} ", op);
  for (size_t at = source.find(tag); at != std::string::npos; at = source.find(tag, at + 1)) {
    if (at == 0 || source[at - 1] != ' ') continue;  // a token of its own: " %7 "
    const size_t begin = source.rfind('\n', at) + 1;  // npos + 1 == 0
    const size_t text = source.find_first_not_of(' ', begin);
    if (source.compare(text, 3, "// ") != 0) continue;  // a comment line: "// %7 ...", "// first of 3: %7 ..."
    const size_t end = source.find('\n', at);
    return source.substr(at, (end == std::string::npos ? source.size() : end) - at);
  }
  return "";
}

}  // namespace mk::codegen
