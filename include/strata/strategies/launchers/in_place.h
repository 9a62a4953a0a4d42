// The in-place launcher: this process already is a rank of its job (an
// outside launcher started it: `strata launch`, torchrun, srun, mpirun; or
// the subprocess launcher re-executed it), or the job has one rank.
#pragma once

#include <cstdint>
#include <optional>

#include "strata/strategies/launchers/launcher.h"

namespace strata::strategies {

class Strategy;

/// Runs launch()'s function here, on this process's rank.
class InPlaceLauncher : public Launcher {
 public:
  /// For `placement`'s strategy (held weakly: the strategy owns its
  /// launcher).
  explicit InPlaceLauncher(const ResolvedPlacement& placement);
  std::string name() const override { return "in_place"; }
  nlohmann::json launch(const std::function<nlohmann::json()>& fn) override;
  bool is_interactive_compatible() const override { return true; }

 private:
  std::weak_ptr<Strategy> strategy_;
  std::optional<uint64_t> seed_;
};

/// Sets `strategy`'s environment up when it is not yet (then seeds LibTorch
/// with `seed`, when given) and runs `fn` here: what every launcher does on
/// a rank of its own.
nlohmann::json run_in_place(Strategy& strategy, std::optional<uint64_t> seed,
                            const std::function<nlohmann::json()>& fn);

}  // namespace strata::strategies
