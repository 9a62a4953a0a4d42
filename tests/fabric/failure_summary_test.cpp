// A failed worker's summary quotes the exception's message, never its
// backtrace (Note [The last error line] in runtime/error_line.cpp): a
// c10::Error carries a backtrace in what(), which the worker prints after
// the message; a std::runtime_error has none. Fabric::launch throws
// LaunchError with the summary.
//
// This process is rank 0; launch() starts rank 1 as a copy of this binary
// with the same --gtest_filter, so each test runs alone.
#include <gtest/gtest.h>

#include <c10/util/Exception.h>
#include <unistd.h>

#include <iostream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "strata/core/error.h"
#include "strata/fabric/fabric.h"
#include "strata/strategies/ddp.h"

namespace {

using strata::Fabric;
using strata::FabricOptions;

// Rank 0 waits for rank 1 in a barrier, which fails once rank 1 is gone;
// rank 1 runs `fail`. Returns what rank 0 caught.
template <class Fail>
std::string failure_of(Fail fail) {
  auto strategy = std::make_shared<strata::strategies::DDPStrategy>(strata::strategies::cpu_accelerator());
  Fabric fabric(FabricOptions().with_strategy(strategy).with_devices(2));
  try {
    fabric.launch([&](Fabric& f) {
      if (f.global_rank() != 1) return f.barrier("failure");
      fail();
    });
  } catch (const strata::LaunchError& e) {
    return e.what();
  }
  return "launch() returned";
}

TEST(FailureSummaryTest, AC10ErrorIsSummarisedByItsMessageNotABacktraceFrame) {
  const std::string what = failure_of([] { TORCH_CHECK(false, "planted c10 failure on rank ", 1); });
  EXPECT_EQ(what, "[fabric] the workers failed: rank 1 exited with code 1; last error: error: planted c10 failure "
                  "on rank 1");
}

TEST(FailureSummaryTest, ARuntimeErrorIsSummarisedByItsMessage) {
  const std::string what = failure_of([] { throw std::runtime_error("planted runtime failure"); });
  EXPECT_EQ(what, "[fabric] the workers failed: rank 1 exited with code 1; last error: error: planted runtime "
                  "failure");
}

TEST(FailureSummaryTest, AModelSummaryTableIsNoErrorLine) {
  // What a Trainer prints at the start of fit, then a crash that says nothing.
  const std::string what = failure_of([] {
    std::cerr << "  | Name | Type   | Params | Mode\n"
                 "---------------------------------\n"
                 "0 | fc   | Linear | 10     | train\n"
                 "---------------------------------\n"
                 "10        Trainable params\n"
                 "1         Modules in train mode" << std::endl;
    std::_Exit(4);
  });
  EXPECT_EQ(what, "[fabric] the workers failed: rank 1 exited with code 4");
}

}  // namespace
