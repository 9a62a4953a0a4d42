// libFuzzer target: strata::fuzz::metadata_input (fuzz/entry_points.h).
#include "entry_points.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  strata::fuzz::metadata_input(data, size);
  return 0;
}
