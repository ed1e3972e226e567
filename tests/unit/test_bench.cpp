// mk_bench's GPU-free parts: the test data and its exact expected results
// (bench/data.hpp), checked here against IEEE conversions done by the host's
// own float types and a float64 sum, and the report writers.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "bench/data.hpp"
#include "bench/report.hpp"
#include "compiler/jit/jit.hpp"

using mk::Collective;
using mk::DType;

namespace {

// The value of `bits` stored as `t`, decoded by the host's own types.
double decode(unsigned long long bits, DType t) {
  switch (t) {
    case DType::fp32: {
      uint32_t b = uint32_t(bits);
      float f;
      std::memcpy(&f, &b, 4);
      return f;
    }
    case DType::fp64: {
      double d;
      std::memcpy(&d, &bits, 8);
      return d;
    }
    case DType::bf16: {
      uint32_t b = uint32_t(bits) << 16;
      float f;
      std::memcpy(&f, &b, 4);
      return f;
    }
    case DType::fp16: {
      uint16_t b = uint16_t(bits);
      _Float16 h;
      std::memcpy(&h, &b, 2);
      return double(h);
    }
    default: return std::nan("");
  }
}

}  // namespace

TEST_CASE("bench data: every unit count is stored exactly in every float format") {
  for (DType t : {DType::fp16, DType::bf16, DType::fp32, DType::fp64}) {
    const int kind = mkb::dtype_kind(t), bytes = int(mk::dtype_size(t));
    for (long long u = -255; u <= 255; ++u) {
      CAPTURE(u);
      CHECK(decode(mkb::to_bits(u, kind, bytes), t) == double(u) / 4.0);
    }
  }
  // integers: two's complement in the element's width
  CHECK(mkb::to_bits(-1, 0, 1) == 0xffull);
  CHECK(mkb::to_bits(-3, 0, 4) == 0xfffffffdull);
  CHECK(mkb::to_bits(-3, 0, 8) == 0xfffffffffffffffdull);
  CHECK(mkb::to_bits(300, 0, 1) == 300 % 256);
  CHECK(mkb::dtype_kind(DType::fp8e4m3) == -1);
}

TEST_CASE("bench data: values differ per rank, element and set, and stay in range") {
  for (int n : {1, 2, 3, 8, 64}) {
    const int K = mkb::unit_range(n);
    CHECK(K >= 1);
    CHECK(K * n <= 255);  // every partial sum has at most 8 significant bits
    std::set<long long> seen;
    int differ_rank = 0, differ_set = 0;
    for (unsigned long long e = 0; e < 2000; ++e) {
      const long long u = mkb::units(0, e, 0, K);
      CHECK(u >= -K);
      CHECK(u <= K);
      seen.insert(u);
      differ_rank += u != mkb::units(n > 1 ? 1 : 5, e, 0, K);
      differ_set += u != mkb::units(0, e, 1, K);
    }
    CHECK(seen.size() >= size_t(std::min(2 * K + 1, 50)));
    CHECK(differ_rank > 1000);
    CHECK(differ_set > 1000);
  }
}

TEST_CASE("bench data: expected outputs are the float64 results of the collectives") {
  for (DType t : {DType::bf16, DType::fp16, DType::fp32}) {
    const int kind = mkb::dtype_kind(t), bytes = int(mk::dtype_size(t));
    for (int n : {2, 3, 8}) {
      const int K = mkb::unit_range(n);
      const int64_t count = 37;
      auto in = [&](int r, int64_t e, unsigned set) { return decode(mkb::to_bits(mkb::units(r, e, set, K), kind, bytes), t); };
      for (int64_t e = 0; e < count; ++e) {
        // all-reduce: the float64 sum of every rank's value, held exactly
        double sum = 0;
        for (int r = 0; r < n; ++r) sum += in(r, e, 2);
        CHECK(decode(mkb::expected_bits(Collective::allreduce, t, n, 0, 1, count, e, 2), t) == sum);
        // all-gather: block b of the output is rank b's input
        for (int b = 0; b < n; ++b)
          CHECK(decode(mkb::expected_bits(Collective::allgather, t, n, 0, n - 1, count, b * count + e, 1), t) ==
                in(b, e, 1));
        // reduce-scatter: rank q gets the sum of every rank's block q
        double rs = 0;
        for (int r = 0; r < n; ++r) rs += in(r, 1 * count + e, 0);
        CHECK(decode(mkb::expected_bits(Collective::reducescatter, t, n, 0, 1, count, e, 0), t) == rs);
        // all-to-all: rank q's block p is rank p's block q
        CHECK(decode(mkb::expected_bits(Collective::alltoall, t, n, 0, 1, count, 0 * count + e, 0), t) ==
              in(0, 1 * count + e, 0));
      }
    }
  }
}

TEST_CASE("bench data: the check kernels compile with NVRTC") {
  if (mk::jit::supported_archs().empty()) {
    MESSAGE("SKIPPED: NVRTC not available");
    return;
  }
  const auto r = mk::jit::compile(mkb::kernel_source(), "mk_bench_data", 90, false);
  CHECK(!r.cubin.empty());
}

TEST_CASE("bench report: sizes, percentiles and bus bandwidth") {
  CHECK(mkb::parse_size("8") == 8);
  CHECK(mkb::parse_size("64K") == 65536);
  CHECK(mkb::parse_size("16M") == (16 << 20));
  CHECK(mkb::parse_size("1G") == (int64_t(1) << 30));
  CHECK(mkb::parse_size("1GiB") == (int64_t(1) << 30));
  CHECK(mkb::parse_size("x") == -1);
  CHECK(mkb::parse_size("12Q") == -1);
  CHECK(mkb::parse_size("") == -1);
  CHECK(mkb::human_bytes(16384) == "16 KiB");
  CHECK(mkb::human_bytes(3 << 20) == "3 MiB");
  CHECK(mkb::human_bytes(1000) == "1000 B");
  double a, b, c;
  mkb::percentiles({5, 1, 4, 2, 3, 9, 8, 7, 6, 10, 11}, &a, &b, &c);
  CHECK(a == 2);
  CHECK(b == 6);
  CHECK(c == 10);
  CHECK(mkb::busbw_factor(Collective::allreduce, 2) == 1.0);
  CHECK(mkb::busbw_factor(Collective::allreduce, 8) == doctest::Approx(1.75));
  CHECK(mkb::busbw_factor(Collective::allgather, 4) == doctest::Approx(0.75));
  CHECK(mkb::busbw_factor(Collective::broadcast, 4) == 1.0);
}

TEST_CASE("bench report: tables, JSON, CSV and the plot say what was measured") {
  mkb::RunInfo info;
  info.title = "t";
  info.nranks = 2;
  info.command = "mk_bench -b 1K";
  info.build = "mKernel 100 (the library), mk_bench built from commit abc123";
  std::vector<mkb::Row> rows(2);
  for (int i = 0; i < 2; ++i) {
    rows[size_t(i)].coll = Collective::allreduce;
    rows[size_t(i)].bytes = 1024 << (2 * i);
    rows[size_t(i)].count = rows[size_t(i)].bytes / 2;
    for (auto* t : {&rows[size_t(i)].nccl[0], &rows[size_t(i)].mk[0]}) {
      t->ran = true;
      t->p10 = 9, t->p50 = 10, t->p90 = 12;
      t->checked = 40;
    }
    rows[size_t(i)].mk[0].p50 = 5;
  }
  rows[1].mk[0].wrong = 3;
  rows[1].mk[0].first_bad = "rank 1 output element 7";
  const std::string md = mkb::markdown(info, rows);
  CHECK(md.find("| allreduce | 1 KiB |") != std::string::npos);
  CHECK(md.find("\nBuild: mKernel 100 (the library), mk_bench built from commit abc123\n") != std::string::npos);
  CHECK(md.find("2.00x") != std::string::npos);  // 10 us vs 5 us
  CHECK(md.find("WRONG RESULTS") != std::string::npos);
  CHECK(md.find("rank 1 output element 7") != std::string::npos);
  const auto j = nlohmann::json::parse(mkb::json(info, rows));
  CHECK(j["rows"].size() == 2);
  CHECK(j["build"] == info.build);
  CHECK(j["rows"][0]["mkernel"]["out_of_place"]["p50_us"] == 5.0);
  // 1 KiB in 5 us = 0.2048 GB/s algbw; at 2 ranks busbw equals it
  CHECK(j["rows"][0]["mkernel"]["out_of_place"]["busbw_gbs"].get<double>() == doctest::Approx(0.2048));
  CHECK(j["rows"][1]["mkernel"]["out_of_place"]["wrong"] == 3);
  CHECK(!j["rows"][0].contains("in_place"));
  const std::string c = mkb::csv(info, rows);
  CHECK(std::count(c.begin(), c.end(), '\n') == 1 + 4);  // header + 2 rows x 2 libraries
  const std::string s = mkb::svg(info, rows);
  CHECK(s.rfind("<svg", 0) == 0);
  CHECK(s.find("</svg>") != std::string::npos);
  CHECK(s.find("polyline") != std::string::npos);
  // without a clean result nothing claims to be ok
  rows[0].mk[0].ran = false;
  CHECK(mkb::markdown(info, rows).find("| - |") != std::string::npos);
}
