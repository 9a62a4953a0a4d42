// MLFlowLogger's state: the bounded queue the caller's thread fills and
// the sending thread that empties it into the tracking server (Note [The
// MLflow logger never slows training] in mlflow_logger.cpp). The caller's
// side is in mlflow_logger.cpp, the thread's in mlflow_sender.cpp.
// Internal to the MLflow logger.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "mlflow_api.h"
#include "mlflow_http.h"
#include "strata/loggers/mlflow_logger.h"

namespace strata::trainer {

struct MLFlowLogger::Impl {
  using Clock = std::chrono::steady_clock;
  using Outcome = detail::Outcome;

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

  // Set by the constructor, read by both sides.
  MLFlowOptions options;
  std::string uri;
  detail::HttpAuth auth;
  std::map<std::string, std::string> start_tags;  // run_tags(), made by the constructor

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
  std::unique_ptr<detail::MlflowApi> api;
  int failures = 0;  // consecutive retryable failures

  // ---- the caller's side (mlflow_logger.cpp; under `mutex`) ----

  /// Queues `e`, dropping the oldest entry when the queue is full.
  void push(Entry e);
  /// Every entry with a sequence number up to this is done (sent, given
  /// up or dropped): the queue and the batch in flight go in order.
  uint64_t done_through() const;
  /// A key as MLflow takes it, or "" (with a warning) when it cannot be.
  std::string clean_key(const std::string& what, const std::string& key);
  /// The tags a new run starts with: MLflow's context tags (user, source),
  /// the options' tags over them, and mlflow.runName from run_name.
  std::map<std::string, std::string> run_tags();
  /// "12 metric, 0 param and 0 tag entries are not sent yet; ...".
  std::string unsent_text() const;
  /// Waits until the entries up to `seq` are done or `deadline` passes.
  bool wait_done(uint64_t seq, Clock::time_point deadline);

  // ---- the thread (mlflow_sender.cpp) ----

  /// Starts the thread; a failure inside it stops the sending, with a
  /// warning.
  void start();

 private:
  struct Sending;  // the thread's place: the run, the tries of the batch in flight

  void warn_renamed(const std::string& what, const std::string& from, const std::string& to);
  void run();
  bool next_work(Sending& s);
  Outcome open_run(std::string& error);
  Outcome send_in_flight(const std::string& run_id, std::string& error);
  void refused(bool have_run, const std::string& error);
  void take_batch();
  nlohmann::json batch_body(const std::string& run_id) const;
  void finish_batch(bool sent);
  void drop_all();
  void note_failure(const std::string& what);
  void warn_unreachable(const std::string& error);
  bool backoff();
};

}  // namespace strata::trainer
