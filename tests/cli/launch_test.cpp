// `strata launch` as users run it: the built `strata` binary started as a
// child process, its output and exit status checked.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <thread>

#include "strata/runtime/env.h"
#include "strata/runtime/launcher.h"
#include "strata/runtime/store.h"
#include "support/processes.h"
#include "support/tool.h"
#include "support/worker.h"
#include "support/environment.h"

namespace {

using strata::testing::ScopedEnv;

using namespace std::chrono_literals;

using strata::testing::Child;
using strata::testing::finish;
using strata::testing::Outcome;
using strata::testing::start_strata;
using strata::testing::strata_binary;

Outcome strata(const std::vector<std::string>& args) { return strata::testing::run_strata(args); }

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string make_temp_dir() {
  std::string templ = ::testing::TempDir() + "strata_cli_XXXXXX";
  const char* made = ::mkdtemp(templ.data());
  EXPECT_NE(made, nullptr);
  return templ;
}

// Waits with a deadline until `path` exists, then reads the pid in it.
pid_t wait_for_pid_file(const std::string& path, std::chrono::seconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(path);
    pid_t pid = 0;
    if (in >> pid) return pid;
    std::this_thread::sleep_for(10ms);
  }
  return -1;
}

TEST(LaunchCommandTest, EachWorkerSeesItsRank) {
  Outcome o = strata({"launch", "-n", "2", "--", "/bin/sh", "-c", "echo $RANK $LOCAL_RANK $WORLD_SIZE"});
  EXPECT_EQ(o.status, 0) << o.err;
  EXPECT_TRUE(contains(o.out, "[rank 0] 0 0 2\n")) << o.out;
  EXPECT_TRUE(contains(o.out, "[rank 1] 1 1 2\n")) << o.out;
  EXPECT_EQ(o.err, "");
}

TEST(LaunchCommandTest, NoPrefixPrintsWorkerOutputAsIs) {
  Outcome o = strata({"launch", "--no-prefix", "--", "echo", "plain"});
  EXPECT_EQ(o.status, 0) << o.err;
  EXPECT_EQ(o.out, "plain\n");
}

TEST(LaunchCommandTest, ArgumentsArriveUnchanged) {
  Outcome o = strata({"launch", "--", "/bin/sh", "-c", "for a in \"$@\"; do echo \"<$a>\"; done", "sh", "a b",
                      "$HOME", "*", "say \"hi\"", "it's", "--nnodes", "-n"});
  EXPECT_EQ(o.status, 0) << o.err;
  EXPECT_EQ(o.out,
            "[rank 0] <a b>\n[rank 0] <$HOME>\n[rank 0] <*>\n[rank 0] <say \"hi\">\n[rank 0] <it's>\n"
            "[rank 0] <--nnodes>\n[rank 0] <-n>\n");
}

TEST(LaunchCommandTest, FailingRankIsReportedAndItsCodeReturned) {
  Outcome o = strata({"launch", "-n", "2", "--grace-period", "1", "--", "/bin/sh", "-c",
                      "if [ $RANK = 1 ]; then echo 'boom: bad input' >&2; exit 3; fi; exec sleep 1000"});
  EXPECT_EQ(o.status, 3);
  EXPECT_TRUE(contains(o.err, "[rank 1] boom: bad input\n")) << o.err;
  EXPECT_TRUE(contains(o.err, "[launcher] rank 1 exited with code 3; last error: boom: bad input\n")) << o.err;
}

TEST(LaunchCommandTest, KilledRankIsReportedWithItsSignal) {
  Outcome o = strata({"launch", "--", "/bin/sh", "-c", "kill -9 $$"});
  EXPECT_EQ(o.status, 128 + 9);
  EXPECT_TRUE(contains(o.err, "[launcher] rank 0 was killed by signal 9 (SIGKILL)\n")) << o.err;
}

TEST(LaunchCommandTest, InterruptStopsEveryWorkerAndTheirChildren) {
  std::string dir = make_temp_dir();
  // Each worker starts a background child, records both pids, then waits.
  std::string script = "sleep 1000 & echo $! > " + dir + "/child.$RANK.tmp; mv " + dir + "/child.$RANK.tmp " + dir +
                       "/child.$RANK; echo $$ > " + dir + "/pid.$RANK.tmp; mv " + dir + "/pid.$RANK.tmp " + dir +
                       "/pid.$RANK; wait";
  Child child = start_strata({"launch", "-n", "2", "--grace-period", "2", "--", "/bin/sh", "-c", script});
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    for (const char* kind : {"pid", "child"}) {
      pid_t pid = wait_for_pid_file(dir + "/" + kind + "." + std::to_string(r), 60s);
      ASSERT_GT(pid, 0) << kind << " file of rank " << r << " never appeared";
      pids.push_back(pid);
    }
  }
  ASSERT_EQ(::kill(child.pid, SIGINT), 0);
  Outcome o = finish(child);
  EXPECT_EQ(o.status, 130) << o.err;
  EXPECT_TRUE(contains(o.err, "[launcher] the launcher received SIGINT; stopped all 2 workers\n")) << o.err;
  for (pid_t pid : pids) EXPECT_TRUE(strata::testing::gone_within(pid, 10s)) << "pid " << pid << " survived";
}

TEST(LaunchCommandTest, HelpMentionsEveryOption) {
  Outcome o = strata({"launch", "--help"});
  EXPECT_EQ(o.status, 0);
  for (const char* option : {"-n", "--nproc-per-node", "--nnodes", "--node-rank", "--master-addr", "--master-port",
                             "--timeout", "--grace-period", "--stop-timeout", "--max-time", "--hang-timeout",
                             "--no-prefix", "PROGRAM", "MASTER_PORT", "MASTER_ADDR",
                             "Examples:",
                             "strata launch -n 4 -- ./my_trainer"}) {
    EXPECT_TRUE(contains(o.out, option)) << option << " missing from:\n" << o.out;
  }
}

TEST(LaunchCommandTest, BadValuesGiveClearErrors) {
  Outcome zero = strata({"launch", "-n", "0", "--", "true"});
  EXPECT_EQ(zero.status, 1);
  EXPECT_EQ(zero.err,
            "strata: error: [launcher] --nproc-per-node '0' is out of range: it must be an integer in 1..1024\n");

  Outcome nodes = strata({"launch", "--nnodes", "2", "--", "true"});
  EXPECT_EQ(nodes.status, 1);
  EXPECT_EQ(nodes.err,
            "strata: error: [launcher] master_port (--master-port or MASTER_PORT) is required when the job spans 2 "
            "nodes: every node must use the same port on 127.0.0.1\n");

  Outcome none = strata({"launch", "-n", "2"});
  EXPECT_EQ(none.status, 1);
  EXPECT_TRUE(contains(none.err, "[launcher] no program given; put it after --")) << none.err;

  Outcome missing = strata({"launch", "--", "strata-no-such-program-xyz"});
  EXPECT_EQ(missing.status, 1);
  EXPECT_TRUE(contains(missing.err, "cannot find program 'strata-no-such-program-xyz' on PATH")) << missing.err;

  Outcome word = strata({"launch", "-n", "two", "--", "true"});
  EXPECT_NE(word.status, 0);
  EXPECT_TRUE(contains(word.err, "two")) << word.err;

  Outcome grace = strata({"launch", "--grace-period", "-1", "--", "true"});
  EXPECT_EQ(grace.status, 1);
  EXPECT_EQ(grace.err,
            "strata: error: [launcher] --grace-period '-1' is out of range: it must be a number in [0, 3600]\n");

  Outcome stop = strata({"launch", "--stop-timeout", "nan", "--", "true"});
  EXPECT_EQ(stop.status, 1);
  EXPECT_EQ(stop.err,
            "strata: error: [launcher] --stop-timeout 'nan' is not a decimal number: it must be a number in [0, "
            "604800]\n");
  Outcome week = strata({"launch", "--stop-timeout", "604801", "--", "true"});
  EXPECT_EQ(week.status, 1);
  EXPECT_EQ(week.err,
            "strata: error: [launcher] --stop-timeout '604801' is out of range: it must be a number in [0, 604800]\n");
}

TEST(LaunchCommandTest, MasterAddrAndPortFromTheEnvironmentAreUsedUnlessFlagsAreGiven) {
  ScopedEnv addr("MASTER_ADDR", "127.0.0.3");
  ScopedEnv port("MASTER_PORT", "23471");
  Outcome from_env = strata({"launch", "--", "/bin/sh", "-c", "echo $MASTER_ADDR:$MASTER_PORT"});
  EXPECT_EQ(from_env.status, 0) << from_env.err;
  EXPECT_EQ(from_env.out, "[rank 0] 127.0.0.3:23471\n");
  Outcome flags = strata({"launch", "--master-addr", "127.0.0.1", "--master-port", "23472", "--", "/bin/sh", "-c",
                          "echo $MASTER_ADDR:$MASTER_PORT"});
  EXPECT_EQ(flags.status, 0) << flags.err;
  EXPECT_EQ(flags.out, "[rank 0] 127.0.0.1:23472\n");
}

TEST(LaunchCommandTest, MalformedMasterPortOrAddrInTheEnvironmentIsNamed) {
  {
    ScopedEnv port("MASTER_PORT", "29500x");
    Outcome o = strata({"launch", "--", "true"});
    EXPECT_EQ(o.status, 1);
    EXPECT_EQ(o.err, "strata: error: [launcher] MASTER_PORT='29500x' in the environment is not a TCP port "
                     "(1..65535); set it to one, unset it for a free port, or give --master-port\n");
  }
  {
    ScopedEnv addr("MASTER_ADDR", "node 0");
    Outcome o = strata({"launch", "--", "true"});
    EXPECT_EQ(o.status, 1);
    EXPECT_EQ(o.err, "strata: error: [launcher] MASTER_ADDR='node 0' in the environment is not a host name or "
                     "address; set it to rank 0's host, unset it, or give --master-addr\n");
  }
}

// args: folder. Joins the rendezvous (rank 0 hosts the store), writes
// joined.RANK (its pid), and holds the store until the folder has a file "release".
STRATA_WORKER(hold_store) {
  strata::runtime::Environment env = strata::runtime::Environment::from_env();
  auto store = strata::runtime::make_store(env, std::chrono::seconds(60));
  std::ofstream(args.at(0) + "/joined." + std::to_string(env.rank)) << ::getpid() << "\n";
  auto deadline = std::chrono::steady_clock::now() + 120s;
  while (!std::ifstream(args.at(0) + "/release").good() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  return 0;
}

TEST(LaunchCommandTest, ASecondJobOnABusyPortIsToldAnotherJobHoldsItAndHowToChooseOne) {
  const std::string self = strata::runtime::current_command_line()[0];
  const std::string port = std::to_string(strata::runtime::find_free_port());
  std::string first_dir = make_temp_dir();
  Child first = start_strata({"launch", "-n", "2", "--master-port", port, "--", self, "--strata-worker=hold_store",
                              first_dir});
  bool joined = wait_for_pid_file(first_dir + "/joined.0", 60s) > 0 && wait_for_pid_file(first_dir + "/joined.1", 60s) > 0;
  // Both ways of giving the port: the flag, and MASTER_PORT.
  std::vector<Outcome> seconds;
  if (joined) {
    std::string dir = make_temp_dir();
    seconds.push_back(strata({"launch", "-n", "2", "--master-port", port, "--grace-period", "1", "--", self,
                              "--strata-worker=hold_store", dir}));
    ScopedEnv from_env("MASTER_PORT", port);
    seconds.push_back(
        strata({"launch", "-n", "2", "--grace-period", "1", "--", self, "--strata-worker=hold_store", dir}));
  }
  std::ofstream(first_dir + "/release") << "\n";
  Outcome o = finish(first);
  ASSERT_TRUE(joined) << o.out << o.err;
  EXPECT_EQ(o.status, 0) << o.err;
  for (const Outcome& second : seconds) {
    EXPECT_NE(second.status, 0);
    // Rank 0 cannot bind the port, rank 1 is refused by the first job's
    // store; whichever the launcher reports first says the same.
    EXPECT_TRUE(contains(second.err, "the port is in use by another strata job")) << second.err;
    EXPECT_TRUE(contains(second.err, "(--master-port or MASTER_PORT), or leave both unset for a free port on one "
                                     "host"))
        << second.err;
    EXPECT_FALSE(contains(second.err, "Start workers with strata launch")) << second.err;
  }
}

}  // namespace
