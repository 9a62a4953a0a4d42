// strata::Trainer: runs the training, validation, test and prediction
// loops over a TrainModule (the Lightning Trainer's role), on the same
// strategies Fabric uses (ddp, fsdp, single_device, and xla and xla_fsdp on
// several xla devices), with callbacks, loggers and checkpoints.
//
//   strata::Trainer trainer(strata::TrainerOptions()
//                               .with_devices(2).with_strategy("ddp").with_max_epochs(3)
//                               .with_logger(strata::trainer::make_logger("csv", "runs")));
//   trainer.fit(module, strata::DataSource(train_set, strata::DataOptions().with_batch_size(32)
//                                                         .with_shuffle(true)),
//               strata::DataSource(val_set, strata::DataOptions().with_batch_size(32)));
//
// Process model (Note [One launch protocol], strategies/placement.h): in a
// program started by a launcher (strata launch, torchrun-style variables,
// MPI, SLURM) or with one device, every call runs in place. With several
// devices and no launcher, the first call makes this process rank 0 and
// re-runs the program as the other ranks (Note [The launching process is
// rank 0] in strategies/launchers/subprocess.h): the whole program, so
// code before that call runs in every rank too, and every Trainer call runs
// on every rank, in place, with that rank's own results (fit's
// global_step and metrics, the metrics validate and test return, predict's
// rows). A worker's failure stops the others and throws LaunchError in
// rank 0.
//
// Note [The Trainer's ranks as threads]
// An accelerator that drives its devices from one process (xla with
// devices=N: Note [Ranks as threads] in strategies/xla.h) runs the job's
// ranks as threads of the calling process, and every Trainer call runs on
// all of them, in place. Rank 0 is this Trainer and the module the caller
// passed. Rank r gets what a worker process would get from Lightning's
// launcher, which pickles the module and the callbacks to each process: a
// Trainer of its own (the same options, its rank's strategy, the loggers
// shared, since only rank 0 writes to them), a copy of each callback, and
// a module built by TrainerOptions::module_factory into which the first
// module's weights and hyperparameters are copied. A callback is copied by
// its class's copy constructor: the built-in ones by the Trainer, a user's
// one when it was given to TrainerOptions::with_callback as a pointer to
// its class (which records how to copy it); what cannot be copied is
// refused, naming it. The copies and the modules are made at the first
// call, before any rank starts and without drawing from the CPU generator,
// so the run draws the numbers a one-process run would. The ranks keep
// their set-up modules and collectives from one call to the next, as
// worker processes do, until the Trainer is destroyed. After a call, this
// Trainer and its module hold rank 0's state.
#pragma once

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include "strata/data/dataset.h"
#include "strata/data/loader.h"
#include "strata/data/torch_dataset.h"
#include "strata/strategies/make_strategy.h"
#include "strata/strategies/placement.h"
#include "strata/strategies/strategy.h"
#include "strata/trainer/callback.h"
#include "strata/loggers/logger.h"
#include "strata/trainer/train_module.h"

namespace strata {

/// A number of batches (an integer) or a fraction of a loader (a real in
/// [0, 1]): limit_*_batches and val_check_interval, as in Lightning.
struct BatchLimit {
  double value = 1.0;
  bool fraction = true;
  BatchLimit(int batches) : value(batches), fraction(false) {}
  BatchLimit(int64_t batches) : value(static_cast<double>(batches)), fraction(false) {}
  BatchLimit(double fraction_of_loader) : value(fraction_of_loader), fraction(true) {}
  /// The number of batches of a loader of `size` batches this limit allows.
  int64_t of(int64_t size) const;
};

namespace trainer::detail {
/// A copy of `callback` made by C's copy constructor when `callback` is
/// of class C itself (a subclass would be sliced) and C is copyable; null
/// otherwise (Note [The Trainer's ranks as threads]).
template <class C>
CallbackPtr copy_as(const Callback& callback) {
  if constexpr (std::is_copy_constructible_v<C>) {
    if (typeid(callback) == typeid(C)) return std::make_shared<C>(static_cast<const C&>(callback));
  }
  return nullptr;
}
}  // namespace trainer::detail

/// How the Trainer builds a loader from a dataset (data/loader.h).
using DataOptions = data::DataOptions;

/// The data of one loop: a dataset the Trainer splits among the ranks (a
/// distributed sampler; needed by predict, and to resume at another world
/// size), or a loader the caller made for this rank.
class DataSource {
 public:
  DataSource(std::shared_ptr<const data::Dataset> dataset, DataOptions options = {})
      : dataset_(std::move(dataset)), options_(options) {}
  /// A `torch::data` dataset (data/torch_dataset.h), moved in and split
  /// among the ranks as any dataset.
  template <class TorchData, class = std::enable_if_t<data::is_torch_dataset_v<TorchData>>>
  DataSource(TorchData dataset, DataOptions options = {})
      : DataSource(data::from_torch(std::move(dataset)), options) {}
  DataSource(std::shared_ptr<data::Loader> loader) : loader_(std::move(loader)) {}
  const std::shared_ptr<const data::Dataset>& dataset() const { return dataset_; }
  const DataOptions& options() const { return options_; }
  const std::shared_ptr<data::Loader>& loader() const { return loader_; }

 private:
  std::shared_ptr<const data::Dataset> dataset_;
  DataOptions options_;
  std::shared_ptr<data::Loader> loader_;
};

/// How a Trainer runs: a Placement (accelerator, devices, num_nodes,
/// strategy, precision, seed, collective_timeout, with their with_x
/// setters) and the loops' settings. Fluent setters; validated by the
/// Trainer's constructor (ConfigError names the field). Defaults are
/// Lightning's, except that there is no default logger.
struct TrainerOptions : WithPlacement<TrainerOptions> {
  /// Epochs to train; unset with max_steps = -1: 1000 (Lightning's default).
  std::optional<int64_t> max_epochs;
  int64_t max_steps = -1;  ///< optimizer steps; -1: no limit
  /// Wall time to train for (a Timer callback stops the run after it).
  std::optional<std::chrono::milliseconds> max_time;
  /// Validate every this many training batches of the epoch (integer,
  /// at most the epoch's batches) or every max(1, floor(fraction * batches))
  /// batches (real); 1.0: at the end of each epoch. Only at those batches:
  /// an epoch whose batch count the interval does not divide ends without
  /// a validation of its own, as in Lightning.
  BatchLimit val_check_interval = 1.0;
  /// Validate on every n-th epoch (n >= 1). std::nullopt (Lightning's
  /// None, also kValidateAcrossEpochs): an integer val_check_interval
  /// counts training batches across epochs (every k-th batch of the run,
  /// whatever its epoch) instead of within each epoch.
  std::optional<int64_t> check_val_every_n_epoch = 1;
  /// Validation batches run before training starts, to catch a broken
  /// validation_step early (-1: all, 0: none). Their metrics are neither
  /// logged nor seen by callbacks that rank or stop (sanity_checking()).
  int64_t num_sanity_val_steps = 2;
  /// A quick run to find bugs (Lightning's fast_dev_run): n > 0 runs n
  /// training batches (one epoch, n steps at most), n validation, test
  /// and predict batches, no sanity validation, and suppresses logging and
  /// checkpointing (loggers get nothing, ModelCheckpoint and EarlyStopping
  /// do nothing). 0: off.
  int64_t fast_dev_run = 0;
  /// Trains and validates on the first batches only, unshuffled (a number
  /// or a fraction of each loader, as limit_*_batches): overrides
  /// limit_train_batches and limit_val_batches. 0.0: off.
  BatchLimit overfit_batches = 0.0;
  BatchLimit limit_train_batches = 1.0;
  BatchLimit limit_val_batches = 1.0;
  BatchLimit limit_test_batches = 1.0;
  BatchLimit limit_predict_batches = 1.0;
  int64_t accumulate_grad_batches = 1;
  std::optional<double> gradient_clip_val;           ///< unset: no clipping
  std::string gradient_clip_algorithm = "norm";       ///< "norm" or "value"
  int64_t log_every_n_steps = 50;
  std::string default_root_dir = ".";  ///< checkpoints go to <dir>/checkpoints
  bool enable_checkpointing = true;    ///< adds a ModelCheckpoint (save_last) when none is given
  bool enable_progress_bar = true;     ///< adds a ProgressBar when none is given
  /// Prints Lightning's model summary table (trainer/model_summary.h) at
  /// the start of fit, on global rank 0.
  bool enable_model_summary = true;
  /// Lightning's sync_batchnorm: the module's BatchNorm layers normalise
  /// over the global batch of all ranks (Strategy::sync_batchnorm; set on
  /// the strategy, a name or an object, as Lightning does).
  bool sync_batchnorm = false;
  /// Note [Stopping on a signal] (runtime/stop_signal.h): during fit,
  /// SIGINT, SIGTERM and SIGUSR1 stop every rank after the step it is in;
  /// the callbacks' on_train_end hooks run (ModelCheckpoint saves that
  /// step), the loggers close as "interrupted", and fit throws
  /// strata::Interrupted, whose exit_code() is 128 + the signal. false
  /// leaves the signals to the program.
  bool stop_on_signals = true;
  std::vector<trainer::CallbackPtr> callbacks;
  std::vector<trainer::LoggerPtr> loggers;
  /// Builds a new module as the one the calls are given was built (its
  /// class and layers), for each other rank of a job whose ranks are
  /// threads of this process (xla with devices > 1: Note [The Trainer's
  /// ranks as threads]); the Trainer copies the given module's weights and
  /// hyperparameters into it. Unused elsewhere; unset, such a job refuses
  /// the module with a message saying to set it.
  std::function<std::shared_ptr<TrainModule>()> module_factory;
  /// How each callback given to with_callback is copied for the other
  /// ranks of such a job, by its address (filled by with_callback; the
  /// built-in callbacks need no entry).
  std::map<const trainer::Callback*, std::function<trainer::CallbackPtr()>> callback_copiers;

  TrainerOptions& with_max_epochs(int64_t e) { max_epochs = e; return *this; }
  TrainerOptions& with_max_steps(int64_t s) { max_steps = s; return *this; }
  TrainerOptions& with_max_time(std::chrono::milliseconds t) { max_time = t; return *this; }
  TrainerOptions& with_val_check_interval(BatchLimit v) { val_check_interval = v; return *this; }
  TrainerOptions& with_check_val_every_n_epoch(std::optional<int64_t> n) { check_val_every_n_epoch = n; return *this; }
  TrainerOptions& with_num_sanity_val_steps(int64_t n) { num_sanity_val_steps = n; return *this; }
  TrainerOptions& with_fast_dev_run(int64_t n = 1) { fast_dev_run = n; return *this; }
  TrainerOptions& with_overfit_batches(BatchLimit b) { overfit_batches = b; return *this; }
  TrainerOptions& with_limit_train_batches(BatchLimit l) { limit_train_batches = l; return *this; }
  TrainerOptions& with_limit_val_batches(BatchLimit l) { limit_val_batches = l; return *this; }
  TrainerOptions& with_limit_test_batches(BatchLimit l) { limit_test_batches = l; return *this; }
  TrainerOptions& with_limit_predict_batches(BatchLimit l) { limit_predict_batches = l; return *this; }
  TrainerOptions& with_accumulate_grad_batches(int64_t a) { accumulate_grad_batches = a; return *this; }
  TrainerOptions& with_gradient_clip_val(double v) { gradient_clip_val = v; return *this; }
  TrainerOptions& with_gradient_clip_algorithm(std::string a) { gradient_clip_algorithm = std::move(a); return *this; }
  TrainerOptions& with_log_every_n_steps(int64_t n) { log_every_n_steps = n; return *this; }
  TrainerOptions& with_default_root_dir(std::string d) { default_root_dir = std::move(d); return *this; }
  TrainerOptions& with_enable_checkpointing(bool e) { enable_checkpointing = e; return *this; }
  TrainerOptions& with_enable_progress_bar(bool e) { enable_progress_bar = e; return *this; }
  TrainerOptions& with_enable_model_summary(bool e) { enable_model_summary = e; return *this; }
  TrainerOptions& with_sync_batchnorm(bool s) { sync_batchnorm = s; return *this; }
  TrainerOptions& with_stop_on_signals(bool s) { stop_on_signals = s; return *this; }
  /// Adds a callback; where the ranks are threads of this process, the
  /// other ranks get copies of it made by C's copy constructor (of the
  /// callback as it is at the first call), when C is the callback's own
  /// class and copyable.
  template <class C>
  TrainerOptions& with_callback(std::shared_ptr<C> c) {
    static_assert(std::is_base_of_v<trainer::Callback, C>, "with_callback takes a strata::trainer::Callback");
    if (c != nullptr) callback_copiers[c.get()] = [c] { return trainer::detail::copy_as<C>(*c); };
    callbacks.push_back(std::move(c));
    return *this;
  }
  TrainerOptions& with_callbacks(std::vector<trainer::CallbackPtr> c) { callbacks = std::move(c); return *this; }
  TrainerOptions& with_logger(trainer::LoggerPtr l) { loggers.push_back(std::move(l)); return *this; }
  TrainerOptions& with_loggers(std::vector<trainer::LoggerPtr> l) { loggers = std::move(l); return *this; }
  TrainerOptions& with_module_factory(std::function<std::shared_ptr<TrainModule>()> f) {
    module_factory = std::move(f);
    return *this;
  }
};

/// check_val_every_n_epoch's Lightning None: an integer val_check_interval
/// counts training batches across epochs.
inline constexpr std::nullopt_t kValidateAcrossEpochs = std::nullopt;

namespace trainer {
class ModelCheckpoint;
namespace detail {
class FitLoop;
class TrainingEpochLoop;
class EvaluationLoop;
class PredictLoop;
}  // namespace detail
}  // namespace trainer

/// The loops. One Trainer trains one module at a time, from one thread.
class Trainer {
 public:
  /// Validates `options` (ConfigError names the field) and builds the
  /// accelerator, precision, strategy and default callbacks. Starts nothing.
  explicit Trainer(TrainerOptions options = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// Trains `module` on `train`, validating on `val` when given. ckpt_path:
  /// "" (start fresh), a checkpoint directory, "last" (the newest last
  /// checkpoint of a ModelCheckpoint) or "best" (its best). Throws
  /// ConfigError for a ckpt_path that does not exist, for a
  /// configure_optimizers that returns no optimizer and for a step that
  /// returns no scalar loss; strata::Error when the loss becomes NaN or
  /// infinite (naming the step; nothing is saved after it).
  void fit(std::shared_ptr<TrainModule> module, const DataSource& train,
           const std::optional<DataSource>& val = std::nullopt, const std::string& ckpt_path = "");
  /// Runs validation_step over `data`; returns the metrics logged
  /// (reduced over the epoch) on every rank.
  trainer::Metrics validate(std::shared_ptr<TrainModule> module, const DataSource& data,
                            const std::string& ckpt_path = "");
  /// Runs test_step over `data`; as validate().
  trainer::Metrics test(std::shared_ptr<TrainModule> module, const DataSource& data,
                        const std::string& ckpt_path = "");
  /// Runs predict_step over `data` (a dataset: the Trainer splits it) and
  /// returns, on global rank 0, every example's prediction in dataset order
  /// (the rows of predict_step's outputs, concatenated); an undefined
  /// tensor on other ranks.
  at::Tensor predict(std::shared_ptr<TrainModule> module, const DataSource& data,
                     const std::string& ckpt_path = "");
  /// The same four for a module held by value (`LitNet module;
  /// trainer.fit(module, data);`): used in place, not owned, so keep it
  /// alive for the calls that use it (Note [Modules held by value] in
  /// strategies/strategy.h; a module that goes first is forgotten by the
  /// Trainer). ConfigError under a strategy that shards parameters (fsdp).
  void fit(TrainModule& module, const DataSource& train, const std::optional<DataSource>& val = std::nullopt,
           const std::string& ckpt_path = "") {
    fit(borrow(module), train, val, ckpt_path);
  }
  trainer::Metrics validate(TrainModule& module, const DataSource& data, const std::string& ckpt_path = "") {
    return validate(borrow(module), data, ckpt_path);
  }
  trainer::Metrics test(TrainModule& module, const DataSource& data, const std::string& ckpt_path = "") {
    return test(borrow(module), data, ckpt_path);
  }
  at::Tensor predict(TrainModule& module, const DataSource& data, const std::string& ckpt_path = "") {
    return predict(borrow(module), data, ckpt_path);
  }

  // ---- state, for callbacks and modules ------------------------------------
  /// The epoch running, or after fit the epochs begun: as Lightning, an
  /// epoch that was stopped inside (max_steps, should_stop) counts as ended,
  /// so a run stopped in its third epoch reports 3.
  int64_t current_epoch() const;
  /// Optimizer steps taken.
  int64_t global_step() const;
  /// The step a value handed to the loggers now is filed under
  /// (Lightning's _batches_that_stepped): the optimizer steps taken before
  /// the running batch's, so global_step - 1 after a batch that stepped
  /// (its on_train_batch_end hooks) and global_step before it
  /// (on_train_batch_start) or inside an accumulation window.
  int64_t log_step() const;
  /// Whether values logged now reach the loggers (Lightning's
  /// should_update_logs): the step being trained, log_step() + 1, is a
  /// multiple of log_every_n_steps, or should_stop is set.
  bool should_update_logs() const;
  /// Set to stop fit after the current batch (every rank must set it).
  bool should_stop = false;
  /// The signal that stopped fit (Note [Stopping on a signal]: SIGINT,
  /// SIGTERM or SIGUSR1, on every rank once they agreed), 0 when none did.
  /// Set from the step the ranks agreed to stop after, so on_train_end
  /// hooks see it.
  int stop_signal() const;
  /// "fit", "validate", "test", "predict" while running; "" otherwise.
  const std::string& state_fn() const { return stage_; }
  /// True inside the validation loop of fit (or validate()).
  bool validating() const { return validating_; }
  /// True during the sanity validation before training
  /// (num_sanity_val_steps); validating() is true then too.
  bool sanity_checking() const { return sanity_checking_; }
  /// Whether a validation (not a sanity one) has run in this fit.
  bool validation_has_run() const;
  /// Validation batches each validation of fit runs (after limits; 0:
  /// no validation data, or limited to none).
  int64_t num_val_batches() const;
  /// The batches fast_dev_run runs (0: off).
  int64_t fast_dev_run() const { return options_.fast_dev_run; }
  /// Whether the current training batch is the epoch's last.
  bool is_last_batch() const;
  /// Whether this epoch validates at all (validation data, and the epoch
  /// is a check_val_every_n_epoch-th one).
  bool validates_this_epoch() const;
  /// Latest metric values: step values during an epoch, epoch values after.
  const trainer::Metrics& callback_metrics() const { return callback_metrics_; }
  /// What was last handed to the loggers.
  const trainer::Metrics& logged_metrics() const { return logged_metrics_; }
  /// Values marked prog_bar.
  const trainer::Metrics& progress_bar_metrics() const { return progress_bar_metrics_; }
  /// Batches of the training loader per epoch (after limits), on this rank.
  int64_t num_training_batches() const;
  /// Training batches done in the current epoch.
  int64_t batch_idx() const;
  /// The loss of the last optimizer step on this rank (NaN before one).
  double last_loss() const;
  /// last_loss() weighted by this rank's share of the step's global
  /// batches (Note [Unequal shares] in data/distributed_sampler.h): its
  /// mean over the ranks is the loss of the global batch, also when ranks
  /// held unequal shares of it. Equal to last_loss() with equal shares.
  double last_loss_weighted() const;

  strategies::Strategy& strategy() { return *strategy_; }
  const TrainerOptions& options() const { return options_; }
  int global_rank() const { return strategy_->global_rank(); }
  int world_size() const { return strategy_->world_size(); }
  bool is_global_zero() const { return strategy_->is_global_zero(); }
  TrainModule* lightning_module() const { return module_.get(); }
  const std::vector<trainer::CallbackPtr>& callbacks() const { return callbacks_; }
  /// The loggers; none under fast_dev_run (Lightning's DummyLogger).
  const std::vector<trainer::LoggerPtr>& loggers() const { return loggers_; }
  /// The first logger, or null.
  trainer::LoggerPtr logger() const { return loggers_.empty() ? nullptr : loggers_.front(); }
  /// The optimizers and schedulers of configure_optimizers (after setup).
  const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers() const { return optimizers_; }
  const std::vector<trainer::SchedulerConfig>& lr_scheduler_configs() const { return schedulers_; }
  /// The first ModelCheckpoint callback, or null.
  std::shared_ptr<trainer::ModelCheckpoint> checkpoint_callback() const;

  /// Saves the Trainer's checkpoint (module, optimizers, schedulers, epoch,
  /// global step, loop position, callback states) to the directory
  /// `filepath`, atomically. Every rank must call it.
  void save_checkpoint(const std::string& filepath);

  /// Where the job runs: the accelerator, world, processes per host and
  /// devices per process resolved from the options.
  const strategies::ResolvedPlacement& placement() const { return placement_; }
  /// The checkpoint the last call restored (Lightning's ckpt_path); "" when
  /// none.
  const std::string& ckpt_path() const { return resume_path_; }

  // ---- used by TrainModule::log and by strategies::Strategy::setup ----------
  /// Records a logged value (TrainModule::log calls this).
  void record_log(const std::string& name, const at::Tensor& value, const LogOptions& options);
  /// Calls the module's configure_optimizers, checks and keeps the result.
  void configure_optimizers_from_module();
  /// Prepares the attached module through the strategy's public calls,
  /// once (setup_module), and in fit the optimizers of configure_optimizers
  /// (setup_optimizer): what Strategy::setup(trainer) does.
  void setup_strategy();

 private:
  /// A call of one rank: its Trainer and its module.
  using RankCall = std::function<void(Trainer&, const std::shared_ptr<TrainModule>&)>;
  struct ThreadRanks;

  /// A Trainer for another rank of a job whose ranks are threads (Note
  /// [The Trainer's ranks as threads]): `primary`'s options and copies of
  /// its callbacks, on `strategy`.
  Trainer(const Trainer& primary, std::shared_ptr<strategies::Strategy> strategy);
  /// Runs `call` with `module` on this process's rank through the
  /// strategy's launcher (Note [One launch protocol]): the subprocess
  /// launcher's first call makes this process rank 0 and starts the
  /// others. With ranks as threads, runs it on every rank.
  void launch(const std::shared_ptr<TrainModule>& module, const RankCall& call);
  /// strategies::module_pointer(module), refused where the strategy cannot borrow it.
  std::shared_ptr<TrainModule> borrow(TrainModule& module);
  /// Called by a module this Trainer uses as it is destroyed (a module held
  /// by value): the Trainer lets go of it without touching it.
  void forget_module(const TrainModule& module);
  friend class TrainModule;
  // The loops (src/trainer/loops/) run the module through the Trainer's
  // strategy, callbacks and metrics.
  friend class trainer::detail::FitLoop;
  friend class trainer::detail::TrainingEpochLoop;
  friend class trainer::detail::EvaluationLoop;
  friend class trainer::detail::PredictLoop;
  /// launch() for ranks as threads: rank r's Trainer and module made at
  /// the first call.
  void run_on_thread_ranks(const std::shared_ptr<TrainModule>& module, const RankCall& call);
  /// Makes this Trainer's fit, evaluation and predict loops.
  void make_loops();
  void run_fit(std::shared_ptr<TrainModule> module, const DataSource& train, const std::optional<DataSource>& val,
               const std::string& ckpt_path);
  trainer::Metrics evaluate_here(std::shared_ptr<TrainModule> module, const DataSource& data,
                                 const std::string& stage, const std::string& ckpt_path);
  at::Tensor predict_here(std::shared_ptr<TrainModule> module, const DataSource& data, const std::string& ckpt_path);
  void attach(std::shared_ptr<TrainModule> module, const std::string& stage);
  void detach(const std::string& stage, const std::string& status);
  std::shared_ptr<data::Loader> make_loader(const DataSource& source, bool train, const std::string& what);
  trainer::Metrics run_evaluation(std::shared_ptr<TrainModule> module, const DataSource& data,
                                  const std::string& stage, const std::string& ckpt_path);
  void log_to_loggers(const trainer::Metrics& metrics, int64_t step);
  /// The values logged since the last call into callback_metrics, the
  /// progress bar's and the loggers' pending row.
  void collect_step_metrics();
  /// Hands the pending row to the loggers after a step whose values
  /// reach them (should_update_logs()).
  void log_step_metrics(bool stepped);
  std::string resolve_ckpt_path(const std::string& ckpt_path);
  void restore(const std::string& path, bool training);
  template <class Fn>
  void each_callback(Fn&& fn) {
    for (const auto& c : callbacks_) fn(*c);
  }

  TrainerOptions options_;
  strategies::ResolvedPlacement placement_;
  std::unique_ptr<ThreadRanks> thread_ranks_;  // the other ranks, when ranks are threads
  std::shared_ptr<strategies::Strategy> strategy_;
  std::vector<trainer::CallbackPtr> callbacks_;
  std::shared_ptr<TrainModule> module_;
  bool module_set_up_ = false;
  bool owns_environment_ = false;
  std::vector<std::shared_ptr<torch::optim::Optimizer>> optimizers_;
  std::vector<trainer::SchedulerConfig> schedulers_;
  std::unique_ptr<trainer::detail::FitLoop> fit_loop_;
  std::unique_ptr<trainer::detail::EvaluationLoop> evaluation_loop_;
  std::unique_ptr<trainer::detail::PredictLoop> predict_loop_;
  std::string stage_;
  bool validating_ = false;
  bool sanity_checking_ = false;
  std::vector<trainer::LoggerPtr> loggers_;  // options_.loggers, or none under fast_dev_run
  std::string resume_path_;  // the checkpoint fit restored (for messages)
  int64_t current_batch_size_ = 0;
  double current_share_ = 1.0;  // the running batch's Batch::share (1 outside steps)
  trainer::Metrics callback_metrics_;
  trainer::Metrics logged_metrics_;
  trainer::Metrics progress_bar_metrics_;
  trainer::Metrics pending_step_metrics_;
};

// Lightning's Strategy.setup(trainer), declared with the strategies and
// defined here, with the Trainer whose public setup_strategy it calls.
inline void strategies::Strategy::setup(Trainer& trainer) { trainer.setup_strategy(); }

}  // namespace strata
