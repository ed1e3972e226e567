// choose_protocol: per size bucket, pick the protocol, tile size, scratch
// depth, instances and block size.
//
//  simple  data lands in scratch with plain 16-byte stores; a release/acquire
//          flag per dependency says it is there. Best for bandwidth.
//  ll      "low latency": every 8 bytes of data travel with a 4-byte step flag
//          in one 16-byte store, so the reader polls the data itself and no
//          separate flag round trip is needed. Half the bandwidth; best for
//          small messages. Needs every scratch slot written once per step.
//
// Defaults stand in for a measured table (`mkc tune` will replace them): LL up
// to 256 KiB (16 instances: one step per launch, so the symmetric schedules
// run in one pass, passes/one_pass.cpp), simple above. The bucket fixes the *largest* tile (it sizes the
// scratch slots: bounded by the scratch budget and 256 KiB); each launch picks
// its tile at run time up to that (templates/layout.cuh pick_tile_bytes).
//
// Needs: thread blocks assigned. Guarantees: proto, tile_bytes (multiple of
// 16), depth >= 1 and instances set (instances x tbs <= max_grid when a cap
// is given and one instance fits it); tile * scratch * depth * instances (x2
// for LL) fits the scratch budget.
#include <algorithm>
#include <map>

#include "compiler/passes/passes.hpp"
#include "compiler/verify/hb.hpp"

namespace mk::passes {

namespace {

bool ll_possible(const ir::Schedule& s) {
  // A NIC copies bytes as they are: it writes no LL flags and cannot wait
  // for them in its source, so puts travel the simple protocol only.
  for (const ir::Op& op : s.ops)
    if (op.kind == ir::OpKind::put) return false;
  // LL scratch slots have one writer a step: access_needs' double_write,
  // from a table of each scratch chunk's writer (the full needs took a
  // second at 1024 ranks for this one answer).
  const size_t cells = size_t(std::max(s.nranks, 1)) * size_t(std::max(s.scratch, 0));
  if (cells > (size_t(1) << 26)) return !verify::access_needs(s, false, true).double_write;
  std::vector<int64_t> writer(cells, -1);
  for (size_t oi = 0; oi < s.ops.size(); ++oi) {
    const ir::Op& op = s.ops[oi];
    if (!op.is_data()) continue;
    for (const ir::Ref& d : op.dsts) {
      if (d.buf != ir::Buf::scratch) continue;
      for (int32_t k = 0; k < d.count; ++k) {
        const ir::Ref at = d.at(k);
        if (at.rank < 0 || at.rank >= s.nranks || at.index < 0 || at.index >= s.scratch)  // the verifier's to report
          return !verify::access_needs(s, false, true).double_write;
        if (op.is_copy() && !op.srcs.empty() && op.srcs[0].at(k) == at) continue;  // writes nothing
        int64_t& w = writer[size_t(at.rank) * size_t(s.scratch) + size_t(at.index)];
        if (w >= 0 && w != int64_t(oi)) return false;
        w = int64_t(oi);
      }
    }
  }
  return true;
}

// Tiles are whole 16-byte vectors; from 4 KiB up, whole 4 KiB pages (tidy
// strides for the scratch layout).
int64_t clamp_tile(int64_t t, int64_t lo, int64_t hi) {
  t = std::max(lo, std::min(hi, t));
  return t >= 4096 ? t / 4096 * 4096 : std::max<int64_t>(16, t / 16 * 16);
}

Bucket make_bucket(const ir::Schedule& s, int64_t lo, int64_t hi, ir::Proto proto, const ProtocolOptions& o) {
  Bucket b;
  b.min_bytes = lo;
  b.max_bytes = hi;
  b.proto = proto;
  b.depth = 2;
  const int32_t floor = proto == ir::Proto::ll ? o.ll_instances : o.simple_instances;
  b.instances = o.forced_instances > 0 ? o.forced_instances : std::max(s.instances, floor);
  if (o.max_grid > 0) b.instances = std::max(1, std::min(b.instances, o.max_grid / std::max(s.tbs, 1)));
  b.threads = proto == ir::Proto::ll ? 256 : 512;
  const int64_t ll_factor = proto == ir::Proto::ll ? 2 : 1;
  // Largest tile the scratch budget allows.
  const int64_t per_tile = int64_t(std::max(s.scratch, 1)) * b.depth * b.instances * ll_factor;
  const int64_t budget_tile = o.scratch_budget / per_tile;
  // Largest tile a message of this bucket can use (one tile per chunk per instance).
  int64_t want = o.max_tile_bytes;
  if (hi >= 0) {
    const int64_t chunk = (hi + s.chunks - 1) / s.chunks;
    want = std::min(want, ((chunk + b.instances - 1) / b.instances + 15) / 16 * 16);
  }
  if (o.forced_tile > 0) want = o.forced_tile;
  b.tile_bytes = clamp_tile(std::min(want, budget_tile), 16, std::max(o.max_tile_bytes, o.forced_tile));
  return b;
}

}  // namespace

std::vector<Bucket> plan_buckets(const ir::Schedule& s, int64_t min_bytes, int64_t max_bytes,
                                 const ProtocolOptions& o) {
  MK_CHECK(min_bytes >= 0 && (max_bytes < 0 || max_bytes >= min_bytes), "bad byte range");
  std::vector<Bucket> out;
  if (o.forced_proto >= 0) {
    auto p = ir::Proto(o.forced_proto);
    if (p == ir::Proto::ll && !ll_possible(s))
      throw Error(ErrId::cli_E013,
                  "schedule '" + s.name + "' writes a scratch slot more than once per step, or moves data "
                  "between nodes (puts); the LL protocol needs one write per slot and loads and stores",
                  {}, "use --proto simple");
    out.push_back(make_bucket(s, min_bytes, max_bytes, p, o));
    return out;
  }
  int64_t lo = min_bytes;
  if (ll_possible(s) && lo <= o.ll_max_bytes) {
    int64_t hi = max_bytes < 0 ? o.ll_max_bytes : std::min(max_bytes, o.ll_max_bytes);
    out.push_back(make_bucket(s, lo, hi, ir::Proto::ll, o));
    lo = hi + 1;
    if (max_bytes >= 0 && lo > max_bytes) return out;
  }
  out.push_back(make_bucket(s, lo, max_bytes, ir::Proto::simple, o));
  return out;
}

ir::Schedule choose_protocol(ir::Schedule s, const Bucket& b) {
  MK_CHECK(b.tile_bytes >= 16 && b.tile_bytes % 16 == 0, "tile must be a multiple of 16 bytes");
  s.proto = b.proto;
  s.tile_bytes = b.tile_bytes;
  s.depth = b.depth;
  s.instances = b.instances;
  return s;
}

}  // namespace mk::passes
