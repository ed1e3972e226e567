// mkCompositeRun: a composite's stages (include/mk/composite.hpp) as one
// group of calls on one communicator, fused into group kernels whatever
// MK_GROUP_FUSE says (runtime/launch/enqueue.cpp plan_fusion: stages that depend on
// each other chain on one lane, the others run side by side).
#include <fmt/format.h>

#include "mk/composite.hpp"
#include "runtime/comm/comm.hpp"
#include "runtime/launch/enqueue.hpp"
#include "runtime/api/handles.hpp"
#include "runtime/api/status.hpp"

namespace mk::rt {

std::shared_ptr<const dsl::Composite> composite_for(Comm& c, const std::string& name) {
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (auto it = c.plans.composites.find(name); it != c.plans.composites.end()) return it->second;
  }
  const dsl::CompositeInfo* info = dsl::find_composite(name);
  if (!info) {
    std::string known;
    for (const auto& k : dsl::registered_composites()) known += (known.empty() ? "" : ", ") + k.name;
    fail(mkInvalidArgument,
         fmt::format("mkCompositeRun: no composite named '{}' (registered: {}); load a schedule file that defines it "
                     "with MK_SCHEDULES",
                     name, known.empty() ? "none" : known));
  }
  auto built = std::make_shared<const dsl::Composite>(dsl::build_composite(*info, c.nranks));  // mk::Error: bad input
  std::lock_guard<std::mutex> lock(c.mu);
  return c.plans.composites.emplace(name, std::move(built)).first->second;
}

void composite_run(const char* name, void* const* buffers, int nbuffers, size_t count, int dtype, int op,
                   mkComm_t comm, cudaStream_t stream) {
  if (!name) fail(mkInvalidArgument, "mkCompositeRun: name is NULL");
  std::shared_ptr<Comm> c = acquire(comm);
  c->check_serves("mkCompositeRun");
  std::shared_ptr<const dsl::Composite> k = composite_for(*c, name);
  const auto& bufs = k->buffers();
  if (nbuffers != int(bufs.size()) || (!buffers && nbuffers > 0)) {
    std::string names;
    for (const auto& b : bufs) names += (names.empty() ? "" : ", ") + b;
    fail(mkInvalidArgument, fmt::format("mkCompositeRun {}: {} buffer(s) given{}, it takes {} ({}, in that order)", name,
                                        nbuffers, buffers ? "" : " (buffers is NULL)", bufs.size(), names));
  }
  for (size_t b = 0; b < bufs.size(); ++b)
    if (!buffers[b] && k->buffer_elems(int(b), int64_t(count)) > 0)
      fail(mkInvalidArgument, fmt::format("mkCompositeRun {}: buffer {} ('{}') is NULL", name, b, bufs[b]));
  group_start();
  group_fuse_all();
  size_t at = 0;
  try {
    for (; at < k->stages().size(); ++at) {
      const dsl::Stage& s = k->stages()[at];
      Call call{s.coll, buffers[s.in], buffers[s.out], count, dtype, op, s.root, nullptr,
                s.schedule.empty() ? nullptr : s.schedule.c_str()};
      enqueue(call, comm, stream);
    }
  } catch (...) {
    // Close the group this call opened, launching nothing, and say which stage.
    const auto [code, what] = caught_error();
    const dsl::Stage& s = k->stages()[at];
    const std::string why = fmt::format("mkCompositeRun {}: stage {} ({} '{}' -> '{}'): {}", name, at,
                                        mk::name(s.coll), bufs[size_t(s.in)], bufs[size_t(s.out)], what);
    group_fail(code, why);
    try {
      group_end();  // launches nothing: the group failed
    } catch (...) {
    }
    throw RtError(code, why);
  }
  group_end();
}

}  // namespace mk::rt
