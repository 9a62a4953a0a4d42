// CSVLogger: Lightning's CSVLogger, in a file logger's versioned folder
// (file_logger.h): metrics.csv (a header row of "epoch", "step" and every
// metric name seen so far, sorted; one row per log_metrics call; empty
// cells for metrics not in that call; the file is rewritten with the wider
// header when a new name appears) and hparams.yaml.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "strata/loggers/file_logger.h"

namespace strata::trainer {

/// Lightning's CSVLogger.
class CSVLogger : public FileLogger {
 public:
  /// flush_logs_every_n_steps: log_metrics writes the buffered rows to disk
  /// when (step + 1) is a multiple of it (Lightning's option and default).
  /// Throws ConfigError for an empty root_dir, a name with '/', or
  /// flush_logs_every_n_steps < 1.
  CSVLogger(std::string root_dir, std::string name = "lightning_logs",
            std::optional<int64_t> version = std::nullopt, int64_t flush_logs_every_n_steps = 100);
  std::string name() const override { return "csv"; }
  /// Buffers a row; save() writes, and so does this call at every
  /// flush_logs_every_n_steps-th step. Non-finite values are written as
  /// "nan", "inf", "-inf" (Python's float() reads them).
  void log_metrics(const Metrics& metrics, std::int64_t step) override;
  /// Merges `params` into the run's hyperparameters and writes them to
  /// hparams.yaml as Lightning does (hparams_yaml in hparams.h).
  void log_hyperparams(const Hyperparams& params) override;
  /// Appends the buffered rows to metrics.csv (or rewrites it when the
  /// columns grew). Throws Error when the file cannot be written.
  void save() override;
  /// Path of metrics.csv.
  std::string metrics_file() const;

 private:
  std::vector<std::string> columns_;              // metric names in the file's header (sorted)
  std::vector<std::map<std::string, std::string>> rows_;  // every row, as text
  size_t written_ = 0;                            // rows already in the file
  bool header_changed_ = false;
  int64_t flush_every_ = 100;
  Hyperparams hparams_;
};

}  // namespace strata::trainer
