// Launchers: how the ranks of a job come to run a function, as objects the
// strategy owns (Lightning's strategies/launchers/).
//
//   InPlaceLauncher     an outside launcher started this process (strata
//                       launch, torchrun, srun, mpirun), or the job has
//                       one rank: launch(fn) runs fn here.
//   SubprocessLauncher  nothing started this process and its host runs
//                       several worker processes: this process becomes
//                       rank 0 and starts the others (launchers/subprocess.h).
//   ThreadRanksLauncher this process drives its host's devices as ranks,
//                       one thread each (launchers/thread_ranks.h).
//
// resolve_placement picks one (make_launcher) and hands it to the strategy
// (Strategy::launcher()); Fabric::launch and the Trainer go through it.
// Every rank returns from launch(); nothing in the library ends a process
// (Note [The launching process is rank 0] in subprocess.h).
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>

namespace strata::strategies {

struct ResolvedPlacement;

/// Starts a job's ranks, or joins the ones an outside launcher started,
/// and runs a function on this process's rank(s).
class Launcher {
 public:
  virtual ~Launcher() = default;
  /// "in_place", "subprocess" or "thread_ranks".
  virtual std::string name() const = 0;
  /// Runs `fn` on this process's rank (ranks, for thread ranks): sets the
  /// strategy's environment up first (once; seeding LibTorch then when the
  /// placement has a seed) and returns fn's result, rank 0's for thread
  /// ranks. The subprocess launcher starts the other worker processes at
  /// its first call. Throws LaunchError, with the outcome, when a worker
  /// process this launcher started failed; fn's own exception otherwise.
  virtual nlohmann::json launch(const std::function<nlohmann::json()>& fn) = 0;
  /// Whether launch() can run from an interactive session (a notebook, a
  /// REPL): true unless it re-executes the program (Lightning's name).
  virtual bool is_interactive_compatible() const = 0;
  /// Sends `signal` to the worker processes this launcher started (none
  /// for the others), as Lightning's launchers do when a rank fails.
  virtual void kill(int signal) { (void)signal; }
};

/// The launcher for `placement` (resolved in this process): thread ranks
/// when its accelerator drives several devices from one process and this
/// thread is not one of them yet, the subprocess launcher when nothing
/// started this process and its job has several worker processes, else in
/// place. `who` ("fabric", "trainer") starts its messages.
std::shared_ptr<Launcher> make_launcher(const ResolvedPlacement& placement, const std::string& who);

}  // namespace strata::strategies
