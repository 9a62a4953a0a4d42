// The state behind comm::Group (its queue, worker thread, statistics and
// error handling) and the helpers its operations share; private to the
// comm area. group.cpp holds the operations, group_segmented.cpp the
// segmented ones (Note [Segmented layouts] in backend.h).
#pragma once

#include <ATen/ATen.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "debug.h"
#include "strata/comm/group.h"
#include "strata/core/error.h"
#include "strata/runtime/heartbeat.h"
#include "task.h"

namespace strata::comm {

using detail::OpKind;
using detail::Task;
using strata::detail::cat;

// Note [One worker thread per group]
// Collectives must be issued in the same order on every rank. Async calls
// go through one queue to the group's worker thread, in call order. A
// synchronous call that finds the queue empty and the worker idle runs on
// the caller's thread instead (Note [Synchronous fast path]); otherwise it
// queues behind the async calls and waits, so no call ever overtakes an
// earlier one. Either way one thread at a time is inside the backend
// (`busy`), so backends need no locking.
//
// Note [Synchronous fast path]
// Handing a small synchronous collective to the worker and waiting for it
// costs two thread wake-ups (tens of microseconds on a loaded machine, as
// much as a 64 KB shared-memory all-reduce itself). Running it in place
// costs a mutex and a flag.
//
// Note [Enqueueing in call order]
// A stream-ordered backend has no worker thread: every call enqueues on
// the caller's thread under `enqueue_mu`, which also takes the call number,
// so calls from several threads (autograd's device threads among them)
// reach the backend one at a time and in the order of their numbers.

inline void check_dtype(OpKind op, const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: case at::kDouble: case at::kBFloat16:
    case at::kHalf: case at::kInt: case at::kLong:
      return;
    default:
      throw ConfigError(cat("[comm] ", detail::op_name(op), ": dtype ", t.scalar_type(),
                            " is not supported; use float32, float64, bfloat16, float16, int32 or int64"));
  }
}

inline CommStats::Entry& entry_for(CommStats& s, OpKind op) {
  switch (op) {
    case OpKind::kAllReduce: return s.all_reduce;
    case OpKind::kAllGather: return s.all_gather;
    case OpKind::kReduceScatter: return s.reduce_scatter;
    case OpKind::kBroadcast: return s.broadcast;
    case OpKind::kBarrier: return s.barrier;
  }
  return s.barrier;
}

/// Divides a sum by `n` in place (integers: floor division).
inline void divide(at::Tensor& t, int n) {
  if (n == 1) return;
  if (at::isIntegralType(t.scalar_type(), /*includeBool=*/false)) t.div_(n, "floor");
  else t.div_(n);
}

struct Group::State : std::enable_shared_from_this<Group::State> {
  std::shared_ptr<Backend> backend;
  GroupOptions options;
  std::atomic<bool> debug{false};
  bool stream_ordered = false;
  std::mutex enqueue_mu;  // Note [Enqueueing in call order]; taken before mu

  std::mutex mu;  // guards everything below
  std::condition_variable cv;
  std::deque<std::shared_ptr<Task>> queue;
  std::vector<std::shared_ptr<Task>> unsynced;  // for synchronize()
  std::thread worker;
  bool stopping = false;
  bool busy = false;  // a thread (the worker or a synchronous caller) is in the backend
  int64_t next_seq = 1;
  std::string broken;  // first backend failure: later calls fail fast

  mutable std::mutex stats_mu;
  CommStats stats;

  ~State() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    cv.notify_all();
    if (worker.joinable()) worker.join();
  }

  /// Numbers `task` and describes it (under mu).
  void label(Task& task, const at::Tensor* t, int64_t reduce_op, int64_t src, const std::string& name) {
    task.seq = next_seq++;
    task.debug = debug.load();
    task.descriptor = detail::describe(task.op, task.seq, t, reduce_op, src, name);
    task.label = std::string(detail::op_name(task.op)) + (name.empty() ? "" : " '" + name + "'") + " #" +
                 std::to_string(task.seq);
  }

  void track(const std::shared_ptr<Task>& task, bool sync) {
    unsynced.erase(std::remove_if(unsynced.begin(), unsynced.end(),
                                  [](const std::shared_ptr<Task>& w) { return w->settled(); }),
                   unsynced.end());
    if (!sync) unsynced.push_back(task);
  }

  /// Queues `task` (taking the next call number) and returns it; with
  /// `sync`, runs it on this thread when nothing is queued or running
  /// (Note [Synchronous fast path]) and returns it finished. Over a
  /// stream-ordered backend, enqueues it on this thread (Note [Enqueueing
  /// in call order]).
  std::shared_ptr<Task> submit(std::shared_ptr<Task> task, const at::Tensor* t, int64_t reduce_op,
                               int64_t src, const std::string& name, bool sync = false) {
    if (stream_ordered) return enqueue(std::move(task), t, reduce_op, src, name, sync);
    std::unique_lock<std::mutex> lock(mu);
    label(*task, t, reduce_op, src, name);
    if (sync && queue.empty() && !busy) {
      busy = true;
      lock.unlock();
      std::exception_ptr error;
      try {
        error = execute(*task);
      } catch (...) {
        error = std::current_exception();
      }
      task->release_closures();
      task->finish(error);
      lock.lock();
      busy = false;
      if (!queue.empty()) cv.notify_all();
      return task;
    }
    if (!worker.joinable()) worker = std::thread([this] { loop(); });
    track(task, sync);
    queue.push_back(task);
    cv.notify_all();
    return task;
  }

  /// Note [Stream-ordered tasks] (task.h), Note [Enqueueing in call order].
  std::shared_ptr<Task> enqueue(std::shared_ptr<Task> task, const at::Tensor* t, int64_t reduce_op, int64_t src,
                                const std::string& name, bool sync) {
    std::lock_guard<std::mutex> order(enqueue_mu);
    {
      std::lock_guard<std::mutex> lock(mu);
      label(*task, t, reduce_op, src, name);
      track(task, sync);
    }
    std::weak_ptr<State> weak = weak_from_this();
    Task* raw = task.get();
    task->on_device_error = [weak, raw](std::exception_ptr error) {
      std::shared_ptr<State> self = weak.lock();
      return self ? self->classify(*raw, error) : error;
    };
    std::exception_ptr error;
    try {
      error = execute(*task);
    } catch (...) {
      error = std::current_exception();
    }
    task->run = nullptr;  // enqueued; `then` waits for the first wait()
    // A barrier blocked until it was over; a failed call never reached the
    // device: both are finished now.
    if (error || !task->device) {
      task->release_closures();
      task->finish(error);
    }
    return task;
  }

  void loop() {
    for (;;) {
      std::shared_ptr<Task> task;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return !busy && (stopping || !queue.empty()); });
        if (queue.empty()) return;
        task = queue.front();
        queue.pop_front();
        busy = true;
      }
      std::exception_ptr error = execute(*task);
      task->release_closures();
      task->finish(error);
      std::lock_guard<std::mutex> lock(mu);
      busy = false;
    }
  }

  std::exception_ptr execute(Task& task) {
    std::string failed_before;
    {
      std::lock_guard<std::mutex> lock(mu);
      failed_before = broken;
    }
    if (!failed_before.empty()) {
      return std::make_exception_ptr(CommError(cat(
          "[comm] ", task.label, " not run: an earlier collective of this group failed (",
          failed_before, "); create a new group after a communication failure")));
    }
    auto start = std::chrono::steady_clock::now();
    try {
      runtime::CollectiveScope in_collective(task.label);  // for the launcher's stuck-rank report
      if (task.debug) detail::check_descriptors(*backend, task.descriptor, task.label);
      task.run();
      if (!stream_ordered) {
        if (task.then) task.then();
      } else if (task.op != OpKind::kBarrier) {
        task.device = backend->take_work();
        STRATA_ASSERT(task.device != nullptr, "[comm] the stream-ordered backend ", backend->name(),
                      " returned no work for ", task.label);
      }
    } catch (...) {
      return classify(task, std::current_exception());
    }
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::lock_guard<std::mutex> lock(stats_mu);
    CommStats::Entry& e = entry_for(stats, task.op);
    e.calls += 1;
    e.bytes += task.bytes;
    e.seconds += seconds;
    return nullptr;
  }

  /// The error `task` reports for `error`: argument errors and debug
  /// mismatches as they are (the group stays usable), a failed copy after
  /// the collective as a CommError, anything else named after the call and
  /// recorded so that later calls fail fast.
  std::exception_ptr classify(const Task& task, std::exception_ptr error) {
    try {
      std::rethrow_exception(error);
    } catch (const ConfigError&) {
      return error;
    } catch (const detail::MismatchError&) {
      return error;
    } catch (const c10::Error& e) {  // a copy after the collective: the group is intact
      return std::make_exception_ptr(CommError(cat("[comm] ", task.label, " failed: ", e.what_without_backtrace())));
    } catch (const TimeoutError& e) {
      return fail(task, std::make_exception_ptr(TimeoutError(cat("[comm] ", task.label, ": ", e.what()))), e.what());
    } catch (const CommError& e) {
      return fail(task, std::make_exception_ptr(CommError(cat("[comm] ", task.label, ": ", e.what()))), e.what());
    } catch (const std::exception& e) {
      return fail(task, std::make_exception_ptr(CommError(cat("[comm] ", task.label, " failed: ", e.what()))), e.what());
    }
  }

  std::exception_ptr fail(const Task& task, std::exception_ptr error, const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    if (broken.empty()) broken = task.label + ": " + why;
    return error;
  }
};

/// A task for `op` over `bytes` of payload: `run` calls the backend, `then`
/// follows the result (Note [Stream-ordered tasks] in task.h).
inline std::shared_ptr<Task> make_task(OpKind op, int64_t bytes, std::function<void()> run,
                                std::function<void()> then = {}) {
  auto task = std::make_shared<Task>();
  task->op = op;
  task->bytes = bytes;
  task->run = std::move(run);
  task->then = std::move(then);
  return task;
}

}  // namespace strata::comm
