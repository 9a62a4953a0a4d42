// Stopping a training run on a signal without losing it (Note [Stopping on
// a signal] in stop_signal.cpp): SIGINT, SIGTERM and SIGUSR1 (SLURM's
// warning before the time limit or a pre-emption) become a request that the
// Trainer's ranks agree on after their current step, save, and end with.
#pragma once

#include <string>

namespace strata::runtime {

/// While one of these is alive, SIGINT, SIGTERM and SIGUSR1 are recorded
/// instead of ending the process, and the Trainer stops after the step it
/// is in. A second SIGINT or SIGTERM that comes a second or more after the
/// first ends the process at once, as the signal's default action does.
/// Scopes nest (only the outermost installs and restores the handlers);
/// they are process-wide, so ranks that run as threads share them.
class StopSignalScope {
 public:
  StopSignalScope();
  ~StopSignalScope();
  StopSignalScope(const StopSignalScope&) = delete;
  StopSignalScope& operator=(const StopSignalScope&) = delete;
};

/// The first stop signal received while a scope was alive (SIGINT, SIGTERM
/// or SIGUSR1), or 0 when none was; a SIGINT or SIGTERM after a SIGUSR1
/// replaces it (the stop it asks for is the same, its exit code differs).
int pending_stop_signal();

/// Forgets the pending request (a new fit starts from none).
void clear_stop_signal();

/// The exit status of a process that stopped on `signal` as asked: 128 +
/// the signal, as a shell reports a process that the signal ended (130 for
/// SIGINT, 143 for SIGTERM, 138 for SIGUSR1).
int stop_exit_code(int signal);

/// "SIGINT", "SIGTERM", "SIGUSR1", or "signal N".
std::string stop_signal_name(int signal);

}  // namespace strata::runtime
