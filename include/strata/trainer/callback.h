// Callbacks: code the Trainer runs at fixed points of its loops
// (Lightning's Callback). Every hook runs on every rank; a callback that
// decides something (stop, save) makes all ranks agree through the
// strategy's collectives, since ranks must call collectives together.
#pragma once

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>

#include "strata/data/loader.h"

namespace torch::optim {
class Optimizer;
}

namespace strata {
class Trainer;
class TrainModule;
}  // namespace strata

namespace strata::trainer {

/// Base of every callback; each hook does nothing by default.
class Callback {
 public:
  virtual ~Callback() = default;

  /// The key of this callback's state in a checkpoint; callbacks of one
  /// type with different settings need different keys.
  virtual std::string state_key() const = 0;

  /// stage: "fit", "validate", "test" or "predict".
  virtual void setup(Trainer&, TrainModule&, const std::string& stage) {}
  virtual void teardown(Trainer&, TrainModule&, const std::string& stage) {}
  virtual void on_fit_start(Trainer&, TrainModule&) {}
  virtual void on_fit_end(Trainer&, TrainModule&) {}
  virtual void on_train_start(Trainer&, TrainModule&) {}
  virtual void on_train_end(Trainer&, TrainModule&) {}
  virtual void on_train_epoch_start(Trainer&, TrainModule&) {}
  /// After the epoch's metrics are reduced (callback_metrics hold them).
  virtual void on_train_epoch_end(Trainer&, TrainModule&) {}
  virtual void on_train_batch_start(Trainer&, TrainModule&, const data::Batch&, int64_t batch_idx) {}
  /// `loss` is what training_step returned (before dividing by
  /// accumulate_grad_batches); the optimizer has stepped when this batch
  /// completed an accumulation.
  virtual void on_train_batch_end(Trainer&, TrainModule&, const at::Tensor& loss, const data::Batch&,
                                  int64_t batch_idx) {}
  /// Around the sanity validation before training (num_sanity_val_steps);
  /// the validation hooks run between them with trainer.sanity_checking().
  virtual void on_sanity_check_start(Trainer&, TrainModule&) {}
  virtual void on_sanity_check_end(Trainer&, TrainModule&) {}
  virtual void on_validation_start(Trainer&, TrainModule&) {}
  /// After validation's metrics are reduced.
  virtual void on_validation_end(Trainer&, TrainModule&) {}
  virtual void on_test_start(Trainer&, TrainModule&) {}
  virtual void on_test_end(Trainer&, TrainModule&) {}
  virtual void on_before_optimizer_step(Trainer&, TrainModule&, torch::optim::Optimizer&) {}
  /// A loop failed with `error` (the Trainer rethrows it afterwards).
  virtual void on_exception(Trainer&, TrainModule&, const std::exception& error) {}

  /// What a checkpoint keeps of this callback (null: nothing).
  virtual nlohmann::json state_dict() const { return nullptr; }
  /// Restores state_dict()'s value. Throws CheckpointError for malformed state.
  virtual void load_state_dict(const nlohmann::json& state) {}
};

using CallbackPtr = std::shared_ptr<Callback>;

}  // namespace strata::trainer
