// mkc tune: measures every candidate (schedule x protocol knobs) of each
// collective per size on the GPUs present and writes the selection table the
// runtime loads (MK_SELECT_FILE; runtime/plans/select.hpp, docs/select.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mk/types.hpp"

namespace mk::tune {

struct Options {
  int ranks = 2;
  bool share = false;  // every rank on GPU 0 (a one-GPU proxy: never a table to ship)
  std::vector<Collective> colls;
  DType dtype = DType::bf16;
  int64_t min_bytes = 1024, max_bytes = int64_t(64) << 20;
  std::string knobs = "quick";  // quick: each schedule with the defaults; full: also knob variants
  int batches = 5;
  bool check = true;            // check each candidate's results once per size up to 16 MiB
  std::string out;              // the table; "" = stdout
  std::string command;          // for the table's note
};

int run(const Options& o);

// A child process's work (the tuner runs each candidate in its own process,
// with MK_ALGO and MK_TUNE set): writes "R <bytes> <us>" or "W <bytes> <what>"
// lines to fd.
int child(const Options& o, Collective coll, int fd);

// The knob variants of a level ("quick", "full"), in MK_TUNE's syntax.
std::vector<std::string> knob_variants(const std::string& level);

}  // namespace mk::tune
