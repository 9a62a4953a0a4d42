// The Trainer: options, the state it shows callbacks and modules, and
// the calls (fit, validate, test, predict) around its loops, which are in
// loops/ (fit_loop.cpp, training_epoch_loop.cpp, evaluation_loop.cpp,
// predict_loop.cpp). The launch and set-up are in trainer_setup.cpp,
// checkpoints in trainer_checkpoint.cpp, the logged metrics' way to the
// loggers in trainer_logging.cpp.
#include "strata/trainer/trainer.h"

#include <ATen/ATen.h>

#include <cmath>
#include <optional>

#include "loops/evaluation_loop.h"
#include "loops/fit_loop.h"
#include "loops/predict_loop.h"
#include "strata/core/error.h"
#include "strata/core/interrupted.h"
#include "strata/core/log.h"
#include "strata/runtime/stop_signal.h"
#include "strata/strategies/make_strategy.h"
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

// ConfigError naming the first field of `o` out of its range.
void check_options(const TrainerOptions& o) {
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
}

// Note [Debug runs]
// As Lightning's Trainer: fast_dev_run=n runs n batches of every loop, one
// epoch and n steps at most, with no sanity validation, validation after
// the epoch, and no logging or checkpointing; overfit_batches replaces
// the training and validation limits (and, in make_loader, turns the
// shuffle off), also under fast_dev_run.
void apply_debug_runs(TrainerOptions& o) {
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
}

}  // namespace

Trainer::Trainer(TrainerOptions options) : options_(std::move(options)) {
  TrainerOptions& o = options_;
  check_options(o);
  apply_debug_runs(o);  // Note [Debug runs]
  if (o.fast_dev_run == 0) loggers_ = o.loggers;

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
  make_loops();
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
  if (options_.stop_on_signals) {
    runtime::clear_stop_signal();
    signals.emplace();
  }
  try {
    fit_loop_->run(train, val, ckpt_path);
  } catch (const std::exception& e) {
    each_callback([&](trainer::Callback& c) { c.on_exception(*this, *module_, e); });
    detach("fit", "failed");
    throw;
  }
  if (const int signal = fit_loop_->stop_signal(); signal != 0) {
    detach("fit", "interrupted");
    throw Interrupted(detail::cat("[trainer] stopped by ", runtime::stop_signal_name(signal), " after step ",
                                  global_step(), " (epoch ", fit_loop_->epoch(), "); the callbacks saved what they "
                                  "save at the end of training (ModelCheckpoint: this step)"),
                      signal);
  }
  detach("fit", "success");
}

// ---- validate, test, predict ----------------------------------------------------

trainer::Metrics Trainer::validate(std::shared_ptr<TrainModule> module, const DataSource& data,
                                   const std::string& ckpt_path) {
  return run_evaluation(std::move(module), data, "validate", ckpt_path);
}

trainer::Metrics Trainer::test(std::shared_ptr<TrainModule> module, const DataSource& data,
                               const std::string& ckpt_path) {
  return run_evaluation(std::move(module), data, "test", ckpt_path);
}

trainer::Metrics Trainer::run_evaluation(std::shared_ptr<TrainModule> module, const DataSource& data,
                                         const std::string& stage, const std::string& ckpt_path) {
  trainer::Metrics metrics;
  launch(module, [&](Trainer& rank, const std::shared_ptr<TrainModule>& m) {
    trainer::Metrics out = rank.evaluate_here(m, data, stage, ckpt_path);
    if (&rank == this) metrics = out;
  });
  return metrics;
}

trainer::Metrics Trainer::evaluate_here(std::shared_ptr<TrainModule> module, const DataSource& data,
                                        const std::string& stage, const std::string& ckpt_path) {
  attach(std::move(module), stage);
  trainer::Metrics metrics;
  try {
    if (!ckpt_path.empty()) {
      std::string path = resolve_ckpt_path(ckpt_path);
      if (!path.empty()) restore(path, /*training=*/false);
    }
    metrics = evaluation_loop_->run(data, stage);
  } catch (const std::exception& e) {
    each_callback([&](trainer::Callback& c) { c.on_exception(*this, *module_, e); });
    detach(stage, "failed");
    throw;
  }
  detach(stage, "success");
  return metrics;
}

at::Tensor Trainer::predict(std::shared_ptr<TrainModule> module, const DataSource& data,
                            const std::string& ckpt_path) {
  // Each rank's own rows (an undefined tensor for thread ranks other than
  // this one's: they stay on their threads).
  at::Tensor result;
  launch(module, [&](Trainer& rank, const std::shared_ptr<TrainModule>& m) {
    at::Tensor out = rank.predict_here(m, data, ckpt_path);
    if (&rank == this) result = out;
  });
  return result;
}

at::Tensor Trainer::predict_here(std::shared_ptr<TrainModule> module, const DataSource& data,
                                 const std::string& ckpt_path) {
  // Note [Prediction order] in loops/predict_loop.cpp.
  STRATA_CHECK(data.dataset() != nullptr || world_size() == 1, ConfigError,
               "[trainer] predict on ", world_size(), " ranks needs a DataSource built from a dataset, so the "
               "Trainer knows which example each rank's rows are (see Note [Prediction order])");
  attach(std::move(module), "predict");
  at::Tensor result;
  try {
    if (!ckpt_path.empty()) {
      std::string path = resolve_ckpt_path(ckpt_path);
      if (!path.empty()) restore(path, /*training=*/false);
    }
    result = predict_loop_->run(data);
  } catch (const std::exception& e) {
    each_callback([&](trainer::Callback& c) { c.on_exception(*this, *module_, e); });
    detach("predict", "failed");
    throw;
  }
  detach("predict", "success");
  return result;
}

// ---- state, for callbacks and modules -----------------------------------------------

void Trainer::make_loops() {
  fit_loop_ = std::make_unique<trainer::detail::FitLoop>(*this);
  evaluation_loop_ = std::make_unique<trainer::detail::EvaluationLoop>(*this);
  predict_loop_ = std::make_unique<trainer::detail::PredictLoop>(*this);
}

int64_t Trainer::current_epoch() const { return fit_loop_->current_epoch(); }

int64_t Trainer::global_step() const { return fit_loop_->epoch_loop().global_step(); }

int64_t Trainer::log_step() const {
  return std::max<int64_t>(global_step() - (fit_loop_->epoch_loop().batch_stepped() ? 1 : 0), 0);
}

bool Trainer::should_update_logs() const {
  return (log_step() + 1) % options_.log_every_n_steps == 0 || should_stop;
}

int Trainer::stop_signal() const { return fit_loop_->stop_signal(); }

bool Trainer::validation_has_run() const { return fit_loop_->validation_has_run(); }

int64_t Trainer::num_val_batches() const { return fit_loop_->num_val_batches(); }

bool Trainer::is_last_batch() const {
  const int64_t batches = num_training_batches();
  return batch_idx() >= batches && batches > 0;
}

bool Trainer::validates_this_epoch() const { return fit_loop_->validates_this_epoch(); }

int64_t Trainer::num_training_batches() const { return fit_loop_->epoch_loop().num_training_batches(); }

int64_t Trainer::batch_idx() const { return fit_loop_->epoch_loop().batch_idx(); }

double Trainer::last_loss() const { return fit_loop_->epoch_loop().last_loss(); }

double Trainer::last_loss_weighted() const { return fit_loop_->epoch_loop().last_loss_weighted(); }

}  // namespace strata
