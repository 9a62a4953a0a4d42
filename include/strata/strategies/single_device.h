// The strategy for one device: no communication at all. strata also lets
// every other strategy run on one device (SPEC.md section 1).
#pragma once

#include "strata/strategies/strategy.h"

namespace strata::strategies {

/// Trains on root_device() of a single process.
class SingleDeviceStrategy : public Strategy {
 public:
  explicit SingleDeviceStrategy(std::shared_ptr<Accelerator> accelerator = cpu_accelerator(),
                                std::optional<Precision> precision = std::nullopt)
      : Strategy(std::move(accelerator), std::move(precision)) {}
  std::string name() const override { return "single_device"; }
};

}  // namespace strata::strategies
