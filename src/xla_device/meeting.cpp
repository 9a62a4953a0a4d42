// Meeting (meeting.h).
#include "meeting.h"

#include <algorithm>
#include <exception>

#include "strata/core/error.h"

namespace strata::xla::detail {

Meeting::Meeting(size_t size, std::chrono::milliseconds timeout, std::function<std::string(int)> name)
    : size_(size), timeout_(timeout), name_(std::move(name)), arrived_(size, false) {}

void Meeting::meet(int rank, const std::string& what, const std::function<void()>& last) {
  const size_t me = static_cast<size_t>(rank);
  std::unique_lock<std::mutex> lock(mutex_);
  STRATA_CHECK(!arrived_[me], ConfigError, "[xla] two threads reached ", what, " as ", name_(rank),
               " at once: each replica is driven by one thread (with the replica's device as its current one)");
  if (!aborted_.empty()) throw CommError(aborted_);
  const uint64_t generation = generation_;
  arrived_[me] = true;
  if (++count_ == size_) {
    // The last to arrive: does the work for all, then lets them go.
    running_ = true;
    lock.unlock();
    std::exception_ptr failure;
    std::string message;
    if (last) {
      try {
        last();
      } catch (const std::exception& e) {
        failure = std::current_exception();
        message = e.what();
      } catch (...) {
        failure = std::current_exception();
        message = "[xla] the work of " + what + " failed";
      }
    }
    lock.lock();
    std::fill(arrived_.begin(), arrived_.end(), false);
    count_ = 0;
    running_ = false;
    error_ = message;
    ++generation_;
    lock.unlock();
    cv_.notify_all();
    if (failure) std::rethrow_exception(failure);
    return;
  }
  if (on_wait_) {
    lock.unlock();
    on_wait_(rank);
    lock.lock();
  }
  const auto leave = [&] {
    arrived_[me] = false;
    --count_;
  };
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (generation_ == generation) {
    if (!aborted_.empty()) {
      leave();
      throw CommError(aborted_);
    }
    if (running_) {
      cv_.wait(lock);  // the others are all here: no timeout
      continue;
    }
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && generation_ == generation && !running_ &&
        aborted_.empty()) {
      std::string missing;
      for (size_t k = 0; k < size_; ++k)
        if (!arrived_[k]) missing += (missing.empty() ? "" : ", ") + name_(static_cast<int>(k));
      leave();
      throw TimeoutError("[xla] " + name_(rank) + " waited " + std::to_string(timeout_.count()) + " ms at " + what +
                         " for " + missing + ": every replica must reach it at the same point of its code, or one "
                         "stopped");
    }
  }
  if (!error_.empty()) throw Error(error_);
}

void Meeting::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_.empty()) aborted_ = reason;
  }
  cv_.notify_all();
}

void Meeting::set_on_wait(std::function<void(int)> on_wait) {
  std::lock_guard<std::mutex> lock(mutex_);
  on_wait_ = std::move(on_wait);
}

uint64_t Meeting::completed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return generation_;
}

}  // namespace strata::xla::detail
