#include "compiler/compile.hpp"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <exception>
#include <thread>

#include "compiler/codegen/codegen.hpp"
#include "compiler/jit/jit.hpp"
#include "templates/abi.cuh"

#ifndef MK_VERSION
#define MK_VERSION "dev"
#endif

namespace mk::compiler {

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

// Everything a plan depends on, hashed without formatting text: the built IR,
// the options, the templates, mKernel's and NVRTC's identity.
std::string plan_key(const ir::Schedule& s, const CompileOptions& o) {
  std::string k;
  k.reserve(s.ops.size() * 48 + 256);
  auto put = [&](int64_t v) { k.append(reinterpret_cast<const char*>(&v), sizeof v); };
  k += s.name + "|" + s.topology + "|" + MK_VERSION + "|" + jit::templates_hash() + "|" + jit::nvrtc_identity();
  for (int64_t v : {int64_t(s.coll), int64_t(s.nranks), int64_t(s.root), int64_t(s.chunks), int64_t(s.instances),
                    int64_t(s.scratch), int64_t(o.arch), int64_t(o.dtype), int64_t(o.op), int64_t(o.lower.instances),
                    int64_t(o.lower.max_tbs), o.lower.min_bytes, o.lower.max_bytes, o.lower.proto.scratch_budget,
                    o.lower.proto.ll_max_bytes, o.lower.proto.max_tile_bytes, int64_t(o.lower.proto.forced_proto),
                    o.lower.proto.forced_tile, int64_t(o.lower.proto.forced_instances),
                    int64_t(o.lower.proto.simple_instances), int64_t(o.lower.proto.ll_instances),
                    int64_t(o.lower.zero_copy)})
    put(v);
  for (const auto& op : s.ops) {
    put(int64_t(op.kind) | int64_t(op.rank) << 8 | int64_t(op.tb) << 40);
    for (const auto* list : {&op.srcs, &op.dsts}) {
      put(int64_t(list->size()));
      for (const auto& r : *list) put(int64_t(r.rank) | int64_t(r.buf) << 20 | int64_t(r.index) << 24 | int64_t(r.count) << 48);
    }
    put(int64_t(op.loc.line));
    k += op.loc.file;
  }
  return jit::hash_hex(k);
}

plan::Plan compile_plan(ir::Schedule built, const CompileOptions& o, CompileStats* stats) {
  CompileStats local;
  CompileStats& st = stats ? *stats : local;
  if (!collective_reduces(built.coll) && o.op != RedOp::sum)
    throw Error(ErrId::cli_E013, fmt::format("{} does not reduce; --op must be sum (the default)", name(built.coll)));
  namespace fs = std::filesystem;
  const std::string key = plan_key(built, o);
  const fs::path cached = fs::path(jit::cache_dir()) / "plans" / key;
  if (o.use_cache && fs::exists(cached / "plan.json")) {
    try {
      plan::Plan p = plan::read_dir(cached.string());
      st.from_cache = true;
      return p;
    } catch (const Error&) {
      // a damaged cache entry: drop it, compile again, store the new one
      std::error_code ec;
      fs::remove_all(cached, ec);
    }
  }
  auto t0 = std::chrono::steady_clock::now();
  Lowered l = lower(std::move(built), o.lower);
  st.lower_ms = ms_since(t0);

  const ir::Schedule& s0 = l.variants.front();
  const std::string tag = fmt::format("{}_n{}_{}_{}", codegen::identifier(s0.name), s0.nranks, name(o.dtype), name(o.op));
  t0 = std::chrono::steady_clock::now();
  std::vector<codegen::Unit> units = codegen::generate(l.variants, o.dtype, o.op, tag);
  st.codegen_ms = ms_since(t0);

  // One NVRTC program per bucket, compiled side by side.
  t0 = std::chrono::steady_clock::now();
  std::vector<jit::CompileResult> results(units.size());
  std::vector<std::exception_ptr> errors(units.size());
  {
    std::vector<std::thread> threads;
    for (size_t i = 0; i < units.size(); ++i)
      threads.emplace_back([&, i] {
        try {
          results[i] = jit::compile(units[i].source, units[i].kernel.name, o.arch, o.use_cache);
        } catch (...) {
          errors[i] = std::current_exception();
        }
      });
    for (auto& t : threads) t.join();
  }
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  st.nvrtc_ms = ms_since(t0);
  st.from_cache = std::all_of(results.begin(), results.end(), [](const auto& r) { return r.from_cache; });

  plan::Plan p;
  p.schedule = s0.name;
  p.coll = s0.coll;
  p.nranks = s0.nranks;
  p.chunks = s0.chunks;
  p.zero_copy = s0.zero_copy;
  p.topology = s0.topology;
  p.dtype = o.dtype;
  p.op = o.op;
  p.arch = o.arch;
  p.nvrtc_version = jit::nvrtc_version();
  p.mkernel_version = MK_VERSION;
  for (size_t b = 0; b < l.variants.size(); ++b) {
    const ir::Schedule& s = l.variants[b];
    const auto& bk = l.buckets[b];
    plan::Kernel k;
    k.name = units[b].kernel.name;
    k.bucket = int32_t(b);
    k.min_bytes = bk.min_bytes;
    k.max_bytes = bk.max_bytes;
    k.proto = std::string(ir::name(s.proto));
    k.max_tile_bytes = s.tile_bytes;
    k.instances = s.instances;
    k.tbs = s.tbs;
    k.threads = units[b].kernel.block;
    k.grid = units[b].kernel.grid;
    k.depth = s.depth;
    k.scratch_slots = std::max(s.scratch, 1);
    k.flag_slots = std::max(s.slots, 1);
    k.classes = units[b].kernel.classes;
    k.scratch_bytes =
        s.scratch == 0 ? 0 : s.tile_bytes * (s.proto == ir::Proto::ll ? 2 : 1) * k.scratch_slots * s.depth * s.instances;
    k.flag_bytes = (dev::flag_words(s.instances, k.flag_slots) + (s.zero_copy ? dev::zc_words(s.nranks) : 0)) * 8;
    k.seq_words = k.grid;
    k.cubin_file = k.name + ".sm_" + std::to_string(o.arch) + ".cubin";
    k.source_file = k.name + ".cu";
    k.cubin = std::move(results[b].cubin);
    k.source = std::move(units[b].source);
    p.kernels.push_back(std::move(k));
  }
  if (o.use_cache) {
    // Write beside, then rename: concurrent compilers never see half a plan.
    std::error_code ec;
    fs::path tmp = cached;
    tmp += fmt::format(".tmp.{}", ::getpid());
    try {
      plan::write_dir(p, tmp.string());
      fs::rename(tmp, cached, ec);
      if (ec) fs::remove_all(tmp, ec);  // another process won the race
    } catch (const Error&) {
      fs::remove_all(tmp, ec);  // the cache is an optimisation; a read-only cache is not an error
    }
  }
  return p;
}

}  // namespace mk::compiler
