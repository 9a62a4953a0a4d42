// MLFlowLogger (loggers/mlflow_logger.h): Lightning's MLFlowLogger over
// MLflow's REST API 2.0, with libcurl as the HTTP client.
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
// Note [MLflow's keys]
// As Lightning: hyperparameters are flattened with '/' (_flatten_dict) and
// sent as Python's str() of the value, cut to 250 characters; metric names
// get the prefix joined by '-' and lose every character other than
// letters, digits, '_', '/', '.', ' ' and '-' (MLflow refuses them), with a
// warning. strata applies the same cleaning to param and tag keys (the
// server would refuse the whole batch of 100 otherwise) and drops, with a
// warning, a key over MLflow's 250 characters and cuts a tag value over
// its 8000.
#include "strata/loggers/mlflow_logger.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "strata/core/error.h"
#include "strata/core/log.h"
#include "strata/trainer/hparams.h"

#if STRATA_HAVE_CURL
#include <curl/curl.h>
#endif

namespace strata::trainer {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// MLflow's limits (mlflow/utils/validation.py).
constexpr std::size_t kMaxKeyLength = 250;
constexpr std::size_t kMaxTagValueLength = 8000;
constexpr std::size_t kBatchMaxMetrics = 1000;
constexpr std::size_t kBatchMaxParams = 100;
constexpr std::size_t kBatchMaxTags = 100;
constexpr std::size_t kBatchMaxEntities = 1000;
constexpr std::size_t kBatchMaxBytes = 900 * 1000;  // under the server's 1 MB request limit
// What strata reads of an answer, and of the variables it takes.
constexpr std::size_t kMaxResponseBytes = 1 << 20;
constexpr std::size_t kMaxEnvBytes = 8192;
constexpr std::size_t kMaxUriBytes = 2048;
constexpr std::size_t kMaxErrorText = 400;

// The number of UTF-8 code points in `text` (a stray byte counts as one).
std::size_t code_point_count(const std::string& text) {
  std::size_t n = 0;
  for (char c : text) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

// The first `limit` code points of `text` (Python's text[:limit]).
std::string cut_code_points(const std::string& text, std::size_t limit) {
  std::size_t seen = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) {
      if (seen == limit) return text.substr(0, i);
      ++seen;
    }
  }
  return text;
}

// Python's str() of a hyperparameter value.
std::string python_str(const json& value) {
  if (value.is_string()) return value.get<std::string>();
  return python_repr(value);  // numbers, True/False, None and lists as str() writes them
}

struct FlatParam {
  std::string key;
  std::string value;
  std::size_t length = 0;  // code points before the cut
};

void flatten_params(const json& value, const std::string& key, std::vector<FlatParam>& out) {
  if (value.is_object()) {  // _flatten_dict: an empty map gives no entry
    for (auto it = value.begin(); it != value.end(); ++it) flatten_params(it.value(), key + "/" + it.key(), out);
    return;
  }
  FlatParam p;
  p.key = key;
  const std::string text = python_str(value);
  p.length = code_point_count(text);
  p.value = cut_code_points(text, kMLFlowParamValueLimit);
  out.push_back(std::move(p));
}

std::vector<FlatParam> flat_params(const Hyperparams& params) {
  std::vector<FlatParam> out;
  for (const auto& [key, value] : params) flatten_params(value, key, out);
  return out;
}

// Text from outside, shortened for a message.
std::string clip(const std::string& text) {
  if (text.size() <= kMaxErrorText) return text;
  return text.substr(0, kMaxErrorText) + "... (" + std::to_string(text.size()) + " bytes)";
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

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

// ---- HTTP -------------------------------------------------------------------

struct Response {
  long status = 0;        // HTTP status; 0 when no answer came
  std::string body;
  std::string failure;    // why the request failed ("" when it got an answer)
  bool cut_off = false;   // the logger is shutting down
};

#if STRATA_HAVE_CURL

void init_curl_once() {
  static std::once_flag once;
  static CURLcode code = CURLE_OK;
  std::call_once(once, [] { code = curl_global_init(CURL_GLOBAL_DEFAULT); });
  STRATA_CHECK(code == CURLE_OK, Error, "[mlflow] libcurl failed to initialise: ", curl_easy_strerror(code));
}

struct Body {
  std::string text;
  bool too_long = false;
};

size_t write_body(char* data, size_t size, size_t count, void* user) {
  Body& body = *static_cast<Body*>(user);
  const size_t n = size * count;
  if (body.text.size() + n > kMaxResponseBytes) {
    body.too_long = true;
    return 0;  // curl stops with CURLE_WRITE_ERROR
  }
  body.text.append(data, n);
  return n;
}

int check_abort(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return static_cast<const std::atomic<bool>*>(user)->load() ? 1 : 0;
}

// One connection to the server, used by the logger's thread alone.
class Http {
 public:
  Http(const std::string& token, const std::string& user, const std::string& password, bool insecure,
       const std::string& ca_file, const std::atomic<bool>* abort)
      : abort_(abort) {
    init_curl_once();
    curl_ = curl_easy_init();
    STRATA_CHECK(curl_ != nullptr, Error, "[mlflow] libcurl could not make a handle (out of memory?)");
    headers_ = curl_slist_append(headers_, "Content-Type: application/json");
    headers_ = curl_slist_append(headers_, "Expect:");
    if (!token.empty()) headers_ = curl_slist_append(headers_, ("Authorization: Bearer " + token).c_str());
    curl_easy_setopt(curl_, CURLOPT_HTTPHEADER, headers_);
    curl_easy_setopt(curl_, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl_, CURLOPT_FOLLOWLOCATION, 0L);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(curl_, CURLOPT_PROTOCOLS_STR, "http,https");
#endif
    curl_easy_setopt(curl_, CURLOPT_WRITEFUNCTION, write_body);
    curl_easy_setopt(curl_, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(curl_, CURLOPT_XFERINFOFUNCTION, check_abort);
    curl_easy_setopt(curl_, CURLOPT_XFERINFODATA, abort_);
    curl_easy_setopt(curl_, CURLOPT_USERAGENT, "strata-mlflow-logger");
    if (token.empty() && !user.empty()) {
      curl_easy_setopt(curl_, CURLOPT_HTTPAUTH, CURLAUTH_BASIC);
      curl_easy_setopt(curl_, CURLOPT_USERNAME, user.c_str());
      curl_easy_setopt(curl_, CURLOPT_PASSWORD, password.c_str());
    }
    if (insecure) {
      curl_easy_setopt(curl_, CURLOPT_SSL_VERIFYPEER, 0L);
      curl_easy_setopt(curl_, CURLOPT_SSL_VERIFYHOST, 0L);
    }
    if (!ca_file.empty()) curl_easy_setopt(curl_, CURLOPT_CAINFO, ca_file.c_str());
  }
  ~Http() {
    curl_easy_cleanup(curl_);
    curl_slist_free_all(headers_);
  }
  Http(const Http&) = delete;
  Http& operator=(const Http&) = delete;

  // GET when `body` is empty, else POST it.
  Response request(const std::string& url, const std::string& body, double timeout_s) {
    Body answer;
    curl_easy_setopt(curl_, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl_, CURLOPT_WRITEDATA, &answer);
    const long timeout_ms = std::max(1L, static_cast<long>(timeout_s * 1000));
    curl_easy_setopt(curl_, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(curl_, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
    if (body.empty()) {
      curl_easy_setopt(curl_, CURLOPT_HTTPGET, 1L);
    } else {
      curl_easy_setopt(curl_, CURLOPT_POST, 1L);
      curl_easy_setopt(curl_, CURLOPT_POSTFIELDS, body.c_str());
      curl_easy_setopt(curl_, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    }
    const CURLcode code = curl_easy_perform(curl_);
    Response r;
    if (code != CURLE_OK) {
      r.cut_off = code == CURLE_ABORTED_BY_CALLBACK;
      r.failure = answer.too_long ? "the answer is over " + std::to_string(kMaxResponseBytes) + " bytes"
                                  : std::string(curl_easy_strerror(code));
      return r;
    }
    curl_easy_getinfo(curl_, CURLINFO_RESPONSE_CODE, &r.status);
    r.body = std::move(answer.text);
    return r;
  }

  std::string escape(const std::string& text) {
    char* e = curl_easy_escape(curl_, text.c_str(), static_cast<int>(text.size()));
    std::string out = e ? e : "";
    curl_free(e);
    return out;
  }

 private:
  CURL* curl_ = nullptr;
  curl_slist* headers_ = nullptr;
  const std::atomic<bool>* abort_;
};

#else  // no libcurl: the constructor refuses before any of this runs

class Http {
 public:
  Http(const std::string&, const std::string&, const std::string&, bool, const std::string&,
       const std::atomic<bool>*) {}
  Response request(const std::string&, const std::string&, double) {
    Response r;
    r.failure = "strata was built without libcurl";
    return r;
  }
  std::string escape(const std::string& text) { return text; }
};

#endif

// What a request came to.
enum class Outcome { kOk, kRetry, kRefused, kCutOff };

}  // namespace

// ---- the public helpers ------------------------------------------------------

std::vector<std::pair<std::string, std::string>> mlflow_params(const Hyperparams& params) {
  std::vector<std::pair<std::string, std::string>> out;
  for (FlatParam& p : flat_params(params)) out.emplace_back(std::move(p.key), std::move(p.value));
  return out;
}

std::string mlflow_metric_key(const std::string& key) {
  std::string out;
  for (char c : key) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '/' || c == '.' || c == ' ' || c == '-';
    if (ok) out.push_back(c);
  }
  return out;
}

// ---- the logger --------------------------------------------------------------

struct MLFlowLogger::Impl {
  enum class Kind { kMetric, kParam, kTag, kTerminate };
  struct Entry {
    Kind kind = Kind::kMetric;
    std::string key;
    std::string text;  // param or tag value; the status of kTerminate
    double value = 0;
    int64_t timestamp = 0;
    int64_t step = 0;
    uint64_t seq = 0;
  };

  MLFlowOptions options;
  std::string uri;
  std::string token, user, password, ca_file;
  std::map<std::string, std::string> start_tags;  // run_tags(), made by the constructor
  bool insecure = false;

  mutable std::mutex mutex;
  std::condition_variable wake;      // the thread: entries, or stop
  std::condition_variable progress;  // finalize: entries done
  std::deque<Entry> queue;
  std::vector<Entry> in_flight;      // taken by the thread, not yet done
  uint64_t next_seq = 1;
  uint64_t reported_seq = 0;         // entries up to here were waited for by finalize
  bool stop = false;
  std::atomic<bool> abort{false};
  MLFlowReport state;
  bool full_warned = false;
  bool run_failed = false;           // the run cannot be had: nothing will be sent
  std::set<std::string> renamed_warned;
  std::thread thread;

  // The thread's own.
  std::unique_ptr<Http> http;
  int failures = 0;  // consecutive retryable failures

  // ---- the caller's side (under `mutex`) ----

  void push(Entry e) {
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

  // Every entry with a sequence number up to `seq` is done (sent, given up
  // or dropped): the queue and the batch in flight go in order.
  uint64_t done_through() const {
    if (!in_flight.empty()) return in_flight.front().seq - 1;
    if (!queue.empty()) return queue.front().seq - 1;
    return next_seq - 1;
  }

  void warn_renamed(const std::string& what, const std::string& from, const std::string& to) {
    if (renamed_warned.size() >= 1000 || !renamed_warned.insert(what + from).second) return;
    log::warning("[mlflow] MLflow only allows '_', '/', '.', ' ' and '-' besides letters and digits in a ", what,
                 " name; ", clip(from), " is sent as ", clip(to));
  }

  // A key as MLflow takes it, or "" (with a warning) when it cannot be.
  std::string clean_key(const std::string& what, const std::string& key) {
    const std::string clean = mlflow_metric_key(key);
    if (clean != key) warn_renamed(what, key, clean);
    if (clean.empty() || clean.size() > kMaxKeyLength) {
      log::warning("[mlflow] the ", what, " '", clip(key), "' is not sent: MLflow takes names of 1 to ",
                   kMaxKeyLength, " characters");
      return "";
    }
    return clean;
  }

  // ---- the thread ----

  std::string api(const std::string& path) const { return uri + "/api/2.0/mlflow/" + path; }

  void note_failure(const std::string& what) {
    std::lock_guard<std::mutex> lock(mutex);
    state.last_error = what;
  }

  // One request; the answer's JSON in `out`.
  Outcome call(const std::string& path, const json* body, json& out, std::string& error) {
    std::string text;
    if (body) text = body->dump(-1, ' ', false, json::error_handler_t::replace);
    Response r = http->request(api(path), text, options.request_timeout_s);
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
    error = "HTTP " + std::to_string(r.status);
    if (out.is_object() && out.contains("error_code") && out["error_code"].is_string()) {
      error += " " + out["error_code"].get<std::string>();
      if (out.contains("message") && out["message"].is_string()) error += ": " + clip(out["message"].get<std::string>());
    } else if (!r.body.empty()) {
      error += ": " + clip(r.body);
    }
    const long s = r.status;
    return (s == 408 || s == 429 || s >= 500) ? Outcome::kRetry : Outcome::kRefused;
  }

  void warn_unreachable(const std::string& error) {
    bool first = false;
    {
      std::lock_guard<std::mutex> lock(mutex);
      state.last_error = error;
      if (!state.unreachable_warned) state.unreachable_warned = first = true;
    }
    if (first) {
      log::warning("[mlflow] no usable answer from the tracking server at ", uri, " (", error,
                   "); training goes on, the logger keeps up to ", options.max_queued,
                   " entries queued and retries with backoff; this warning is printed once");
    }
  }

  // Waits the backoff of the current failure count; false when stopping.
  bool backoff() {
    const double wait =
        std::min(options.max_backoff_s, options.initial_backoff_s * std::pow(2.0, std::min(failures - 1, 30)));
    std::unique_lock<std::mutex> lock(mutex);
    return !wake.wait_for(lock, std::chrono::duration<double>(wait), [&] { return abort.load(); });
  }

  static std::string string_field(const json& j, std::initializer_list<const char*> path) {
    const json* at = &j;
    for (const char* p : path) {
      if (!at->is_object() || !at->contains(p)) return "";
      at = &(*at)[p];
    }
    if (at->is_string()) return at->get<std::string>();
    if (at->is_number_integer()) return std::to_string(at->get<int64_t>());
    return "";
  }

  // Resolves the experiment and creates or finds the run. kOk, kRetry,
  // kRefused (with `error`), kCutOff.
  Outcome open_run(std::string& error) {
    json answer;
    std::string experiment_id;
    std::string run_id = options.run_id;
    if (!run_id.empty()) {
      Outcome o = call("runs/get?run_id=" + http->escape(run_id), nullptr, answer, error);
      if (o != Outcome::kOk) {
        if (o == Outcome::kRefused) error = "run_id '" + clip(run_id) + "' cannot be continued: " + error;
        return o;
      }
      experiment_id = string_field(answer, {"run", "info", "experiment_id"});
      if (experiment_id.empty()) {
        error = "runs/get answered without run.info.experiment_id: " + clip(answer.dump());
        return Outcome::kRefused;
      }
    } else {
      for (int round = 0; round < 3 && experiment_id.empty(); ++round) {
        Outcome o = call("experiments/get-by-name?experiment_name=" + http->escape(options.experiment_name), nullptr,
                         answer, error);
        if (o == Outcome::kOk) {
          if (string_field(answer, {"experiment", "lifecycle_stage"}) == "deleted") {
            error = "the experiment '" + clip(options.experiment_name) +
                    "' is deleted on the server; restore it (mlflow experiments restore) or choose another name";
            return Outcome::kRefused;
          }
          experiment_id = string_field(answer, {"experiment", "experiment_id"});
          if (experiment_id.empty()) {
            error = "experiments/get-by-name answered without experiment.experiment_id: " + clip(answer.dump());
            return Outcome::kRefused;
          }
          break;
        }
        const bool missing = o == Outcome::kRefused && error.find("RESOURCE_DOES_NOT_EXIST") != std::string::npos;
        if (!missing) return o;
        log::info("[mlflow] experiment '", options.experiment_name, "' not found on ", uri, "; creating it");
        json create = {{"name", options.experiment_name}};
        o = call("experiments/create", &create, answer, error);
        if (o == Outcome::kOk) {
          experiment_id = string_field(answer, {"experiment_id"});
          if (experiment_id.empty()) {
            error = "experiments/create answered without experiment_id: " + clip(answer.dump());
            return Outcome::kRefused;
          }
        } else if (!(o == Outcome::kRefused && error.find("RESOURCE_ALREADY_EXISTS") != std::string::npos)) {
          return o;  // else another client made it meanwhile: look it up again
        }
      }
      if (experiment_id.empty()) return Outcome::kRetry;
      json tags = json::array();
      for (const auto& [k, v] : start_tags) tags.push_back({{"key", k}, {"value", v}});
      json create = {{"experiment_id", experiment_id}, {"start_time", now_ms()}, {"tags", tags}};
      if (!options.run_name.empty()) create["run_name"] = options.run_name;
      Outcome o = call("runs/create", &create, answer, error);
      if (o != Outcome::kOk) return o;
      run_id = string_field(answer, {"run", "info", "run_id"});
      if (run_id.empty()) {
        error = "runs/create answered without run.info.run_id: " + clip(answer.dump());
        return Outcome::kRefused;
      }
    }
    std::lock_guard<std::mutex> lock(mutex);
    state.run_id = run_id;
    state.experiment_id = experiment_id;
    return Outcome::kOk;
  }

  // The tags a new run starts with: MLflow's context tags (user, source),
  // the options' tags over them, and mlflow.runName from run_name.
  std::map<std::string, std::string> run_tags() {
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
      if (value.size() > kMaxTagValueLength) {
        log::warning("[mlflow] tag '", key, "' is ", value.size(), " bytes long; MLflow keeps ", kMaxTagValueLength,
                     ", the rest is cut");
        value = cut_code_points(value, kMaxTagValueLength);
        while (value.size() > kMaxTagValueLength) value = cut_code_points(value, code_point_count(value) - 1);
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

  // Moves the next batch from the queue to in_flight: metrics, params and
  // tags within MLflow's limits (no key twice among params or tags), or
  // one terminate entry. Under `mutex`.
  void take_batch() {
    in_flight.clear();
    if (queue.front().kind == Kind::kTerminate) {
      in_flight.push_back(std::move(queue.front()));
      queue.pop_front();
      return;
    }
    std::size_t metrics = 0, params = 0, tags = 0, bytes = 0;
    std::set<std::string> param_keys, tag_keys;
    while (!queue.empty()) {
      const Entry& e = queue.front();
      if (e.kind == Kind::kTerminate) break;
      if (metrics + params + tags >= kBatchMaxEntities) break;
      const std::size_t size = e.key.size() + e.text.size() + 96;
      if (bytes + size > kBatchMaxBytes && !in_flight.empty()) break;
      if (e.kind == Kind::kMetric) {
        if (metrics >= kBatchMaxMetrics) break;
        ++metrics;
      } else if (e.kind == Kind::kParam) {
        if (params >= kBatchMaxParams || param_keys.count(e.key)) break;
        param_keys.insert(e.key);
        ++params;
      } else {
        if (tags >= kBatchMaxTags || tag_keys.count(e.key)) break;
        tag_keys.insert(e.key);
        ++tags;
      }
      bytes += size;
      in_flight.push_back(std::move(queue.front()));
      queue.pop_front();
    }
  }

  json batch_body(const std::string& run_id) const {
    json metrics = json::array(), params = json::array(), tags = json::array();
    for (const Entry& e : in_flight) {
      if (e.kind == Kind::kMetric) {
        json value;
        // Proto3's JSON for the doubles JSON lacks, as MLflow's client sends them.
        if (std::isnan(e.value)) value = "NaN";
        else if (std::isinf(e.value)) value = e.value > 0 ? "Infinity" : "-Infinity";
        else value = e.value;
        metrics.push_back({{"key", e.key}, {"value", value}, {"timestamp", e.timestamp}, {"step", e.step}});
      } else if (e.kind == Kind::kParam) {
        params.push_back({{"key", e.key}, {"value", e.text}});
      } else {
        tags.push_back({{"key", e.key}, {"value", e.text}});
      }
    }
    return {{"run_id", run_id}, {"metrics", metrics}, {"params", params}, {"tags", tags}};
  }

  // Sends in_flight (a batch, or a terminate entry). kOk, kRetry, kRefused, kCutOff.
  Outcome send_batch(const std::string& run_id, std::string& error) {
    json answer;
    if (in_flight.front().kind == Kind::kTerminate) {
      json update = {{"run_id", run_id}, {"status", in_flight.front().text}, {"end_time", in_flight.front().timestamp}};
      return call("runs/update", &update, answer, error);
    }
    json body = batch_body(run_id);
    return call("runs/log-batch", &body, answer, error);
  }

  // Marks in_flight done: sent, or given up.
  void finish_batch(bool sent) {
    std::lock_guard<std::mutex> lock(mutex);
    for (const Entry& e : in_flight) {
      if (e.kind == Kind::kTerminate) {
        state.terminated = sent;
      } else if (sent) {
        ++state.sent;
      } else {
        ++state.given_up;
      }
    }
    in_flight.clear();
    progress.notify_all();
  }

  // Drops what is queued: the run cannot be had.
  void drop_all() {
    std::lock_guard<std::mutex> lock(mutex);
    for (const Entry& e : queue) state.given_up += e.kind == Kind::kTerminate ? 0 : 1;
    queue.clear();
    progress.notify_all();
  }

  void run() {
    http = std::make_unique<Http>(token, user, password, insecure, ca_file, &abort);
    bool have_run = false;
    std::string run_id;
    int attempts = 0;  // tries of the batch in flight
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mutex);
        wake.wait(lock, [&] {
          if (abort) return true;
          if (run_failed) return stop || !queue.empty();
          return stop || !queue.empty() || !in_flight.empty() || !have_run;
        });
        if (abort || (stop && queue.empty() && in_flight.empty())) break;
        if (run_failed) {
          // Nothing can be sent: what arrives is counted as given up.
          lock.unlock();
          drop_all();
          continue;
        }
        if (have_run && in_flight.empty()) {
          if (queue.empty()) continue;
          take_batch();
          attempts = 0;
        }
      }
      std::string error;
      Outcome o;
      if (!have_run) {
        o = open_run(error);
        if (o == Outcome::kOk) {
          have_run = true;
          run_id = state_run_id();
          failures = 0;
          continue;
        }
      } else {
        o = send_batch(run_id, error);
        ++attempts;
        if (o == Outcome::kOk) {
          failures = 0;
          finish_batch(true);
          continue;
        }
      }
      if (o == Outcome::kCutOff) break;
      if (o == Outcome::kRefused) {
        if (!have_run) {
          log::warning("[mlflow] the tracking server at ", uri, " refused to open the run (", error,
                       "); nothing of this run will be sent");
          note_failure(error);
          std::lock_guard<std::mutex> lock(mutex);
          run_failed = true;
          continue;
        }
        log::warning("[mlflow] the tracking server at ", uri, " refused ", in_flight.size(), " entries (", error,
                     "); they are dropped");
        note_failure(error);
        finish_batch(false);
        continue;
      }
      // A failure that may pass: warn once, back off, try again.
      ++failures;
      warn_unreachable(error);
      if (have_run && attempts >= options.max_attempts) {
        finish_batch(false);
        attempts = 0;
      }
      if (!backoff()) break;
    }
    http.reset();
  }

  std::string state_run_id() {
    std::lock_guard<std::mutex> lock(mutex);
    return state.run_id;
  }

  // Waits until the entries up to `seq` are done or `deadline` passes.
  bool wait_done(uint64_t seq, Clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mutex);
    return progress.wait_until(lock, deadline, [&] { return done_through() >= seq; });
  }

  // "12 entries (10 metrics, 2 params) are not sent; 3 were dropped ...".
  std::string unsent_text() const {
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
};

MLFlowLogger::MLFlowLogger(MLFlowOptions options) : impl_(std::make_unique<Impl>()) {
#if !STRATA_HAVE_CURL
  throw ConfigError(
      "[mlflow] strata was built without libcurl, which the MLflow logger sends with; install it "
      "(Debian: apt-get install libcurl4-openssl-dev, or scripts/install-deps.sh) and configure the build again");
#endif
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
  m.token = env_value("MLFLOW_TRACKING_TOKEN");
  m.user = env_value("MLFLOW_TRACKING_USERNAME");
  m.password = env_value("MLFLOW_TRACKING_PASSWORD");
  STRATA_CHECK(m.user.empty() == m.password.empty(), ConfigError,
               "[mlflow] MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD go together; set both or neither");
  const std::string insecure = env_value("MLFLOW_TRACKING_INSECURE_TLS");
  m.insecure = insecure == "true" || insecure == "True" || insecure == "1";
  m.ca_file = env_value("MLFLOW_TRACKING_SERVER_CERT_PATH");
  m.options = std::move(options);
  m.start_tags = m.run_tags();
  m.thread = std::thread([&m] {
    try {
      m.run();
    } catch (const std::exception& e) {
      log::warning("[mlflow] the logger's thread stopped: ", e.what(), "; nothing more is sent");
      std::lock_guard<std::mutex> lock(m.mutex);
      m.state.last_error = e.what();
      m.run_failed = true;
      m.in_flight.clear();
      m.queue.clear();
      m.progress.notify_all();
    }
  });
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
  const int64_t timestamp = now_ms();
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
  for (FlatParam& p : flat_params(params)) {
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
    e.timestamp = now_ms();
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
