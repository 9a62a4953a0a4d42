// EarlyStopping: stops fit when a monitored metric stops improving
// (Lightning's EarlyStopping).
#pragma once

#include <cstdint>
#include <string>

#include "strata/trainer/callback.h"

namespace strata::trainer {

/// EarlyStopping's settings.
struct EarlyStoppingOptions {
  std::string monitor;
  double min_delta = 0.0;  ///< an improvement smaller than this does not count
  int64_t patience = 3;    ///< checks without improvement before stopping
  std::string mode = "min";
  /// Check at the end of each training epoch instead of each validation.
  bool check_on_train_epoch_end = false;

  EarlyStoppingOptions& with_monitor(std::string m) { monitor = std::move(m); return *this; }
  EarlyStoppingOptions& with_min_delta(double d) { min_delta = d; return *this; }
  EarlyStoppingOptions& with_patience(int64_t p) { patience = p; return *this; }
  EarlyStoppingOptions& with_mode(std::string m) { mode = std::move(m); return *this; }
  EarlyStoppingOptions& with_check_on_train_epoch_end(bool c) { check_on_train_epoch_end = c; return *this; }
};

/// Stops fit when `monitor` stops improving. Rank 0's value decides and is
/// broadcast, so every rank stops after the same step.
class EarlyStopping : public Callback {
 public:
  /// Throws ConfigError for an empty monitor, a bad mode, patience < 0.
  explicit EarlyStopping(EarlyStoppingOptions options);
  std::string state_key() const override;
  const EarlyStoppingOptions& options() const { return options_; }
  int64_t wait_count() const { return wait_; }
  double best_score() const { return best_; }
  /// The global step at which it stopped the run (-1: it did not).
  int64_t stopped_step() const { return stopped_step_; }
  /// The epoch in which it stopped the run (current_epoch when it decided);
  /// 0 when it did not, as Lightning's stopped_epoch.
  int64_t stopped_epoch() const { return stopped_epoch_; }

  void on_validation_end(Trainer& trainer, TrainModule& module) override;
  void on_train_epoch_end(Trainer& trainer, TrainModule& module) override;
  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;

 private:
  void check(Trainer& trainer);
  EarlyStoppingOptions options_;
  int64_t wait_ = 0;
  double best_;
  int64_t stopped_step_ = -1;
  int64_t stopped_epoch_ = 0;
  bool validated_ = false;  // a validation ended since the last epoch end
};

}  // namespace strata::trainer
