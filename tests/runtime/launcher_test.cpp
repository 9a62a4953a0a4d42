// The launcher with real worker processes: ranks and environment, failure
// reports (exit code, signal, last error line), stopping the others within
// the grace period without leaving orphans, arguments passed verbatim, the
// stop on a signal (workers finish and save; a second signal, the stop
// timeout), lines redrawn in place on a terminal, and MASTER_PORT.
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>

#include "strata/core/error.h"
#include "strata/runtime/env.h"
#include "strata/runtime/launcher.h"
#include "support/multiprocess.h"
#include "support/worker.h"

#include "support/processes.h"
#include "support/environment.h"

namespace {

using strata::testing::ScopedEnv;

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

// What a Trainer's rank writes to stderr before a crash that says nothing
// of itself: log lines, a warning, the model summary (its last line was
// once quoted as the error), a progress line.
constexpr const char* kTrainerChatter =
    "[trainer] fit: 2 ranks, DDPStrategy on cpu\n"
    "warning: [data] the last batch of each epoch is dropped\n"
    "  | Name  | Type   | Params | Mode \n"
    "----------------------------------------\n"
    "0 | model | GPT    | 110 K  | train\n"
    "----------------------------------------\n"
    "110 K     Trainable params\n"
    "0         Non-trainable params\n"
    "110 K     Total params\n"
    "0.442     Total estimated model params size (MB)\n"
    "12        Modules in train mode\n"
    "0         Modules in eval mode\n";

// args: rank to kill, then "quiet" or "said-error". That rank writes what a
// Trainer writes (after an error line of its own with "said-error"), then
// SIGKILLs itself.
STRATA_WORKER(chatter_then_kill) {
  Environment env = Environment::from_env();
  if (env.rank != std::stoi(args.at(0))) return 0;
  if (args.at(1) == "said-error") std::cerr << "error: [checkpoint] cannot write ckpt/step-3: disk full\n";
  std::cerr << kTrainerChatter << "Epoch 0: step 3/100 loss 4.21" << std::endl;
  ::kill(::getpid(), SIGKILL);
  return 0;
}

// args: how rank 1 fails with a c10::Error (whose what() ends with its
// backtrace): "caught" as strata's main reports it ("strata: internal
// error: " + what(), exit 2); "raw", what() printed as it is after an older
// error line and before a farewell (exit 3); "uncaught", escaping a thread
// (std::terminate: SIGABRT). "python": a Python traceback and a torch
// warning after it (exit 1).
STRATA_WORKER(c10_failure) {
  Environment env = Environment::from_env();
  if (env.rank != 1) return 0;
  const std::string how = args.at(0);
  std::cerr << kTrainerChatter;
  auto fail = [] { TORCH_CHECK(false, "planted c10 failure on rank ", 1); };
  if (how == "uncaught") std::thread(fail).join();
  if (how == "python") {
    std::cerr << "Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n    main()\n"
                 "RuntimeError: planted python failure\n"
                 "[W1207 00:36:25.410209576 ProcessGroup.cpp:95] Warning: the process group was not destroyed"
              << std::endl;
    return 1;
  }
  try {
    fail();
  } catch (const std::exception& e) {
    if (how == "caught") {
      std::cerr << "strata: internal error: " << e.what() << std::endl;
      return 2;
    }
    std::cerr << "error: [ddp] an earlier problem, handled\n" << kTrainerChatter << e.what() << "\nshutting down"
              << std::endl;
    return 3;
  }
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

// ---- stopping on a signal (Note [Stopping on a signal]) ----------------------

volatile sig_atomic_t g_stop_signal = 0;
volatile sig_atomic_t g_signals = 0;

// The Trainer's contract, in small: the first SIGINT/SIGTERM asks to stop;
// a second one stops the process at once.
extern "C" void on_stop_signal(int sig) {
  g_signals = g_signals + 1;
  if (g_stop_signal != 0) {
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  g_stop_signal = sig;
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path + ".tmp") << text;
  std::rename((path + ".tmp").c_str(), path.c_str());
}

bool appears_within(const std::string& path, std::chrono::seconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (std::ifstream(path).good()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return false;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// args: folder, mode. Every rank writes ready.R, then waits for a stop
// signal; on it, finishes its "step" (100 ms), writes saved.R with the
// signal and exits with 128+signal. Modes: "save" as said; "slow": after
// the signal writes stopping.R and never ends (a second signal ends it);
// "ignore": ignores SIGINT and SIGTERM; "fail": rank 1 exits 1 instead of
// saving; "peer": rank 0 gets no signal: it waits for saved.1 (the ranks
// agreed to stop) and writes saved.0 with how many signals it got.
STRATA_WORKER(stop_on_signal) {
  Environment env = Environment::from_env();
  const std::string dir = args.at(0);
  const std::string mode = args.at(1);
  const std::string r = std::to_string(env.rank);
  if (mode == "ignore") {
    ::signal(SIGINT, SIG_IGN);
    ::signal(SIGTERM, SIG_IGN);
  } else {
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGINT, &action, nullptr);
    ::sigaction(SIGTERM, &action, nullptr);
  }
  write_file(dir + "/ready." + r, std::to_string(::getpid()));
  if (mode == "peer" && env.rank == 0) {
    if (!appears_within(dir + "/saved.1", 60s)) return 2;
    // Ends after the launcher reaped rank 1, so rank 1 is the one it sees stop.
    const pid_t peer = std::stoi(read_file(dir + "/ready.1"));
    for (int i = 0; i < 60000 && !(::kill(peer, 0) != 0 && errno == ESRCH); ++i) ::usleep(1000);
    write_file(dir + "/saved.0", "signals=" + std::to_string(g_signals));
    return 128 + SIGTERM;
  }
  while (g_stop_signal == 0) ::usleep(1000);
  if (mode == "slow") {
    write_file(dir + "/stopping." + r, "");
    while (true) ::pause();
  }
  ::usleep(100 * 1000);  // the step in flight
  if (mode == "fail" && env.rank == 1) {
    std::cerr << "error: cannot write the checkpoint" << std::endl;
    return 1;
  }
  write_file(dir + "/saved." + r, "signal=" + std::to_string(g_stop_signal));
  return 128 + g_stop_signal;
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

// Note [The last error line]: a rank killed by a signal is reported with an
// error line it wrote, or with none; never with its model summary.
TEST(LauncherTest, ARankKilledBySignalIsReportedWithItsErrorLineOrNone) {
  auto quiet = run_workers(2, "chatter_then_kill", {"0", "quiet"});
  EXPECT_EQ(quiet.launch.failed_signal, 9);
  EXPECT_EQ(quiet.launch.last_error, "");
  EXPECT_EQ(quiet.launch.summary, "rank 0 was killed by signal 9 (SIGKILL)") << quiet.output;
  auto said = run_workers(2, "chatter_then_kill", {"0", "said-error"});
  EXPECT_EQ(said.launch.summary, "rank 0 was killed by signal 9 (SIGKILL); last error: error: [checkpoint] cannot "
                                 "write ckpt/step-3: disk full")
      << said.output;
}

// Note [The last error line]: a c10::Error is quoted by its message, never
// by a line of its backtrace, however the worker printed it.
TEST(LauncherTest, ARankThatThrewAC10ErrorIsReportedByTheErrorsMessage) {
  auto caught = run_workers(2, "c10_failure", {"caught"});
  EXPECT_EQ(caught.launch.summary, "rank 1 exited with code 2; last error: strata: internal error: planted c10 "
                                   "failure on rank 1")
      << caught.output;
  auto uncaught = run_workers(2, "c10_failure", {"uncaught"});
  EXPECT_EQ(uncaught.launch.summary, "rank 1 was killed by signal 6 (SIGABRT); last error: what():  planted c10 "
                                     "failure on rank 1")
      << uncaught.output;
}

// Note [The last error line]: an exception's message printed without
// "error:" is found before its backtrace, and a Python exception by its
// name, whatever follows them.
TEST(LauncherTest, AnExceptionPrintedAsItIsIsReportedByItsMessage) {
  auto raw = run_workers(2, "c10_failure", {"raw"});
  EXPECT_EQ(raw.launch.summary, "rank 1 exited with code 3; last error: planted c10 failure on rank 1") << raw.output;
  auto python = run_workers(2, "c10_failure", {"python"});
  EXPECT_EQ(python.launch.summary, "rank 1 exited with code 1; last error: RuntimeError: planted python failure")
      << python.output;
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

TEST(LauncherTest, TheCallerIsTheFirstLocalRanksAndHearsWhereTheJobRuns) {
  // The subprocess launcher's rank 0: the launcher starts local ranks 1 and
  // 2 of 3 and tells the caller its own place and the workers' pids.
  std::string out;
  strata::runtime::Environment job;
  std::vector<int> started;
  LaunchOptions options = LaunchOptions().with_nproc_per_node(3).with_first_local_rank(1).with_on_output(
      [&out](int, strata::runtime::OutputStream, const std::string& line) { out += line; });
  options.on_started = [&](const strata::runtime::Environment& env, const std::vector<int>& pids) {
    job = env;
    started = pids;
  };
  auto result = strata::runtime::launch_workers(
      {"sh", "-c", "echo \"$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $MASTER_PORT $STRATA_JOB_TOKEN\""},
      options);
  ASSERT_EQ(result.exit_code, 0) << result.summary;
  EXPECT_EQ(job.rank, 0);
  EXPECT_EQ(job.local_rank, 0);
  EXPECT_EQ(job.world_size, 3);
  EXPECT_EQ(job.local_world_size, 3);
  EXPECT_GT(job.master_port, 0);
  EXPECT_FALSE(job.job_token.empty());
  EXPECT_EQ(started, result.pids);
  ASSERT_EQ(started.size(), 2u);
  const std::string tail = " 3 3 " + std::to_string(job.master_port) + " " + job.job_token + "\n";
  const std::string one = "[rank 1] 1 1" + tail, two = "[rank 2] 2 2" + tail;
  EXPECT_TRUE(out == one + two || out == two + one) << out;
  // Rank 0 is no worker of this launcher.
  EXPECT_THROW(strata::runtime::launch_workers({"true"}, LaunchOptions().with_first_local_rank(1)),
               strata::ConfigError);
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
                 "[launcher] master_port (--master-port or MASTER_PORT) is required when the job spans 2 nodes: every "
                 "node must use the same port on 127.0.0.1");
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

// Runs `nproc` stop_on_signal workers in `mode` while `act` (another
// thread) signals them or the launcher. max_time keeps a broken stop from
// hanging the test.
strata::testing::WorkersResult run_stopping(int nproc, const std::string& dir, const std::string& mode,
                                            LaunchOptions options, const std::function<void()>& act) {
  options.with_max_time(120s);
  std::thread actor(act);
  auto result = run_workers(nproc, "stop_on_signal", {dir, mode}, options);
  actor.join();
  return result;
}

bool all_ready(const std::string& dir, int nproc) {
  for (int r = 0; r < nproc; ++r)
    if (!appears_within(dir + "/ready." + std::to_string(r), 60s)) return false;
  return true;
}

TEST(LauncherStopTest, SigtermToTheLauncherLetsEveryWorkerSaveAndReturns143) {
  std::string dir = make_temp_dir();
  auto result = run_stopping(2, dir, "save", LaunchOptions().with_timeout_s(60), [&] {
    if (all_ready(dir, 2)) ::kill(::getpid(), SIGTERM);
  });
  EXPECT_EQ(result.launch.exit_code, 143) << result.launch.summary;
  EXPECT_EQ(result.launch.interrupted_by, SIGTERM);
  EXPECT_EQ(result.launch.failed_rank, -1);
  EXPECT_EQ(result.launch.summary, "the launcher received SIGTERM; stopped all 2 workers");
  // Each got the launcher's SIGTERM (not another signal) and saved.
  EXPECT_EQ(read_file(dir + "/saved.0"), "signal=15");
  EXPECT_EQ(read_file(dir + "/saved.1"), "signal=15");
}

TEST(LauncherStopTest, SigintIsForwardedAsSigintAndTheExitStatusIs130) {
  std::string dir = make_temp_dir();
  auto result = run_stopping(2, dir, "save", LaunchOptions().with_timeout_s(60), [&] {
    if (all_ready(dir, 2)) ::kill(::getpid(), SIGINT);
  });
  EXPECT_EQ(result.launch.exit_code, 130) << result.launch.summary;
  EXPECT_EQ(result.launch.interrupted_by, SIGINT);
  EXPECT_EQ(result.launch.summary, "the launcher received SIGINT; stopped all 2 workers");
  EXPECT_EQ(read_file(dir + "/saved.0"), "signal=2");
  EXPECT_EQ(read_file(dir + "/saved.1"), "signal=2");
}

TEST(LauncherStopTest, ASecondSignalKillsTheWorkersAtOnce) {
  std::string dir = make_temp_dir();
  // The stop timeout is far longer than any test: only the second signal
  // can end these workers, which never finish their save.
  LaunchOptions options = LaunchOptions().with_timeout_s(60).with_stop_timeout(std::chrono::hours(1));
  auto result = run_stopping(2, dir, "slow", options, [&] {
    if (!all_ready(dir, 2)) return;
    ::kill(::getpid(), SIGTERM);
    if (appears_within(dir + "/stopping.0", 60s) && appears_within(dir + "/stopping.1", 60s))
      ::kill(::getpid(), SIGINT);
  });
  EXPECT_EQ(result.launch.exit_code, 143) << result.launch.summary;
  EXPECT_EQ(result.launch.interrupted_by, SIGTERM);
  EXPECT_EQ(result.launch.summary,
            "the launcher received SIGTERM; killed ranks 0, 1 at once on a second signal (a checkpoint may be "
            "incomplete)");
  for (pid_t pid : result.launch.pids) EXPECT_TRUE(strata::testing::gone_within(pid, 10s));
}

TEST(LauncherStopTest, AWorkerIgnoringTheSignalIsStoppedAfterTheStopTimeout) {
  std::string dir = make_temp_dir();
  LaunchOptions options = LaunchOptions().with_timeout_s(60).with_stop_timeout(300ms).with_grace_period(200ms);
  auto result = run_stopping(2, dir, "ignore", options, [&] {
    if (all_ready(dir, 2)) ::kill(::getpid(), SIGTERM);
  });
  EXPECT_EQ(result.launch.exit_code, 143) << result.launch.summary;
  EXPECT_EQ(result.launch.interrupted_by, SIGTERM);
  EXPECT_EQ(result.launch.failed_rank, -1);
  EXPECT_EQ(result.launch.summary,
            "the launcher received SIGTERM; ranks 0, 1 did not end within the stop timeout (0.3 s) and were stopped "
            "(a checkpoint may be incomplete)");
  for (pid_t pid : result.launch.pids) EXPECT_TRUE(strata::testing::gone_within(pid, 10s));
}

TEST(LauncherStopTest, AWorkerThatFailsWhileStoppingIsNamed) {
  std::string dir = make_temp_dir();
  auto result = run_stopping(2, dir, "fail", LaunchOptions().with_timeout_s(60), [&] {
    if (all_ready(dir, 2)) ::kill(::getpid(), SIGTERM);
  });
  EXPECT_EQ(result.launch.exit_code, 143) << result.launch.summary;
  EXPECT_EQ(result.launch.summary,
            "the launcher received SIGTERM; stopped all 2 workers; rank 1 exited with code 1 while stopping; last "
            "error: error: cannot write the checkpoint");
  EXPECT_EQ(read_file(dir + "/saved.0"), "signal=15");
}

TEST(LauncherStopTest, AWorkerSignalledDirectlyStopsTheJobWithoutASignalToTheOthers) {
  std::string dir = make_temp_dir();
  auto result = run_stopping(2, dir, "peer", LaunchOptions().with_timeout_s(60), [&] {
    if (!all_ready(dir, 2)) return;
    ::kill(std::stoi(read_file(dir + "/ready.1")), SIGTERM);
  });
  EXPECT_EQ(result.launch.exit_code, 143) << result.launch.summary;
  EXPECT_EQ(result.launch.interrupted_by, SIGTERM);
  EXPECT_EQ(result.launch.failed_rank, -1);
  EXPECT_EQ(result.launch.summary, "rank 1 stopped on SIGTERM; stopped all 2 workers");
  EXPECT_EQ(read_file(dir + "/saved.1"), "signal=15");
  // Rank 0 ended on its own: the launcher did not signal it.
  EXPECT_EQ(read_file(dir + "/saved.0"), "signals=0");
}

TEST(LauncherStopTest, NegativeStopTimeoutIsRefused) {
  try {
    LaunchOptions().with_stop_timeout(-1ms).validate();
    FAIL() << "no error";
  } catch (const strata::ConfigError& e) {
    EXPECT_STREQ(e.what(), "[launcher] stop_timeout (--stop-timeout) must not be negative, got -1 ms");
  }
}

// ---- lines redrawn in place (Note [Redraws through the launcher]) ----------

struct Piece {
  strata::runtime::OutputStream stream;
  std::string text;
  bool operator==(const Piece&) const = default;
};

// Runs `script` under sh as one worker. The sink records each piece and
// touches `dir`/seen.N when it has N pieces, so a script can wait for the
// launcher to have taken its output before it writes to its other stream
// (two pipes keep no order between them).
std::vector<Piece> run_sh(const std::string& script, bool terminal, const std::string& dir = "") {
  std::vector<Piece> pieces;
  LaunchOptions options = LaunchOptions().with_terminal(terminal).with_on_output(
      [&pieces, dir](int, strata::runtime::OutputStream stream, const std::string& text) {
        pieces.push_back({stream, text});
        if (!dir.empty()) std::ofstream(dir + "/seen." + std::to_string(pieces.size())) << "\n";
      });
  auto result = strata::runtime::launch_workers({"/bin/sh", "-c", script, "sh", dir}, options);
  EXPECT_EQ(result.exit_code, 0) << result.summary;
  return pieces;
}

std::string shown(const std::vector<Piece>& pieces) {
  std::string out;
  for (const Piece& p : pieces)
    out += (p.stream == strata::runtime::OutputStream::kStdout ? "out:" : "err:") + p.text + "|";
  return out;
}

constexpr auto kOut = strata::runtime::OutputStream::kStdout;
constexpr auto kErr = strata::runtime::OutputStream::kStderr;

TEST(LauncherRedrawTest, OnATerminalRedrawsPassInPlaceAndOtherLinesEndThemFirst) {
  // As trainer::ProgressBar writes on a terminal: "\r" + text + clear, no
  // newline; a line on stderr in between; a final draw with "\n"; tqdm's
  // "text\r"; "\r\n" as a plain line end.
  std::string dir = make_temp_dir();
  std::string script =
      "seen() { while [ ! -e \"$1/seen.$2\" ]; do sleep 0.01; done; }; "
      "printf '\\rstep 1\\033[K'; printf '\\rstep 2\\033[K'; seen \"$1\" 2; echo warn >&2; seen \"$1\" 4; "
      "printf '\\rstep 3\\033[K'; printf '\\rstep 4\\033[K\\n'; echo plain; printf 'tq 1\\r'; printf 'tq 2\\r'; "
      "printf 'dos\\r\\n'";
  std::vector<Piece> expected{
      {kOut, "\r[rank 0] step 1\x1b[K"},   {kOut, "\r[rank 0] step 2\x1b[K"},
      {kOut, "\n"},                          {kErr, "[rank 0] warn\n"},
      {kOut, "\r[rank 0] step 3\x1b[K"},   {kOut, "\r[rank 0] step 4\x1b[K\n"},
      {kOut, "[rank 0] plain\n"},            {kOut, "\r[rank 0] tq 1\x1b[K"},
      {kOut, "\r[rank 0] tq 2\x1b[K"},     {kOut, "\r[rank 0] dos\x1b[K\n"},
  };
  std::vector<Piece> got = run_sh(script, true, dir);
  EXPECT_EQ(got, expected) << shown(got);
}

TEST(LauncherRedrawTest, OffATerminalOutputStaysLineByLine) {
  std::string script = "printf '\\rstep 1\\033[K'; printf '\\rstep 2\\033[K\\n'; echo plain; printf 'dos\\r\\n'";
  std::vector<Piece> expected{
      {kOut, "[rank 0] \rstep 1\x1b[K\rstep 2\x1b[K\n"},
      {kOut, "[rank 0] plain\n"},
      {kOut, "[rank 0] dos\n"},
  };
  std::vector<Piece> got = run_sh(script, false);
  EXPECT_EQ(got, expected) << shown(got);
}

TEST(LauncherRedrawTest, AnOpenRedrawIsEndedWhenTheWorkerEnds) {
  std::vector<Piece> expected{{kOut, "\r[rank 0] 50%\x1b[K"}, {kOut, "\r[rank 0] 50%\x1b[K\n"}};
  std::vector<Piece> got = run_sh("printf '\\r50%%'", true);
  EXPECT_EQ(got, expected) << shown(got);
}

TEST(LauncherRedrawTest, WorkersAreToldWhetherTheLauncherIsOnATerminal) {
  for (bool terminal : {true, false}) {
    std::vector<Piece> got = run_sh("echo \"tty=$STRATA_LAUNCHER_TTY\"", terminal);
    ASSERT_EQ(got.size(), 1u) << shown(got);
    EXPECT_EQ(got[0].text, terminal ? "[rank 0] tty=1\n" : "[rank 0] tty=0\n");
  }
}

// ---- MASTER_PORT (Note [MASTER_PORT from the environment]) ------------------

TEST(LauncherTest, MasterPortFromTheEnvironmentIsUsedWhenNoPortIsGiven) {
  ScopedEnv port("MASTER_PORT", "23461");
  auto result = run_workers(1, "print_env");
  ASSERT_TRUE(result.ok()) << result.launch.summary;
  EXPECT_NE(result.output.find("master=127.0.0.1:23461 "), std::string::npos) << result.output;
  auto given = run_workers(1, "print_env", {}, LaunchOptions().with_master_port(23462));
  ASSERT_TRUE(given.ok()) << given.launch.summary;
  EXPECT_NE(given.output.find("master=127.0.0.1:23462 "), std::string::npos) << given.output;
  // It also satisfies a several-node job's need for a fixed port.
  EXPECT_NO_THROW(LaunchOptions().with_nnodes(2).validate());
}

TEST(LauncherTest, MasterPortFromTheEnvironmentThatIsNoPortIsAnError) {
  for (std::string bad : {"abc", "0", "65536", "-5", "2950x", "123456789012345678901234567890"}) {
    ScopedEnv port("MASTER_PORT", bad);
    try {
      strata::runtime::launch_workers({"true"}, LaunchOptions());
      FAIL() << "no error for " << bad;
    } catch (const strata::ConfigError& e) {
      EXPECT_EQ(std::string(e.what()), "[launcher] MASTER_PORT='" + bad +
                                           "' in the environment is not a TCP port (1..65535); set it to one, "
                                           "unset it for a free port, or give --master-port");
    }
  }
}

}  // namespace
