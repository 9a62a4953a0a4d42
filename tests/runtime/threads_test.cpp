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

#include <filesystem>

#include "runtime/slurm_tasks.h"
#include "strata/core/error.h"
#include "strata/core/log.h"
#include "strata/runtime/env.h"
#include "strata/runtime/launcher.h"
#include "strata/runtime/process.h"
#include "support/multiprocess.h"
#include "support/worker.h"

namespace {

using strata::runtime::choose_worker_threads;
using strata::runtime::Environment;
using strata::runtime::LaunchOptions;
using strata::runtime::threads_per_worker;
using strata::runtime::usable_cores;

// A task that srun started: what a strategy does first (Note [Threads under
// other launchers]), then what LibTorch uses.
STRATA_WORKER(slurm_threads) {
  const Environment env = Environment::from_env();
  strata::log::set_rank(env.rank);
  strata::runtime::apply_worker_threads(env);
  std::cout << "task " << env.describe() << " master " << env.master_addr << " aten=" << at::get_num_threads()
            << std::endl;
  return 0;
}

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

Environment slurm_env(int local_workers, int nodes = 1) {
  return Environment::from_map({{"SLURM_PROCID", "0"},
                                {"SLURM_STEP_ID", "0"},
                                {"SLURM_NTASKS", std::to_string(local_workers * nodes)},
                                {"SLURM_NNODES", std::to_string(nodes)},
                                {"SLURM_JOB_NODELIST", "n[1-9]"}});
}

TEST(ThreadsTest, OtherLaunchersSplitTheCoresWhenOmpNumThreadsIsUnset) {
  auto choice = choose_worker_threads(slurm_env(2), nullptr, nullptr, false, 8);
  EXPECT_EQ(choice.threads, 4);
  EXPECT_EQ(choice.message, "[threads] 4 intra-op threads per worker: srun started 2 workers on this host, which has "
                            "8 usable cores, and OMP_NUM_THREADS is unset (set it to choose)");
  choice = choose_worker_threads(slurm_env(3, 2), nullptr, nullptr, false, 2);
  EXPECT_EQ(choice.threads, 1);
  EXPECT_EQ(choice.message, "[threads] 1 intra-op thread per worker: srun started 3 workers on this host, which has "
                            "2 usable cores, and OMP_NUM_THREADS is unset (set it to choose)");
  const Environment mpi = Environment::from_map({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "4"}});
  EXPECT_EQ(choose_worker_threads(mpi, nullptr, nullptr, false, 16).message,
            "[threads] 4 intra-op threads per worker: mpirun started 4 workers on this host, which has 16 usable "
            "cores, and OMP_NUM_THREADS is unset (set it to choose)");
  const Environment plain = Environment::from_map({{"RANK", "0"}, {"WORLD_SIZE", "2"}});
  EXPECT_EQ(choose_worker_threads(plain, nullptr, nullptr, false, 6).threads, 3);
  EXPECT_NE(choose_worker_threads(plain, nullptr, nullptr, false, 6).message.find("the launcher that set RANK"),
            std::string::npos);
}

TEST(ThreadsTest, SlurmCpusPerTaskIsTheTasksShare) {
  auto choice = choose_worker_threads(slurm_env(2), nullptr, "3", false, 8);
  EXPECT_EQ(choice.threads, 3);
  EXPECT_EQ(choice.message, "[threads] 3 intra-op threads per worker: SLURM_CPUS_PER_TASK=3 (srun started 2 workers "
                            "on this host, which has 8 usable cores); OMP_NUM_THREADS is unset (set it to choose)");
  EXPECT_EQ(choose_worker_threads(slurm_env(2), nullptr, "64", false, 8).threads, 8);  // no more than usable
  for (const char* bad : {"0", "-2", "4x", "", " 4", "99999999999"}) {
    try {
      choose_worker_threads(slurm_env(2), nullptr, bad, false, 8);
      ADD_FAILURE() << "SLURM_CPUS_PER_TASK='" << bad << "' was taken";
    } catch (const strata::ConfigError& e) {
      EXPECT_EQ(std::string(e.what()), std::string("[threads] SLURM_CPUS_PER_TASK='") + bad +
                                           "' is not a positive count of CPUs; srun --cpus-per-task sets it");
    }
  }
}

// OMP_NUM_THREADS wins, the user's or torchrun's (which cannot be told
// apart: torchrun exports 1 when the user set nothing); strata's own
// workers and single processes are left alone, silently.
TEST(ThreadsTest, OmpNumThreadsIsKeptAndTorchrunsOneIsNamed) {
  auto choice = choose_worker_threads(slurm_env(2), "3", nullptr, false, 8);
  EXPECT_EQ(choice.threads, 0);
  EXPECT_EQ(choice.message, "[threads] OMP_NUM_THREADS=3 kept: srun started 2 workers on this host, which has 8 "
                            "usable cores");
  const Environment torchrun = Environment::from_map({{"RANK", "0"}, {"WORLD_SIZE", "2"}});
  choice = choose_worker_threads(torchrun, "1", nullptr, true, 8);
  EXPECT_EQ(choice.threads, 0);
  EXPECT_EQ(choice.message, "[threads] OMP_NUM_THREADS=1 kept (torchrun sets 1 when the user did not): 1 intra-op "
                            "thread per worker; torchrun started 2 workers on this host, which has 8 usable cores, "
                            "so set OMP_NUM_THREADS=4 to use them");
  choice = choose_worker_threads(torchrun, nullptr, nullptr, true, 8);
  EXPECT_EQ(choice.threads, 4);
  const Environment strata_launched =
      Environment::from_map({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"STRATA_JOB_TOKEN", "t"}});
  choice = choose_worker_threads(strata_launched, "4", nullptr, false, 8);
  EXPECT_EQ(choice.threads, 0);
  EXPECT_EQ(choice.message, "");
  choice = choose_worker_threads(Environment::from_map({}), nullptr, nullptr, false, 8);
  EXPECT_EQ(choice.threads, 0);
  EXPECT_EQ(choice.message, "");
}

// Two tasks as srun starts them, without OMP_NUM_THREADS: each sets
// LibTorch's threads to its share of the cores, and the host's first task
// says so.
TEST(ThreadsTest, TwoSrunTasksSplitTheCoresAndSaySo) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("strata-slurm-threads-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  strata::testing::SrunStep step;
  step.tasks_per_node = 2;
  step.nodelist = "localhost";
  const int cores = usable_cores();
  const int expected = threads_per_worker(cores, 2);
  std::vector<strata::testing::Task> tasks;
  for (int rank = 0; rank < 2; ++rank) {
    tasks.push_back(strata::testing::start_task(
        {"/proc/self/exe", "--strata-worker=slurm_threads"}, strata::testing::task_environment(step.vars(rank)),
        (dir / ("task" + std::to_string(rank) + ".log")).string()));
  }
  for (int rank = 0; rank < 2; ++rank) {
    const int status = strata::testing::wait_task(tasks[rank], std::chrono::seconds(120));
    const std::string log = strata::testing::read_text(tasks[rank].log);
    EXPECT_EQ(status, 0) << log;
    EXPECT_NE(log.find("task rank " + std::to_string(rank) + "/2 (local " + std::to_string(rank) +
                       "/2, node 0/1) master 127.0.0.1 aten=" + std::to_string(expected) + "\n"),
              std::string::npos)
        << log;
    const std::string said = "[threads] " + std::to_string(expected) +
                             (expected == 1 ? " intra-op thread" : " intra-op threads") +
                             " per worker: srun started 2 workers on this host, which has " + std::to_string(cores) +
                             " usable cores, and OMP_NUM_THREADS is unset (set it to choose)";
    // Once per host: task 0 (local 0) says it, task 1 does not.
    EXPECT_EQ(log.find(said) != std::string::npos, rank == 0) << log;
  }
  fs::remove_all(dir);
}

}  // namespace
