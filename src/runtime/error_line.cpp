// Which line of a failed worker's stderr its report quotes (Note [The last
// error line]): a small classifier of lines, and the per-worker record the
// supervisor feeds every stderr line to.
//
// Note [The last error line]
// A failed worker's summary quotes what it said went wrong. Most of what a
// worker writes to stderr is not that: progress and log lines, a Trainer's
// model summary (a table printed at the start of fit), and the backtrace
// LibTorch's c10::Error carries in what() ("Exception raised from f at
// file:line (most recent call first):", then "frame #N: ..." lines), which
// a worker that prints what() ends with. Quoting the last line named
// "0         Modules in eval mode" for a rank killed by SIGKILL, and
// "frame #19: <unknown function> + 0x22651 (...)" for one that threw.
//
// So the report quotes the last line that is an error:
// - strata's (and most programs') error lines: "error: ..." as strata's
//   log writes them, "strata: error: ...", "strata: internal error: ...",
//   "fatal: ...", with or without the "[rank R] " prefix;
// - what std::terminate prints for an exception nobody caught ("terminate
//   called after throwing ...", then its "what():  message");
// - an exception's message right before its backtrace: the line before
//   "Exception raised from ...", unless an error line already opened that
//   message (a message of several lines is quoted by its first);
// - a Python exception ("RuntimeError: ...",
//   "torch.distributed.DistNetworkError: ..."), the last line of a
//   traceback; LibTorch's own error log lines ("[E1207 00:36:28.95 f.cpp:3]
//   ..."); a sanitizer's "==N==ERROR: ...".
// A worker killed by a signal said nothing about it (SIGKILL leaves no
// words): it is reported with such a line or with none. A worker that
// exited with a code chose to, and its last words are its reason even from
// a program that writes no "error:" (a script's "boom: bad input"): without
// an error line, it is quoted by its last line that is not a backtrace, a
// model summary line or blank.
#include <string_view>

#include "launch_internal.h"

namespace strata::runtime::launch {
namespace {

std::string_view trimmed(std::string_view line) {
  const size_t start = line.find_first_not_of(" \t");
  if (start == std::string_view::npos) return {};
  line.remove_prefix(start);
  while (!line.empty() && (line.back() == ' ' || line.back() == '\t' || line.back() == '\r')) line.remove_suffix(1);
  return line;
}

std::string_view without_rank_prefix(std::string_view line) {
  line = trimmed(line);
  if (line.substr(0, 6) == "[rank ") {
    const size_t close = line.find("] ");
    if (close != std::string_view::npos) line = trimmed(line.substr(close + 2));
  }
  return line;
}

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

bool is_backtrace_start(std::string_view line) { return starts_with(line, "Exception raised from "); }

bool is_backtrace_line(std::string_view line) {
  if (is_backtrace_start(line)) return true;
  return starts_with(line, "frame #") && line.size() > 7 && is_digit(line[7]);
}

bool is_model_summary_line(std::string_view line) {
  if (line.find(" | ") != std::string_view::npos) return true;  // a row of the table, or its header
  if (line.find_first_not_of('-') == std::string_view::npos) return true;  // its rules
  static constexpr std::string_view kFooters[] = {"Trainable params", "Non-trainable params", "Total params",
                                                  "Total estimated model params size (MB)",
                                                  "Modules in train mode", "Modules in eval mode"};
  for (std::string_view footer : kFooters) {
    if (line.size() > footer.size() && ends_with(line, footer) && is_digit(line[0])) return true;
  }
  return false;
}

// "error: ...", "internal error: ...", "fatal error: ...", "fatal: ..."
// (any case), after at most one "program: " in front.
bool is_level_error(std::string_view line) {
  auto opens = [](std::string_view s) {
    for (std::string_view word : {"error:", "internal error:", "fatal error:", "fatal:"}) {
      if (s.size() < word.size()) continue;
      bool same = true;
      for (size_t i = 0; i < word.size() && same; ++i) {
        const char c = s[i] >= 'A' && s[i] <= 'Z' ? static_cast<char>(s[i] - 'A' + 'a') : s[i];
        same = c == word[i];
      }
      if (same) return true;
    }
    return false;
  };
  if (opens(line)) return true;
  const size_t colon = line.find(": ");
  if (colon == std::string_view::npos || colon == 0) return false;
  const std::string_view program = line.substr(0, colon);
  if (program.find_first_of(" \t[") != std::string_view::npos) return false;
  return opens(line.substr(colon + 2));
}

// A Python exception line: a dotted name ending in Error or Exception (or
// KeyboardInterrupt), alone or followed by ": message".
bool is_python_exception(std::string_view line) {
  const size_t end = line.find(':');
  const std::string_view name = line.substr(0, end);
  if (name.empty() || !(ends_with(name, "Error") || ends_with(name, "Exception") || name == "KeyboardInterrupt"))
    return false;
  if (end != std::string_view::npos && line.substr(end, 2) != ": " && end + 1 != line.size()) return false;
  for (char c : name) {
    const bool word = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '_' || c == '.';
    if (!word) return false;
  }
  return !is_digit(name[0]) && name[0] != '.';
}

// LibTorch's (glog's) error lines: "[E1207 00:36:28.956 file.cpp:328] ...".
bool is_torch_error_log(std::string_view line) {
  return line.size() > 7 && starts_with(line, "[E") && is_digit(line[2]) && is_digit(line[3]) && is_digit(line[4]) &&
         is_digit(line[5]) && line[6] == ' ' && line.find("] ") != std::string_view::npos;
}

bool is_sanitizer_error(std::string_view line) {
  return starts_with(line, "==") && line.find("==ERROR: ") != std::string_view::npos;
}

// `text`: a line without its rank prefix, not blank, not a backtrace line.
bool is_error_line(std::string_view text) {
  return is_level_error(text) || starts_with(text, "terminate called ") || starts_with(text, "what():") ||
         is_python_exception(text) || is_torch_error_log(text) || is_sanitizer_error(text);
}

// An error line this close before a backtrace opened the message the
// backtrace belongs to (Note [The last error line]).
constexpr int kMessageLines = 4;

}  // namespace

void ErrorLines::add(const std::string& line) {
  const std::string_view text = without_rank_prefix(line);
  if (text.empty()) return;
  if (is_backtrace_line(text)) {
    // The message before a backtrace, unless an error line opened it.
    if (is_backtrace_start(text) && !previous_.empty() && lines_since_error_ > kMessageLines) error_ = previous_;
    lines_since_error_ = kMessageLines + 1;
    previous_.clear();
    return;
  }
  if (is_model_summary_line(text)) {
    previous_.clear();
    if (lines_since_error_ <= kMessageLines) ++lines_since_error_;
    return;
  }
  previous_ = std::string(trimmed(line));
  last_ = previous_;
  if (is_error_line(text)) {
    error_ = previous_;
    lines_since_error_ = 0;
  } else if (lines_since_error_ <= kMessageLines) {
    ++lines_since_error_;
  }
}

std::string ErrorLines::quote(bool killed_by_signal) const {
  if (!error_.empty() || killed_by_signal) return error_;
  return last_;
}

}  // namespace strata::runtime::launch
