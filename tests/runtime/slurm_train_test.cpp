// `strata train` under SLURM, on loopback: four tasks with the variables
// srun gives 2 nodes x 2 tasks (a compressed node list whose first host is
// 127.0.0.1, each "node" its own host identity, MASTER_PORT from the job
// id) train as one process does; each node's first task says how many
// threads it chose. In the job's batch script (no step id), `strata train
// --devices 2` starts its own two workers instead of waiting for tasks
// that never come, and a job over two nodes is refused at once.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/slurm_tasks.h"
#include "strata/runtime/process.h"
#include "support/tool.h"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using namespace strata::testing;

const std::vector<std::string> kTrain = {"train", "--model-size", "tiny", "--batch-size", "8", "--lr", "3e-3",
                                         "--sample-tokens", "0", "--log-every", "1", "--seed", "3",
                                         "--max-steps", "4"};

std::vector<double> losses(const std::string& metrics_file) {
  std::vector<double> out;
  std::ifstream in(metrics_file);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line).at("loss").get<double>());
  return out;
}

class SlurmTrainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("strata-slurm-train-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // `strata train` with `extra` flags, as one task with `vars`.
  Task train(const std::vector<std::string>& extra, const std::map<std::string, std::string>& vars,
             const std::string& log) {
    std::vector<std::string> argv = {strata_binary()};
    argv.insert(argv.end(), kTrain.begin(), kTrain.end());
    argv.insert(argv.end(), extra.begin(), extra.end());
    return start_task(argv, task_environment(vars), path(log));
  }

  // The single-process reference: its four losses.
  std::vector<double> reference() {
    Task single = train({"--devices", "1", "--metrics-file", path("ref.jsonl")}, {{"OMP_NUM_THREADS", "1"}},
                        "ref.log");
    EXPECT_EQ(wait_task(single, 300s), 0) << read_text(path("ref.log"));
    return losses(path("ref.jsonl"));
  }

  fs::path dir_;
};

void expect_same_losses(const std::vector<double>& got, const std::vector<double>& want, const std::string& log) {
  ASSERT_EQ(want.size(), 4u);
  ASSERT_EQ(got.size(), 4u) << log;
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << "step " << i + 1;
}

// The command docs/launcher.md shows: in an sbatch script with
// `#SBATCH --nodes=2 --ntasks-per-node=2`,
//   srun strata train --num-nodes 2 --devices 2 ...
TEST_F(SlurmTrainTest, TwoNodesOfTwoTasksTrainAsOneProcess) {
  const std::vector<double> want = reference();
  SrunStep step;
  step.nodes = 2;
  step.tasks_per_node = 2;
  step.nodelist = "127.0.0.[1-2]";
  step.job_id = job_id_with_free_port();
  std::vector<Task> tasks;
  for (int rank = 0; rank < 4; ++rank) {
    auto vars = step.vars(rank);
    vars["STRATA_HOST_ID"] = "slurm-node" + std::to_string(rank / 2);  // two hosts on one machine
    vars["STRATA_TIMEOUT"] = "120";
    tasks.push_back(train({"--num-nodes", "2", "--devices", "2", "--metrics-file", path("four.jsonl")}, vars,
                          "task" + std::to_string(rank) + ".log"));
  }
  std::string logs;
  for (int rank = 0; rank < 4; ++rank) {
    const int status = wait_task(tasks[rank], 300s);
    const std::string log = read_text(tasks[rank].log);
    logs += "--- task " + std::to_string(rank) + " ---\n" + log;
    EXPECT_EQ(status, 0) << log;
  }
  expect_same_losses(losses(path("four.jsonl")), want, logs);
  // The first task of each node says what it chose; the others do not.
  const int cores = strata::runtime::usable_cores();
  const int threads = strata::runtime::threads_per_worker(cores, 2);
  const std::string said = "[threads] " + std::to_string(threads) +
                           (threads == 1 ? " intra-op thread" : " intra-op threads") +
                           " per worker: srun started 2 workers on this host, which has " + std::to_string(cores) +
                           " usable cores, and OMP_NUM_THREADS is unset (set it to choose)";
  for (int rank = 0; rank < 4; ++rank) {
    const std::string log = read_text(tasks[rank].log);
    EXPECT_EQ(log.find(said) != std::string::npos, rank % 2 == 0) << "task " << rank << ":\n" << log;
  }
}

// Note [SLURM tasks and the batch script] (runtime/env.cpp).
TEST_F(SlurmTrainTest, TheBatchScriptStartsItsOwnWorkersOrRefusesAtOnce) {
  const std::vector<double> want = reference();
  SrunStep job;
  job.tasks_per_node = 2;
  job.nodelist = "localhost";
  job.job_id = job_id_with_free_port();
  auto batch = job.vars(0);
  batch.erase("SLURM_STEP_ID");
  const auto start = std::chrono::steady_clock::now();
  Task script = train({"--devices", "2", "--metrics-file", path("batch.jsonl")}, batch, "batch.log");
  EXPECT_EQ(wait_task(script, 300s), 0) << read_text(path("batch.log"));
  expect_same_losses(losses(path("batch.jsonl")), want, read_text(path("batch.log")));

  SrunStep two = job;
  two.nodes = 2;
  two.nodelist = "gpu[01-02]";
  auto batch2 = two.vars(0);
  batch2.erase("SLURM_STEP_ID");
  Task refused = train({"--num-nodes", "2", "--devices", "2", "--metrics-file", path("refused.jsonl")}, batch2,
                       "refused.log");
  EXPECT_NE(wait_task(refused, 120s), 0);
  EXPECT_NE(read_text(path("refused.log")).find("num_nodes=2: a multi-node job is started by a launcher on every "
                                                "host"),
            std::string::npos)
      << read_text(path("refused.log"));
  // Neither waited for a rendezvous timeout (300 s by default).
  EXPECT_LT(std::chrono::steady_clock::now() - start, 250s);
}

}  // namespace
