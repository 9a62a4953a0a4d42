// The batches of one training epoch (training_epoch_loop.h): training_step,
// backward, gradient accumulation, the optimizer step and the schedulers
// that follow it, the step's loss checks, and the validations on the
// epoch's cadence.
//
// Note [Steps through the root's forward]
// Lightning runs training_step through the wrapped module's forward, so
// that a strategy's forward hooks (FSDP's gather of the root unit's
// parameters) surround it. strata does the same: every step runs as the
// body of hooked_forward on the TrainModule, so under FSDP the TrainModule
// is the root unit, gathered around each step, and the units inside it
// (e.g. the GPT's blocks) are gathered around their own forwards.
#include "training_epoch_loop.h"

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <cmath>
#include <optional>

#include "fit_loop.h"
#include "strata/core/error.h"
#include "strata/core/log.h"
#include "strata/core/module_hooks.h"
#include "strata/runtime/heartbeat.h"
#include "strata/strategies/precision.h"
#include "strata/trainer/trainer.h"

namespace strata::trainer::detail {

TrainingEpochLoop::TrainingEpochLoop(Trainer& trainer, FitLoop& fit) : trainer_(trainer), fit_(fit) {}

void TrainingEpochLoop::reset_fit(int64_t global_step) {
  global_step_ = global_step;
  batch_stepped_ = false;
}

void TrainingEpochLoop::next_epoch() {
  batch_in_epoch_ = 0;
  epoch_done_ = false;
}

int64_t TrainingEpochLoop::epoch_batches(const data::Loader& loader) const {
  const TrainerOptions& options = trainer_.options_;
  const int64_t n = options.limit_train_batches.of(static_cast<int64_t>(loader.size()));
  STRATA_CHECK(n > 0, ConfigError, "[trainer] the training data yields no batch on rank ", trainer_.global_rank(),
               " (", loader.size(), " batches, limit_train_batches ", options.limit_train_batches.value,
               "); give more data or a smaller batch_size");
  return n;
}

int64_t TrainingEpochLoop::validation_interval(int64_t n, const data::Loader* val_loader) const {
  // Note [When validation runs]
  // As Lightning's _should_check_val_fx: after every val_every-th batch of
  // the epoch (of the run with check_val_every_n_epoch=None), and only
  // then: the epoch's last batch validates only when the interval divides
  // it (a fraction f validates after each floor(f * n) batches, so 1/3 of
  // 64 runs after batches 21, 42 and 63). And after the batch in whose
  // hooks something set should_stop (a Timer, a callback), so a run that
  // stops has a validation of its last state.
  const BatchLimit& vci = trainer_.options_.val_check_interval;
  int64_t val_every = vci.fraction ? std::max<int64_t>(1, static_cast<int64_t>(std::floor(vci.value * n)))
                                   : static_cast<int64_t>(vci.value);
  const bool across_epochs = !trainer_.options_.check_val_every_n_epoch;
  STRATA_CHECK(across_epochs || vci.fraction || val_every <= n || !val_loader, ConfigError,
               "[trainer] val_check_interval (", val_every, ") is more than the training batches per epoch (", n,
               "); lower it, pass a fraction of the epoch, or set check_val_every_n_epoch to std::nullopt "
               "(Lightning's None) to count batches across epochs");
  return val_every;
}

bool TrainingEpochLoop::run(data::Loader& loader, data::Loader* val_loader) {
  const int64_t n = epoch_batches(loader);
  num_training_batches_ = n;
  const int64_t val_every = validation_interval(n, val_loader);
  const bool validate_this_epoch = val_loader && fit_.validates_this_epoch();
  start(loader);
  trainer_.each_callback([&](Callback& c) { c.on_train_epoch_start(trainer_, *trainer_.module_); });
  trainer_.module_->on_train_epoch_start();
  bool stopped = false;
  while (batch_in_epoch_ < n) {
    std::optional<data::Batch> batch = loader.next();
    if (!batch) break;
    run_batch(*batch, val_loader, validate_this_epoch, val_every);
    if (trainer_.should_stop || fit_.step_limit_reached()) {
      stopped = batch_in_epoch_ < n;
      break;
    }
  }
  // Epoch end (also when stopped inside it, as Lightning does).
  end();
  return !stopped;
}

void TrainingEpochLoop::start(data::Loader& loader) {
  // Position: a resumed epoch continues after the batches it had done.
  const int64_t position = fit_.checked_resume_position(num_training_batches_);
  const int64_t epoch = fit_.epoch();
  loader.set_epoch(static_cast<uint64_t>(epoch));
  if (position > 0 && loader.resumable()) {
    loader.load_state({static_cast<uint64_t>(epoch), static_cast<uint64_t>(position)});
  }
  loader.reset();
  if (position > 0 && !loader.resumable()) {
    for (int64_t i = 0; i < position; ++i) loader.next();
  }
  batch_in_epoch_ = position;
  epoch_done_ = false;
  results_.reset();
  const nlohmann::json resumed = fit_.take_resume_results();
  if (position > 0 && !resumed.is_null()) {
    results_.load_epoch_state(resumed, trainer_.global_rank(), "the restored checkpoint");
  }
  step_loss_ = at::zeros({}, at::kFloat);
  step_loss_weighted_ = at::zeros({}, at::kFloat);
}

void TrainingEpochLoop::run_batch(const data::Batch& batch, data::Loader* val_loader, bool validate,
                                  int64_t val_every) {
  Trainer& t = trainer_;
  TrainModule& module = *t.module_;
  const int64_t n = num_training_batches_;
  const int64_t idx = batch_in_epoch_;
  const bool last_of_step = (idx + 1) % t.options_.accumulate_grad_batches == 0 || idx + 1 == n;
  runtime::report_step(global_step_ + 1);
  t.each_callback([&](Callback& c) { c.on_train_batch_start(t, module, batch, idx); });
  module.on_train_batch_start(batch, idx);
  training_batch(batch, idx, last_of_step);
  batch_in_epoch_ = idx + 1;
  batch_stepped_ = last_of_step;
  // Note [Values logged in on_train_batch_end]: what the module logs in
  // its on_train_batch_end belongs to this batch, as in Lightning: the
  // callbacks after it see it in callback_metrics, and it reaches the
  // loggers in this step's row.
  t.collect_step_metrics();
  module.on_train_batch_end(last_batch_loss_, batch, idx);
  t.collect_step_metrics();
  t.each_callback([&](Callback& c) { c.on_train_batch_end(t, module, last_batch_loss_, batch, idx); });
  t.collect_step_metrics();
  t.log_step_metrics(last_of_step);
  if (last_of_step && t.options_.stop_on_signals && fit_.stop_signal() == 0) fit_.agree_on_stop_signal();
  // Note [When validation runs]; a run stopping on a signal saves
  // without validating first (its time may be short).
  const bool across_epochs = !t.options_.check_val_every_n_epoch;
  const int64_t batches_counted = across_epochs ? fit_.epoch() * n + batch_in_epoch_ : batch_in_epoch_;
  if (validate && fit_.stop_signal() == 0 && (t.should_stop || batches_counted % val_every == 0)) {
    fit_.run_validation(*val_loader);
  }
  batch_stepped_ = false;
}

void TrainingEpochLoop::end() {
  Trainer& t = trainer_;
  Metrics log, bar, all;
  results_.reduce_epoch(*t.strategy_, log, bar, all);
  for (const auto& [k, v] : all) t.callback_metrics_[k] = v;
  for (const auto& [k, v] : bar) t.progress_bar_metrics_[k] = v;
  if (!log.empty()) t.log_to_loggers(log, std::max<int64_t>(global_step_ - 1, 0));
  epoch_done_ = batch_in_epoch_ >= num_training_batches_;
  // Note [Epoch schedulers before the epoch-end hooks]
  // Epoch-interval schedulers step before on_train_epoch_end, so a
  // checkpoint saved there holds the rates of the next epoch and a run
  // resumed from it sets the same rates as one that went on.
  if (epoch_done_) {
    for (auto& s : t.schedulers_) {
      if (s.interval == "epoch" && (fit_.epoch() + 1) % s.frequency == 0) s.scheduler->step();
    }
  }
  t.each_callback([&](Callback& c) { c.on_train_epoch_end(t, *t.module_); });
  t.module_->on_train_epoch_end();
  if (t.is_global_zero()) {
    for (const auto& logger : t.loggers_) logger->save();
  }
}

void TrainingEpochLoop::training_batch(const data::Batch& batch, int64_t batch_idx, bool last_of_step) {
  Trainer& t = trainer_;
  TrainModule& module = *t.module_;
  strategies::Strategy& strategy = *t.strategy_;
  const int64_t epoch = fit_.epoch();
  t.current_batch_size_ = batch.examples();
  t.current_share_ = batch.share(t.world_size());
  struct ShareReset {
    double& share;
    ~ShareReset() { share = 1.0; }
  } share_reset{t.current_share_};
  at::Tensor loss;
  {
    strategies::Scope no_sync = strategy.no_backward_sync(module, !last_of_step);
    {
      strategies::Precision::ForwardContext autocast(strategy.precision());
      // Note [Steps through the root's forward].
      hooked_forward(module, batch.input, [&](const at::Tensor&) {
        loss = module.training_step(batch, batch_idx);
        return loss.defined() ? loss : at::zeros({});
      });
    }
    STRATA_CHECK(loss.defined(), ConfigError,
                 "[trainer] training_step returned no loss (an undefined tensor) at epoch ", epoch, ", batch ",
                 batch_idx, "; return the loss tensor to backpropagate");
    STRATA_CHECK(loss.numel() == 1, ConfigError, "[trainer] training_step must return a scalar loss, got shape ",
                 loss.sizes(), " at epoch ", epoch, ", batch ", batch_idx, "; reduce it first, e.g. loss.mean()");
    STRATA_CHECK(loss.requires_grad(), ConfigError,
                 "[trainer] the loss training_step returned does not require grad (epoch ", epoch, ", batch ",
                 batch_idx, "): it is not computed from the module's trainable parameters, or was detached");
    check_loss(loss, batch_idx);
    at::Tensor scaled = loss.to(at::kFloat) / static_cast<double>(t.options_.accumulate_grad_batches);
    // Note [Unequal shares]: a rank holding n_r of an uneven global batch
    // of m examples weights its mean loss by n_r * N / m (0 for a filler
    // batch), so the mean over ranks that DDP and FSDP take of the
    // gradients is the gradient of the global batch's mean loss.
    at::Tensor weighted = t.current_share_ == 1.0 ? scaled : scaled * t.current_share_;
    strategy.backward(weighted);
    accumulate(step_loss_, scaled);
    accumulate(step_loss_weighted_, weighted);
  }
  last_batch_loss_ = loss.detach();
  if (last_of_step) optimizer_step();
  end_step(last_of_step);
}

void TrainingEpochLoop::end_step(bool stepped) {
  // Note [No reads inside a lazy step] (strategies/accelerator.h): the
  // step ends here (on a lazy device it runs, and throws
  // deferred_loss_message for a non-finite loss), then the values it
  // computed are read.
  trainer_.strategy_->mark_step();
  if (stepped) read_step_loss();
  results_.settle(*trainer_.strategy_);
  warn_about_recompiles();
}

void TrainingEpochLoop::accumulate(at::Tensor& sum, const at::Tensor& loss) const {
  // The sum stays on the loss's device, read once the step ended.
  const at::Tensor value = loss.detach().to(at::kFloat);
  sum = sum.device() == value.device() ? sum + value : value + sum.to(value.device());
}

void TrainingEpochLoop::check_loss(const at::Tensor& loss, int64_t batch_idx) {
  // Note [NaN loss]
  // Every rank votes; one non-finite loss stops all of them before the
  // backward, so no step is taken with it and nothing is saved after the
  // last good step: the checkpoints on disk stay as they were. On a device
  // that reads nothing inside a step the check is deferred to the step's
  // end, registered before any check of the step's gradients, so that it
  // is the one reported.
  strategies::Strategy& strategy = *trainer_.strategy_;
  const strategies::Accelerator& accelerator = strategy.accelerator();
  if (!accelerator.reads_inside_step()) {
    accelerator.check_at_step_end(loss.detach().isfinite(), deferred_loss_message(batch_idx));
    return;
  }
  const double value = loss.detach().to(at::kDouble).item<double>();
  const bool bad = !std::isfinite(value);
  if (!strategy.reduce_boolean_decision(bad, /*all=*/false)) return;
  const char* what = bad ? (std::isnan(value) ? "NaN" : "infinite") : "non-finite";
  throw Error(strata::detail::cat("[trainer] the loss is ", what, bad ? "" : " on another rank", " at step ",
                                  global_step_ + 1, " (epoch ", fit_.epoch(), ", batch ", batch_idx,
                                  "); training stopped before that step, so the last checkpoint saved stays "
                                  "untouched. Lower the learning rate or clip gradients (gradient_clip_val)"));
}

std::string TrainingEpochLoop::deferred_loss_message(int64_t batch_idx) const {
  return strata::detail::cat(
      "[trainer] the loss is NaN or infinite at step ", global_step_ + 1, " (epoch ", fit_.epoch(), ", batch ",
      batch_idx, "); on the ", trainer_.strategy_->accelerator().name(),
      " device the loss is read after the step ran (Note [No reads inside a lazy step]), so the model "
      "in memory took that step, but training stopped before anything was saved after it: the last "
      "checkpoint saved stays untouched. Lower the learning rate or clip gradients "
      "(gradient_clip_val)");
}

void TrainingEpochLoop::read_step_loss() {
  // A download (on a lazy device the step has run); a convert there would
  // be a program of its own.
  last_loss_ = finished_loss_.cpu().item<double>();
  last_loss_weighted_ = finished_loss_weighted_.cpu().item<double>();
}

void TrainingEpochLoop::warn_about_recompiles() {
  // Note [Recompiles after the warm-up]: a steady loop compiles its
  // programs in its first two steps; a compile later means the step
  // changed (a shape, an op, a constant) and each such step pays a compile.
  // An eager device compiles none.
  const strategies::Accelerator& accelerator = trainer_.strategy_->accelerator();
  const strategies::Accelerator::CompiledPrograms programs = accelerator.compiled_programs();
  // With ranks as threads the counts are the process's: rank 0 speaks.
  if (global_step_ > 2 && programs.count > compiles_seen_ && !programs.last_reason.empty() &&
      trainer_.is_global_zero()) {
    log::warning("[trainer] the ", accelerator.name(), " device compiled a new program at step ", global_step_,
                 ", after the warm-up steps (", programs.count - compiles_seen_, " new; ", programs.count,
                 " in all): ", programs.last_reason,
                 ". A step whose shapes or ops change compiles each time; keep batch shapes fixed (drop_last) "
                 "and read values only after the step");
  }
  compiles_seen_ = programs.count;
}

void TrainingEpochLoop::optimizer_step() {
  Trainer& t = trainer_;
  TrainModule& module = *t.module_;
  const TrainerOptions& options = t.options_;
  for (const auto& optimizer : t.optimizers_) {
    t.each_callback([&](Callback& c) { c.on_before_optimizer_step(t, module, *optimizer); });
    module.on_before_optimizer_step(*optimizer);
  }
  if (options.gradient_clip_val && *options.gradient_clip_val > 0) {
    if (options.gradient_clip_algorithm == "norm") {
      t.strategy_->clip_gradients_norm(module, *t.optimizers_.front(), *options.gradient_clip_val);
    } else {
      t.strategy_->clip_gradients_value(module, *t.optimizers_.front(), *options.gradient_clip_val);
    }
  }
  for (const auto& optimizer : t.optimizers_) t.strategy_->optimizer_step(*optimizer);
  for (const auto& optimizer : t.optimizers_) optimizer->zero_grad();
  ++global_step_;
  finished_loss_ = step_loss_;
  finished_loss_weighted_ = step_loss_weighted_;
  step_loss_ = at::zeros({}, at::kFloat);
  step_loss_weighted_ = at::zeros({}, at::kFloat);
  for (auto& s : t.schedulers_) {
    if (s.interval == "step" && global_step_ % s.frequency == 0) s.scheduler->step();
  }
}

}  // namespace strata::trainer::detail
