// How a launch ended reaches the launching process as fields, one test per
// outcome: a clean launch, a rank that exits with a code, a rank killed by
// a signal, and the launcher interrupted by SIGINT (through Fabric::launch
// and through `strata train`, which then exits 130 as `strata launch`
// does). Note [Launch outcomes] in include/strata/core/error.h.
//
// This process becomes rank 0 at launch() and starts rank 1 as a copy of
// this binary with the same --gtest_filter (Note [The launching process is
// rank 0] in strategies/launchers/subprocess.h), where launch() runs the
// function in place. So each test runs alone (one --gtest_filter per test,
// as ctest runs them). Rank 0 waits for rank 1 in a barrier, which fails
// at once when rank 1 is gone; launch() then reports rank 1's outcome.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "strata/core/error.h"
#include "strata/fabric/fabric.h"
#include "strata/runtime/env.h"
#include "strata/runtime/launcher.h"
#include "strata/strategies/ddp.h"
#include "support/processes.h"
#include "support/tool.h"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using strata::Fabric;
using strata::FabricOptions;
using strata::LaunchError;
using strata::LaunchOutcome;

// Where the workers of the interrupt test say they are running.
constexpr const char* kReadyDirVar = "STRATA_TEST_READY_DIR";

// Waits until the launcher stops this worker (the launcher's forwarded
// SIGINT); on rank 0, waits for rank 1 in a barrier that fails when rank 1
// is gone.
void wait_to_be_stopped(Fabric& f) {
  if (f.global_rank() == 0) {
    f.barrier("outcome");
    return;
  }
  while (true) ::pause();
}

// Runs `fn` on two ranks (ddp on the CPU); returns the LaunchError rank 0
// got (what() and outcome), or nullopt when launch() returned.
struct Caught {
  std::string what;
  std::optional<LaunchOutcome> outcome;
};
template <class Fn>
std::optional<Caught> launch_two(Fn fn) {
  auto strategy = std::make_shared<strata::strategies::DDPStrategy>(strata::strategies::cpu_accelerator());
  Fabric fabric(FabricOptions().with_strategy(strategy).with_devices(2));
  try {
    fabric.launch(fn);
  } catch (const LaunchError& e) {
    return Caught{e.what(), e.outcome()};
  }
  return std::nullopt;
}

// Waits with a deadline until `path` exists.
bool appears_within(const fs::path& path, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (fs::exists(path)) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

TEST(LaunchOutcomeTest, ACleanLaunchReturnsAndItsOutcomeIsAllZero) {
  std::optional<Caught> caught = launch_two([](Fabric& f) { (void)f.global_rank(); });
  EXPECT_FALSE(caught) << caught->what;

  strata::runtime::LaunchResult result =
      strata::runtime::launch_workers({"/bin/true"}, strata::runtime::LaunchOptions().with_nproc_per_node(2));
  const LaunchOutcome& outcome = result;
  EXPECT_EQ(outcome.exit_code, 0);
  EXPECT_EQ(outcome.failed_rank, -1);
  EXPECT_EQ(outcome.failed_exit_code, 0);
  EXPECT_EQ(outcome.failed_signal, 0);
  EXPECT_FALSE(outcome.interrupted());
  EXPECT_EQ(outcome.hung_rank, -1);
}

TEST(LaunchOutcomeTest, ARankThatExitsWithACodeIsNamedWithItsCode) {
  std::optional<Caught> caught = launch_two([](Fabric& f) {
    if (f.global_rank() != 1) return wait_to_be_stopped(f);
    std::cerr << "planted failure" << std::endl;
    std::_Exit(3);
  });
  ASSERT_TRUE(caught) << "launch() returned";
  EXPECT_EQ(caught->what, "[fabric] the workers failed: rank 1 exited with code 3; last error: planted failure");
  ASSERT_TRUE(caught->outcome) << caught->what;
  EXPECT_EQ(caught->outcome->exit_code, 3);
  EXPECT_EQ(caught->outcome->failed_rank, 1);
  EXPECT_EQ(caught->outcome->failed_exit_code, 3);
  EXPECT_EQ(caught->outcome->failed_signal, 0);
  EXPECT_FALSE(caught->outcome->interrupted());
}

TEST(LaunchOutcomeTest, ARankKilledByASignalIsNamedWithTheSignal) {
  std::optional<Caught> caught = launch_two([](Fabric& f) {
    if (f.global_rank() != 1) return wait_to_be_stopped(f);
    ::raise(SIGKILL);
  });
  ASSERT_TRUE(caught) << "launch() returned";
  EXPECT_EQ(caught->what, "[fabric] the workers failed: rank 1 was killed by signal 9 (SIGKILL)");
  ASSERT_TRUE(caught->outcome) << caught->what;
  EXPECT_EQ(caught->outcome->exit_code, 128 + SIGKILL);
  EXPECT_EQ(caught->outcome->failed_rank, 1);
  EXPECT_EQ(caught->outcome->failed_exit_code, 0);
  EXPECT_EQ(caught->outcome->failed_signal, SIGKILL);
  EXPECT_FALSE(caught->outcome->interrupted());
}

TEST(LaunchOutcomeTest, SigintToTheLauncherIsAnInterruptedOutcomeWithExitCode130) {
  const bool worker = strata::runtime::Environment::from_env().launched();
  fs::path dir;
  std::thread interrupter;
  if (!worker) {
    std::string templ = ::testing::TempDir() + "strata_outcome_XXXXXX";
    ASSERT_NE(::mkdtemp(templ.data()), nullptr);
    dir = templ;
    ::setenv(kReadyDirVar, templ.c_str(), 1);
    // SIGINT to this process once both workers run (the launcher forwards it).
    interrupter = std::thread([dir] {
      if (appears_within(dir / "ready.0", 120s) && appears_within(dir / "ready.1", 120s)) ::kill(::getpid(), SIGINT);
    });
  }
  std::optional<Caught> caught = launch_two([](Fabric& f) {
    const char* ready = std::getenv(kReadyDirVar);
    if (ready != nullptr) std::ofstream(fs::path(ready) / ("ready." + std::to_string(f.global_rank()))) << "\n";
    wait_to_be_stopped(f);
  });
  if (interrupter.joinable()) interrupter.join();
  ::unsetenv(kReadyDirVar);
  fs::remove_all(dir);
  ASSERT_TRUE(caught) << "launch() returned";
  EXPECT_EQ(caught->what, "[fabric] the workers failed: the launcher received SIGINT; stopped all 1 workers");
  ASSERT_TRUE(caught->outcome) << caught->what;
  EXPECT_TRUE(caught->outcome->interrupted());
  EXPECT_EQ(caught->outcome->interrupted_by, SIGINT);
  EXPECT_EQ(caught->outcome->exit_code, 130);
  EXPECT_EQ(caught->outcome->failed_rank, -1);
}

TEST(LaunchOutcomeTest, SigintToStrataTrainExitsWith130) {
  std::string templ = ::testing::TempDir() + "strata_outcome_XXXXXX";
  ASSERT_NE(::mkdtemp(templ.data()), nullptr);
  const fs::path metrics = fs::path(templ) / "metrics.jsonl";
  strata::testing::Child child =
      strata::testing::start_strata({"train", "--model-size", "tiny", "--devices", "2", "--batch-size", "8",
                                     "--max-steps", "1000000", "--sample-tokens", "0", "--val-every", "0",
                                     "--metrics-file", metrics.string()});
  // The first step's line: both workers run and the launcher supervises them.
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  while (std::chrono::steady_clock::now() < deadline && (!fs::exists(metrics) || fs::file_size(metrics) == 0))
    std::this_thread::sleep_for(10ms);
  const bool started = fs::exists(metrics) && fs::file_size(metrics) > 0;
  ::kill(child.pid, started ? SIGINT : SIGKILL);
  strata::testing::Outcome o = strata::testing::finish(child);
  fs::remove_all(templ);
  ASSERT_TRUE(started) << "no step within 120 s:\n" << o.out << o.err;
  EXPECT_EQ(o.status, 130) << o.err;
  // strata train is a Trainer user, and its process is rank 0: the
  // Trainer's own stop (Note [Stopping on a signal]), agreed by both ranks.
  EXPECT_NE(o.err.find("strata: [trainer] stopped by SIGINT after step "), std::string::npos) << o.err;
  EXPECT_EQ(o.err.find("the workers failed"), std::string::npos) << o.err;
}

}  // namespace
