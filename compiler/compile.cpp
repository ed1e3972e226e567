#include "compiler/compile.hpp"

#include "compiler/common/trusted_fs.hpp"
#include "compiler/plan/prebuilt.hpp"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <tuple>
#include <chrono>
#include <filesystem>
#include <future>
#include <exception>
#include <nlohmann/json.hpp>
#include <mutex>
#include <optional>
#include <system_error>

#include "compiler/codegen/codegen.hpp"
#include "compiler/common/log.hpp"
#include "compiler/verify/fusion_check.hpp"
#include "mk/fusion.hpp"
#include "compiler/verify/verify.hpp"
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

// The ranks every bucket's kernel serves (buckets may class ranks
// differently); empty: every rank.
// The schedule's network connections (plan::Kernel::net): a block's puts,
// and its signals to ranks on other nodes, by (rank, tb, peer).
std::vector<plan::Kernel::NetConn> net_connections(const ir::Schedule& s) {
  std::vector<plan::Kernel::NetConn> out;
  if (!verify::has_network_ops(s)) return out;
  const topology::Topology t = ir::topology_of(s);
  std::map<std::tuple<int32_t, int32_t, int32_t>, bool> conns;
  for (const ir::Op& op : s.ops) {
    if (op.kind == ir::OpKind::put)
      conns[{op.rank, op.tb, op.dsts[0].rank}] = true;
    else if (op.kind == ir::OpKind::signal && t.node(op.peer) != t.node(op.rank))
      conns.emplace(std::make_tuple(op.rank, op.tb, op.peer), false);
  }
  for (const auto& [k, puts] : conns) out.push_back({std::get<0>(k), std::get<1>(k), std::get<2>(k), puts});
  return out;
}

std::vector<int32_t> served_by_all(const std::vector<codegen::Unit>& units) {
  std::vector<int32_t> out;
  bool all = true;
  for (const auto& u : units) {
    if (u.serves.empty()) continue;
    if (all) {
      out = u.serves;
      all = false;
      continue;
    }
    std::vector<int32_t> both;
    std::set_intersection(out.begin(), out.end(), u.serves.begin(), u.serves.end(), std::back_inserter(both));
    out = std::move(both);
  }
  return out;
}
// What a fused plan needs of its collective and dtype (the epilogue's own
// soundness is verify_epilogue's, per lowered bucket).
void check_fusion_plan(const ir::Schedule& built, const dsl::FusionInfo& f, DType dtype, RedOp op) {
  if (built.coll != Collective::allreduce)
    throw Error(ErrId::cli_E013,
                fmt::format("fusion {} runs on all-reduce outputs; {} is a {}", f.name, built.name, name(built.coll)));
  if (std::find(f.dtypes.begin(), f.dtypes.end(), dtype) == f.dtypes.end()) {
    std::string ok;
    for (DType t : f.dtypes) ok += (ok.empty() ? "" : ", ") + std::string(name(t));
    throw Error(ErrId::cli_E013, fmt::format("fusion {} does not serve {} (it serves {})", f.name, name(dtype), ok));
  }
  if (op == RedOp::premulsum && !f.pre_source.empty())
    throw Error(ErrId::cli_E013, fmt::format("fusion {} has a prologue, and a PreMulSum kernel has its own (the "
                                             "scaling); use op sum and scale in the prologue",
                                             f.name));
}

}  // namespace

std::string fusion_identity(const std::string& name) {
  if (name.empty()) return {};
  // The code's identity, not its verdict: compile_plan and the runtime check it (per dtype).
  const dsl::FusionInfo* f = dsl::find_fusion_unchecked(name);
  if (!f) throw Error(ErrId::cli_E011, fmt::format("unknown fusion '{}'", name), {}, known_fusions());
  return fusion_identity(*f);
}

std::string fusion_identity(const dsl::FusionInfo& reg) {
  const dsl::FusionInfo* f = &reg;
  const std::string& name = reg.name;
  std::string k = f->source;
  if (!f->pre_source.empty()) k += "\nprologue\n" + f->pre_source;  // (a fusion without one keeps its old identity)
  for (const auto& op : f->operands)
    k += fmt::format("\n{} {} {} {} {}", op.name, int(op.shape), op.output, op.same_dtype, int(op.dtype));
  k += fmt::format("\nrows {} {}", int(f->rows), f->max_row);
  return name + "@" + jit::hash_hex(k);
}

std::string known_fusions() {
  std::string names;
  for (const auto& f : dsl::registered_fusions()) names += (names.empty() ? "" : ", ") + f.name;
  return "known fusions: " + (names.empty() ? std::string("none") : names);
}

std::string options_json(const CompileOptions& o) {
  // A new field breaks one of these bindings: serialise it below.
  const auto& [arch, dtype, op, lower, use_cache, use_prebuilt, rank, fusion, fusion_check] = o;
  const auto& [instances, max_tbs, min_bytes, max_bytes, proto, topology, zero_copy, verify_each, orders, on_variant,
               on_pass] = lower;
  const auto& [scratch_budget, ll_max_bytes, max_tile_bytes, forced_proto, forced_tile, forced_instances,
               simple_instances, ll_instances, max_grid, simple_loads, simple_pipeline, one_pass, lamport,
               lamport_units, one_pass_generic, block_groups, ce_tile_bytes] = proto;
  (void)ce_tile_bytes;  // copy-engine transfers: no kernel
  (void)use_cache;     // where the plan is kept, not what it is
  (void)use_prebuilt;  // where the plan may come from, not what it is
  (void)on_pass;      // observes the passes, changes nothing
  (void)on_variant;   // how compile_plan takes each variant, not what it is
  (void)verify_each;  // checks the passes, changes nothing
  (void)orders;       // asks a question of the schedule, changes nothing
  nlohmann::json j = {
      {"arch", arch},
      {"dtype", std::string(name(dtype))},
      {"op", std::string(name(op))},
      {"rank", rank},
      {"fusion", fusion_identity(fusion)},
      {"lower",
       {{"instances", instances},
        {"max_tbs", max_tbs},
        {"min_bytes", min_bytes},
        {"max_bytes", max_bytes},
        {"topology", topology ? topology::to_json(*topology) : nlohmann::json()},
        {"zero_copy", zero_copy},
        {"proto",
         {{"scratch_budget", scratch_budget},
          {"ll_max_bytes", ll_max_bytes},
          {"max_tile_bytes", max_tile_bytes},
          {"forced_proto", forced_proto},
          {"forced_tile", forced_tile},
          {"forced_instances", forced_instances},
          {"simple_instances", simple_instances},
          {"ll_instances", ll_instances},
          {"max_grid", max_grid},
          {"simple_loads", simple_loads},
          {"simple_pipeline", simple_pipeline},
          {"one_pass", one_pass},
          {"lamport", lamport},
          {"lamport_units", lamport_units}}}}}};
  // only where set: every other plan keeps its key
  if (one_pass_generic != 0) j["lower"]["proto"]["one_pass_generic"] = one_pass_generic;
  if (block_groups != 1) j["lower"]["proto"]["block_groups"] = block_groups;
  // NVRTC's --Ofast-compile (MK_FAST_COMPILE): slower kernels, never served for full optimisation
  if (const std::string fc = jit::fast_compile(); fc != "0") j["fast_compile"] = fc;
  if (fusion_check && !fusion.empty()) j["fusion_check"] = true;
  return j.dump();
}

std::string plan_key(const ir::Schedule& s, const CompileOptions& o) {
  std::string k = ir::fingerprint(s);
  k += "\n//options " + options_json(o);
  k += "\n//templates " + jit::templates_hash();
  k += "\n//mkernel " MK_VERSION;
  k += "\n//nvrtc " + jit::nvrtc_identity();
  return jit::hash_hex(k);
}

plan::Plan compile_plan(ir::Schedule built, const CompileOptions& o, CompileStats* stats, const ServesFn& on_serves) {
  CompileStats local;
  CompileStats& st = stats ? *stats : local;
  if (o.rank < -1 || o.rank >= built.nranks)
    throw Error(ErrId::cli_E004, fmt::format("--rank {} is not a rank of {}", o.rank, built.nranks), {},
                fmt::format("give a rank in 0..{}, or leave --rank out for a plan that serves every rank",
                            built.nranks - 1));
  if (!collective_reduces(built.coll) && o.op != RedOp::sum)
    throw Error(ErrId::cli_E013, fmt::format("{} does not reduce; --op must be sum (the default)", name(built.coll)));
  namespace fs = std::filesystem;
  // A fused plan: the registration looked up once, so that the code compiled,
  // the code checked and the plan's label are one version of the fusion even
  // if a plugin registers the name again meanwhile (entries never change).
  const dsl::FusionInfo* reg = o.fusion.empty() ? nullptr : dsl::find_fusion_unchecked(o.fusion);
  if (!o.fusion.empty() && !reg)
    throw Error(ErrId::cli_E011, fmt::format("unknown fusion '{}'", o.fusion), {}, known_fusions());
  const std::string reg_id = reg ? fusion_identity(*reg) : std::string();
  const std::string key = plan_key(built, o);
  if (reg && fusion_identity(o.fusion) != reg_id)
    throw Error(ErrId::cli_E011, fmt::format("fusion {} was registered again while its plan was being made", o.fusion),
                {}, "call again: the new registration's plan is compiled then");
  const std::string cache = o.use_cache ? jit::private_cache_dir() : "";
  const fs::path cached = cache.empty() ? fs::path() : fs::path(cache) / "plans" / key;
  if (std::error_code ec; !cache.empty() && fs::exists(fs::symlink_status(cached, ec))) {
    // a fused plan: its code checked on this dtype (outside the try: a refusal is not a damaged entry)
    if (reg) verify::check_fusion_once(*reg, o.dtype);
    try {
      // An entry that is a link, or not ours, or that others can write, is
      // not read (tfs::entry_problem, then read_dir's checks of every file).
      if (std::string why = tfs::entry_problem(cached); !why.empty())
        throw Error(ErrId::plan_E007, cached.string() + " is " + why);
      plan::Plan p = plan::read_dir(cached.string());
      plan::check_version(p, cached.string());
      st.from_cache = true;
      return p;
    } catch (const Error& e) {
      // a damaged or untrusted cache entry: drop it, compile again, store
      // the new one
      debug_log("plan cache: dropping " + cached.string() + ": " + e.what());
      fs::remove_all(cached, ec);
    }
  }
  // Plans shipped with the library (compiler/plan/prebuilt.hpp), compiled
  // ahead of time for the common cases.
  if (o.use_cache && o.use_prebuilt) {
    if (auto pre = prebuilt::find(prebuilt::key(built, o), built, o)) {
      if (reg) verify::check_fusion_once(*reg, o.dtype);
      st.from_cache = true;
      return *pre;
    }
  }
  // Each bucket, as soon as it is proved (in its lowering worker, while the
  // other bucket is still synchronised): the resource check, code generation
  // and NVRTC; then its ops go (the plan needs the variant's settings only:
  // millions of ops at 1024 ranks, most of the memory).
  // A fused plan: the fusion as registered now (the key above hashed its code).
  // Its code is checked on the CPU (verify::check_fusion_once, this dtype)
  // while the buckets compile: the plan is returned only if it passes.
  std::optional<dsl::FusionInfo> fusion;
  std::future<void> fusion_checked;
  if (reg) {
    fusion = *reg;
    check_fusion_plan(built, *fusion, o.dtype, o.op);
    try {
      fusion_checked = std::async(std::launch::async, [reg, t = o.dtype] { verify::check_fusion_once(*reg, t); });
    } catch (const std::system_error&) {
      verify::check_fusion_once(*reg, o.dtype);  // no thread to spare: before the compile
    }
  }
  const std::string tag = fmt::format("{}_n{}_{}_{}{}", codegen::identifier(built.name), built.nranks, name(o.dtype),
                                      name(o.op), fusion ? "_" + codegen::identifier(fusion->name) : std::string());
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<codegen::Unit> units;
  std::vector<jit::CompileResult> results;
  std::vector<double> started_ms, codegen_ms, nvrtc_ms;
  std::vector<std::vector<plan::Kernel::NetConn>> nets;  // per bucket (the ops are freed after codegen)
  std::mutex sizing;  // the first bucket's worker sizes the vectors; each then writes its own
  LowerOptions lo = o.lower;
  lo.on_variant = [&](size_t b, size_t nb, ir::Schedule& v) {
    {
      std::lock_guard<std::mutex> g(sizing);
      if (units.empty()) {
        units.resize(nb);
        results.resize(nb);
        started_ms.assign(nb, 0);
        codegen_ms.assign(nb, 0);
        nvrtc_ms.assign(nb, 0);
        nets.resize(nb);
      }
    }
    started_ms[b] = ms_since(t0);
    v = passes::mark_lamport(std::move(v), o.dtype, o.lower.proto.lamport != 0);  // per dtype: after lowering
    verify::verify_resources(v);  // refuse what no communicator could load
    // the kernel's prologue is sound here, and the epilogue in its tail
    if (o.op == RedOp::premulsum) verify::verify_prologue(v);
    if (fusion && !fusion->pre_source.empty()) verify::verify_prologue(v, "prologue of fusion " + fusion->name);
    if (fusion && !fusion->source.empty()) verify::verify_epilogue(v, fusion->name);
    auto t = std::chrono::steady_clock::now();
    codegen::Limits lim;
    lim.loads = o.lower.proto.simple_loads;
    lim.pipeline = o.lower.proto.simple_pipeline != 0;
    lim.lamport_units = o.lower.proto.lamport_units;
    lim.one_pass_generic = o.lower.proto.one_pass_generic != 0;
    lim.block_groups = o.lower.proto.block_groups != 0;
    if (fusion && !fusion->pre_source.empty()) {
      lim.prologue.name = fusion->name;
      lim.prologue.source = fusion->pre_source;
    }
    if (fusion && !fusion->source.empty()) {
      lim.epilogue.name = fusion->name;
      lim.epilogue.source = fusion->source;
      for (const auto& op : fusion->operands) {
        lim.epilogue.operands.emplace_back(op.same_dtype ? o.dtype : op.dtype, int32_t(op.shape));
        lim.epilogue.outputs.push_back(op.output);
      }
      lim.epilogue.check = o.fusion_check;
      lim.epilogue.scalars = int32_t(fusion->scalars.size());
    }
    units[b] = codegen::generate_one(v, b, nb, o.dtype, o.op, tag, lim, o.rank);
    codegen_ms[b] = ms_since(t);
    if (on_serves) on_serves(units[b].serves);
    nets[b] = net_connections(v);  // before the ops go
    std::vector<ir::Op>().swap(v.ops);
    t = std::chrono::steady_clock::now();
    results[b] = jit::compile(units[b].source, units[b].kernel.name, o.arch, o.use_cache);
    nvrtc_ms[b] = ms_since(t);
  };
  Lowered l = lower(std::move(built), lo);  // (a throw waits for the check: ~future)
  if (fusion_checked.valid()) fusion_checked.get();  // its error, if the code was refused
  MK_CHECK(units.size() == l.variants.size(), "compile_plan: a bucket was not generated");
  // Every bucket's times, and the split of the wall time (CompileStats): the
  // bucket that finished last, until it was proved, its codegen, its NVRTC;
  // the others ran meanwhile.
  st.buckets.clear();
  for (size_t b = 0; b < units.size(); ++b) st.buckets.push_back({started_ms[b], codegen_ms[b], nvrtc_ms[b]});
  st.critical = 0;
  for (size_t b = 1; b < st.buckets.size(); ++b)
    if (st.buckets[b].done_ms() > st.buckets[st.critical].done_ms()) st.critical = b;
  if (!st.buckets.empty()) {
    st.lower_ms = st.buckets[st.critical].proved_ms;
    st.codegen_ms = st.buckets[st.critical].codegen_ms;
    st.nvrtc_ms = st.buckets[st.critical].nvrtc_ms;
  }
  const ir::Schedule& s0 = l.variants.front();
  st.cubins_cached = std::all_of(results.begin(), results.end(), [](const auto& r) { return r.from_cache; });

  plan::Plan p;
  p.schedule = s0.name;
  p.coll = s0.coll;
  p.nranks = s0.nranks;
  p.chunks = s0.chunks;
  p.zero_copy = s0.zero_copy;
  p.topology = s0.topology;
  p.dtype = o.dtype;
  p.op = o.op;
  p.fusion = reg_id;  // name@hash: a plan of an older version of the code is not it
  p.fusion_check = o.fusion_check && !o.fusion.empty();
  p.arch = o.arch;
  p.nvrtc_version = jit::nvrtc_version();
  p.mkernel_version = MK_VERSION;
  p.serves = served_by_all(units);
  if (p.serves.size() == size_t(p.nranks)) p.serves.clear();  // one class: the plan serves every rank
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
    k.scratch_bytes = verify::scratch_bytes(s);
    k.flag_bytes = (dev::flag_words(s.instances, k.flag_slots) + (s.zero_copy ? dev::zc_words(s.nranks) : 0)) * 8;
    k.seq_words = k.grid;
    k.pdl = o.arch >= 90;
    k.one_pass = s.one_pass;  // codegen: every kernel starts with mk::dev::grid_dependency_wait()
    k.lamport = s.lamport;
    k.net = std::move(nets[b]);
    k.cubin_file = k.name + ".sm_" + std::to_string(o.arch) + ".cubin";
    k.source_file = k.name + ".cu";
    k.cubin = std::move(results[b].cubin);
    k.source = std::move(units[b].source);
    p.kernels.push_back(std::move(k));
  }
  if (!cache.empty()) {
    // Write beside (a fresh 0700 directory), then rename: concurrent
    // compilers never see half a plan, and nobody else can reach it.
    std::error_code ec;
    std::string why = tfs::make_private_dir(cached.parent_path());
    const fs::path tmp = why.empty() ? tfs::make_temp_dir(cached, &why) : fs::path();
    try {
      if (!why.empty()) throw Error(ErrId::jit_E004, why);
      plan::write_dir(p, tmp.string(), /*private_files=*/true);
      fs::rename(tmp, cached, ec);
      if (ec) fs::remove_all(tmp, ec);  // another process won the race
    } catch (const Error& e) {
      // the cache is an optimisation; a read-only cache is not an error
      debug_log("plan cache: not stored: " + std::string(e.what()));
      if (!tmp.empty()) fs::remove_all(tmp, ec);
    }
  }
  return p;
}

}  // namespace mk::compiler
