// The launchers (strategies/launchers/): which one a placement gets, and
// what the subprocess launcher promises (Note [The launching process is
// rank 0]): the launching process is rank 0, every rank returns from
// launch() and leaves through main() (the destructors of main's objects run
// in each), and a worker's failure is a LaunchError in rank 0, after which
// rank 0 goes on.
//
// The subprocess scenarios run as a program of their own (this binary with
// --strata-worker=..., started without a launcher), since its ranks run
// the whole program.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "strata/core/error.h"
#include "strata/fabric/fabric.h"
#include "strata/runtime/env.h"
#include "strata/runtime/launcher.h"
#include "strata/strategies/ddp.h"
#include "strata/strategies/launchers/subprocess.h"
#include "strata/strategies/placement.h"
#include "strata/strategies/strategy.h"
#include "support/commands.h"
#include "support/environment.h"
#include "support/worker.h"

namespace {

namespace fs = std::filesystem;
using strata::Fabric;
using strata::FabricOptions;

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Writes "<name>.<rank>" in a folder when it goes out of scope.
struct MarkOnDestruction {
  fs::path file;
  ~MarkOnDestruction() { std::ofstream(file) << ::getpid() << "\n"; }
};

std::shared_ptr<strata::strategies::DDPStrategy> cpu_ddp() {
  return std::make_shared<strata::strategies::DDPStrategy>(strata::strategies::cpu_accelerator());
}

// Every rank: launch() returns its own result (its rank plus the sum of
// ranks, through a collective), then the code after it runs and main's
// objects are destroyed.
STRATA_WORKER(every_rank_returns) {
  const fs::path dir = args.at(0);
  Fabric fabric(FabricOptions().with_strategy(cpu_ddp()).with_devices(2));
  const int result = fabric.launch([](Fabric& f) {
    const double sum = f.all_reduce(at::full({1}, static_cast<double>(f.global_rank())), "sum").item<double>();
    return 10 * f.global_rank() + static_cast<int>(sum);
  });
  const std::string rank = std::to_string(fabric.global_rank());
  MarkOnDestruction mark{dir / ("destroyed." + rank)};
  std::ofstream(dir / ("after." + rank)) << result << " " << ::getpid() << "\n";
  return 0;
}

// Rank 1 fails inside launch(); rank 0 catches the LaunchError and goes on.
STRATA_WORKER(worker_fails) {
  const fs::path dir = args.at(0);
  Fabric fabric(FabricOptions().with_strategy(cpu_ddp()).with_devices(2));
  try {
    fabric.launch([](Fabric& f) {
      if (f.global_rank() == 1) throw std::runtime_error("planted failure on rank 1");
      f.barrier("waits for rank 1");
    });
  } catch (const strata::LaunchError& e) {
    std::ofstream(dir / "caught") << e.what() << "\n"
                                  << (e.outcome() ? e.outcome()->failed_rank : -2) << "\n";
  }
  MarkOnDestruction mark{dir / ("destroyed." + std::to_string(fabric.global_rank()))};
  return 0;
}

// Rank 1 (the copy rank 0 started) fails before its launch(), so it never
// joins the rendezvous rank 0 waits in.
STRATA_WORKER(worker_dies_before_launch) {
  const fs::path dir = args.at(0);
  Fabric fabric(FabricOptions().with_strategy(cpu_ddp()).with_devices(2));
  if (std::getenv(strata::strategies::kEnvSubprocessWorker) != nullptr) return 3;
  const auto start = std::chrono::steady_clock::now();
  try {
    fabric.launch([](Fabric& f) { f.barrier("waits for rank 1"); });
  } catch (const strata::LaunchError& e) {
    const auto waited = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - start);
    std::ofstream(dir / "caught") << e.what() << "\n" << waited.count() << "\n";
  }
  return 0;
}

// Two Fabrics, one after the other, in every rank: the second joins the job
// the first one's launch made (rank 0's environment names it).
STRATA_WORKER(two_fabrics) {
  const fs::path dir = args.at(0);
  int results[2] = {0, 0};
  int rank = -1;
  for (int round = 0; round < 2; ++round) {
    Fabric fabric(FabricOptions().with_strategy(cpu_ddp()).with_devices(2));
    results[round] = fabric.launch([round](Fabric& f) {
      return static_cast<int>(f.all_reduce(at::full({1}, 1.0 + f.global_rank() + round), "sum").item<double>());
    });
    rank = fabric.global_rank();
  }
  std::ofstream(dir / ("results." + std::to_string(rank))) << results[0] << " " << results[1] << "\n";
  return 0;
}

// Runs a scenario as a program no launcher started; returns its result.
strata::testing::CommandResult run_scenario(const std::string& name, const fs::path& dir) {
  const std::string self = strata::runtime::current_command_line()[0];
  return strata::testing::run_command("env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE '" + self +
                                      "' --strata-worker=" + name + " '" + dir.string() + "'");
}

fs::path fresh_dir(const std::string& name) {
  std::string templ = ::testing::TempDir() + "strata_" + name + "_XXXXXX";
  EXPECT_NE(::mkdtemp(templ.data()), nullptr);
  return templ;
}

TEST(LaunchersTest, EachPlacementGetsItsLauncher) {
  using strata::strategies::resolve_placement;
  strata::Placement one;
  EXPECT_EQ(resolve_placement(one, "test").strategy->launcher()->name(), "in_place");
  strata::Placement two;
  two.devices = 2;
  const auto spawning = resolve_placement(two, "test");
  EXPECT_EQ(spawning.strategy->launcher()->name(), "subprocess");
  EXPECT_FALSE(spawning.strategy->launcher()->is_interactive_compatible());
  {
    // An outside launcher started this process: it joins in place.
    strata::testing::ScopedEnv rank("RANK", "1"), world("WORLD_SIZE", "2"), local("LOCAL_RANK", "1"),
        local_world("LOCAL_WORLD_SIZE", "2"), port("MASTER_PORT", "29500");
    const auto joined = resolve_placement(two, "test");
    EXPECT_EQ(joined.strategy->launcher()->name(), "in_place");
    EXPECT_EQ(joined.world_size, 2);
  }
}

TEST(LaunchersTest, TheLaunchingProcessIsRankZeroAndEveryRankLeavesThroughMain) {
  const fs::path dir = fresh_dir("every_rank");
  const strata::testing::CommandResult run = run_scenario("every_rank_returns", dir);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  // launch() returned each rank's own result: 10 * rank + (0 + 1).
  std::istringstream after0(read_file(dir / "after.0")), after1(read_file(dir / "after.1"));
  int result0 = -1, result1 = -1, pid0 = 0, pid1 = 0;
  after0 >> result0 >> pid0;
  after1 >> result1 >> pid1;
  EXPECT_EQ(result0, 1);
  EXPECT_EQ(result1, 11);
  EXPECT_NE(pid0, pid1);
  // The destructors of main's objects ran in both ranks: no rank ended
  // inside the library.
  EXPECT_EQ(read_file(dir / "destroyed.0"), std::to_string(pid0) + "\n");
  EXPECT_EQ(read_file(dir / "destroyed.1"), std::to_string(pid1) + "\n");
  // Two processes in all: the launching one was rank 0, not a third.
  EXPECT_FALSE(fs::exists(dir / "after.2"));
  fs::remove_all(dir);
}

TEST(LaunchersTest, AWorkerFailureIsALaunchErrorInRankZeroWhichGoesOn) {
  const fs::path dir = fresh_dir("worker_fails");
  const strata::testing::CommandResult run = run_scenario("worker_fails", dir);
  // Rank 0 caught the error and returned 0 from main.
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(read_file(dir / "caught"),
            "[fabric] the workers failed: rank 1 exited with code 1; last error: error: planted failure on rank 1\n"
            "1\n");
  EXPECT_TRUE(fs::exists(dir / "destroyed.0")) << run.output;
  fs::remove_all(dir);
}

TEST(LaunchersTest, AWorkerThatDiesBeforeTheRendezvousFailsRankZeroAtOnce) {
  const fs::path dir = fresh_dir("dies_before_launch");
  const strata::testing::CommandResult run = run_scenario("worker_dies_before_launch", dir);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  std::istringstream caught(read_file(dir / "caught"));
  std::string message;
  int waited = -1;
  std::getline(caught, message);
  caught >> waited;
  EXPECT_EQ(message, "[fabric] the workers failed: rank 1 exited with code 3") << run.output;
  // Not the rendezvous timeout (300 s): the supervisor's word.
  EXPECT_GE(waited, 0);
  EXPECT_LT(waited, 20) << run.output;
  fs::remove_all(dir);
}

TEST(LaunchersTest, ASecondFabricInTheProgramJoinsTheSameJob) {
  const fs::path dir = fresh_dir("two_fabrics");
  const strata::testing::CommandResult run = run_scenario("two_fabrics", dir);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  // (1 + 2) then (2 + 3) on both ranks.
  EXPECT_EQ(read_file(dir / "results.0"), "3 5\n");
  EXPECT_EQ(read_file(dir / "results.1"), "3 5\n");
  fs::remove_all(dir);
}

}  // namespace
