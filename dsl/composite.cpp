// Composites (include/mk/composite.hpp): a step's collectives as one program.
// Checks here are the ones a builder's call can be held to (buffer indices,
// in-place forms, roots, names); build_composite checks the schedules each
// stage names against the schedule registry.
#include <fmt/format.h>

#include <cctype>
#include <deque>
#include <mutex>

#include "mk/composite.hpp"
#include "mk/dsl.hpp"

namespace mk::dsl {
namespace {

SrcLoc to_loc(const std::source_location& l) {
  return SrcLoc{l.file_name(), static_cast<uint32_t>(l.line()), l.function_name()};
}

std::mutex& mu() {
  static std::mutex m;
  return m;
}
std::deque<CompositeInfo>& registry() {  // deque: pointers stay valid as plugins register
  static std::deque<CompositeInfo> r;
  return r;
}

bool valid_buffer_name(const std::string& n) {
  if (n.empty() || n.size() > 64) return false;
  for (char c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

}  // namespace

Composite::Composite(int nranks, std::string name, Loc loc) : nranks_(nranks), name_(std::move(name)), loc_(to_loc(loc)) {
  if (nranks < 1 || nranks > 1024)
    throw Error(ErrId::dsl_E004, fmt::format("nranks must be in 1..1024, got {}", nranks), loc_);
}

int Composite::buffer(const std::string& name, Loc loc) {
  if (!valid_buffer_name(name))
    throw Error(ErrId::dsl_E010,
                fmt::format("buffer name '{}': 1..64 letters, digits or '_'", name), to_loc(loc));
  for (const std::string& b : buffers_)
    if (b == name) throw Error(ErrId::dsl_E010, fmt::format("buffer '{}' is declared twice", name), to_loc(loc));
  if (buffers_.size() == size_t(kMaxCompositeBuffers))
    throw Error(ErrId::dsl_E010, fmt::format("more than {} buffers", kMaxCompositeBuffers), to_loc(loc));
  buffers_.push_back(name);
  return int(buffers_.size()) - 1;
}

int Composite::stage(Collective coll, int in, int out, int root, const std::string& schedule, Loc loc) {
  const SrcLoc l = to_loc(loc);
  auto bad_buffer = [&](int b) { return b < 0 || b >= int(buffers_.size()); };
  if (bad_buffer(in) || bad_buffer(out))
    throw Error(ErrId::dsl_E010,
                fmt::format("{} stage: buffer {} is not declared ({} buffer(s): 0..{})", mk::name(coll),
                            bad_buffer(in) ? in : out, buffers_.size(), int(buffers_.size()) - 1),
                l, "declare it first: `int b = c.buffer(\"name\");`");
  if (root < 0 || root >= nranks_)
    throw Error(ErrId::dsl_E001, fmt::format("{} stage: root {} is not a rank of {}", mk::name(coll), root, nranks_), l);
  if (!collective_rooted(coll) && root != 0)
    throw Error(ErrId::dsl_E010, fmt::format("{} stage: a root ({}) for a collective without one", mk::name(coll), root), l);
  if (in == out && inplace_rule(coll) != InPlace::same)
    throw Error(ErrId::dsl_E010,
                fmt::format("{} stage reads and writes buffer '{}': its in-place form is a slice of the other "
                            "buffer, which a composite cannot name",
                            mk::name(coll), buffers_[size_t(in)]),
                l, "give it distinct input and output buffers");
  if (stages_.size() == size_t(kMaxStages))
    throw Error(ErrId::dsl_E010, fmt::format("more than {} stages (a group kernel holds at most {} collectives)",
                                             kMaxStages, kMaxStages),
                l);
  stages_.push_back(Stage{coll, in, out, root, schedule, l});
  return int(stages_.size()) - 1;
}

int Composite::all_reduce(int in, int out, const std::string& s, Loc loc) {
  return stage(Collective::allreduce, in, out, 0, s, loc);
}
int Composite::all_gather(int in, int out, const std::string& s, Loc loc) {
  return stage(Collective::allgather, in, out, 0, s, loc);
}
int Composite::reduce_scatter(int in, int out, const std::string& s, Loc loc) {
  return stage(Collective::reducescatter, in, out, 0, s, loc);
}
int Composite::all_to_all(int in, int out, const std::string& s, Loc loc) {
  return stage(Collective::alltoall, in, out, 0, s, loc);
}
int Composite::broadcast(int in, int out, int root, const std::string& s, Loc loc) {
  return stage(Collective::broadcast, in, out, root, s, loc);
}
int Composite::reduce(int in, int out, int root, const std::string& s, Loc loc) {
  return stage(Collective::reduce, in, out, root, s, loc);
}

int64_t Composite::buffer_elems(int b, int64_t count) const {
  int64_t n = 0;
  for (const Stage& s : stages_) {
    if (s.in == b) n = std::max(n, int64_t(input_blocks(s.coll, nranks_)) * count);
    if (s.out == b) n = std::max(n, int64_t(output_blocks(s.coll, nranks_)) * count);
  }
  return n;
}

bool Composite::depends(int i, int j) const {
  const Stage& a = stages_.at(size_t(i));
  const Stage& b = stages_.at(size_t(j));
  return b.in == a.out || b.out == a.out || b.out == a.in;
}

namespace {
int64_t g_registrations = 0;  // under mu()
}  // namespace

int64_t composite_registrations() {
  std::lock_guard<std::mutex> lock(mu());
  return g_registrations;
}

bool register_composite(const CompositeInfo& info) {
  std::lock_guard<std::mutex> lock(mu());
  ++g_registrations;
  for (auto& c : registry())
    if (c.name == info.name) {
      c = info;  // a later registration (a user plugin) replaces an earlier one
      return true;
    }
  registry().push_back(info);
  return true;
}

std::vector<CompositeInfo> registered_composites() {
  std::lock_guard<std::mutex> lock(mu());
  return {registry().begin(), registry().end()};
}

const CompositeInfo* find_composite(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu());
  for (auto& c : registry())
    if (c.name == name) return &c;
  return nullptr;
}

Composite build_composite(const CompositeInfo& info, int nranks) {
  const SrcLoc decl{info.file, uint32_t(info.line), ""};
  if (!info.build) throw Error(ErrId::dsl_E010, fmt::format("composite {} has no builder", info.name), decl);
  Composite c(nranks, info.name);
  try {
    info.build(c);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(ErrId::dsl_E007, fmt::format("composite {} for {} ranks: the builder threw: {}", info.name, nranks,
                                             e.what()),
                decl);
  } catch (...) {
    throw Error(ErrId::dsl_E007, fmt::format("composite {} for {} ranks: the builder threw", info.name, nranks), decl);
  }
  if (c.stages().empty())
    throw Error(ErrId::dsl_E010, fmt::format("composite {} for {} ranks has no stage", info.name, nranks), decl);
  for (const Stage& s : c.stages()) {
    if (s.schedule.empty()) continue;
    const ScheduleInfo* si = find_schedule(s.schedule);
    if (!si)
      throw Error(ErrId::dsl_E010, fmt::format("composite {}: {} stage names schedule '{}', which is not registered",
                                               info.name, mk::name(s.coll), s.schedule),
                  s.loc, "`mkc list` shows the registered schedules; load yours with MK_SCHEDULES or --plugin");
    if (si->coll != s.coll)
      throw Error(ErrId::dsl_E010, fmt::format("composite {}: {} stage names schedule '{}', which computes {}",
                                               info.name, mk::name(s.coll), s.schedule, mk::name(si->coll)),
                  s.loc);
    if (si->copy_engine)
      throw Error(ErrId::dsl_E010,
                  fmt::format("composite {}: {} stage names schedule '{}', which runs on copy engines: a "
                              "composite's stages run in one kernel",
                              info.name, mk::name(s.coll), s.schedule),
                  s.loc, "name a kernel schedule, or leave the schedule out");
  }
  return c;
}

}  // namespace mk::dsl
