// The importers' common middle: ordering, race proof and IR emission (see
// algo.hpp for what each part guarantees).
#include "compiler/importers/algo.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <numeric>
#include <tuple>

namespace mk::importers::detail {

const char* vbuf_name(VBuf b) {
  switch (b) {
    case VBuf::i: return "input";
    case VBuf::o: return "output";
    case VBuf::s: return "scratch";
  }
  return "?";
}

const char* vbuf_letter(VBuf b) {
  switch (b) {
    case VBuf::i: return "i";
    case VBuf::o: return "o";
    case VBuf::s: return "s";
  }
  return "?";
}

std::string to_string(const VRef& r) {
  if (r.count == 1) return fmt::format("gpu {} {}[{}]", r.rank, vbuf_letter(r.buf), r.index);
  return fmt::format("gpu {} {}[{}:{}]", r.rank, vbuf_letter(r.buf), r.index, int64_t(r.index) + r.count);
}

// ---- Graph ------------------------------------------------------------------

int32_t Graph::add_thread(int32_t gpu, int32_t tb) {
  threads.push_back(Thread{gpu, tb, {}});
  return int32_t(threads.size() - 1);
}

int32_t Graph::add_node(int32_t thread, int32_t gpu, SrcLoc loc, std::string what) {
  Node n;
  n.thread = thread;
  n.gpu = gpu;
  n.loc = std::move(loc);
  n.what = std::move(what);
  int32_t id = int32_t(nodes.size());
  if (thread >= 0) {
    Thread& t = threads[size_t(thread)];
    n.pos = int32_t(t.nodes.size());
    t.nodes.push_back(id);
  }
  nodes.push_back(std::move(n));
  return id;
}

void Graph::access(int32_t n, const VRef& ref, bool write) {
  chunk_accesses += ref.count;
  if (chunk_accesses > (int64_t(1) << 26))
    throw Error(ErrId::import_E012,
                fmt::format("the steps touch more than {} chunks in all; mKernel imports smaller algorithms",
                            int64_t(1) << 26),
                nodes[size_t(n)].loc);
  nodes[size_t(n)].acc.push_back({ref, write});
}

std::string Graph::where(int32_t n) const {
  const Node& x = nodes[size_t(n)];
  std::string s = x.what;
  if (x.loc.valid()) s += " (" + x.loc.str() + (x.loc.func.empty() ? "" : ", " + x.loc.func) + ")";
  return s;
}

namespace {
// "0", "C", "C/2", "3C/4": k/n of a chunk's C bytes
std::string fraction_of_c(int64_t k, int64_t n) {
  const int64_t d = std::gcd(k, n);
  k /= d;
  n /= d;
  if (k == 0)
    return "0";
  std::string num = k == 1 ? "C" : fmt::format("{}C", k);
  return n == 1 ? num : fmt::format("{}/{}", num, n);
}
} // namespace

std::string Graph::describe(const VRef &r) const {
  if (refine <= 1)
    return to_string(r);
  const int64_t first = r.index / refine,
                last = (int64_t(r.index) + r.count - 1) / refine;
  if (r.index % refine == 0 && r.count % refine == 0)
    return to_string(
        VRef{r.rank, r.buf, int32_t(first), int32_t(r.count / refine)});
  std::string s =
      to_string(VRef{r.rank, r.buf, int32_t(first), int32_t(last - first + 1)});
  if (first != last)
    return s + " (in part)";
  const int64_t lo = r.index % refine, hi = lo + r.count;
  return fmt::format("{} bytes [{}, {}) (C: the chunk's size; MSCCL++ rounds "
                     "to its buffer alignment)",
                     s, fraction_of_c(lo, refine), fraction_of_c(hi, refine));
}

// Why two steps are unordered, for a race message: what the later step's
// thread knows of the earlier one's, and the cross-thread edges into the
// later step's thread (before it) and out of the earlier step's thread
// (after it): the candidates one would expect to order them.
static std::string explain_unordered(const Graph &g, int32_t a, int32_t b,
                                     uint32_t known) {
  const Node &x = g.nodes[size_t(a)];
  const Node &y = g.nodes[size_t(b)];
  const Thread &tx = g.threads[size_t(x.thread)];
  const Thread &ty = g.threads[size_t(y.thread)];
  const std::string nx = fmt::format("gpu {} tb {}", tx.gpu, tx.tb),
                    ny = fmt::format("gpu {} tb {}", ty.gpu, ty.tb);
  std::string s =
      fmt::format("\n  interleaving: {} and {} run concurrently; ", nx, ny);
  if (known == 0)
    s += fmt::format("no step of {} is ordered before the {} one", nx, ny);
  else
    s += fmt::format("the last step of {} ordered before the {} one is {}, "
                     "before the racing one",
                     nx, ny, g.nodes[size_t(tx.nodes[known - 1])].what);
  auto name = [&](int32_t n) {
    return g.nodes[size_t(n)].thread < 0
               ? g.nodes[size_t(n)].what + " (all its members)"
               : g.nodes[size_t(n)].what;
  };
  std::vector<std::string> into;
  for (int32_t m : ty.nodes) {
    if (g.nodes[size_t(m)].pos > y.pos)
      break;
    for (int32_t p : g.nodes[size_t(m)].preds)
      into.push_back(
          fmt::format("{} waits for {}", g.nodes[size_t(m)].what, name(p)));
  }
  std::vector<std::string> out;
  for (size_t n = 0; n < g.nodes.size() && out.size() < 4; ++n)
    for (int32_t p : g.nodes[n].preds)
      if (g.nodes[size_t(p)].thread == x.thread &&
          g.nodes[size_t(p)].pos >= x.pos && g.nodes[n].thread != x.thread)
        out.push_back(fmt::format("{} releases {}", g.nodes[size_t(p)].what,
                                  name(int32_t(n))));
  auto list = [](const std::vector<std::string> &v, size_t from) {
    std::string r;
    for (size_t i = from; i < v.size(); ++i)
      r += "\n    " + v[i];
    return r;
  };
  s += fmt::format("\n  what orders {} after other thread blocks, up to its "
                   "racing step:",
                   ny) +
       (into.empty() ? std::string(" nothing")
                     : list(into, into.size() > 4 ? into.size() - 4 : 0));
  s += fmt::format("\n  what orders other thread blocks after {}, from its "
                   "racing step on:",
                   nx) +
       (out.empty() ? std::string(" nothing") : list(out, 0));
  return s;
}

std::vector<int32_t> topo_order(const Graph& g, const std::string& hint) {
  const size_t n = g.nodes.size();
  std::vector<int32_t> indeg(n, 0);
  std::vector<std::vector<int32_t>> succ(n);
  for (size_t i = 0; i < n; ++i) {
    const Node& x = g.nodes[i];
    for (int32_t p : x.preds) {
      succ[size_t(p)].push_back(int32_t(i));
      ++indeg[i];
    }
    if (x.thread >= 0 && x.pos > 0) {
      succ[size_t(g.threads[size_t(x.thread)].nodes[size_t(x.pos - 1)])].push_back(int32_t(i));
      ++indeg[i];
    }
  }
  auto key = [&](int32_t a) {
    const Node& x = g.nodes[size_t(a)];
    int32_t tb = x.thread >= 0 ? g.threads[size_t(x.thread)].tb : INT_MAX;
    return std::make_tuple(x.gpu, tb, x.thread, x.pos, a);
  };
  std::vector<int32_t> order, level, next;
  order.reserve(n);
  for (size_t i = 0; i < n; ++i)
    if (indeg[i] == 0) level.push_back(int32_t(i));
  while (!level.empty()) {
    std::sort(level.begin(), level.end(), [&](int32_t a, int32_t b) { return key(a) < key(b); });
    next.clear();
    for (int32_t a : level) {
      order.push_back(a);
      for (int32_t b : succ[size_t(a)])
        if (--indeg[size_t(b)] == 0) next.push_back(b);
    }
    level.swap(next);
  }
  if (order.size() == n) return order;

  // A cycle: every node left has an unprocessed predecessor; walk back until
  // a node repeats.
  int32_t start = -1;
  for (size_t i = 0; i < n && start < 0; ++i)
    if (indeg[i] > 0) start = int32_t(i);
  auto left_pred = [&](int32_t x) {
    const Node& nd = g.nodes[size_t(x)];
    if (nd.thread >= 0 && nd.pos > 0) {
      int32_t p = g.threads[size_t(nd.thread)].nodes[size_t(nd.pos - 1)];
      if (indeg[size_t(p)] > 0) return p;
    }
    for (int32_t p : nd.preds)
      if (indeg[size_t(p)] > 0) return p;
    return int32_t(-1);
  };
  std::vector<int32_t> seen_at(n, -1), path;
  int32_t x = start;
  while (x >= 0 && seen_at[size_t(x)] < 0) {
    seen_at[size_t(x)] = int32_t(path.size());
    path.push_back(x);
    x = left_pred(x);
  }
  std::vector<int32_t> cycle;
  if (x >= 0) cycle.assign(path.begin() + seen_at[size_t(x)], path.end());
  std::reverse(cycle.begin(), cycle.end());  // now each waits for the previous
  std::string chain;
  for (size_t i = 0; i < cycle.size() && i < 10; ++i)
    chain += fmt::format("\n    {}{}", i ? "then " : "", g.where(cycle[i]));
  if (cycle.size() > 10) chain += fmt::format("\n    ... ({} steps in all)", cycle.size());
  if (!cycle.empty()) chain += "\n    which waits for the first again";
  size_t stuck = 0;
  for (size_t i = 0; i < n; ++i) stuck += indeg[i] > 0;
  const Node& first = g.nodes[size_t(cycle.empty() ? start : cycle.front())];
  throw Error(ErrId::import_E007,
              fmt::format("dependency cycle: {} step(s) can never run; the steps on the cycle wait for "
                          "each other:{}",
                          stuck, chain),
              first.loc, hint);
}

// ---- Geometry and View --------------------------------------------------------

int32_t Geometry::in_chunks() const { return ir::buf_blocks(coll, nranks, ir::Buf::input) * chunks; }
int32_t Geometry::out_chunks() const { return ir::buf_blocks(coll, nranks, ir::Buf::output) * chunks; }

View::View(const Geometry& g, bool inplace) : g_(g), inplace_(inplace) {
  int32_t sc = 0;
  for (int32_t x : g_.scratch) sc = std::max(sc, x);
  if (inplace_) {
    unified_ = std::max(g_.in_chunks(), g_.out_chunks());
    per_rank_ = unified_ + sc;
  } else {
    per_rank_ = g_.in_chunks() + g_.out_chunks() + sc;
  }
  if (per_rank_ < 1) per_rank_ = 1;
}

int32_t View::bound(int32_t rank, VBuf b) const {
  switch (b) {
    case VBuf::i: {
      int32_t n = g_.in_chunks();
      int32_t d = g_.decl_in.empty() ? -1 : g_.decl_in[size_t(rank)];
      return d >= 0 ? std::min(n, d) : n;
    }
    case VBuf::o: {
      int32_t n = g_.out_chunks();
      int32_t d = g_.decl_out.empty() ? -1 : g_.decl_out[size_t(rank)];
      return d >= 0 ? std::min(n, d) : n;
    }
    case VBuf::s: return g_.scratch[size_t(rank)];
  }
  return 0;
}

int64_t View::cell(int32_t rank, VBuf b, int32_t index) const {
  int64_t base = int64_t(rank) * per_rank_;
  const int32_t K = g_.chunks;
  if (inplace_) {
    switch (b) {
      case VBuf::i: return base + int64_t(inplace_input_block(g_.coll, rank)) * K + index;
      case VBuf::o: return base + int64_t(inplace_output_block(g_.coll, rank)) * K + index;
      case VBuf::s: return base + unified_ + index;
    }
  } else {
    switch (b) {
      case VBuf::i: return base + index;
      case VBuf::o: return base + g_.in_chunks() + index;
      case VBuf::s: return base + g_.in_chunks() + g_.out_chunks() + index;
    }
  }
  return base;
}

View::Cell View::info(int64_t cell) const {
  const int32_t r = int32_t(cell / per_rank_);
  const int32_t u = int32_t(cell % per_rank_);
  const int32_t K = g_.chunks;
  auto in = [&](int32_t i) { return ir::Ref{r, ir::Buf::input, i, 1}; };
  auto out = [&](int32_t i) { return ir::Ref{r, ir::Buf::output, i, 1}; };
  const bool has_in = has_input(g_.coll, r, g_.root), has_out = has_output(g_.coll, r, g_.root);
  Cell c;
  if (inplace_) {
    if (u >= unified_) {
      c.home = ir::Ref{r, ir::Buf::scratch, u - unified_, 1};
      return c;
    }
    // the unified buffer holds input and output, each from its in-place block
    // on (both from block 0 where mKernel has no in-place form: the file says
    // its buffers are one)
    const int32_t i = u - inplace_input_block(g_.coll, r) * K, o = u - inplace_output_block(g_.coll, r) * K;
    if (has_in && i >= 0 && i < g_.in_chunks()) c.init = in(i);
    if (has_out && o >= 0 && o < g_.out_chunks()) c.home = out(o);
    return c;
  }
  const int32_t ni = g_.in_chunks(), no = g_.out_chunks();
  if (u < ni) {
    c.init = in(u);  // its home is private: the input is read-only
  } else if (u < ni + no) {
    c.home = out(u - ni);
  } else {
    c.home = ir::Ref{r, ir::Buf::scratch, u - ni - no, 1};
  }
  return c;
}

// ---- Races ---------------------------------------------------------------------

void check_races(const Graph& g, const std::vector<int32_t>& order, const View& v, const std::string& hint) {
  const size_t n = g.nodes.size();
  // Within one step: the chunks of an operation are processed in parallel, so
  // a chunk it writes may be read or written by the same step only at the
  // same position of the operation (dst[k] := f(src[k]), in place allowed).
  {
    std::unordered_map<int64_t, std::pair<int32_t, bool>> seen;  // cell -> (position, written)
    for (size_t i = 0; i < n; ++i) {
      const Node& x = g.nodes[i];
      if (x.acc.size() < 2) continue;
      seen.clear();
      for (const Access& a : x.acc)
        for (int32_t k = 0; k < a.ref.count; ++k) {
          int64_t c = v.cell(a.ref.rank, a.ref.buf, a.ref.index + k);
          auto [it, fresh] = seen.emplace(c, std::make_pair(k, a.write));
          if (fresh) continue;
          const bool clash = (it->second.second && a.write) ||  // written twice
                             ((it->second.second || a.write) && it->second.first != k);
          if (clash)
            throw Error(ErrId::import_E009,
                        fmt::format("{} {} {} at two different positions of one operation (its chunks are "
                                    "processed in parallel, so the result is undefined; {} reading)",
                                    g.where(int32_t(i)), a.write && it->second.second ? "writes" : "reads and writes",
                                    to_string(VRef{a.ref.rank, a.ref.buf, a.ref.index + k, 1}),
                                    v.inplace() ? "in-place" : "out-of-place"),
                        x.loc, "make the source and destination ranges identical or disjoint");
          it->second.second = it->second.second || a.write;
        }
    }
  }
  const int32_t nranks = v.geo().nranks;
  // Which threads touch each rank's memory.
  std::vector<std::vector<int32_t>> touch(static_cast<size_t>(nranks));
  std::vector<uint8_t> out_edge(n, 0);
  for (size_t i = 0; i < n; ++i) {
    for (int32_t p : g.nodes[i].preds) out_edge[size_t(p)] = 1;
    const Node& x = g.nodes[i];
    for (const Access& a : x.acc)
      if (x.thread >= 0) touch[size_t(a.ref.rank)].push_back(x.thread);
  }
  for (auto& t : touch) {
    std::sort(t.begin(), t.end());
    t.erase(std::unique(t.begin(), t.end()), t.end());
  }
  std::vector<int32_t> tmap(g.threads.size(), -1);
  for (int32_t r = 0; r < nranks; ++r) {
    const auto& T = touch[size_t(r)];
    if (T.empty()) continue;
    const size_t w = T.size();
    for (size_t k = 0; k < w; ++k) tmap[size_t(T[k])] = int32_t(k);
    // Vector clocks restricted to the threads that touch rank r: the running
    // clock of each thread, and snapshots of nodes that have ordering edges
    // out of them. Entry = position + 1 of the latest step of that thread
    // known to happen before (0: none).
    size_t snap_nodes = 0;
    for (size_t i = 0; i < n; ++i) snap_nodes += out_edge[i];
    if ((snap_nodes + g.threads.size()) * w > (size_t(1) << 27))
      throw Error(ErrId::import_E012,
                  fmt::format("{} thread blocks touch the memory of gpu {}: too many to check for races", w, r),
                  g.nodes.empty() ? SrcLoc{} : g.nodes.front().loc);
    std::vector<uint32_t> thread_vc(g.threads.size() * w, 0);
    std::vector<int64_t> snap_at(n, -1);
    std::vector<uint32_t> snaps;
    std::vector<uint32_t> vc(w);
    struct CellState {
      int32_t last_write = -1;
      std::vector<int32_t> reads;
    };
    std::unordered_map<int64_t, CellState> cells;
    auto hb = [&](int32_t a) {  // does node a happen before the node whose clock is `vc`?
      const Node& x = g.nodes[size_t(a)];
      int32_t k = tmap[size_t(x.thread)];
      return k >= 0 && vc[size_t(k)] >= uint32_t(x.pos) + 1;
    };
    auto race = [&](int32_t a, int32_t b, const VRef &ref, bool a_writes,
                    bool b_writes) {
      const int32_t ka = tmap[size_t(g.nodes[size_t(a)].thread)];
      throw Error(
          ErrId::import_E009,
          fmt::format(
              "race on {}: {} {} it and {} {} it, and nothing orders the two "
              "(in this {} reading of the file){}",
              g.describe(ref), g.where(a), a_writes ? "writes" : "reads",
              g.where(b), b_writes ? "writes" : "reads",
              v.inplace() ? "in-place" : "out-of-place",
              explain_unordered(g, a, b, ka >= 0 ? vc[size_t(ka)] : 0)),
          g.nodes[size_t(b)].loc, hint);
    };
    std::unordered_map<int64_t, VRef> first_ref;  // for messages: how the last writer named the cell
    for (int32_t id : order) {
      const Node& x = g.nodes[size_t(id)];
      std::fill(vc.begin(), vc.end(), 0);
      if (x.thread >= 0) {
        const uint32_t* t = &thread_vc[size_t(x.thread) * w];
        for (size_t k = 0; k < w; ++k) vc[k] = t[k];
      }
      for (int32_t p : x.preds) {
        int64_t at = snap_at[size_t(p)];
        if (at < 0) continue;
        for (size_t k = 0; k < w; ++k) vc[k] = std::max(vc[k], snaps[size_t(at) + k]);
      }
      if (x.thread >= 0) {
        int32_t k = tmap[size_t(x.thread)];
        if (k >= 0) vc[size_t(k)] = uint32_t(x.pos) + 1;
        uint32_t* t = &thread_vc[size_t(x.thread) * w];
        for (size_t j = 0; j < w; ++j) t[j] = vc[j];
      }
      if (out_edge[size_t(id)]) {
        snap_at[size_t(id)] = int64_t(snaps.size());
        snaps.insert(snaps.end(), vc.begin(), vc.end());
      }
      for (const Access& a : x.acc) {
        if (a.ref.rank != r || x.thread < 0) continue;
        for (int32_t k = 0; k < a.ref.count; ++k) {
          VRef one{a.ref.rank, a.ref.buf, a.ref.index + k, 1};
          int64_t c = v.cell(one.rank, one.buf, one.index);
          CellState& st = cells[c];
          if (st.last_write >= 0 && st.last_write != id && !hb(st.last_write))
            race(st.last_write, id, one, true, a.write);
          if (a.write) {
            for (int32_t rd : st.reads)
              if (rd != id && !hb(rd)) race(rd, id, one, false, true);
            st.reads.clear();
            st.last_write = id;
          } else if (st.reads.empty() || st.reads.back() != id) {
            // Reads ordered after an earlier read of this cell subsume it.
            if (!st.reads.empty() && hb(st.reads.back())) st.reads.back() = id;
            else st.reads.push_back(id);
          }
        }
      }
    }
    for (int32_t t : T) tmap[size_t(t)] = -1;
  }
}

// ---- Emitter -------------------------------------------------------------------

Emitter::Emitter(const Graph& g, const std::vector<int32_t>& order, const View& v, ir::Schedule& s,
                 int32_t scratch_base)
    : v_(v), s_(s) {
  next_slot_.assign(size_t(v.geo().nranks), scratch_base);
  // 2: never written by the file (until proven otherwise), 0: not yet
  // written, 1: written. Only cells read as initial values get entries in
  // last_init_read_ / init_users_, so the cost follows the file, not the
  // buffer sizes.
  written_.assign(size_t(v.ncells()), 2);
  for (size_t t = 0; t < order.size(); ++t) {
    const Node& x = g.nodes[size_t(order[t])];
    for (const Access& a : x.acc)
      for (int32_t k = 0; k < a.ref.count; ++k) {
        int64_t c = v.cell(a.ref.rank, a.ref.buf, a.ref.index + k);
        if (a.write)
          written_[size_t(c)] = 0;
        else if (written_[size_t(c)] == 2)
          last_init_read_[c] = int32_t(t);
      }
  }
  for (auto& [c, t] : last_init_read_)
    if (auto in = v.info(c).init) init_users_[canon(*in)].push_back(c);
}

std::optional<ir::Ref> Emitter::init_of(int64_t c) const {
  auto it = init_override_.find(c);
  if (it != init_override_.end()) return it->second;
  return v_.info(c).init;
}

int64_t Emitter::canon(const ir::Ref& r) const {
  int64_t space = 0, idx = r.index;
  switch (r.buf) {
    case ir::Buf::input:
      if (auto o = ir::inplace_output_of_input(s_, r.rank, r.index)) {
        space = 1;
        idx = *o;
      }
      break;
    case ir::Buf::output: space = 1; break;
    case ir::Buf::scratch: space = 2; break;
  }
  return ((int64_t(r.rank) * 3 + space) << 32) | int64_t(uint32_t(idx));
}

void Emitter::materialise_in_place_inputs(const SrcLoc& loc) {
  loc_ = loc;
  std::vector<ir::Ref> dst, src;
  for (int64_t c = 0; c < v_.ncells(); ++c) {
    if (written_[size_t(c)] != 2) continue;
    View::Cell info = v_.info(c);
    if (!info.init || !info.home || info.home->buf != ir::Buf::output) continue;
    dst.push_back(*info.home);
    src.push_back(*info.init);
  }
  if (dst.empty()) return;
  // No before_write: in-place these copies are no-ops, so they clobber nothing.
  push(ir::OpKind::copy, {dst}, {src}, true);
}

void Emitter::begin_node(int32_t order_index, const SrcLoc& loc) {
  cur_ = order_index;
  loc_ = loc;
}

std::optional<ir::Ref> Emitter::home_of(int64_t c) const {
  auto it = private_home_.find(c);
  if (it != private_home_.end()) return it->second;
  return v_.info(c).home;
}

ir::Ref Emitter::home(int64_t c) {
  if (auto h = home_of(c)) return *h;
  ir::Ref h = fresh(v_.cell_rank(c), 1).front();
  private_home_[c] = h;
  return h;
}

std::vector<ir::Ref> Emitter::read(const VRef& r) {
  std::vector<ir::Ref> out;
  out.reserve(size_t(r.count));
  for (int32_t k = 0; k < r.count; ++k) {
    int64_t c = v_.cell(r.rank, r.buf, r.index + k);
    std::optional<ir::Ref> in;
    if (written_[size_t(c)] != 1) in = init_of(c);
    out.push_back(in ? *in : home(c));
  }
  return out;
}

std::vector<ir::Ref> Emitter::write(const VRef& r) {
  // Private homes of one write get consecutive slots, so the op stays one op.
  int32_t missing = 0;
  for (int32_t k = 0; k < r.count; ++k)
    if (!home_of(v_.cell(r.rank, r.buf, r.index + k))) ++missing;
  if (missing > 0) {
    auto slots = fresh(r.rank, missing);
    size_t j = 0;
    for (int32_t k = 0; k < r.count; ++k) {
      int64_t c = v_.cell(r.rank, r.buf, r.index + k);
      if (!home_of(c)) private_home_[c] = slots[j++];
    }
  }
  std::vector<ir::Ref> out;
  out.reserve(size_t(r.count));
  for (int32_t k = 0; k < r.count; ++k) out.push_back(*home_of(v_.cell(r.rank, r.buf, r.index + k)));
  return out;
}

void Emitter::mark_written(const VRef& r) {
  for (int32_t k = 0; k < r.count; ++k) written_[size_t(v_.cell(r.rank, r.buf, r.index + k))] = 1;
}

std::vector<ir::Ref> Emitter::fresh(int32_t rank, int32_t count) {
  std::vector<ir::Ref> out;
  int32_t& next = next_slot_[size_t(rank)];
  for (int32_t k = 0; k < count; ++k) out.push_back(ir::Ref{rank, ir::Buf::scratch, next++, 1});
  return out;
}

int32_t Emitter::capture(int32_t sender, int32_t receiver, std::vector<ir::Ref> refs) {
  int32_t id = int32_t(flights_.size());
  for (const ir::Ref& r : refs) flight_users_[canon(r)].push_back(id);
  flights_.push_back(Flight{sender, receiver, std::move(refs), true});
  return id;
}

static void drop_user(std::unordered_map<int64_t, std::vector<int32_t>>& m, int64_t key, int32_t id) {
  auto it = m.find(key);
  if (it == m.end()) return;
  auto& v = it->second;
  v.erase(std::remove(v.begin(), v.end(), id), v.end());
  if (v.empty()) m.erase(it);
}

std::vector<ir::Ref> Emitter::consume(int32_t f) {
  Flight& fl = flights_[size_t(f)];
  MK_CHECK(fl.live, "a transfer is received twice");
  fl.live = false;
  for (const ir::Ref& r : fl.refs) drop_user(flight_users_, canon(r), f);
  return std::move(fl.refs);
}

void Emitter::materialise(int32_t f) {
  Flight& fl = flights_[size_t(f)];
  auto fifo = fresh(fl.receiver, int32_t(fl.refs.size()));
  std::vector<ir::Ref> old = fl.refs;
  for (const ir::Ref& r : old) drop_user(flight_users_, canon(r), f);
  push(ir::OpKind::copy, {fifo}, {old}, true);
  flights_[size_t(f)].refs = std::move(fifo);  // fresh slots: nothing else writes them
}

void Emitter::before_write(const std::vector<std::vector<ir::Ref>>& dsts, const std::vector<ir::Ref>* copy_src) {
  for (const auto& d : dsts)
    for (size_t k = 0; k < d.size(); ++k) {
      const ir::Ref& r = d[k];
      const int64_t x = canon(r);
      // A copy into the storage it reads from (an input chunk into the output
      // chunk it aliases) leaves the value as it is: it clobbers nothing.
      if (copy_src && canon((*copy_src)[k]) == x) continue;
      // 1. transfers still holding a lazy reference to this storage
      auto fu = flight_users_.find(x);
      if (fu != flight_users_.end()) {
        std::vector<int32_t> ids = fu->second;
        for (int32_t f : ids)
          if (flights_[size_t(f)].live) materialise(f);
      }
      // 2. input chunks this write clobbers under in-place aliasing, that are
      //    still to be read as initial values: save them first
      auto iu = init_users_.find(x);
      if (iu == init_users_.end()) continue;
      std::vector<int64_t> cells = std::move(iu->second);
      init_users_.erase(iu);
      for (int64_t c : cells) {
        std::optional<ir::Ref> in = init_of(c);
        if (written_[size_t(c)] == 1 || !in || canon(*in) != x) continue;
        if (last_init_read_.at(c) <= cur_) continue;  // never read as initial value again
        ir::Ref save = fresh(in->rank, 1).front();
        push(ir::OpKind::copy, {{save}}, {{*in}}, true);
        init_override_[c] = save;
      }
    }
}

void Emitter::emit(ir::OpKind kind, const std::vector<std::vector<ir::Ref>>& dsts,
                   const std::vector<std::vector<ir::Ref>>& srcs) {
  before_write(dsts, kind == ir::OpKind::copy ? &srcs.front() : nullptr);
  push(kind, dsts, srcs, false);
}

void Emitter::push(ir::OpKind kind, const std::vector<std::vector<ir::Ref>>& dsts,
                   const std::vector<std::vector<ir::Ref>>& srcs, bool count_staging) {
  MK_CHECK(!dsts.empty() && !srcs.empty(), "an op needs operands");
  const size_t n = dsts.front().size();
  for (const auto& d : dsts) MK_CHECK(d.size() == n, "operands differ in length");
  for (const auto& x : srcs) MK_CHECK(x.size() == n, "operands differ in length");
  auto next_of = [](const ir::Ref& a, const ir::Ref& b) {
    return a.rank == b.rank && a.buf == b.buf && int64_t(b.index) == int64_t(a.index) + 1;
  };
  size_t k = 0;
  while (k < n) {
    size_t e = k + 1;
    while (e < n) {
      bool ok = true;
      for (const auto& d : dsts) ok = ok && next_of(d[e - 1], d[e]);
      for (const auto& x : srcs) ok = ok && next_of(x[e - 1], x[e]);
      if (!ok) break;
      ++e;
    }
    const int32_t len = int32_t(e - k);
    ir::Op op;
    op.kind = kind;
    for (const auto& x : srcs) op.srcs.push_back(ir::Ref{x[k].rank, x[k].buf, x[k].index, len});
    for (const auto& d : dsts) op.dsts.push_back(ir::Ref{d[k].rank, d[k].buf, d[k].index, len});
    bool self_copy = kind == ir::OpKind::copy;
    for (const auto& d : op.dsts) self_copy = self_copy && d == op.srcs[0];
    if (!self_copy) {
      if (kind == ir::OpKind::copy) {
        op.rank = op.srcs[0].rank;  // push, like the DSL's default
      } else {
        bool same = true;
        for (const auto& x : op.srcs) same = same && x.rank == op.srcs[0].rank;
        op.rank = same ? op.srcs[0].rank : op.dsts[0].rank;
      }
      op.id = int32_t(s_.ops.size());
      op.loc = loc_;
      s_.ops.push_back(std::move(op));
      if (count_staging) ++staging_;
    }
    k = e;
  }
}

void Emitter::finish() {
  for (int32_t x : next_slot_) s_.scratch = std::max(s_.scratch, x);
}

}  // namespace mk::importers::detail
