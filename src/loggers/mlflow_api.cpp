// MLflow's REST API 2.0 as the MLflow logger calls it (mlflow_api.h).
#include "mlflow_api.h"

#include <chrono>
#include <initializer_list>

#include "mlflow_keys.h"
#include "strata/core/log.h"

namespace strata::trainer::detail {
namespace {

using json = nlohmann::json;

// The string (or integer, as text) at `path` in `j`, "" when there is none.
std::string string_field(const json& j, std::initializer_list<const char*> path) {
  const json* at = &j;
  for (const char* p : path) {
    if (!at->is_object() || !at->contains(p)) return "";
    at = &(*at)[p];
  }
  if (at->is_string()) return at->get<std::string>();
  if (at->is_number_integer()) return std::to_string(at->get<int64_t>());
  return "";
}

// "HTTP 400 INVALID_PARAMETER_VALUE: <message>", or the status and the body.
std::string http_error(long status, const json& answer, const std::string& body) {
  std::string error = "HTTP " + std::to_string(status);
  if (answer.is_object() && answer.contains("error_code") && answer["error_code"].is_string()) {
    error += " " + answer["error_code"].get<std::string>();
    if (answer.contains("message") && answer["message"].is_string()) {
      error += ": " + clip(answer["message"].get<std::string>());
    }
  } else if (!body.empty()) {
    error += ": " + clip(body);
  }
  return error;
}

}  // namespace

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

MlflowApi::MlflowApi(std::string uri, const HttpAuth& auth, double timeout_s, const std::atomic<bool>* abort)
    : uri_(std::move(uri)), timeout_s_(timeout_s), http_(auth, abort) {}

Outcome MlflowApi::call(const std::string& path, const json* body, json& out, std::string& error) {
  std::string text;
  if (body) text = body->dump(-1, ' ', false, json::error_handler_t::replace);
  HttpResponse r = http_.request(uri_ + "/api/2.0/mlflow/" + path, text, timeout_s_);
  if (r.cut_off) {
    error = "cut off at shutdown";
    return Outcome::kCutOff;
  }
  if (r.status == 0) {
    error = r.failure;
    return Outcome::kRetry;
  }
  out = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  if (r.status >= 200 && r.status < 300) {
    if (out.is_discarded() || !out.is_object()) {
      error = "HTTP " + std::to_string(r.status) + " with an answer that is not a JSON object: " + clip(r.body);
      return Outcome::kRetry;
    }
    return Outcome::kOk;
  }
  error = http_error(r.status, out, r.body);
  const long s = r.status;
  return (s == 408 || s == 429 || s >= 500) ? Outcome::kRetry : Outcome::kRefused;
}

Outcome MlflowApi::run_experiment(const std::string& run_id, std::string& experiment_id, std::string& error) {
  json answer;
  Outcome o = call("runs/get?run_id=" + http_.escape(run_id), nullptr, answer, error);
  if (o != Outcome::kOk) {
    if (o == Outcome::kRefused) error = "run_id '" + clip(run_id) + "' cannot be continued: " + error;
    return o;
  }
  experiment_id = string_field(answer, {"run", "info", "experiment_id"});
  if (experiment_id.empty()) {
    error = "runs/get answered without run.info.experiment_id: " + clip(answer.dump());
    return Outcome::kRefused;
  }
  return Outcome::kOk;
}

Outcome MlflowApi::experiment_by_name(const std::string& name, std::string& experiment_id, std::string& error) {
  json answer;
  for (int round = 0; round < 3; ++round) {
    Outcome o = call("experiments/get-by-name?experiment_name=" + http_.escape(name), nullptr, answer, error);
    if (o == Outcome::kOk) {
      if (string_field(answer, {"experiment", "lifecycle_stage"}) == "deleted") {
        error = "the experiment '" + clip(name) +
                "' is deleted on the server; restore it (mlflow experiments restore) or choose another name";
        return Outcome::kRefused;
      }
      experiment_id = string_field(answer, {"experiment", "experiment_id"});
      if (experiment_id.empty()) {
        error = "experiments/get-by-name answered without experiment.experiment_id: " + clip(answer.dump());
        return Outcome::kRefused;
      }
      return Outcome::kOk;
    }
    const bool missing = o == Outcome::kRefused && error.find("RESOURCE_DOES_NOT_EXIST") != std::string::npos;
    if (!missing) return o;
    log::info("[mlflow] experiment '", name, "' not found on ", uri_, "; creating it");
    json create = {{"name", name}};
    o = call("experiments/create", &create, answer, error);
    if (o == Outcome::kOk) {
      experiment_id = string_field(answer, {"experiment_id"});
      if (!experiment_id.empty()) return Outcome::kOk;
      error = "experiments/create answered without experiment_id: " + clip(answer.dump());
      return Outcome::kRefused;
    }
    if (!(o == Outcome::kRefused && error.find("RESOURCE_ALREADY_EXISTS") != std::string::npos)) return o;
    // Else another client made it meanwhile: look it up again.
  }
  return Outcome::kRetry;
}

Outcome MlflowApi::create_run(const std::string& experiment_id, const std::string& run_name,
                              const std::map<std::string, std::string>& tags, std::string& run_id,
                              std::string& error) {
  json tag_list = json::array();
  for (const auto& [k, v] : tags) tag_list.push_back({{"key", k}, {"value", v}});
  json create = {{"experiment_id", experiment_id}, {"start_time", now_ms()}, {"tags", tag_list}};
  if (!run_name.empty()) create["run_name"] = run_name;
  json answer;
  Outcome o = call("runs/create", &create, answer, error);
  if (o != Outcome::kOk) return o;
  run_id = string_field(answer, {"run", "info", "run_id"});
  if (run_id.empty()) {
    error = "runs/create answered without run.info.run_id: " + clip(answer.dump());
    return Outcome::kRefused;
  }
  return Outcome::kOk;
}

Outcome MlflowApi::log_batch(const json& batch, std::string& error) {
  json answer;
  return call("runs/log-batch", &batch, answer, error);
}

Outcome MlflowApi::update_run(const std::string& run_id, const std::string& status, std::int64_t end_time,
                              std::string& error) {
  json update = {{"run_id", run_id}, {"status", status}, {"end_time", end_time}};
  json answer;
  return call("runs/update", &update, answer, error);
}

}  // namespace strata::trainer::detail
