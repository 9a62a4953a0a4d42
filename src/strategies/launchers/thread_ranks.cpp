// The thread-ranks launcher and ThreadRankJob
// (strategies/launchers/thread_ranks.h).
#include "strata/strategies/launchers/thread_ranks.h"

#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "strata/core/error.h"
#include "strata/core/log.h"
#include "strata/strategies/placement.h"
#include "strata/strategies/strategy.h"

namespace strata::strategies {
namespace {

thread_local const detail::ThreadRank* tls_rank = nullptr;
thread_local Strategy* tls_primary = nullptr;   // the job's strategy (rank 0's)
thread_local Strategy* tls_strategy = nullptr;  // this thread's rank's

}  // namespace

// Note [Ranks as threads] (strategies/xla.h): one thread per device of
// this process, each rank with its own strategy (rank 0 the job's own, the
// others its replicas), environment and collectives.
struct ThreadRankJob::State {
  ResolvedPlacement placement;
  std::string who;
  std::vector<std::shared_ptr<Strategy>> strategies;
  std::vector<detail::ThreadRank> ranks;  // each thread's, kept between runs
  ThreadRanks threads;
  std::string failure;  // the failed run's report: the job is over
  bool torn_down = false;
};

ThreadRankJob::ThreadRankJob(const ResolvedPlacement& placement, std::string who)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.placement = placement;
  s.who = std::move(who);
  const int n = placement.devices_per_process;
  s.strategies.push_back(placement.strategy);
  for (int r = 1; r < n; ++r) {
    s.strategies.push_back(placement.strategy->replica());
    s.strategies.back()->set_collective_timeout(placement.collective_timeout);
  }
  s.threads = placement.accelerator->thread_ranks(n, placement.collective_timeout);
  s.threads.pause(true);  // until a run starts the ranks' threads
  s.ranks.resize(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    detail::ThreadRank& rank = s.ranks[static_cast<size_t>(r)];
    rank.env.rank = rank.env.local_rank = r;
    rank.env.world_size = rank.env.local_world_size = n;
    rank.env.source = "threads";
    rank.backend = s.threads.backends[static_cast<size_t>(r)];
  }
  std::string devices;
  for (int r = 0; r < n; ++r) devices += (r ? ", " : "") + placement.accelerator->device(r).str();
  log::info("[", s.who, "] the '", placement.accelerator->name(),
            "' accelerator drives its devices from one process: ", n, " ranks as threads of this one, on ", devices);
  if (placement.seed) seed_everything(*placement.seed);
}

ThreadRankJob::~ThreadRankJob() {
  try {
    teardown();
  } catch (const std::exception& e) {
    log::error("[", state_->who, "] teardown failed: ", e.what());
  }
}

int ThreadRankJob::size() const { return static_cast<int>(state_->strategies.size()); }

const std::shared_ptr<Strategy>& ThreadRankJob::strategy(int rank) const {
  return state_->strategies.at(static_cast<size_t>(rank));
}

nlohmann::json ThreadRankJob::run(const std::function<nlohmann::json(int rank)>& call) {
  State& s = *state_;
  STRATA_CHECK(s.failure.empty(), Error, "[", s.who, "] the job's ranks stopped after a failure (", s.failure,
               "); start a new one");
  STRATA_CHECK(!s.torn_down, Error, "[", s.who, "] the job's ranks were torn down; start a new one");
  const int n = size();
  // Note [Ranks start one at a time]
  // The ranks share the process's CPU generator, which a launched function
  // uses first of all (seed_everything, then the model's initial weights).
  // So rank r+1 starts only once rank r waits for its peers (its first
  // collective or step end) or returns: each rank's start runs alone, as
  // in a process of its own, and every run draws the same numbers.
  std::mutex turn_mutex;
  std::condition_variable turn_cv;
  int turn = 0;  // the rank that may start
  const auto pass = [&](int r) {
    {
      std::lock_guard<std::mutex> lock(turn_mutex);
      if (turn != r) return;
      turn = r + 1;
    }
    turn_cv.notify_all();
  };
  s.threads.set_on_wait(pass);
  s.threads.pause(false);
  std::mutex mutex;
  std::exception_ptr first_failure;
  nlohmann::json result;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      tls_rank = &s.ranks[static_cast<size_t>(r)];
      tls_primary = s.placement.strategy.get();
      tls_strategy = s.strategies[static_cast<size_t>(r)].get();
      Strategy& strategy = *tls_strategy;
      {
        std::unique_lock<std::mutex> lock(turn_mutex);
        turn_cv.wait(lock, [&] { return turn >= r; });
      }
      try {
        // A thread's device is its own (the xla device's replica): set again
        // on each run's new thread.
        if (strategy.launched()) set_current_device(s.placement.accelerator->device(r));
        else strategy.setup_environment();
        nlohmann::json out = call(r);
        pass(r);
        strategy.mark_step();  // the last step's collectives run with their peers
        s.threads.finish(r);   // a rank that still waits for this one fails at once
        if (r == 0) result = std::move(out);
      } catch (const std::exception& e) {
        bool first = false;
        {
          std::lock_guard<std::mutex> lock(mutex);
          first = !first_failure;
          if (first) first_failure = std::current_exception();
        }
        const std::string report = "[" + s.who + "] rank " + std::to_string(r) + " of " + std::to_string(n) +
                                   " failed in step " + std::to_string(s.threads.steps()) + " (counting from 0): " +
                                   e.what();
        // The first failure is the job's; the others are ranks it stopped.
        if (first) {
          log::error(report);
          std::lock_guard<std::mutex> lock(mutex);
          s.failure = report;
        }
        s.threads.abort(report);
        pass(r);
        try {
          strategy.teardown();
        } catch (const std::exception&) {
          // the rank's own error is the one reported
        }
      }
      tls_rank = nullptr;
      tls_primary = tls_strategy = nullptr;
    });
  }
  for (std::thread& t : threads) t.join();
  s.threads.set_on_wait(nullptr);  // `pass` ends with this call
  s.threads.pause(true);           // the caller may use rank 0's device until the next run
  if (first_failure) std::rethrow_exception(first_failure);
  return result;
}

void ThreadRankJob::teardown() {
  State& s = *state_;
  if (s.torn_down) return;
  s.torn_down = true;
  if (!s.failure.empty()) return;  // a failed run tore its ranks down
  std::exception_ptr failure;
  std::mutex mutex;
  std::vector<std::thread> threads;
  s.threads.pause(false);
  for (int r = 0; r < size(); ++r) {
    threads.emplace_back([&, r] {
      tls_rank = &s.ranks[static_cast<size_t>(r)];
      tls_primary = s.placement.strategy.get();
      tls_strategy = s.strategies[static_cast<size_t>(r)].get();
      try {
        set_current_device(s.placement.accelerator->device(r));
        if (tls_strategy->launched()) tls_strategy->teardown();
      } catch (const std::exception&) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!failure) failure = std::current_exception();
        s.threads.abort("a rank's teardown failed");
      }
      tls_rank = nullptr;
      tls_primary = tls_strategy = nullptr;
    });
  }
  for (std::thread& t : threads) t.join();
  if (failure) std::rethrow_exception(failure);
}

Strategy& strategy_of_thread(Strategy& primary) {
  return tls_primary == &primary && tls_strategy != nullptr ? *tls_strategy : primary;
}

const detail::ThreadRank* detail::current_thread_rank() { return tls_rank; }

ThreadRanksLauncher::ThreadRanksLauncher(const ResolvedPlacement& placement, std::string who)
    : placement_(std::make_unique<ResolvedPlacement>(placement)), weak_strategy_(placement.strategy),
      who_(std::move(who)) {
  placement_->strategy = nullptr;  // the strategy owns this launcher
}

ThreadRanksLauncher::~ThreadRanksLauncher() = default;

nlohmann::json ThreadRanksLauncher::launch(const std::function<nlohmann::json()>& fn) {
  ResolvedPlacement placement = *placement_;
  placement.strategy = weak_strategy_.lock();
  STRATA_CHECK(placement.strategy != nullptr, Error, "[launcher] the strategy of this launcher is gone");
  // Every rank ends its last step and tears its strategy down, so the next
  // launch starts afresh as a worker process's would.
  ThreadRankJob job(placement, who_);
  nlohmann::json result = job.run([&](int) { return fn(); });
  job.teardown();
  return result;
}

}  // namespace strata::strategies
