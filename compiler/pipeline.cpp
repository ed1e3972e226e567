#include "compiler/pipeline.hpp"

#include <fmt/format.h>

#include <chrono>
#include <new>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "compiler/common/side_by_side.hpp"
#include "compiler/verify/clocks.hpp"
#include "compiler/verify/hb.hpp"
#include "compiler/verify/verify.hpp"

namespace mk::compiler {

const std::vector<std::string>& pass_names() {
  static const std::vector<std::string> names = {"build",       "verify", "stage",    "fuse",
                                                 "analyze",     "parallelize", "assign", "protocol",
                                                 "sync"};
  return names;
}

namespace {

void set_topology(ir::Schedule& s, const std::optional<topology::Topology>& t) {
  if (!t) return;
  if (t->nranks() != s.nranks)
    throw Error(ErrId::cli_E011,
                fmt::format("topology {} has {} ranks but the schedule has {}", t->name(), t->nranks(), s.nranks));
  if (s.topology && !(*s.topology == *t))
    throw Error(ErrId::cli_E011,
                fmt::format("'{}' was built for topology {} but is lowered for {}", s.name, s.topology->name(),
                            t->name()),
                {}, "build and lower with the same --topology");
  s.topology = *t;
}

// verify_each: a pass that breaks the schedule is a compiler bug, named here.
void check_after(std::string_view pass, const ir::Schedule& s) {
  try {
    verify::verify_all(s);
  } catch (const Error& e) {
    throw InternalError("pass '" + std::string(pass) + "' broke its guarantees: " + e.what());
  }
}

}  // namespace

// Hands the heap's free pages back to the system between the big steps of
// a big schedule's lowering. glibc keeps what a pass freed (below its mmap
// threshold, which rises as big blocks are freed) resident for reuse; at
// 1024 ranks that was a quarter of the peak RSS while the other bucket was at
// its peak. About 10-20 ms a call there; nothing for small schedules.
static void release_free_memory(const ir::Schedule& s) {
#if defined(__GLIBC__)
  if (s.ops.size() > 100000) malloc_trim(0);
#else
  (void)s;
#endif
}

static Lowered lower_passes(ir::Schedule s, const LowerOptions& o, std::string_view* done) {
  auto t0 = std::chrono::steady_clock::now();
  std::string before;  // the previous pass's IR text, only while someone watches
  // `ms`: the pass's own time where it did not run just before (sync runs
  // the buckets side by side).
  auto dump = [&](std::string_view pass, const ir::Schedule& x, double ms = -1) {
    *done = pass;
    if (o.verify_each) check_after(pass, x);
    if (!o.on_pass) return;
    PassInfo info;
    info.ms = ms >= 0 ? ms : std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::string now = ir::print(x);
    info.changed = pass == "build" || pass == "protocol" || now != before;  // a bucket starts at protocol
    before = std::move(now);
    o.on_pass(pass, x, info);
    t0 = std::chrono::steady_clock::now();  // the observer's time is not the next pass's
  };
  set_topology(s, o.topology);
  s.one_pass = false;  // a pass decides, never the input (an IR file may say anything)
  s.lamport = false;
  dump("build", s);

  // Plans are for root 0 (the kernel relabels ranks for the caller's root): a
  // schedule written for another root (IR JSON may say so) is relabelled first.
  Lowered out;
  s = verify::rotate_root(std::move(s), 0);
  // Prove the author's program before touching it; orders as written come
  // from the same run. Only rooted schedules are relabelled, and in them one
  // rank (the root) holds each reduced chunk, so no two ranks' orders are
  // compared and no message names a relabelled rank.
  verify::verify_semantics(s, o.orders ? &out.nondeterministic_written : nullptr);
  dump("verify", s);
  s = passes::compact_scratch(std::move(s));  // sparse slot numbers would size everything below

  // Zero-copy: user buffers are mapped into peers, so remote accesses stay as
  // written. A schedule that never touches a peer's user buffer gains nothing
  // from it (only the entry/exit barriers) and is lowered as usual.
  auto remote_user = [](const ir::Schedule& x) {
    for (const auto& op : x.ops)
      for (const auto* list : {&op.srcs, &op.dsts})
        for (const auto& r : *list)
          if (r.buf != ir::Buf::scratch && r.rank != op.rank) return true;
    return false;
  };
  if (o.zero_copy && remote_user(s))
    s.zero_copy = true;
  else
    s = passes::stage_remote(std::move(s));
  s = passes::stage_network(std::move(s));  // across nodes: puts (after staging, so only scratch is reached)
  dump("stage", s);

  s = passes::fuse(std::move(s));
  dump("fuse", s);

  // positions and final reductions; re-proves the rewritten program (and,
  // asked, its orders: the variants' unless their data ops differ)
  verify::analyze(s, o.orders ? &out.nondeterministic_lowered : nullptr);
  dump("analyze", s);

  s = passes::parallelize(std::move(s), o.instances);
  dump("parallelize", s);

  s = passes::assign_tbs(std::move(s), o.max_tbs);
  dump("assign", s);

  out.buckets = passes::plan_buckets(s, o.min_bytes, o.max_bytes, o.proto);
  const double plan_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const size_t nb = out.buckets.size();
  // Each bucket its own sync and proof (plan_buckets makes at most one per
  // protocol, and sync depends on the protocol).
  std::vector<ir::Schedule> vs(nb);
  // Observers see protocol then sync for each bucket in turn, as if they ran
  // one after the other: keep the schedules after protocol for them.
  const bool watched = o.on_pass || o.verify_each;
  std::vector<ir::Schedule> chosen;
  std::vector<double> chose_ms;
  for (size_t b = 0; b < nb; ++b) {
    const auto t = std::chrono::steady_clock::now();
    if (watched) chosen.push_back(passes::choose_protocol(s, out.buckets[b]));
    chose_ms.push_back((b == 0 ? plan_ms : 0) +
                       std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count());
  }
  // The buckets' sync and proof, side by side where there are cores (LL and
  // simple: about half the time at 1024 ranks), each with its share of the
  // clock memory; then, in the same worker, on_variant.
  const size_t budget = verify::kClockBudget / std::max<size_t>(1, nb);
  std::vector<double> ms(nb, 0);
  std::vector<verify::Orders> orders(nb);  // of variants whose data ops differ from `s`
  side_by_side(nb, [&](size_t b) {
    const auto t = std::chrono::steady_clock::now();
    ir::Schedule& v = vs[b];
    v = passes::choose_protocol(s, out.buckets[b]);  // the copy of `s` here: side by side too
    const bool one_pass = o.proto.one_pass && passes::one_pass_possible(v, out.buckets[b].max_bytes);
    if (one_pass) v = passes::one_block(std::move(v));
    // The access needs once for the sync and its proof (hb.hpp DataNeeds):
    // `s`'s ops are those insert_sync starts from, with this bucket's protocol.
    {
      verify::DataNeeds needs = verify::data_needs(v, v.proto == ir::Proto::ll);
      release_free_memory(v);
      v = passes::insert_sync(std::move(v), budget, &needs);
      v = passes::insert_flush(std::move(v));  // puts' sources: local completion before reuse
      // Network operations are proved in their model, whose needs are its
      // own: these go before it is built (at 1024 ranks, hundreds of MB).
      const bool network = verify::has_network_ops(v);
      if (network) needs = verify::DataNeeds{};
      release_free_memory(v);
      // Final proof: meaning, bounds, pairing, no deadlock, no race. Analyze
      // proved the meaning; parallelize and assign_tbs change no data op
      // (verify_each re-proves after each in the tests), and choose_protocol
      // and insert_sync may only add sync ops: when the data ops are still
      // exactly those of `s`, proving the meaning again would repeat the same
      // symbolic run (seconds at 1024 ranks).
      if (!ir::same_data_ops(v, s)) verify::verify_semantics(v, o.orders ? &orders[b] : nullptr);
      if (network && nb == 1) {
        // The network proof needs nothing of `s` and no other bucket does:
        // its ops go before the model is built (at 1024 ranks, a fifth of
        // the peak).
        std::vector<ir::Op>().swap(s.ops);
        release_free_memory(v);
      }
      if (network)
        verify::verify_sync_network(v, budget);  // its model made of its own ops, then given back
      else
        verify::verify_sync_budget(v, budget, verify::SymMode::automatic, {&s, &needs});
    }
    if (one_pass) v = passes::mark_one_pass(std::move(v), out.buckets[b].max_bytes);
    release_free_memory(v);
    ms[b] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
    if (o.on_variant && !watched) o.on_variant(b, nb, v);
  });
  for (size_t b = 0; b < nb; ++b) {
    if (watched) dump("protocol", chosen[b], chose_ms[b]);
    dump("sync", vs[b], ms[b]);
  }
  if (o.on_variant && watched)
    for (size_t b = 0; b < nb; ++b) o.on_variant(b, nb, vs[b]);
  for (size_t b = 0; b < nb && out.nondeterministic_lowered.empty(); ++b)
    out.nondeterministic_lowered = std::move(orders[b]);
  for (auto& v : vs) out.variants.push_back(std::move(v));
  return out;
}

Lowered lower(ir::Schedule s, const LowerOptions& o) {
  const std::string name = s.name;
  const int32_t nranks = s.nranks;
  const size_t ops = s.ops.size();
  std::string_view done = "none";
  try {
    return lower_passes(std::move(s), o, &done);
  } catch (const std::bad_alloc&) {
    // A size limit, not a crash: the analyses grow with the op count.
    throw Error(ErrId::jit_E005,
                fmt::format("schedule '{}' for {} ranks ({} ops) is too large to lower on this machine: out of "
                            "memory after pass '{}'",
                            name, nranks, ops, done),
                {}, "use fewer ranks or chunks; `mkc lower --dump-after=PASS` shows each pass's time");
  }
}

const ir::Schedule& variant_for(const Lowered& l, int64_t bytes) {
  MK_CHECK(!l.variants.empty(), "a lowered schedule has at least one variant");
  for (size_t i = 0; i < l.buckets.size(); ++i)
    if (bytes >= l.buckets[i].min_bytes && (l.buckets[i].max_bytes < 0 || bytes <= l.buckets[i].max_bytes))
      return l.variants[i];
  return l.variants.back();
}

}  // namespace mk::compiler
