#include "runtime/comm/lifecycle.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <optional>
#include <thread>
#include <utility>

#include "runtime/comm/comm.hpp"
#include "runtime/driver/cuda_driver.hpp"
#include "runtime/launch/enqueue.hpp"
#include "runtime/api/handles.hpp"
#include "runtime/api/status.hpp"

namespace mk::rt {

namespace {

// How long destroy/abort wait for calls in progress on other threads before
// leaving the freeing to the last of them.
constexpr int64_t kCallDrainMs = 10000;

void init_body(const std::shared_ptr<Comm>& c, int nranks, const mkUniqueId& id, int rank, int device) {
  try {
    comm_init_rank(*c, nranks, id, rank, device);
    c->state.store(int(CommState::ready));
    // An abort that came after init's last check of `closing` but before
    // `ready` skipped raising the abort words (raise_abort leaves an
    // initialising communicator alone): raise them now.
    // Only an abort (a destroy of an initialising communicator sets `aborted`
    // too): a plain destroy of a ready one must not stop the peers.
    if (c->aborted.load()) c->raise_abort();
  } catch (const RtError& e) {
    c->set_error(e.code(), e.what());
    c->state.store(int(CommState::failed));
    throw;
  } catch (const std::exception& e) {
    c->set_error(mkInternalError, std::string("internal error: ") + e.what());
    c->state.store(int(CommState::failed));
    throw;
  }
}

}  // namespace

mkComm_t lifecycle_init_rank(int nranks, const mkUniqueId& id, int rank, const mkConfig_t* config,
                             bool* in_progress) {
  auto c = std::make_shared<Comm>();
  c->config = comm_config_from_env();
  apply_user_config(&c->config, config);
  const int device = current_device();  // the caller's (cudaSetDevice), as NCCL does
  *in_progress = false;
  if (c->config.blocking) {
    init_body(c, nranks, id, rank, device);
    return publish(std::move(c));
  }
  // Nonblocking: the handle now, the work on a thread that holds a reference
  // (abort interrupts its bootstrap waits; destroy waits for it).
  mkComm_t h = publish(c);
  std::thread([c, nranks, id, rank, device] {
    try {
      init_body(c, nranks, id, rank, device);
    } catch (...) {  // recorded in the communicator: mkCommGetAsyncError reports it
    }
  }).detach();
  *in_progress = true;
  return h;
}

std::vector<mkComm_t> lifecycle_init_all(int ndev, const int* devlist) {
  auto comms = comm_init_all(ndev, devlist, comm_config_from_env());
  std::vector<mkComm_t> out;
  for (auto& c : comms) out.push_back(publish(c));
  return out;
}

void lifecycle_close(mkComm_t h, bool abort) {
  acquire(h);  // the usual error for NULL or a dead handle
  std::shared_ptr<Comm> c = retire(h);
  if (!c) fail(mkInvalidArgument, "invalid communicator: destroyed or aborted by another thread");
  c->closing.store(true);
  // Destroying a communicator whose nonblocking init still runs cancels the
  // init (its bootstrap waits return now), as an abort does: nothing waits
  // for peers that may never come.
  if (abort || c->state.load() == int(CommState::initializing)) {
    c->aborted.store(true);
    c->raise_abort();
  }
  // Calls still inside on other threads fail at their next check; let them
  // leave. If one takes longer, it frees the communicator when it returns.
  // An abort does not wait for calls inside a plan compile (seconds): they
  // fail when it ends, and the last reference frees.
  wait_sole_owner(c, kCallDrainMs, /*unless_compiling=*/abort);
  // ~Comm waits (bounded) for this communicator's kernels, then frees.
}

void lifecycle_finalize(mkComm_t h) {
  std::shared_ptr<Comm> c = acquire(h);
  c->check_usable("mkCommFinalize");
  const int64_t bound = c->config.timeout_ns == 0 ? -1 : int64_t(c->config.timeout_ns / 1000000) + 5000;
  if (!c->wait_idle(bound))
    fail(mkRemoteError, "mkCommFinalize: this communicator's kernels did not finish within the watchdog's timeout");
  c->check_usable("mkCommFinalize");  // an error of the last kernels is reported here
  c->state.store(int(CommState::finalized));
}

mkResult_t lifecycle_async_error(mkComm_t h, std::string* message) {
  std::shared_ptr<Comm> c = acquire(h);
  const mkResult_t r = c->poll_async_error();
  if (r != mkSuccess && r != mkInProgress) {
    *message = c->error_message();
    c->set_last_error(*message);
  }
  return r;
}

// ---- split ------------------------------------------------------------------

namespace {

// What each rank of the parent contributes to a split (fixed layout: it
// travels as bytes between processes of one mKernel version).
struct SplitEntry {
  int32_t color, key, rank, share;
  SharedRegion region;  // what this rank's parent would cede (share only)
};

// Ranks of the new communicator of `color`, ordered by (key, parent rank).
std::vector<SplitEntry> members_of(const std::vector<SplitEntry>& all, int color) {
  std::vector<SplitEntry> m;
  for (const auto& e : all)
    if (e.color == color) m.push_back(e);
  std::sort(m.begin(), m.end(),
            [](const SplitEntry& a, const SplitEntry& b) { return a.key != b.key ? a.key < b.key : a.rank < b.rank; });
  return m;
}

// The smallest regions worth sharing; below them a child gets its own arena.
constexpr int64_t kMinSharedFlags = 16 << 10, kMinSharedScratch = 1 << 20;

// Whether the children share their parents' memory, and which region: the
// same answer on every rank (it depends only on what every rank sent).
std::optional<SharedRegion> decide_share(const std::vector<SplitEntry>& all) {
  int asked = 0;
  for (const auto& e : all) asked += e.share != 0;
  if (asked == 0) return std::nullopt;
  if (asked != int(all.size())) {
    int yes = 0, no = 0;
    for (const auto& e : all) (e.share ? yes : no) = e.rank;
    fail(mkInvalidUsage, fmt::format("mkCommSplit: ranks disagree on splitShare (rank {} asks to share the parent's "
                                     "memory, rank {} does not); pass the same config on every rank",
                                     yes, no));
  }
  const SharedRegion r = all[0].region;
  for (const auto& e : all)
    if (!(e.region == r)) {
      debug_log(fmt::format("mkCommSplit: splitShare ignored: the parent's free memory differs between ranks 0 and "
                            "{} (they did not make the same calls); the children allocate their own",
                            e.rank));
      return std::nullopt;
    }
  if (r.flag_hi - r.flag_lo < kMinSharedFlags || r.scratch_hi - r.scratch_lo < kMinSharedScratch) {
    debug_log(fmt::format("mkCommSplit: splitShare ignored: only {} bytes of scratch and {} of flags are left to "
                          "share; the children allocate their own",
                          r.scratch_hi - r.scratch_lo, r.flag_hi - r.flag_lo));
    return std::nullopt;
  }
  return r;
}

// Ranks of one process (mkCommInitAll) meet here: each thread posts its
// (color, key) and the communicator it will fill; the last to arrive builds
// every child. Each round keeps its own results until every rank has taken
// its own, so a rank that splits again at once cannot disturb the round
// before.
struct Posted {
  SplitEntry entry;
  std::shared_ptr<Comm> child;  // null for MK_SPLIT_NOCOLOR
};
struct SplitRound {
  std::string error;
  int untaken = 0;
};
struct CliqueSplit {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t round = 0;  // the round being posted to
  std::vector<Posted> posted;
  std::map<uint64_t, SplitRound> done;
};

std::mutex& clique_split_mutex() {
  static std::mutex m;
  return m;
}
std::map<const Clique*, std::shared_ptr<CliqueSplit>>& clique_splits() {
  static std::map<const Clique*, std::shared_ptr<CliqueSplit>> m;
  return m;
}

// What the child of parent rank m[i].rank takes from it when sharing.
ParentMemory parent_memory(const Comm& parent, const std::vector<SplitEntry>& m, const SharedRegion& r) {
  ParentMemory pm;
  pm.arena = parent.arena;
  pm.transport = parent.transport;
  for (const auto& e : m) pm.peer_base.push_back(parent.peer_base.at(size_t(e.rank)));
  pm.region = r;
  return pm;
}

// Builds the children of one round.
std::string build_round(const Comm& parent, const std::vector<Posted>& posted) {
  try {
    std::vector<SplitEntry> all;
    for (const auto& p : posted) all.push_back(p.entry);
    std::vector<Comm*> members;
    {
      std::lock_guard<std::mutex> cl(parent.clique->mu);
      members = parent.clique->members;
    }
    for (const auto& e : all)
      if (!members[size_t(e.rank)]) fail(mkInvalidUsage, "mkCommSplit: a rank of the parent was destroyed");
    const std::optional<SharedRegion> share = decide_share(all);
    if (share)
      for (const auto& e : all) members[size_t(e.rank)]->cede(*share);
    std::vector<int> colors;
    for (const auto& e : all)
      if (e.color != MK_SPLIT_NOCOLOR && std::find(colors.begin(), colors.end(), e.color) == colors.end())
        colors.push_back(e.color);
    for (int col : colors) {
      const auto m = members_of(all, col);
      std::vector<std::shared_ptr<Comm>> children;
      std::vector<int> devs;
      std::vector<ParentMemory> shared;
      for (const auto& e : m) {
        for (const auto& p : posted)
          if (p.entry.rank == e.rank) children.push_back(p.child);
        const Comm& pr = *members[size_t(e.rank)];
        devs.push_back(pr.device);
        if (share) shared.push_back(parent_memory(pr, m, *share));
      }
      comm_init_all(children, devs, share ? &shared : nullptr);
    }
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

// Waits in slices so that an abort of the parent or of the new communicator
// ends the wait at once.
bool stopped(const Comm& parent, const std::shared_ptr<Comm>& child) {
  return parent.closing.load() || (child && child->closing.load());
}

void split_in_process(Comm& parent, const SplitEntry& mine, const std::shared_ptr<Comm>& child) {
  std::shared_ptr<CliqueSplit> s;
  {
    std::lock_guard<std::mutex> lock(clique_split_mutex());
    auto& slot = clique_splits()[parent.clique.get()];
    if (!slot) slot = std::make_shared<CliqueSplit>();
    s = slot;
  }
  std::unique_lock<std::mutex> lock(s->mu);
  const uint64_t my_round = s->round;
  s->posted.push_back({mine, child});
  if (int(s->posted.size()) == parent.nranks) {
    // The last rank builds every child (one process: devices by address).
    SplitRound& r = s->done[my_round];
    r.error = build_round(parent, s->posted);
    r.untaken = parent.nranks;
    s->posted.clear();
    ++s->round;
    s->cv.notify_all();
  } else {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(bootstrap_timeout_ms());
    while (s->done.count(my_round) == 0) {
      const bool late = std::chrono::steady_clock::now() > deadline;
      if (late || stopped(parent, child)) {
        s->posted.erase(std::remove_if(s->posted.begin(), s->posted.end(),
                                       [&](const Posted& p) { return p.entry.rank == parent.rank; }),
                        s->posted.end());
        if (!late) fail(mkInvalidUsage, "mkCommSplit: aborted while waiting for the other ranks");
        fail(mkInvalidUsage, fmt::format("mkCommSplit: rank {} waited {} ms for the other ranks of its "
                                         "mkCommInitAll group; call mkCommSplit from one thread per rank (they "
                                         "meet), every rank of the group",
                                         parent.rank, bootstrap_timeout_ms()));
      }
      s->cv.wait_for(lock, std::chrono::milliseconds(20));
    }
  }
  SplitRound& r = s->done[my_round];
  const std::string error = r.error;
  if (--r.untaken == 0) s->done.erase(my_round);
  if (!error.empty()) fail(mkInvalidUsage, "mkCommSplit: " + error);
}

void split_across(Comm& parent, const SplitEntry& mine, const std::shared_ptr<Comm>& child) {
  // Round 1: everyone's (color, key, share). Round 2: each new communicator's
  // first member publishes a fresh unique id for it.
  auto blobs = parent.boot->allgather(std::string(reinterpret_cast<const char*>(&mine), sizeof mine));
  std::vector<SplitEntry> all;
  for (const auto& b : blobs) {
    if (b.size() != sizeof(SplitEntry)) fail(mkInvalidUsage, "mkCommSplit: malformed exchange");
    SplitEntry e;
    std::memcpy(&e, b.data(), sizeof e);
    all.push_back(e);
  }
  const std::optional<SharedRegion> share = decide_share(all);
  if (share) parent.cede(*share);  // every rank of the parent, NOCOLOR too: offsets stay symmetric
  const std::vector<SplitEntry> m =
      mine.color == MK_SPLIT_NOCOLOR ? std::vector<SplitEntry>{} : members_of(all, mine.color);
  std::string id_blob;
  if (!m.empty() && m[0].rank == parent.rank) {
    mkUniqueId id;
    bootstrap_create_id(&id);
    id_blob.assign(id.internal, sizeof id.internal);
  }
  auto ids = parent.boot->allgather(id_blob);
  if (m.empty()) return;
  const std::string& leader = ids[size_t(m[0].rank)];
  if (leader.size() != sizeof(mkUniqueId)) fail(mkInternalError, "mkCommSplit: the new communicator's id is missing");
  mkUniqueId id;
  std::memcpy(id.internal, leader.data(), sizeof id.internal);
  int newrank = 0;
  while (m[size_t(newrank)].rank != parent.rank) ++newrank;
  std::optional<ParentMemory> pm;
  if (share) pm = parent_memory(parent, m, *share);
  comm_init_rank(*child, int(m.size()), id, newrank, parent.device, pm ? &*pm : nullptr);
  child->state.store(int(CommState::ready));
}

// The split itself: fills `child` (null for MK_SPLIT_NOCOLOR). Records a
// failure in the child, so that a nonblocking split reports it.
void split_body(const std::shared_ptr<Comm>& parent, const SplitEntry& mine, const std::shared_ptr<Comm>& child) {
  try {
    if (parent->nranks == 1) {
      const std::optional<SharedRegion> share = decide_share({mine});
      if (share) parent->cede(*share);
      if (child) {
        std::optional<ParentMemory> pm;
        if (share) pm = parent_memory(*parent, {mine}, *share);
        mkUniqueId none{};
        comm_init_rank(*child, 1, none, 0, parent->device, pm ? &*pm : nullptr);
        child->state.store(int(CommState::ready));
      }
    } else if (parent->clique) {
      split_in_process(*parent, mine, child);
    } else {
      split_across(*parent, mine, child);
    }
    if (child && child->closing.load()) child->raise_abort();  // aborted while it was being built
  } catch (const RtError& e) {
    if (child) {
      child->set_error(e.code(), e.what());
      child->state.store(int(CommState::failed));
    }
    throw;
  } catch (const std::exception& e) {
    if (child) {
      child->set_error(mkInternalError, std::string("internal error: ") + e.what());
      child->state.store(int(CommState::failed));
    }
    throw;
  }
}

}  // namespace

mkComm_t lifecycle_shrink(mkComm_t h, const int* exclude, int nexclude, const mkConfig_t* config, int flags) {
  std::shared_ptr<Comm> parent = acquire(h);
  // A communicator with an asynchronous error (a peer died) may shrink:
  // that is what it is for. One whose init failed, still initialising,
  // finalized, being destroyed or splitting may not.
  const int st = parent->state.load();
  if (st == int(CommState::initializing))
    fail(mkInvalidUsage, "mkCommShrink: the communicator is still being initialised (nonblocking init)");
  if (st == int(CommState::failed)) fail(mkInvalidUsage, "mkCommShrink: the communicator's init failed");
  if (st == int(CommState::finalized))
    fail(mkInvalidUsage, "mkCommShrink: the communicator was finalized; only mkCommDestroy is allowed");
  if (parent->closing.load()) fail(mkInvalidUsage, "mkCommShrink: the communicator is being destroyed");
  if (parent->splits_running.load() != 0)
    fail(mkInvalidUsage, "mkCommShrink: a nonblocking mkCommSplit of this communicator is still running");
  if (flags != MK_SHRINK_DEFAULT && flags != MK_SHRINK_ABORT)
    fail(mkInvalidArgument, fmt::format("mkCommShrink: shrinkFlags {} is not MK_SHRINK_DEFAULT or MK_SHRINK_ABORT", flags));
  if (nexclude < 0 || (nexclude > 0 && !exclude))
    fail(mkInvalidArgument, fmt::format("mkCommShrink: {} excluded ranks{}", nexclude, nexclude > 0 ? " but the list is NULL" : ""));
  std::vector<bool> out(size_t(parent->nranks), false);
  for (int i = 0; i < nexclude; ++i) {
    const int r = exclude[i];
    if (r < 0 || r >= parent->nranks)
      fail(mkInvalidArgument, fmt::format("mkCommShrink: excluded rank {} is outside 0..{}", r, parent->nranks - 1));
    if (out[size_t(r)]) fail(mkInvalidArgument, fmt::format("mkCommShrink: rank {} is excluded twice", r));
    out[size_t(r)] = true;
  }
  if (out[size_t(parent->rank)])
    fail(mkInvalidArgument, fmt::format("mkCommShrink: rank {} calls it but is in its own exclude list (excluded ranks "
                                        "do not call mkCommShrink)",
                                        parent->rank));
  if (parent->clique)
    fail(mkInvalidUsage, "mkCommShrink: ranks of one process (mkCommInitAll) cannot shrink yet; make a new "
                         "communicator of the remaining ranks with mkCommInitAll");
  CommConfig cfg = parent->config;
  apply_user_config(&cfg, config);
  cfg.split_share = 0;  // the parent's memory may be in use by kernels that never end: not shared
  if (flags == MK_SHRINK_ABORT) parent->stop_kernels();
  std::vector<int> keep;
  for (int r = 0; r < parent->nranks; ++r)
    if (!out[size_t(r)]) keep.push_back(r);
  const int newrank = int(std::find(keep.begin(), keep.end(), parent->rank) - keep.begin());
  // The first remaining rank makes the new communicator's id and hands it
  // to the others point to point (an all-gather would wait for the excluded
  // ranks), on the bootstrap's recovery path: a rank that left, an exchange
  // that failed or a rendezvous that ended do not stop it. The list of
  // remaining ranks goes with it: ranks that were given different exclude
  // lists fail instead of making communicators that do not match.
  std::string keep_text;
  for (int r : keep) keep_text += std::to_string(r) + ",";
  mkUniqueId id{};
  if (keep.size() > 1) {
    if (!parent->boot) fail(mkInternalError, "mkCommShrink: the communicator has no bootstrap");
    if (newrank == 0) {
      bootstrap_create_id(&id);
      const std::string msg = std::string(id.internal, sizeof id.internal) + keep_text;
      std::string first_error;
      for (size_t i = 1; i < keep.size(); ++i) {  // every one, even after a failure (the rest would wait)
        try {
          parent->boot->send_recovery(keep[i], msg);
        } catch (const RtError& e) {
          if (first_error.empty()) first_error = e.what();
        }
      }
      if (!first_error.empty()) fail(mkRemoteError, "mkCommShrink: " + first_error);
    } else {
      const std::string got = parent->boot->recv_recovery(keep[0]);
      if (got.size() < sizeof id.internal)
        fail(mkRemoteError, fmt::format("mkCommShrink: rank {} sent no id for the new communicator", keep[0]));
      if (got.substr(sizeof id.internal) != keep_text)
        fail(mkInvalidUsage, fmt::format("mkCommShrink: rank {} keeps ranks {} and this rank {}: every remaining rank "
                                         "must pass the same exclude list",
                                         keep[0], got.substr(sizeof id.internal), keep_text));
      std::memcpy(id.internal, got.data(), sizeof id.internal);
    }
  }
  auto child = std::make_shared<Comm>();
  child->config = cfg;
  child->node_name = parent->node_name;
  comm_init_rank(*child, int(keep.size()), id, newrank, parent->device, nullptr);
  child->state.store(int(CommState::ready));
  debug_log(fmt::format("mkCommShrink: rank {}/{} is rank {}/{} of the new communicator ({} excluded)", parent->rank,
                        parent->nranks, newrank, keep.size(), nexclude));
  return publish(std::move(child));
}

mkComm_t lifecycle_split(mkComm_t h, int color, int key, const mkConfig_t* config, bool* in_progress) {
  std::shared_ptr<Comm> parent = acquire(h);
  parent->check_usable("mkCommSplit");
  *in_progress = false;
  if (color < 0 && color != MK_SPLIT_NOCOLOR)
    fail(mkInvalidArgument, fmt::format("mkCommSplit: color {} is negative (MK_SPLIT_NOCOLOR is {})", color,
                                        MK_SPLIT_NOCOLOR));
  // The child inherits the parent's settings; `config` overrides them.
  CommConfig cfg = parent->config;
  apply_user_config(&cfg, config);
  if (parent->bootstrap_only && cfg.split_share) {  // no memory to share (the same on every rank)
    debug_log("mkCommSplit: splitShare ignored: the parent is bootstrap-only (it spans nodes)");
    cfg.split_share = 0;
  }
  SplitEntry mine{color, key, parent->rank, cfg.split_share, {}};
  if (cfg.split_share) mine.region = parent->propose_shared_region();
  std::shared_ptr<Comm> child;
  if (color != MK_SPLIT_NOCOLOR) {
    child = std::make_shared<Comm>();
    child->config = cfg;
    child->node_name = parent->node_name;
  }
  const bool grouped = group_open();
  if (cfg.blocking && !grouped) {
    split_body(parent, mine, child);
    return child ? publish(std::move(child)) : nullptr;
  }
  // Nonblocking, or inside a group (one thread splitting several ranks of
  // one process, as with NCCL): the new handle now (NULL for NOCOLOR), the
  // work on a thread. Until it ends the parent takes no calls and reports
  // mkInProgress; the child reports its own progress and errors. In a group
  // of blocking communicators mkGroupEnd waits for it and returns its error.
  struct Done {
    std::mutex mu;
    std::condition_variable cv;
    bool finished = false;
    mkResult_t code = mkSuccess;
    std::string error;
  };
  auto done = std::make_shared<Done>();
  mkComm_t out = child ? publish(child) : nullptr;
  parent->splits_running.fetch_add(1);
  std::thread([parent, mine, child, done] {
    mkResult_t code = mkSuccess;
    std::string error;
    try {
      split_body(parent, mine, child);
    } catch (const RtError& e) {
      code = e.code();
      error = e.what();
    } catch (const std::exception& e) {
      code = mkInternalError;
      error = std::string("internal error: ") + e.what();
    }
    if (code != mkSuccess) parent->set_last_error(std::string("mkCommSplit: ") + error);
    parent->splits_running.fetch_sub(1);
    std::lock_guard<std::mutex> lock(done->mu);
    done->finished = true;
    done->code = code;
    done->error = error;
    done->cv.notify_all();
  }).detach();
  if (grouped && cfg.blocking)
    group_defer([done] {
      std::unique_lock<std::mutex> lock(done->mu);
      done->cv.wait(lock, [&] { return done->finished; });
      if (done->code != mkSuccess) fail(done->code, done->error);
    });
  *in_progress = !cfg.blocking;
  return out;
}

}  // namespace mk::rt
