// The in-place launcher (strategies/launchers/in_place.h).
#include "strata/strategies/launchers/in_place.h"

#include <cstdlib>

#include "strata/core/error.h"
#include "strata/core/log.h"
#include "strata/strategies/launchers/subprocess.h"
#include "strata/strategies/placement.h"
#include "strata/strategies/strategy.h"

namespace strata::strategies {

InPlaceLauncher::InPlaceLauncher(const ResolvedPlacement& placement)
    : strategy_(placement.strategy), seed_(placement.seed) {}

nlohmann::json InPlaceLauncher::launch(const std::function<nlohmann::json()>& fn) {
  const std::shared_ptr<Strategy> strategy = strategy_.lock();
  STRATA_CHECK(strategy != nullptr, Error, "[launcher] the strategy of this launcher is gone");
  try {
    return run_in_place(*strategy, seed_, fn);
  } catch (const std::exception& e) {
    // Rank 0's report quotes a worker's last error line.
    if (std::getenv(kEnvSubprocessWorker) != nullptr) log::error(e.what());
    throw;
  }
}

nlohmann::json run_in_place(Strategy& strategy, std::optional<uint64_t> seed,
                            const std::function<nlohmann::json()>& fn) {
  if (!strategy.launched()) {
    strategy.setup_environment();
    if (seed) seed_everything(*seed);
  }
  return fn();
}

}  // namespace strata::strategies
