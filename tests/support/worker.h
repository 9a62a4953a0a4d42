// Worker scenarios for multi-process tests. A test binary started with
// `--strata-worker=NAME [ARGS...]` runs the scenario registered as NAME
// instead of GoogleTest, and exits with its return value. Register with
//
//   STRATA_WORKER(all_reduce_sums) {   // args: std::vector<std::string>
//     ... return 0;                     // non-zero (or a throw) fails the worker
//   }
//
// and start it on N ranks with strata::testing::run_workers (multiprocess.h).
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace strata::testing {

using WorkerFn = std::function<int(const std::vector<std::string>& args)>;

/// Registers `fn` under `name`; returns true (for static registration).
bool register_worker(const std::string& name, WorkerFn fn);

/// Runs the scenario named in argv when argv[1] is --strata-worker=NAME;
/// returns -1 when argv does not ask for a worker.
int maybe_run_worker(int argc, char** argv);

}  // namespace strata::testing

#define STRATA_WORKER_CAT2(a, b) a##b
#define STRATA_WORKER_CAT(a, b) STRATA_WORKER_CAT2(a, b)
#define STRATA_WORKER(name)                                                            \
  static int strata_worker_##name(const std::vector<std::string>& args);               \
  [[maybe_unused]] static const bool STRATA_WORKER_CAT(strata_worker_registered_, name) = \
      ::strata::testing::register_worker(#name, strata_worker_##name);                 \
  static int strata_worker_##name([[maybe_unused]] const std::vector<std::string>& args)
