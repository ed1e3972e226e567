// mkc: the mKernel compiler driver.
//
//   mkc list
//   mkc verify   SCHEDULE [--ranks N] [--root R] [--strict]
//   mkc show     SCHEDULE [--ranks N] [--svg OUT.svg] [--pick]
//   mkc lower    SCHEDULE [--ranks N] --dump-after=PASS
//   mkc compile  SCHEDULE [--ranks N] [--rank R] --dtype T --op O -o DIR
//   mkc simulate SCHEDULE [--ranks N] --dtype T --op O --count C
//   mkc import   FILE.xml|FILE.json [-o schedule.json]
//   mkc export   SCHEDULE [--ranks N] --format msccl-xml [-o out.xml]
//   mkc composite NAME|FILE.cpp --ranks N [--simulate --dtype T --op O --count C]
//   mkc info
//
// SCHEDULE is `--schedule NAME` (built-in or plugin) or a FILE: a C++ DSL file
// (.cpp), an MSCCL XML algorithm (.xml), an MSCCL++ execution plan (.json) or
// an mKernel IR JSON (.json, as `mkc import -o` writes it); verify and
// simulate check every schedule a .cpp file defines, --schedule picks one of
// them (the other commands need one). --ranks is
// required for DSL schedules; a file fixes its own rank count, and --ranks,
// if given, must match it. load_schedule() below is the one place that turns
// any of these into a raw ir::Schedule.
//
// Exit codes: 0 success, 1 a user error (printed with its [mk.*] id), 2 bad
// command line, 3 an internal error (a bug in mKernel).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "compiler/codegen/codegen.hpp"
#include "mk/composite.hpp"
#include "compiler/common/side_by_side.hpp"
#include "compiler/compile.hpp"
#include "compiler/cost/cost.hpp"
#include "compiler/importers/importers.hpp"
#include "compiler/jit/jit.hpp"
#include "compiler/pipeline.hpp"
#include "compiler/plan/prebuilt.hpp"
#include "compiler/plugin.hpp"
#include "compiler/sources.hpp"
#include "compiler/topology/topology.hpp"
#include "runtime/topology/machine.hpp"
#include "compiler/verify/composite.hpp"
#include "compiler/verify/executor.hpp"
#include "compiler/verify/fusion_check.hpp"
#include "compiler/verify/verify.hpp"
#include "mk/dsl.hpp"
#include "mk/fusion.hpp"
#include "runtime/comm/comm.hpp"
#include "runtime/comm/env.hpp"
#include "runtime/api/status.hpp"
#include "tools/mkc/tune.hpp"

using namespace mk;
namespace fs = std::filesystem;

namespace {

constexpr int kMaxRanks = 1024;
constexpr int kRanksUnset = -1;  // --ranks not given

// Options shared by the commands that take a schedule.
struct Common {
  std::string schedule;
  std::string file;
  std::vector<std::string> plugins;
  int ranks = kRanksUnset;
  int root = 0;
  int instances = 0;
  int max_tbs = 32;
  std::string topology;
  std::string topology_file;  // --topology-file (mkc topo)
  std::optional<topology::Topology> topo;  // parsed by load_schedule; unset: the file's own
  std::string proto;  // "", simple, ll
  int64_t tile = 0;
  int64_t min_bytes = 0;
  int64_t max_bytes = -1;
  bool zero_copy = false;
  std::string tune;  // MK_TUNE's syntax
};

void add_common(CLI::App* c, Common& o, bool sizes) {
  c->add_option("file", o.file,
                "a schedule file instead of --schedule: DSL (.cpp), MSCCL XML (.xml), MSCCL++ plan or mKernel IR (.json)");
  c->add_option("-s,--schedule", o.schedule,
                "a built-in or plugin schedule (see `mkc list`); with a DSL FILE, which of its schedules");
  c->add_option("-n,--ranks", o.ranks, "number of ranks (GPUs); required for DSL schedules, files fix their own");
  c->add_option("--root", o.root,
                "root rank for broadcast/reduce (plans are built for root 0 and relabelled; verify and simulate "
                "also check this root)");
  c->add_option("--instances", o.instances, "parallel instances (default: what the schedule asks for)");
  c->add_option("--max-tbs", o.max_tbs, "thread blocks per rank per instance at most");
  c->add_option("--topology", o.topology,
                 "nvlink:N (default), pcie:N, NxG (N nodes of G GPUs, network between nodes) or NxG:direct "
                 "(every pair linked: a stand-in, not a real machine); NxG implies --ranks N*G");
  c->add_option("--topology-file", o.topology_file,
                "the machine from a file `mkc topo -o FILE` wrote on it (instead of --topology); implies --ranks");
  c->add_option("--plugin", o.plugins, "load schedules from a plugin library (.so)");
  c->add_option("--proto", o.proto, "force a protocol: simple or ll");
  c->add_option("--tile", o.tile, "force the tile size in bytes (a multiple of 16)");
  c->add_option("--tune", o.tune,
                "protocol knobs in MK_TUNE's syntax (key=value,...; `mkc info` lists the keys), e.g. "
                "simple_instances=32,max_tile=131072");
  c->add_flag("--zero-copy", o.zero_copy,
              "lower for registered buffers: ops access peers' user buffers directly (no staging, no scratch)");
  if (sizes) {
    c->add_option("--min-bytes", o.min_bytes, "smallest message (bytes per rank) the plan covers");
    c->add_option("--max-bytes", o.max_bytes, "largest message (bytes per rank), -1 for no limit");
  }
}

std::string names_of(const std::vector<dsl::ScheduleInfo>& list) {
  std::string names;
  for (const auto& f : list) names += (names.empty() ? "" : ", ") + f.name;
  return names;
}

// The DSL schedules to build: every schedule of a .cpp file (or the one
// --schedule names), or a registered name.
std::vector<dsl::ScheduleInfo> resolve(const Common& o) {
  if (!o.file.empty()) {
    auto found = plugin::load_source(o.file);
    if (o.schedule.empty()) return found;
    for (const auto& f : found)
      if (f.name == o.schedule) return {f};
    throw Error(ErrId::cli_E001, fmt::format("{} defines no schedule '{}'", o.file, o.schedule), {},
                fmt::format("it defines: {}", names_of(found)));
  }
  if (o.schedule.empty())
    throw Error(ErrId::cli_E001, "no schedule given", {},
                "pass --schedule NAME (see `mkc list`), a DSL FILE.cpp, an MSCCL FILE.xml or a FILE.json");
  const dsl::ScheduleInfo* info = dsl::find_schedule(o.schedule);
  if (!info) {
    std::string names;
    for (const auto& s : dsl::registered_schedules()) names += " " + s.name;
    throw Error(ErrId::cli_E001, "unknown schedule '" + o.schedule + "'", {}, "known schedules:" + names);
  }
  return {*info};
}

void check_ranks(const Common& o) {
  if (o.ranks < 1 || o.ranks > kMaxRanks)
    throw Error(ErrId::cli_E004, fmt::format("--ranks {} is out of range: it must be >= 1 and <= {}", o.ranks, kMaxRanks),
                {}, "--ranks is the number of GPUs, e.g. --ranks 8");
  if (o.root < 0 || o.root >= o.ranks)
    throw Error(ErrId::cli_E004, fmt::format("--root {} is not a rank of {}", o.root, o.ranks));
  if (o.min_bytes < 0) throw Error(ErrId::cli_E011, "--min-bytes must be >= 0");
  if (o.max_bytes >= 0 && o.min_bytes > o.max_bytes)
    throw Error(ErrId::cli_E005, fmt::format("--min-bytes {} is greater than --max-bytes {}", o.min_bytes, o.max_bytes));
  if (o.tile < 0 || o.tile % 16 != 0) throw Error(ErrId::cli_E011, "--tile must be a positive multiple of 16");
  if (o.instances < 0 || o.instances > 64) throw Error(ErrId::cli_E011, "--instances must be in 1..64");
  if (o.max_tbs < 1 || o.max_tbs > 1024) throw Error(ErrId::cli_E011, "--max-tbs must be in 1..1024");
}

compiler::LowerOptions lower_options(const Common& o) {
  compiler::LowerOptions l;
  l.instances = o.instances;
  l.max_tbs = o.max_tbs;
  l.min_bytes = o.min_bytes;
  l.max_bytes = o.max_bytes;
  l.topology = o.topo;
  if (!o.proto.empty()) {
    auto p = ir::parse_proto(o.proto);
    if (!p) throw Error(ErrId::cli_E011, "--proto must be simple or ll");
    l.proto.forced_proto = int(*p);
  }
  l.proto.forced_tile = o.tile;
  l.zero_copy = o.zero_copy;
  if (!o.tune.empty()) {
    try {
      rt::env::apply_tune(o.tune, &l.proto);
    } catch (const rt::RtError& e) {
      throw Error(ErrId::cli_E011, std::string("--tune: ") + e.what(), {}, "keys: " + rt::env::tune_keys());
    }
  }
  return l;
}

// A raw schedule and where it came from.
struct Loaded {
  ir::Schedule raw;
  std::string name;  // what messages call it
  Collective coll = Collective::allreduce;
  bool imported = false;  // from an .xml/.json file
  importers::ImportInfo info;
};

// The one way every command obtains its schedules: a DSL name or .cpp file
// (built for --ranks; a file may define several), or an imported file (MSCCL
// XML, MSCCL++ plan, IR JSON) whose rank count then becomes o.ranks. Rooted
// collectives are built for root 0 and relabelled at run time.
std::vector<Loaded> load_schedules(Common& o) {
  if (!o.topology.empty() && !o.topology_file.empty())
    throw Error(ErrId::cli_E011, "give either --topology or --topology-file, not both");
  for (const auto& p : o.plugins) plugin::load_library(p);
  const bool dsl_file = !o.file.empty() && plugin::is_dsl_source(o.file);
  if (!o.file.empty() && !dsl_file && !o.schedule.empty())
    throw Error(ErrId::cli_E011, "give either a file or --schedule, not both", {},
                "--schedule picks a schedule from a DSL .cpp file only");
  Loaded l;
  if (!o.file.empty() && !dsl_file) {
    l.raw = importers::import_file(o.file, &l.info);
    l.imported = true;
    if (o.ranks != kRanksUnset && o.ranks != l.raw.nranks)
      throw Error(ErrId::cli_E004,
                  fmt::format("--ranks {} does not match '{}', which is written for {} ranks", o.ranks, o.file,
                              l.raw.nranks),
                  {}, "leave --ranks out for imported files");
    o.ranks = l.raw.nranks;
    check_ranks(o);
    if (!o.topology_file.empty()) o.topo = topology::read_file(o.topology_file, o.ranks);
    if (!o.topology.empty()) o.topo = topology::parse(o.topology, o.ranks);
    l.name = l.raw.name.empty() ? fs::path(o.file).filename().string() : l.raw.name;
    l.coll = l.raw.coll;
    std::vector<Loaded> one;
    one.push_back(std::move(l));
    return one;
  }
  std::optional<topology::Topology> from_file;
  if (!o.topology_file.empty()) {
    from_file = topology::read_file(o.topology_file, o.ranks == kRanksUnset ? 0 : o.ranks);
    if (o.ranks == kRanksUnset) o.ranks = from_file->nranks();
  }
  if (o.ranks == kRanksUnset && !o.topology.empty()) o.ranks = topology::parse(o.topology, 0).nranks();
  if (o.ranks == kRanksUnset)
    throw Error(ErrId::cli_E004, "--ranks is required for a DSL schedule", {}, "e.g. --ranks 8");
  check_ranks(o);
  o.topo = from_file ? *from_file : topology::parse(o.topology, o.ranks);
  std::vector<Loaded> out;
  for (const auto& info : resolve(o)) {
    Loaded d;
    d.raw = dsl::build(info, *o.topo, 0);
    d.name = info.name;
    d.coll = info.coll;
    out.push_back(std::move(d));
  }
  return out;
}

// Commands that produce one thing (a plan, a picture) need one schedule.
Loaded load_schedule(Common& o) {
  auto all = load_schedules(o);
  if (all.size() > 1) {
    std::string names;
    for (const auto& l : all) names += (names.empty() ? "" : ", ") + l.name;
    throw Error(ErrId::cli_E011, fmt::format("{} defines several schedules ({})", o.file, names), {},
                "pick one with --schedule NAME");
  }
  return std::move(all.front());
}

// Broadcast and reduce take a root; the others must leave it at 0.
void check_root(const Common& o, Collective c) {
  if (o.root != 0 && !collective_rooted(c))
    throw Error(ErrId::cli_E011, "--root applies to broadcast and reduce only");
}

DType dtype_arg(const std::string& s) {
  auto t = parse_dtype(s);
  if (!t)
    throw Error(ErrId::cli_E002, "unknown dtype '" + s + "'", {},
                "use int8 uint8 int32 uint32 int64 uint64 fp16 bf16 fp32 fp64 fp8e4m3 fp8e5m2 "
                "(NCCL names like float, half, bfloat16 work too)");
  return *t;
}

RedOp op_arg(const std::string& s) {
  auto t = parse_redop(s);
  if (!t) throw Error(ErrId::cli_E003, "unknown reduction op '" + s + "'", {}, "use sum prod min max avg");
  return *t;
}

int cmd_list() {
  fmt::print("{:<24} {:<14} {}\n", "schedule", "collective", "description");
  for (const auto& s : dsl::registered_schedules())
    fmt::print("{:<24} {:<14} {}\n", s.name, name(s.coll), s.doc);
  const auto composites = dsl::registered_composites();
  if (!composites.empty()) {
    fmt::print("\n{:<39} {}\n", "composite (mkc composite NAME)", "description");
    for (const auto& c : composites) fmt::print("{:<39} {}\n", c.name, c.doc);
  }
  const auto fusions = dsl::registered_fusions();
  if (!fusions.empty()) {
    fmt::print("\n{:<24} {:<14} {}\n", "fusion (--fusion NAME)", "runs", "description");
    for (const auto& f : fusions) {
      const char* runs = f.source.empty() ? "prologue" : f.pre_source.empty() ? "epilogue" : "both";
      fmt::print("{:<24} {:<14} {}\n", f.name, runs, f.doc);
    }
  }
  return 0;
}

// What `mkc verify` checks determinism for: a call of one dtype and op, or
// (no --dtype) of any dtype.
struct CallKind {
  std::optional<DType> dtype;
  RedOp op = RedOp::sum;
};

// The fusion `mkc verify --fusion` and `mkc simulate --fusion` name (its
// file loaded first): unchecked, for the checker's own report.
const dsl::FusionInfo& named_fusion(const std::string& fusion) {
  const dsl::FusionInfo* f = dsl::find_fusion_unchecked(fusion);
  if (!f) {
    std::string names;
    for (const auto& x : dsl::registered_fusions()) names += (names.empty() ? "" : ", ") + x.name;
    throw Error(ErrId::cli_E011, fmt::format("unknown fusion '{}'", fusion), {},
                fmt::format("known fusions: {}; load yours with a FILE.cpp argument, --plugin or MK_SCHEDULES",
                            names.empty() ? "none" : names));
  }
  return *f;
}

int verify_one(const Common& o, Loaded in, bool strict, const CallKind& call = {},
               const dsl::FusionInfo* fusion = nullptr) {
  auto t0 = std::chrono::steady_clock::now();
  check_root(o, in.coll);
  size_t nops = in.raw.ops.size();
  const bool rooted = collective_rooted(in.coll);
  if (rooted && o.root != 0) verify::verify_root(in.raw, o.root);
  const std::string scope =
      call.dtype ? fmt::format("{} {}", name(*call.dtype), name(call.op)) : std::string("every dtype and op");
  std::string determinism = fmt::format(
      "every rank combines each reduction in the same order and rounds it at the same points (bit-identical "
      "results, {})",
      scope);
  // set below when the answer for the call is "yes" but not for every dtype
  // Deterministic as written and as lowered (what the kernel runs), answered
  // by the lowering's own symbolic runs (LowerOptions::orders).
  compiler::LowerOptions lo = lower_options(o);
  lo.orders = true;
  // Each bucket, as soon as it is proved (in its lowering worker): the
  // resource check, then its ops go, as compile_plan does (at 1024 ranks a
  // bucket's millions of ops are hundreds of megabytes, and the other bucket
  // is still being synchronised).
  size_t pairs = 0;
  if (fusion && in.coll != Collective::allreduce)
    throw Error(ErrId::cli_E013, fmt::format("fusion {} runs on all-reduce outputs; {} is a {}", fusion->name, in.name,
                                             name(in.coll)));
  lo.on_variant = [&](size_t b, size_t, ir::Schedule& v) {
    verify::verify_resources(v);
    // what compile_plan asks of a fused plan: the kernel runs the prologue
    // once on every input and the epilogue after every output is final
    if (fusion && !fusion->pre_source.empty()) verify::verify_prologue(v, "prologue of fusion " + fusion->name);
    if (fusion && !fusion->source.empty()) verify::verify_epilogue(v, fusion->name);
    if (b == 0)
      for (const auto& op : v.ops) pairs += op.kind == ir::OpKind::signal;
    std::vector<ir::Op>().swap(v.ops);
  };
  const compiler::Lowered l = compiler::lower(std::move(in.raw), lo);  // proves it first
  // The first answer that matters for the call (as written before as
  // lowered) is reported; E015 is a warning without --strict.
  if (collective_reduces(in.coll) && call.dtype)
    for (const verify::Orders* why : {&l.nondeterministic_written, &l.nondeterministic_lowered}) {
      if (why->empty() || !why->for_call(call.dtype, call.op).empty()) continue;
      // bit-identical for this call, though not for every dtype or op
      determinism = fmt::format("bit-identical results for {} ({})", scope,
                                !why->order.empty() ? "ranks combine in different orders, which integers, min and "
                                                      "max do not show"
                                                    : "ranks round at different points, which this dtype does not "
                                                      "show");
      break;
    }
  if (collective_reduces(in.coll))
    for (const verify::Orders* why : {&l.nondeterministic_written, &l.nondeterministic_lowered}) {
      if (why->for_call(call.dtype, call.op).empty()) continue;
      const Error x = verify::nondeterministic_error(*why, call.dtype, call.op);
      if (strict) throw x;
      std::cerr << "mkc: warning: " << x.what() << "\n";
      const bool rounding = &why->for_call(call.dtype, call.op) == &why->rounding;
      determinism = rounding ? "NOT bit-identical across ranks in fp16, bf16 and fp8 (ranks round at different "
                               "points; fp32, fp64 and integers agree; see the warning; --strict refuses it)"
                             : "NOT deterministic across ranks (see the warning; --strict refuses it)";
      break;
    }
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const std::string roots =
      !rooted ? ""
      : o.root != 0
          ? fmt::format(" for root 0 and root {} (relabelled as the kernel does; by the same relabelling, every root)",
                        o.root)
          : " for root 0 and, by relabelling (rank r runs as (r - root) mod n), every root";
  fmt::print(
      "proved: {} ({}) for {} ranks{}: {} operations compute the collective in-place and out-of-place for every "
      "count; bounds hold; {} bucket(s) synchronised ({} signal(s) in the first), no race, no deadlock; {}{} ({:.0f} "
      "ms)\n",
      in.name, name(in.coll), o.ranks, roots, nops, l.variants.size(), pairs, determinism,
      !fusion ? std::string()
              : fmt::format("; with fusion {}, every bucket's kernel runs {}", fusion->name,
                            !fusion->pre_source.empty() && !fusion->source.empty()
                                ? "the prologue once on every input element and the epilogue after every output "
                                  "element is final"
                            : !fusion->pre_source.empty() ? "the prologue once on every input element, by its owner"
                                                          : "the epilogue after every output element is final"),
      ms);
  return 0;
}

// mkc composite NAME|FILE.cpp -n N: a composite's buffers and stages, which
// stage runs after which, and the proof of every schedule a stage names.
ir::Schedule pick_variant(const compiler::Lowered& l, int bucket, int64_t bytes);

struct CompositeSim {
  bool on = false;
  std::string dtype = "bf16", op = "sum";
  int64_t count = 1000;
  uint64_t seed = 1;
};

// Every stage's schedule lowered for `count` elements (the one it names, or
// the runtime's selection for the size), then the composite on the CPU.
void simulate_composite(const Common& o, const dsl::Composite& c, const CompositeSim& cs) {
  const DType t = dtype_arg(cs.dtype);
  const RedOp op = op_arg(cs.op);
  if (cs.count < 0) throw Error(ErrId::cli_E011, "--count must be >= 0");
  const int64_t bytes = cs.count * int64_t(dtype_size(t));
  std::vector<ir::Schedule> lowered;
  std::string names;
  for (const dsl::Stage& st : c.stages()) {
    Common v = o;
    v.file.clear();
    v.root = 0;
    if (st.schedule.empty()) {
      const rt::Choice ch = rt::choose_schedule(st.coll, c.ranks(), bytes);
      v.schedule = ch.schedule;
      v.tune = ch.tune;
    } else {
      v.schedule = st.schedule;
    }
    names += (names.empty() ? "" : ", ") + v.schedule;
    Loaded in = std::move(load_schedules(v).front());
    const compiler::LowerOptions lo = lower_options(v);
    auto l = compiler::lower(std::move(in.raw), lo);
    ir::Schedule s = pick_variant(l, -1, bytes);
    lowered.push_back(passes::mark_lamport(std::move(s), t, lo.proto.lamport != 0));
  }
  std::vector<const ir::Schedule*> ptrs;
  for (const auto& s : lowered) ptrs.push_back(&s);
  const verify::CompositeSimResult r = verify::simulate_composite(c, ptrs, t, op, cs.count, cs.seed);
  fmt::print("simulated: {} stage(s) ({}), {} {}, count {}: {} element(s) of every buffer and rank checked against "
             "the float64 reference of the stages in program order; max error {:.3g}, {} mismatch(es)\n",
             c.stages().size(), names, name(t), name(op), cs.count, r.checked, r.max_err, r.mismatches);
  if (!r.ok) throw Error(ErrId::verify_E013, "simulated composite differs from the float64 reference: " + r.first_bad);
}

int cmd_composite(Common o, const std::string& target, const CompositeSim& cs) {
  for (const auto& p : o.plugins) plugin::load_library(p);
  if (o.ranks == kRanksUnset) throw Error(ErrId::cli_E004, "--ranks is required", {}, "e.g. --ranks 8");
  check_ranks(o);
  std::vector<dsl::CompositeInfo> todo;
  if (plugin::is_dsl_source(target)) {
    std::set<std::string> before;
    for (const auto& c : dsl::registered_composites()) before.insert(c.name + "@" + c.file);
    plugin::load_source(target);
    for (const auto& c : dsl::registered_composites())
      if (!before.count(c.name + "@" + c.file)) todo.push_back(c);
    if (todo.empty())
      throw Error(ErrId::cli_E001, target + " defines no composite", {},
                  "register one with MK_COMPOSITE(\"name\", builder, \"description\")");
  } else {
    const dsl::CompositeInfo* info = dsl::find_composite(target);
    if (!info) {
      std::string names;
      for (const auto& c : dsl::registered_composites()) names += " " + c.name;
      throw Error(ErrId::cli_E001, "unknown composite '" + target + "'", {},
                  names.empty() ? std::string("none is registered; load a file with MK_SCHEDULES or --plugin")
                                : "known composites:" + names);
    }
    todo.push_back(*info);
  }
  for (const auto& info : todo) {
    const dsl::Composite c = dsl::build_composite(info, o.ranks);
    fmt::print("composite {} for {} ranks ({}:{}): {}\n", info.name, o.ranks, fs::path(info.file).filename().string(),
               info.line, info.doc);
    fmt::print("  buffers, in mkCompositeRun's order (elements per rank for a call of count c):\n");
    for (size_t b = 0; b < c.buffers().size(); ++b) {
      const int64_t per = c.buffer_elems(int(b), 1);
      fmt::print("    {:>2}  {:<20} {}\n", b, c.buffers()[b],
                 per == 0 ? std::string("unused") : per == 1 ? std::string("c") : fmt::format("{} x c", per));
    }
    fmt::print("  stages:\n");
    for (size_t j = 0; j < c.stages().size(); ++j) {
      const dsl::Stage& st = c.stages()[j];
      std::string after;
      for (size_t i = 0; i < j; ++i)
        if (c.depends(int(i), int(j))) after += (after.empty() ? "" : ", ") + std::to_string(i);
      fmt::print("    {:>2}  {:<14} {} -> {}{}  schedule: {}  {}  ({})\n", j, name(st.coll), c.buffers()[size_t(st.in)],
                 c.buffers()[size_t(st.out)], collective_rooted(st.coll) ? fmt::format(" root {}", st.root) : "",
                 st.schedule.empty() ? "the runtime's selection for the size" : st.schedule,
                 after.empty() ? "independent of the stages before" : "after stage(s) " + after, st.loc.str());
    }
    std::set<std::string> proved;
    for (const dsl::Stage& st : c.stages()) {
      if (st.schedule.empty() || !proved.insert(st.schedule).second) continue;
      Common v = o;
      v.schedule = st.schedule;
      v.file.clear();
      v.root = 0;
      for (auto& l : load_schedules(v)) verify_one(v, std::move(l), false);
    }
    if (cs.on) simulate_composite(o, c, cs);
    fmt::print("ok: {} stage(s); ordered stages run in program order on the same thread blocks, the others side by "
               "side (one group kernel, docs/composites.md)\n",
               c.stages().size());
  }
  return 0;
}

int cmd_verify(Common o, bool strict, const std::string& dtype, const std::string& op, const std::string& fusion) {
  CallKind call;
  if (!dtype.empty()) call.dtype = dtype_arg(dtype);
  if (!op.empty()) {
    if (!call.dtype) throw Error(ErrId::cli_E011, "--op needs --dtype (without it, every dtype and op is checked)");
    call.op = op_arg(op);
  }
  const bool schedule = !o.schedule.empty() || (!o.file.empty() && !plugin::is_dsl_source(o.file)) ||
                        (!o.file.empty() && o.ranks != kRanksUnset);
  const dsl::FusionInfo* f = nullptr;
  if (!fusion.empty()) {
    // a fusion of a DSL file: load it (its schedules too, verified below when --ranks is given)
    for (const auto& p : o.plugins) plugin::load_library(p);
    if (!o.file.empty() && plugin::is_dsl_source(o.file)) plugin::load_source(o.file);
    f = &named_fusion(fusion);
    verify::FusionCheckOptions fo;
    if (call.dtype) fo.dtypes = {*call.dtype};
    const auto t0 = std::chrono::steady_clock::now();
    const verify::FusionCheckReport rep = verify::check_fusion(*f, fo);
    fmt::print("checked: fusion {} ({}:{}) on the CPU: {} ({:.0f} ms)\n", f->name, fs::path(f->file).filename().string(),
               f->line, rep.summary,
               std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    if (!schedule) return 0;
  }
  auto all = load_schedules(o);
  for (size_t k = 0; k < all.size(); ++k) verify_one(o, std::move(all[k]), strict, call, f);
  return 0;
}

int cmd_lower(Common o, const std::string& dump_after, const std::string& emit) {
  const auto& names = compiler::pass_names();
  if (dump_after != "all" && std::find(names.begin(), names.end(), dump_after) == names.end()) {
    std::string list;
    for (const auto& n : names) list += " " + n;
    throw Error(ErrId::cli_E008, "unknown pass '" + dump_after + "'", {}, "passes:" + list + " (or all)");
  }
  if (emit != "text" && emit != "json") throw Error(ErrId::cli_E011, "--emit must be text or json");
  ir::Schedule s = load_schedule(o).raw;
  auto lo = lower_options(o);
  int bucket = -1;
  lo.on_pass = [&](std::string_view pass, const ir::Schedule& x, const compiler::PassInfo& info) {
    // every bucket starts with "protocol" (counted even when not printed)
    if (pass == "protocol") ++bucket;
    // the lowering log, like Halide's: every pass, its time, whether it changed anything
    std::cerr << fmt::format("mkc: {:<12} {:9.2f} ms{}{}\n", pass, info.ms,
                             pass == "protocol" || pass == "sync" ? fmt::format(" (bucket {})", bucket) : "",
                             info.changed ? "" : " (unchanged)");
    if (dump_after != "all" && pass != dump_after) return;
    std::string label(pass);
    if (pass == "protocol" || pass == "sync") label += fmt::format(" (bucket {})", bucket);
    if (emit == "json") {
      std::cout << ir::to_json(x, 1) << "\n";
    } else {
      std::cout << "=== after " << label << " ===\n" << ir::print(x);
    }
  };
  compiler::lower(std::move(s), lo);
  return 0;
}

ir::Schedule pick_variant(const compiler::Lowered& l, int bucket, int64_t bytes) {
  if (bucket >= 0) {
    if (bucket >= int(l.variants.size()))
      throw Error(ErrId::cli_E011, fmt::format("--bucket {}: the plan has {} bucket(s)", bucket, l.variants.size()));
    return l.variants[size_t(bucket)];
  }
  return compiler::variant_for(l, bytes);
}

// Message sizes (bytes per rank) `mkc show` estimates.
constexpr int64_t kShowSizes[] = {1 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20};

// The cost model's estimate for each of kShowSizes, on the bucket that size runs.
std::vector<double> estimates(const compiler::Lowered& l) {
  std::vector<double> out;
  for (int64_t b : kShowSizes) {
    ir::Schedule v = pick_variant(l, -1, b);
    out.push_back(cost::estimate_us(v, ir::topology_of(v), b));
  }
  return out;
}

// Among the built-in schedules of `coll`, the one with the lowest estimate at
// each size ("" where none lowers for this topology). Only an estimate: the
// runtime selects from its own table (runtime/plans/select.cpp).
std::vector<std::string> estimate_picks(Collective coll, const Common& o) {
  std::vector<std::string> best(std::size(kShowSizes));
  std::vector<double> best_us(best.size(), 0);
  for (const auto& info : dsl::registered_schedules()) {
    if (info.coll != coll || info.copy_engine) continue;  // estimates are for kernels
    std::vector<double> us;
    try {
      us = estimates(compiler::lower(dsl::build(info, *o.topo, 0), lower_options(o)));
    } catch (const Error&) {
      continue;  // does not fit this topology (e.g. crosses nodes)
    }
    for (size_t i = 0; i < us.size(); ++i)
      if (best[i].empty() || us[i] < best_us[i]) best[i] = info.name, best_us[i] = us[i];
  }
  return best;
}

int cmd_show(Common o, const std::string& svg_path, int bucket, bool show_ir, bool pick, bool show_classes) {
  Loaded in = load_schedule(o);
  auto l = compiler::lower(std::move(in.raw), lower_options(o));
  ir::Schedule v = pick_variant(l, bucket < 0 ? int(l.variants.size()) - 1 : bucket, 0);
  const topology::Topology topo = ir::topology_of(v);
  auto tl = cost::step_timeline(v, topo, v.tile_bytes);
  if (show_ir) std::cout << ir::print(v) << "\n";
  if (show_classes)
    std::cout << codegen::print_classes(codegen::rank_classes(v, lower_options(o).proto.one_pass_generic != 0));
  std::cout << cost::text(v, tl);
  const auto us = estimates(l);
  const auto best = pick && !in.imported ? estimate_picks(in.coll, o) : std::vector<std::string>{};
  fmt::print("estimate_us on {} (alpha-beta model, not measured):\n", topo.name());
  for (size_t i = 0; i < us.size(); ++i)
    fmt::print("  {:>10} B/rank {:10.2f} us{}\n", kShowSizes[i], us[i],
               best.empty() ? "" : fmt::format("   lowest estimate: {}", best[i].empty() ? "-" : best[i]));
  if (!svg_path.empty()) {
    std::ofstream f(svg_path);
    f << cost::svg(v, tl);
    if (!f) throw Error(ErrId::cli_E012, "cannot write " + svg_path);
    std::cout << "wrote " << svg_path << "\n";
  }
  return 0;
}

int cmd_compile(Common o, const std::string& dtype, const std::string& op, const std::string& arch,
                const std::string& out, bool no_cache, int32_t rank, const std::string& fusion, bool fusion_check) {
  compiler::CompileOptions co;
  co.rank = rank;
  co.fusion = fusion;
  if (fusion_check && fusion.empty()) throw Error(ErrId::cli_E011, "--fusion-check needs --fusion");
  co.fusion_check = fusion_check;
  co.dtype = dtype_arg(dtype);
  co.op = op_arg(op);
  co.arch = jit::parse_arch(arch);
  co.use_cache = !no_cache;
  co.use_prebuilt = false;  // a plan directory with its sources, compiled here
  auto t0 = std::chrono::steady_clock::now();
  Loaded in = load_schedule(o);
  if (const dsl::ScheduleInfo* info = dsl::find_schedule(in.name); info && info->copy_engine && !in.imported)
    throw Error(ErrId::cli_E011,
                fmt::format("{} runs on copy engines: there is no kernel to compile (the runtime issues its "
                            "transfers; `mkc verify` and `mkc simulate` check its data flow)",
                            in.name));
  ir::Schedule s = std::move(in.raw);
  co.lower = lower_options(o);
  compiler::CompileStats st;
  plan::Plan p = compiler::compile_plan(std::move(s), co, &st);
  plan::write_dir(p, out);
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::cout << plan::summary(p);
  const char* cached = st.from_cache ? ", from cache" : st.cubins_cached ? ", cubins cached" : "";
  // The wall time and its critical path (the bucket that finished last:
  // until it was proved, its codegen, its NVRTC), then every bucket's own
  // times: buckets are lowered and compiled side by side, so they overlap.
  std::string per;
  if (st.buckets.size() > 1 && !st.from_cache)
    for (size_t b = 0; b < st.buckets.size(); ++b)
      per += fmt::format("\n  bucket {}: proved at {:.0f} ms, codegen {:.0f}, NVRTC {:.0f}{}", b,
                         st.buckets[b].proved_ms, st.buckets[b].codegen_ms, st.buckets[b].nvrtc_ms,
                         b == st.critical ? " (the critical path)" : "");
  fmt::print("wrote {}/plan.json and {} cubin(s); {:.0f} ms (lower {:.0f}, codegen {:.0f}, NVRTC {:.0f}{}{}){}\n", out,
             p.kernels.size(), ms, st.lower_ms, st.codegen_ms, st.nvrtc_ms, cached,
             st.buckets.size() > 1 && !st.from_cache ? fmt::format("; bucket {} is the critical path", st.critical)
                                                      : std::string(),
             per);
  // A plan of every rank whose kernel holds a code path per rank class
  // (one-pass kernels: one per rank) costs that many times a rank's own.
  int32_t most = 1;
  for (const auto& k : p.kernels) most = std::max(most, k.classes);
  if (rank < 0 && p.serves.empty() && most > 2)
    fmt::print("note: a kernel of this plan holds {} code paths (rank classes, `mkc show --classes`), one per group of "
               "ranks; a rank's first call compiles only its own: `--rank R` compiles that plan (a fraction of the "
               "time), and `--tune one_pass_generic=1` gives one-pass kernels one path for every rank (1-3 us slower "
               "a call up to 8 KiB)\n",
               most);
  return 0;
}

// Which data `mkc simulate` runs: for fp16, bf16 and fp8 sums and averages,
// data whose every partial sum is exact (sums checked exactly) and data whose
// partial sums round (checked against a float64 bound; shows ranks that
// round at different points); other dtypes and ops have one kind of data.
enum class SimData { exact, inexact, both };

void simulate_one(const Common& o, verify::SimOptions so, Loaded in, int bucket, SimData data, bool strict) {
  const int64_t count = so.count;
  const bool inplace = so.inplace;
  const int launches = so.launches;
  if (!collective_reduces(in.coll) && so.op != RedOp::sum)
    throw Error(ErrId::cli_E013, fmt::format("{} does not reduce; --op must be sum (the default)", name(in.coll)));
  // What the runtime would run: it never gives a PreMulSum call to the copy
  // engines (they cannot scale an input); it takes the built-in table's
  // kernel schedule instead (runtime/comm/comm.cpp create_instance).
  if (so.op == RedOp::premulsum && !in.imported)
    if (const dsl::ScheduleInfo* info = dsl::find_schedule(in.name); info && info->copy_engine)
      throw Error(ErrId::cli_E013,
                  fmt::format("{} runs on copy engines, which cannot scale an input: the runtime never runs a PreMulSum "
                              "call on it (it takes the built-in table's kernel schedule)",
                              in.name),
                  {}, "simulate a kernel schedule with --op premulsum (e.g. -s allreduce.ring), or this one with --op sum");
  const compiler::LowerOptions lo = lower_options(o);
  auto l = compiler::lower(std::move(in.raw), lo);
  ir::Schedule v = pick_variant(l, bucket, count * int64_t(dtype_size(so.dtype)));
  v = passes::mark_lamport(std::move(v), so.dtype, lo.proto.lamport != 0);  // as compile_plan does
  // What the proof says of bit-identity across ranks for this call (the
  // variant the simulation runs), so that the two tools agree.
  const verify::Orders orders = verify::nondeterminism(v);
  const std::string& why = orders.for_call(so.dtype, so.op);
  const bool narrow = so.dtype == DType::fp16 || so.dtype == DType::bf16 || so.dtype == DType::fp8e4m3 ||
                      so.dtype == DType::fp8e5m2;
  const bool two_kinds = narrow && (so.op == RedOp::sum || so.op == RedOp::avg);
  std::vector<bool> kinds;  // inexact?
  if (!two_kinds || data != SimData::inexact) kinds.push_back(false);
  if (two_kinds && data != SimData::exact) kinds.push_back(true);
  int64_t diffs = 0;
  std::string first_diff;
  for (bool inexact : kinds) {
    so.inexact = inexact;
    auto r = verify::simulate(v, so);
    fmt::print(
        "{} ({} ranks, {} {}, count {}, {}{}, proto {}{}, tile {} B, {} step(s), {} launch(es){}): max error {:.3g} "
        "(tolerance {:.3g}), {} mismatch(es){}\n",
        in.name, o.ranks, name(so.dtype), name(so.op), count, inplace ? "in-place" : "out-of-place",
        collective_rooted(in.coll) ? fmt::format(", root {}", o.root) : "", ir::name(v.proto),
        v.lamport ? " (Lamport packets)" : "", v.tile_bytes, r.steps, launches,
        !two_kinds ? "" : inexact ? ", data whose partial sums round" : ", data whose partial sums are exact",
        r.max_err, r.max_tol, r.mismatches,
        r.rank_diffs ? fmt::format(", {} element(s) differ bit-wise between ranks", r.rank_diffs) : "");
    if (r.mismatches)
      throw Error(ErrId::verify_E013, "simulated result differs from the float64 reference: " + r.first_bad);
    if (r.rank_diffs && first_diff.empty()) first_diff = r.first_diff;
    diffs += r.rank_diffs;
  }
  if (diffs && why.empty())
    throw Error(ErrId::verify_E013,
                fmt::format("ranks differ bit-wise ({}), although the verifier proves them bit-identical for {} {}",
                            first_diff, name(so.dtype), name(so.op)),
                {}, "this is a bug in mKernel's lowering, proof or arithmetic: please report it with the command line");
  if (!why.empty()) {
    // the same verdict as `mkc verify`: a warning, refused with --strict
    const Error x = verify::nondeterministic_error(orders, so.dtype, so.op);
    if (strict) throw x;
    std::cerr << "mkc: warning: " << x.what() << "\n";
    fmt::print("ok: every value within the float64 reference's tolerance; ranks are NOT bit-identical ({}; see the "
               "warning, mk.verify.E015; --strict refuses it)\n",
               diffs ? first_diff : "the data did not show it here");
    return;
  }
  std::cout << "ok\n";
}

// mkc simulate --fusion NAME: the fused all-reduce on the CPU (verify::simulate_fusion).
void simulate_fused(const Common& o, Loaded in, const dsl::FusionInfo& f, const verify::SimOptions& so, int bucket,
                    int64_t row, const std::vector<double>& scalars, bool strict) {
  if (so.op != RedOp::sum)
    throw Error(ErrId::cli_E013, fmt::format("a fused all-reduce runs op sum (fusion {}; a prologue scales)", f.name));
  if (const dsl::ScheduleInfo* info = dsl::find_schedule(in.name); info && info->copy_engine && !in.imported)
    throw Error(ErrId::cli_E013,
                fmt::format("{} runs on copy engines, which run no prologue or epilogue: the runtime gives fused calls "
                            "the built-in table's kernel schedule",
                            in.name),
                {}, "simulate a kernel schedule (e.g. -s allreduce.ring)");
  verify::check_fusion_once(f);  // what the runtime asks before it runs the fusion
  const compiler::LowerOptions lo = lower_options(o);
  auto l = compiler::lower(std::move(in.raw), lo);
  ir::Schedule v = pick_variant(l, bucket, so.count * int64_t(dtype_size(so.dtype)));
  v = passes::mark_lamport(std::move(v), so.dtype, lo.proto.lamport != 0);
  if (!f.pre_source.empty()) verify::verify_prologue(v, "prologue of fusion " + f.name);
  if (!f.source.empty()) verify::verify_epilogue(v, f.name);
  // The same verdict on bit-identity as `mkc verify` and plain simulate.
  const verify::Orders orders = verify::nondeterminism(v);
  const bool may_differ = !orders.for_call(so.dtype, RedOp::sum).empty();
  verify::FusionSimOptions fo;
  fo.dtype = so.dtype;
  fo.count = so.count;
  fo.row = row;
  fo.inplace = so.inplace;
  fo.seed = so.seed;
  fo.ranks_may_differ = may_differ;
  if (!scalars.empty()) fo.scalars.assign(size_t(v.nranks), scalars);
  const verify::FusionSimResult r = verify::simulate_fusion(v, f, fo);
  if (!r.first_bad.empty()) throw Error(r.bad_id, "simulated fused all-reduce: " + r.first_bad);
  fmt::print("{} ({} ranks, {}, count {}, {}) with fusion {}{}: the all-reduce{} against float64: max error {:.3g} "
             "(tolerance {:.3g}){}; {}\n",
             in.name, v.nranks, name(so.dtype), so.count, so.inplace ? "in-place" : "out-of-place", f.name,
             f.source.empty() ? "" : fmt::format(" (rows of {})", row > 0 ? row : 4096),
             f.pre_source.empty() ? "" : " of the prologue's values", r.max_err, r.max_tol,
             f.source.empty() ? ""
             : r.reference
                 ? fmt::format("; the epilogue against its float64 reference: max error {:.3g} (tolerance {:.3g})",
                               r.ref_max_err, r.ref_max_tol)
                 : std::string("; the epilogue has no float64 reference (MK_FUSION_REFERENCE)"),
             may_differ ? fmt::format("ranks NOT bit-identical ({} all-reduce element(s) differ here; see the warning, "
                                      "mk.verify.E015)",
                                      r.rank_diffs)
                        : std::string("every rank's results bit-identical"));
  if (may_differ) {
    const Error x = verify::nondeterministic_error(orders, so.dtype, RedOp::sum);
    if (strict) throw x;
    std::cerr << "mkc: warning: " << x.what() << "\n";
  }
  std::cout << "ok\n";
}

int cmd_simulate(Common o, const std::string& dtype, const std::string& op, int64_t count, bool inplace,
                 int launches, uint64_t seed, int bucket, const std::string& data, bool strict,
                 const std::string& fusion, int64_t row, const std::vector<double>& scalars) {
  verify::SimOptions so;
  so.dtype = dtype_arg(dtype);
  so.op = op_arg(op);
  if (count < 0) throw Error(ErrId::cli_E011, "--count must be >= 0");
  if (launches < 1 || launches > 1000) throw Error(ErrId::cli_E011, "--launches must be in 1..1000");
  SimData d = SimData::both;
  if (data == "exact")
    d = SimData::exact;
  else if (data == "inexact")
    d = SimData::inexact;
  else if (data != "both")
    throw Error(ErrId::cli_E011, "--data must be exact, inexact or both, not '" + data + "'");
  so.count = count;
  so.inplace = inplace;
  so.root = o.root;
  so.launches = launches;
  so.seed = seed;
  if (!fusion.empty()) {
    auto all = load_schedules(o);  // a DSL file's fusions register as it loads
    const dsl::FusionInfo& f = named_fusion(fusion);
    for (auto& in : all) simulate_fused(o, std::move(in), f, so, bucket, row, scalars, strict);
    return 0;
  }
  for (auto& in : load_schedules(o)) simulate_one(o, so, std::move(in), bucket, d, strict);
  return 0;
}

std::string bytes_str(int64_t b) { return b < 0 ? "unbounded" : fmt::format("{}", b); }

// mkc import FILE [-o schedule.json]: what the file holds, the IR it becomes,
// and the proof that it computes its collective.
int cmd_import(const std::string& file, const std::string& out, bool no_verify) {
  importers::ImportInfo info;
  ir::Schedule s = importers::import_file(file, &info);
  size_t copies = 0, reduces = 0;
  for (const auto& op : s.ops) (op.kind == ir::OpKind::copy ? copies : reduces) += op.is_data();
  const char* fmt_name = info.format == "msccl-xml"      ? "MSCCL XML"
                         : info.format == "mscclpp-json" ? "MSCCL++ execution plan"
                                                         : "mKernel IR JSON";
  fmt::print("imported {} ({}): '{}' {}, {} ranks\n", file, fmt_name, info.name, name(s.coll), s.nranks);
  if (info.format != "mk-ir-json") {
    std::string uses = info.inplace && info.outofplace ? "in-place and out-of-place"
                       : info.inplace                  ? "in-place"
                                                       : "out-of-place";
    fmt::print("  file: {} thread block(s), {} step(s), {} {}, {} ordering edge(s); protocol {}; declared {}; "
               "sizes {}..{} bytes\n",
               info.threadblocks, info.steps, info.transfers,
               info.format == "msccl-xml" ? "send/receive pair(s)" : "remote data op(s)", info.sync_edges,
               info.protocol, uses, info.min_bytes, bytes_str(info.max_bytes));
  }
  fmt::print("  IR: {} op(s) ({} copy, {} reduce), {} chunk(s) per block, {} scratch slot(s); {} staging op(s) added; "
             "{} reading\n",
             copies + reduces, copies, reduces, s.chunks, s.scratch, info.staging_ops, info.reading);
  for (const auto& n : info.notes) fmt::print("  note: {}\n", n);
  if (no_verify) {
    fmt::print("not verified (--no-verify)\n");
  } else {
    verify::verify_semantics(s);
    fmt::print("proved: computes {} in-place and out-of-place for {} ranks; no race, no deadlock in the file's "
               "ordering\n",
               name(s.coll), s.nranks);
  }
  if (!out.empty()) {
    std::ofstream f(out);
    f << ir::to_json(s, 1) << "\n";
    if (!f) throw Error(ErrId::cli_E012, "cannot write " + out);
    fmt::print("wrote {}\n", out);
  }
  return 0;
}

// mkc export SCHEDULE --format msccl-xml [-o out.xml]
int cmd_export(Common o, const std::string& format, const std::string& out) {
  if (format != "msccl-xml")
    throw Error(ErrId::cli_E011, "--format must be msccl-xml, got '" + format + "'");
  Loaded in = load_schedule(o);
  verify::verify_semantics(in.raw);  // only a correct schedule is worth exporting
  std::string x = importers::export_msccl_xml(in.raw);
  if (out.empty()) {
    std::cout << x;
    return 0;
  }
  std::ofstream f(out);
  f << x;
  if (!f) throw Error(ErrId::cli_E012, "cannot write " + out);
  fmt::print("wrote {}: {} ({}) for {} ranks as MSCCL XML\n", out, in.name, name(in.coll), o.ranks);
  return 0;
}

// This machine as a topology file (runtime/topology/machine.hpp).
int cmd_topo(int nodes, const std::string& out) {
  std::string text;
  try {
    text = rt::local_machine_json(nodes);
  } catch (const rt::RtError& e) {
    throw Error(ErrId::cli_E011, std::string("mkc topo: ") + e.what(), {},
                "run it on a machine of the job, with its GPUs visible (CUDA_VISIBLE_DEVICES)");
  }
  if (out.empty()) {
    std::cout << text;
    return 0;
  }
  std::ofstream f(out);
  f << text;
  f.close();
  if (!f) throw Error(ErrId::cli_E012, "cannot write " + out);
  fmt::print("wrote {}: {}\n", out, topology::read_file(out, 0).name());
  return 0;
}

// Every plan a communicator of `ranks` ranks on `archs` would ask for, for
// the six collectives in these dtypes and ops, compiled into a prebuilt
// directory (compiler/plan/prebuilt.hpp) that the library reads.
int cmd_prebuild(const std::vector<std::string>& archs, const std::vector<int>& ranks,
                 const std::vector<std::string>& dtypes, const std::vector<std::string>& copy_dtypes,
                 const std::vector<std::string>& ops, const std::string& out, int jobs) {
  struct Job {
    std::string schedule, tune;
    Collective coll;
    int nranks, arch, rank;
    DType dtype;
    RedOp op;
  };
  std::vector<Job> all;
  for (const auto& a : archs)
    for (int n : ranks) {
      if (n < 1) throw Error(ErrId::cli_E004, fmt::format("--ranks {}: must be at least 1", n));
      for (int ci = 0; ci < kNumCollectives; ++ci) {
        const Collective coll = Collective(ci);
        for (const rt::Choice& s : rt::schedules_for(coll, n)) {
          // collectives that only move data also for the copy dtypes, one plan
          // per element size (rt::kernel_dtype: it serves every type of that size)
          std::vector<std::string> ds = dtypes;
          if (!collective_reduces(coll)) {
            ds.clear();
            std::vector<std::string> all = dtypes;
            all.insert(all.end(), copy_dtypes.begin(), copy_dtypes.end());
            for (const auto& d : all) {
              const std::string k{name(rt::kernel_dtype(coll, dtype_arg(d)))};
              if (std::find(ds.begin(), ds.end(), k) == ds.end()) ds.push_back(k);
            }
          }
          for (const auto& d : ds)
            for (const auto& o : ops) {
              const RedOp op = op_arg(o);
              if (!collective_reduces(coll) && o != ops.front()) continue;
              // Up to 64 ranks (-1): a plan per rank class, each filed under
              // the keys of the ranks it serves (below); above, a plan per rank.
              for (int r = n <= 64 ? -1 : 0; r < (n <= 64 ? 0 : n); ++r)
                all.push_back({s.schedule, s.tune, coll, n, jit::parse_arch(a), r, dtype_arg(d),
                               collective_reduces(coll) ? op : RedOp::sum});
            }
        }
      }
    }
  prebuilt::Writer w(out);
  std::mutex mu;
  std::string first_error;
  std::atomic<size_t> compiled{0};
  const auto t0 = std::chrono::steady_clock::now();
  if (jobs < 1) throw Error(ErrId::cli_E004, fmt::format("--jobs {}: must be at least 1", jobs));
  work_queue(all.size(), size_t(jobs), [&](size_t i) {
    const Job& j = all[i];
    try {
      const dsl::ScheduleInfo* info = dsl::find_schedule(j.schedule);
      if (!info) throw Error(ErrId::cli_E001, "no schedule named " + j.schedule);
      const compiler::CompileOptions o = rt::plan_options(j.coll, j.dtype, j.op, j.arch, false, 0, j.rank, j.tune);
      const ir::Schedule built = dsl::build(*info, j.nranks, 0);
      auto key_of = [&](int r) {  // what rank r's runtime looks its plan up by
        return prebuilt::key(built, rt::plan_options(j.coll, j.dtype, j.op, j.arch, false, 0, r, j.tune));
      };
      if (j.rank >= 0) {
        w.add(key_of(j.rank), compiler::compile_plan(built, o));
        ++compiled;
        return;
      }
      // What each rank's first call would compile: its class's code path
      // alone. Rank 0's plan serves every rank where each kernel has one code
      // path (one compile, as for a plan of every rank); in one-pass kernels
      // (a path per rank) each class gets its own plan: faster to compile
      // and to run than one kernel holding every rank's path (the other
      // buckets, the same for every class, come from the kernel cache).
      std::vector<char> filed(size_t(j.nranks), 0);
      for (int r = 0; r < j.nranks; ++r) {
        if (filed[size_t(r)]) continue;
        const plan::Plan p =
            compiler::compile_plan(built, rt::plan_options(j.coll, j.dtype, j.op, j.arch, false, 0, r, j.tune));
        ++compiled;
        for (int q = r; q < j.nranks; ++q)
          if (!filed[size_t(q)] && plan::serves(p, q)) {
            w.add(key_of(q), p);
            filed[size_t(q)] = 1;
          }
        MK_CHECK(filed[size_t(r)], fmt::format("prebuild: rank {}'s plan serves ranks {} only", r, plan::served_ranks(p)));
      }
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> g(mu);
      if (first_error.empty())
        first_error = fmt::format("{} for {} ranks (rank {}), {} {}, sm_{}: {}", j.schedule, j.nranks, j.rank,
                                  name(j.dtype), name(j.op), j.arch, e.what());
    }
  });
  if (!first_error.empty()) throw Error(ErrId::cli_E012, "mkc prebuild: " + first_error);
  const auto [keys, plans] = w.finish();
  fmt::print("wrote {}: {} keys, {} distinct plans ({} configurations, {} plans compiled or taken from the kernel "
             "cache) in {:.1f} s\n",
             out, keys, plans, all.size(), compiled.load(),
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return 0;
}

int cmd_info() {
  fmt::print("mkernel {}\n", "0.1.0");
  fmt::print("NVRTC: {}\n", jit::nvrtc_status());
  std::string archs;
  for (int a : jit::supported_archs()) archs += " " + jit::arch_name(a);
  fmt::print("architectures:{}\n", archs.empty() ? " (none: NVRTC unavailable)" : archs);
  fmt::print("fast-compile: {} (NVRTC --Ofast-compile; MK_FAST_COMPILE)\n", jit::fast_compile());
  fmt::print("cache: {}\n", jit::cache_dir());
  fmt::print("prebuilt plans: {}\n", prebuilt::search_path().empty() ? "(none)" : prebuilt::search_path());
  std::string headers;
  try {
    headers = plugin::include_dir();
  } catch (const Error& e) {
    headers = "(" + e.message() + ")";
  }
  fmt::print("DSL headers: {}\n", headers.empty() ? std::string("(not found)") : headers);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mkc: compile collective schedules into fused CUDA kernels"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("mkc 0.1.0"));

  Common verify_o, show_o, lower_o, compile_o, sim_o, export_o;

  app.add_subcommand("list", "list the built-in schedules and those MK_SCHEDULES loads");
  app.add_subcommand("info", "NVRTC, supported architectures, cache location");

  auto* verify = app.add_subcommand("verify", "prove that a schedule computes its collective (exit 0) or explain why not");
  add_common(verify, verify_o, false);
  bool strict = false;
  verify->add_flag("--strict", strict,
                   "also refuse schedules whose ranks may get different bits: they combine a reduction in different "
                   "orders or round it at different points (mk.verify.E015)");
  std::string verify_dtype, verify_op;
  verify->add_option("--dtype", verify_dtype,
                     "check bit-identity across ranks for this dtype only (default: every dtype; integers always "
                     "agree, fp32 and fp64 need one order, fp16, bf16 and fp8 also the same rounding points)");
  verify->add_option("--op", verify_op, "with --dtype: for this reduction op (default sum; min and max always agree)");
  std::string verify_fusion;
  verify->add_option("--fusion", verify_fusion,
                     "check this fusion's code on the CPU (every access, threads, paths, its float64 reference; "
                     "with --dtype only that dtype); with a schedule too, also that its kernels run the prologue and "
                     "epilogue soundly");

  auto* show = app.add_subcommand("show", "per rank and thread block, what moves when (text, and an SVG timeline)");
  add_common(show, show_o, false);
  std::string svg;
  int show_bucket = -1;
  bool show_ir = false;
  show->add_option("--svg", svg, "write the timeline as an SVG picture");
  show->add_option("--bucket", show_bucket, "which size bucket (default: the largest)");
  show->add_flag("--ir", show_ir, "also print the lowered IR");
  bool show_pick = false;
  show->add_flag("--pick", show_pick,
                 "also name, per size, the built-in schedule of this collective with the lowest estimate "
                 "(lowers each; the runtime's selection is unchanged)");
  bool show_classes = false;
  show->add_flag("--classes", show_classes, "also print the rank classes (ranks that share one code path) and why they differ");

  auto* lower = app.add_subcommand("lower", "run the compiler passes and print the IR after one of them");
  add_common(lower, lower_o, true);
  std::string dump_after = "sync", emit = "text";
  lower->add_option("--dump-after", dump_after, "build verify stage fuse analyze parallelize assign protocol sync, or all");
  lower->add_option("--emit", emit, "text (default) or json");

  auto* compile = app.add_subcommand("compile", "compile a schedule into a plan: plan.json and cubin(s)");
  add_common(compile, compile_o, true);
  std::string dtype = "fp32", op = "sum", arch = "sm_90", out;
  bool no_cache = false;
  compile->add_option("--dtype", dtype, "element type (int8 uint8 int32 uint32 int64 uint64 fp16 bf16 fp32 fp64 fp8e4m3 fp8e5m2)");
  compile->add_option("--op", op, "reduction: sum prod min max avg");
  compile->add_option("--arch", arch, "GPU architecture, e.g. sm_90 (default), sm_80, sm_100");
  compile->add_option("-o,--out", out, "output directory")->required();
  compile->add_flag("--no-cache", no_cache, "ignore and do not fill the kernel cache");
  std::string fast_compile;
  const char* fast_compile_help =
      "NVRTC's --Ofast-compile level: 0 (full optimisation), min, mid or max (faster compilation, slower kernels; "
      "default: MK_FAST_COMPILE, else 0)";
  compile->add_option("--fast-compile", fast_compile, fast_compile_help);
  int32_t compile_rank = -1;
  std::string compile_fusion;
  compile->add_option("--fusion", compile_fusion,
                      "fuse this epilogue into every kernel's tail (all-reduce: allreduce.rmsnorm, allreduce.fp8_rows, "
                      "or one a --plugin file registers with MK_FUSION); the runtime's mkAllReduceFused uses such plans "
                      "from MK_PLAN_DIR");
  bool compile_fusion_check = false;
  compile->add_flag("--fusion-check", compile_fusion_check,
                    "with --fusion: checked epilogue accessors that print the fusion, row, thread and index of an "
                    "access outside its row, operands or scalars and trap (a debugging build; the runtime's "
                    "MK_FUSION_CHECK=1)");
  compile->add_option("--rank", compile_rank,
                      "generate and compile only the code of this rank's class (plan.json lists the ranks it serves; "
                      "from 128 ranks: of this rank alone, generated from its own program); default: every rank");

  auto* simulate = app.add_subcommand("simulate", "run the lowered schedule on the CPU and compare with a float64 reference");
  add_common(simulate, sim_o, false);
  std::string sdtype = "fp32", sop = "sum";
  int64_t count = 4096;
  bool inplace = false;
  int launches = 2, sim_bucket = -1;
  uint64_t seed = 1;
  simulate->add_option("--dtype", sdtype, "element type");
  simulate->add_option("--op", sop, "reduction op");
  simulate->add_option("--count", count, "elements per rank (the collective's count)");
  simulate->add_flag("--inplace", inplace, "input and output share memory, as NCCL defines in-place");
  simulate->add_option("--launches", launches, "back-to-back launches with fresh data");
  simulate->add_option("--seed", seed, "data and interleaving seed");
  simulate->add_option("--bucket", sim_bucket, "force a size bucket (default: chosen by size)");
  std::string sim_data = "both";
  bool sim_strict = false;
  simulate->add_option("--data", sim_data,
                       "fp16, bf16 and fp8 sums and averages: data whose partial sums are exact (checked exactly), "
                       "data whose partial sums round (shows ranks that round at different points), or both (default)");
  std::string sim_fusion;
  int64_t sim_row = 0;
  std::vector<double> sim_scalars;
  simulate->add_option("--fusion", sim_fusion,
                       "simulate a fused all-reduce: the fusion's prologue in the collective, then its epilogue on "
                       "every rank's output, against float64 (its MK_FUSION_REFERENCE) and across ranks");
  simulate->add_option("--row", sim_row, "--fusion: the epilogue's row length (a given-row fusion needs one)");
  simulate->add_option("--scalars", sim_scalars, "--fusion: the call's scalars, the same on every rank")->delimiter(',');
  simulate->add_flag("--strict", sim_strict,
                     "refuse a schedule whose ranks may get different bits for this dtype and op (mk.verify.E015), "
                     "as `mkc verify --strict` does; without it, a warning");

  auto* import = app.add_subcommand("import", "read an MSCCL XML algorithm or MSCCL++ execution plan, prove it, and "
                                               "write it as mKernel IR JSON");
  std::string import_file, import_out;
  bool import_no_verify = false;
  import->add_option("file", import_file, "FILE.xml (MSCCL) or FILE.json (MSCCL++ plan)")->required();
  import->add_option("-o,--out", import_out, "write the IR as JSON here (ir::to_json; every command reads it back)");
  import->add_flag("--no-verify", import_no_verify, "write the IR even if it is not proved (it says so)");

  auto* comp = app.add_subcommand("composite", "a composite's buffers and stages (MK_COMPOSITE), which stage runs after "
                                                "which, and the proof of each schedule it names");
  Common comp_o;
  std::string comp_target;
  comp->add_option("composite", comp_target, "a registered composite's name, or a DSL file (.cpp) defining composites")
      ->required();
  comp->add_option("-n,--ranks", comp_o.ranks, "number of ranks (GPUs)");
  comp->add_option("--plugin", comp_o.plugins, "load schedules and composites from a plugin library (.so)");
  CompositeSim comp_sim;
  comp->add_flag("--simulate", comp_sim.on,
                 "also run the stages' lowered schedules on the CPU in program order and compare every buffer with a "
                 "float64 reference");
  comp->add_option("--dtype", comp_sim.dtype, "--simulate: fp16, bf16 (default), fp32 or fp64");
  comp->add_option("--op", comp_sim.op, "--simulate: sum (default), avg, min or max");
  comp->add_option("--count", comp_sim.count, "--simulate: every stage's count (default 1000)");
  comp->add_option("--seed", comp_sim.seed, "--simulate: data and interleaving seed");
  auto* exp = app.add_subcommand("export", "write a schedule in another format (MSCCL XML)");
  add_common(exp, export_o, false);
  std::string export_format = "msccl-xml", export_out;
  exp->add_option("--format", export_format, "msccl-xml (the default)");
  exp->add_option("-o,--out", export_out, "output file (default: standard output)");

  auto* topo_cmd = app.add_subcommand("topo", "describe this machine's GPUs, their links and nearest NICs as a topology "
                                               "file (for --topology-file and MK_SELECT_FILE's machine fields)");
  int topo_nodes = 1;
  std::string topo_out;
  topo_cmd->add_option("--nodes", topo_nodes, "nodes of the job, each like this one (default 1)");
  topo_cmd->add_option("-o,--out", topo_out, "output file (default: standard output)");

  auto* prebuild = app.add_subcommand("prebuild", "compile every plan the runtime picks for these ranks, dtypes "
                                                   "and ops into a directory of prebuilt plans (MK_PREBUILT_DIR)");
  std::vector<std::string> pb_archs = {"sm_90"}, pb_dtypes = {"bf16", "fp16", "fp32"}, pb_ops = {"sum"};
  std::vector<int> pb_ranks = {2, 4, 8};
  std::string pb_out;
  int pb_jobs = int(std::max(1u, std::thread::hardware_concurrency()));
  prebuild->add_option("--arch", pb_archs, "architectures (default sm_90)")->delimiter(',');
  prebuild->add_option("-n,--ranks", pb_ranks, "rank counts (default 2,4,8)")->delimiter(',');
  prebuild->add_option("--dtype", pb_dtypes, "element types (default bf16,fp16,fp32)")->delimiter(',');
  std::vector<std::string> pb_copy = {"int32", "int64"};
  prebuild->add_option("--copy-dtype", pb_copy,
                       "also these element types for the collectives that only move data (allgather, broadcast, "
                       "alltoall; default int32,int64: frameworks' metadata, e.g. DDP's bucket and parameter sync); "
                       "one plan serves every type of a size")
      ->delimiter(',');
  prebuild->add_option("--op", pb_ops, "reduction ops (default sum)")->delimiter(',');
  prebuild->add_option("-o,--out", pb_out, "output directory (index.json is merged)")->required();
  prebuild->add_option("-j,--jobs", pb_jobs, "plans compiled at once (default: one per core)");
  prebuild->add_option("--fast-compile", fast_compile, fast_compile_help);

  auto* tune = app.add_subcommand("tune", "measure every schedule (and knob variant) of each collective per size on "
                                          "the GPUs present and write the selection table (MK_SELECT_FILE)");
  tune::Options tu;
  std::vector<std::string> tu_colls = {"allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall"};
  std::string tu_dtype = "bf16";
  bool tu_no_check = false;
  tune->add_option("-n,--ranks", tu.ranks, "ranks (one per GPU, GPUs 0..n-1; default 2)");
  tune->add_flag("--share-gpu", tu.share,
                 "every rank on GPU 0 (a one-GPU proxy to try the tuner: never a table to ship)");
  tune->add_option("--colls", tu_colls, "collectives (default all six)")->delimiter(',');
  tune->add_option("--dtype", tu_dtype, "element type (default bf16)");
  tune->add_option("--min-bytes", tu.min_bytes, "smallest size (default 1024); size = a rank's larger buffer");
  tune->add_option("--max-bytes", tu.max_bytes, "largest size (default 64 MiB); sizes in x2 steps");
  tune->add_option("--knobs", tu.knobs, "quick: each schedule with the defaults; full: also knob variants");
  tune->add_option("--batches", tu.batches, "timed batches per size (median; default 5)");
  tune->add_flag("--no-check", tu_no_check, "do not check each candidate's results (they are checked up to 16 MiB)");
  tune->add_option("-o,--out", tu.out, "the table (default: standard output)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  try {
    // Schedules from files (compiler/sources.hpp), as the runtime loads them:
    // `mkc list` shows them, --schedule NAME and `mkc tune` use them.
    if (const char* list = std::getenv("MK_SCHEDULES"); list && *list) sources::load(list);
    if (!fast_compile.empty()) {
      jit::set_fast_compile(fast_compile);
      ::unsetenv("MK_FAST_COMPILE");  // the command line wins
    }
    if (app.got_subcommand("list")) return cmd_list();
    if (app.got_subcommand("info")) return cmd_info();
    if (*verify) return cmd_verify(verify_o, strict, verify_dtype, verify_op, verify_fusion);
    if (*show) return cmd_show(show_o, svg, show_bucket, show_ir, show_pick, show_classes);
    if (*lower) return cmd_lower(lower_o, dump_after, emit);
    if (*compile)
      return cmd_compile(compile_o, dtype, op, arch, out, no_cache, compile_rank, compile_fusion, compile_fusion_check);
    if (*topo_cmd) return cmd_topo(topo_nodes, topo_out);
    if (*prebuild) return cmd_prebuild(pb_archs, pb_ranks, pb_dtypes, pb_copy, pb_ops, pb_out, pb_jobs);
    if (*tune) {
      for (const auto& c : tu_colls) {
        const auto coll = parse_collective(c);
        if (!coll) throw Error(ErrId::cli_E011, "--colls: '" + c + "' is not a collective");
        tu.colls.push_back(*coll);
      }
      tu.dtype = dtype_arg(tu_dtype);
      tu.check = !tu_no_check;
      for (int i = 0; i < argc; ++i) tu.command += (i ? " " : "") + std::string(i ? argv[i] : "mkc");
      return tune::run(tu);
    }
    if (*simulate)
      return cmd_simulate(sim_o, sdtype, sop, count, inplace, launches, seed, sim_bucket, sim_data, sim_strict,
                          sim_fusion, sim_row, sim_scalars);
    if (*import) return cmd_import(import_file, import_out, import_no_verify);
    if (*exp) return cmd_export(export_o, export_format, export_out);
    if (*comp) return cmd_composite(comp_o, comp_target, comp_sim);
  } catch (const Error& e) {
    std::cerr << "mkc: error: " << e.what() << "\n";
    return 1;
  } catch (const InternalError& e) {
    std::cerr << "mkc: " << e.what() << "\nThis is a bug in mKernel; please report it with the command line.\n";
    return 3;
  } catch (const std::exception& e) {
    std::cerr << "mkc: internal error: " << e.what() << "\n";
    return 3;
  }
  return 0;
}
