// The part of MLflow's REST API 2.0 the MLflow logger uses, over its HTTP
// client: one method per request (experiments/get-by-name and
// experiments/create, runs/get, runs/create, runs/log-batch, runs/update),
// each telling what it came to as an Outcome that the logger's thread
// acts on (Note [The MLflow logger never slows training] in
// mlflow_logger.cpp). Internal to the MLflow logger.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "mlflow_http.h"

namespace strata::trainer::detail {

/// What a request came to: kOk; kRetry for a failure that may pass (no
/// connection, a timeout, HTTP 408/429/5xx, an answer that is not JSON);
/// kRefused for one that will not (another 4xx, or an answer without the
/// field asked for); kCutOff when the logger is shutting down. Every
/// outcome but kOk comes with an error text.
enum class Outcome { kOk, kRetry, kRefused, kCutOff };

/// Milliseconds since the epoch, MLflow's timestamps.
std::int64_t now_ms();

/// One tracking server's REST API, used by one thread alone.
class MlflowApi {
 public:
  /// `uri`: the server's checked address (no trailing '/'); each request
  /// takes at most `timeout_s`; `abort` cuts off the one in flight.
  MlflowApi(std::string uri, const HttpAuth& auth, double timeout_s, const std::atomic<bool>* abort);

  /// The experiment of the run `run_id` (runs/get), in `experiment_id`.
  Outcome run_experiment(const std::string& run_id, std::string& experiment_id, std::string& error);
  /// The id of the experiment `name`, created when the server has none of
  /// that name (and looked up again when another client created it
  /// meanwhile). A deleted experiment is refused.
  Outcome experiment_by_name(const std::string& name, std::string& experiment_id, std::string& error);
  /// Creates a run in `experiment_id` with `tags` (and `run_name` unless
  /// empty), starting now; its id in `run_id`.
  Outcome create_run(const std::string& experiment_id, const std::string& run_name,
                     const std::map<std::string, std::string>& tags, std::string& run_id, std::string& error);
  /// runs/log-batch of `batch` ({"run_id", "metrics", "params", "tags"}).
  Outcome log_batch(const nlohmann::json& batch, std::string& error);
  /// Sets the run's end status ("FINISHED", "FAILED", "KILLED") and time.
  Outcome update_run(const std::string& run_id, const std::string& status, std::int64_t end_time,
                     std::string& error);

 private:
  // One request to api/2.0/mlflow/`path` (GET without a body, else POST);
  // the answer's JSON object in `out`.
  Outcome call(const std::string& path, const nlohmann::json* body, nlohmann::json& out, std::string& error);

  std::string uri_;
  double timeout_s_;
  HttpClient http_;
};

}  // namespace strata::trainer::detail
