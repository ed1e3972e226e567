// libFuzzer target: MSCCL++ execution-plan import (JSON, the line locator).
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return mkfuzz::run(&mk::importers::import_mscclpp_json, "fuzz.json", data, size);
}
