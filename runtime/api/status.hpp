// Runtime errors: an mkResult_t and a message. The C API turns them into
// return codes and mkGetLastError text; nothing escapes as an exception.
#pragma once

#include <new>
#include <stdexcept>
#include <string>

#include "mk.h"
#include "compiler/common/log.hpp"
#include "mk/error.hpp"

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

// The exception being handled as the C API reports it: a runtime error's
// own code, a user error (mk::Error: a bad schedule, name or setting) as
// mkInvalidArgument, out of host memory as mkSystemError, anything else as
// an internal error. Call it only inside a catch block.
struct CaughtError {
  mkResult_t code;
  std::string what;
};
inline CaughtError caught_error() {
  try {
    throw;
  } catch (const RtError& e) {
    return {e.code(), e.what()};
  } catch (const mk::Error& e) {
    return {mkInvalidArgument, e.what()};
  } catch (const std::bad_alloc&) {
    return {mkSystemError, "out of host memory"};
  } catch (const std::exception& e) {
    return {mkInternalError, std::string("internal error: ") + e.what()};
  } catch (...) {
    return {mkInternalError, "internal error: an unknown exception"};
  }
}

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
