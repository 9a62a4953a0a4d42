// The Trainer's logged metrics (Lightning's logger connector): what a
// step logged, collected into callback_metrics, the progress bar's and
// logged_metrics, and sent to the loggers on their cadence; and
// TrainModule::log's way into the results.
#include <ATen/ATen.h>

#include "loops/evaluation_loop.h"
#include "loops/fit_loop.h"
#include "results.h"
#include "strata/core/error.h"
#include "strata/trainer/trainer.h"
#include "trainer_impl.h"

namespace strata {

void Trainer::collect_step_metrics() {
  trainer::Metrics log, bar, all;
  fit_loop_->epoch_loop().results().take_step(*strategy_, log, bar, all);
  for (const auto& [k, v] : all) callback_metrics_[k] = v;
  for (const auto& [k, v] : bar) progress_bar_metrics_[k] = v;
  // logged_metrics has every batch's values, whether or not this step's
  // row reaches the loggers (Lightning's on_batch_end).
  for (const auto& [k, v] : log) pending_step_metrics_[k] = logged_metrics_[k] = v;
}

void Trainer::log_step_metrics(bool stepped) {
  // Lightning's update_train_step_metrics: after a batch that stepped,
  // when should_update_logs(), so also off the cadence once a hook has set
  // should_stop (that step is the run's last).
  if (stepped && should_update_logs() && !pending_step_metrics_.empty()) {
    log_to_loggers(pending_step_metrics_, log_step());
    pending_step_metrics_.clear();
  }
}

void Trainer::log_to_loggers(const trainer::Metrics& metrics, int64_t step) {
  // "epoch" goes to the loggers' rows only (Lightning adds it there, not
  // to logged_metrics).
  for (const auto& [k, v] : metrics) logged_metrics_[k] = v;
  trainer::Metrics row = metrics;
  row["epoch"] = static_cast<double>(fit_loop_->epoch());
  if (!is_global_zero()) return;
  for (const auto& logger : loggers_) {
    logger->log_metrics(row, step);
    logger->save();
  }
}

void Trainer::record_log(const std::string& name, const at::Tensor& value, const LogOptions& options) {
  STRATA_CHECK(!stage_.empty(), ConfigError, "[trainer] log('", name,
               "') was called outside fit/validate/test/predict; log inside a step or hook");
  trainer::detail::Results* evaluating = evaluation_loop_->results();
  trainer::detail::Results& results = evaluating ? *evaluating : fit_loop_->epoch_loop().results();
  int64_t batch_size = options.batch_size.value_or(current_batch_size_);
  results.log(*strategy_, name, value, options, /*in_training=*/!validating_ && stage_ == "fit", batch_size,
              current_share_);
}

}  // namespace strata
