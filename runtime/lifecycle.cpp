#include "runtime/lifecycle.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <thread>
#include <utility>

#include "runtime/comm.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/handles.hpp"
#include "runtime/status.hpp"

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
    if (c->closing.load()) c->raise_abort();
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
  if (abort) {
    c->aborted.store(true);
    c->raise_abort();
  }
  // Calls still inside on other threads fail at their next check; let them
  // leave. If one takes longer, it frees the communicator when it returns.
  wait_sole_owner(c, kCallDrainMs);
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

struct SplitEntry {
  int32_t color, key, rank;
};

// Ranks of the new communicator of `color`, ordered by (key, parent rank).
std::vector<SplitEntry> members_of(std::vector<SplitEntry> all, int color) {
  std::vector<SplitEntry> m;
  for (const auto& e : all)
    if (e.color == color) m.push_back(e);
  std::sort(m.begin(), m.end(),
            [](const SplitEntry& a, const SplitEntry& b) { return a.key != b.key ? a.key < b.key : a.rank < b.rank; });
  return m;
}

// Ranks of one process (mkCommInitAll) meet here: each thread posts its
// (color, key); the last to arrive builds every child communicator. Each
// round keeps its own results until every rank has taken its own, so a rank
// that splits again at once cannot disturb the round before.
struct SplitRound {
  std::vector<std::shared_ptr<Comm>> results;  // by parent rank
  std::string error;
  int untaken = 0;
};
struct CliqueSplit {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t round = 0;  // the round being posted to
  std::vector<SplitEntry> posted;
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

// Builds the children of one round; on failure none survives.
SplitRound build_round(const Comm& parent, const std::vector<SplitEntry>& all) {
  SplitRound out;
  out.results.assign(size_t(parent.nranks), nullptr);
  out.untaken = parent.nranks;
  try {
    std::vector<int> colors;
    for (const auto& e : all)
      if (e.color != MK_SPLIT_NOCOLOR && std::find(colors.begin(), colors.end(), e.color) == colors.end())
        colors.push_back(e.color);
    std::vector<Comm*> members;
    {
      std::lock_guard<std::mutex> cl(parent.clique->mu);
      members = parent.clique->members;
    }
    for (int col : colors) {
      auto m = members_of(all, col);
      std::vector<int> devs;
      for (const auto& e : m) {
        if (!members[size_t(e.rank)]) fail(mkInvalidUsage, "mkCommSplit: a rank of the parent was destroyed");
        devs.push_back(members[size_t(e.rank)]->device);
      }
      auto children = comm_init_all(int(devs.size()), devs.data(), parent.config);
      for (size_t i = 0; i < m.size(); ++i) out.results[size_t(m[i].rank)] = children[i];
    }
  } catch (const std::exception& e) {
    out.error = e.what();
    out.results.assign(size_t(parent.nranks), nullptr);  // the children built so far go
  }
  return out;
}

std::shared_ptr<Comm> split_in_process(Comm& parent, int color, int key) {
  std::shared_ptr<CliqueSplit> s;
  {
    std::lock_guard<std::mutex> lock(clique_split_mutex());
    auto& slot = clique_splits()[parent.clique.get()];
    if (!slot) slot = std::make_shared<CliqueSplit>();
    s = slot;
  }
  std::unique_lock<std::mutex> lock(s->mu);
  const uint64_t my_round = s->round;
  s->posted.push_back({color, key, parent.rank});
  if (int(s->posted.size()) == parent.nranks) {
    // The last rank builds every child (one process: devices by address).
    s->done[my_round] = build_round(parent, s->posted);
    s->posted.clear();
    ++s->round;
    s->cv.notify_all();
  } else {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(bootstrap_timeout_ms());
    if (!s->cv.wait_until(lock, deadline, [&] { return s->done.count(my_round) != 0; })) {
      s->posted.erase(std::remove_if(s->posted.begin(), s->posted.end(),
                                     [&](const SplitEntry& e) { return e.rank == parent.rank; }),
                      s->posted.end());
      fail(mkInvalidUsage, fmt::format("mkCommSplit: rank {} waited {} ms for the other ranks of its mkCommInitAll "
                                       "group; call mkCommSplit from one thread per rank (they meet), every rank "
                                       "of the group",
                                       parent.rank, bootstrap_timeout_ms()));
    }
  }
  SplitRound& r = s->done[my_round];
  std::shared_ptr<Comm> mine = std::exchange(r.results[size_t(parent.rank)], nullptr);
  const std::string error = r.error;
  if (--r.untaken == 0) s->done.erase(my_round);
  if (!error.empty()) fail(mkInvalidUsage, "mkCommSplit: " + error);
  return mine;
}

std::shared_ptr<Comm> split_across(Comm& parent, int color, int key, const mkConfig_t* config) {
  // Round 1: everyone's (color, key). Round 2: each new communicator's first
  // member publishes a fresh unique id for it.
  SplitEntry mine{color, key, parent.rank};
  auto blobs = parent.boot->allgather(std::string(reinterpret_cast<const char*>(&mine), sizeof mine));
  std::vector<SplitEntry> all;
  for (const auto& b : blobs) {
    if (b.size() != sizeof(SplitEntry)) fail(mkInvalidUsage, "mkCommSplit: malformed exchange");
    SplitEntry e;
    std::memcpy(&e, b.data(), sizeof e);
    all.push_back(e);
  }
  std::vector<SplitEntry> m = color == MK_SPLIT_NOCOLOR ? std::vector<SplitEntry>{} : members_of(all, color);
  std::string id_blob;
  if (!m.empty() && m[0].rank == parent.rank) {
    mkUniqueId id;
    bootstrap_create_id(&id);
    id_blob.assign(id.internal, sizeof id.internal);
  }
  auto ids = parent.boot->allgather(id_blob);
  if (m.empty()) return nullptr;
  const std::string& leader = ids[size_t(m[0].rank)];
  if (leader.size() != sizeof(mkUniqueId)) fail(mkInternalError, "mkCommSplit: the new communicator's id is missing");
  mkUniqueId id;
  std::memcpy(id.internal, leader.data(), sizeof id.internal);
  int newrank = 0;
  while (m[size_t(newrank)].rank != parent.rank) ++newrank;
  auto c = std::make_shared<Comm>();
  c->config = parent.config;
  apply_user_config(&c->config, config);
  c->config.blocking = true;  // split itself is blocking here (the new communicator's init runs now)
  comm_init_rank(*c, int(m.size()), id, newrank, parent.device);
  c->state.store(int(CommState::ready));
  return c;
}

}  // namespace

mkComm_t lifecycle_split(mkComm_t h, int color, int key, const mkConfig_t* config) {
  std::shared_ptr<Comm> parent = acquire(h);
  parent->check_usable("mkCommSplit");
  if (color < 0 && color != MK_SPLIT_NOCOLOR)
    fail(mkInvalidArgument, fmt::format("mkCommSplit: color {} is negative (MK_SPLIT_NOCOLOR is {})", color,
                                        MK_SPLIT_NOCOLOR));
  std::shared_ptr<Comm> child;
  if (parent->nranks == 1) {
    if (color == MK_SPLIT_NOCOLOR) return nullptr;
    child = std::make_shared<Comm>();
    child->config = parent->config;
    apply_user_config(&child->config, config);
    mkUniqueId none{};
    comm_init_rank(*child, 1, none, 0, parent->device);
    child->state.store(int(CommState::ready));
  } else if (parent->clique) {
    if (config) {
      CommConfig check = parent->config;
      apply_user_config(&check, config);  // validated; children of one process share the parent's settings
    }
    child = split_in_process(*parent, color, key);
  } else {
    child = split_across(*parent, color, key, config);
  }
  return child ? publish(std::move(child)) : nullptr;
}

}  // namespace mk::rt
