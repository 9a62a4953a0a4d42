// File loggers of the Trainer: CSV in Lightning's CSVLogger layout and
// JSON lines, and make_logger, which builds a logger from its name.
//
// Layout (both): <root_dir>/<name>/version_<N>/, N one past the largest
// version already there unless given. CSVLogger writes metrics.csv (a
// header row of "epoch", "step" and every metric name seen so far, sorted;
// one row per log_metrics call; empty cells for metrics not in that call;
// the file is rewritten with the wider header when a new name appears) and
// hparams.yaml. JSONLinesLogger writes metrics.jsonl, one object per call:
// {"step": S, "<metric>": value, ...}, and hparams.json.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "strata/loggers/logger.h"

namespace strata::trainer {

/// Where a file logger writes: <root_dir>/<name>/version_<version>.
/// version: nullopt takes the next free number (the folder is chosen when
/// the logger is constructed, before any other rank could race for it:
/// the Trainer calls loggers on global rank 0 only).
std::string versioned_log_dir(const std::string& root_dir, const std::string& name,
                              std::optional<int64_t> version);

/// What the file loggers share: a versioned folder (versioned_log_dir),
/// the files written in it, and finalize = save.
class FileLogger : public Logger {
 public:
  std::string log_dir() const override { return log_dir_; }
  void finalize(const std::string& status) override;

 protected:
  /// Throws ConfigError for an empty root_dir or a name with '/'.
  FileLogger(const std::string& root_dir, const std::string& name, std::optional<int64_t> version);
  /// The path of `file` in the log folder, creating the folder (Error
  /// when it cannot).
  std::string file_path(const std::string& file) const;
  /// Replaces `file` in the log folder by `text` (Error when it cannot).
  void write_file(const std::string& file, const std::string& text) const;

  std::string log_dir_;
};

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

/// One JSON object per line.
class JSONLinesLogger : public FileLogger {
 public:
  JSONLinesLogger(std::string root_dir, std::string name = "lightning_logs",
                  std::optional<int64_t> version = std::nullopt);
  std::string name() const override { return "jsonl"; }
  /// Non-finite values are written as null.
  void log_metrics(const Metrics& metrics, std::int64_t step) override;
  /// Merges `params` into the run's hyperparameters and writes them to
  /// hparams.json.
  void log_hyperparams(const Hyperparams& params) override;
  void save() override;
  std::string metrics_file() const;

 private:
  std::vector<std::string> pending_;
  Hyperparams hparams_;
};

/// Builds a logger by format name: "csv" or "jsonl" ("tensorboard" when
/// that logger is built in). Throws ConfigError for another name, listing
/// the known ones.
LoggerPtr make_logger(const std::string& kind, const std::string& root_dir, const std::string& name = "lightning_logs",
                      std::optional<int64_t> version = std::nullopt);

}  // namespace strata::trainer
