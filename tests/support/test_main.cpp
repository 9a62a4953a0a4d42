// main() of every test executable: GoogleTest, or a worker scenario when
// started by a multi-process test (see worker.h).
#include <gtest/gtest.h>

#include <cstdlib>
#include <exception>
#include <iostream>
#include <map>

#include "support/worker.h"
#include "test_paths.h"

namespace strata::testing {
namespace {
std::map<std::string, WorkerFn>& registry() {
  static std::map<std::string, WorkerFn> workers;
  return workers;
}
}  // namespace

bool register_worker(const std::string& name, WorkerFn fn) {
  registry()[name] = std::move(fn);
  return true;
}

int maybe_run_worker(int argc, char** argv) {
  const std::string flag = "--strata-worker=";
  if (argc < 2 || std::string(argv[1]).rfind(flag, 0) != 0) return -1;
  std::string name = std::string(argv[1]).substr(flag.size());
  auto it = registry().find(name);
  if (it == registry().end()) {
    std::cerr << "test worker: no scenario named '" << name << "'\n";
    return 120;
  }
  std::vector<std::string> args(argv + 2, argv + argc);
  try {
    return it->second(args);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace strata::testing

int main(int argc, char** argv) {
  // Tests (and the workers they start, which inherit the environment) read
  // these; a value already in the environment wins.
  ::setenv("STRATA_BINARY_DIR", STRATA_TEST_BINARY_DIR, /*overwrite=*/0);
  ::setenv("STRATA_SOURCE_DIR", STRATA_TEST_SOURCE_DIR, 0);
  if (*STRATA_TEST_PYTHON) ::setenv("STRATA_PYTHON", STRATA_TEST_PYTHON, 0);
  // Every xla program found by its graph's structure is emitted as well
  // and checked against the text it was compiled from (Note [Programs
  // known by their structure] in strata/xla/lazy_graph.h).
  ::setenv("STRATA_XLA_CHECK_KEYS", "1", 0);
  int worker_rc = strata::testing::maybe_run_worker(argc, argv);
  if (worker_rc >= 0) return worker_rc;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
