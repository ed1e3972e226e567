#include "compiler/cost/cost.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace mk::cost {

using ir::Buf;
using ir::Op;
using ir::OpKind;

namespace {

// The slowest link a data op uses: from its executing rank to every rank it
// touches (the executing rank's own memory is Link::self).
const topology::LinkCost& op_link(const Op& op, const topology::Topology& t) {
  const topology::LinkCost* worst = &t.cost(topology::Link::self);
  for (const auto* list : {&op.srcs, &op.dsts})
    for (const auto& r : *list) {
      const topology::LinkCost& c = t.cost(t.link(op.rank, r.rank));
      if (c.gbps < worst->gbps) worst = &c;
    }
  return *worst;
}

double op_cost(const ir::Schedule& s, const Op& op, const topology::Topology& t, int64_t tile_bytes, int32_t share) {
  if (!op.is_data()) return kSyncOpUs;
  double bytes = double(tile_bytes) * op.count() * double(op.dsts.size()) * double(std::max(share, 1));
  if (s.proto == ir::Proto::ll) bytes *= 2;
  return kDataOpUs + bytes / (op_link(op, t).gbps * 1e3);  // GB/s -> bytes per microsecond
}

}  // namespace

Timeline step_timeline(const ir::Schedule& s, const topology::Topology& t, int64_t tile_bytes, int32_t share) {
  Timeline tl;
  std::map<std::pair<int32_t, int32_t>, std::vector<size_t>> progs;
  for (size_t i = 0; i < s.ops.size(); ++i) progs[{s.ops[i].rank, s.ops[i].tb}].push_back(i);
  struct Signal {
    double at;
    int32_t from;
  };
  std::map<std::pair<int32_t, int32_t>, Signal> signal_time;  // (rank, slot) -> when set, by whom
  std::map<std::pair<int32_t, int32_t>, size_t> pc;
  std::map<std::pair<int32_t, int32_t>, double> clock;
  std::map<std::pair<int32_t, int32_t>, double> busy;
  bool progress = true;
  size_t done = 0;
  while (progress) {
    progress = false;
    for (auto& [key, prog] : progs) {
      size_t& i = pc[key];
      double& now = clock[key];
      while (i < prog.size()) {
        const Op& op = s.ops[prog[i]];
        double start = now;
        if (op.kind == OpKind::wait && op.iter == 0) {
          auto it = signal_time.find({op.rank, op.slot});
          if (it == signal_time.end()) break;  // not yet signalled
          const auto link = t.link(it->second.from, op.rank);
          start = std::max(now, it->second.at + t.cost(link).alpha_us / 2);
        }
        double end = start + op_cost(s, op, t, tile_bytes, share);
        if (op.kind == OpKind::signal) signal_time[{op.peer, op.slot}] = {end, op.rank};
        if (op.is_data()) busy[key] += end - start;
        tl.events.push_back({prog[i], op.rank, op.tb, start, end});
        now = end;
        ++i;
        ++done;
        progress = true;
      }
    }
  }
  if (done != s.ops.size())
    throw InternalError("cost model: schedule does not complete one step (unverified schedule?)");
  for (auto& e : tl.events) tl.step_us = std::max(tl.step_us, e.end_us);
  for (auto& [k, b] : busy) tl.bottleneck_us = std::max(tl.bottleneck_us, b);
  return tl;
}

double estimate_us(const ir::Schedule& s, const topology::Topology& t, int64_t bytes) {
  if (bytes <= 0) return 0;
  int64_t chunk = (bytes + s.chunks - 1) / s.chunks;
  int64_t tile = std::min<int64_t>(s.tile_bytes, std::max<int64_t>(16, chunk));
  int64_t tiles = (chunk + tile - 1) / tile;
  int64_t steps = (tiles + s.instances - 1) / s.instances;
  // the instances that actually have a tile in a step share the links
  Timeline tl = step_timeline(s, t, tile, int32_t(std::min<int64_t>(s.instances, tiles)));
  return t.launch_us + tl.step_us + double(steps - 1) * tl.bottleneck_us;
}

std::string text(const ir::Schedule& s, const Timeline& tl) {
  std::string out = fmt::format("{}: one step of one instance (tile {} B, proto {}), estimated {:.2f} us\n",
                                s.name, s.tile_bytes, ir::name(s.proto), tl.step_us);
  std::vector<Event> ev = tl.events;
  std::stable_sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) {
    return std::tie(a.rank, a.tb, a.start_us) < std::tie(b.rank, b.tb, b.start_us);
  });
  int32_t r = -1, tb = -1;
  for (const auto& e : ev) {
    if (e.rank != r || e.tb != tb) {
      r = e.rank;
      tb = e.tb;
      out += fmt::format("rank {} tb {}:\n", r, tb);
    }
    out += fmt::format("  {:8.2f} .. {:8.2f} us  {}\n", e.start_us, e.end_us, ir::print_op(s.ops[e.op]));
  }
  return out;
}

std::string svg(const ir::Schedule& s, const Timeline& tl) {
  std::map<std::pair<int32_t, int32_t>, int> row;
  for (const auto& e : tl.events) row.emplace(std::make_pair(e.rank, e.tb), 0);
  int n = 0;
  for (auto& [k, v] : row) v = n++;
  const double left = 110, top = 40, row_h = 22, width = 1000;
  const double scale = tl.step_us > 0 ? width / tl.step_us : 1;
  std::string o = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"monospace\" "
      "font-size=\"11\">\n",
      left + width + 20, top + row_h * n + 30);
  o += fmt::format(
      "<text x=\"10\" y=\"20\" font-size=\"14\">{} ({} ranks, proto {}, tile {} B): one step, {:.2f} us "
      "estimated</text>\n",
      s.name, s.nranks, ir::name(s.proto), s.tile_bytes, tl.step_us);
  for (auto& [k, v] : row)
    o += fmt::format("<text x=\"10\" y=\"{}\">rank {} tb {}</text>\n", top + row_h * v + 15, k.first, k.second);
  for (const auto& e : tl.events) {
    const Op& op = s.ops[e.op];
    const char* color = op.kind == OpKind::copy     ? "#4e79a7"
                        : op.kind == OpKind::reduce ? "#e15759"
                        : op.kind == OpKind::wait   ? "#bab0ac"
                                                    : "#59a14f";
    double x = left + e.start_us * scale, w = std::max(1.0, (e.end_us - e.start_us) * scale);
    double y = top + row_h * row[{e.rank, e.tb}];
    o += fmt::format(
        "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\" stroke=\"white\"><title>{} "
        "[{:.2f}..{:.2f} us]</title></rect>\n",
        x, y + 2, w, row_h - 4, color, ir::print_op(op), e.start_us, e.end_us);
    if (op.is_data() && w > 60) {
      std::string label = fmt::format("%{} {}", op.id, ir::name(op.kind));
      o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"white\">{}</text>\n", x + 3, y + 15, label);
    }
  }
  o += fmt::format(
      "<text x=\"{}\" y=\"{}\">blue copy, red reduce, green signal, grey wait; hover for details</text>\n", left,
      top + row_h * n + 20);
  o += "</svg>\n";
  return o;
}

}  // namespace mk::cost
