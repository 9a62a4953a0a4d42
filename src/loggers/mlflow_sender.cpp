// The MLflow logger's sending thread (mlflow_sender.h): it opens the run,
// then sends the queue in batches within MLflow's limits, retrying what
// may pass and giving up what will not (Note [The MLflow logger never
// slows training] in mlflow_logger.cpp).
#include "mlflow_sender.h"

#include <algorithm>
#include <cmath>
#include <exception>

#include "strata/core/log.h"

namespace strata::trainer {
namespace {

using json = nlohmann::json;
using detail::Outcome;

// MLflow's limits on one runs/log-batch (mlflow/utils/validation.py).
constexpr std::size_t kBatchMaxMetrics = 1000;
constexpr std::size_t kBatchMaxParams = 100;
constexpr std::size_t kBatchMaxTags = 100;
constexpr std::size_t kBatchMaxEntities = 1000;
constexpr std::size_t kBatchMaxBytes = 900 * 1000;  // under the server's 1 MB request limit

// A metric value as MLflow's client sends it: proto3's JSON for the
// doubles JSON lacks.
json metric_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  return v;
}

}  // namespace

struct MLFlowLogger::Impl::Sending {
  bool have_run = false;
  std::string run_id;
  int attempts = 0;  // tries of the batch in flight
};

void MLFlowLogger::Impl::start() {
  thread = std::thread([this] {
    try {
      run();
    } catch (const std::exception& e) {
      log::warning("[mlflow] the logger's thread stopped: ", e.what(), "; nothing more is sent");
      std::lock_guard<std::mutex> lock(mutex);
      state.last_error = e.what();
      run_failed = true;
      in_flight.clear();
      queue.clear();
      progress.notify_all();
    }
  });
}

void MLFlowLogger::Impl::run() {
  api = std::make_unique<detail::MlflowApi>(uri, auth, options.request_timeout_s, &abort);
  Sending s;
  while (next_work(s)) {
    std::string error;
    Outcome o;
    if (!s.have_run) {
      o = open_run(error);
      if (o == Outcome::kOk) {
        s.have_run = true;
        std::lock_guard<std::mutex> lock(mutex);
        s.run_id = state.run_id;
      }
    } else {
      o = send_in_flight(s.run_id, error);
      ++s.attempts;
      if (o == Outcome::kOk) finish_batch(true);
    }
    if (o == Outcome::kOk) {
      failures = 0;
      continue;
    }
    if (o == Outcome::kCutOff) break;
    if (o == Outcome::kRefused) {
      refused(s.have_run, error);
      continue;
    }
    // A failure that may pass: warn once, back off, try again.
    ++failures;
    warn_unreachable(error);
    if (s.have_run && s.attempts >= options.max_attempts) {
      finish_batch(false);
      s.attempts = 0;
    }
    if (!backoff()) break;
  }
  api.reset();
}

// Waits for work: the run to open, or a batch to send (taken into
// in_flight when none is there). False when the thread is to stop.
bool MLFlowLogger::Impl::next_work(Sending& s) {
  while (true) {
    std::unique_lock<std::mutex> lock(mutex);
    wake.wait(lock, [&] {
      if (abort) return true;
      if (run_failed) return stop || !queue.empty();
      return stop || !queue.empty() || !in_flight.empty() || !s.have_run;
    });
    if (abort || (stop && queue.empty() && in_flight.empty())) return false;
    if (run_failed) {
      // Nothing can be sent: what arrives is counted as given up.
      lock.unlock();
      drop_all();
      continue;
    }
    if (s.have_run && in_flight.empty()) {
      if (queue.empty()) continue;
      take_batch();
      s.attempts = 0;
    }
    return true;
  }
}

// Resolves the experiment and creates the run, or finds the run to
// continue; on success the ids are in `state`.
MLFlowLogger::Impl::Outcome MLFlowLogger::Impl::open_run(std::string& error) {
  std::string experiment_id;
  std::string run_id = options.run_id;
  Outcome o = Outcome::kOk;
  if (!run_id.empty()) {
    o = api->run_experiment(run_id, experiment_id, error);
  } else {
    o = api->experiment_by_name(options.experiment_name, experiment_id, error);
    if (o == Outcome::kOk) o = api->create_run(experiment_id, options.run_name, start_tags, run_id, error);
  }
  if (o != Outcome::kOk) return o;
  std::lock_guard<std::mutex> lock(mutex);
  state.run_id = run_id;
  state.experiment_id = experiment_id;
  return Outcome::kOk;
}

// Sends in_flight: a batch, or a terminate entry.
MLFlowLogger::Impl::Outcome MLFlowLogger::Impl::send_in_flight(const std::string& run_id, std::string& error) {
  const Entry& first = in_flight.front();
  if (first.kind == Kind::kTerminate) return api->update_run(run_id, first.text, first.timestamp, error);
  return api->log_batch(batch_body(run_id), error);
}

// A refusal that will not pass: the run cannot be had (nothing of it will
// be sent), or the batch in flight is dropped.
void MLFlowLogger::Impl::refused(bool have_run, const std::string& error) {
  if (!have_run) {
    log::warning("[mlflow] the tracking server at ", uri, " refused to open the run (", error,
                 "); nothing of this run will be sent");
    note_failure(error);
    std::lock_guard<std::mutex> lock(mutex);
    run_failed = true;
    return;
  }
  log::warning("[mlflow] the tracking server at ", uri, " refused ", in_flight.size(), " entries (", error,
               "); they are dropped");
  note_failure(error);
  finish_batch(false);
}

// Moves the next batch from the queue to in_flight: metrics, params and
// tags within MLflow's limits (no key twice among params or tags), or
// one terminate entry. Under `mutex`.
void MLFlowLogger::Impl::take_batch() {
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

json MLFlowLogger::Impl::batch_body(const std::string& run_id) const {
  json metrics = json::array(), params = json::array(), tags = json::array();
  for (const Entry& e : in_flight) {
    if (e.kind == Kind::kMetric) {
      metrics.push_back(
          {{"key", e.key}, {"value", metric_value(e.value)}, {"timestamp", e.timestamp}, {"step", e.step}});
    } else if (e.kind == Kind::kParam) {
      params.push_back({{"key", e.key}, {"value", e.text}});
    } else {
      tags.push_back({{"key", e.key}, {"value", e.text}});
    }
  }
  return {{"run_id", run_id}, {"metrics", metrics}, {"params", params}, {"tags", tags}};
}

// Marks in_flight done: sent, or given up.
void MLFlowLogger::Impl::finish_batch(bool sent) {
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
void MLFlowLogger::Impl::drop_all() {
  std::lock_guard<std::mutex> lock(mutex);
  for (const Entry& e : queue) state.given_up += e.kind == Kind::kTerminate ? 0 : 1;
  queue.clear();
  progress.notify_all();
}

void MLFlowLogger::Impl::note_failure(const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex);
  state.last_error = what;
}

void MLFlowLogger::Impl::warn_unreachable(const std::string& error) {
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
bool MLFlowLogger::Impl::backoff() {
  const double wait =
      std::min(options.max_backoff_s, options.initial_backoff_s * std::pow(2.0, std::min(failures - 1, 30)));
  std::unique_lock<std::mutex> lock(mutex);
  return !wake.wait_for(lock, std::chrono::duration<double>(wait), [&] { return abort.load(); });
}

}  // namespace strata::trainer
