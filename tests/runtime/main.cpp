// mk_runtime_tests: the real host runtime against the fake driver. Listing
// the tests (doctest_discover_tests at build time) touches no driver.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>

int mkt_child_main(int argc, char** argv);  // test_multiprocess.cpp

int main(int argc, char** argv) {
  // Ranks of the multi-process tests are this binary started again.
  if (argc >= 2 && std::strcmp(argv[1], "--mkt-child") == 0) return mkt_child_main(argc, argv);
  // Small symmetric memory: every rank's arena is zeroed by host memset here.
  setenv("MK_SCRATCH_BYTES", "4194304", 0);
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
