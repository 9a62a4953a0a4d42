// Runs worker scenarios (worker.h) on several ranks through strata's own
// launcher, over loopback, the way users start their programs.
#pragma once

#include <string>
#include <vector>

#include "strata/runtime/launcher.h"

namespace strata::testing {

/// Result of a multi-process run: the launcher's result plus everything the
/// workers printed (prefixed "[rank R] ").
struct WorkersResult {
  runtime::LaunchResult launch;
  std::string output;
  bool ok() const { return launch.exit_code == 0; }
};

/// Starts this test binary as `nproc` workers running scenario `name` with
/// `args`, waits for them and returns what happened. The workers get
/// STRATA_TIMEOUT from options.timeout_s (tests use seconds, not minutes).
WorkersResult run_workers(int nproc, const std::string& name, const std::vector<std::string>& args = {},
                          runtime::LaunchOptions options = runtime::LaunchOptions().with_timeout_s(60));

}  // namespace strata::testing
