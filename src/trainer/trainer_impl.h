// Helpers shared by the Trainer's sources.
#pragma once

#include <iostream>
#include <string>

#include "strata/trainer/trainer.h"

namespace strata::trainer::detail {

/// A warning on global rank 0 (stderr, "[trainer] warning: ...").
inline void warn(const Trainer& trainer, const std::string& message) {
  if (trainer.is_global_zero()) std::cerr << "[trainer] warning: " << message << std::endl;
}

}  // namespace strata::trainer::detail
