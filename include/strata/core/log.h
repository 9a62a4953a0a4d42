// The library's one logger. Every message strata prints goes through it:
// a level, a rank prefix once the process knows its rank, and by default
// only global rank 0 prints (so N workers do not repeat one line N times).
//
//   strata::log::info("[ddp] step ", step, " communication: ", summary);
//   strata::log::warning_all_ranks("[checkpoint] ", what);
//
// Messages go to stderr; stdout stays the program's own.
#pragma once

#include <string>

#include "strata/core/error.h"

namespace strata::log {

/// Severity, lowest first.
enum class Level { kDebug, kInfo, kWarning, kError };

/// The lowest level printed (default kInfo; STRATA_LOG_LEVEL=debug|info|
/// warning|error sets it at start-up).
void set_level(Level level);
Level level();

/// This process's global rank, for the prefix and the rank-0 filter
/// (strategies set it in setup_environment; -1: unknown, no prefix).
void set_rank(int rank);
int rank();

/// Whether every rank prints (default false: only rank 0, or a process
/// whose rank is unknown).
void set_all_ranks(bool all);

/// Prints `message` at `level`, when the level and the rank filter allow
/// it (`any_rank`: this message prints on every rank).
void write(Level level, const std::string& message, bool any_rank = false);

template <class... Args>
void debug(const Args&... args) {
  write(Level::kDebug, detail::cat(args...));
}
template <class... Args>
void info(const Args&... args) {
  write(Level::kInfo, detail::cat(args...));
}
template <class... Args>
void warning(const Args&... args) {
  write(Level::kWarning, detail::cat(args...));
}
/// A warning every rank prints (something that concerns this rank only).
template <class... Args>
void warning_all_ranks(const Args&... args) {
  write(Level::kWarning, detail::cat(args...), /*any_rank=*/true);
}
/// Errors print on every rank.
template <class... Args>
void error(const Args&... args) {
  write(Level::kError, detail::cat(args...), /*any_rank=*/true);
}

/// Parses "debug", "info", "warning" ("warn"), "error"; ConfigError otherwise.
Level parse_level(const std::string& name);

}  // namespace strata::log
