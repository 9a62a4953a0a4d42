// The exception of a run that stopped because it was asked to.
#pragma once

#include <string>

#include "strata/core/error.h"

namespace strata {

/// The run stopped because the process was asked to (SIGINT, SIGTERM or
/// SIGUSR1; Note [Stopping on a signal] in runtime/stop_signal.cpp) after
/// finishing its step and saving. main() exits with exit_code().
class Interrupted : public Error {
 public:
  Interrupted(const std::string& what, int signal) : Error(what), signal_(signal) {}
  int signal() const noexcept { return signal_; }
  /// 128 + the signal: what a shell shows for a process the signal ended.
  int exit_code() const noexcept { return 128 + signal_; }

 private:
  int signal_;
};

}  // namespace strata
