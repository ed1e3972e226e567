#include "compiler/cost/cost.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "compiler/common/xml.hpp"

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

// The NIC directions a data op uses (a NIC per (node, rail); sending and
// receiving are separate, as LinkCost's rate is per direction): for a rank
// it writes on another node, the executing rank's NIC sending and that
// rank's receiving; for one it reads, the reverse. None for an op inside a
// node (and none on NxG:direct, where every pair is linked).
std::vector<int64_t> op_nics(const Op& op, const topology::Topology& t) {
  std::vector<int64_t> nics;
  auto nic = [&](int32_t r, bool send) { return (int64_t(t.node(r)) * t.gpus_per_node + t.rail(r)) * 2 + send; };
  auto add = [&](int64_t n) {
    if (std::find(nics.begin(), nics.end(), n) == nics.end()) nics.push_back(n);
  };
  for (const auto& x : op.dsts)
    if (t.link(op.rank, x.rank) == topology::Link::net) add(nic(op.rank, true)), add(nic(x.rank, false));
  for (const auto& x : op.srcs)
    if (t.link(op.rank, x.rank) == topology::Link::net) add(nic(x.rank, true)), add(nic(op.rank, false));
  return nics;
}

}  // namespace

Timeline step_timeline(const ir::Schedule& s, const topology::Topology& t, int64_t tile_bytes, int32_t share) {
  Timeline tl;
  std::map<std::pair<int32_t, int32_t>, std::vector<size_t>> progs;
  for (size_t i = 0; i < s.ops.size(); ++i) progs[{s.ops[i].rank, s.ops[i].tb}].push_back(i);
  struct Signal {
    double at;
    int32_t from;
    size_t ev;  // the signal's event
  };
  std::map<std::pair<int32_t, int32_t>, Signal> signal_time;  // (rank, slot) -> when set, by whom
  std::map<std::pair<int32_t, int32_t>, size_t> pc;
  std::map<std::pair<int32_t, int32_t>, double> clock;
  std::map<std::pair<int32_t, int32_t>, double> busy;
  std::map<std::pair<int32_t, int32_t>, int64_t> last_ev;
  // Each NIC carries one transfer at a time, in the order the ops are played
  // (first come, first served); its busy time bounds the pipelined rate too.
  std::map<int64_t, double> nic_free, nic_busy;
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
        auto lane = last_ev.try_emplace(key, -1).first;
        int64_t cause = lane->second, released_by = -1;
        if (op.kind == OpKind::wait && op.iter == 0) {
          auto it = signal_time.find({op.rank, op.slot});
          if (it == signal_time.end()) break;  // not yet signalled
          const auto link = t.link(it->second.from, op.rank);
          const double released = it->second.at + t.cost(link).alpha_us / 2;
          released_by = int64_t(it->second.ev);
          if (released > now || cause < 0) cause = released_by;
          start = std::max(now, released);
        }
        const std::vector<int64_t> nics = op.is_data() ? op_nics(op, t) : std::vector<int64_t>{};
        for (int64_t n : nics) start = std::max(start, nic_free[n]);
        double end = start + op_cost(s, op, t, tile_bytes, share);
        for (int64_t n : nics) {
          nic_free[n] = end;
          nic_busy[n] += end - start;
        }
        if (op.kind == OpKind::signal) signal_time[{op.peer, op.slot}] = {end, op.rank, tl.events.size()};
        if (op.is_data()) busy[key] += end - start;
        lane->second = int64_t(tl.events.size());
        tl.events.push_back({prog[i], op.rank, op.tb, start, end, cause, released_by});
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
  for (auto& [k, b] : nic_busy) tl.bottleneck_us = std::max(tl.bottleneck_us, b);
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

std::vector<size_t> critical_path(const Timeline& tl) {
  std::vector<size_t> path;
  if (tl.events.empty()) return path;
  size_t at = 0;
  for (size_t i = 1; i < tl.events.size(); ++i)
    if (tl.events[i].end_us > tl.events[at].end_us) at = i;
  for (int64_t i = int64_t(at); i >= 0 && path.size() <= tl.events.size(); i = tl.events[size_t(i)].cause)
    path.push_back(size_t(i));
  return path;
}

namespace {

std::string xml(const std::string& in) { return xml_escape(in, true); }

// A tick interval of 1, 2 or 5 times a power of ten, at least `min_us`.
double tick_us(double min_us) {
  double p = 1e-3;
  while (p * 10 <= min_us) p *= 10;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (p * m >= min_us) return p * m;
  return p * 10;
}

const char* color_of(OpKind k) {
  return k == OpKind::copy ? "#4e79a7" : k == OpKind::reduce ? "#e15759" : k == OpKind::wait ? "#bab0ac" : "#59a14f";
}

}  // namespace

std::string svg(const ir::Schedule& s, const Timeline& tl) {
  std::map<std::pair<int32_t, int32_t>, int> row;  // (rank, tb) -> lane
  for (const auto& e : tl.events) row.emplace(std::make_pair(e.rank, e.tb), 0);
  int n = 0;
  std::map<int32_t, std::pair<int, int>> band;  // rank -> first and last lane
  for (auto& [k, v] : row) {
    v = n++;
    auto [it, fresh] = band.try_emplace(k.first, v, v);
    if (!fresh) it->second.second = v;
  }
  const double left = 120, top = 64, row_h = 22, width = 1000;
  const double span = tl.step_us > 0 ? tl.step_us : 1;
  const double scale = width / span;
  const double bottom = top + row_h * n;
  auto x_of = [&](double us) { return left + us * scale; };
  auto y_mid = [&](const Event& e) { return top + row_h * row[{e.rank, e.tb}] + row_h / 2; };
  const std::vector<size_t> path = critical_path(tl);
  std::vector<bool> critical(tl.events.size(), false);
  for (size_t i : path) critical[i] = true;

  std::string o = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"monospace\" "
      "font-size=\"11\">\n",
      left + width + 30, bottom + 60);
  o += "<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerWidth=\"6\" "
       "markerHeight=\"6\" orient=\"auto-start-reverse\"><path d=\"M 0 0 L 10 5 L 0 10 z\" fill=\"context-stroke\"/>"
       "</marker></defs>\n";
  o += fmt::format(
      "<text x=\"10\" y=\"18\" font-size=\"14\">{}: {} ranks, proto {}, tile {} B: one step of one instance, "
      "{:.2f} us estimated</text>\n",
      xml(s.name), s.nranks, ir::name(s.proto), s.tile_bytes, tl.step_us);
  o += fmt::format(
      "<text x=\"10\" y=\"34\" fill=\"#555\">cost model (alpha-beta), not measured; critical path: {} ops, "
      "outlined in black</text>\n",
      path.size());
  // rank bands and lane labels
  for (const auto& [rank, lanes] : band) {
    const double y = top + row_h * lanes.first, h = row_h * (lanes.second - lanes.first + 1);
    o += fmt::format("<rect x=\"0\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\"/>\n", y,
                     left + width + 20, h, rank % 2 ? "#ffffff" : "#f2f2f2");
  }
  for (auto& [k, v] : row)
    o += fmt::format("<text x=\"10\" y=\"{:.1f}\">rank {} tb {}</text>\n", top + row_h * v + 15, k.first, k.second);
  // time axis and grid
  const double step = tick_us(span * 80 / width);
  for (double t = 0; t <= span * 1.0001; t += step) {
    const double x = x_of(t);
    o += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>\n", x,
                     top - 6, x, bottom);
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" fill=\"#555\">{:g} us</text>\n", x,
                     top - 10, t);
  }
  // ops
  for (size_t i = 0; i < tl.events.size(); ++i) {
    const Event& e = tl.events[i];
    const Op& op = s.ops[e.op];
    const double x = x_of(e.start_us), w = std::max(1.0, (e.end_us - e.start_us) * scale);
    const double y = top + row_h * row[{e.rank, e.tb}];
    std::string hover = fmt::format("{} [{:.2f} .. {:.2f} us]", ir::print_op(op), e.start_us, e.end_us);
    if (op.loc.valid()) hover += "\n" + op.loc.str();
    if (critical[i]) hover += "\non the critical path";
    o += fmt::format(
        "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\" stroke=\"{}\" "
        "stroke-width=\"{}\"><title>{}</title></rect>\n",
        x, y + 3, w, row_h - 6, color_of(op.kind), critical[i] ? "#000" : "#fff", critical[i] ? 2 : 1, xml(hover));
    if (op.is_data() && w > 60)
      o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"white\" pointer-events=\"none\">%{} {}</text>\n",
                       x + 3, y + 15, op.id, ir::name(op.kind));
  }
  // flags: a signal to the wait it releases (solid where the wait had to wait for it)
  for (const auto& e : tl.events) {
    if (e.signal < 0) continue;
    const Event& c = tl.events[size_t(e.signal)];
    const bool binding = e.cause == e.signal;
    o += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#9c755f\" stroke-dasharray=\"{}\" "
        "marker-end=\"url(#arrow)\"><title>flag: %{} (rank {}) releases %{} (rank {}){}</title></line>\n",
        x_of(c.end_us), y_mid(c), x_of(e.start_us), y_mid(e), binding ? "none" : "3 3", s.ops[c.op].id, c.rank,
        s.ops[e.op].id, e.rank, binding ? ", which waited for it" : ", which was set before the wait");
  }
  // data written into another rank's memory: to that rank's lanes
  for (const auto& e : tl.events) {
    const Op& op = s.ops[e.op];
    if (!op.is_data()) continue;
    std::set<int32_t> remote;
    for (const auto& d : op.dsts)
      if (d.rank != op.rank && band.count(d.rank)) remote.insert(d.rank);
    for (int32_t q : remote) {
      const auto [first, last] = band[q];
      const double y_to = band[op.rank].first < first ? top + row_h * first + 3 : top + row_h * (last + 1) - 3;
      const double x = x_of(e.end_us) - 2 - 3 * (op.rank % 4);  // ranks writing at once stay apart
      o += fmt::format(
          "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#4e79a7\" stroke-width=\"1.5\" "
          "marker-end=\"url(#arrow)\"><title>data: %{} (rank {}) writes rank {}'s memory</title></line>\n",
          x, y_mid(e), x, y_to, op.id, op.rank, q);
    }
  }
  // legend
  const double ly = bottom + 22;
  double lx = left;
  for (auto [label, color] : std::initializer_list<std::pair<const char*, const char*>>{
           {"copy", "#4e79a7"}, {"reduce", "#e15759"}, {"signal", "#59a14f"}, {"wait", "#bab0ac"}}) {
    o += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"12\" height=\"12\" fill=\"{}\"/>\n", lx, ly - 10, color);
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n", lx + 16, ly, label);
    lx += 90;
  }
  o += fmt::format(
      "<text x=\"{:.1f}\" y=\"{:.1f}\">blue arrow: data into a peer; brown: a flag (solid where the wait waited "
      "for it); hover for the op, its times and DSL line</text>\n",
      left, ly + 20);
  o += "</svg>\n";
  return o;
}

}  // namespace mk::cost
