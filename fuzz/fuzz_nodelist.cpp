// libFuzzer target: SLURM host lists (runtime/slurm.h). Arbitrary bytes as
// SLURM_JOB_NODELIST: a ConfigError is the expected refusal; for a list
// that parses, the three readers must agree (the first host expanded is
// first_host, the expansion has count_nodelist hosts). Anything else
// escaping, a crash or a hang is a bug.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "strata/core/error.h"
#include "strata/runtime/slurm.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view list(reinterpret_cast<const char*>(data), size);
  std::string first;
  try {
    first = strata::runtime::first_host(list);
  } catch (const strata::ConfigError&) {
    return 0;  // refused; the other readers must refuse it too
  }
  size_t count = 0;
  try {
    count = strata::runtime::count_nodelist(list);
  } catch (const strata::ConfigError&) {
    return 0;  // parses, but names more hosts than strata expands
  }
  const auto hosts = strata::runtime::expand_nodelist(list);
  if (hosts.size() != count || hosts.empty() || hosts.front() != first) std::abort();
  return 0;
}
