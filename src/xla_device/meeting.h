// Where the replicas' threads meet (Note [Replicas in one process] in
// recorder.cpp): the end of each step, and the host collectives and
// barriers of the replicas' comm backend (replicas.cpp).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace strata::xla::detail {

class Meeting;

/// Where the parties of several meetings wait (Note [Replicas that wait
/// apart] in meeting.cpp): a wait that can never end is an error at once,
/// not a timeout. Thread-safe.
class WaitBoard {
 public:
  WaitBoard(size_t size, std::function<std::string(int)> name);
  /// Party `rank` is about to wait at `what` of `meeting`: the message of
  /// a wait that cannot end (every party waits, not all at one meeting; or
  /// a party has left), or "".
  std::string wait(int rank, const Meeting* meeting, const std::string& what);
  /// Party `rank` waits at `meeting` no more (it left the wait).
  void done(int rank, const Meeting* meeting);
  /// `meeting` completed: its parties wait there no more.
  void release(const Meeting* meeting);
  /// Party `rank` has left for good (its thread ended): a party that waits
  /// for it now or later fails at once with the returned message ("" when
  /// none waits now).
  std::string leave(int rank);
  /// Every party is back (a new run of their threads).
  void reset();

 private:
  std::string stuck_locked() const;
  const std::function<std::string(int)> name_;
  mutable std::mutex mutex_;
  std::vector<const Meeting*> at_;      // where each party waits (null: not waiting)
  std::vector<std::string> what_;
  std::vector<bool> gone_;
};

/// A barrier of `size` parties that meet again and again: a timeout that
/// names who is missing, an abort that ends every wait, and work the last
/// to arrive may do for all. Thread-safe.
class Meeting {
 public:
  /// `name(k)` names party k in messages ("replica 1 (xla:1)").
  Meeting(size_t size, std::chrono::milliseconds timeout, std::function<std::string(int)> name);

  /// Returns once every party has called meet() (`what` names the place:
  /// "the end of a step", "a barrier"). The last to arrive runs `last` (when
  /// given) while the others wait for it however long it takes; a failure
  /// of `last` is rethrown to the party that ran it and is an Error with
  /// the same message for the others. Throws TimeoutError naming the
  /// parties still missing after the timeout, CommError once aborted, and
  /// ConfigError when `rank` has arrived already (two threads as one
  /// party).
  void meet(int rank, const std::string& what, const std::function<void()>& last = nullptr);

  /// Ends every wait, now and later, with CommError(`reason`).
  void abort(const std::string& reason);
  /// Calls on_wait(rank) whenever a party is about to wait for the others
  /// (on its thread, no lock held).
  void set_on_wait(std::function<void(int)> on_wait);
  /// The meetings completed so far.
  uint64_t completed() const;
  /// Reports each wait to `board`, shared with the parties' other meetings
  /// (Note [Replicas that wait apart]); a wait that cannot end aborts them.
  void set_board(std::shared_ptr<WaitBoard> board, std::function<void(const std::string&)> abort_all);

 private:
  const size_t size_;
  const std::chrono::milliseconds timeout_;
  const std::function<std::string(int)> name_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<bool> arrived_;
  size_t count_ = 0;
  bool running_ = false;  // the last party is running `last`
  uint64_t generation_ = 0;
  std::string error_;     // the last meeting's failure of `last`
  std::string aborted_;
  std::function<void(int)> on_wait_;
  std::shared_ptr<WaitBoard> board_;
  std::function<void(const std::string&)> abort_all_;
};

}  // namespace strata::xla::detail
