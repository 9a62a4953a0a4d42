// ModelCheckpoint: saves the Trainer's checkpoint at intervals and keeps
// the top k by a monitored metric (Lightning's ModelCheckpoint).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "strata/loggers/logger.h"
#include "strata/trainer/callback.h"

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

}  // namespace strata::trainer
