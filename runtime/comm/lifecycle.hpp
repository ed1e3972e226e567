// Creating, splitting, finalizing, destroying and aborting communicators
// (NCCL's lifetime contract): what the C API's lifecycle entry points do.
#pragma once

#include <string>
#include <vector>

#include "mk.h"

namespace mk::rt {

// mkCommInitRankConfig. Blocking: returns the ready handle. Nonblocking: the
// handle at once (its init runs on a thread; *in_progress set).
mkComm_t lifecycle_init_rank(int nranks, const mkUniqueId& id, int rank, const mkConfig_t* config,
                             bool* in_progress);
std::vector<mkComm_t> lifecycle_init_all(int ndev, const int* devlist);
// Destroy (abort = false) or abort. Safe from any thread while other threads
// are inside calls on `h`.
void lifecycle_close(mkComm_t h, bool abort);
void lifecycle_finalize(mkComm_t h);
// NULL for MK_SPLIT_NOCOLOR. Blocking (the effective config's `blocking`):
// returns the ready child. Nonblocking: the child at once, built on a thread
// (*in_progress set); the parent takes no calls until that thread is done.
mkComm_t lifecycle_split(mkComm_t parent, int color, int key, const mkConfig_t* config, bool* in_progress);
mkComm_t lifecycle_shrink(mkComm_t parent, const int* exclude, int nexclude, const mkConfig_t* config, int flags);
mkResult_t lifecycle_async_error(mkComm_t h, std::string* message);

}  // namespace mk::rt
