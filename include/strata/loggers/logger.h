// Experiment loggers of the Trainer (Lightning's Logger role): they receive
// the metrics the Trainer collects and write them somewhere a person or a
// tool reads them. The Trainer calls them on global rank 0 only.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace strata::trainer {

/// Metric values by name, as the Trainer hands them to a logger:
/// "train_loss", "val_loss", "lr-AdamW", "epoch", ...
using Metrics = std::map<std::string, double>;
/// Hyperparameters by name, typed as Lightning's save_hyperparameters keeps
/// them: numbers, booleans, strings, null, lists and nested maps
/// ({{"lr", 0.01}, {"model", {{"n_layer", 2}}}}).
using Hyperparams = std::map<std::string, nlohmann::json>;

/// Base of every logger. Methods are called from one thread.
class Logger {
 public:
  virtual ~Logger() = default;

  /// Short name of the logger's format: "csv", "jsonl", "tensorboard".
  virtual std::string name() const = 0;
  /// The folder this run writes into (created on first write).
  virtual std::string log_dir() const = 0;
  /// Records `metrics` at optimizer step `step`.
  virtual void log_metrics(const Metrics& metrics, std::int64_t step) = 0;
  /// Records the run's hyperparameters (once, before training).
  virtual void log_hyperparams(const Hyperparams& params) = 0;
  /// Flushes what is buffered to disk.
  virtual void save() = 0;
  /// Flushes and closes; `status` is "success", "failed" or "interrupted".
  virtual void finalize(const std::string& status) = 0;
};

using LoggerPtr = std::shared_ptr<Logger>;

}  // namespace strata::trainer
