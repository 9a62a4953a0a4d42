// `strata train` under the engines people already start jobs with, run as
// they run them: torchrun (static and c10d rendezvous, an elastic restart,
// its error file), mpirun, Kubernetes' PyTorchJob (the variables its operator sets,
// two pods as two torchrun agents on loopback), and a stop on SIGTERM under
// strata's launcher, torchrun and SLURM's variables that saves the step and
// resumes exactly (Note [Workers of torchrun], Note [Stopping on a signal]).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "strata/checkpoint/directory.h"
#include "strata/checkpoint/safetensors.h"
#include "strata/runtime/store.h"
#include "support/commands.h"
#include "support/tool.h"

namespace {

namespace fs = std::filesystem;
using strata::testing::CommandResult;
using strata::testing::run_command;
using strata::testing::strata_binary;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The venv's torchrun (next to the project's Python).
std::string torchrun() { return (fs::path(strata::testing::project_python()).parent_path() / "torchrun").string(); }

std::string free_port() { return std::to_string(strata::runtime::find_free_port()); }

// The flags every run here shares: a tiny GPT, 2 workers' worth of batch.
std::string train_flags(int64_t max_steps) {
  return "train --model-size tiny --batch-size 8 --lr 3e-3 --sample-tokens 0 --log-every 1 --seed 3 --val-every 0 "
         "--max-steps " + std::to_string(max_steps);
}

// Every tensor of two full checkpoints is bitwise equal.
void expect_same_weights(const std::string& a, const std::string& b) {
  auto x = strata::checkpoint::CheckpointReader::open(a).open_file("state.safetensors");
  auto y = strata::checkpoint::CheckpointReader::open(b).open_file("state.safetensors");
  ASSERT_EQ(x.keys(), y.keys()) << a << " vs " << b;
  for (const std::string& key : x.keys()) EXPECT_TRUE(x.load(key).equal(y.load(key))) << key << ": " << a << " vs " << b;
}

std::string step_dir(const std::string& ckpt, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(step));
  return (fs::path(ckpt) / name).string();
}

// The checkpoints in `ckpt` (complete ones hold metadata.json), by step.
std::vector<int64_t> saved_steps(const std::string& ckpt) {
  std::vector<int64_t> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(ckpt, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-", 0) == 0 && fs::exists(entry.path() / "metadata.json")) out.push_back(std::stoll(name.substr(5)));
  }
  std::sort(out.begin(), out.end());
  return out;
}

class TorchrunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (strata::testing::project_python().empty()) GTEST_SKIP() << "no project Python (STRATA_PYTHON)";
    dir_ = fs::temp_directory_path() / ("strata-torchrun-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // `strata train` on 2 workers started by strata's own launcher.
  CommandResult baseline(int64_t max_steps, const std::string& ckpt) {
    return run_command("cd " + dir_.string() + " && " + strata_binary() + " launch -n 2 -- " + strata_binary() + " " +
                       train_flags(max_steps) + " --devices 2 --ckpt-dir " + ckpt);
  }
  // A shell script that starts `command` in the background, waits until
  // `ready` (a shell condition) holds, sends `signal` to it, and prints its
  // exit status as "exit=N".
  CommandResult signal_when(const std::string& command, const std::string& ready, const std::string& signal) {
    const std::string script = "cd " + dir_.string() + " && { " + command + " > " + path("out.txt") +
                               " 2>&1 & pid=$!; for i in $(seq 600); do " + ready +
                               " && break; sleep 0.1; done; kill -" + signal + " $pid; wait $pid; echo exit=$?; cat " +
                               path("out.txt") + "; }";
    return run_command(script);
  }

  fs::path dir_;
};

TEST_F(TorchrunTest, StaticAndC10dRendezvousTrainBitForBitAsStrataLaunch) {
  CommandResult ours = baseline(6, path("launch"));
  ASSERT_EQ(ours.exit_code, 0) << ours.output;
  const std::string program = " --no-python " + strata_binary() + " " + train_flags(6) + " --devices 2 --ckpt-dir ";
  CommandResult fixed = run_command("cd " + dir_.string() + " && " + torchrun() + " --nproc-per-node 2 --master-port " +
                                    free_port() + program + path("static"));
  ASSERT_EQ(fixed.exit_code, 0) << fixed.output;
  EXPECT_TRUE(contains(fixed.output, "done: 6 steps")) << fixed.output;
  CommandResult dynamic = run_command("cd " + dir_.string() + " && " + torchrun() +
                                      " --nproc-per-node 2 --rdzv-backend c10d --rdzv-id strata-test --rdzv-endpoint "
                                      "127.0.0.1:" + free_port() + program + path("c10d"));
  ASSERT_EQ(dynamic.exit_code, 0) << dynamic.output;
  expect_same_weights(step_dir(path("launch"), 6), step_dir(path("static"), 6));
  expect_same_weights(step_dir(path("launch"), 6), step_dir(path("c10d"), 6));
}

TEST_F(TorchrunTest, AFailingWorkerLeavesTheErrorFileTorchrunsSummaryAndReaderRead) {
  // Under torchrun: its summary's root cause shows strata's error, not "error_file: <N/A>".
  CommandResult failed = run_command("cd " + dir_.string() + " && " + torchrun() + " --nproc-per-node 2 --master-port " +
                                     free_port() + " --no-python " + strata_binary() + " " + train_flags(4) +
                                     " --devices 2 --data " + path("missing.txt"));
  EXPECT_NE(failed.exit_code, 0) << failed.output;
  // The root cause is the worker that failed first; a peer torchrun stopped
  // with SIGTERM before it reached the same error has no file, and its row
  // in "Failures:" rightly says so.
  const std::size_t root = failed.output.find("Root Cause");
  ASSERT_NE(root, std::string::npos) << failed.output;
  const std::string cause = failed.output.substr(root, failed.output.find("=====", root) - root);
  EXPECT_TRUE(contains(cause, "strata::ConfigError: [")) << failed.output;
  EXPECT_FALSE(contains(cause, "error_file: <N/A>")) << failed.output;

  // The same file, written where the test can keep it, read back by
  // torch.distributed.elastic's own reader.
  const std::string file = path("error.json");
  CommandResult one = run_command("cd " + dir_.string() + " && TORCHELASTIC_ERROR_FILE=" + file + " " +
                                  strata_binary() + " " + train_flags(4) + " --devices 1 --data " + path("missing.txt"));
  ASSERT_EQ(one.exit_code, 1) << one.output;
  const std::string reader =
      "import json, sys\n"
      "from torch.distributed.elastic.multiprocessing.errors import ProcessFailure\n"
      "f = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=sys.argv[1])\n"
      "m = f.message['message'] if isinstance(f.message, dict) else f.message\n"
      "print(json.dumps({'message': m, 'timestamp': f.timestamp}))\n";
  std::ofstream(path("read_error.py")) << reader;
  CommandResult read = run_command(strata::testing::project_python() + " " + path("read_error.py") + " " + file);
  ASSERT_EQ(read.exit_code, 0) << read.output;
  const auto json = nlohmann::json::parse(read.output.substr(read.output.find('{')));
  const std::string message = json.at("message").get<std::string>();
  EXPECT_EQ(message.rfind("strata::ConfigError: [", 0), 0u) << message;
  EXPECT_TRUE(contains(message, "missing.txt")) << message;
  const int64_t age = static_cast<int64_t>(std::time(nullptr)) - json.at("timestamp").get<int64_t>();
  EXPECT_GE(age, 0);
  EXPECT_LT(age, 600);
}

TEST_F(TorchrunTest, AnElasticRestartResumesFromTheLastCheckpointAndEndsWithTheUninterruptedWeights) {
  CommandResult whole = baseline(10, path("whole"));
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  // torchrun with one restart; once step 4 is saved, one worker is killed.
  const std::string command = torchrun() + " --nproc-per-node 2 --max-restarts 1 --monitor-interval 0.2 --master-port " +
                              free_port() + " --no-python " + strata_binary() + " " + train_flags(10) +
                              " --devices 2 --ckpt-every 2 --ckpt-dir " + path("elastic");
  const std::string script = "cd " + dir_.string() + " && { " + command + " > " + path("out.txt") +
                             " 2>&1 & pid=$!; for i in $(seq 1200); do [ -e " + step_dir(path("elastic"), 4) +
                             "/metadata.json ] && break; sleep 0.1; done; victim=$(pgrep -P $pid | head -n 1); "
                             "kill -KILL $victim; wait $pid; echo exit=$?; cat " + path("out.txt") + "; }";
  CommandResult run = run_command(script);
  EXPECT_TRUE(contains(run.output, "exit=0")) << run.output;
  EXPECT_TRUE(contains(run.output, "torchrun restart 1 of 1: resuming")) << run.output;
  EXPECT_TRUE(contains(run.output, "resumed from")) << run.output;
  expect_same_weights(step_dir(path("whole"), 10), step_dir(path("elastic"), 10));
}

TEST_F(TorchrunTest, MpirunStartsTheWorkersAndTheyTrainAsUnderStrataLaunch) {
  // Open MPI's mpirun (Debian's openmpi-bin, which scripts/install-deps.sh
  // installs) starts the processes; strata reads OMPI_COMM_WORLD_*.
  CommandResult which = run_command("command -v mpirun");
  ASSERT_EQ(which.exit_code, 0) << "mpirun is not installed: run scripts/install-deps.sh (openmpi-bin)";
  CommandResult ours = baseline(6, path("launch"));
  ASSERT_EQ(ours.exit_code, 0) << ours.output;
  CommandResult mpi = run_command("cd " + dir_.string() + " && mpirun -np 2 --allow-run-as-root --oversubscribe -x "
                                  "MASTER_PORT=" + free_port() + " " + strata_binary() + " " + train_flags(6) +
                                  " --devices 2 --ckpt-dir " + path("mpi"));
  ASSERT_EQ(mpi.exit_code, 0) << mpi.output;
  expect_same_weights(step_dir(path("launch"), 6), step_dir(path("mpi"), 6));
}

TEST_F(TorchrunTest, PyTorchJobPodsAsTwoTorchrunAgentsTrainAsOneJob) {
  // docs/examples/pytorchjob.yaml: each pod runs `torchrun --no-python
  // strata train ...` with the variables Kubeflow's training operator
  // sets (torchrun reads its options from PET_*). Two pods here are two
  // agents on loopback, one process each, with one thread each as the
  // baseline's two workers on this host have (a matmul's last bits depend
  // on its thread count; the manifest sets OMP_NUM_THREADS too).
  CommandResult whole = baseline(6, path("whole"));
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const std::string port = free_port();
  auto pod = [&](int index) {
    return "env OMP_NUM_THREADS=1 PET_NNODES=2 PET_NPROC_PER_NODE=1 PET_NODE_RANK=" + std::to_string(index) +
           " PET_MASTER_ADDR=127.0.0.1 PET_MASTER_PORT=" + port + " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port +
           " WORLD_SIZE=2 RANK=" + std::to_string(index) + " " + torchrun() + " --no-python " + strata_binary() + " " +
           train_flags(6) + " --devices 1 --num-nodes 2 --ckpt-dir " + path("pods") + " > " + path("pod" +
           std::to_string(index) + ".txt") + " 2>&1";
  };
  CommandResult pods = run_command("cd " + dir_.string() + " && { " + pod(1) + " & other=$!; " + pod(0) +
                                   "; a=$?; wait $other; b=$?; echo pods=$a,$b; cat " + path("pod0.txt") + " " +
                                   path("pod1.txt") + "; }");
  EXPECT_TRUE(contains(pods.output, "pods=0,0")) << pods.output;
  expect_same_weights(step_dir(path("whole"), 6), step_dir(path("pods"), 6));
}

// SIGTERM at a step: a complete checkpoint of that step, exit 143, and a
// run resumed from it that ends where an uninterrupted one does.
class StopOnSignalTest : public TorchrunTest {
 protected:
  void check_stop_and_resume(const std::string& stopped, const std::string& ckpt,
                             const std::string& signal = "SIGTERM") {
    std::smatch match;
    ASSERT_TRUE(std::regex_search(stopped, match, std::regex("stopped by " + signal + " after step ([0-9]+)")))
        << stopped;
    const int64_t step = std::stoll(match[1]);
    EXPECT_GE(step, 3) << stopped;
    EXPECT_EQ(saved_steps(ckpt), std::vector<int64_t>{step}) << stopped;
    const int64_t end = step + 3;
    CommandResult resumed = baseline(end, ckpt + " --resume latest");
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_TRUE(contains(resumed.output, "resumed from " + step_dir(ckpt, step))) << resumed.output;
    CommandResult whole = baseline(end, path("whole"));
    ASSERT_EQ(whole.exit_code, 0) << whole.output;
    expect_same_weights(step_dir(path("whole"), end), step_dir(ckpt, end));
  }
  // True once the run's output shows step 3 done.
  std::string after_step_three() const { return "grep -q 'step 3/' " + path("out.txt") + " 2>/dev/null"; }
};

TEST_F(StopOnSignalTest, UnderStrataLaunch) {
  CommandResult run = signal_when(strata_binary() + " " + train_flags(100000) + " --devices 2 --ckpt-dir " +
                                      path("ckpt"), after_step_three(), "TERM");
  EXPECT_TRUE(contains(run.output, "exit=143")) << run.output;
  check_stop_and_resume(run.output, path("ckpt"));
}

TEST_F(StopOnSignalTest, UnderTorchrun) {
  CommandResult run = signal_when(torchrun() + " --nproc-per-node 2 --master-port " + free_port() + " --no-python " +
                                      strata_binary() + " " + train_flags(100000) + " --devices 2 --ckpt-dir " +
                                      path("ckpt"), after_step_three(), "TERM");
  // torchrun reports its workers' exit (143 each) as a failure of its own.
  EXPECT_FALSE(contains(run.output, "exit=0")) << run.output;
  EXPECT_TRUE(contains(run.output, "exitcode  : 143") || contains(run.output, "exitcode: 143") ||
              contains(run.output, "SignalException"))
      << run.output;
  check_stop_and_resume(run.output, path("ckpt"));
}

// Two tasks as srun starts them (srun forwards a signal to every task);
// `extra` goes before the program, `flags` after its own; `targets` are
// the tasks the signal is sent to ($zero, $one).
std::string slurm_tasks_script(const std::string& dir, const std::string& extra, const std::string& flags,
                               const std::string& ckpt, const std::string& signal, const std::string& ready,
                               const std::string& out, const std::string& targets = "$zero $one") {
  const std::string port = free_port();
  auto task = [&](int rank) {
    return "env SLURM_JOB_ID=4242 SLURM_PROCID=" + std::to_string(rank) + " SLURM_LOCALID=" + std::to_string(rank) +
           " SLURM_NODEID=0 SLURM_NTASKS=2 SLURM_NNODES=1 SLURM_NTASKS_PER_NODE=2 SLURM_JOB_NODELIST=localhost "
           "SLURM_STEP_ID=0 MASTER_PORT=" + port + " OMP_NUM_THREADS=1 " + extra + " " + strata_binary() + " " +
           train_flags(100000) + " --devices 2 --ckpt-dir " + ckpt + " " + flags;
  };
  return "cd " + dir + " && { " + task(1) + " > " + out + ".1 2>&1 & one=$!; " + task(0) + " > " + out +
         " 2>&1 & zero=$!; for i in $(seq 600); do " + ready + " && break; sleep 0.1; done; kill -" + signal +
         " " + targets + "; wait $zero; a=$?; wait $one; b=$?; echo exit=$a,$b; cat " + out + "; }";
}

TEST_F(StopOnSignalTest, UnderSlurmVariablesSigterm) {
  CommandResult run = run_command(slurm_tasks_script(dir_.string(), "", "", path("ckpt"), "TERM", after_step_three(),
                                                     path("out.txt")));
  EXPECT_TRUE(contains(run.output, "exit=143,143")) << run.output;
  check_stop_and_resume(run.output, path("ckpt"));
}

TEST_F(StopOnSignalTest, SlurmsSigusr1SavesRequeuesAndTheRequeuedJobResumes) {
  // --signal=USR1@90: the tasks save and stop (138); with --requeue rank 0
  // asks scontrol to requeue the job (a recording stand-in here).
  fs::create_directories(path("bin"));
  std::ofstream(path("bin/scontrol")) << "#!/bin/sh\necho \"$@\" >> " << path("scontrol.log") << "\n";
  fs::permissions(path("bin/scontrol"), fs::perms::owner_all);
  CommandResult run = run_command(slurm_tasks_script(dir_.string(), "PATH=" + path("bin") + ":$PATH", "--requeue",
                                                     path("ckpt"), "USR1", after_step_three(), path("out.txt")));
  EXPECT_TRUE(contains(run.output, "exit=138,138")) << run.output;
  std::ifstream log(path("scontrol.log"));
  std::string line;
  ASSERT_TRUE(std::getline(log, line)) << "scontrol was not run\n" << run.output;
  EXPECT_EQ(line, "requeue 4242");
  EXPECT_FALSE(std::getline(log, line)) << "scontrol ran more than once: " << line;
  check_stop_and_resume(run.output, path("ckpt"), "SIGUSR1");
}

TEST_F(StopOnSignalTest, ASignalThatReachesOneTaskStopsEveryTaskAsThatSignal) {
  // A signal reaches the tasks at different times (srun's forwarding, a
  // node's SIGTERM): the tasks agree on one signal after the same step, so
  // a task the signal had not reached exits with the same code, and rank 0
  // requeues although only rank 1 was told.
  fs::create_directories(path("bin"));
  std::ofstream(path("bin/scontrol")) << "#!/bin/sh\necho \"$@\" >> " << path("scontrol.log") << "\n";
  fs::permissions(path("bin/scontrol"), fs::perms::owner_all);
  CommandResult run = run_command(slurm_tasks_script(dir_.string(), "PATH=" + path("bin") + ":$PATH", "--requeue",
                                                     path("ckpt"), "USR1", after_step_three(), path("out.txt"),
                                                     "$one"));
  EXPECT_TRUE(contains(run.output, "exit=138,138")) << run.output;
  std::ifstream log(path("scontrol.log"));
  std::string line;
  ASSERT_TRUE(std::getline(log, line)) << "scontrol was not run\n" << run.output;
  EXPECT_EQ(line, "requeue 4242");
  check_stop_and_resume(run.output, path("ckpt"), "SIGUSR1");
}

}  // namespace
