// JSONLinesLogger: metrics as JSON lines in a file logger's versioned
// folder (file_logger.h): metrics.jsonl, one object per log_metrics call,
// {"step": S, "<metric>": value, ...}, and hparams.json.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "strata/loggers/file_logger.h"

namespace strata::trainer {

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

}  // namespace strata::trainer
