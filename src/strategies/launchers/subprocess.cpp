// The subprocess launcher: Note [The launching process is rank 0]
// (strategies/launchers/subprocess.h).
#include "strata/strategies/launchers/subprocess.h"

#include <ATen/Parallel.h>

#include <signal.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "strata/core/error.h"
#include "strata/core/interrupted.h"
#include "strata/core/log.h"
#include "strata/runtime/env.h"
#include "strata/runtime/launcher.h"
#include "strata/runtime/process.h"
#include "strata/runtime/store.h"
#include "strata/strategies/launchers/in_place.h"
#include "strata/strategies/placement.h"
#include "strata/strategies/strategy.h"

namespace strata::strategies {
namespace {

// How long rank 0, whose collective failed, waits for the supervisor to
// report the worker that caused it (it notices the exit within
// milliseconds; stopping the others takes up to the grace period).
constexpr auto kFailureReportWait = std::chrono::seconds(15);
// Other errors (a loop that wraps the collective's) are rank 0's own
// unless a worker is found to have ended this soon.
constexpr auto kOwnFailureWait = std::chrono::seconds(2);

// The workers this process started, for the rest of its life: started
// once, supervised by one thread, waited for when the process exits.
class Job {
 public:
  static Job& get() {
    static Job job;
    return job;
  }
  ~Job() {
    join();
    if (result_.exit_code != 0 && !stopping_) log::error("[launcher] the workers failed: ", result_.summary);
  }

  // The ranks stop together (Note [Stopping on a signal]): the workers'
  // exit codes say so and are no failure.
  void stopping() {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }

  bool started() {
    std::lock_guard<std::mutex> lock(mutex_);
    return started_;
  }

  // Starts `argv` as local ranks 1..N-1 and returns the job's place (rank
  // 0's), once they run; throws what stopped them from starting.
  runtime::Environment start(const std::vector<std::string>& argv, runtime::LaunchOptions options) {
    options.on_started = [this](const runtime::Environment& job, const std::vector<int>& pids) {
      std::lock_guard<std::mutex> lock(mutex_);
      env_ = job;
      pids_ = pids;
      started_ = true;
      cv_.notify_all();
    };
    supervisor_ = std::thread([this, argv, options] {
      runtime::LaunchResult result;
      std::exception_ptr failure;
      try {
        result = runtime::launch_workers(argv, options);
      } catch (...) {
        failure = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mutex_);
      result_ = std::move(result);
      failure_ = failure;
      ended_ = true;
      // Note [A job that failed] (runtime/store_server.cpp): rank 0 may be
      // waiting in the rendezvous for a worker that never came.
      if (result_.exit_code != 0 && !stopping_)
        runtime::abort_hosted_stores("the job failed: " + result_.summary);
      cv_.notify_all();
    });
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return started_ || ended_; });
    if (started_) return env_;
    lock.unlock();
    join();
    if (failure_) std::rethrow_exception(failure_);
    throw LaunchError("[launcher] the workers ended before they started: " + result_.summary);
  }

  // The workers' outcome once they ended with a failure within `wait`.
  std::optional<runtime::LaunchResult> failure(std::chrono::milliseconds wait) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait_for(lock, wait, [&] { return ended_; });
    if (!ended_ || result_.exit_code == 0) return std::nullopt;
    return result_;
  }

  void kill(int signal) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (ended_) return;
    for (int pid : pids_) ::kill(-pid, signal);  // each worker's process group (Note [Worker process groups])
  }

  // Waits until every worker ended and was reaped.
  void join() {
    if (supervisor_.joinable() && supervisor_.get_id() != std::this_thread::get_id()) supervisor_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool started_ = false;
  bool ended_ = false;
  bool stopping_ = false;
  runtime::Environment env_;
  std::vector<int> pids_;
  runtime::LaunchResult result_;
  std::exception_ptr failure_;
  std::thread supervisor_;
};

// Rank 0's own place, as the launcher gives it to the other ranks: its
// variables in this process's environment (so that every later strategy
// here joins the same job in place) and its share of the cores (Note
// [Threads per worker] in runtime/process.cpp).
void become_rank_zero(const runtime::Environment& job) {
  for (const auto& [name, value] : job.to_vars()) ::setenv(name.c_str(), value.c_str(), 1);
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    const int threads = runtime::threads_per_worker(runtime::usable_cores(), job.local_world_size);
    ::setenv("OMP_NUM_THREADS", std::to_string(threads).c_str(), 1);
    at::set_num_threads(threads);
  }
}

}  // namespace

SubprocessLauncher::SubprocessLauncher(const ResolvedPlacement& placement, std::string who)
    : strategy_(placement.strategy),
      seed_(placement.seed),
      processes_(placement.processes_per_node),
      num_nodes_(placement.num_nodes),
      who_(std::move(who)) {}

nlohmann::json SubprocessLauncher::launch(const std::function<nlohmann::json()>& fn) {
  const std::shared_ptr<Strategy> strategy = strategy_.lock();
  STRATA_CHECK(strategy != nullptr, Error, "[launcher] the strategy of this launcher is gone");
  Job& job = Job::get();
  if (!job.started()) {
    STRATA_CHECK(num_nodes_ == 1, ConfigError, "[", who_, "] num_nodes=", num_nodes_,
                 ": a multi-node job is started by a launcher on every host, e.g. `strata launch --nnodes ",
                 num_nodes_, " --node-rank R --master-addr HOST --master-port PORT -n ", processes_,
                 " -- PROGRAM`");
    runtime::LaunchOptions options;
    options.nproc_per_node = processes_;
    options.first_local_rank = 1;  // this process
    options.extra_env[kEnvSubprocessWorker] = "1";
    become_rank_zero(job.start(runtime::current_command_line(), options));
  }
  nlohmann::json result;
  try {
    result = run_in_place(*strategy, seed_, fn);
  } catch (const Interrupted&) {
    // Every rank agreed to stop after the same step; the workers end on
    // their own, and the process waits for them when it exits.
    job.stopping();
    throw;
  } catch (const std::exception& e) {
    // A collective that lost its peer: the worker's failure is the story.
    const bool peer = dynamic_cast<const CommError*>(&e) != nullptr;
    if (auto failed = job.failure(peer ? kFailureReportWait : kOwnFailureWait))
      throw LaunchError("[" + who_ + "] the workers failed: " + failed->summary, *failed);
    job.kill(SIGKILL);
    job.join();
    throw;
  }
  if (auto failed = job.failure(std::chrono::seconds(0)))
    throw LaunchError("[" + who_ + "] the workers failed: " + failed->summary, *failed);
  return result;
}

void SubprocessLauncher::kill(int signal) { Job::get().kill(signal); }

}  // namespace strata::strategies
