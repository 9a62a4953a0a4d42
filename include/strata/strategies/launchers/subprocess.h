// The subprocess launcher: a process that nothing started, whose host runs
// several worker processes, becomes rank 0 and starts the others.
//
// Note [The launching process is rank 0]
// As Lightning's subprocess script launcher does, the first launch() in a
// process no launcher started (and whose job has several worker
// processes) re-executes the program, with the same arguments, as local
// ranks 1..N-1 through strata's launcher (runtime/launcher.h), with the
// variables a launcher sets (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
// STRATA_JOB_TOKEN, ...). It then sets the same variables for rank 0 in its
// own environment and runs the function here as rank 0. The copies find
// those variables, so every strategy they build launches in place: they
// run the program from the start as ordinary ranks, and launch() returns
// in every rank, which goes on with the program to the end of its main().
// What runs where:
//   - code before the first launch() runs once in every rank (in rank 0
//     before the others exist);
//   - launch(fn) runs fn once in every rank and returns that rank's result;
//   - code after it runs in every rank; a later Fabric or Trainer in any
//     rank joins the same job in place (rank 0's environment now names it).
// Nothing in the library ends a process: every rank leaves through its
// main(), and the destructors of main's objects run in each. Rank 0's
// process waits for the others when it exits (a static's destructor, after
// main returns), so no worker outlives it.
//
// A background thread of rank 0 supervises the others (relays their
// output with "[rank R] ", forwards SIGINT/SIGTERM/SIGUSR1, stops them all
// when one fails). A worker's failure reaches rank 0 as LaunchError, with
// the outcome (rank, exit code or signal, last error line), from the
// launch() that runs while it fails: rank 0 waiting for the dead worker in
// a collective fails at once (the collectives name a peer that is gone),
// and launch() reports the worker's failure instead. When rank 0's own fn
// throws, the workers are killed (SIGKILL, as Lightning's launcher does)
// and its exception goes on. A worker that fails after its launch()
// returned is logged by rank 0 when the job ends.
#pragma once

#include <cstdint>
#include <optional>

#include "strata/strategies/launchers/launcher.h"

namespace strata::strategies {

class Strategy;

/// Set to "1" in the ranks the subprocess launcher starts: an error that
/// leaves their launch() is logged there as an "error: " line, which rank
/// 0's report quotes, whatever their main() then does with it.
inline constexpr const char* kEnvSubprocessWorker = "STRATA_SUBPROCESS_WORKER";

/// Note [The launching process is rank 0]. One host only: a job of several
/// hosts is started by a launcher on each (ConfigError says how).
class SubprocessLauncher : public Launcher {
 public:
  SubprocessLauncher(const ResolvedPlacement& placement, std::string who);
  std::string name() const override { return "subprocess"; }
  /// Starts the other ranks at the first call in this process, then runs
  /// `fn` here as rank 0.
  nlohmann::json launch(const std::function<nlohmann::json()>& fn) override;
  bool is_interactive_compatible() const override { return false; }
  /// Sends `signal` to every worker process that is still running.
  void kill(int signal) override;

 private:
  std::weak_ptr<Strategy> strategy_;
  std::optional<uint64_t> seed_;
  int processes_ = 1;
  int num_nodes_ = 1;
  std::string who_;
};

}  // namespace strata::strategies
