// The fit loop (Lightning's _FitLoop): the epochs of Trainer::fit, from
// the resume position of a restored checkpoint to max_epochs or a stop,
// with the sanity validation before them and the fit's hooks around them.
// The batches of each epoch are its TrainingEpochLoop's
// (training_epoch_loop.h). Internal: the Trainer owns one and its public
// state (current_epoch(), stop_signal(), ...) reads from it.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>

#include "strata/data/loader.h"
#include "strata/trainer/trainer.h"
#include "training_epoch_loop.h"

namespace strata::trainer::detail {

/// The epochs of one fit at a time, on its Trainer's strategy and callbacks.
class FitLoop {
 public:
  /// The loop of `trainer`, with its max_epochs (Lightning's default: 1000
  /// unless a step limit is given).
  explicit FitLoop(Trainer& trainer);
  FitLoop(const FitLoop&) = delete;
  FitLoop& operator=(const FitLoop&) = delete;

  /// Trains on `train`, validating on `val`: restores `ckpt_path` when
  /// given, runs the sanity validation, then the epochs and their hooks.
  void run(const DataSource& train, const std::optional<DataSource>& val, const std::string& ckpt_path);

  /// The epoch running (the loop position a checkpoint saves).
  int64_t epoch() const { return epoch_; }
  /// Trainer::current_epoch(): a stopped epoch counts as ended.
  int64_t current_epoch() const { return epoch_ + (stopped_inside_epoch_ ? 1 : 0); }
  /// Note [Stopping on a signal]: the signal the ranks agreed to stop on.
  int stop_signal() const { return stop_signal_; }
  int64_t num_val_batches() const { return num_val_batches_; }
  /// Whether a validation (not a sanity one) has run in this fit.
  bool validation_has_run() const { return validations_run_ > 0; }
  /// Validation data, and the epoch is a check_val_every_n_epoch-th one.
  bool validates_this_epoch() const;
  /// max_steps reached.
  bool step_limit_reached() const;
  /// Whether the training data is a dataset (which resumes at any world size).
  bool train_is_dataset() const { return train_is_dataset_; }

  TrainingEpochLoop& epoch_loop() { return epoch_loop_; }
  const TrainingEpochLoop& epoch_loop() const { return epoch_loop_; }

  /// Sets the loop position from a restored checkpoint: `epoch` and
  /// `global_step`, the first epoch's batches done (`position`) and its
  /// logged values so far (`results`, null: none).
  void restore(int64_t epoch, int64_t global_step, int64_t position, nlohmann::json results);
  /// The first epoch's resume position checked against its `batches` (an
  /// out-of-range position is an error); 0 after the first call.
  int64_t checked_resume_position(int64_t batches);
  /// The first epoch's restored logged values (null: none), once.
  nlohmann::json take_resume_results();

  /// Note [Stopping on a signal]: the ranks vote after an optimizer step.
  void agree_on_stop_signal();
  /// A validation inside fit, counted (validation_has_run()).
  void run_validation(data::Loader& loader);

 private:
  /// The fit's state at its start (a Trainer fits again from scratch).
  void reset(const DataSource& train, const data::Loader* val_loader);
  /// The epochs, with on_train_start/end around them.
  void run_epochs(data::Loader& train_loader, data::Loader* val_loader);

  Trainer& trainer_;
  TrainingEpochLoop epoch_loop_;
  int64_t max_epochs_ = 1000;
  int64_t epoch_ = 0;
  bool stopped_inside_epoch_ = false;  // fit stopped before its epoch's last batch
  int stop_signal_ = 0;                // Note [Stopping on a signal]
  bool train_is_dataset_ = false;
  int64_t validations_run_ = 0;  // validations of this fit, not counting the sanity one
  int64_t num_val_batches_ = 0;
  int64_t resume_position_ = 0;    // batches of the first epoch a restored run skips
  nlohmann::json resume_results_;  // that epoch's logged values so far (null: none)
};

}  // namespace strata::trainer::detail
