// The training epoch loop (Lightning's _TrainingEpochLoop with its
// automatic optimization): the batches of one epoch of fit, each through
// training_step and backward, accumulated over accumulate_grad_batches
// and ended by the optimizer step, with the step's loss checked and read,
// the validations the epoch's cadence asks for, and the epoch's end.
// Internal: owned by the FitLoop (fit_loop.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <limits>
#include <string>

#include "../results.h"
#include "strata/data/loader.h"

namespace strata {
class Trainer;
}

namespace strata::trainer::detail {

class FitLoop;

/// One epoch of fit at a time; its state lasts from one epoch (and one
/// fit) to the next, as a checkpoint saves it.
class TrainingEpochLoop {
 public:
  TrainingEpochLoop(Trainer& trainer, FitLoop& fit);
  TrainingEpochLoop(const TrainingEpochLoop&) = delete;
  TrainingEpochLoop& operator=(const TrainingEpochLoop&) = delete;

  /// Runs the epoch fit is at on `loader`, validating on `val_loader`
  /// (null: none) on its cadence; false when it stopped inside the epoch.
  bool run(data::Loader& loader, data::Loader* val_loader);
  /// A new fit: no step taken.
  void reset_fit(int64_t global_step = 0);
  /// The next epoch has not begun: a checkpoint from here on resumes at
  /// its first batch.
  void next_epoch();

  /// Optimizer steps taken.
  int64_t global_step() const { return global_step_; }
  /// Training batches done in the current epoch.
  int64_t batch_idx() const { return batch_in_epoch_; }
  /// Batches of the training loader per epoch (after limits), on this rank.
  int64_t num_training_batches() const { return num_training_batches_; }
  /// The current epoch finished (for checkpoints at its end).
  bool epoch_done() const { return epoch_done_; }
  /// The running batch ended an accumulation (until its hooks are done).
  bool batch_stepped() const { return batch_stepped_; }
  double last_loss() const { return last_loss_; }
  double last_loss_weighted() const { return last_loss_weighted_; }
  /// The values logged in training (the epoch's running ones included).
  Results& results() { return results_; }

 private:
  /// The epoch's batch count, checked (the data yields some).
  int64_t epoch_batches(const data::Loader& loader) const;
  /// The batches between validations (Note [When validation runs]).
  int64_t validation_interval(int64_t batches, const data::Loader* val_loader) const;
  /// The loader at the epoch's position (a resumed epoch continues after
  /// the batches it had done), and the epoch's values restarted.
  void start(data::Loader& loader);
  /// One batch with its hooks, its step and the validation after it.
  void run_batch(const data::Batch& batch, data::Loader* val_loader, bool validate, int64_t val_every);
  /// The epoch's values reduced, the epoch schedulers, the end hooks.
  void end();
  /// training_step (Note [Steps through the root's forward]), its loss
  /// checked, backward, and the optimizer step when `last_of_step`.
  void training_batch(const data::Batch& batch, int64_t batch_idx, bool last_of_step);
  void optimizer_step();
  /// Ends the running batch's step (the strategy's mark_step: Note [No
  /// reads inside a lazy step]) and reads what it computed: the step's loss
  /// when it `stepped`, the values logged.
  void end_step(bool stepped);
  /// Adds `loss` (detached, f32) to `sum`, on the loss's device.
  void accumulate(at::Tensor& sum, const at::Tensor& loss) const;
  /// Note [NaN loss]: every rank votes on `loss`, the loss of the next
  /// step; strata::Error when any is non-finite. On a device that reads
  /// nothing inside a step, checked by each rank at the step's end.
  void check_loss(const at::Tensor& loss, int64_t batch_idx);
  /// The error of a non-finite loss read after its step ran.
  std::string deferred_loss_message(int64_t batch_idx) const;
  /// last_loss_ and last_loss_weighted_ from the finished step's sums.
  void read_step_loss();
  /// Warns when the device compiled a program after the warm-up steps.
  void warn_about_recompiles();

  Trainer& trainer_;
  FitLoop& fit_;
  Results results_;
  int64_t global_step_ = 0;
  int64_t batch_in_epoch_ = 0;
  int64_t num_training_batches_ = 0;
  bool epoch_done_ = false;
  bool batch_stepped_ = false;
  double last_loss_ = std::numeric_limits<double>::quiet_NaN();
  double last_loss_weighted_ = std::numeric_limits<double>::quiet_NaN();
  at::Tensor step_loss_;
  at::Tensor step_loss_weighted_;  // the step's loss, each micro-batch weighted by its share
  at::Tensor finished_loss_;       // the last step's sums, read into last_loss_ once the step ended
  at::Tensor finished_loss_weighted_;
  int64_t compiles_seen_ = 0;      // the device's compiled programs at the last step's end
  at::Tensor last_batch_loss_;
};

}  // namespace strata::trainer::detail
