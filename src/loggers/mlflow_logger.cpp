// MLFlowLogger (loggers/mlflow_logger.h): Lightning's MLFlowLogger over
// MLflow's REST API 2.0 (mlflow_api.h), with libcurl as the HTTP client
// (mlflow_http.h). This file checks the options and holds the caller's
// side: every call only queues; the thread of mlflow_sender.cpp sends.
//
// Note [The MLflow logger never slows training]
// The Trainer calls log_metrics on its own thread between steps; a tracking
// server that is down, slow or refusing must not stop or slow it. So every
// call only appends entries to a bounded queue (when it is full the oldest
// entry is dropped and counted; one warning says so), and one background
// thread does all the network work: it resolves the experiment and creates
// (or looks up) the run, then sends the queue in runs/log-batch requests
// within MLflow's per-request limits, each request bounded by
// request_timeout_s. A failure that may pass (no connection, a timeout,
// HTTP 408/429/5xx) is retried after a backoff that doubles up to
// max_backoff_s; a batch is given up after max_attempts tries, and the
// run's creation is retried for as long as the logger lives (nothing can be
// sent without a run; the queue bound caps what waits). The first such
// failure prints one warning, not one per step. A refusal that will not
// pass (another 4xx: a bad request, bad credentials, a param changed on a
// continued run) drops that batch with a warning naming the server's error.
// finalize() waits for the queue at most finalize_timeout_s and says what
// was not sent; the destructor waits at most as long again (only when
// something new was queued) and then cuts off the request in flight, so
// neither blocks for longer than its bound plus about a second.
//
// MLflow's rules for names and values are in mlflow_keys.cpp (Note
// [MLflow's keys]).
#include "strata/loggers/mlflow_logger.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <mutex>

#include "mlflow_api.h"
#include "mlflow_http.h"
#include "mlflow_keys.h"
#include "mlflow_sender.h"
#include "strata/core/error.h"
#include "strata/core/log.h"

namespace strata::trainer {
namespace {

using detail::clip;
using Clock = MLFlowLogger::Impl::Clock;

// The most strata reads of the variables it takes.
constexpr std::size_t kMaxEnvBytes = 8192;
constexpr std::size_t kMaxUriBytes = 2048;

// An environment variable, checked: bounded, one line.
std::string env_value(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return "";
  const std::string value(v);
  STRATA_CHECK(value.size() <= kMaxEnvBytes, ConfigError, "[mlflow] ", name, " is ", value.size(),
               " bytes long; it must be at most ", kMaxEnvBytes);
  STRATA_CHECK(value.find_first_of("\r\n") == std::string::npos, ConfigError,
               "[mlflow] ", name, " holds a line break; set it to a single line");
  return value;
}

// The tracking URI: http(s)://host[:port][/path], no trailing '/'.
std::string check_uri(std::string uri, bool from_env) {
  const std::string origin = from_env ? "MLFLOW_TRACKING_URI" : "tracking_uri";
  STRATA_CHECK(!uri.empty(), ConfigError,
               "[mlflow] no tracking server: pass tracking_uri (strata train: --mlflow-uri) or set "
               "MLFLOW_TRACKING_URI to the server's address, e.g. http://127.0.0.1:5000");
  STRATA_CHECK(uri.size() <= kMaxUriBytes, ConfigError, "[mlflow] ", origin, " is ", uri.size(),
               " bytes long; it must be at most ", kMaxUriBytes);
  for (char c : uri) {
    const unsigned char u = static_cast<unsigned char>(c);
    STRATA_CHECK(u > 0x20 && u < 0x7F, ConfigError, "[mlflow] ", origin, " '", clip(uri),
                 "' holds a space or a control or non-ASCII character; write the address URL-encoded");
  }
  const bool http = uri.rfind("http://", 0) == 0, https = uri.rfind("https://", 0) == 0;
  STRATA_CHECK(http || https, ConfigError, "[mlflow] ", origin, " '", clip(uri),
               "' is not an http:// or https:// address; strata's MLflow logger talks to a tracking server "
               "(start one with `mlflow server`), not to a local folder or a database");
  STRATA_CHECK(uri.size() > (http ? 7u : 8u), ConfigError, "[mlflow] ", origin, " '", uri, "' names no host");
  while (!uri.empty() && uri.back() == '/') uri.pop_back();
  return uri;
}

void check_seconds(double v, const char* what) {
  STRATA_CHECK(std::isfinite(v) && v > 0 && v <= 3600, ConfigError, "[mlflow] ", what,
               " must be a number of seconds in (0, 3600], got ", v);
}

}  // namespace

// ---- the caller's side of the queue --------------------------------------------

void MLFlowLogger::Impl::push(Entry e) {
  e.seq = next_seq++;
  if (static_cast<int64_t>(queue.size()) >= options.max_queued) {
    for (auto it = queue.begin(); it != queue.end(); ++it) {
      if (it->kind == Kind::kTerminate) continue;
      queue.erase(it);
      ++state.dropped_full;
      break;
    }
    if (!full_warned) {
      full_warned = true;
      log::warning("[mlflow] ", options.max_queued, " entries wait for the tracking server at ", uri,
                   ", the most the queue holds (max_queued); the oldest are dropped from now on and finalize "
                   "says how many");
    }
  }
  queue.push_back(std::move(e));
  wake.notify_one();
}

uint64_t MLFlowLogger::Impl::done_through() const {
  if (!in_flight.empty()) return in_flight.front().seq - 1;
  if (!queue.empty()) return queue.front().seq - 1;
  return next_seq - 1;
}

void MLFlowLogger::Impl::warn_renamed(const std::string& what, const std::string& from, const std::string& to) {
  if (renamed_warned.size() >= 1000 || !renamed_warned.insert(what + from).second) return;
  log::warning("[mlflow] MLflow only allows '_', '/', '.', ' ' and '-' besides letters and digits in a ", what,
               " name; ", clip(from), " is sent as ", clip(to));
}

std::string MLFlowLogger::Impl::clean_key(const std::string& what, const std::string& key) {
  const std::string clean = mlflow_metric_key(key);
  if (clean != key) warn_renamed(what, key, clean);
  if (clean.empty() || clean.size() > detail::kMaxKeyLength) {
    log::warning("[mlflow] the ", what, " '", clip(key), "' is not sent: MLflow takes names of 1 to ",
                 detail::kMaxKeyLength, " characters");
    return "";
  }
  return clean;
}

std::map<std::string, std::string> MLFlowLogger::Impl::run_tags() {
  std::map<std::string, std::string> tags;
  std::string login;
  for (const char* var : {"LOGNAME", "USER", "LNAME", "USERNAME"}) {
    const char* v = std::getenv(var);
    if (v && *v) {
      login = std::string(v).substr(0, 256);
      break;
    }
  }
  if (!login.empty()) tags["mlflow.user"] = login;
  tags["mlflow.source.name"] = "strata";
  tags["mlflow.source.type"] = "LOCAL";
  for (const auto& [k, v] : options.tags) {
    const std::string key = clean_key("tag", k);
    if (key.empty()) continue;
    std::string value = v;
    if (value.size() > detail::kMaxTagValueLength) {
      log::warning("[mlflow] tag '", key, "' is ", value.size(), " bytes long; MLflow keeps ",
                   detail::kMaxTagValueLength, ", the rest is cut");
      value = detail::cut_tag_value(value);
    }
    tags[key] = value;
  }
  if (!options.run_name.empty()) {
    if (options.tags.count("mlflow.runName")) {
      log::warning("[mlflow] the tag mlflow.runName is found in tags; it is replaced by run_name '",
                   options.run_name, "'");
    }
    tags["mlflow.runName"] = options.run_name;
  }
  return tags;
}

bool MLFlowLogger::Impl::wait_done(uint64_t seq, Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex);
  return progress.wait_until(lock, deadline, [&] { return done_through() >= seq; });
}

std::string MLFlowLogger::Impl::unsent_text() const {
  int64_t metrics = 0, params = 0, tags = 0;
  auto count = [&](const Entry& e) {
    metrics += e.kind == Kind::kMetric;
    params += e.kind == Kind::kParam;
    tags += e.kind == Kind::kTag;
  };
  for (const Entry& e : queue) count(e);
  for (const Entry& e : in_flight) count(e);
  std::string out = std::to_string(metrics) + " metric, " + std::to_string(params) + " param and " +
                    std::to_string(tags) + " tag entries are not sent yet";
  if (state.dropped_full) out += "; " + std::to_string(state.dropped_full) + " were dropped when the queue was full";
  if (state.given_up) {
    out += "; " + std::to_string(state.given_up) + " were given up (refused by the server, or failed " +
           std::to_string(options.max_attempts) + " times)";
  }
  if (!state.last_error.empty()) out += "; last error: " + state.last_error;
  return out;
}

// ---- MLFlowLogger ----------------------------------------------------------------

MLFlowLogger::MLFlowLogger(MLFlowOptions options) : impl_(std::make_unique<Impl>()) {
  STRATA_CHECK(detail::http_client_built(), ConfigError,
               "[mlflow] strata was built without libcurl, which the MLflow logger sends with; install it "
               "(Debian: apt-get install libcurl4-openssl-dev, or scripts/install-deps.sh) and configure the "
               "build again");
  Impl& m = *impl_;
  const bool from_env = options.tracking_uri.empty();
  m.uri = check_uri(from_env ? env_value("MLFLOW_TRACKING_URI") : options.tracking_uri, from_env);
  STRATA_CHECK(!options.experiment_name.empty() || !options.run_id.empty(), ConfigError,
               "[mlflow] experiment_name is empty; name the experiment (default lightning_logs)");
  STRATA_CHECK(options.experiment_name.size() <= 500 && options.run_name.size() <= 500 && options.run_id.size() <= 256,
               ConfigError, "[mlflow] experiment_name and run_name must be at most 500 bytes and run_id at most 256");
  check_seconds(options.request_timeout_s, "request_timeout_s");
  check_seconds(options.finalize_timeout_s, "finalize_timeout_s");
  check_seconds(options.initial_backoff_s, "initial_backoff_s");
  check_seconds(options.max_backoff_s, "max_backoff_s");
  STRATA_CHECK(options.max_attempts >= 1 && options.max_attempts <= 1000, ConfigError,
               "[mlflow] max_attempts must be in 1..1000, got ", options.max_attempts);
  STRATA_CHECK(options.max_queued >= 1 && options.max_queued <= 100000000, ConfigError,
               "[mlflow] max_queued must be in 1..100000000, got ", options.max_queued);
  m.auth.token = env_value("MLFLOW_TRACKING_TOKEN");
  m.auth.user = env_value("MLFLOW_TRACKING_USERNAME");
  m.auth.password = env_value("MLFLOW_TRACKING_PASSWORD");
  STRATA_CHECK(m.auth.user.empty() == m.auth.password.empty(), ConfigError,
               "[mlflow] MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD go together; set both or neither");
  const std::string insecure = env_value("MLFLOW_TRACKING_INSECURE_TLS");
  m.auth.insecure = insecure == "true" || insecure == "True" || insecure == "1";
  m.auth.ca_file = env_value("MLFLOW_TRACKING_SERVER_CERT_PATH");
  m.options = std::move(options);
  m.start_tags = m.run_tags();
  m.start();
}

MLFlowLogger::~MLFlowLogger() {
  Impl& m = *impl_;
  {
    std::unique_lock<std::mutex> lock(m.mutex);
    m.stop = true;
    m.wake.notify_all();
    const uint64_t last = m.next_seq - 1;
    if (last > m.reported_seq && m.done_through() < last) {
      const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                               std::chrono::duration<double>(m.options.finalize_timeout_s));
      if (!m.progress.wait_until(lock, deadline, [&] { return m.done_through() >= last; })) {
        log::warning("[mlflow] closing the logger of ", m.uri, " after ", m.options.finalize_timeout_s, " s: ",
                     m.unsent_text());
      }
    }
    m.abort = true;
    m.wake.notify_all();
  }
  if (m.thread.joinable()) m.thread.join();
}

void MLFlowLogger::log_metrics(const Metrics& metrics, std::int64_t step) {
  Impl& m = *impl_;
  const int64_t timestamp = detail::now_ms();
  std::lock_guard<std::mutex> lock(m.mutex);
  for (const auto& [name, value] : metrics) {
    const std::string full = m.options.prefix.empty() ? name : m.options.prefix + "-" + name;
    Impl::Entry e;
    e.kind = Impl::Kind::kMetric;
    e.key = m.clean_key("metric", full);
    if (e.key.empty()) continue;
    e.value = value;
    e.timestamp = timestamp;
    e.step = step;
    m.push(std::move(e));
  }
}

void MLFlowLogger::log_hyperparams(const Hyperparams& params) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mutex);
  for (detail::FlatParam& p : detail::flat_params(params)) {
    Impl::Entry e;
    e.kind = Impl::Kind::kParam;
    e.key = m.clean_key("param", p.key);
    if (e.key.empty()) continue;
    if (p.length > kMLFlowParamValueLimit) {
      log::warning("[mlflow] param '", e.key, "' is ", p.length, " characters long; as Lightning's MLFlowLogger, the "
                   "first ", kMLFlowParamValueLimit, " are sent");
    }
    e.text = std::move(p.value);
    m.push(std::move(e));
  }
}

void MLFlowLogger::finalize(const std::string& status) {
  Impl& m = *impl_;
  std::string mlflow_status = "FINISHED";
  if (status == "failed") mlflow_status = "FAILED";
  else if (status == "interrupted") mlflow_status = "KILLED";
  uint64_t seq = 0;
  {
    std::lock_guard<std::mutex> lock(m.mutex);
    Impl::Entry e;
    e.kind = Impl::Kind::kTerminate;
    e.text = mlflow_status;
    e.timestamp = detail::now_ms();
    m.push(std::move(e));
    seq = m.next_seq - 1;
    m.reported_seq = seq;
  }
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(m.options.finalize_timeout_s));
  if (m.wait_done(seq, deadline)) {
    std::lock_guard<std::mutex> lock(m.mutex);
    if (m.state.dropped_full || m.state.given_up || !m.state.terminated) {
      log::warning("[mlflow] the run on ", m.uri, " is not complete: ", m.unsent_text(),
                   m.state.terminated ? "" : "; its status was not set");
    }
    return;
  }
  std::lock_guard<std::mutex> lock(m.mutex);
  log::warning("[mlflow] finalize waited ", m.options.finalize_timeout_s, " s (finalize_timeout_s) for the tracking "
               "server at ", m.uri, ": ", m.unsent_text(), "; the run's status ", mlflow_status, " is not set");
}

const std::string& MLFlowLogger::tracking_uri() const { return impl_->uri; }

MLFlowReport MLFlowLogger::report() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  MLFlowReport r = impl_->state;
  r.pending = static_cast<int64_t>(impl_->queue.size() + impl_->in_flight.size());
  return r;
}

}  // namespace strata::trainer
