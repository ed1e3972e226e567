// libFuzzer target: MSCCL XML import (and the XML reader under it).
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return mkfuzz::run(&mk::importers::import_msccl_xml, "fuzz.xml", data, size);
}
