// The fusion registry (include/mk/fusion.hpp) and the host row context's
// rounding.
#include <fmt/format.h>

#include <cctype>
#include <cmath>
#include <deque>
#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include "compiler/verify/reference.hpp"
#include "compiler/verify/fusion_check.hpp"
#include "mk/error.hpp"
#include "mk/fusion.hpp"
#include "templates/dtype.cuh"

namespace mk::dsl {
inline namespace fusion_abi_v2 {
namespace {
std::mutex& mu() {
  static std::mutex m;
  return m;
}
// Every registration ever made, never changed or freed (a deque: a pointer
// find_fusion returned stays valid and unchanged while other threads load
// plugins); `current` names the live one of each name, in first-registered
// order.
std::deque<FusionInfo>& store() {
  static std::deque<FusionInfo> r;
  return r;
}
std::vector<const FusionInfo*>& current() {
  static std::vector<const FusionInfo*> r;
  return r;
}
// Fusions that failed their checks at registration (static initialisers
// cannot throw): name -> the error, raised when the name is asked for.
std::map<std::string, std::string>& rejected() {
  static std::map<std::string, std::string> r;
  return r;
}
// Declared float64 references, by fusion name and the file that declared
// them (MK_FUSION_REFERENCE may come before or after the fusion's
// registration; only a fusion registered from the same file takes it).
template <class Fn>
struct Declared {
  Fn fn;
  std::string file;
};
std::map<std::string, Declared<FusionRefFn>>& references() {
  static std::map<std::string, Declared<FusionRefFn>> r;
  return r;
}
std::map<std::string, Declared<PrologueRefFn>>& prologue_references() {
  static std::map<std::string, Declared<PrologueRefFn>> r;
  return r;
}

std::string check(const FusionInfo& f) {
  if (f.name.empty()) return "a fusion needs a name";
  for (char c : f.name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-'))
      return fmt::format("fusion name '{}' may hold only letters, digits, '.', '_' and '-'", f.name);
  if (f.source.empty() && f.pre_source.empty()) return "it has neither an epilogue (MK_EPILOGUE) nor a prologue (MK_PROLOGUE)";
  if (!f.source.empty() && f.source.find("Epi") == std::string::npos) return "its epilogue code defines no struct Epi";
  if (!f.pre_source.empty() && f.pre_source.find("Pro") == std::string::npos)
    return "its prologue code defines no struct Pro";
  if (f.source.empty() && (!f.operands.empty() || f.rows != RowMode::any))
    return "a fusion without an epilogue has no operands and no rows (operands and rows are the epilogue's)";
  if (f.operands.size() > size_t(kMaxOperands))
    return fmt::format("{} operands; at most {}", f.operands.size(), kMaxOperands);
  if (f.scalars.size() > size_t(kMaxScalars)) return fmt::format("{} scalars; at most {}", f.scalars.size(), kMaxScalars);
  for (size_t k = 0; k < f.operands.size(); ++k) {
    const OperandInfo& o = f.operands[k];
    if (o.name.empty()) return fmt::format("operand {} has no name", k);
    if (int(o.shape) < 0 || int(o.shape) > 2) return fmt::format("operand {} has an unknown shape", o.name);
    if (!o.same_dtype && (int(o.dtype) < 0 || int(o.dtype) >= kNumDTypes))
      return fmt::format("operand {} has an unknown dtype", o.name);
    if (o.output && o.shape == Shape::col)
      return fmt::format("operand {} is a per-column output: every row's block would write it", o.name);
  }
  if (f.rows != RowMode::given && f.rows != RowMode::any) return "unknown row mode";
  if (f.rows == RowMode::any)
    for (const OperandInfo& o : f.operands)
      if (o.shape != Shape::elem)
        return fmt::format("operand {} is per {}, but the rows of an element-wise fusion (RowMode::any) are the "
                           "runtime's choice",
                           o.name, o.shape == Shape::col ? "column" : "row");
  if (f.max_row < 1 || f.max_row > 65536) return fmt::format("max_row {} is outside 1..65536", f.max_row);
  if (f.dtypes.empty()) return "no dtype";
  for (DType t : f.dtypes)
    if (t != DType::fp16 && t != DType::bf16 && t != DType::fp32 && t != DType::fp64)
      return fmt::format("dtype {}: epilogues run on floating-point outputs (fp16, bf16, fp32, fp64)", name(t));
  // The checker (verify/fusion_check.hpp) runs the host build before first
  // use: code without one could not be checked.
  auto all = [](auto* const(&fns)[4]) { return fns[0] && fns[1] && fns[2] && fns[3]; };
  if (!f.source.empty() && !all(f.host))
    return "its epilogue has no host build (FusionInfo::host; MK_EPILOGUE makes one, a FusionInfo filled by hand "
           "must set it): the fusion checker runs it before the fusion's first use";
  if (!f.pre_source.empty() && !all(f.pre_host))
    return "its prologue has no host build (FusionInfo::pre_host; MK_PROLOGUE makes one, a FusionInfo filled by hand "
           "must set it): the fusion checker runs it before the fusion's first use";
  return {};
}
}  // namespace

bool register_fusion(const FusionInfo& info) {
  std::lock_guard<std::mutex> lock(mu());
  const std::string why = check(info);
  if (!why.empty()) {
    rejected()[info.name] = fmt::format("{}:{}: {}", info.file, info.line, why);
    return false;
  }
  rejected().erase(info.name);
  store().push_back(info);
  FusionInfo& added = store().back();
  added.reference = nullptr;  // only what its own file declares
  added.prologue_reference = nullptr;
  if (auto it = references().find(info.name); it != references().end() && it->second.file == info.file)
    added.reference = it->second.fn;
  if (auto it = prologue_references().find(info.name);
      it != prologue_references().end() && it->second.file == info.file)
    added.prologue_reference = it->second.fn;
  for (const FusionInfo*& f : current())
    if (f->name == info.name) {
      f = &store().back();  // a later registration (a user plugin) replaces an earlier one
      return true;
    }
  current().push_back(&store().back());
  return true;
}

std::vector<FusionInfo> registered_fusions() {
  std::lock_guard<std::mutex> lock(mu());
  std::vector<FusionInfo> out;
  for (const FusionInfo* f : current()) out.push_back(*f);
  return out;
}

const FusionInfo* find_fusion_unchecked(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu());
  if (auto it = rejected().find(name); it != rejected().end())
    throw Error(ErrId::dsl_E009, fmt::format("fusion {} is malformed: {}", name, it->second));
  for (const FusionInfo* f : current())
    if (f->name == name) return f;
  return nullptr;
}

const FusionInfo* find_fusion(const std::string& name) {
  const FusionInfo* f = find_fusion_unchecked(name);
  if (f) verify::check_fusion_once(*f);  // outside the registry's lock: it runs the fusion's code
  return f;
}

const FusionInfo* find_fusion(const std::string& name, DType dtype) {
  const FusionInfo* f = find_fusion_unchecked(name);
  if (f) verify::check_fusion_once(*f, dtype);
  return f;
}

size_t fusion_registrations() {
  std::lock_guard<std::mutex> lock(mu());
  return store().size();
}

std::vector<std::string> fusions_registered_since(size_t mark) {
  std::lock_guard<std::mutex> lock(mu());
  std::vector<std::string> out;
  for (size_t i = mark; i < store().size(); ++i) out.push_back(store()[i].name);
  return out;
}

namespace {
// A reference declared for the live entry of `name` from `file`: a new entry
// with it (entries never change; what find_fusion returned stays as it was).
template <class Set>
void attach(const std::string& name, const std::string& file, Set set) {
  for (const FusionInfo*& f : current())
    if (f->name == name && f->file == file) {
      FusionInfo copy = *f;
      if (!set(copy)) return;  // already has it
      store().push_back(copy);
      f = &store().back();
    }
}
}  // namespace

bool register_fusion_reference(const std::string& name, FusionRefFn fn, const std::string& file) {
  std::lock_guard<std::mutex> lock(mu());
  references()[name] = {fn, file};
  attach(name, file, [&](FusionInfo& f) { return std::exchange(f.reference, fn) != fn; });
  return true;
}

bool register_prologue_reference(const std::string& name, PrologueRefFn fn, const std::string& file) {
  std::lock_guard<std::mutex> lock(mu());
  prologue_references()[name] = {fn, file};
  attach(name, file, [&](FusionInfo& f) { return std::exchange(f.prologue_reference, fn) != fn; });
  return true;
}

double FusionRef::smallest() const {
  switch (dtype) {
    case DType::fp16: return std::ldexp(1.0, -24);
    case DType::bf16: return std::ldexp(1.0, -133);
    case DType::fp32: return std::ldexp(1.0, -149);
    default: return 4.9e-324;
  }
}

double FusionRef::unit_roundoff() const { return verify::unit_roundoff(dtype); }
double FusionRef::unit_roundoff(int k) const {
  if (!fusion || k < 0 || k >= int(fusion->operands.size())) return unit_roundoff();
  const OperandInfo& o = fusion->operands[size_t(k)];
  return verify::unit_roundoff(o.same_dtype ? dtype : o.dtype);
}

namespace fusion_detail {
double host_round(double v, DType t) {
  using namespace mk::dev;
  switch (t) {
    case DType::fp16: return double(to_float(from_float<f16>(float(v))));
    case DType::bf16: return double(to_float(from_float<bf16>(float(v))));
    case DType::fp8e4m3: return double(to_float(from_float<f8e4m3>(float(v))));
    case DType::fp8e5m2: return double(to_float(from_float<f8e5m2>(float(v))));
    case DType::fp32: return double(float(v));
    default: return v;
  }
}
}  // namespace fusion_detail

namespace {
int host_slot(DType t) {
  switch (t) {
    case DType::fp16: return 0;
    case DType::bf16: return 1;
    case DType::fp32: return 2;
    case DType::fp64: return 3;
    default: return -1;
  }
}
}  // namespace

double run_prologue_host(const FusionInfo& f, DType dtype, double x, const double* scalars, bool exact) {
  const int slot = host_slot(dtype);
  if (f.pre_source.empty() || slot < 0 || !f.pre_host[slot] || !f.pre_host[3])
    throw Error(ErrId::cli_E013, fmt::format("fusion {} has no prologue host code for {}", f.name, name(dtype)));
  double in[kMaxScalars] = {};
  for (size_t k = 0; k < f.scalars.size() && k < size_t(kMaxScalars); ++k) in[k] = scalars ? scalars[k] : 0.0;
  if (exact) return f.pre_host[3](x, in, nullptr);
  return fusion_detail::host_round(f.pre_host[slot](x, in, nullptr), dtype);
}

void run_fusion_host(const FusionInfo& f, DType dtype, int64_t count, int64_t row, double* out,
                     double* const* operands, const double* scalars, bool exact) {
  if (f.source.empty() || !f.host[3])
    throw Error(ErrId::cli_E013, fmt::format("fusion {} has no epilogue", f.name));
  if (row < 1) throw Error(ErrId::cli_E011, fmt::format("fusion {}: row {} is not positive", f.name, row));
  int slot = -1;
  switch (dtype) {
    case DType::fp16: slot = 0; break;
    case DType::bf16: slot = 1; break;
    case DType::fp32: slot = 2; break;
    case DType::fp64: slot = 3; break;
    default: break;
  }
  if (slot < 0 || !f.host[slot])
    throw Error(ErrId::cli_E013, fmt::format("fusion {} has no host code for {}", f.name, name(dtype)));
  fusion_detail::HostFn fn = exact ? f.host[3] : f.host[slot];
  for (int64_t r = 0; r * row < count; ++r) {
    fusion_detail::HostRowBase ctx;  // the host function wraps it in its HostRow<C>
    ctx.n = int32_t(std::min(row, count - r * row));
    ctx.row = r;
    ctx.out_ = out + r * row;
    ctx.out_dtype = exact ? DType::fp64 : dtype;
    for (size_t k = 0; k < f.operands.size(); ++k) {
      ctx.ops_[k] = operands[k];
      ctx.shape_[k] = f.operands[k].shape;
      ctx.dtype_[k] = exact ? DType::fp64 : f.operands[k].same_dtype ? dtype : f.operands[k].dtype;
    }
    for (size_t k = 0; k < f.scalars.size() && k < size_t(kMaxScalars); ++k) ctx.scalars_[k] = scalars[k];
    ctx.stride_ = row;
    fn(ctx);
  }
}

}  // inline namespace fusion_abi_v2
}  // namespace mk::dsl
