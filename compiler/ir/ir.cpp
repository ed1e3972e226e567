#include "compiler/ir/ir.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <map>
#include <mutex>
#include <unordered_set>

namespace mk::ir {
namespace {

struct OpInfo {
  std::string_view name;
  int min_srcs, min_dsts;
  std::string_view meaning;
};
constexpr std::array kOpInfo = {
#define MK_OP(name, min_srcs, min_dsts, meaning) OpInfo{#name, min_srcs, min_dsts, meaning},
#include "compiler/ir/ops.def"
#undef MK_OP
};
constexpr std::array<std::string_view, 3> kBufNames = {"in", "out", "sc"};
constexpr std::array<std::string_view, 2> kProtoNames = {"simple", "ll"};

bool parse_int(std::string_view s, int32_t* out) {
  if (s.empty()) return false;
  auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

struct LocHash {
  size_t operator()(const SrcLoc& l) const {
    size_t h = std::hash<std::string>()(l.file);
    h = h * 1000003u ^ std::hash<std::string>()(l.func);
    return h * 1000003u ^ l.line;
  }
};
struct LocEq {
  bool operator()(const SrcLoc& a, const SrcLoc& b) const {
    return a.line == b.line && a.file == b.file && a.func == b.func;
  }
};

}  // namespace

namespace {
union NoLoc {
  SrcLoc v;
  constexpr NoLoc() : v() {}
  ~NoLoc() {}  // leaves v alone: Locs made or read during static destruction still point at it
};
constinit NoLoc no_loc;  // before any dynamic initialisation that makes a Loc
}  // namespace

const SrcLoc* const Loc::kNone = &no_loc.v;

Loc::Loc(const SrcLoc& l) {
  if (!l.valid() && l.file.empty() && l.func.empty()) return;  // kNone
  // Never freed: nodes of an unordered_set keep their address, so a Loc read
  // takes no lock. Bounded by the distinct positions of the programs built.
  static std::mutex mu;
  static auto* table = new std::unordered_set<SrcLoc, LocHash, LocEq>();
  std::lock_guard<std::mutex> lock(mu);
  p_ = &*table->insert(l).first;
}

std::string_view name(OpKind k) { return kOpInfo.at(size_t(k)).name; }
int min_srcs(OpKind k) { return kOpInfo.at(size_t(k)).min_srcs; }
int min_dsts(OpKind k) { return kOpInfo.at(size_t(k)).min_dsts; }
std::string_view meaning(OpKind k) { return kOpInfo.at(size_t(k)).meaning; }
std::optional<OpKind> parse_opkind(std::string_view s) {
  for (size_t i = 0; i < kOpInfo.size(); ++i)
    if (kOpInfo[i].name == s) return OpKind(i);
  return std::nullopt;
}
std::vector<OpKind> all_opkinds() {
  std::vector<OpKind> v;
  for (size_t i = 0; i < kOpInfo.size(); ++i) v.push_back(OpKind(i));
  return v;
}

std::string_view name(Buf b) { return kBufNames.at(size_t(b)); }
std::optional<Buf> parse_buf(std::string_view s) {
  for (size_t i = 0; i < kBufNames.size(); ++i)
    if (kBufNames[i] == s) return Buf(i);
  return std::nullopt;
}
std::string_view name(Proto p) { return kProtoNames.at(size_t(p)); }
std::optional<Proto> parse_proto(std::string_view s) {
  for (size_t i = 0; i < kProtoNames.size(); ++i)
    if (kProtoNames[i] == s) return Proto(i);
  return std::nullopt;
}

std::string to_string(const Ref& r) {
  if (r.count == 1) return fmt::format("r{}.{}[{}]", r.rank, name(r.buf), r.index);
  return fmt::format("r{}.{}[{}:{}]", r.rank, name(r.buf), r.index, r.index + r.count);
}

std::optional<Ref> parse_ref(std::string_view s) {
  // r<rank>.<buf>[<i>] or r<rank>.<buf>[<i>:<j>]
  if (s.size() < 6 || s[0] != 'r') return std::nullopt;
  auto dot = s.find('.');
  auto lb = s.find('[');
  if (dot == std::string_view::npos || lb == std::string_view::npos || lb < dot || s.back() != ']')
    return std::nullopt;
  Ref r;
  if (!parse_int(s.substr(1, dot - 1), &r.rank)) return std::nullopt;
  auto b = parse_buf(s.substr(dot + 1, lb - dot - 1));
  if (!b) return std::nullopt;
  r.buf = *b;
  auto inner = s.substr(lb + 1, s.size() - lb - 2);
  auto colon = inner.find(':');
  if (colon == std::string_view::npos) {
    if (!parse_int(inner, &r.index)) return std::nullopt;
    r.count = 1;
  } else {
    int32_t end = 0;
    if (!parse_int(inner.substr(0, colon), &r.index) || !parse_int(inner.substr(colon + 1), &end))
      return std::nullopt;
    r.count = end - r.index;
  }
  return r;
}

int32_t Schedule::next_id() const {
  int32_t m = -1;
  for (const auto& op : ops) m = std::max(m, op.id);
  return m + 1;
}

topology::Topology topology_of(const Schedule& s) {
  return s.topology ? *s.topology : topology::single(s.nranks);
}

int32_t buf_blocks(Collective c, int32_t nranks, Buf b) {
  switch (b) {
    case Buf::input: return input_blocks(c, nranks);
    case Buf::output: return output_blocks(c, nranks);
    case Buf::scratch: return 1;  // slots, not blocks: buf_chunks uses s.scratch
  }
  return 1;
}

int32_t buf_chunks(const Schedule& s, Buf b) {
  if (b == Buf::scratch) return s.scratch;
  return buf_blocks(s.coll, s.nranks, b) * s.chunks;
}

bool has_input(const Schedule& s, int32_t rank) { return mk::has_input(s.coll, rank, s.root); }
bool has_output(const Schedule& s, int32_t rank) { return mk::has_output(s.coll, rank, s.root); }

std::optional<int32_t> inplace_shift(const Schedule& s, int32_t rank) {
  if (inplace_rule(s.coll) == InPlace::unsupported || !has_input(s, rank) || !has_output(s, rank))
    return std::nullopt;
  // both buffers sit in one allocation, each from its in-place block on
  return (inplace_input_block(s.coll, rank) - inplace_output_block(s.coll, rank)) * s.chunks;
}

std::optional<int32_t> inplace_output_of_input(const Schedule& s, int32_t rank, int32_t index) {
  const auto shift = inplace_shift(s, rank);
  if (!shift) return std::nullopt;
  const int32_t at = index + *shift;
  if (at < 0 || at >= buf_chunks(s, Buf::output)) return std::nullopt;
  return at;
}

std::string print_op(const Op& op) {
  std::string s = fmt::format("%{} {}", op.id, name(op.kind));
  auto refs = [](const Refs& v) {
    std::string out;
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + to_string(v[i]);
    return out;
  };
  switch (op.kind) {
    case OpKind::copy:
    case OpKind::reduce:
    case OpKind::put:
      s += " " + refs(op.srcs) + " -> " + refs(op.dsts);
      if (op.final) s += " final";
      break;
    case OpKind::signal: s += fmt::format(" r{} slot {}", op.peer, op.slot); break;
    case OpKind::wait:
      s += fmt::format(" slot {}", op.slot);
      if (op.iter != 0) s += fmt::format(" iter {}", op.iter);
      break;
    case OpKind::nop:
    case OpKind::flush: break;
  }
  return s;
}

std::string print(const Schedule& s) {
  std::string out = fmt::format(
      "schedule {} collective={} ranks={} root={} chunks={} instances={} scratch={}\n", s.name,
      name(s.coll), s.nranks, s.root, s.chunks, s.instances, s.scratch);
  out += fmt::format("  tbs={} slots={} depth={} proto={} tile={}{}{}{}{}{}{}\n", s.tbs, s.slots, s.depth,
                     name(s.proto), s.tile_bytes, s.staged ? " staged" : "",
                     s.zero_copy ? " zero_copy" : "", s.synced ? " synced" : "", s.one_pass ? " one_pass" : "",
                     s.lamport ? " lamport" : "", s.topology ? " topology=" + s.topology->name() : "");
  // Group by rank, then thread block; within a group keep program order.
  // Bucketed once and stably sorted: scanning all ops per rank and per block
  // took minutes at 1024 ranks.
  std::vector<std::vector<const Op*>> by_rank(size_t(std::max(s.nranks, 0)));
  for (const auto& op : s.ops)
    if (op.rank >= 0 && op.rank < s.nranks) by_rank[size_t(op.rank)].push_back(&op);
  for (int32_t r = 0; r < s.nranks; ++r) {
    std::vector<const Op*>& mine = by_rank[size_t(r)];
    std::stable_sort(mine.begin(), mine.end(), [](const Op* a, const Op* b) { return a->tb < b->tb; });
    out += fmt::format("rank {}:\n", r);
    for (size_t i = 0; i < mine.size(); ++i) {
      const Op* op = mine[i];
      const bool in_block = op->tb >= 0;
      if (in_block && (i == 0 || mine[i - 1]->tb != op->tb)) out += fmt::format("  tb {}:\n", op->tb);
      std::string line = (in_block ? "    " : "  ") + print_op(*op);
      if (op->loc.valid()) {
        if (line.size() < 60) line.resize(60, ' ');
        line += "  ; " + op->loc.str();
      }
      out += line + "\n";
    }
  }
  return out;
}

bool same_data_ops(const Schedule& a, const Schedule& b) {
  if (a.nranks != b.nranks || a.coll != b.coll || a.chunks != b.chunks || a.scratch != b.scratch) return false;
  size_t i = 0, j = 0;
  for (;; ++i, ++j) {
    while (i < a.ops.size() && !a.ops[i].is_data()) ++i;
    while (j < b.ops.size() && !b.ops[j].is_data()) ++j;
    if (i == a.ops.size() || j == b.ops.size()) return i == a.ops.size() && j == b.ops.size();
    const Op &x = a.ops[i], &y = b.ops[j];
    if (x.kind != y.kind || x.rank != y.rank || x.srcs != y.srcs || x.dsts != y.dsts || x.final != y.final ||
        x.pos != y.pos)
      return false;
  }
}

}  // namespace mk::ir
