// User schedules in the runtime: MK_SCHEDULES (process-wide) and a
// communicator's own list (mkConfig_t::schedules) are loaded into the schedule
// registry (compiler/sources.hpp) at communicator init, before MK_ALGO and
// MK_SELECT_FILE are read, so both can name them. At init every user schedule
// that builds for the communicator's rank count is lowered, which proves it
// (the verifier: right contributions, no races, bounds, no deadlock), and
// every schedule MK_ALGO or MK_SELECT_FILE names for this rank count must
// build for it. The loaded schedules and their file hashes are a setting every
// rank must agree on, so a list that differs, or fails on one rank, fails init
// on all ranks (runtime/comm/comm.cpp agree_on_settings).
#pragma once

#include <string>

namespace mk::rt {

// MK_SCHEDULES's schedules, "name@hash,..." sorted ("" when unset). Loads
// them on first use; a bad list throws RtError(mkInvalidArgument) from every
// call until it loads.
std::string env_schedules();

// Loads `config_list` (a communicator's own list: "" for none) and returns the
// same description of it. Throws RtError(mkInvalidArgument) naming the file.
std::string config_schedules(const std::string& config_list);

// Proves the user schedules a communicator of `nranks` ranks can run (those
// of MK_SCHEDULES and `config_list`, and any user schedule MK_ALGO or
// MK_SELECT_FILE selects for `nranks`, whichever communicator loaded it) and
// checks that what MK_ALGO and MK_SELECT_FILE select for `nranks` builds for
// it. Returns "name@hash,..." (sorted by name) of those user schedules, the
// hash being of the IR each builds for `nranks` ("-": does not build): what
// ranks must agree on. Throws RtError(mkInvalidArgument) with the verifier's
// or the builder's message. Results are kept per (schedule, nranks).
std::string prove_user_schedules(const std::string& config_list, int nranks);

}  // namespace mk::rt
