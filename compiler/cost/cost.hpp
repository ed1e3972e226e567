// Alpha-beta cost model over a lowered schedule, for `mkc show` (timelines)
// and as a first-guess selection aid until `mkc tune` measures. One step of
// one instance is played out ASAP: each thread block runs its ops in order, a
// wait ends no earlier than its signal plus one flag latency, a data op costs
// bytes / bandwidth (NVLink when it touches another rank, HBM otherwise).
#pragma once

#include <string>
#include <vector>

#include "compiler/ir/ir.hpp"
#include "compiler/topology/topology.hpp"

namespace mk::cost {

struct Event {
  size_t op;  // index into Schedule::ops
  int32_t rank, tb;
  double start_us, end_us;
};

struct Timeline {
  std::vector<Event> events;
  double step_us = 0;        // critical path of one step
  double bottleneck_us = 0;  // busiest thread block's work per step (pipelined throughput)
};

Timeline step_timeline(const ir::Schedule& s, const topology::Topology& t, int64_t tile_bytes);

// Estimated time of one launch moving `bytes` per rank.
double estimate_us(const ir::Schedule& s, const topology::Topology& t, int64_t bytes, size_t elem_size);

// The timeline as an SVG picture: one row per (rank, thread block).
std::string svg(const ir::Schedule& s, const Timeline& tl);
// ... and as text: per rank and thread block, what moves when.
std::string text(const ir::Schedule& s, const Timeline& tl);

}  // namespace mk::cost
