#include "mk/error.hpp"

#include <array>

namespace mk {
namespace {

struct Entry {
  std::string_view domain, code, summary;
};

constexpr std::array<Entry, static_cast<size_t>(ErrId::count_)> kEntries = {{
#define MK_ERR(domain, code, summary) Entry{#domain, #code, summary},
#include "mk/errors.def"
#undef MK_ERR
}};

}  // namespace

std::string err_name(ErrId id) {
  const auto& e = kEntries.at(static_cast<size_t>(id));
  return "mk." + std::string(e.domain) + "." + std::string(e.code);
}

std::string_view err_summary(ErrId id) { return kEntries.at(static_cast<size_t>(id)).summary; }

bool err_parse(std::string_view text, ErrId* out) {
  if (text.substr(0, 3) == "mk.") text.remove_prefix(3);
  for (size_t i = 0; i < kEntries.size(); ++i) {
    std::string full = std::string(kEntries[i].domain) + "." + std::string(kEntries[i].code);
    if (text == full) {
      *out = static_cast<ErrId>(i);
      return true;
    }
  }
  return false;
}

std::string SrcLoc::str() const {
  if (!valid()) return {};
  auto slash = file.find_last_of('/');
  std::string base = slash == std::string::npos ? file : file.substr(slash + 1);
  return base + ":" + std::to_string(line);
}

Error::Error(ErrId id, std::string message, SrcLoc loc, std::string hint)
    : std::runtime_error(render(id, message, loc, hint)),
      id_(id),
      message_(std::move(message)),
      loc_(std::move(loc)),
      hint_(std::move(hint)) {}

std::string Error::render(ErrId id, const std::string& msg, const SrcLoc& loc,
                          const std::string& hint) {
  std::string s = "[";
  s += err_name(id);
  s += "] ";
  s += msg;
  if (loc.valid()) s += "\n  at " + loc.file + ":" + std::to_string(loc.line);
  if (!hint.empty()) s += "\n  hint: " + hint;
  return s;
}

}  // namespace mk
