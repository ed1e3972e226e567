#include "compiler/verify/symmetry.hpp"

#include <fmt/format.h>

#include "mk/error.hpp"

namespace mk::verify {

ChainIndex::ChainIndex(const ir::Schedule& s, const std::vector<int32_t>& chain, const std::vector<int32_t>& pos,
                       size_t nchains)
    : chain_(chain), pos_(pos) {
  rank_.assign(nchains, -1);
  tb_.assign(nchains, -1);
  begin_.assign(nchains + 1, 0);
  for (size_t i = 0; i < s.ops.size(); ++i) {
    if (chain[i] < 0) continue;
    const size_t c = size_t(chain[i]);
    rank_[c] = s.ops[i].rank;
    tb_[c] = s.ops[i].tb;
    width_ = std::max(width_, s.ops[i].tb + 2);
    ++begin_[c + 1];
  }
  for (size_t c = 0; c < nchains; ++c) begin_[c + 1] += begin_[c];
  ops_.resize(begin_[nchains]);
  for (size_t i = 0; i < s.ops.size(); ++i)
    if (chain[i] >= 0) ops_[begin_[size_t(chain[i])] + size_t(pos[i]) - 1] = uint32_t(i);
  key_.assign(size_t(s.nranks) * size_t(width_), -1);
  for (size_t c = 0; c < nchains; ++c) key_[size_t(rank_[c]) * size_t(width_) + size_t(tb_[c] + 1)] = int32_t(c);
}

std::vector<std::pair<std::string, std::vector<int32_t>>> candidate_generators(const ir::Schedule& s) {
  const int32_t n = s.nranks;
  const topology::Topology t = ir::topology_of(s);
  std::vector<std::pair<std::string, std::vector<int32_t>>> out;
  auto add = [&](std::string name, auto&& f) {
    std::vector<int32_t> pi(static_cast<size_t>(n));
    for (int32_t r = 0; r < n; ++r) pi[size_t(r)] = f(r);
    // a permutation that moves something, and not one already listed
    std::vector<bool> hit(static_cast<size_t>(n), false);
    bool moves = false;
    for (int32_t r = 0; r < n; ++r) {
      if (pi[size_t(r)] < 0 || pi[size_t(r)] >= n || hit[size_t(pi[size_t(r)])]) return;
      hit[size_t(pi[size_t(r)])] = true;
      moves = moves || pi[size_t(r)] != r;
    }
    if (!moves) return;
    for (auto& [other, q] : out)
      if (q == pi) return;
    out.emplace_back(std::move(name), std::move(pi));
  };
  add("rotation", [&](int32_t r) { return (r + 1) % n; });
  const int32_t g = t.gpus_per_node, nodes = t.nodes;
  if (nodes > 1 && g > 1 && nodes * g == n) {
    add("node rotation", [&](int32_t r) { return (r + g) % n; });
    add("rotation in a node", [&](int32_t r) { return r / g * g + (r % g + 1) % g; });
  }
  const bool pow2 = (n & (n - 1)) == 0;
  if (pow2)
    for (int32_t b = 1; b < n; b <<= 1) add(fmt::format("xor {}", b), [&](int32_t r) { return r ^ b; });
  return out;
}

SymmetryFinder::SymmetryFinder(int32_t n) : n_(n), parent_(size_t(n)), orbits_(size_t(n)) {
  for (int32_t r = 0; r < n; ++r) parent_[size_t(r)] = r;
}

int32_t SymmetryFinder::find_root(int32_t x) {
  while (parent_[size_t(x)] != x) x = parent_[size_t(x)] = parent_[size_t(parent_[size_t(x)])];
  return x;
}

bool SymmetryFinder::transitive() const { return orbits_ == 1; }

bool SymmetryFinder::merges(const std::vector<int32_t>& pi) {
  for (int32_t r = 0; r < n_; ++r)
    if (find_root(r) != find_root(pi[size_t(r)])) return true;
  return false;
}

void SymmetryFinder::accept(std::string name, std::vector<int32_t> pi) {
  for (int32_t r = 0; r < n_; ++r) {
    int32_t a = find_root(r), b = find_root(pi[size_t(r)]);
    if (a == b) continue;
    if (a > b) std::swap(a, b);
    parent_[size_t(b)] = a;
    --orbits_;
  }
  gens_.push_back(std::move(pi));
  names_.push_back(std::move(name));
}

RankSymmetry SymmetryFinder::finish() {
  RankSymmetry sym;
  const size_t n = size_t(n_);
  sym.rep_.assign(n, -1);
  sym.orbits_ = orbits_;
  sym.gens_ = names_;
  sym.members_.resize(n);
  if (sym.trivial()) {
    for (size_t r = 0; r < n; ++r) {
      sym.rep_[r] = int32_t(r);
      sym.members_[r] = {int32_t(r)};
    }
    return sym;  // no group elements needed: every rank is its own class
  }
  sym.to_.assign(n * n, 0);
  sym.from_.assign(n * n, 0);
  std::vector<bool> done(n, false);
  std::vector<int32_t> queue;
  for (size_t root = 0; root < n; ++root) {
    if (done[root]) continue;
    // The lowest rank of each orbit is met first: it is the representative,
    // and its element is the identity.
    done[root] = true;
    sym.rep_[root] = int32_t(root);
    for (size_t x = 0; x < n; ++x) sym.to_[root * n + x] = int32_t(x);
    queue.assign(1, int32_t(root));
    for (size_t k = 0; k < queue.size(); ++k) {
      const size_t y = size_t(queue[k]);
      for (const auto& pi : gens_) {
        const size_t z = size_t(pi[y]);
        if (done[z]) continue;
        done[z] = true;
        sym.rep_[z] = int32_t(root);
        // g_z = pi o g_y takes the representative to pi(y) = z
        for (size_t x = 0; x < n; ++x) sym.to_[z * n + x] = pi[size_t(sym.to_[y * n + x])];
        queue.push_back(int32_t(z));
      }
    }
  }
  for (size_t r = 0; r < n; ++r) {
    sym.members_[size_t(sym.rep_[r])].push_back(int32_t(r));
    for (size_t x = 0; x < n; ++x) sym.from_[r * n + size_t(sym.to_[r * n + x])] = int32_t(x);
  }
  MK_CHECK(find_root(0) == 0, "symmetry: union-find and BFS disagree");
  return sym;
}

std::string RankSymmetry::describe() const {
  std::string g;
  for (const auto& name : gens_) g += (g.empty() ? "" : ", ") + name;
  return fmt::format("{} class{} of {} ranks{}", orbits_, orbits_ == 1 ? "" : "es", nranks(),
                     g.empty() ? "" : " (" + g + ")");
}

}  // namespace mk::verify
