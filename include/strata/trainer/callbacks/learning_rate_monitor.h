// LearningRateMonitor: logs the optimizers' learning rates (Lightning's
// LearningRateMonitor).
#pragma once

#include <cstdint>
#include <string>

#include "strata/loggers/logger.h"
#include "strata/trainer/callback.h"

namespace strata::trainer {

/// Logs every optimizer's learning rate ("lr-<Optimizer>", "/pg<i>" for
/// further param groups, or the scheduler's name), on rank 0, as
/// Lightning's LearningRateMonitor: with "step" at the start of each
/// training batch of a step whose values reach the loggers (every batch
/// of an accumulation window, every log_every_n_steps steps), with
/// "epoch" at the start of each epoch (Note [When the LR monitor logs]).
class LearningRateMonitor : public Callback {
 public:
  /// Throws ConfigError unless interval is "step" or "epoch".
  explicit LearningRateMonitor(std::string logging_interval = "step");
  std::string state_key() const override { return "LearningRateMonitor"; }
  /// The names and values it would log now.
  static Metrics learning_rates(const Trainer& trainer);
  void on_train_batch_start(Trainer& trainer, TrainModule& module, const data::Batch& batch,
                            int64_t batch_idx) override;
  void on_train_epoch_start(Trainer& trainer, TrainModule& module) override;

 private:
  std::string interval_;
};

}  // namespace strata::trainer
