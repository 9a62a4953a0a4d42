// SLURM's compressed host lists, and requeueing the current job through
// scontrol.
#include "strata/runtime/slurm.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "strata/core/error.h"

extern char** environ;

namespace strata::runtime {
namespace {

// Note [Bounded host lists]
// SLURM_JOB_NODELIST comes from outside, so its parser trusts nothing: the
// text is at most 64 KiB (a list of 10,000 distinct host names fits with
// room to spare, and SLURM compresses runs), a number in a bracket has at
// most 9 digits (so every bound, difference and count fits in 64 bits
// without care), and an expansion stops at 64 Ki hosts, which a range of
// two short numbers could otherwise blow up to a billion strings. Parsing
// only records the ranges; counting multiplies their sizes (saturating);
// first_host reads the first value of each group. Nothing but
// expand_nodelist, after the count has passed, allocates per host. A host
// name has at most 16 bracket groups (SLURM writes one per dimension of
// its node names, rarely more than three), which bounds the depth of the
// expansion's recursion.

// One "lo" or "lo-hi" inside brackets; `width` is the digits of lo as
// written, which SLURM keeps as zero padding.
struct Range {
  uint64_t lo = 0;
  uint64_t hi = 0;
  size_t width = 0;
};

// A run of name characters, or a bracket group (its ranges, in order).
struct Piece {
  std::string text;
  std::vector<Range> ranges;
  bool group() const { return !ranges.empty(); }
};

using Entry = std::vector<Piece>;

constexpr size_t kMaxGroups = 16;

// The value as it may appear in a message: at most 96 bytes, anything
// unprintable as \xNN.
std::string shown(std::string_view text) {
  constexpr size_t kShown = 96;
  std::string out;
  for (size_t i = 0; i < text.size() && i < kShown; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\'') {
      out += static_cast<char>(c);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", c);
      out += hex;
    }
  }
  if (text.size() > kShown) out += "...";
  return out;
}

bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
         c == '_';
}

bool digit(char c) { return c >= '0' && c <= '9'; }

class Parser {
 public:
  Parser(std::string_view text, std::string_view variable) : text_(text), variable_(variable) {}

  std::vector<Entry> parse() {
    if (text_.size() > kMaxNodelistBytes) {
      fail_whole(detail::cat("it is ", text_.size(), " bytes long, over the ", kMaxNodelistBytes, "-byte limit"));
    }
    if (text_.empty()) fail_whole("it is empty");
    std::vector<Entry> entries;
    while (true) {
      entries.push_back(entry());
      if (pos_ == text_.size()) break;
      ++pos_;  // the ','
      if (pos_ == text_.size()) fail(pos_ - 1, pos_, "a ',' with no host after it");
    }
    return entries;
  }

 private:
  Entry entry() {
    Entry pieces;
    const size_t begin = pos_;
    size_t groups = 0;
    while (pos_ < text_.size() && text_[pos_] != ',') {
      const char c = text_[pos_];
      if (c == '[') {
        if (++groups > kMaxGroups) {
          fail(pos_, pos_ + 1, detail::cat("more than ", kMaxGroups, " bracket groups in one host name"));
        }
        pieces.push_back(group());
      } else if (name_char(c)) {
        Piece piece;
        while (pos_ < text_.size() && name_char(text_[pos_])) piece.text += text_[pos_++];
        pieces.push_back(std::move(piece));
      } else if (c == ']') {
        fail(pos_, pos_ + 1, "a ']' without its '['");
      } else {
        fail(pos_, pos_ + 1, "a character that no host name holds (letters, digits, '-', '.', '_')");
      }
    }
    if (pieces.empty()) fail(begin, begin + 1, "an empty host name");
    return pieces;
  }

  // At '['; reads through the matching ']'.
  Piece group() {
    const size_t open = pos_++;
    Piece piece;
    while (true) {
      if (pos_ == text_.size()) fail(open, pos_, "a '[' that is not closed");
      Range range;
      const size_t begin = pos_;
      range.lo = number(open, range.width);
      range.hi = range.lo;
      if (pos_ < text_.size() && text_[pos_] == '-') {
        ++pos_;
        size_t width = 0;
        range.hi = number(open, width);
        if (range.hi < range.lo) fail(begin, pos_, "a range that runs backwards");
      }
      piece.ranges.push_back(range);
      if (pos_ == text_.size()) fail(open, pos_, "a '[' that is not closed");
      if (text_[pos_] == ']') {
        ++pos_;
        return piece;
      }
      if (text_[pos_] != ',') {
        fail(pos_, pos_ + 1,
             text_[pos_] == '[' ? "a '[' inside brackets"
                                : "a character other than a digit, '-', ',' or ']' in brackets");
      }
      ++pos_;
    }
  }

  // Digits at pos_ (1 to kMaxNodelistDigits of them); `width` gets their count.
  uint64_t number(size_t open, size_t& width) {
    const size_t begin = pos_;
    uint64_t value = 0;
    while (pos_ < text_.size() && digit(text_[pos_])) {
      if (pos_ - begin == kMaxNodelistDigits) {
        while (pos_ < text_.size() && digit(text_[pos_])) ++pos_;
        fail(begin, pos_, detail::cat("a number of more than ", kMaxNodelistDigits, " digits"));
      }
      value = value * 10 + static_cast<uint64_t>(text_[pos_++] - '0');
    }
    if (pos_ == begin) {
      if (pos_ == text_.size()) fail(open, pos_, "a '[' that is not closed");
      fail(pos_, pos_ + 1, text_[pos_] == '[' ? "a '[' inside brackets" : "a missing number in brackets");
    }
    width = pos_ - begin;
    return value;
  }

  [[noreturn]] void fail(size_t begin, size_t end, const std::string& what) const {
    begin = std::min(begin, text_.size());
    end = std::min(std::max(end, begin), text_.size());
    const std::string part = end > begin ? shown(text_.substr(begin, std::min<size_t>(end - begin, 32))) : "";
    throw ConfigError(detail::cat("[slurm] ", variable_, "='", shown(text_), "' is not a SLURM host list: ", what,
                                  part.empty() ? std::string(" at its end") : " at '" + part + "'", " (byte ", begin,
                                  "); expected host names and bracketed ranges such as node[01-04,07] or a1,b[2-3]"));
  }

  [[noreturn]] void fail_whole(const std::string& what) const {
    throw ConfigError(detail::cat("[slurm] ", variable_, "='", shown(text_), "' is not a SLURM host list: ", what,
                                  "; expected host names and bracketed ranges such as node[01-04,07] or a1,b[2-3]"));
  }

  std::string_view text_;
  std::string_view variable_;
  size_t pos_ = 0;
};

std::string padded(uint64_t value, size_t width) {
  std::string digits = std::to_string(value);
  if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
  return digits;
}

// Hosts in the entries, saturating at kMaxNodelistHosts + 1.
size_t count(const std::vector<Entry>& entries) {
  constexpr uint64_t kCap = kMaxNodelistHosts + 1;
  uint64_t total = 0;
  for (const Entry& entry : entries) {
    uint64_t product = 1;
    for (const Piece& piece : entry) {
      if (!piece.group()) continue;
      uint64_t size = 0;
      for (const Range& r : piece.ranges) size = std::min(kCap, size + (r.hi - r.lo + 1));
      product = std::min(kCap, product * size);  // both <= kCap: no overflow
    }
    total = std::min(kCap, total + product);
  }
  return static_cast<size_t>(total);
}

size_t checked_count(const std::vector<Entry>& entries, std::string_view nodelist, std::string_view variable) {
  const size_t n = count(entries);
  STRATA_CHECK(n <= kMaxNodelistHosts, ConfigError, "[slurm] ", variable, "='", shown(nodelist), "' names more than ",
               kMaxNodelistHosts, " hosts; strata reads host lists up to that size");
  return n;
}

// Appends the hosts of `entry` from piece `index` on, after `prefix`.
void expand_entry(const Entry& entry, size_t index, std::string& prefix, std::vector<std::string>& out) {
  if (index == entry.size()) {
    out.push_back(prefix);
    return;
  }
  const Piece& piece = entry[index];
  const size_t mark = prefix.size();
  if (!piece.group()) {
    prefix += piece.text;
    expand_entry(entry, index + 1, prefix, out);
  } else {
    for (const Range& r : piece.ranges) {
      for (uint64_t v = r.lo; v <= r.hi; ++v) {
        prefix += padded(v, r.width);
        expand_entry(entry, index + 1, prefix, out);
        prefix.resize(mark);
      }
    }
  }
  prefix.resize(mark);
}

}  // namespace

std::vector<std::string> expand_nodelist(std::string_view nodelist, std::string_view variable) {
  const std::vector<Entry> entries = Parser(nodelist, variable).parse();
  std::vector<std::string> hosts;
  hosts.reserve(checked_count(entries, nodelist, variable));
  std::string prefix;
  for (const Entry& entry : entries) expand_entry(entry, 0, prefix, hosts);
  return hosts;
}

std::string first_host(std::string_view nodelist, std::string_view variable) {
  const std::vector<Entry> entries = Parser(nodelist, variable).parse();
  std::string host;
  for (const Piece& piece : entries.front()) {
    host += piece.group() ? padded(piece.ranges.front().lo, piece.ranges.front().width) : piece.text;
  }
  return host;
}

size_t count_nodelist(std::string_view nodelist, std::string_view variable) {
  return checked_count(Parser(nodelist, variable).parse(), nodelist, variable);
}

namespace {

// The job id scontrol requeue takes, or "" with `why` set.
std::string requeue_job_id(std::string& why) {
  auto read = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v != nullptr ? v : "";
  };
  auto numeric = [](const std::string& s) {
    if (s.empty() || s.size() > 18) return false;
    for (char c : s)
      if (!digit(c)) return false;
    return true;
  };
  const std::string array_job = read("SLURM_ARRAY_JOB_ID");
  const std::string array_task = read("SLURM_ARRAY_TASK_ID");
  if (!array_job.empty() || !array_task.empty()) {
    if (numeric(array_job) && numeric(array_task)) return array_job + "_" + array_task;
    why = detail::cat("SLURM_ARRAY_JOB_ID='", shown(array_job), "' and SLURM_ARRAY_TASK_ID='", shown(array_task),
                      "' do not name an array task (two numbers expected)");
    return "";
  }
  const std::string job = read("SLURM_JOB_ID");
  if (numeric(job)) return job;
  why = job.empty() ? std::string("SLURM_JOB_ID is not set: this process is not part of a SLURM job")
                    : detail::cat("SLURM_JOB_ID='", shown(job), "' is not a job number");
  return "";
}

// The first executable `name` in the folders of PATH, or "".
std::string on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string_view dirs = path != nullptr ? path : "";
  if (dirs.size() > 64 * 1024) dirs = dirs.substr(0, 64 * 1024);
  while (true) {
    const size_t colon = dirs.find(':');
    std::string dir(dirs.substr(0, colon));
    if (dir.empty()) dir = ".";
    const std::string candidate = dir + "/" + name;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
    if (colon == std::string_view::npos) return "";
    dirs.remove_prefix(colon + 1);
  }
}

// Output kept for the message: scontrol's last words are one line or two.
constexpr size_t kKeptOutput = 2048;

std::string one_line(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) text.pop_back();
  for (char& c : text)
    if (c == '\n' || c == '\r') c = ' ';
  return shown(text);
}

}  // namespace

RequeueResult slurm_requeue(int timeout_s) {
  RequeueResult result;
  try {
    std::string why;
    result.job_id = requeue_job_id(why);
    if (result.job_id.empty()) {
      result.message = "[slurm] not requeued: " + why;
      return result;
    }
    const std::string scontrol = on_path("scontrol");
    if (scontrol.empty()) {
      result.message = "[slurm] job " + result.job_id +
                       " not requeued: scontrol is not on PATH (it comes with the SLURM client tools); requeue it "
                       "by hand with `scontrol requeue " + result.job_id + "`";
      return result;
    }
    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
      result.message = "[slurm] job " + result.job_id + " not requeued: cannot create a pipe: " + std::strerror(errno);
      return result;
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 1);
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 2);
    std::string arg0 = "scontrol", arg1 = "requeue", arg2 = result.job_id;
    char* argv[] = {arg0.data(), arg1.data(), arg2.data(), nullptr};
    pid_t pid = -1;
    const int spawned = ::posix_spawn(&pid, scontrol.c_str(), &actions, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(pipe_fds[1]);
    if (spawned != 0) {
      ::close(pipe_fds[0]);
      result.message = "[slurm] job " + result.job_id + " not requeued: cannot run " + scontrol + ": " +
                       std::strerror(spawned);
      return result;
    }
    // Read its output until it closes the pipe or the time is up.
    std::string output;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(std::max(1, timeout_s));
    bool timed_out = false;
    while (true) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        timed_out = true;
        break;
      }
      pollfd fd{pipe_fds[0], POLLIN, 0};
      const int ready = ::poll(&fd, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
      if (ready < 0 && errno != EINTR) break;
      if (ready <= 0) continue;
      char buf[512];
      const ssize_t n = ::read(pipe_fds[0], buf, sizeof(buf));
      if (n > 0) {
        const size_t room = kKeptOutput - std::min(kKeptOutput, output.size());
        output.append(buf, std::min(static_cast<size_t>(n), room));
      } else if (n == 0 || errno != EINTR) {
        break;
      }
    }
    ::close(pipe_fds[0]);
    if (timed_out) ::kill(pid, SIGKILL);
    int status = 0;
    // Its output closed: it has ended or is about to; a child that closed
    // its output but hangs is given until the deadline, then killed.
    while (true) {
      const pid_t done = ::waitpid(pid, &status, timed_out ? 0 : WNOHANG);
      if (done == pid) break;
      if (done < 0 && errno != EINTR) break;
      if (done == 0) {
        if (std::chrono::steady_clock::now() >= deadline) {
          timed_out = true;
          ::kill(pid, SIGKILL);
        } else {
          ::usleep(10 * 1000);
        }
      }
    }
    const std::string said = one_line(output);
    const std::string command = "`scontrol requeue " + result.job_id + "`";
    if (timed_out) {
      result.message = "[slurm] " + command + " did not finish within " + std::to_string(std::max(1, timeout_s)) +
                       " s and was killed" + (said.empty() ? "" : "; it said: " + said);
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      result.ok = true;
      result.message = "[slurm] requeued job " + result.job_id + " (" + command + ")";
    } else {
      const std::string how = WIFEXITED(status) ? "exited with status " + std::to_string(WEXITSTATUS(status))
                                                : "was killed by signal " + std::to_string(WTERMSIG(status));
      result.message = "[slurm] job " + result.job_id + " not requeued: " + command + " " + how +
                       (said.empty() ? "" : ": " + said);
    }
  } catch (const std::exception& e) {
    result.ok = false;
    result.message = std::string("[slurm] not requeued: ") + e.what();
  }
  return result;
}

}  // namespace strata::runtime
