// What the built-in callbacks share: the monitored metric, read as rank 0
// holds it (ModelCheckpoint, EarlyStopping), and how they print times.
//
// Note [Rank 0 decides]
// A metric logged without sync_dist holds each rank's own value, so ranks
// could rank checkpoints or judge improvement differently, and then call
// different collectives (one saves, another does not) and hang. Both
// callbacks take rank 0's value (broadcast) and vote with
// reduce_boolean_decision, so every rank saves, removes and stops together.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "strata/core/error.h"
#include "strata/loggers/logger.h"
#include "strata/strategies/strategy.h"
#include "strata/trainer/trainer.h"

namespace strata::trainer::detail {

/// The names of `metrics`, for messages.
inline std::string available(const Metrics& metrics) {
  std::string out;
  for (const auto& [k, v] : metrics) out += (out.empty() ? "" : ", ") + k;
  return out.empty() ? "(none logged yet)" : out;
}

/// Rank 0's value of `monitor` on every rank; ConfigError when rank 0 has
/// none (every rank runs the same loops, so every rank throws).
inline double monitored(Trainer& trainer, const std::string& monitor, const std::string& who) {
  const Metrics& metrics = trainer.callback_metrics();
  auto it = metrics.find(monitor);
  const bool found = trainer.strategy().broadcast(it != metrics.end(), 0);
  STRATA_CHECK(found, ConfigError, "[trainer] ", who, " monitors '", monitor,
               "', which was never logged; the metrics logged are: ", available(metrics),
               ". Log it with log(\"", monitor, "\", value) in a step, or monitor one of those");
  return trainer.strategy().broadcast(it != metrics.end() ? it->second : 0.0, 0);
}

/// ConfigError unless `mode` is "min" or "max".
inline void check_mode(const std::string& mode, const char* who) {
  STRATA_CHECK(mode == "min" || mode == "max", ConfigError, "[trainer] ", who, " mode must be 'min' or 'max', got '",
               mode, "'");
}

/// "m:ss" or "h:mm:ss"; "?" for a negative or non-finite time.
inline std::string clock_text(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(seconds);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%lld:%02lld", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  }
  return buf;
}

}  // namespace strata::trainer::detail
