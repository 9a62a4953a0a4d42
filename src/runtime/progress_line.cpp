// runtime::ProgressLine (include/strata/runtime/progress_line.h).
#include "strata/runtime/progress_line.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>

#include "strata/core/strings.h"

namespace strata::runtime {
namespace {

// Redraws on a terminal at most this often: fast work stays cheap.
constexpr std::chrono::milliseconds kRedrawInterval{100};

std::string clock_text(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long long s = static_cast<long long>(seconds);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  else
    std::snprintf(buf, sizeof(buf), "%lld:%02lld", s / 60, s % 60);
  return buf;
}

}  // namespace

ProgressLine::ProgressLine(std::ostream& out, std::string label, std::string unit, bool terminal,
                           std::chrono::milliseconds interval, Now now)
    : out_(out),
      label_(std::move(label)),
      unit_(std::move(unit)),
      terminal_(terminal),
      interval_(interval),
      now_(std::move(now)) {
  start_ = last_ = now_();
}

ProgressLine::~ProgressLine() {
  try {
    finish();
  } catch (...) {
  }
}

bool ProgressLine::is_terminal(int fd) { return ::isatty(fd) != 0; }

std::string ProgressLine::text(const std::string& label, const std::string& unit, const ProgressCount& count,
                               double elapsed_s) {
  std::string line = label + ": " + std::to_string(count.items_done) + "/" + std::to_string(count.items_total) +
                     " " + unit + ", " + human_bytes(count.bytes_done) + " of " + human_bytes(count.bytes_total);
  const uint64_t percent = count.bytes_total > 0 ? 100 * count.bytes_done / count.bytes_total : 100;
  line += " (" + std::to_string(percent) + "%)";
  // The rate and ETA by bytes: tensors differ in size by orders of magnitude.
  if (elapsed_s > 0 && count.bytes_done > 0) {
    const double rate = static_cast<double>(count.bytes_done) / elapsed_s;
    line += ", " + human_bytes(static_cast<uint64_t>(rate)) + "/s";
    if (count.bytes_total >= count.bytes_done)
      line += ", eta " + clock_text(static_cast<double>(count.bytes_total - count.bytes_done) / rate);
  }
  return line;
}

void ProgressLine::update(const ProgressCount& count) {
  count_ = count;
  if (finished_) return;
  const Clock::time_point now = now_();
  if (now - last_ < (terminal_ ? std::chrono::duration_cast<std::chrono::milliseconds>(kRedrawInterval) : interval_))
    return;
  last_ = now;
  draw(false);
}

void ProgressLine::clear() {
  if (!terminal_ || !open_) return;
  out_ << "\r\033[K";
  out_.flush();
  open_ = false;
}

void ProgressLine::finish() {
  if (finished_) return;
  finished_ = true;
  if (terminal_ && drawn_) draw(true);
}

void ProgressLine::draw(bool final_line) {
  const double elapsed = std::chrono::duration<double>(now_() - start_).count();
  const std::string line = text(label_, unit_, count_, elapsed);
  if (terminal_) {
    // Carriage return, the line, erase to its end; a newline only when it
    // is done, so the next output starts on a line of its own.
    out_ << "\r" << line << "\033[K";
    open_ = !final_line;
    drawn_ = true;
    if (final_line) out_ << "\n";
    out_.flush();
  } else {
    out_ << line << std::endl;
  }
}

}  // namespace strata::runtime
