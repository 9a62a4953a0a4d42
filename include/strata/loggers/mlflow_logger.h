// MLFlowLogger: Lightning's MLFlowLogger in C++. Params, metrics and tags
// go to an MLflow tracking server over its REST API (2.0):
// experiments/get-by-name and experiments/create for the experiment,
// runs/create (or runs/get to continue a run), runs/log-batch, and
// runs/update for the end status.
//
//   auto mlflow = std::make_shared<strata::trainer::MLFlowLogger>(
//       strata::trainer::MLFlowOptions().with_tracking_uri("http://127.0.0.1:5000")
//                                       .with_run_name("baseline"));
//   strata::Trainer trainer(strata::TrainerOptions().with_logger(mlflow));
//
// Training never waits for the server (Note [The MLflow logger never slows
// training] in mlflow_logger.cpp): log_metrics and log_hyperparams only
// queue, and one background thread creates the run and sends the queue in
// batches.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "strata/loggers/logger.h"

namespace strata::trainer {

/// MLFlowLogger's options. The first six are Lightning's.
struct MLFlowOptions {
  /// The experiment the run belongs to (created when the server has none
  /// of that name).
  std::string experiment_name = "lightning_logs";
  /// The run's name (the tag mlflow.runName); "" lets the server pick one.
  std::string run_name;
  /// http:// or https:// address of the tracking server; "" reads
  /// MLFLOW_TRACKING_URI.
  std::string tracking_uri;
  /// Tags set on the run when it is created.
  std::map<std::string, std::string> tags;
  /// Continue this run (its experiment is the run's own) instead of
  /// creating one.
  std::string run_id;
  /// Put before every metric name, joined by '-' ("fit-train_loss").
  std::string prefix;

  /// Seconds one request may take (connecting included) before it counts
  /// as failed.
  double request_timeout_s = 5.0;
  /// The longest finalize() (and the destructor) waits for the queue to
  /// reach the server.
  double finalize_timeout_s = 5.0;
  /// Tries of one batch before it is given up (counted as not sent).
  int max_attempts = 5;
  /// Wait before the first retry; it doubles after each failure, up to
  /// max_backoff_s.
  double initial_backoff_s = 0.25;
  double max_backoff_s = 4.0;
  /// Most metric/param/tag entries queued; past it the oldest are dropped.
  int64_t max_queued = 100000;

  MLFlowOptions& with_experiment_name(std::string v) { experiment_name = std::move(v); return *this; }
  MLFlowOptions& with_run_name(std::string v) { run_name = std::move(v); return *this; }
  MLFlowOptions& with_tracking_uri(std::string v) { tracking_uri = std::move(v); return *this; }
  MLFlowOptions& with_tags(std::map<std::string, std::string> v) { tags = std::move(v); return *this; }
  MLFlowOptions& with_run_id(std::string v) { run_id = std::move(v); return *this; }
  MLFlowOptions& with_prefix(std::string v) { prefix = std::move(v); return *this; }
  MLFlowOptions& with_request_timeout_s(double v) { request_timeout_s = v; return *this; }
  MLFlowOptions& with_finalize_timeout_s(double v) { finalize_timeout_s = v; return *this; }
  MLFlowOptions& with_max_attempts(int v) { max_attempts = v; return *this; }
  MLFlowOptions& with_backoff_s(double initial, double max) {
    initial_backoff_s = initial;
    max_backoff_s = max;
    return *this;
  }
  MLFlowOptions& with_max_queued(int64_t v) { max_queued = v; return *this; }
};

/// What reached the server and what did not, for finalize's report and
/// for tests.
struct MLFlowReport {
  std::string run_id;          ///< "" until the run exists on the server
  std::string experiment_id;   ///< likewise
  int64_t sent = 0;            ///< metric, param and tag entries the server accepted
  int64_t pending = 0;         ///< still queued (not sent yet)
  int64_t dropped_full = 0;    ///< dropped because the queue was full
  int64_t given_up = 0;        ///< dropped after max_attempts tries, or refused by the server
  bool terminated = false;     ///< the last finalize's status reached the server
  bool unreachable_warned = false;  ///< the one "server unreachable" warning was printed
  std::string last_error;      ///< the last failure, "" when none
};

/// Lightning's parameter value limit: longer values are cut to it (with a
/// warning).
inline constexpr std::size_t kMLFlowParamValueLimit = 250;

/// Lightning's _flatten_dict for MLflow: nested maps flattened with '/'
/// ("model/n_layer"), an empty map giving no entry; each value as Python's
/// str() writes it ("0.01", "True", "None", "AdamW", "[0.9, 0.95]"); values
/// over kMLFlowParamValueLimit characters cut to it. In key order.
std::vector<std::pair<std::string, std::string>> mlflow_params(const Hyperparams& params);

/// Lightning's rule for metric names: characters other than letters,
/// digits, '_', '/', '.', ' ' and '-' removed ("val/acc@1" -> "val/acc1").
std::string mlflow_metric_key(const std::string& key);

/// Sends a Trainer's params and metrics to an MLflow tracking server.
/// Call it on global rank 0 only (the Trainer does).
class MLFlowLogger : public Logger {
 public:
  /// Checks the options and starts the background thread; it contacts no
  /// server (the thread does), so a server that is down never blocks here.
  /// Throws ConfigError for a tracking URI that is missing (no option, no
  /// MLFLOW_TRACKING_URI) or not http(s)://, empty experiment name,
  /// timeouts outside (0, 3600], max_attempts < 1, max_queued < 1, and
  /// MLFLOW_TRACKING_TOKEN / _USERNAME / _PASSWORD values with line breaks
  /// or over 8 KiB; and when strata was built without libcurl.
  explicit MLFlowLogger(MLFlowOptions options = {});
  /// Waits up to finalize_timeout_s for what is queued, then stops the
  /// thread (a request in flight is cut off).
  ~MLFlowLogger() override;
  MLFlowLogger(const MLFlowLogger&) = delete;
  MLFlowLogger& operator=(const MLFlowLogger&) = delete;

  std::string name() const override { return "mlflow"; }
  /// "": the run lives on the server, not in a local folder.
  std::string log_dir() const override { return ""; }
  /// Queues one entry per metric (name prefixed and cleaned as Lightning
  /// does, a warning once per renamed key), stamped with the time of this
  /// call and `step`. Never blocks on the network.
  void log_metrics(const Metrics& metrics, std::int64_t step) override;
  /// Queues the params (mlflow_params; a warning per value cut).
  void log_hyperparams(const Hyperparams& params) override;
  /// Nothing to flush: the thread sends continuously.
  void save() override {}
  /// Queues the run's end status ("success" -> FINISHED, "failed" ->
  /// FAILED, "interrupted" -> KILLED) and waits up to finalize_timeout_s
  /// for everything queued so far to reach the server. What did not is
  /// said in one warning (and in report()); it stays queued.
  void finalize(const std::string& status) override;

  /// The tracking server's address, as used.
  const std::string& tracking_uri() const;
  /// The state of sending (a snapshot).
  MLFlowReport report() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::trainer
