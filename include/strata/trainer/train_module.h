// strata::TrainModule: the LightningModule's role. A user subclasses it,
// registers the model as a submodule, and says what one step does; the
// Trainer (trainer.h) runs the loops, the strategy, the checkpoints and the
// logging around it.
//
//   class LitGPT : public strata::TrainModule {
//    public:
//     LitGPT() { gpt = register_module("model", strata::models::GPT(config)); }
//     at::Tensor training_step(const strata::data::Batch& b, int64_t) override {
//       at::Tensor loss = gpt->loss(b.input, b.target);
//       log("train_loss", loss, strata::LogOptions().with_prog_bar(true));
//       return loss;
//     }
//     strata::OptimizerConfig configure_optimizers() override {
//       auto opt = std::make_shared<torch::optim::AdamW>(parameters(), torch::optim::AdamWOptions(3e-3));
//       return strata::OptimizerConfig(opt);
//     }
//     strata::models::GPT gpt{nullptr};
//   };
//
// Every step runs on every rank with that rank's slice of the batches.
#pragma once

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/data/loader.h"
#include "strata/loggers/logger.h"
#include "strata/trainer/scheduler.h"

namespace torch::optim {
class Optimizer;
}

namespace strata {

class Trainer;

/// How a value passed to TrainModule::log() is recorded (Lightning's
/// self.log arguments). Unset on_step / on_epoch take the defaults of the
/// hook that logs: training_step logs on_step, validation and test steps
/// on_epoch. A value logged both ways appears twice, as "<name>_step" and
/// "<name>_epoch".
struct LogOptions {
  bool prog_bar = false;           ///< show it in the progress bar
  std::optional<bool> on_step;     ///< log the value of each step
  std::optional<bool> on_epoch;    ///< log its reduction over the epoch
  bool sync_dist = false;          ///< reduce across ranks (else each rank keeps its own)
  std::string reduce_fx = "mean";  ///< "mean" (weighted by batch size), "sum", "max", "min"
  bool logger = true;              ///< hand it to the loggers
  /// Examples behind the value (weights the epoch mean); default: the
  /// batch's size.
  std::optional<int64_t> batch_size;

  LogOptions& with_prog_bar(bool v) { prog_bar = v; return *this; }
  LogOptions& with_on_step(bool v) { on_step = v; return *this; }
  LogOptions& with_on_epoch(bool v) { on_epoch = v; return *this; }
  LogOptions& with_sync_dist(bool v) { sync_dist = v; return *this; }
  LogOptions& with_reduce_fx(std::string v) { reduce_fx = std::move(v); return *this; }
  LogOptions& with_logger(bool v) { logger = v; return *this; }
  LogOptions& with_batch_size(int64_t v) { batch_size = v; return *this; }
};

/// What configure_optimizers() returns: one or more optimizers over the
/// module's parameters, and learning-rate schedulers of them. With
/// automatic optimization every optimizer steps after each accumulated
/// batch, in the order given.
struct OptimizerConfig {
  std::vector<std::shared_ptr<torch::optim::Optimizer>> optimizers;
  std::vector<trainer::SchedulerConfig> schedulers;

  OptimizerConfig() = default;
  /// One optimizer, no scheduler.
  explicit OptimizerConfig(std::shared_ptr<torch::optim::Optimizer> optimizer) {
    optimizers.push_back(std::move(optimizer));
  }
  OptimizerConfig& with_optimizer(std::shared_ptr<torch::optim::Optimizer> o) { optimizers.push_back(std::move(o)); return *this; }
  OptimizerConfig& with_scheduler(trainer::SchedulerConfig s) { schedulers.push_back(std::move(s)); return *this; }
};

/// Base of a user's training module. Override training_step and
/// configure_optimizers; the other steps and hooks are optional.
class TrainModule : public torch::nn::Module {
 public:
  TrainModule();
  ~TrainModule() override;

  // ---- steps (every rank, on its own batches) ----------------------------------
  /// The loss of one batch: a scalar tensor that requires grad. The
  /// Trainer backpropagates it (divided by accumulate_grad_batches).
  virtual at::Tensor training_step(const data::Batch& batch, int64_t batch_idx) = 0;
  /// One validation batch; log() metrics here. Not overriding it skips
  /// validation. The return value is ignored.
  virtual at::Tensor validation_step(const data::Batch& batch, int64_t batch_idx);
  /// One test batch; as validation_step.
  virtual at::Tensor test_step(const data::Batch& batch, int64_t batch_idx);
  /// The predictions for one batch: a tensor with one row per example
  /// (dim 0 = batch.size()). Default: forward-less modules must override.
  virtual at::Tensor predict_step(const data::Batch& batch, int64_t batch_idx);
  /// The optimizers and schedulers; called by the Trainer after the
  /// strategy set the module up (FSDP: parameters() are then the shards).
  virtual OptimizerConfig configure_optimizers() = 0;

  // ---- hooks -------------------------------------------------------------------
  virtual void on_fit_start() {}
  virtual void on_fit_end() {}
  virtual void on_train_start() {}
  virtual void on_train_end() {}
  virtual void on_train_epoch_start() {}
  virtual void on_train_epoch_end() {}
  virtual void on_train_batch_start(const data::Batch& batch, int64_t batch_idx) {}
  virtual void on_train_batch_end(const at::Tensor& loss, const data::Batch& batch, int64_t batch_idx) {}
  virtual void on_validation_epoch_start() {}
  virtual void on_validation_epoch_end() {}
  virtual void on_test_epoch_start() {}
  virtual void on_test_epoch_end() {}
  /// After the gradients of an accumulation are synchronised, before they
  /// are clipped and the optimizer steps (Lightning's order).
  virtual void on_before_optimizer_step(torch::optim::Optimizer& optimizer) {}
  /// Adds the module's own values to a checkpoint (under "module_extra").
  virtual void on_save_checkpoint(nlohmann::json& extra) {}
  /// Receives what on_save_checkpoint added, when a checkpoint is loaded.
  virtual void on_load_checkpoint(const nlohmann::json& extra) {}

  // ---- inside a step -------------------------------------------------------------
  /// Records a metric (see LogOptions). `value` is a scalar tensor or a
  /// number. Throws ConfigError outside a step or hook of a running loop,
  /// for a non-scalar or non-finite-typed tensor, and for an unknown
  /// reduce_fx.
  void log(const std::string& name, const at::Tensor& value, const LogOptions& options = {});
  void log(const std::string& name, double value, const LogOptions& options = {});
  /// log() for each entry of `values`.
  void log_dict(const std::map<std::string, at::Tensor>& values, const LogOptions& options = {});
  /// Records the module's hyperparameters, typed (numbers, booleans,
  /// strings, null, lists, nested maps), as Lightning's
  /// save_hyperparameters: the loggers get them at the start of fit
  /// (hparams.yaml, TensorBoard's HPARAMS tab) and checkpoints keep them.
  void save_hyperparameters(const trainer::Hyperparams& params) { hparams_ = params; }
  const trainer::Hyperparams& hparams() const { return hparams_; }

  /// The Trainer running this module; null outside fit/validate/test/predict.
  Trainer* trainer() const { return trainer_; }
  /// The Trainer's epoch and optimizer step (0 when not attached).
  int64_t current_epoch() const;
  int64_t global_step() const;

 private:
  friend class Trainer;
  Trainer* trainer_ = nullptr;
  trainer::Hyperparams hparams_;
};

namespace trainer::detail {
/// Thrown by the default validation_step / test_step / predict_step, so
/// the Trainer knows the module does not define them.
struct NotOverridden {
  const char* hook;
};
}  // namespace trainer::detail

}  // namespace strata
