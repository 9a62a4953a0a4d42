// LearningRateMonitor (trainer/callbacks/learning_rate_monitor.h).
#include "strata/trainer/callbacks/learning_rate_monitor.h"

#include <torch/optim/optimizer.h>

#include <typeinfo>

#include "strata/core/error.h"
#include "strata/core/log.h"
#include "strata/trainer/trainer.h"
#include "strata/trainer/trainer_state.h"

namespace strata::trainer {

namespace {

// "AdamW" from LibTorch's type name "torch::optim::AdamW".
std::string optimizer_name(const torch::optim::Optimizer& optimizer) {
  const std::string name = typeid(optimizer).name();
  for (const char* known : {"AdamW", "Adam", "SGD", "RMSprop", "Adagrad", "LBFGS"}) {
    if (name.find(known) != std::string::npos) return known;
  }
  return "Optimizer";
}

}  // namespace

LearningRateMonitor::LearningRateMonitor(std::string logging_interval) : interval_(std::move(logging_interval)) {
  STRATA_CHECK(interval_ == "step" || interval_ == "epoch", ConfigError,
               "[trainer] LearningRateMonitor logging_interval must be 'step' or 'epoch', got '", interval_, "'");
}

Metrics LearningRateMonitor::learning_rates(const Trainer& trainer) {
  Metrics out;
  std::map<std::string, int> seen;
  for (const auto& optimizer : trainer.optimizers()) {
    std::string base = "lr-" + optimizer_name(*optimizer);
    for (const auto& s : trainer.lr_scheduler_configs()) {
      if (&s.scheduler->optimizer() == optimizer.get() && !s.name.empty()) base = s.name;
    }
    // Two optimizers of one type: "lr-SGD", "lr-SGD-1".
    const int count = seen[base]++;
    if (count > 0) base += "-" + std::to_string(count);
    const auto& groups = optimizer->param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      out[g == 0 ? base : base + "/pg" + std::to_string(g + 1)] = groups[g].options().get_lr();
    }
  }
  return out;
}

// Note [When the LR monitor logs]
// As Lightning 2.6.6's LearningRateMonitor: with "step" it logs at each
// training batch's start, so every batch of an accumulation window logs
// the rate its step will use (accumulate_grad_batches=2 writes two rows a
// step), when that step's values reach the loggers (should_update_logs:
// the log_every_n_steps cadence, or should_stop), filed under the steps
// taken before it (log_step(), Lightning's _batches_that_stepped). With
// "epoch" it logs at each epoch's start under the steps taken so far, so
// the second epoch's rate after 3 steps is filed under step 3. Its rows
// hold the rates only (no "epoch"), and go to the loggers directly, as
// Lightning's do, so they are written at the loggers' next save, in the
// order logged (tests/trainer/lightning_loop_test.cpp compares the CSV
// with Lightning's for the same run).
void LearningRateMonitor::on_train_batch_start(Trainer& trainer, TrainModule&, const data::Batch&, int64_t) {
  if (interval_ != "step" || !trainer.is_global_zero() || !trainer.should_update_logs()) return;
  const Metrics rates = learning_rates(trainer);
  for (const auto& logger : trainer.loggers()) logger->log_metrics(rates, trainer.log_step());
}

void LearningRateMonitor::on_train_epoch_start(Trainer& trainer, TrainModule&) {
  if (interval_ != "epoch" || !trainer.is_global_zero()) return;
  const Metrics rates = learning_rates(trainer);
  for (const auto& logger : trainer.loggers()) logger->log_metrics(rates, trainer.log_step());
}

}  // namespace strata::trainer
