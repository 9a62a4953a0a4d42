// The thread-ranks launcher: one process drives its host's N devices as N
// ranks, one thread each (Note [Ranks as threads] in strategies/xla.h; the
// way of JAX and of PJRT's clients). ThreadRankJob keeps the ranks, with
// their environments and collectives, between calls; the launcher makes
// one for each launch() (Fabric), the Trainer one for all its calls.
//
// Multi-host: with one process per host started by an outside launcher (in
// place) and each process running its devices as thread ranks, the job is
// the composition of the two launchers; strata refuses num_nodes > 1 for
// such accelerators until the multi-process client's collectives exist.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>

#include "strata/runtime/env.h"
#include "strata/strategies/launchers/launcher.h"

namespace strata::comm {
class Backend;
}

namespace strata::strategies {

class Strategy;

/// The ranks of a job whose accelerator drives its devices from one process
/// (Note [Ranks as threads] in strategies/xla.h), as threads of this one:
/// rank 0 on the placement's strategy, rank r on a replica of it. Each
/// run() starts the ranks' threads, one at a time (Note [Ranks start one
/// at a time] in thread_ranks.cpp), calls `call(r)` on rank r's thread and
/// returns rank 0's result; a rank that fails stops the others, its error
/// is run()'s, and the job is over. The ranks keep their environments
/// (collectives, set-up modules) from one run to the next until teardown()
/// or the destructor: launch() makes one for a call (Fabric), the Trainer
/// one for all its calls (WorkerExit::kContinue).
class ThreadRankJob {
 public:
  /// Logs which devices the ranks drive; seeds when the placement has a
  /// seed. Starts no thread.
  ThreadRankJob(const ResolvedPlacement& placement, std::string who);
  ~ThreadRankJob();
  ThreadRankJob(const ThreadRankJob&) = delete;
  ThreadRankJob& operator=(const ThreadRankJob&) = delete;

  int size() const;
  /// Rank r's strategy (rank 0: the placement's own).
  const std::shared_ptr<Strategy>& strategy(int rank) const;
  nlohmann::json run(const std::function<nlohmann::json(int rank)>& call);
  /// Tears every rank's strategy down, on its thread; then runs nothing.
  void teardown();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// The strategy a call on this thread goes through: the rank's own when
/// launch() started this thread as one of the ranks of `primary`'s job
/// (Note [Ranks as threads] in strategies/xla.h), else `primary`.
Strategy& strategy_of_thread(Strategy& primary);

namespace detail {
/// What launch() gives a thread it starts as a rank: its environment
/// (rank r of the process's ranks) and its collectives.
struct ThreadRank {
  runtime::Environment env;
  std::shared_ptr<comm::Backend> backend;
};
/// The calling thread's, or nullptr on a thread launch() did not start.
const ThreadRank* current_thread_rank();
}  // namespace detail

/// Runs launch()'s function on every rank of this process, one thread
/// each, in a ThreadRankJob made for the call and torn down after it.
class ThreadRanksLauncher : public Launcher {
 public:
  ThreadRanksLauncher(const ResolvedPlacement& placement, std::string who);
  ~ThreadRanksLauncher() override;
  std::string name() const override { return "thread_ranks"; }
  /// Returns rank 0's result; a rank's failure stops the others and is
  /// launch()'s (Note [Ranks start one at a time] in thread_ranks.cpp).
  nlohmann::json launch(const std::function<nlohmann::json()>& fn) override;
  bool is_interactive_compatible() const override { return true; }

 private:
  std::unique_ptr<ResolvedPlacement> placement_;  // its strategy held weakly, as weak_strategy_
  std::weak_ptr<Strategy> weak_strategy_;
  std::string who_;
};

}  // namespace strata::strategies
