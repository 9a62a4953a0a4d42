// Expectations inside worker processes (GoogleTest's EXPECT_* only work in
// the test process): a worker records failures and returns non-zero.
#pragma once

#include <iostream>
#include <string>

namespace strata::testing {

/// Collects failed expectations inside a worker; the worker fails if any.
struct Checks {
  int rank = 0;
  int failures = 0;
  void expect(bool ok, const std::string& what) {
    if (!ok) {
      ++failures;
      std::cerr << "CHECK FAILED on rank " << rank << ": " << what << std::endl;
    }
  }
  /// The worker's exit code.
  int result() const { return failures == 0 ? 0 : 1; }
};

/// True when `haystack` contains `needle`.
inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace strata::testing
