// The Trainer's built-in callbacks: ModelCheckpoint (top-k by a metric,
// last, periodic), EarlyStopping, LearningRateMonitor, Timer (max_time)
// and the progress bar.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "strata/trainer/callback.h"
#include "strata/loggers/logger.h"

namespace strata::trainer {

/// ModelCheckpoint's settings (Lightning's arguments and defaults).
struct ModelCheckpointOptions {
  /// Folder of the checkpoints; "": the first logger's
  /// <log_dir>/checkpoints (e.g. runs/lightning_logs/version_0/checkpoints),
  /// or <default_root_dir>/checkpoints without a logger (Lightning's).
  std::string dirpath;
  /// Name template: "{epoch}-{val_loss:.2f}" makes "epoch=3-val_loss=0.52";
  /// "": "{epoch}-{step}". Formats: .Nf, .Ne, .Ng for reals, 0Nd for
  /// integers (epoch, step). file_extension is appended.
  std::string filename;
  std::string monitor;      ///< metric ranking the checkpoints; "": keep the latest
  std::string mode = "min";  ///< "min" or "max"
  /// Keep the k best by `monitor` (-1: all, 0: none); without a monitor,
  /// only 1 (the latest) or -1 make sense.
  int64_t save_top_k = 1;
  bool save_last = false;   ///< also keep "last.ckpt", the newest save
  int64_t every_n_train_steps = 0;  ///< save every N optimizer steps (0: off)
  /// Save every N epochs (0: off); by default at each validation end (or
  /// epoch end without validation) when every_n_train_steps is 0.
  std::optional<int64_t> every_n_epochs;
  /// "{step}" writes "step=12"; false writes just "12" (then put the names
  /// in the template yourself: "step-{step:08d}").
  bool auto_insert_metric_name = true;
  /// Appended to every checkpoint's name (and "last"); "ckpt_path='last'"
  /// looks for names with it.
  std::string file_extension = ".ckpt";

  ModelCheckpointOptions& with_dirpath(std::string d) { dirpath = std::move(d); return *this; }
  ModelCheckpointOptions& with_filename(std::string f) { filename = std::move(f); return *this; }
  ModelCheckpointOptions& with_monitor(std::string m) { monitor = std::move(m); return *this; }
  ModelCheckpointOptions& with_mode(std::string m) { mode = std::move(m); return *this; }
  ModelCheckpointOptions& with_save_top_k(int64_t k) { save_top_k = k; return *this; }
  ModelCheckpointOptions& with_save_last(bool s) { save_last = s; return *this; }
  ModelCheckpointOptions& with_every_n_train_steps(int64_t n) { every_n_train_steps = n; return *this; }
  ModelCheckpointOptions& with_every_n_epochs(int64_t n) { every_n_epochs = n; return *this; }
  ModelCheckpointOptions& with_auto_insert_metric_name(bool a) { auto_insert_metric_name = a; return *this; }
  ModelCheckpointOptions& with_file_extension(std::string e) { file_extension = std::move(e); return *this; }
};

/// Saves the Trainer's checkpoint at intervals and keeps the top k by a
/// monitored metric. Rank 0's metric values decide (broadcast to every
/// rank), so every rank saves and removes the same files; a file that
/// leaves the top k is removed through the strategy (local rank 0 of every
/// host). Saves are atomic (checkpoint/atomic.h).
class ModelCheckpoint : public Callback {
 public:
  /// Throws ConfigError for a bad mode, save_top_k < -1, negative
  /// intervals, or save_top_k > 1 without a monitor.
  explicit ModelCheckpoint(ModelCheckpointOptions options = {});
  std::string state_key() const override;
  const ModelCheckpointOptions& options() const { return options_; }

  /// Path of the best checkpoint so far ("" none).
  const std::string& best_model_path() const { return best_model_path_; }
  /// The monitored value of best_model_path(); empty before a checkpoint
  /// was ranked (Lightning's None), and without a monitor.
  const std::optional<double>& best_model_score() const { return best_model_score_; }
  /// Path of the newest "last" checkpoint ("" none).
  const std::string& last_model_path() const { return last_model_path_; }
  /// The top-k kept, by path: their monitored values.
  const std::map<std::string, double>& best_k_models() const { return best_k_; }
  /// The folder (after setup).
  const std::string& dirpath() const { return dirpath_; }
  /// The file name the template makes for these values (without ".ckpt").
  std::string format_name(int64_t epoch, int64_t step, const Metrics& metrics) const;

  void setup(Trainer& trainer, TrainModule& module, const std::string& stage) override;
  void on_train_batch_end(Trainer& trainer, TrainModule& module, const at::Tensor& loss, const data::Batch& batch,
                          int64_t batch_idx) override;
  void on_train_epoch_end(Trainer& trainer, TrainModule& module) override;
  void on_validation_end(Trainer& trainer, TrainModule& module) override;
  /// After a stop on a signal (Trainer::stop_signal()), saves that step.
  void on_train_end(Trainer& trainer, TrainModule& module) override;
  nlohmann::json state_dict() const override;
  /// Restores state_dict()'s value when its dirpath is this callback's
  /// folder (another folder's ranking is ignored). Throws CheckpointError
  /// for a malformed state (validate_model_checkpoint_state), a monitor
  /// other than its own, or a path that is not a checkpoint directly inside
  /// the folder (Note [Restored paths stay in the folder]).
  void load_state_dict(const nlohmann::json& state) override;

 private:
  // Note [When ModelCheckpoint saves] in model_checkpoint.cpp.
  bool skip_saving(Trainer& trainer) const;
  bool save_on_train_epoch_end(const Trainer& trainer) const;
  Metrics candidates(const Trainer& trainer) const;
  void save_top_k_checkpoint(Trainer& trainer, const Metrics& metrics);
  void save_last_checkpoint(Trainer& trainer, const Metrics& metrics);
  void write(Trainer& trainer, const std::string& path);
  bool better(double a, double b) const;
  void check_restored_path(const std::string& path, const std::string& field) const;

  ModelCheckpointOptions options_;
  std::string dirpath_;
  std::map<std::string, double> best_k_;
  std::string best_model_path_;
  std::optional<double> best_model_score_;
  std::string last_model_path_;
  int64_t last_saved_step_ = -1;
  bool saved_any_ = false;  ///< this callback wrote a file (not state: Lightning's _last_checkpoint_saved)
  bool defer_save_until_validation_ = false;
  bool warned_missing_ = false;
};

/// EarlyStopping's settings.
struct EarlyStoppingOptions {
  std::string monitor;
  double min_delta = 0.0;  ///< an improvement smaller than this does not count
  int64_t patience = 3;    ///< checks without improvement before stopping
  std::string mode = "min";
  /// Check at the end of each training epoch instead of each validation.
  bool check_on_train_epoch_end = false;

  EarlyStoppingOptions& with_monitor(std::string m) { monitor = std::move(m); return *this; }
  EarlyStoppingOptions& with_min_delta(double d) { min_delta = d; return *this; }
  EarlyStoppingOptions& with_patience(int64_t p) { patience = p; return *this; }
  EarlyStoppingOptions& with_mode(std::string m) { mode = std::move(m); return *this; }
  EarlyStoppingOptions& with_check_on_train_epoch_end(bool c) { check_on_train_epoch_end = c; return *this; }
};

/// Stops fit when `monitor` stops improving. Rank 0's value decides and is
/// broadcast, so every rank stops after the same step.
class EarlyStopping : public Callback {
 public:
  /// Throws ConfigError for an empty monitor, a bad mode, patience < 0.
  explicit EarlyStopping(EarlyStoppingOptions options);
  std::string state_key() const override;
  const EarlyStoppingOptions& options() const { return options_; }
  int64_t wait_count() const { return wait_; }
  double best_score() const { return best_; }
  /// The global step at which it stopped the run (-1: it did not).
  int64_t stopped_step() const { return stopped_step_; }
  /// The epoch in which it stopped the run (current_epoch when it decided);
  /// 0 when it did not, as Lightning's stopped_epoch.
  int64_t stopped_epoch() const { return stopped_epoch_; }

  void on_validation_end(Trainer& trainer, TrainModule& module) override;
  void on_train_epoch_end(Trainer& trainer, TrainModule& module) override;
  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;

 private:
  void check(Trainer& trainer);
  EarlyStoppingOptions options_;
  int64_t wait_ = 0;
  double best_;
  int64_t stopped_step_ = -1;
  int64_t stopped_epoch_ = 0;
  bool validated_ = false;  // a validation ended since the last epoch end
};

/// Logs every optimizer's learning rate ("lr-<Optimizer>", "/pg<i>" for
/// further param groups, or the scheduler's name), on rank 0, as
/// Lightning's LearningRateMonitor: with "step" at the start of each
/// training batch of a step whose values reach the loggers (every batch
/// of an accumulation window, every log_every_n_steps steps), with
/// "epoch" at the start of each epoch (Note [When the LR monitor logs]).
class LearningRateMonitor : public Callback {
 public:
  /// Throws ConfigError unless interval is "step" or "epoch".
  explicit LearningRateMonitor(std::string logging_interval = "step");
  std::string state_key() const override { return "LearningRateMonitor"; }
  /// The names and values it would log now.
  static Metrics learning_rates(const Trainer& trainer);
  void on_train_batch_start(Trainer& trainer, TrainModule& module, const data::Batch& batch,
                            int64_t batch_idx) override;
  void on_train_epoch_start(Trainer& trainer, TrainModule& module) override;

 private:
  std::string interval_;
};

/// Stops fit once `duration` of training time has passed (the Trainer's
/// max_time). Rank 0's clock decides and is broadcast. Time spent before a
/// resume counts (it is in the checkpoint).
class Timer : public Callback {
 public:
  explicit Timer(std::chrono::milliseconds duration);
  std::string state_key() const override { return "Timer"; }
  /// Training time so far, seconds.
  double time_elapsed() const;
  void on_train_start(Trainer& trainer, TrainModule& module) override;
  void on_train_end(Trainer& trainer, TrainModule& module) override;
  void on_train_batch_end(Trainer& trainer, TrainModule& module, const at::Tensor& loss, const data::Batch& batch,
                          int64_t batch_idx) override;
  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;

 private:
  std::chrono::milliseconds duration_;
  double offset_s_ = 0.0;
  std::optional<std::chrono::steady_clock::time_point> start_;
};

/// Progress on global rank 0: on a terminal one line redrawn in place
/// (epoch, step, loss, prog_bar metrics, rate, ETA); otherwise a plain
/// line every log_every_n_steps steps and at each epoch end. The loss is
/// the prog_bar value "train_loss" when the module logs one (the value
/// the loggers get), else the rank's Trainer::last_loss().
class ProgressBar : public Callback {
 public:
  /// `out_is_terminal`: nullopt asks isatty(stdout) or STRATA_LAUNCHER_TTY.
  explicit ProgressBar(std::optional<bool> out_is_terminal = std::nullopt);
  std::string state_key() const override { return "ProgressBar"; }
  /// The text of the progress line for the trainer's current state.
  static std::string line(const Trainer& trainer, double steps_per_s, double eta_s);
  void on_train_start(Trainer& trainer, TrainModule& module) override;
  void on_train_batch_end(Trainer& trainer, TrainModule& module, const at::Tensor& loss, const data::Batch& batch,
                          int64_t batch_idx) override;
  void on_train_epoch_end(Trainer& trainer, TrainModule& module) override;
  void on_validation_end(Trainer& trainer, TrainModule& module) override;
  void on_train_end(Trainer& trainer, TrainModule& module) override;

 private:
  void print(const std::string& text, bool final_line);
  bool tty_;
  bool line_open_ = false;
  std::chrono::steady_clock::time_point start_;
  int64_t first_step_ = 0;
  int64_t last_printed_step_ = -1;
};

}  // namespace strata::trainer
