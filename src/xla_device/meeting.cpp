// Meeting (meeting.h).
#include "meeting.h"

#include <algorithm>
#include <exception>

#include "strata/core/error.h"

namespace strata::xla::detail {

// Note [Replicas that wait apart]
// The replicas' threads meet at the ends of steps and at host collectives
// (two meetings). When every replica waits, but not all at one meeting,
// none can go on: one reached a collective the others skipped, typically a
// checkpoint save or a barrier inside `if (rank == 0)`. Likewise a replica
// waits in vain for one whose thread has ended. Both are errors at once,
// naming where each replica is, rather than a wait for the collective
// timeout (30 minutes by default). The party that completes a meeting
// clears its peers' marks before it goes on, so a peer not yet awake is
// never counted as waiting; a peer puts its mark on the board under the
// meeting's lock, before the meeting can complete, so no mark outlives its
// meeting (one placed after the completion once stopped a fit at step 44,
// two replicas "waiting" at a vote and a step end that were both passed).
// The completing party clears the marks under the meeting's lock too, after
// it has moved the generation on: a party that let go of the lock to run
// on_wait and takes it back after the completion must find the meeting
// done. Cleared before that, a mark such a party put back stayed on the
// board (a fit failed at step 59, replica 1 "at the end of a step" it had
// left while replica 0 waited at the next host all_reduce).
WaitBoard::WaitBoard(size_t size, std::function<std::string(int)> name)
    : name_(std::move(name)), at_(size, nullptr), what_(size), gone_(size, false) {}

std::string WaitBoard::stuck_locked() const {
  std::string gone, places;
  size_t waiting = 0;
  bool apart = false;
  for (size_t k = 0; k < at_.size(); ++k) {
    if (gone_[k]) gone += (gone.empty() ? "" : ", ") + name_(static_cast<int>(k));
    if (at_[k] == nullptr) continue;
    ++waiting;
    apart = apart || at_[k] != at_[0] || at_[0] == nullptr;
    places += (places.empty() ? "" : ", ") + name_(static_cast<int>(k)) + " at " + what_[k];
  }
  const std::string advice =
      ": every rank must reach each collective (a checkpoint save, a barrier, a read of a device value) at the "
      "same point of its code; a collective inside `if (rank == 0)` is the usual cause";
  if (!gone.empty() && waiting > 0)
    return "[xla] " + places + " waits for " + gone + ", whose work has ended" + advice;
  if (waiting == at_.size() && apart)
    return "[xla] the replicas wait at different points and none can go on: " + places + advice;
  return "";
}

std::string WaitBoard::wait(int rank, const Meeting* meeting, const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  at_[static_cast<size_t>(rank)] = meeting;
  what_[static_cast<size_t>(rank)] = what;
  return stuck_locked();
}

void WaitBoard::done(int rank, const Meeting* meeting) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (at_[static_cast<size_t>(rank)] == meeting) at_[static_cast<size_t>(rank)] = nullptr;
}

void WaitBoard::release(const Meeting* meeting) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Meeting*& at : at_)
    if (at == meeting) at = nullptr;
}

std::string WaitBoard::leave(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  gone_[static_cast<size_t>(rank)] = true;
  return stuck_locked();
}

void WaitBoard::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::fill(gone_.begin(), gone_.end(), false);
}

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
    // Under this meeting's lock, after the generation moved on: a party
    // that comes back from on_wait now sees the meeting done and puts no
    // mark on the board (Note [Replicas that wait apart]).
    if (board_) board_->release(this);
    lock.unlock();
    cv_.notify_all();
    if (failure) std::rethrow_exception(failure);
    return;
  }
  if (on_wait_) {
    const std::function<void(int)> on_wait = on_wait_;
    lock.unlock();
    on_wait(rank);
    lock.lock();
  }
  // Note [Replicas that wait apart]: the mark goes on the board under this
  // meeting's lock, so the last party (which needs the lock to arrive)
  // cannot complete the meeting, and clear the marks, before the mark is
  // there. Placed after the meeting completed, it would stay behind and
  // count this party as waiting here while it waits at the next one.
  if (board_ && generation_ == generation) {
    const std::string stuck = board_->wait(rank, this, what);
    if (!stuck.empty()) {
      lock.unlock();
      abort_all_(stuck);  // takes every meeting's lock, this one's too
      lock.lock();
    }
  }
  const auto leave = [&] {
    arrived_[me] = false;
    --count_;
    if (board_) board_->done(rank, this);
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

void Meeting::set_board(std::shared_ptr<WaitBoard> board, std::function<void(const std::string&)> abort_all) {
  std::lock_guard<std::mutex> lock(mutex_);
  board_ = std::move(board);
  abort_all_ = std::move(abort_all);
}

uint64_t Meeting::completed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return generation_;
}

}  // namespace strata::xla::detail
