// Settings from the environment, parsed strictly. A value must parse as a
// whole ("12abc" is not 12) and lie in its range; otherwise the call that
// reads it fails with RtError(mkInvalidArgument) naming the variable, its
// value and what is accepted. Unset and empty variables take their default.
//
//   MK_SCRATCH_BYTES         symmetric scratch per rank   1 MiB .. 1 TiB, default 256 MiB
//   MK_FLAG_BYTES            flag memory per rank         4096 .. 1 GiB, default 1 MiB
//   MK_TIMEOUT_MS            kernel wait bound, 0: none   0 .. 2^40, default 600000
//   MK_MAX_REGISTRATIONS     registered buffers at once   1 .. 1048576, default 256
//   MK_BOOTSTRAP_TIMEOUT_MS  bootstrap wait bound         1 .. 2^31-1, default 120000
//   MK_ZERO_COPY             0 or 1, default 1
//   MK_ZERO_COPY_MIN_BYTES   0 .. 2^62, default 4 MiB
//   MK_PDL                   0 or 1, default 1 (programmatic dependent launch)
//   MK_FUSION_CHECK          0 or 1, default 0 (fused plans with checked epilogue accessors)
//   MK_TUNE                  key=value,... (tune_keys())
//   MK_ALGO                  collective=schedule,... (a built-in schedule of that collective)
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "compiler/passes/passes.hpp"
#include "mk/types.hpp"

namespace mk::rt::env {

// MK_NET: the network transport to ranks on other nodes: "" (unset: none,
// such communicators go to NCCL or fail as before), "socket", "verbs", or
// "plugin" (MK_NET_PLUGIN names it; setting MK_NET_PLUGIN alone means
// "plugin"). Throws mkInvalidArgument for anything else.
std::string net_transport();
// MK_NET_DEPTH: a network connection's puts in flight (the trigger FIFO's
// entries and the receiver's buffers): a power of two in 2..16, default 8.
// Rank-local (each side sizes its own end).
int net_depth();

// The value of `name`, or nullopt when it is unset or empty.
std::optional<std::string> raw(const char* name);

// One value; `name` only labels the error.
int64_t parse_int(const char* name, const std::string& value, int64_t lo, int64_t hi);
bool parse_bool(const char* name, const std::string& value);  // "0" or "1"
// "key=value,key=value": each item has a non-empty key and value, no key
// appears twice; the items in their order.
std::vector<std::pair<std::string, std::string>> parse_list(const char* name, const std::string& value);

int64_t get_int(const char* name, int64_t dflt, int64_t lo, int64_t hi);
bool get_bool(const char* name, bool dflt);

// The integer settings of the table above.
int64_t scratch_bytes();
int64_t flag_bytes();
int64_t timeout_ms();
int32_t max_registrations();
int32_t bootstrap_timeout_ms();
// MK_HOST_ID: the node this process counts as, instead of its host name and
// boot id (ranks with different ids are on different nodes: processes of one
// machine stand in for nodes in tests). 1..63 printable ASCII characters, no
// spaces; unset or empty: nullopt. Throws for anything else.
// MK_HOST_ID=a,a,b,b: a list, one node name per rank (rank r of a
// communicator of that many ranks counts as node list[r]): ranks of one
// process, or one launcher environment for every process, as nodes.
// host_id() checks the syntax and returns the whole value;
// host_id(rank, nranks) returns the rank's name (a list of another length
// throws).
std::optional<std::string> host_id();
std::optional<std::string> host_id(int rank, int nranks);
bool zero_copy();
int64_t zero_copy_min_bytes();
bool pdl();
// MK_GROUP_FUSE: how mkGroupEnd runs several calls of one communicator
// (runtime/launch/enqueue.cpp): 0 (the default) one launch per call, 1 one group
// kernel from the first time, 2 ("auto") from the second time a group of the
// same shape is seen (a shape that changes every call is never compiled).
int group_fuse();

// MK_TUNE applied to compile options, every key strictly parsed and
// range-checked; unknown keys are errors.
void apply_tune(const std::string& value, passes::ProtocolOptions* p);
void apply_tune(passes::ProtocolOptions* p);  // from the environment
// The keys MK_TUNE accepts, with their ranges, for messages and docs.
std::string tune_keys();

// MK_ALGO: every item names a collective and a registered schedule that
// implements it; anything else is an error now, not at the call it affects.
std::map<Collective, std::string> parse_algo(const std::string& value);
std::map<Collective, std::string> algo();  // from the environment

// The normalised value of every setting that shapes plans or memory layout,
// in a fixed order: MK_ALGO, MK_TUNE (every key, defaults included),
// MK_ZERO_COPY, MK_ZERO_COPY_MIN_BYTES, MK_SCRATCH_BYTES, MK_FLAG_BYTES,
// MK_MAX_REGISTRATIONS, MK_PLAN_DIR (a hash of the plan.json files and cubins
// it would load), the mKernel version and the compiler identity (NVRTC and
// the templates). Ranks whose lists differ would lay out memory or pick plans
// differently; communicator init compares them. Throws what the parsers throw.
std::vector<std::pair<std::string, std::string>> plan_shaping_settings();

}  // namespace mk::rt::env
