#include "bench/report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

namespace mkb {

double busbw_factor(mk::Collective c, int n) {
  switch (c) {
    case mk::Collective::allreduce: return 2.0 * (n - 1) / n;
    case mk::Collective::allgather:
    case mk::Collective::reducescatter:
    case mk::Collective::alltoall: return double(n - 1) / n;
    case mk::Collective::broadcast:
    case mk::Collective::reduce: return 1.0;
  }
  return 1.0;
}

void percentiles(std::vector<double> v, double* p10, double* p50, double* p90) {
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {
    const size_t i = size_t(std::lround(q * double(v.size() - 1)));
    return v[std::min(i, v.size() - 1)];
  };
  *p10 = at(0.1);
  *p50 = at(0.5);
  *p90 = at(0.9);
}

std::string human_bytes(int64_t b) {
  if (b >= (int64_t(1) << 30) && b % (int64_t(1) << 30) == 0) return fmt::format("{} GiB", b >> 30);
  if (b >= (int64_t(1) << 20) && b % (int64_t(1) << 20) == 0) return fmt::format("{} MiB", b >> 20);
  if (b >= 1024 && b % 1024 == 0) return fmt::format("{} KiB", b >> 10);
  return fmt::format("{} B", b);
}

int64_t parse_size(const std::string& s) {
  if (s.empty() || s.size() > 19) return -1;
  size_t digits = 0;
  while (digits < s.size() && s[digits] >= '0' && s[digits] <= '9') ++digits;
  if (digits == 0) return -1;
  int64_t v = std::stoll(s.substr(0, digits));
  std::string unit = s.substr(digits);
  for (auto& ch : unit) ch = char(std::toupper(static_cast<unsigned char>(ch)));
  int shift = 0;
  if (unit == "" || unit == "B") shift = 0;
  else if (unit == "K" || unit == "KB" || unit == "KIB") shift = 10;
  else if (unit == "M" || unit == "MB" || unit == "MIB") shift = 20;
  else if (unit == "G" || unit == "GB" || unit == "GIB") shift = 30;
  else return -1;
  if (v > (int64_t(1) << (62 - shift))) return -1;
  return v << shift;
}

namespace {

std::string root_str(const Row& r) { return r.root < 0 ? "-" : std::to_string(r.root); }

double algbw(const Row& r, double us) { return us > 0 ? double(r.bytes) / us / 1e3 : 0; }

std::string time_cell(const Timing& t) {
  if (!t.ran) return "-";
  return fmt::format("{:.1f} ({:.1f}-{:.1f})", t.p50, t.p10, t.p90);
}
std::string bw_cell(const Row& r, const Timing& t, double f) {
  return t.ran ? fmt::format("{:.1f}", algbw(r, t.p50) * f) : "-";
}
std::string wrong_cell(const Timing& t) {
  if (!t.ran) return "-";
  return t.checked ? std::to_string(t.wrong) : "unchecked";
}
std::string ratio_cell(const Timing& n, const Timing& m) {
  return n.ran && m.ran && m.p50 > 0 ? fmt::format("{:.2f}x", n.p50 / m.p50) : "-";
}

std::string header(const RunInfo& info) {
  std::string s = "# " + info.title + "\n\n";
  if (!info.build.empty()) s += "Build: " + info.build + "\n\n";
  if (!info.label.empty()) s += "Run: " + info.label + "\n\n";
  if (!info.command.empty()) s += "Command:\n\n```\n" + info.command + "\n```\n\n";
  if (!info.proxy_note.empty()) s += "**" + info.proxy_note + "**\n\n";
  for (const auto& n : info.notes) s += "- " + n + "\n";
  if (!info.notes.empty()) s += "\n";
  return s;
}

}  // namespace

std::string markdown(const RunInfo& info, const std::vector<Row>& rows) {
  std::string s = header(info);
  s += "Times are microseconds per call: median (p10-p90) over batches, each batch's time the slowest rank's. "
       "busbw in GB/s (nccl-tests' definition, from the median). speedup = NCCL time / mKernel time. #wrong: "
       "mismatching elements over every checked batch (the last call of each timed batch, every rank).\n\n";
  s += "## Summary (medians)\n\n";
  s += "| collective | size | NCCL us | mKernel us | speedup | NCCL in-place us | mKernel in-place us | speedup | "
       "mKernel busbw | wrong (mKernel/NCCL) |\n";
  s += "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
  for (const Row& r : rows) {
    const double f = busbw_factor(r.coll, info.nranks);
    const int64_t mw = r.mk[0].wrong + r.mk[1].wrong, nw = r.nccl[0].wrong + r.nccl[1].wrong;
    s += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {}/{} |\n", mk::name(r.coll), human_bytes(r.bytes),
                     r.nccl[0].ran ? fmt::format("{:.1f}", r.nccl[0].p50) : "-",
                     r.mk[0].ran ? fmt::format("{:.1f}", r.mk[0].p50) : "-", ratio_cell(r.nccl[0], r.mk[0]),
                     r.nccl[1].ran ? fmt::format("{:.1f}", r.nccl[1].p50) : "-",
                     r.mk[1].ran ? fmt::format("{:.1f}", r.mk[1].p50) : "-", ratio_cell(r.nccl[1], r.mk[1]),
                     bw_cell(r, r.mk[0], f), mw, info.nccl ? std::to_string(nw) : "-");
  }
  s += "\n## Detail (nccl-tests columns, per library)\n\n";
  s += "| collective | size | count | type | redop | root | library | out-of-place time us | algbw | busbw | #wrong | "
       "in-place time us | algbw | busbw | #wrong |\n";
  s += "|---|---:|---:|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const Row& r : rows) {
    const double f = busbw_factor(r.coll, info.nranks);
    for (int lib = 0; lib < 2; ++lib) {
      const Timing* t = lib == 0 ? r.nccl : r.mk;
      if (lib == 0 && !info.nccl) continue;
      std::string name = lib == 0 ? "NCCL" : "mKernel";
      if (lib == 0 && !r.nccl_algo.empty()) name += " (" + r.nccl_algo + ")";
      s += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                       mk::name(r.coll), human_bytes(r.bytes), r.count, mk::name(r.dtype),
                       mk::collective_reduces(r.coll) ? std::string(mk::name(r.op)) : "-", root_str(r), name,
                       time_cell(t[0]), bw_cell(r, t[0], 1.0), bw_cell(r, t[0], f), wrong_cell(t[0]), time_cell(t[1]),
                       bw_cell(r, t[1], 1.0), bw_cell(r, t[1], f), wrong_cell(t[1]));
    }
  }
  std::vector<std::string> bad;
  for (const Row& r : rows)
    for (int lib = 0; lib < 2; ++lib)
      for (int p = 0; p < 2; ++p) {
        const Timing& t = (lib == 0 ? r.nccl : r.mk)[p];
        if (t.wrong)
          bad.push_back(fmt::format("{} {} {} {}: {} wrong element(s); first: {}", lib == 0 ? "NCCL" : "mKernel",
                                    mk::name(r.coll), human_bytes(r.bytes), p ? "in-place" : "out-of-place", t.wrong,
                                    t.first_bad));
      }
  if (!bad.empty()) {
    s += "\n## WRONG RESULTS\n\n";
    for (const auto& b : bad) s += "- " + b + "\n";
  }
  return s;
}

std::string json(const RunInfo& info, const std::vector<Row>& rows) {
  using nlohmann::json;
  json j;
  j["title"] = info.title;
  j["command"] = info.command;
  j["label"] = info.label;
  j["build"] = info.build;
  j["proxy_note"] = info.proxy_note;
  j["notes"] = info.notes;
  j["nranks"] = info.nranks;
  j["rows"] = json::array();
  for (const Row& r : rows) {
    json row = {{"collective", mk::name(r.coll)}, {"bytes", r.bytes},   {"count", r.count},
                {"dtype", mk::name(r.dtype)},     {"op", mk::name(r.op)}, {"root", r.root},
                {"nccl_algo", r.nccl_algo}};
    const double f = busbw_factor(r.coll, info.nranks);
    for (int lib = 0; lib < 2; ++lib)
      for (int p = 0; p < 2; ++p) {
        const Timing& t = (lib == 0 ? r.nccl : r.mk)[p];
        if (!t.ran) continue;
        row[lib == 0 ? "nccl" : "mkernel"][p ? "in_place" : "out_of_place"] = {
            {"p10_us", t.p10},         {"p50_us", t.p50},
            {"p90_us", t.p90},         {"algbw_gbs", algbw(r, t.p50)},
            {"busbw_gbs", algbw(r, t.p50) * f}, {"wrong", t.wrong},
            {"checked", t.checked},    {"first_bad", t.first_bad}};
      }
    j["rows"].push_back(row);
  }
  return j.dump(1) + "\n";
}

std::string csv(const RunInfo& info, const std::vector<Row>& rows) {
  std::string s = "collective,bytes,count,dtype,op,root,library,placement,p10_us,p50_us,p90_us,algbw_gbs,busbw_gbs,wrong,"
                  "checked\n";
  for (const Row& r : rows) {
    const double f = busbw_factor(r.coll, info.nranks);
    for (int lib = 0; lib < 2; ++lib)
      for (int p = 0; p < 2; ++p) {
        const Timing& t = (lib == 0 ? r.nccl : r.mk)[p];
        if (!t.ran) continue;
        s += fmt::format("{},{},{},{},{},{},{},{},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f},{},{}\n", mk::name(r.coll), r.bytes,
                         r.count, mk::name(r.dtype), mk::name(r.op), r.root, lib == 0 ? "nccl" : "mkernel",
                         p ? "in_place" : "out_of_place", t.p10, t.p50, t.p90, algbw(r, t.p50), algbw(r, t.p50) * f,
                         t.wrong, t.checked);
      }
  }
  return s;
}

namespace {

// One log-x chart: series of (bytes, value) points.
struct Series {
  std::string name, color;
  bool dashed = false;
  std::vector<std::pair<double, double>> pts;
};

std::string chart(double x0, double y0, double w, double h, const std::string& title, const std::string& ylabel,
                  bool logy, const std::vector<Series>& series) {
  double xmin = 1e300, xmax = 0, ymin = 1e300, ymax = 0;
  for (const auto& s : series)
    for (auto [x, y] : s.pts) {
      if (x <= 0 || !(y > 0)) continue;
      xmin = std::min(xmin, x), xmax = std::max(xmax, x), ymin = std::min(ymin, y), ymax = std::max(ymax, y);
    }
  std::string o = fmt::format("<g><text x=\"{}\" y=\"{}\" font-size=\"14\" font-weight=\"bold\">{}</text>\n", x0,
                              y0 - 8, title);
  o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#888\"/>\n", x0, y0, w, h);
  if (xmax <= 0) return o + "</g>\n";
  if (xmax == xmin) xmax = xmin * 2;
  if (logy) {
    ymin = std::pow(10, std::floor(std::log10(ymin)));
    ymax = std::pow(10, std::ceil(std::log10(ymax)));
  } else {
    ymin = 0;
    ymax *= 1.05;
  }
  if (ymax <= ymin) ymax = ymin + 1;
  auto X = [&](double x) { return x0 + w * (std::log2(x) - std::log2(xmin)) / (std::log2(xmax) - std::log2(xmin)); };
  auto Y = [&](double y) {
    const double t = logy ? (std::log10(y) - std::log10(ymin)) / (std::log10(ymax) - std::log10(ymin))
                          : (y - ymin) / (ymax - ymin);
    return y0 + h - h * t;
  };
  // x ticks at every 4x
  for (double x = xmin; x <= xmax * 1.0001; x *= 4)
    o += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#eee\"/>"
                     "<text x=\"{0:.1f}\" y=\"{3}\" font-size=\"10\" text-anchor=\"middle\">{4}</text>\n",
                     X(x), y0, y0 + h, y0 + h + 14, human_bytes(int64_t(x)));
  std::vector<double> yt;
  if (logy)
    for (double y = ymin; y <= ymax * 1.0001; y *= 10) yt.push_back(y);
  else
    for (int k = 0; k <= 5; ++k) yt.push_back(ymin + (ymax - ymin) * k / 5);
  for (double y : yt)
    o += fmt::format("<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#eee\"/>"
                     "<text x=\"{3}\" y=\"{1:.1f}\" font-size=\"10\" text-anchor=\"end\">{4:.4g}</text>\n",
                     x0, Y(y), x0 + w, x0 - 4, y);
  o += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"11\" transform=\"rotate(-90 {} {})\" "
                   "text-anchor=\"middle\">{}</text>\n",
                   x0 - 42, y0 + h / 2, x0 - 42, y0 + h / 2, ylabel);
  for (const auto& s : series) {
    std::string pts;
    for (auto [x, y] : s.pts)
      if (x > 0 && y > 0) pts += fmt::format("{:.1f},{:.1f} ", X(x), Y(y));
    if (pts.empty()) continue;
    o += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\"{} points=\"{}\"/>\n", s.color,
                     s.dashed ? " stroke-dasharray=\"6,4\"" : "", pts);
  }
  return o + "</g>\n";
}

}  // namespace

std::string svg(const RunInfo& info, const std::vector<Row>& rows) {
  static const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};
  std::map<int, std::vector<const Row*>> by;
  for (const Row& r : rows) by[int(r.coll)].push_back(&r);
  std::vector<Series> bw, lat;
  for (auto& [c, rs] : by) {
    for (int lib = 0; lib < 2; ++lib) {
      if (lib == 0 && !info.nccl) continue;
      Series b{fmt::format("{} {}", mk::name(mk::Collective(c)), lib == 0 ? "NCCL" : "mKernel"), colors[c % 6],
               lib == 0, {}};
      Series l = b;
      for (const Row* r : rs) {
        const Timing& t = (lib == 0 ? r->nccl : r->mk)[0];
        if (!t.ran) continue;
        b.pts.emplace_back(double(r->bytes), algbw(*r, t.p50) * busbw_factor(r->coll, info.nranks));
        l.pts.emplace_back(double(r->bytes), t.p50);
      }
      bw.push_back(std::move(b));
      lat.push_back(std::move(l));
    }
  }
  const double W = 1100, H = 470;
  std::string o = fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
                              "font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
                              W, H);
  o += fmt::format("<text x=\"20\" y=\"22\" font-size=\"14\">{}</text>\n", info.title);
  if (!info.proxy_note.empty())
    o += fmt::format("<text x=\"20\" y=\"40\" font-size=\"11\" fill=\"#b00\">{}</text>\n", info.proxy_note);
  o += chart(70, 70, 440, 300, "bus bandwidth (out-of-place, median)", "GB/s", false, bw);
  o += chart(620, 70, 440, 300, "time per call (out-of-place, median)", "us", true, lat);
  double lx = 70, ly = 410;
  for (const auto& s : bw) {
    o += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{3}\" stroke-width=\"2\"{4}/>"
                     "<text x=\"{5}\" y=\"{6}\" font-size=\"11\">{7}</text>\n",
                     lx, ly, lx + 28, s.color, s.dashed ? " stroke-dasharray=\"6,4\"" : "", lx + 34, ly + 4, s.name);
    lx += 170;
    if (lx > W - 170) lx = 70, ly += 18;
  }
  return o + "</svg>\n";
}

}  // namespace mkb
