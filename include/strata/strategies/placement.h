// Placement: where a job runs and how it starts, in one place for Fabric,
// the Trainer and `strata train`.
//
//   FabricOptions and TrainerOptions embed a Placement (its fields and
//   with_x setters are theirs). resolve_placement turns it into the
//   accelerator, the world, the processes per host, the devices each
//   process drives and the strategy, once; launch() then runs a call on
//   every worker, starting the workers when no launcher did.
//
// Note [One launch protocol]
// A process no launcher started, whose job has more than one worker, is
// the launching process. Its first launch() re-executes the program
// through strata's launcher as the job's workers, with
// STRATA_LAUNCH_RESULTS naming a file in a private folder, and waits for
// them. In a worker every launch() runs its call in place, and global rank
// 0 appends the call's result (JSON) to that file, so the file holds one
// result per call, in the program's order. Back in the launching process,
// Fabric's workers end after their first call (WorkerExit::kAfterCall):
// code after Fabric::launch runs in the launching process only, which
// returns rank 0's result, and each Fabric::launch there starts the workers
// afresh. The Trainer's workers go on (kContinue), so the program's later
// Trainer calls run in them too: the launching process starts them once,
// its first launch() returns the first result and each later one the next,
// without running anything; it follows the workers call by call. A
// worker's failure stops the others and throws LaunchError, with the
// launch outcome as data, from the launch() that started them.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>

#include "strata/runtime/env.h"
#include "strata/strategies/accelerator.h"

namespace strata {
namespace strategies {
class Strategy;
/// A strategy as a user names it: a name ("auto", "ddp", "fsdp",
/// "single_device") or an object.
using StrategyChoice = std::variant<std::string, std::shared_ptr<Strategy>>;
}  // namespace strategies

/// Where a job runs and how it starts: the part FabricOptions and
/// TrainerOptions share. Validated by resolve_placement (the Fabric and
/// Trainer constructors), where ConfigError names the bad field.
struct Placement {
  std::string accelerator = "cpu";  ///< "cpu", "cuda", "auto"
  /// Devices on each host (-1: every visible device; one worker on the CPU).
  int devices = 1;
  int num_nodes = 1;  ///< hosts
  /// The strategy: a name ("auto", "ddp", "fsdp", "single_device"), built
  /// with default options, or a strategy object.
  strategies::StrategyChoice strategy = std::string("auto");
  /// "32-true", "bf16-mixed"; unset: "32-true", or a strategy object's own.
  /// When set it is applied to a strategy object too, as in Lightning.
  std::optional<std::string> precision;
  std::optional<uint64_t> seed;  ///< seeds LibTorch in every worker at launch
  /// Timeout of each collective (PyTorch's default: 30 minutes).
  std::chrono::milliseconds collective_timeout = std::chrono::minutes(30);
};

/// The Placement's fluent setters, returning the options type that
/// embeds it (FabricOptions, TrainerOptions).
template <class Options>
struct WithPlacement : Placement {
  Options& with_accelerator(std::string a) { accelerator = std::move(a); return self(); }
  Options& with_devices(int d) { devices = d; return self(); }
  Options& with_num_nodes(int n) { num_nodes = n; return self(); }
  Options& with_strategy(std::string s) { strategy = std::move(s); return self(); }
  Options& with_strategy(std::shared_ptr<strategies::Strategy> s) { strategy = std::move(s); return self(); }
  Options& with_precision(std::string p) { precision = std::move(p); return self(); }
  Options& with_seed(uint64_t s) { seed = s; return self(); }
  Options& with_collective_timeout(std::chrono::milliseconds t) { collective_timeout = t; return self(); }
  /// The placement alone.
  const Placement& placement() const { return *this; }

 private:
  Options& self() { return static_cast<Options&>(*this); }
};

namespace strategies {

/// A Placement resolved on this machine, in this process.
struct ResolvedPlacement {
  std::shared_ptr<Accelerator> accelerator;
  int devices = 1;              ///< devices on each host (-1 resolved)
  int num_nodes = 1;
  int devices_per_process = 1;  ///< devices one worker process drives (Accelerator::devices_per_process)
  int processes_per_node = 1;   ///< worker processes on each host
  int world_size = 1;           ///< ranks in the job (processes x devices each drives)
  /// A launcher started this process: it is one of the workers and runs
  /// every call in place.
  bool launched = false;
  std::shared_ptr<Strategy> strategy;  ///< built for world_size, with the precision and timeout
  std::optional<uint64_t> seed;
  std::chrono::milliseconds collective_timeout = std::chrono::minutes(30);

  /// True in the launching process of a job of several worker processes
  /// (Note [One launch protocol]): its first launch() starts them.
  bool needs_spawn() const { return !launched && processes_per_node * num_nodes > 1; }
  /// True when this process runs several ranks as threads (Note [Ranks as
  /// threads] in strategies/xla.h).
  bool thread_ranks() const { return devices_per_process > 1; }
};

/// Checks `placement` (ConfigError: "[who] field ..."), resolves -1
/// devices (more GPUs than this host has is refused here, before any worker
/// starts: Note [Device placement]), works out the world from the launcher's
/// variables when one started this process (else devices / devices per
/// process x num_nodes), and builds the strategy. Starts nothing. `who`
/// ("fabric", "trainer") starts the messages.
ResolvedPlacement resolve_placement(const Placement& placement, const std::string& who);

/// What a worker does after its call (Note [One launch protocol]).
enum class WorkerExit {
  kAfterCall,  ///< a worker started by launch() ends when the call returns (Fabric)
  kContinue,   ///< it goes on with the program (the Trainer)
};

/// Runs `call` on every worker (Note [One launch protocol]) and returns
/// its result on global rank 0 of the workers. In a worker or a
/// one-process job: sets the strategy's environment up (once per strategy,
/// seeding LibTorch then when a seed is given) and runs `call` here. In the
/// launching process: starts the workers at the first launch() and returns
/// the result of the matching call of global rank 0 (null when the
/// workers recorded none). Throws LaunchError (with the outcome) when a
/// worker fails.
nlohmann::json launch(const ResolvedPlacement& placement, const std::string& who, WorkerExit exit,
                      const std::function<nlohmann::json()>& call);

/// The ranks of a job whose accelerator drives its devices from one process
/// (Note [Ranks as threads] in strategies/xla.h), as threads of this one:
/// rank 0 on the placement's strategy, rank r on a replica of it. Each
/// run() starts the ranks' threads, one at a time (Note [Ranks start one
/// at a time] in placement.cpp), calls `call(r)` on rank r's thread and
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

/// Seeds LibTorch's default generator and the C library's rand() in this
/// process (Lightning's seed_everything, without Python's and NumPy's).
void seed_everything(uint64_t seed);

}  // namespace strategies
}  // namespace strata
