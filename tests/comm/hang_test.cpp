// Stuck-rank detection: a worker that stops making progress (stopped by
// SIGSTOP, or asleep in user code) is named by the launcher within the
// hang timeout, with where every rank was last seen, and the job stops
// with no process left behind.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <signal.h>

#include <chrono>
#include <thread>

#include "strata/comm/group.h"
#include "strata/runtime/env.h"
#include "strata/runtime/heartbeat.h"
#include "support/multiprocess.h"
#include "support/processes.h"
#include "support/worker.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Steps of one all_reduce each; at step 3 rank 1 does args[0]: "stop"
// (SIGSTOP to itself) or "sleep" (ten minutes in user code).
STRATA_WORKER(stall_at_step_3) {
  auto env = strata::runtime::Environment::from_env();
  strata::comm::Group group = strata::comm::init_process_group(env);
  const int64_t steps = args.at(0) == "none" ? 100 : 1000;
  for (int64_t step = 1; step <= steps; ++step) {
    strata::runtime::report_step(step);
    if (step == 3 && env.rank == 1) {
      if (args.at(0) == "stop") ::raise(SIGSTOP);
      if (args.at(0) == "sleep") std::this_thread::sleep_for(600s);
    }
    at::Tensor t = at::ones({4});
    group.all_reduce(t);
    std::this_thread::sleep_for(20ms);
  }
  return 0;
}

struct Stalled {
  strata::testing::WorkersResult result;
  double seconds = 0;
};

Stalled run_stalling(const std::string& how) {
  auto start = Clock::now();
  Stalled run;
  run.result = strata::testing::run_workers(
      2, "stall_at_step_3", {how},
      strata::runtime::LaunchOptions().with_timeout_s(60).with_hang_timeout(3s).with_grace_period(2s));
  run.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  for (int pid : run.result.launch.pids) EXPECT_TRUE(strata::testing::gone_within(pid, 10s)) << "pid " << pid;
  return run;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

TEST(HangTest, AStoppedWorkerIsNamedWithWhereEveryRankWasLastSeen) {
  Stalled run = run_stalling("stop");
  const auto& r = run.result.launch;
  std::string report = joined(r.report);
  EXPECT_EQ(r.exit_code, 124) << r.summary << "\n" << run.result.output;
  EXPECT_EQ(r.hung_rank, 1) << r.summary;
  EXPECT_EQ(r.summary.rfind("rank 1 is stuck: no heartbeat for ", 0), 0u) << r.summary;
  // "Last seen" is its last heartbeat, sent a few times per hang timeout:
  // the stop came at step 3, a few tens of milliseconds in, so the last
  // heartbeat may predate it.
  EXPECT_NE(r.summary.find(" (the process is stopped or frozen); last seen "), std::string::npos) << r.summary;
  EXPECT_NE(report.find("  rank 0: waiting in all_reduce #"), std::string::npos) << report;
  EXPECT_NE(report.find("  rank 1: no heartbeat for "), std::string::npos) << report;
  EXPECT_NE(report.find("   <- stuck\n"), std::string::npos) << report;
  EXPECT_NE(report.find("stopped the job: no progress within --hang-timeout 3.0 s"), std::string::npos) << report;
  EXPECT_LT(run.seconds, 30.0) << "named after " << run.seconds << " s";
  std::cout << "[ measured ] stopped worker named and job stopped after " << run.seconds << " s\n";
}

TEST(HangTest, AWorkerAsleepInUserCodeIsNamed) {
  Stalled run = run_stalling("sleep");
  const auto& r = run.result.launch;
  std::string report = joined(r.report);
  EXPECT_EQ(r.exit_code, 124) << r.summary << "\n" << run.result.output;
  EXPECT_EQ(r.hung_rank, 1) << r.summary;
  EXPECT_EQ(r.summary.rfind("rank 1 is stuck: no progress for ", 0), 0u) << r.summary;
  EXPECT_NE(r.summary.find(" in user code at step 3, after all_reduce #"), std::string::npos) << r.summary;
  EXPECT_NE(r.summary.find(", outside any collective"), std::string::npos) << r.summary;
  EXPECT_NE(report.find("  rank 0: waiting in all_reduce #"), std::string::npos) << report;
  EXPECT_NE(report.find("  rank 1: running in user code at step 3"), std::string::npos) << report;
  EXPECT_LT(run.seconds, 30.0) << "named after " << run.seconds << " s";
  std::cout << "[ measured ] sleeping worker named and job stopped after " << run.seconds << " s\n";
}

TEST(HangTest, WorkersThatKeepMovingAreNeverNamed) {
  // 100 steps of about 20 ms each: the hang check watches and stays quiet.
  auto result = strata::testing::run_workers(
      2, "stall_at_step_3", {"none"},
      strata::runtime::LaunchOptions().with_timeout_s(60).with_hang_timeout(3s));
  EXPECT_TRUE(result.ok()) << result.launch.summary << "\n" << joined(result.launch.report);
  EXPECT_TRUE(result.launch.report.empty());
}

}  // namespace
