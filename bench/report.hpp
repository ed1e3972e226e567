// mk_bench's results and how they are written: an nccl-tests-style table
// (markdown), JSON, CSV and an SVG plot (bus bandwidth and latency against
// size, both libraries). No GPU code: tested on CPU machines.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mk/types.hpp"

namespace mkb {

// One library's timing of one (collective, size, placement).
struct Timing {
  bool ran = false;         // false: not run (in-place of all-to-all, NCCL in one-GPU mode)
  double p10 = 0, p50 = 0, p90 = 0;  // microseconds per call, over batches (each the max over ranks)
  int64_t wrong = 0;        // mismatching elements over every checked batch and rank
  int64_t checked = 0;      // batches (x ranks) whose output was checked
  std::string first_bad;    // where the first mismatch was
};

struct Row {
  mk::Collective coll;
  int64_t bytes = 0;  // nccl-tests' size: the larger buffer of one rank
  int64_t count = 0;  // elements per rank (the call's count)
  mk::DType dtype = mk::DType::bf16;
  mk::RedOp op = mk::RedOp::sum;
  int root = -1;      // -1: no root
  Timing nccl[2], mk[2];  // [0] out-of-place, [1] in-place
  std::string nccl_algo;  // what NCCL said it ran (NCCL_DEBUG_SUBSYS=TUNING), if probed
};

struct RunInfo {
  std::string title;        // one line: libraries, ranks, dtype, launches
  std::string command;      // the command line
  std::string label;        // --label (machine, settings)
  std::string build;        // the library version and the commit the binary was built from
  std::string proxy_note;   // non-empty for one-GPU proxies
  std::vector<std::string> notes;  // clocks, settings, anything else worth keeping
  int nranks = 0;
  bool nccl = true;
};

// nccl-tests' bus bandwidth factor.
double busbw_factor(mk::Collective c, int nranks);
// p10/p50/p90 of `v` (nearest rank); v not empty.
void percentiles(std::vector<double> v, double* p10, double* p50, double* p90);
// "16 KiB", "1 GiB", "8 B".
std::string human_bytes(int64_t b);
// Parses "8", "64K", "16M", "1G" (binary multiples); -1 if malformed.
int64_t parse_size(const std::string& s);

std::string markdown(const RunInfo& info, const std::vector<Row>& rows);
std::string json(const RunInfo& info, const std::vector<Row>& rows);
std::string csv(const RunInfo& info, const std::vector<Row>& rows);
std::string svg(const RunInfo& info, const std::vector<Row>& rows);

}  // namespace mkb
