// ProgressBar: the training progress line on global rank 0 (Lightning's
// progress bar).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "strata/trainer/callback.h"

namespace strata::trainer {

/// Progress on global rank 0: on a terminal one line redrawn in place
/// (epoch, step, loss, prog_bar metrics, rate, ETA); otherwise a plain
/// line every log_every_n_steps steps and at each epoch end. The loss is
/// the prog_bar value "train_loss" when the module logs one (the value
/// the loggers get), else the rank's Trainer::last_loss().
class ProgressBar : public Callback {
 public:
  /// `out_is_terminal`: nullopt asks isatty(stdout) or STRATA_LAUNCHER_TTY.
  explicit ProgressBar(std::optional<bool> out_is_terminal = std::nullopt);
  std::string state_key() const override { return "ProgressBar"; }
  /// The text of the progress line for the trainer's current state.
  static std::string line(const Trainer& trainer, double steps_per_s, double eta_s);
  void on_train_start(Trainer& trainer, TrainModule& module) override;
  void on_train_batch_end(Trainer& trainer, TrainModule& module, const at::Tensor& loss, const data::Batch& batch,
                          int64_t batch_idx) override;
  void on_train_epoch_end(Trainer& trainer, TrainModule& module) override;
  void on_validation_end(Trainer& trainer, TrainModule& module) override;
  void on_train_end(Trainer& trainer, TrainModule& module) override;

 private:
  void print(const std::string& text, bool final_line);
  bool tty_;
  bool line_open_ = false;
  std::chrono::steady_clock::time_point start_;
  int64_t first_step_ = 0;
  int64_t last_printed_step_ = -1;
};

}  // namespace strata::trainer
