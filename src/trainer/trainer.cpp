// The Trainer: options and the fit loop (epochs, accumulated batches,
// optimizer steps, schedulers, validation checks). The launch and set-up
// are in trainer_setup.cpp, evaluation loops in evaluation.cpp,
// checkpoints in trainer_checkpoint.cpp, the logged metrics'
// way to the loggers in trainer_logging.cpp.
//
// Note [Steps through the root's forward]
// Lightning runs training_step through the wrapped module's forward, so
// that a strategy's forward hooks (FSDP's gather of the root unit's
// parameters) surround it. strata does the same: every step runs as the
// body of hooked_forward on the TrainModule, so under FSDP the TrainModule
// is the root unit, gathered around each step, and the units inside it
// (e.g. the GPT's blocks) are gathered around their own forwards.
#include "strata/trainer/trainer.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <csignal>
#include <cmath>
#include <limits>
#include <iostream>
#include <optional>

#include "results.h"
#include "strata/core/error.h"
#include "strata/core/interrupted.h"
#include "strata/core/log.h"
#include "strata/core/module_hooks.h"
#include "strata/runtime/heartbeat.h"
#include "strata/runtime/stop_signal.h"
#include "strata/strategies/make_strategy.h"
#include "strata/strategies/precision.h"
#include "strata/trainer/callbacks.h"
#include "trainer_impl.h"

namespace strata {


int64_t BatchLimit::of(int64_t size) const {
  if (!fraction) return std::min<int64_t>(size, static_cast<int64_t>(value));
  if (value >= 1.0) return size;
  return static_cast<int64_t>(std::floor(value * static_cast<double>(size)));
}

namespace {

void check_limit(const BatchLimit& l, const char* field) {
  if (l.fraction) {
    STRATA_CHECK(l.value >= 0 && l.value <= 1, ConfigError, "[trainer] ", field,
                 " as a fraction must be in [0, 1], got ", l.value, " (pass an integer for a number of batches)");
  } else {
    STRATA_CHECK(l.value >= 0, ConfigError, "[trainer] ", field, " must be >= 0 batches, got ", l.value);
  }
}

}  // namespace

Trainer::Trainer(TrainerOptions options) : options_(std::move(options)) {
  TrainerOptions& o = options_;
  STRATA_CHECK(o.max_steps >= -1, ConfigError, "[trainer] max_steps must be >= -1 (-1: no limit), got ", o.max_steps);
  STRATA_CHECK(!o.max_epochs || *o.max_epochs >= -1, ConfigError,
               "[trainer] max_epochs must be >= -1 (-1: no limit), got ", *o.max_epochs);
  STRATA_CHECK(o.accumulate_grad_batches >= 1, ConfigError, "[trainer] accumulate_grad_batches must be >= 1, got ",
               o.accumulate_grad_batches);
  STRATA_CHECK(o.gradient_clip_algorithm == "norm" || o.gradient_clip_algorithm == "value", ConfigError,
               "[trainer] gradient_clip_algorithm must be 'norm' or 'value', got '", o.gradient_clip_algorithm, "'");
  STRATA_CHECK(!o.gradient_clip_val || (std::isfinite(*o.gradient_clip_val) && *o.gradient_clip_val >= 0),
               ConfigError, "[trainer] gradient_clip_val must be a finite number >= 0, got ", *o.gradient_clip_val);
  STRATA_CHECK(o.log_every_n_steps >= 1, ConfigError, "[trainer] log_every_n_steps must be >= 1, got ",
               o.log_every_n_steps);
  STRATA_CHECK(!o.check_val_every_n_epoch || *o.check_val_every_n_epoch >= 1, ConfigError,
               "[trainer] check_val_every_n_epoch must be >= 1, got ", o.check_val_every_n_epoch.value_or(0),
               "; pass std::nullopt (strata::kValidateAcrossEpochs, Lightning's None) to count val_check_interval's "
               "batches across epochs");
  STRATA_CHECK(o.check_val_every_n_epoch || !o.val_check_interval.fraction || o.val_check_interval.value == 1.0,
               ConfigError, "[trainer] check_val_every_n_epoch=None needs val_check_interval as a number of batches, "
               "not the fraction ", o.val_check_interval.value);
  STRATA_CHECK(o.num_sanity_val_steps >= -1, ConfigError,
               "[trainer] num_sanity_val_steps must be >= -1 (-1: all validation batches), got ", o.num_sanity_val_steps);
  STRATA_CHECK(o.fast_dev_run >= 0, ConfigError, "[trainer] fast_dev_run must be >= 0 batches (0: off), got ",
               o.fast_dev_run);
  check_limit(o.overfit_batches, "overfit_batches");
  STRATA_CHECK(!o.max_time || o.max_time->count() >= 0, ConfigError, "[trainer] max_time must be >= 0");
  check_limit(o.limit_train_batches, "limit_train_batches");
  check_limit(o.limit_val_batches, "limit_val_batches");
  check_limit(o.limit_test_batches, "limit_test_batches");
  check_limit(o.limit_predict_batches, "limit_predict_batches");
  STRATA_CHECK(o.val_check_interval.fraction ? (o.val_check_interval.value > 0 && o.val_check_interval.value <= 1)
                                             : o.val_check_interval.value >= 1,
               ConfigError, "[trainer] val_check_interval must be a fraction in (0, 1] or a number of batches >= 1, got ",
               o.val_check_interval.value);
  for (const auto& c : o.callbacks) STRATA_CHECK(c != nullptr, ConfigError, "[trainer] callbacks holds a null callback");
  for (const auto& l : o.loggers) STRATA_CHECK(l != nullptr, ConfigError, "[trainer] loggers holds a null logger");

  // Note [Debug runs]
  // As Lightning's Trainer: fast_dev_run=n runs n batches of every loop, one
  // epoch and n steps at most, with no sanity validation, validation after
  // the epoch, and no logging or checkpointing; overfit_batches replaces
  // the training and validation limits (and, in make_loader, turns the
  // shuffle off), also under fast_dev_run.
  const bool overfit = o.overfit_batches.value > 0;
  if (o.fast_dev_run > 0) {
    const int64_t n = o.fast_dev_run;
    if (!overfit) {
      o.limit_train_batches = n;
      o.limit_val_batches = n;
    }
    o.limit_test_batches = n;
    o.limit_predict_batches = n;
    o.max_steps = n;
    o.max_epochs = 1;
    o.num_sanity_val_steps = 0;
    o.val_check_interval = 1.0;
    o.check_val_every_n_epoch = 1;
  }
  if (overfit) {
    o.limit_train_batches = o.overfit_batches;
    o.limit_val_batches = o.overfit_batches;
  }
  if (o.fast_dev_run == 0) loggers_ = o.loggers;
  // Lightning's defaults: 1000 epochs unless a step limit is given.
  if (o.max_epochs) max_epochs_ = *o.max_epochs;
  else max_epochs_ = o.max_steps == -1 ? 1000 : -1;

  placement_ = strategies::resolve_placement(options_, "trainer");
  options_.devices = placement_.devices;
  strategy_ = placement_.strategy;
  // Lightning's Trainer(sync_batchnorm=True) gives its strategy the layer sync.
  if (o.sync_batchnorm) strategy_->set_sync_batchnorm(true);

  callbacks_ = o.callbacks;
  auto has = [&](auto* probe) {
    using T = std::remove_pointer_t<decltype(probe)>;
    for (const auto& c : callbacks_) {
      if (std::dynamic_pointer_cast<T>(c)) return true;
    }
    return false;
  };
  if (o.enable_progress_bar && !has(static_cast<trainer::ProgressBar*>(nullptr))) {
    callbacks_.push_back(std::make_shared<trainer::ProgressBar>());
  }
  if (o.enable_checkpointing && !has(static_cast<trainer::ModelCheckpoint*>(nullptr))) {
    callbacks_.push_back(std::make_shared<trainer::ModelCheckpoint>());
  }
  if (o.max_time && !has(static_cast<trainer::Timer*>(nullptr))) {
    callbacks_.push_back(std::make_shared<trainer::Timer>(*o.max_time));
  }
  results_ = std::make_unique<trainer::detail::Results>();
}

Trainer::~Trainer() {
  if (thread_ranks_) {
    try {
      thread_ranks_->job->teardown();  // on the ranks' threads, before their Trainers go
    } catch (const std::exception& e) {
      log::error("[trainer] teardown failed: ", e.what());
    }
    thread_ranks_.reset();
  }
  if (module_) module_->trainer_ = nullptr;
  if (owns_environment_ && strategy_->launched()) {
    try {
      strategy_->teardown();
    } catch (const std::exception& e) {
      log::error("[trainer] teardown failed: ", e.what());
    }
  }
}

std::shared_ptr<trainer::ModelCheckpoint> Trainer::checkpoint_callback() const {
  for (const auto& c : callbacks_) {
    if (auto m = std::dynamic_pointer_cast<trainer::ModelCheckpoint>(c)) return m;
  }
  return nullptr;
}

// ---- fit ---------------------------------------------------------------------------

void Trainer::fit(std::shared_ptr<TrainModule> module, const DataSource& train, const std::optional<DataSource>& val,
                  const std::string& ckpt_path) {
  launch(module, [&](Trainer& rank, const std::shared_ptr<TrainModule>& m) { rank.run_fit(m, train, val, ckpt_path); });
}

void Trainer::run_fit(std::shared_ptr<TrainModule> module, const DataSource& train,
                      const std::optional<DataSource>& val, const std::string& ckpt_path) {
  attach(std::move(module), "fit");
  // Note [Stopping on a signal] (runtime/stop_signal.cpp).
  std::optional<runtime::StopSignalScope> signals;
  stop_signal_ = 0;
  if (options_.stop_on_signals) {
    runtime::clear_stop_signal();
    signals.emplace();
  }
  try {
    run_training(train, val, ckpt_path);
  } catch (const std::exception& e) {
    each_callback([&](trainer::Callback& c) { c.on_exception(*this, *module_, e); });
    detach("fit", "failed");
    throw;
  }
  if (stop_signal_ != 0) {
    detach("fit", "interrupted");
    throw Interrupted(detail::cat("[trainer] stopped by ", runtime::stop_signal_name(stop_signal_), " after step ",
                                  global_step_, " (epoch ", epoch_, "); the callbacks saved what they save at the "
                                  "end of training (ModelCheckpoint: this step)"),
                      stop_signal_);
  }
  detach("fit", "success");
}

void Trainer::agree_on_stop_signal() {
  // Every rank votes after the same step, so all stop after it together,
  // and with the same signal: one sent to every task (srun, a pod's
  // SIGTERM) may reach a rank only after the vote, and a rank that
  // guessed would exit with another code and skip SIGUSR1's requeue.
  // A stop outranks SIGUSR1's save-and-requeue: SIGTERM, SIGINT, SIGUSR1.
  const int mine = runtime::pending_stop_signal();
  const int vote = mine == 0 ? 0 : mine == SIGUSR1 ? 1 : mine == SIGINT ? 2 : 3;
  const at::Tensor votes = at::scalar_tensor(static_cast<double>(vote), at::kFloat);
  const int agreed = static_cast<int>(strategy_->all_reduce(votes, comm::ReduceOp::kMax).item<float>() + 0.5f);
  if (agreed <= 0) return;
  stop_signal_ = agreed == 1 ? SIGUSR1 : agreed == 2 ? SIGINT : SIGTERM;
  should_stop = true;
  if (is_global_zero()) {
    log::warning("[trainer] ", runtime::stop_signal_name(stop_signal_), ": stopping after step ", global_step_,
                 " and saving; a second SIGINT or SIGTERM stops at once without saving");
  }
}

bool Trainer::step_limit_reached() const { return options_.max_steps >= 0 && global_step_ >= options_.max_steps; }

bool Trainer::validates_this_epoch() const {
  const std::optional<int64_t>& every = options_.check_val_every_n_epoch;
  return num_val_batches_ > 0 && (!every || (epoch_ + 1) % *every == 0);
}

void Trainer::run_training(const DataSource& train, const std::optional<DataSource>& val,
                           const std::string& ckpt_path) {
  std::shared_ptr<data::Loader> train_loader = make_loader(train, true, "training");
  std::shared_ptr<data::Loader> val_loader = val ? make_loader(*val, false, "validation") : nullptr;
  train_is_dataset_ = train.dataset() != nullptr;
  epoch_ = 0;
  global_step_ = 0;
  resume_position_ = 0;
  resume_path_.clear();
  stopped_inside_epoch_ = false;
  validations_run_ = 0;
  batch_stepped_ = false;
  num_val_batches_ = val_loader ? options_.limit_val_batches.of(static_cast<int64_t>(val_loader->size())) : 0;
  if (!ckpt_path.empty()) {
    std::string path = resolve_ckpt_path(ckpt_path);
    if (!path.empty()) restore(path, /*training=*/true);
  }
  if (is_global_zero()) {
    for (const auto& logger : loggers_) logger->log_hyperparams(module_->hparams());
  }
  each_callback([&](trainer::Callback& c) { c.on_fit_start(*this, *module_); });
  module_->on_fit_start();
  const int64_t sanity_batches =
      options_.num_sanity_val_steps == -1 ? num_val_batches_ : std::min(options_.num_sanity_val_steps, num_val_batches_);
  if (sanity_batches > 0) run_validation(*val_loader, sanity_batches, /*sanity=*/true);
  // limit_train_batches=0 turns training off (Lightning skips the fit loop
  // and its hooks); data that yields no batch is an error (train_one_epoch).
  if (options_.limit_train_batches.value != 0) {
    each_callback([&](trainer::Callback& c) { c.on_train_start(*this, *module_); });
    module_->on_train_start();
    module_->train();
    while (!should_stop) {
      if (max_epochs_ >= 0 && epoch_ >= max_epochs_) break;
      if (step_limit_reached()) break;
      const bool finished = train_one_epoch(*train_loader, val_loader.get());
      if (!finished) {
        // Note [Epochs stopped inside]: Lightning ends a stopped epoch as
        // any other and counts it, so current_epoch() says the next one;
        // epoch_ keeps the loop position, which a checkpoint saved from
        // here on (on_train_end) resumes from.
        stopped_inside_epoch_ = true;
        break;
      }
      // The next epoch has not begun: a checkpoint from here on (on_train_end)
      // resumes at its first batch.
      ++epoch_;
      batch_in_epoch_ = 0;
      epoch_done_ = false;
    }
    module_->on_train_end();
    each_callback([&](trainer::Callback& c) { c.on_train_end(*this, *module_); });
  }
  module_->on_fit_end();
  each_callback([&](trainer::Callback& c) { c.on_fit_end(*this, *module_); });
}

bool Trainer::train_one_epoch(data::Loader& loader, data::Loader* val_loader) {
  const int64_t n = options_.limit_train_batches.of(static_cast<int64_t>(loader.size()));
  STRATA_CHECK(n > 0, ConfigError, "[trainer] the training data yields no batch on rank ", global_rank(), " (",
               loader.size(), " batches, limit_train_batches ", options_.limit_train_batches.value,
               "); give more data or a smaller batch_size");
  num_training_batches_ = n;
  // Note [When validation runs]
  // As Lightning's _should_check_val_fx: after every val_every-th batch of
  // the epoch (of the run with check_val_every_n_epoch=None), and only
  // then: the epoch's last batch validates only when the interval divides
  // it (a fraction f validates after each floor(f * n) batches, so 1/3 of
  // 64 runs after batches 21, 42 and 63). And after the batch in whose
  // hooks something set should_stop (a Timer, a callback), so a run that
  // stops has a validation of its last state.
  const BatchLimit& vci = options_.val_check_interval;
  int64_t val_every = vci.fraction ? std::max<int64_t>(1, static_cast<int64_t>(std::floor(vci.value * n)))
                                   : static_cast<int64_t>(vci.value);
  const bool across_epochs = !options_.check_val_every_n_epoch;
  STRATA_CHECK(across_epochs || vci.fraction || val_every <= n || !val_loader, ConfigError,
               "[trainer] val_check_interval (", val_every, ") is more than the training batches per epoch (", n,
               "); lower it, pass a fraction of the epoch, or set check_val_every_n_epoch to std::nullopt "
               "(Lightning's None) to count batches across epochs");
  const bool validate_this_epoch = val_loader && validates_this_epoch();

  // Position: a resumed epoch continues after the batches it had done.
  const int64_t position = checked_resume_position(n);
  loader.set_epoch(static_cast<uint64_t>(epoch_));
  if (position > 0 && loader.resumable()) loader.load_state({static_cast<uint64_t>(epoch_), static_cast<uint64_t>(position)});
  loader.reset();
  if (position > 0 && !loader.resumable()) {
    for (int64_t i = 0; i < position; ++i) loader.next();
  }
  batch_in_epoch_ = position;
  epoch_done_ = false;
  results_->reset();
  if (position > 0 && !resume_results_.is_null()) {
    results_->load_epoch_state(resume_results_, global_rank(), "the restored checkpoint");
  }
  resume_results_ = nlohmann::json();
  step_loss_ = at::zeros({}, at::kFloat);
  step_loss_weighted_ = at::zeros({}, at::kFloat);

  each_callback([&](trainer::Callback& c) { c.on_train_epoch_start(*this, *module_); });
  module_->on_train_epoch_start();
  bool stopped = false;
  while (batch_in_epoch_ < n) {
    std::optional<data::Batch> batch = loader.next();
    if (!batch) break;
    const int64_t idx = batch_in_epoch_;
    const bool last_of_step = (idx + 1) % options_.accumulate_grad_batches == 0 || idx + 1 == n;
    runtime::report_step(global_step_ + 1);
    each_callback([&](trainer::Callback& c) { c.on_train_batch_start(*this, *module_, *batch, idx); });
    module_->on_train_batch_start(*batch, idx);
    training_batch(*batch, idx, last_of_step);
    batch_in_epoch_ = idx + 1;
    batch_stepped_ = last_of_step;
    // Note [Values logged in on_train_batch_end]: what the module logs in
    // its on_train_batch_end belongs to this batch, as in Lightning: the
    // callbacks after it see it in callback_metrics, and it reaches the
    // loggers in this step's row.
    collect_step_metrics();
    module_->on_train_batch_end(last_batch_loss_, *batch, idx);
    collect_step_metrics();
    each_callback([&](trainer::Callback& c) { c.on_train_batch_end(*this, *module_, last_batch_loss_, *batch, idx); });
    collect_step_metrics();
    log_step_metrics(last_of_step);
    if (last_of_step && options_.stop_on_signals && stop_signal_ == 0) agree_on_stop_signal();
    // Note [When validation runs]; a run stopping on a signal saves
    // without validating first (its time may be short).
    const int64_t batches_counted = across_epochs ? epoch_ * n + batch_in_epoch_ : batch_in_epoch_;
    if (validate_this_epoch && stop_signal_ == 0 && (should_stop || batches_counted % val_every == 0)) {
      run_validation(*val_loader, num_val_batches_);
    }
    batch_stepped_ = false;
    if (should_stop || step_limit_reached()) {
      stopped = batch_in_epoch_ < n;
      break;
    }
  }
  // Epoch end (also when stopped inside it, as Lightning does).
  trainer::Metrics log, bar, all;
  results_->reduce_epoch(*strategy_, log, bar, all);
  for (const auto& [k, v] : all) callback_metrics_[k] = v;
  for (const auto& [k, v] : bar) progress_bar_metrics_[k] = v;
  if (!log.empty()) log_to_loggers(log, std::max<int64_t>(global_step_ - 1, 0));
  epoch_done_ = batch_in_epoch_ >= n;
  // Note [Epoch schedulers before the epoch-end hooks]
  // Epoch-interval schedulers step before on_train_epoch_end, so a
  // checkpoint saved there holds the rates of the next epoch and a run
  // resumed from it sets the same rates as one that went on.
  if (epoch_done_) {
    for (auto& s : schedulers_) {
      if (s.interval == "epoch" && (epoch_ + 1) % s.frequency == 0) s.scheduler->step();
    }
  }
  each_callback([&](trainer::Callback& c) { c.on_train_epoch_end(*this, *module_); });
  module_->on_train_epoch_end();
  if (is_global_zero()) {
    for (const auto& logger : loggers_) logger->save();
  }
  return !stopped;
}

void Trainer::training_batch(const data::Batch& batch, int64_t batch_idx, bool last_of_step) {
  current_batch_size_ = batch.examples();
  current_share_ = batch.share(world_size());
  struct ShareReset {
    double& share;
    ~ShareReset() { share = 1.0; }
  } share_reset{current_share_};
  in_training_step_ = true;
  at::Tensor loss;
  {
    strategies::Scope no_sync = strategy_->no_backward_sync(*module_, !last_of_step);
    {
      strategies::Precision::ForwardContext autocast(strategy_->precision());
      // Note [Steps through the root's forward].
      hooked_forward(*module_, batch.input, [&](const at::Tensor&) {
        loss = module_->training_step(batch, batch_idx);
        return loss.defined() ? loss : at::zeros({});
      });
    }
    in_training_step_ = false;
    STRATA_CHECK(loss.defined(), ConfigError, "[trainer] training_step returned no loss (an undefined tensor) at epoch ",
                 epoch_, ", batch ", batch_idx, "; return the loss tensor to backpropagate");
    STRATA_CHECK(loss.numel() == 1, ConfigError, "[trainer] training_step must return a scalar loss, got shape ",
                 loss.sizes(), " at epoch ", epoch_, ", batch ", batch_idx, "; reduce it first, e.g. loss.mean()");
    STRATA_CHECK(loss.requires_grad(), ConfigError,
                 "[trainer] the loss training_step returned does not require grad (epoch ", epoch_, ", batch ",
                 batch_idx, "): it is not computed from the module's trainable parameters, or was detached");
    check_loss(loss, batch_idx);
    at::Tensor scaled = loss.to(at::kFloat) / static_cast<double>(options_.accumulate_grad_batches);
    // Note [Unequal shares]: a rank holding n_r of an uneven global batch
    // of m examples weights its mean loss by n_r * N / m (0 for a filler
    // batch), so the mean over ranks that DDP and FSDP take of the
    // gradients is the gradient of the global batch's mean loss.
    at::Tensor weighted = current_share_ == 1.0 ? scaled : scaled * current_share_;
    strategy_->backward(weighted);
    accumulate(step_loss_, scaled);
    accumulate(step_loss_weighted_, weighted);
  }
  last_batch_loss_ = loss.detach();
  if (last_of_step) optimizer_step();
  end_step(last_of_step);
}

void Trainer::end_step(bool stepped) {
  // Note [No reads inside a lazy step] (strategies/accelerator.h): the
  // step ends here (on a lazy device it runs, and throws
  // deferred_loss_message for a non-finite loss), then the values it
  // computed are read.
  strategy_->mark_step();
  if (stepped) read_step_loss();
  results_->settle(*strategy_);
  warn_about_recompiles();
}

void Trainer::accumulate(at::Tensor& sum, const at::Tensor& loss) const {
  // The sum stays on the loss's device, read once the step ended.
  const at::Tensor value = loss.detach().to(at::kFloat);
  sum = sum.device() == value.device() ? sum + value : value + sum.to(value.device());
}

void Trainer::check_loss(const at::Tensor& loss, int64_t batch_idx) {
  // Note [NaN loss]
  // Every rank votes; one non-finite loss stops all of them before the
  // backward, so no step is taken with it and nothing is saved after the
  // last good step: the checkpoints on disk stay as they were. On a device
  // that reads nothing inside a step the check is deferred to the step's
  // end, registered before any check of the step's gradients, so that it
  // is the one reported.
  const strategies::Accelerator& accelerator = strategy_->accelerator();
  if (!accelerator.reads_inside_step()) {
    accelerator.check_at_step_end(loss.detach().isfinite(), deferred_loss_message(batch_idx));
    return;
  }
  const double value = loss.detach().to(at::kDouble).item<double>();
  const bool bad = !std::isfinite(value);
  if (!strategy_->reduce_boolean_decision(bad, /*all=*/false)) return;
  throw Error(detail::cat("[trainer] the loss is ", bad ? (std::isnan(value) ? "NaN" : "infinite") : "non-finite",
                          bad ? "" : " on another rank", " at step ", global_step_ + 1, " (epoch ", epoch_, ", batch ",
                          batch_idx, "); training stopped before that step, so the last checkpoint saved stays "
                          "untouched. Lower the learning rate or clip gradients (gradient_clip_val)"));
}

std::string Trainer::deferred_loss_message(int64_t batch_idx) const {
  return detail::cat("[trainer] the loss is NaN or infinite at step ", global_step_ + 1, " (epoch ", epoch_,
                     ", batch ", batch_idx, "); on the ", strategy_->accelerator().name(),
                     " device the loss is read after the step ran (Note [No reads inside a lazy step]), so the model "
                     "in memory took that step, but training stopped before anything was saved after it: the last "
                     "checkpoint saved stays untouched. Lower the learning rate or clip gradients "
                     "(gradient_clip_val)");
}

void Trainer::read_step_loss() {
  // A download (on a lazy device the step has run); a convert there would
  // be a program of its own.
  last_loss_ = finished_loss_.cpu().item<double>();
  last_loss_weighted_ = finished_loss_weighted_.cpu().item<double>();
}

void Trainer::warn_about_recompiles() {
  // Note [Recompiles after the warm-up]: a steady loop compiles its
  // programs in its first two steps; a compile later means the step
  // changed (a shape, an op, a constant) and each such step pays a compile.
  // An eager device compiles none.
  const strategies::Accelerator::CompiledPrograms programs = strategy_->accelerator().compiled_programs();
  // With ranks as threads the counts are the process's: rank 0 speaks.
  if (global_step_ > 2 && programs.count > compiles_seen_ && !programs.last_reason.empty() && is_global_zero()) {
    log::warning("[trainer] the ", strategy_->accelerator().name(), " device compiled a new program at step ",
                 global_step_, ", after the warm-up steps (", programs.count - compiles_seen_, " new; ",
                 programs.count, " in all): ", programs.last_reason,
                 ". A step whose shapes or ops change compiles each time; keep batch shapes fixed (drop_last) "
                 "and read values only after the step");
  }
  compiles_seen_ = programs.count;
}

void Trainer::optimizer_step() {
  for (const auto& optimizer : optimizers_) {
    each_callback([&](trainer::Callback& c) { c.on_before_optimizer_step(*this, *module_, *optimizer); });
    module_->on_before_optimizer_step(*optimizer);
  }
  if (options_.gradient_clip_val && *options_.gradient_clip_val > 0) {
    if (options_.gradient_clip_algorithm == "norm") {
      strategy_->clip_gradients_norm(*module_, *optimizers_.front(), *options_.gradient_clip_val);
    } else {
      strategy_->clip_gradients_value(*module_, *optimizers_.front(), *options_.gradient_clip_val);
    }
  }
  for (const auto& optimizer : optimizers_) strategy_->optimizer_step(*optimizer);
  for (const auto& optimizer : optimizers_) optimizer->zero_grad();
  ++global_step_;
  finished_loss_ = step_loss_;
  finished_loss_weighted_ = step_loss_weighted_;
  step_loss_ = at::zeros({}, at::kFloat);
  step_loss_weighted_ = at::zeros({}, at::kFloat);
  for (auto& s : schedulers_) {
    if (s.interval == "step" && global_step_ % s.frequency == 0) s.scheduler->step();
  }
}

}  // namespace strata
