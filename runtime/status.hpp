// Runtime errors: an mkResult_t and a message. The C API turns them into
// return codes and mkGetLastError text; nothing escapes as an exception.
#pragma once

#include <stdexcept>
#include <string>

#include "mk.h"
#include "compiler/common/log.hpp"

namespace mk::rt {

class RtError : public std::runtime_error {
 public:
  RtError(mkResult_t code, const std::string& msg) : std::runtime_error(msg), code_(code) {}
  mkResult_t code() const { return code_; }

 private:
  mkResult_t code_;
};

// A schedule's kernel cannot run the PreMulSum prologue (verify_prologue,
// mk.verify.E018) or a fused epilogue (verify_epilogue, mk.verify.E019)
// soundly: the runtime serves the call with another schedule.
class ScheduleRefused : public RtError {
 public:
  explicit ScheduleRefused(const std::string& msg) : RtError(mkInvalidUsage, msg) {}
};

[[noreturn]] inline void fail(mkResult_t code, const std::string& msg) { throw RtError(code, msg); }

// Checks a driver call: MK_CU(cu().cuMemAlloc(&p, n), "allocating scratch")
#define MK_CU(call, what)                                                                       \
  do {                                                                                          \
    CUresult mk_r_ = (call);                                                                    \
    if (mk_r_ != CUDA_SUCCESS)                                                                  \
      ::mk::rt::fail(mkUnhandledCudaError, std::string(what) + ": " + ::mk::rt::cu_error_string(mk_r_)); \
  } while (0)

// MK_DEBUG=1 logging (compiler/common/log.hpp), one mechanism for the library.
using ::mk::debug_enabled;
using ::mk::debug_log;

}  // namespace mk::rt
