// strata's exception hierarchy and check macros.
//
// Every error strata raises derives from strata::Error. Messages start with
// a tag naming the component (`[gloo]`, `[launcher]`, `[checkpoint]`), name
// the offending value and say what to do. Only main() turns an exception
// into an exit code.
#pragma once

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

/// Starting or supervising worker processes failed.
class LaunchError : public Error {
 public:
  using Error::Error;
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
