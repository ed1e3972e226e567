// Communicator handles: mkComm_t values are never-reused 64-bit ids (not
// addresses: a new communicator that reuses a destroyed one's memory gets
// another handle, and every call on the old handle fails, forever). They lie
// outside the user address space, so code that dereferences one faults at
// once instead of reading someone else's memory. Comm objects are owned
// here. Every API call takes a reference (acquire) for its duration; retire
// removes a handle so that no new call can reach it, and the memory goes with
// the last reference. This is what makes mkCommAbort / mkCommDestroy safe
// from any thread while another thread is inside a call on the same
// communicator (PyTorch's watchdog does exactly that).
#pragma once

#include <memory>

#include "mk.h"
#include "runtime/comm/comm.hpp"

namespace mk::rt {

// Makes `c` reachable through its handle.
mkComm_t publish(std::shared_ptr<Comm> c);
// The communicator behind `h`, referenced; throws RtError(mkInvalidArgument)
// for NULL, a destroyed or never-created handle.
std::shared_ptr<Comm> acquire(mkComm_t h);
// Removes `h`: later acquire() fail. Returns the owning reference (null if
// `h` was not live).
std::shared_ptr<Comm> retire(mkComm_t h);
// Waits until `c` is referenced only by `c` itself (every call in progress
// has returned), at most `bound_ms`. False if the bound passed, or, with
// `unless_compiling`, as soon as a call is inside a plan compile or fusion
// check (`c->compiling`): that call fails when the compile ends and frees
// the communicator if it holds the last reference.
bool wait_sole_owner(const std::shared_ptr<Comm>& c, int64_t bound_ms, bool unless_compiling = false);

}  // namespace mk::rt
