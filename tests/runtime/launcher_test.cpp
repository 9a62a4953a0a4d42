// The launcher with real worker processes: ranks and environment, failure
// reports (exit code, signal, last error line), stopping the others within
// the grace period without leaving orphans, and arguments passed verbatim.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "strata/core/error.h"
#include "strata/runtime/env.h"
#include "strata/runtime/launcher.h"
#include "support/multiprocess.h"
#include "support/worker.h"

#include "support/processes.h"

namespace {

using namespace std::chrono_literals;
using strata::runtime::Environment;
using strata::runtime::LaunchOptions;
using strata::testing::run_workers;

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

// Prints the variables the launcher set, as Environment reads them.
STRATA_WORKER(print_env) {
  Environment env = Environment::from_env();
  std::cout << "env rank=" << env.rank << " local_rank=" << env.local_rank << " world_size=" << env.world_size
            << " local_world_size=" << env.local_world_size << " node_rank=" << env.node_rank
            << " master=" << env.master_addr << ":" << env.master_port << " timeout=" << env.timeout_s
            << " extra=" << env_or("STRATA_TEST_EXTRA", "-") << " source=" << env.source << std::endl;
  return 0;
}

// args: failing rank, exit code. That rank prints an error and exits.
STRATA_WORKER(fail_on_rank) {
  Environment env = Environment::from_env();
  if (env.rank == std::stoi(args.at(0))) {
    std::cerr << "preparing to fail\n\nerror: rank " << env.rank << " gave up" << std::endl;
    return std::stoi(args.at(1));
  }
  return 0;
}

// args: rank to kill. That rank SIGKILLs itself.
STRATA_WORKER(kill_self_on_rank) {
  Environment env = Environment::from_env();
  if (env.rank == std::stoi(args.at(0))) ::kill(::getpid(), SIGKILL);
  return 0;
}

// args: pid folder, failing rank. Every rank records its pid; the failing
// rank waits until all pids are written, then exits with 5; the others
// block in pause() forever (optionally ignoring SIGTERM, arg 3 == "ignore").
STRATA_WORKER(hang_while_one_fails) {
  Environment env = Environment::from_env();
  const std::string dir = args.at(0);
  if (args.size() > 2 && args[2] == "ignore") ::signal(SIGTERM, SIG_IGN);
  {
    std::ofstream(dir + "/pid." + std::to_string(env.rank) + ".tmp") << ::getpid() << "\n";
    std::rename((dir + "/pid." + std::to_string(env.rank) + ".tmp").c_str(),
                (dir + "/pid." + std::to_string(env.rank)).c_str());
  }
  if (env.rank == std::stoi(args.at(1))) {
    for (int r = 0; r < env.world_size; ++r) {
      while (!std::ifstream(dir + "/pid." + std::to_string(r)).good()) ::usleep(1000);
    }
    std::cerr << "error: rank " << env.rank << " failed on purpose" << std::endl;
    return 5;
  }
  while (true) ::pause();
}

// Prints every argument on its own line between markers.
STRATA_WORKER(echo_args) {
  for (const std::string& a : args) std::cout << "arg<" << a << ">" << std::endl;
  return 0;
}

std::string make_temp_dir() {
  std::string templ = ::testing::TempDir() + "strata_launcher_XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  const char* made = ::mkdtemp(buf.data());
  EXPECT_NE(made, nullptr);
  return made != nullptr ? made : "";
}

TEST(LauncherTest, EveryWorkerGetsItsRanksAndTheRendezvousAddress) {
  LaunchOptions options = LaunchOptions().with_timeout_s(42).with_master_port(23456);
  options.extra_env["STRATA_TEST_EXTRA"] = "hello world";
  auto result = run_workers(3, "print_env", {}, options);
  ASSERT_TRUE(result.ok()) << result.launch.summary;
  EXPECT_EQ(result.launch.summary, "");
  EXPECT_EQ(result.launch.pids.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    std::string expected = "[rank " + std::to_string(r) + "] env rank=" + std::to_string(r) +
                           " local_rank=" + std::to_string(r) +
                           " world_size=3 local_world_size=3 node_rank=0 master=127.0.0.1:23456 timeout=42 "
                           "extra=hello world source=strata\n";
    EXPECT_NE(result.output.find(expected), std::string::npos) << expected << "\nnot in:\n" << result.output;
  }
}

TEST(LauncherTest, SecondNodeRanksStartAfterTheFirstNodes) {
  LaunchOptions options = LaunchOptions().with_nnodes(3).with_node_rank(2).with_master_port(23457);
  auto result = run_workers(2, "print_env", {}, options);
  ASSERT_TRUE(result.ok()) << result.launch.summary;
  EXPECT_NE(result.output.find("[rank 4] env rank=4 local_rank=0 world_size=6 local_world_size=2 node_rank=2"),
            std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("[rank 5] env rank=5 local_rank=1 world_size=6 local_world_size=2 node_rank=2"),
            std::string::npos)
      << result.output;
}

TEST(LauncherTest, FreePortIsChosenOnASingleNode) {
  auto result = run_workers(2, "print_env");
  ASSERT_TRUE(result.ok()) << result.launch.summary;
  auto pos = result.output.find("master=127.0.0.1:");
  ASSERT_NE(pos, std::string::npos) << result.output;
  int port = std::atoi(result.output.c_str() + pos + std::string("master=127.0.0.1:").size());
  EXPECT_GT(port, 0);
  EXPECT_LE(port, 65535);
}

TEST(LauncherTest, WorkerExitingWithCodeIsReportedWithRankCodeAndLastError) {
  auto result = run_workers(2, "fail_on_rank", {"1", "3"});
  EXPECT_EQ(result.launch.exit_code, 3);
  EXPECT_EQ(result.launch.failed_rank, 1);
  EXPECT_EQ(result.launch.failed_exit_code, 3);
  EXPECT_EQ(result.launch.failed_signal, 0);
  EXPECT_EQ(result.launch.last_error, "error: rank 1 gave up");
  EXPECT_EQ(result.launch.summary, "rank 1 exited with code 3; last error: error: rank 1 gave up");
  EXPECT_NE(result.output.find("[rank 1] error: rank 1 gave up\n"), std::string::npos) << result.output;
}

TEST(LauncherTest, WorkerKilledBySignalIsReportedAsThatSignal) {
  auto result = run_workers(2, "kill_self_on_rank", {"0"});
  EXPECT_EQ(result.launch.failed_rank, 0);
  EXPECT_EQ(result.launch.failed_signal, 9);
  EXPECT_EQ(result.launch.exit_code, 128 + 9);
  EXPECT_EQ(result.launch.summary, "rank 0 was killed by signal 9 (SIGKILL)");
}

void expect_hanging_workers_are_stopped(bool ignore_sigterm) {
  std::string dir = make_temp_dir();
  LaunchOptions options = LaunchOptions().with_grace_period(ignore_sigterm ? 200ms : 5000ms);
  std::vector<std::string> args{dir, "2"};
  if (ignore_sigterm) args.push_back("ignore");
  auto result = run_workers(3, "hang_while_one_fails", args, options);
  EXPECT_EQ(result.launch.failed_rank, 2);
  EXPECT_EQ(result.launch.exit_code, 5);
  EXPECT_EQ(result.launch.last_error, "error: rank 2 failed on purpose");
  for (int r = 0; r < 3; ++r) {
    std::ifstream in(dir + "/pid." + std::to_string(r));
    pid_t pid = 0;
    ASSERT_TRUE(in >> pid) << "rank " << r << " wrote no pid";
    EXPECT_EQ(pid, result.launch.pids[r]);
    EXPECT_TRUE(strata::testing::gone_within(pid, 10s)) << "rank " << r << " (pid " << pid << ") survived";
  }
}

TEST(LauncherTest, HangingWorkersAreStoppedWhenAnotherFails) { expect_hanging_workers_are_stopped(false); }

TEST(LauncherTest, WorkersIgnoringSigtermAreKilledAfterTheGracePeriod) { expect_hanging_workers_are_stopped(true); }

TEST(LauncherTest, ArgumentsArriveUnchanged) {
  std::vector<std::string> args{"with space", "it's \"quoted\"", "$HOME", "*", "", "a;b|c&&d", "back\\slash"};
  auto result = run_workers(1, "echo_args", args);
  ASSERT_TRUE(result.ok()) << result.launch.summary;
  std::string expected;
  for (const std::string& a : args) expected += "[rank 0] arg<" + a + ">\n";
  EXPECT_EQ(result.output, expected);
}

TEST(LauncherTest, ProgramOnPathIsFoundAndOutputIsNotPrefixedWhenAsked) {
  std::string out;
  LaunchOptions options = LaunchOptions().with_nproc_per_node(2).with_prefix_output(false).with_on_output(
      [&out](int, strata::runtime::OutputStream, const std::string& line) { out += line; });
  auto result = strata::runtime::launch_workers({"sh", "-c", "echo \"r$RANK\""}, options);
  ASSERT_EQ(result.exit_code, 0) << result.summary;
  EXPECT_TRUE(out == "r0\nr1\n" || out == "r1\nr0\n") << out;
}

TEST(LauncherTest, MissingProgramIsALaunchErrorNamingIt) {
  try {
    strata::runtime::launch_workers({"strata-no-such-program-xyz"}, LaunchOptions());
    FAIL() << "no error";
  } catch (const strata::LaunchError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot find program 'strata-no-such-program-xyz' on PATH"),
              std::string::npos)
        << e.what();
  }
  try {
    strata::runtime::launch_workers({"/nonexistent/strata/prog"}, LaunchOptions());
    FAIL() << "no error";
  } catch (const strata::LaunchError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot run '/nonexistent/strata/prog': No such file or directory"),
              std::string::npos)
        << e.what();
  }
}

TEST(LauncherTest, InvalidOptionsNameTheField) {
  EXPECT_THROW(LaunchOptions().with_nproc_per_node(0).validate(), strata::ConfigError);
  try {
    LaunchOptions().with_nnodes(2).validate();
    FAIL() << "no error";
  } catch (const strata::ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "[launcher] master_port (--master-port) is required when the job spans 2 nodes: every node must use "
                 "the same port on 127.0.0.1");
  }
  try {
    LaunchOptions().with_nnodes(2).with_node_rank(2).with_master_port(1234).validate();
    FAIL() << "no error";
  } catch (const strata::ConfigError& e) {
    EXPECT_STREQ(e.what(), "[launcher] node_rank (--node-rank) must be in 0..1 for nnodes=2, got 2");
  }
}

TEST(LauncherTest, MaxTimeStopsAJobThatRunsTooLong) {
  std::string dir = make_temp_dir();
  // No rank fails (failing rank 7 does not exist): every worker hangs.
  LaunchOptions options = LaunchOptions().with_max_time(300ms).with_grace_period(2000ms);
  auto result = run_workers(2, "hang_while_one_fails", {dir, "7"}, options);
  EXPECT_EQ(result.launch.exit_code, 124);
  EXPECT_EQ(result.launch.failed_rank, -1);
  EXPECT_EQ(result.launch.summary, "the workers were still running after 300 ms (max_time); stopped them");
  for (pid_t pid : result.launch.pids) EXPECT_TRUE(strata::testing::gone_within(pid, 10s));
}

TEST(LauncherTest, ProcessThatEscapesTheGroupDoesNotKeepTheLauncherWaiting) {
  std::string dir = make_temp_dir();
  // The worker starts a process in a new session that keeps the worker's
  // stdout open, then exits 0: the launcher must still return.
  std::string script = "setsid sh -c 'echo $$ > " + dir + "/escaped; exec sleep 1000' & while [ ! -s " + dir +
                       "/escaped ]; do sleep 0.01; done; echo done";
  std::string out;
  LaunchOptions options = LaunchOptions().with_grace_period(200ms).with_on_output(
      [&out](int, strata::runtime::OutputStream, const std::string& line) { out += line; });
  auto result = strata::runtime::launch_workers({"/bin/sh", "-c", script}, options);
  EXPECT_EQ(result.exit_code, 0) << result.summary;
  EXPECT_EQ(out, "[rank 0] done\n");
  std::ifstream in(dir + "/escaped");
  pid_t escaped = 0;
  ASSERT_TRUE(in >> escaped);
  ::kill(escaped, SIGKILL);  // it left the worker's group on purpose; clean up here
  EXPECT_TRUE(strata::testing::gone_within(escaped, 10s));
}

}  // namespace
