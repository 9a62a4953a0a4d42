// Threads per worker (Note [Threads per worker] in process.cpp): the split
// of the cores, and the launcher exporting it as OMP_NUM_THREADS unless the
// user chose, which LibTorch's thread pool then uses.
#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <thread>

#include "strata/runtime/launcher.h"
#include "strata/runtime/process.h"
#include "support/multiprocess.h"
#include "support/worker.h"

namespace {

using strata::runtime::LaunchOptions;
using strata::runtime::threads_per_worker;
using strata::runtime::usable_cores;

STRATA_WORKER(print_threads) {
  const char* omp = std::getenv("OMP_NUM_THREADS");
  std::cout << "threads omp=" << (omp != nullptr ? omp : "unset") << " aten=" << at::get_num_threads() << std::endl;
  return 0;
}

// Sets (or, with nullopt, unsets) OMP_NUM_THREADS in this process for the
// scope, then puts back what was there.
class OmpEnv {
 public:
  explicit OmpEnv(const std::optional<std::string>& value) {
    if (const char* old = std::getenv("OMP_NUM_THREADS")) old_ = old;
    if (value) {
      ::setenv("OMP_NUM_THREADS", value->c_str(), 1);
    } else {
      ::unsetenv("OMP_NUM_THREADS");
    }
  }
  ~OmpEnv() {
    if (old_) {
      ::setenv("OMP_NUM_THREADS", old_->c_str(), 1);
    } else {
      ::unsetenv("OMP_NUM_THREADS");
    }
  }

 private:
  std::optional<std::string> old_;
};

TEST(ThreadsTest, WorkersSplitTheCoresAtLeastOneEach) {
  EXPECT_EQ(threads_per_worker(8, 2), 4);
  EXPECT_EQ(threads_per_worker(16, 3), 5);
  EXPECT_EQ(threads_per_worker(2, 2), 1);
  EXPECT_EQ(threads_per_worker(2, 4), 1);
  EXPECT_EQ(threads_per_worker(6, 1), 6);
  EXPECT_EQ(threads_per_worker(4, 0), 4);
}

TEST(ThreadsTest, UsableCoresAreTheAffinityMask) {
  const int cores = usable_cores();
  EXPECT_GE(cores, 1);
  const unsigned hardware = std::thread::hardware_concurrency();
  if (hardware > 0) EXPECT_LE(cores, static_cast<int>(hardware));
}

TEST(ThreadsTest, TheLauncherSplitsTheCoresWhenTheUserDidNotChoose) {
  OmpEnv unset(std::nullopt);
  const std::string expected = std::to_string(threads_per_worker(usable_cores(), 2));
  auto run = strata::testing::run_workers(2, "print_threads", {}, LaunchOptions().with_timeout_s(120));
  ASSERT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
  for (int r = 0; r < 2; ++r) {
    const std::string line = "[rank " + std::to_string(r) + "] threads omp=" + expected + " aten=" + expected + "\n";
    EXPECT_NE(run.output.find(line), std::string::npos) << line << "not in:\n" << run.output;
  }
}

// One worker would get every usable core; the user's 1 wins, from the
// launcher's environment or from its options.
TEST(ThreadsTest, OmpNumThreadsOfTheUserWins) {
  {
    OmpEnv one(std::string("1"));
    auto run = strata::testing::run_workers(1, "print_threads", {}, LaunchOptions().with_timeout_s(120));
    ASSERT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
    EXPECT_NE(run.output.find("[rank 0] threads omp=1 aten=1\n"), std::string::npos) << run.output;
  }
  OmpEnv unset(std::nullopt);
  auto chosen = strata::testing::run_workers(1, "print_threads", {},
                                             LaunchOptions().with_timeout_s(120).with_env("OMP_NUM_THREADS", "1"));
  ASSERT_TRUE(chosen.ok()) << chosen.launch.summary << "\n" << chosen.output;
  EXPECT_NE(chosen.output.find("[rank 0] threads omp=1 aten=1\n"), std::string::npos) << chosen.output;
  auto split = strata::testing::run_workers(1, "print_threads", {}, LaunchOptions().with_timeout_s(120));
  ASSERT_TRUE(split.ok()) << split.launch.summary << "\n" << split.output;
  const std::string all = std::to_string(usable_cores());
  EXPECT_NE(split.output.find("[rank 0] threads omp=" + all + " aten=" + all + "\n"), std::string::npos)
      << split.output;
}

}  // namespace
