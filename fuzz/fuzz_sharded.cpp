// libFuzzer target: strata::fuzz::sharded_input (fuzz/entry_points.h).
#include "entry_points.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  strata::fuzz::sharded_input(data, size);
  return 0;
}
