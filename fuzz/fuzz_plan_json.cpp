// libFuzzer target: plan.json (plan::from_json) and the cubin checks.
//
// Contract under test: from_json either returns a plan or throws mk::Error
// (mk.plan.E001/E002); anything else escaping is a finding, like sanitizer
// reports, timeouts and running out of memory (fuzz_common.hpp's rules).
// Oracles beyond "no crash": a plan that was accepted writes JSON that reads
// back to the same JSON, and its resource key can be computed; the bytes
// are also given to cubin_problem, which must answer without crashing.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "compiler/common/cubin.hpp"
#include "compiler/plan/plan.hpp"
#include "mk/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  (void)mk::cubin_problem(text.data(), text.size(), 90);
  mk::plan::Plan p;
  try {
    p = mk::plan::from_json(text, "fuzz.json");
  } catch (const mk::Error&) {
    return 0;  // a clear user error: the expected outcome for most inputs
  }
  const std::string once = mk::plan::to_json(p);
  try {
    const std::string twice = mk::plan::to_json(mk::plan::from_json(once, "again.json"));
    if (twice != once) {
      std::fprintf(stderr, "plan JSON does not survive a round trip:\n%s\n---\n%s\n", once.c_str(), twice.c_str());
      std::abort();
    }
  } catch (const mk::Error& e) {
    std::fprintf(stderr, "an accepted plan wrote JSON it rejects: %s\n%s\n", e.what(), once.c_str());
    std::abort();
  }
  for (const auto& k : p.kernels) (void)mk::plan::resource_key(p, k);
  return 0;
}
