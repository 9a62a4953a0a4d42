// Helpers shared by the Trainer's sources.
#pragma once

#include <nlohmann/json.hpp>

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "strata/core/log.h"
#include "strata/strategies/placement.h"
#include "strata/trainer/trainer.h"

namespace strata {

/// The job's ranks when they are threads of this process (Note [The
/// Trainer's ranks as threads] in trainer.h): rank 0 is the Trainer that
/// holds this, ranks 1..N-1 are these.
struct Trainer::ThreadRanks {
  std::unique_ptr<strategies::ThreadRankJob> job;
  std::vector<std::unique_ptr<Trainer>> trainers;
  std::shared_ptr<TrainModule> module;                 // rank 0's, the caller's
  std::vector<std::shared_ptr<TrainModule>> modules;  // copies of it, made at its first call
};

}  // namespace strata

namespace strata::trainer::detail {

/// A warning on global rank 0, through the library's logger
/// ("warning: [trainer] ...").
inline void warn(const Trainer& trainer, const std::string& message) {
  // Filtered here by the Trainer's own rank, so the logger prints it as is.
  if (trainer.is_global_zero()) log::warning_all_ranks("[trainer] ", message);
}

}  // namespace strata::trainer::detail
