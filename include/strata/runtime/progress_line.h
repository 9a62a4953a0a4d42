// A progress line for long work outside the training loop (`strata ckpt
// consolidate`, `reshard`, `export`): items and bytes done of a total, the
// rate and an ETA. On a terminal one line redrawn in place; otherwise (a
// log file, a pipe) a plain line every few seconds, none for quick work.
// The Trainer's own progress bar (trainer/callbacks/progress_bar.h) follows
// the same two rules for training steps.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <ostream>
#include <string>

namespace strata::runtime {

/// How much of a piece of work is done.
struct ProgressCount {
  uint64_t items_done = 0;
  uint64_t items_total = 0;
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;
};

/// Reports progress on `out`. Not thread-safe: one thread updates it.
class ProgressLine {
 public:
  using Clock = std::chrono::steady_clock;
  /// The clock it reads (replaceable in tests).
  using Now = std::function<Clock::time_point()>;

  /// `label` starts each line ("consolidating"); `unit` names the items
  /// ("tensors"). `terminal`: redraw in place (ask is_terminal()), else a
  /// plain line at most every `interval`. On a terminal the line is redrawn
  /// at most every 100 ms.
  ProgressLine(std::ostream& out, std::string label, std::string unit, bool terminal,
               std::chrono::milliseconds interval = std::chrono::seconds(5), Now now = Clock::now);
  /// Ends an open terminal line (as finish()).
  ~ProgressLine();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  /// True when the file descriptor is a terminal (isatty).
  static bool is_terminal(int fd);

  /// Records the work done so far; prints when it is time to.
  void update(const ProgressCount& count);
  /// Erases an open terminal line so that other output can be printed
  /// (the next update draws it again); nothing otherwise.
  void clear();
  /// On a terminal where a line was drawn, draws the last count and ends
  /// the line (so what is printed next starts on a line of its own);
  /// otherwise (plain output, or work too quick to draw) prints nothing.
  /// Idempotent.
  void finish();

  /// The text of one line: "<label>: 3/10 <unit>, 1.0 KiB of 4.0 KiB (25%),
  /// 2.0 KiB/s, eta 0:02". `elapsed_s` <= 0: no rate or ETA yet.
  static std::string text(const std::string& label, const std::string& unit, const ProgressCount& count,
                          double elapsed_s);

 private:
  void draw(bool final_line);

  std::ostream& out_;
  std::string label_, unit_;
  bool terminal_;
  std::chrono::milliseconds interval_;
  Now now_;
  Clock::time_point start_, last_;
  ProgressCount count_;
  bool open_ = false;      // a terminal line is drawn and not ended
  bool drawn_ = false;     // a line was drawn (finish() draws the last count)
  bool finished_ = false;
};

}  // namespace strata::runtime
