// TensorBoardLogger: Lightning's TensorBoardLogger in C++. Scalars go to
// TensorBoard event files (strata writes the format itself, see
// event_file.h) under Lightning's folder layout:
//
//   <root_dir>/<name>/version_<N>/events.out.tfevents.<time>.<host>.<pid>.<n>
//   <root_dir>/<name>/version_<N>/hparams.yaml
//
// N is the `version` given, else one more than the largest version_<K>
// folder already there (0 when none), as Lightning picks it. An empty
// `name` drops that level. `tensorboard --logdir <root_dir>/<name>` shows
// every version as a run.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "strata/loggers/event_file.h"
#include "strata/trainer/hparams.h"
#include "strata/loggers/logger.h"

namespace strata::trainer {

/// Writes metrics as TensorBoard scalars and hyperparameters as
/// hparams.yaml. Call it on global rank 0 only (the Trainer does).
class TensorBoardLogger : public Logger {
 public:
  /// Chooses the run folder (nothing is created until the first write).
  /// Throws ConfigError when `name` is not a plain folder name (".", "..",
  /// '/', NUL, over 255 bytes), `root_dir` is empty, `version` is
  /// negative, or the versions already there cannot be listed.
  /// default_hp_metric (Lightning's option and default): log_hyperparams
  /// also logs the scalar "hp_metric" = -1 at step 0 and names it as the
  /// HPARAMS tab's metric; false writes the hyperparameters to hparams.yaml
  /// only, as Lightning does without metrics.
  explicit TensorBoardLogger(std::string root_dir, std::string name = "lightning_logs",
                             std::optional<int> version = std::nullopt, bool default_hp_metric = true);
  ~TensorBoardLogger() override;

  std::string name() const override { return "tensorboard"; }
  /// <root_dir>/<name>/version_<N>.
  std::string log_dir() const override { return log_dir_; }
  /// The run's version number N.
  int version() const { return version_; }

  /// One scalar per metric at `step`. Throws ConfigError for a metric name
  /// TensorBoard cannot hold (check_tag) before writing anything, and Error
  /// when the file cannot be written. Non-finite values are written as
  /// they are (TensorBoard shows NaN and inf).
  void log_metrics(const Metrics& metrics, std::int64_t step) override;
  /// Merges `params` into the run's hyperparameters (a key given again is
  /// replaced) and rewrites hparams.yaml (hparams_yaml; atomically: a reader
  /// sees the old file or the new one). They reach TensorBoard's HPARAMS
  /// tab (encode_hparams_events of tensorboard_hparams, with hp_metric) with
  /// the next scalars, save() or finalize(); TensorBoard shows the first
  /// such record of a run, so call this before logging metrics.
  void log_hyperparams(const Hyperparams& params) override;
  /// Writes buffered records to the event file.
  void save() override;
  /// Flushes, fsyncs and closes the event file. A later log_metrics opens
  /// a new event file in the same folder, as Lightning's logger does.
  void finalize(const std::string& status) override;

  /// The event file being written, or "" before the first write.
  std::string event_file() const;

 private:
  void ensure_dir();
  void write_hparams();
  void write_pending_hparams();

  std::string root_dir_;
  std::string name_;
  int version_ = 0;
  std::string log_dir_;
  Hyperparams hparams_;
  bool hparams_pending_ = false;
  bool default_hp_metric_ = true;
  std::unique_ptr<EventFileWriter> writer_;
};

}  // namespace strata::trainer
