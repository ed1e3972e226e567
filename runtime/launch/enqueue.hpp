// From an API call to a kernel on the caller's stream: validation, plan
// lookup, launch, and groups (mkGroupStart/End).
#pragma once

#include <functional>

#include <cstddef>

#include "mk.h"
#include "mk/types.hpp"

namespace mk::rt {

class Comm;

struct Call {
  Collective coll;
  const void* send;
  void* recv;
  size_t count;
  int dtype;
  int op;
  int root;
  const mkFusion_t* fusion = nullptr;  // mkAllReduceFused; copied by enqueue
  // A stage of a composite (mkCompositeRun): the schedule it names instead of
  // the selection tables' ("" or null: the tables'); copied by enqueue.
  const char* schedule = nullptr;
};

// mkRedOpCreatePreMulSum's device scalar: GPU memory of the communicator's
// GPU, `bytes` long, aligned to it; throws RtError(mkInvalidArgument).
void check_scalar_pointer(Comm& c, const void* ptr, size_t bytes, const char* api);

// Validates and launches (or queues, inside a group) one collective; throws
// RtError. A failure inside a group also fails the whole group.
void enqueue(const Call& k, mkComm_t comm, cudaStream_t stream);

void group_start();
// Launches the group's calls, all or nothing; throws RtError.
void group_end();
// The open group's calls run as group kernels whatever MK_GROUP_FUSE says
// (mkCompositeRun); reset by the outermost mkGroupEnd.
void group_fuse_all();
// Records a failure inside an open group (the group then launches nothing).
void group_fail(mkResult_t code, const std::string& why);
// Whether this thread is inside mkGroupStart/End.
bool group_open();
// Work started inside the open group (a split) that mkGroupEnd must wait for
// before it launches anything: `wait` blocks until it is done and throws
// RtError if it failed.
void group_defer(std::function<void()> wait);

const char* api_name_of(Collective c);

// mkCompositeRun (runtime/launch/composite.cpp); throws RtError or mk::Error.
void composite_run(const char* name, void* const* buffers, int nbuffers, size_t count, int dtype, int op,
                   mkComm_t comm, cudaStream_t stream);

}  // namespace mk::rt
