// strata's exception hierarchy and check macros.
//
// Every error strata raises derives from strata::Error. Messages start with
// a tag naming the component (`[gloo]`, `[launcher]`, `[checkpoint]`), name
// the offending value and say what to do. Only main() turns an exception
// into an exit code.
#pragma once

#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>

namespace strata {

/// Base class of every exception strata throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Bad configuration or argument: a wrong option value, a malformed or
/// missing environment variable, an unknown name.
class ConfigError : public Error {
 public:
  using Error::Error;
};

/// A collective or rendezvous failed: timeout, peer gone, mismatched calls.
class CommError : public Error {
 public:
  using Error::Error;
};

/// A collective or rendezvous did not complete within its timeout. The
/// message names the operation, this rank and the peers still missing.
class TimeoutError : public CommError {
 public:
  using CommError::CommError;
};

/// Reading or writing a checkpoint failed (missing, truncated, mismatched).
class CheckpointError : public Error {
 public:
  using Error::Error;
};

/// How a launch of worker processes ended, as data. runtime::LaunchResult
/// is one of these plus its text; it lives here, in core, so LaunchError
/// can carry it (Note [Launch outcomes]).
struct LaunchOutcome {
  /// The launcher's exit status: 0 when every worker succeeded, else the
  /// failing rank's exit code, 128+N when signal N killed it, 124 when the
  /// job was stopped by max_time or the hang check, 128+N when the
  /// launcher received signal N (130 for SIGINT, 143 for SIGTERM).
  int exit_code = 0;
  int failed_rank = -1;      ///< global rank of the first worker that failed, -1: none
  int failed_exit_code = 0;  ///< its exit code (when it exited)
  int failed_signal = 0;     ///< the signal that killed it (when it was killed)
  /// SIGINT or SIGTERM when the launcher received it and stopped the
  /// workers, 0 when it was not interrupted.
  int interrupted_by = 0;
  /// The rank named stuck by the hang check (-1: none, or the workers here
  /// all wait on a rank elsewhere).
  int hung_rank = -1;

  bool interrupted() const { return interrupted_by != 0; }
};

// Note [Launch outcomes]
// A caller that launched workers decides what to do from how they ended
// (`strata train` exits as `strata launch` does), so the outcome travels as
// fields, never as text to search. The struct is in core because
// LaunchError is, and core includes no other layer; runtime derives its
// LaunchResult from it, so a result converts to the outcome as it is.

/// Starting or supervising worker processes failed. When workers were
/// started and then failed (or the launcher was interrupted), outcome()
/// says how; when they could not be started at all it is empty.
class LaunchError : public Error {
 public:
  using Error::Error;
  /// The workers ran and ended as `outcome` says; `what` describes it.
  LaunchError(const std::string& what, const LaunchOutcome& outcome) : Error(what), outcome_(outcome) {}

  /// How the launch ended, or nullopt when no worker ran to an end.
  const std::optional<LaunchOutcome>& outcome() const noexcept { return outcome_; }

 private:
  std::optional<LaunchOutcome> outcome_;
};

namespace detail {

/// Concatenates the streamable arguments into one string.
template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

/// Throws an internal Error that carries file:line (for failures that are
/// bugs or unexpected system states rather than user mistakes).
[[noreturn]] void throw_internal(const char* file, int line, const std::string& what);

/// Describes errno as "strerror(errno) (errno N)".
std::string errno_string(int err);

}  // namespace detail
}  // namespace strata

/// Throws `ErrorType` with the concatenated message when `cond` is false.
/// Usage: STRATA_CHECK(n > 0, ConfigError, "[fabric] devices must be > 0, got ", n);
#define STRATA_CHECK(cond, ErrorType, ...)                                  \
  do {                                                                      \
    if (!(cond)) throw ::strata::ErrorType(::strata::detail::cat(__VA_ARGS__)); \
  } while (0)

/// Checks an internal invariant; the error carries file:line.
#define STRATA_ASSERT(cond, ...)                                            \
  do {                                                                      \
    if (!(cond))                                                            \
      ::strata::detail::throw_internal(__FILE__, __LINE__,                  \
                                       ::strata::detail::cat("internal check failed: " #cond ". ", ##__VA_ARGS__)); \
  } while (0)

/// Checks a POSIX call that returns -1 and sets errno; throws `ErrorType`
/// with the call, the errno text and file:line.
#define STRATA_CHECK_SYSCALL(expr, ErrorType, ...)                          \
  do {                                                                      \
    if ((expr) == -1) {                                                     \
      int strata_err_ = errno;                                              \
      throw ::strata::ErrorType(::strata::detail::cat(                      \
          __VA_ARGS__, ": " #expr " failed: ", ::strata::detail::errno_string(strata_err_), \
          " (", __FILE__, ":", __LINE__, ")"));                             \
    }                                                                       \
  } while (0)
