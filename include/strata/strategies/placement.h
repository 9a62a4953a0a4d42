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
// resolve_placement gives the strategy its launcher
// (strategies/launchers/launcher.h), and every launch() goes through it:
// in place when a launcher started this process or the job has one rank;
// the subprocess launcher when nothing started it and its host runs
// several worker processes (this process becomes rank 0 and re-executes
// the program as the others: Note [The launching process is rank 0] in
// launchers/subprocess.h); thread ranks when the accelerator drives its
// host's devices from one process. Every rank returns from every launch()
// with its own result and goes on with the program; a worker's failure
// stops the others and reaches rank 0 as LaunchError with the outcome.
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
#include "strata/strategies/launchers/launcher.h"

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

  /// True in a process no launcher started whose job has several worker
  /// processes: its first launch() makes it rank 0 and starts the others
  /// (Note [The launching process is rank 0] in launchers/subprocess.h).
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

/// How long a call's ranks live. Worker processes always go on with the
/// program after a call; thread ranks differ.
enum class WorkerExit {
  kAfterCall,  ///< thread ranks are made for the call and torn down after it (Fabric)
  kContinue,   ///< the caller keeps its thread ranks in a ThreadRankJob (the Trainer)
};

/// Runs `call` through the strategy's launcher (Note [One launch
/// protocol]) and returns this rank's result (rank 0's for thread ranks).
/// In place on a rank's thread and for a strategy without a launcher (a
/// thread rank's replica). Sets the strategy's environment up first (once
/// per strategy, seeding LibTorch then when a seed is given). Throws
/// LaunchError (with the outcome) when a worker process fails, ConfigError
/// for thread ranks with kContinue.
nlohmann::json launch(const ResolvedPlacement& placement, const std::string& who, WorkerExit exit,
                      const std::function<nlohmann::json()>& call);

/// Seeds LibTorch's default generator and the C library's rand() in this
/// process (Lightning's seed_everything, without Python's and NumPy's).
void seed_everything(uint64_t seed);

}  // namespace strategies
}  // namespace strata

// ThreadRankJob, strategy_of_thread (the Trainer keeps its thread ranks).
#include "strata/strategies/launchers/thread_ranks.h"
