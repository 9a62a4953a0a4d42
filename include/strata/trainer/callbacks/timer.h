// Timer: stops fit after a wall-time budget (the Trainer's max_time;
// Lightning's Timer).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "strata/trainer/callback.h"

namespace strata::trainer {

/// Stops fit once `duration` of training time has passed (the Trainer's
/// max_time). Rank 0's clock decides and is broadcast. Time spent before a
/// resume counts (it is in the checkpoint).
class Timer : public Callback {
 public:
  explicit Timer(std::chrono::milliseconds duration);
  std::string state_key() const override { return "Timer"; }
  /// Training time so far, seconds.
  double time_elapsed() const;
  void on_train_start(Trainer& trainer, TrainModule& module) override;
  void on_train_end(Trainer& trainer, TrainModule& module) override;
  void on_train_batch_end(Trainer& trainer, TrainModule& module, const at::Tensor& loss, const data::Batch& batch,
                          int64_t batch_idx) override;
  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;

 private:
  std::chrono::milliseconds duration_;
  double offset_s_ = 0.0;
  std::optional<std::chrono::steady_clock::time_point> start_;
};

}  // namespace strata::trainer
