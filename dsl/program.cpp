// The DSL records calls as IR ops in call order. Checks here are the ones that
// can be made at the call (bad ranks, negative indices, mismatched counts);
// everything that needs the whole program (bounds against the final chunk
// count, contributions, races) is the verifier's job.
#include <fmt/format.h>

#include <deque>
#include <mutex>

#include "compiler/ir/ir.hpp"
#include "mk/dsl.hpp"

namespace mk::dsl {
namespace {

SrcLoc to_loc(const std::source_location& l) {
  return SrcLoc{l.file_name(), static_cast<uint32_t>(l.line()), l.function_name()};
}

// The interned position of a call site. A builder's loop calls the same few
// sites millions of times: the last site is remembered and compared by
// content (an unloaded plugin's strings may be reused at the same address),
// so most calls skip building and hashing a SrcLoc.
ir::Loc interned(const std::source_location& l) {
  thread_local ir::Loc last;
  if (last->line != l.line() || last->file != l.file_name() || last->func != l.function_name()) last = to_loc(l);
  return last;
}

ir::Buf to_ir(Buf b) {
  switch (b) {
    case Buf::input: return ir::Buf::input;
    case Buf::output: return ir::Buf::output;
    case Buf::scratch: return ir::Buf::scratch;
  }
  return ir::Buf::input;
}

ir::Ref to_ref(const Chunk& c) { return ir::Ref{c.rank, to_ir(c.buf), c.index, c.count}; }

constexpr int kMaxRanks = 1024;

}  // namespace

Program::Program(Collective coll, int nranks, int root, std::string name, Loc loc) : s_(new ir::Schedule) {
  if (nranks < 1 || nranks > kMaxRanks) {
    delete s_;
    throw Error(ErrId::dsl_E004, "nranks must be in 1.." + std::to_string(kMaxRanks) + ", got " +
                                     std::to_string(nranks), to_loc(loc));
  }
  if (root < 0 || root >= nranks) {
    delete s_;
    throw Error(ErrId::dsl_E001, "root " + std::to_string(root) + " is not a rank of " +
                                     std::to_string(nranks), to_loc(loc));
  }
  s_->name = std::move(name);
  s_->coll = coll;
  s_->nranks = nranks;
  s_->root = root;
  s_->loc = to_loc(loc);
}

Program::~Program() { delete s_; }
Program::Program(Program&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }
Program& Program::operator=(Program&& o) noexcept {
  std::swap(s_, o.s_);
  return *this;
}

Collective Program::collective() const { return s_->coll; }
int Program::ranks() const { return s_->nranks; }
int Program::root() const { return s_->root; }
const std::string& Program::name() const { return s_->name; }
int Program::chunks() const { return s_->chunks; }
int Program::instances() const { return s_->instances; }
int Program::input_chunks() const { return ir::buf_chunks(*s_, ir::Buf::input); }
int Program::output_chunks() const { return ir::buf_chunks(*s_, ir::Buf::output); }
int Program::nodes() const { return ir::topology_of(*s_).nodes; }
int Program::gpus_per_node() const { return ir::topology_of(*s_).gpus_per_node; }

int Program::node(int r, Loc loc) const {
  check_rank(r, "node", loc);
  return ir::topology_of(*s_).node(r);
}

int Program::local(int r, Loc loc) const {
  check_rank(r, "local", loc);
  return ir::topology_of(*s_).local(r);
}

int Program::rank_of(int node, int local, Loc loc) const {
  const auto t = ir::topology_of(*s_);
  if (node < 0 || node >= t.nodes || local < 0 || local >= t.gpus_per_node)
    throw Error(ErrId::dsl_E001,
                "rank_of(" + std::to_string(node) + ", " + std::to_string(local) + "): the topology " + t.name() +
                    " has nodes 0.." + std::to_string(t.nodes - 1) + " of GPUs 0.." +
                    std::to_string(t.gpus_per_node - 1),
                to_loc(loc));
  return t.rank_of(node, local);
}

void Program::check_rank(int r, const char* what, Loc loc) const {
  if (r < 0 || r >= s_->nranks)
    throw Error(ErrId::dsl_E001,
                std::string(what) + "(" + std::to_string(r) + "): not a rank of " + std::to_string(s_->nranks),
                to_loc(loc));
}

ir::Schedule& Program::ir() { return *s_; }
const ir::Schedule& Program::ir() const { return *s_; }

void Program::chunks(int k, Loc loc) {
  if (k < 1 || k > 1 << 16)
    throw Error(ErrId::dsl_E004, "chunks(" + std::to_string(k) + "): need 1..65536 chunks per block",
                to_loc(loc));
  if (!s_->ops.empty())
    throw Error(ErrId::dsl_E004, "chunks() must be set before the first operation", to_loc(loc),
                "move the p.chunks(...) call to the top of the builder");
  s_->chunks = k;
}

void Program::instances(int n, Loc loc) {
  if (n < 1 || n > 64)
    throw Error(ErrId::dsl_E004, "instances(" + std::to_string(n) + "): need 1..64", to_loc(loc));
  s_->instances = n;
}

void Program::check_chunk(const Chunk& c, Loc loc) const {
  if (c.rank < 0 || c.rank >= s_->nranks)
    throw Error(ErrId::dsl_E001,
                "chunk refers to rank " + std::to_string(c.rank) + " but the program has " +
                    std::to_string(s_->nranks) + " ranks",
                to_loc(loc));
  if (c.index < 0 || c.count < 1)
    throw Error(ErrId::dsl_E002,
                "chunk index " + std::to_string(c.index) + " count " + std::to_string(c.count) +
                    ": index must be >= 0 and count >= 1",
                to_loc(loc));
}

void Program::add(int kind, const std::vector<Chunk>& dsts, const std::vector<Chunk>& srcs, Exec e,
                  Loc loc) {
  for (const auto& c : dsts) check_chunk(c, loc);
  for (const auto& c : srcs) check_chunk(c, loc);
  const int count = dsts.front().count;
  for (const auto& c : dsts)
    if (c.count != count)
      throw Error(ErrId::dsl_E003, "destinations of one operation must have the same chunk count",
                  to_loc(loc));
  for (const auto& c : srcs)
    if (c.count != count)
      throw Error(ErrId::dsl_E003,
                  "source has " + std::to_string(c.count) + " chunk(s), destination " +
                      std::to_string(count),
                  to_loc(loc));
  if (e.on < -1)
    throw Error(ErrId::dsl_E005, "executing rank " + std::to_string(e.on) + " is not a rank (use -1 for the default)",
                to_loc(loc));
  int exec = e.on;
  if (exec < 0) {
    if (kind == int(ir::OpKind::copy)) {
      exec = srcs.front().rank;
    } else {
      bool same = true;
      for (const auto& c : srcs) same = same && c.rank == srcs.front().rank;
      exec = same ? srcs.front().rank : dsts.front().rank;
    }
  }
  if (exec >= s_->nranks)
    throw Error(ErrId::dsl_E005, "executing rank " + std::to_string(exec) + " is not a rank",
                to_loc(loc));
  if (e.tb < -1 || e.tb >= 1024)
    throw Error(ErrId::dsl_E005, "thread block " + std::to_string(e.tb) + " must be in 0..1023",
                to_loc(loc));
  ir::Op op;
  op.id = static_cast<int32_t>(s_->ops.size());
  op.kind = static_cast<ir::OpKind>(kind);
  op.rank = exec;
  op.tb = e.tb;
  for (const auto& c : srcs) op.srcs.push_back(to_ref(c));
  for (const auto& c : dsts) op.dsts.push_back(to_ref(c));
  op.loc = interned(loc);
  for (const auto& c : srcs)
    if (c.buf == Buf::scratch) s_->scratch = std::max(s_->scratch, c.index + c.count);
  for (const auto& c : dsts)
    if (c.buf == Buf::scratch) s_->scratch = std::max(s_->scratch, c.index + c.count);
  s_->ops.push_back(std::move(op));
}

void Program::copy(const Chunk& dst, const Chunk& src, Exec e, Loc loc) {
  add(int(ir::OpKind::copy), {dst}, {src}, e, loc);
}

void Program::copy(const std::vector<Chunk>& dsts, const Chunk& src, Exec e, Loc loc) {
  if (dsts.empty())
    throw Error(ErrId::dsl_E003, "copy needs at least one destination", to_loc(loc));
  add(int(ir::OpKind::copy), dsts, {src}, e, loc);
}

namespace {
// Equal sizes (of at least `min`), ranks in range, each rank once per group.
void check_groups(const Program& p, const Program::Groups& groups, size_t min, const char* what,
                  std::source_location loc) {
  if (groups.empty()) throw Error(ErrId::dsl_E004, std::string(what) + ": no groups", to_loc(loc));
  for (const auto& g : groups) {
    if (g.size() < min || g.size() != groups[0].size())
      throw Error(ErrId::dsl_E004,
                  std::string(what) + ": groups must have equal sizes of at least " + std::to_string(min) +
                      " (got " + std::to_string(g.size()) + " and " + std::to_string(groups[0].size()) + ")",
                  to_loc(loc));
    for (size_t i = 0; i < g.size(); ++i) {
      if (g[i] < 0 || g[i] >= p.ranks())
        throw Error(ErrId::dsl_E001, std::string(what) + ": rank " + std::to_string(g[i]) + " is outside 0.." +
                                         std::to_string(p.ranks() - 1),
                    to_loc(loc));
      for (size_t j = 0; j < i; ++j)
        if (g[j] == g[i])
          throw Error(ErrId::dsl_E004, std::string(what) + ": rank " + std::to_string(g[i]) + " twice in one group",
                      to_loc(loc));
    }
  }
}
}  // namespace

void Program::reduce_scatter(const Groups& groups, const PairFn& piece, const RankFn& dst, const PairFn& slot,
                             Order order, Loc loc) {
  check_groups(*this, groups, 2, "reduce_scatter", loc);
  const size_t n = groups[0].size();
  for (size_t d = 1; d < n; ++d)
    for (const auto& g : groups)
      for (size_t i = 0; i < n; ++i) {
        const int from = g[i], to = g[(i + d) % n];
        copy(slot(from, to), piece(from, to), {}, loc);
      }
  for (const auto& g : groups)
    for (size_t k = 0; k < n; ++k) {
      const int me = g[k];
      std::vector<Chunk> srcs;
      if (order == Order::own_first) {
        srcs.push_back(piece(me, me));
        for (size_t d = 1; d < n; ++d) srcs.push_back(slot(g[(k + d) % n], me));
      } else {
        for (size_t j = 0; j < n; ++j) srcs.push_back(j == k ? piece(me, me) : slot(g[j], me));
      }
      reduce(dst(me), srcs, {}, loc);
    }
}

void Program::all_gather(const Groups& groups, const RankFn& src, const PairFn& dst, bool self, Loc loc) {
  check_groups(*this, groups, 1, "all_gather", loc);
  const size_t n = groups[0].size();
  for (size_t d = self ? 0 : 1; d < n; ++d)
    for (const auto& g : groups)
      for (size_t i = 0; i < n; ++i) copy(dst(g[(i + d) % n], g[i]), src(g[i]), {}, loc);
}

Program::Groups Program::all_ranks() const {
  Groups g(1);
  for (int r = 0; r < ranks(); ++r) g[0].push_back(r);
  return g;
}

Program::Groups Program::node_groups() const {
  Groups g(static_cast<size_t>(nodes()));
  for (int r = 0; r < ranks(); ++r) g[size_t(node(r))].push_back(r);
  return g;
}

Program::Groups Program::rail_groups() const {
  Groups g(static_cast<size_t>(gpus_per_node()));
  for (int r = 0; r < ranks(); ++r) g[size_t(local(r))].push_back(r);
  return g;
}

void Program::reduce(const Chunk& dst, const std::vector<Chunk>& srcs, Exec e, Loc loc) {
  if (srcs.size() < 2)
    throw Error(ErrId::dsl_E006,
                "reduce needs at least two sources, got " + std::to_string(srcs.size()), to_loc(loc),
                "use copy() to move one chunk, or accumulate(dst, src) for dst := dst op src");
  add(int(ir::OpKind::reduce), {dst}, srcs, e, loc);
}

void Program::accumulate(const Chunk& dst, const Chunk& src, Exec e, Loc loc) {
  add(int(ir::OpKind::reduce), {dst}, {dst, src}, e, loc);
}

// ---- registry ---------------------------------------------------------------

namespace {
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::deque<ScheduleInfo>& registry() {  // deque: pointers stay valid as plugins register
  static std::deque<ScheduleInfo> r;
  return r;
}
}  // namespace

namespace {
thread_local RefuseReplacement* t_refuse = nullptr;
}

RefuseReplacement::RefuseReplacement() : outer_(t_refuse) { t_refuse = this; }
RefuseReplacement::~RefuseReplacement() { t_refuse = outer_; }

bool register_schedule(const ScheduleInfo& info) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  static int64_t counter = 0;
  ScheduleInfo copy = info;
  copy.seq = ++counter;
  for (auto& s : registry())
    if (s.name == info.name) {
      if (t_refuse) {
        t_refuse->refused.push_back(info.name);
        return true;
      }
      s = copy;  // a later registration (a user plugin) replaces an earlier one
      return true;
    }
  registry().push_back(copy);
  return true;
}

std::vector<ScheduleInfo> registered_schedules() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  return {registry().begin(), registry().end()};
}

const ScheduleInfo* find_schedule(const std::string& name) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (auto& s : registry())
    if (s.name == name) return &s;
  return nullptr;
}

namespace {

ir::Schedule run_builder(const ScheduleInfo& info, Program& p) {
  const int nranks = p.ranks();
  try {
    info.build(p);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(ErrId::dsl_E007,
                "schedule '" + info.name + "' threw while building for " + std::to_string(nranks) +
                    " ranks (" + ir::topology_of(p.ir()).name() + "): " + e.what(),
                SrcLoc{info.file, static_cast<uint32_t>(info.line), {}});
  }
  p.ir().loc = SrcLoc{info.file, static_cast<uint32_t>(info.line), {}};
  return std::move(p.ir());
}

ir::Schedule imported_copy(const ScheduleInfo& info, int nranks, int root) {
  const ir::Schedule& s = *info.imported;
  const SrcLoc at{info.file, static_cast<uint32_t>(info.line), {}};
  if (nranks != s.nranks)
    throw Error(ErrId::dsl_E008,
                fmt::format("schedule '{}' was imported from {} for {} ranks; it cannot serve {}", info.name,
                            info.file, s.nranks, nranks),
                at, "import (or write) a version of the algorithm for this rank count, under another name");
  if (root != 0)
    throw Error(ErrId::dsl_E008,
                fmt::format("schedule '{}' was imported for root 0; asked for root {}", info.name, root), at,
                "the runtime serves every root from the root-0 schedule by renumbering ranks");
  return s;
}

}  // namespace

ir::Schedule build(const ScheduleInfo& info, int nranks, int root) {
  if (info.imported) return imported_copy(info, nranks, root);
  Program p(info.coll, nranks, root, info.name);
  return run_builder(info, p);
}

ir::Schedule build(const ScheduleInfo& info, const topology::Topology& t, int root) {
  if (info.imported) {
    ir::Schedule s = imported_copy(info, t.nranks(), root);
    s.topology = t;
    return s;
  }
  Program p(info.coll, t.nranks(), root, info.name);
  p.ir().topology = t;
  return run_builder(info, p);
}

}  // namespace mk::dsl
