// The rendezvous server (the "root"): a thread of the process that made the
// unique id (or of rank 0's, with MK_COMM_ID). One poll loop over its
// listening socket and every connection: it authenticates each connection
// (auth.hpp), seats the ranks, tells each every rank's peer listener, then
// watches who leaves and tells the others (bootstrap.hpp has the whole
// story; protocol.hpp the messages). Internal to runtime/bootstrap/.
#pragma once

#include "runtime/bootstrap/bootstrap.hpp"

namespace mk::rt {

// Serves the rendezvous of `id` on `listen_fd` (bound and listening; owned
// from now on) in a detached thread until every rank has left, or until
// the rendezvous does not complete within MK_BOOTSTRAP_TIMEOUT_MS. At exit
// the process waits (at most 2 s) for its servers to write what they owe.
void start_server(int listen_fd, const IdContents& id);

}  // namespace mk::rt
