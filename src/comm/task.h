// One operation of comm::Group and the Work handle returned for it
// (group.cpp). On a host backend the worker thread, or a synchronous
// caller, runs it and finishes it; on a stream-ordered backend the caller
// enqueues it, and the first wait() orders the caller's stream after it
// and applies what follows the result (Note [Stream-ordered tasks]).
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <string>

#include "debug.h"

namespace strata::comm::detail {

// Note [Stream-ordered tasks]
// Over a stream-ordered backend, `run` only enqueues the collective, so
// what must follow its result (`then`: the division of a mean, the copy
// into a non-contiguous tensor) cannot run at once. The first wait() makes
// the caller's current stream wait for the collective (`device`), then
// runs `then` on that stream: still no host synchronisation. A failure the
// backend reports there (a timeout caught by its watchdog) goes through
// `on_device_error`, which names the call and marks the group broken as a
// failure inside `run` would.
class Task final : public Work {
 public:
  OpKind op = OpKind::kBarrier;
  int64_t seq = 0;
  int64_t bytes = 0;
  bool debug = false;
  Descriptor descriptor;
  std::string label;          // "all_reduce #3", "barrier 'name' #4"
  std::function<void()> run;  // the backend call, and what must precede it
  std::function<void()> then;  // what follows the result (may be empty)
  WorkPtr device;             // stream-ordered backends: the enqueued collective
  std::function<std::exception_ptr(std::exception_ptr)> on_device_error;

  void wait() override {
    if (device) return wait_device();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    if (error_) {
      observed_ = true;
      std::rethrow_exception(error_);
    }
  }

  bool is_completed() const override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_ || !device) return done_;
    }
    return device->is_completed();
  }

  /// Drops `run` and `then`, and with them the tensors they hold, once
  /// they have run: a finished task that someone still holds (its Work, the
  /// group's list for synchronize()) keeps no buffer alive.
  void release_closures() {
    run = nullptr;
    then = nullptr;
  }

  /// Host backends, or a failed enqueue: the task is over.
  void finish(std::exception_ptr error) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      error_ = std::move(error);
    }
    cv_.notify_all();
  }

  /// Waits; returns the error not yet rethrown by wait() (and marks it seen).
  std::exception_ptr wait_unobserved() {
    if (device) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (done_ && error_) {
          if (observed_) return nullptr;
          observed_ = true;
          return error_;
        }
      }
      try {
        wait_device();
      } catch (...) {
        return std::current_exception();
      }
      return nullptr;
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    if (!error_ || observed_) return nullptr;
    observed_ = true;
    return error_;
  }

  /// Finished, with no error left for wait() or synchronize() to report.
  bool settled() const {
    std::lock_guard<std::mutex> lock(mu_);
    return done_ && (!error_ || observed_);
  }

 private:
  /// Note [Stream-ordered tasks]. A later wait() (another thread, another
  /// stream) orders its stream after the collective again; `then` runs once.
  void wait_device() {
    std::lock_guard<std::mutex> once(device_mu_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_ && error_) {
        observed_ = true;
        std::rethrow_exception(error_);
      }
      if (done_) {
        device->wait();
        return;
      }
    }
    std::exception_ptr error;
    try {
      device->wait();
      if (then) then();
      then = nullptr;
    } catch (...) {
      error = on_device_error ? on_device_error(std::current_exception()) : std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      error_ = error;
      observed_ = error != nullptr;
    }
    cv_.notify_all();
    if (error) std::rethrow_exception(error);
  }

  std::mutex device_mu_;  // taken before mu_, never after
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  bool observed_ = false;
  std::exception_ptr error_;
};

}  // namespace strata::comm::detail
