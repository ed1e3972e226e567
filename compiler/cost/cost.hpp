// Alpha-beta cost model over a lowered schedule, for `mkc show` (timelines,
// estimates) and as a first-guess selection aid until `mkc tune` measures.
// One step of every instance is played out ASAP on the schedule's topology:
//
//  - each (rank, thread block) runs its ops in program order;
//  - a data op costs kDataOpUs + B / (gbps * 1e3) us, B = tile bytes x chunks
//    x destinations (x2 for LL), gbps of the slowest link it uses from its
//    executing rank (Topology::link: self, nvlink, pcie, net);
//  - a data op that crosses nodes also holds the NIC directions it uses (a
//    NIC per node and rail; writing to a peer: the executing rank's sending
//    side and the peer's receiving side) for its duration: a NIC carries one
//    transfer at a time each way, first come first served in the
//    order ops are played (so it may delay an op that was ready earlier:
//    pessimistic), and its busy time per step bounds the pipelined rate
//    like a thread block's;
//  - a signal or wait costs kSyncOpUs; a wait (iter 0) starts no earlier than
//    its signal's end plus half the flag round trip (alpha_us) of the link
//    between the signalling and the waiting rank.
//
// estimate_us(bytes) = launch_us + step + (steps - 1) x bottleneck, where a
// chunk is ceil(bytes / chunks) bytes, tile = min(tile_bytes, max(16, chunk)),
// steps = ceil(ceil(chunk / tile) / instances), step is the critical path of
// one step and bottleneck the busiest thread block's data-op time per step.
// The instances of a step run at once and share the links: for the estimate
// each moves its bytes at 1/instances of a link's rate (more instances fill
// the pipeline sooner, they do not make a link faster).
#pragma once

#include <string>
#include <vector>

#include "compiler/ir/ir.hpp"
#include "compiler/topology/topology.hpp"

namespace mk::cost {

constexpr double kDataOpUs = 0.2;   // fixed cost of a copy or reduce (issue, first access)
constexpr double kSyncOpUs = 0.05;  // a signal or a wait once its flag is set

struct Event {
  size_t op;  // index into Schedule::ops
  int32_t rank, tb;
  double start_us, end_us;
  // The event (index into Timeline::events) this one started after: the
  // signal that released a wait, else the previous op of its thread block;
  // -1 for a thread block's first op. Following it from the last event to
  // end gives the critical path.
  int64_t cause = -1;
  // For a wait released by a signal: that signal's event, else -1.
  int64_t signal = -1;
};

struct Timeline {
  std::vector<Event> events;
  double step_us = 0;        // critical path of one step
  double bottleneck_us = 0;  // busiest thread block's (or NIC's) work per step (pipelined throughput)
};

// `share`: instances sharing each link (1: one instance alone, as `mkc show` draws it).
Timeline step_timeline(const ir::Schedule& s, const topology::Topology& t, int64_t tile_bytes, int32_t share = 1);

// Estimated time of one launch moving `bytes` per rank (the collective's
// count times the element size), 0 for no bytes.
double estimate_us(const ir::Schedule& s, const topology::Topology& t, int64_t bytes);

// The events on the critical path (indices into tl.events, last first).
std::vector<size_t> critical_path(const Timeline& tl);

// The timeline as an SVG picture: a time axis, one lane per (rank, thread
// block) grouped by rank, arrows for flags (signal -> the wait it releases)
// and for data written into another rank's memory, the critical path
// outlined, hover text with the op, its times and its DSL line.
std::string svg(const ir::Schedule& s, const Timeline& tl);
// ... and as text: per rank and thread block, what moves when.
std::string text(const ir::Schedule& s, const Timeline& tl);

}  // namespace mk::cost
