// Errors raised by mKernel's compiler and tools.
//
// Contract:
//  - mk::Error is a *user* error: bad input, a broken schedule, a missing file.
//    It carries a stable id from errors.def (printed "[mk.verify.E012]"), the
//    message, optionally the DSL source line, and a hint saying what to do.
//  - mk::InternalError is a bug in mKernel itself (a broken invariant). Tools
//    print it differently and ask for a bug report.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace mk {

enum class ErrId : uint16_t {
#define MK_ERR(domain, code, summary) domain##_##code,
#include "mk/errors.def"
#undef MK_ERR
  count_
};

// "mk.verify.E012"
std::string err_name(ErrId id);
// one-line summary from the catalogue
std::string_view err_summary(ErrId id);
// parses "mk.verify.E012" (or "verify.E012"); returns false when unknown
bool err_parse(std::string_view text, ErrId* out);

// A source position in a DSL file (std::source_location, captured by the DSL).
struct SrcLoc {
  std::string file;
  uint32_t line = 0;
  std::string func;
  bool valid() const { return line != 0; }
  // "file.cpp:42" (file name without directories) or "" when invalid
  std::string str() const;
};

class Error : public std::runtime_error {
 public:
  Error(ErrId id, std::string message, SrcLoc loc = {}, std::string hint = {});
  ErrId id() const { return id_; }
  const std::string& message() const { return message_; }
  const SrcLoc& loc() const { return loc_; }
  const std::string& hint() const { return hint_; }

 private:
  static std::string render(ErrId id, const std::string& msg, const SrcLoc& loc,
                            const std::string& hint);
  ErrId id_;
  std::string message_;
  SrcLoc loc_;
  std::string hint_;
};

class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& what) : std::logic_error("mKernel internal error: " + what) {}
};

// MK_CHECK(cond, msg): internal invariant; throws InternalError with file:line.
#define MK_CHECK(cond, msg)                                                              \
  do {                                                                                   \
    if (!(cond))                                                                         \
      throw ::mk::InternalError(std::string(msg) + " [" #cond "] at " + __FILE__ + ":" + \
                                std::to_string(__LINE__));                               \
  } while (0)

}  // namespace mk
