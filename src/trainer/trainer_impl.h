// Helpers shared by the Trainer's sources.
#pragma once

#include <string>

#include "strata/core/log.h"
#include "strata/trainer/trainer.h"

namespace strata::trainer::detail {

/// A warning on global rank 0, through the library's logger
/// ("warning: [trainer] ...").
inline void warn(const Trainer& trainer, const std::string& message) {
  // Filtered here by the Trainer's own rank, so the logger prints it as is.
  if (trainer.is_global_zero()) log::warning_all_ranks("[trainer] ", message);
}

}  // namespace strata::trainer::detail
