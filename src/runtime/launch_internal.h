// The launcher's insides, shared by launcher.cpp (launch_workers),
// spawn.cpp (signals, starting a worker) and supervisor.cpp (watching the
// workers until they end). Private to src/runtime.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "strata/runtime/launcher.h"
#include "strata/runtime/heartbeat.h"

namespace strata::runtime::launch {

using Clock = std::chrono::steady_clock;

// ---- signals (spawn.cpp) ---------------------------------------------------

constexpr int kHandledSignals[] = {SIGCHLD, SIGINT, SIGTERM, SIGUSR1};

// Installs the handlers for the lifetime of one launch and restores the
// previous ones afterwards; the handlers feed a self-pipe (spawn.cpp,
// Note [Self-pipe]) whose read end the supervision loop polls.
class SignalScope {
 public:
  SignalScope();
  ~SignalScope();
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;
  int read_fd() const { return read_fd_; }

 private:
  int read_fd_ = -1;
  int write_fd_ = -1;
  struct sigaction previous_[std::size(kHandledSignals)] {};
};

/// "SIGTERM", ..., or "signal N".
std::string signal_name(int sig);

/// Writes all of `text` to `fd`, retrying on EINTR; gives up silently when
/// the fd is gone (the launcher keeps supervising).
void write_all(int fd, const std::string& text);

// ---- workers -----------------------------------------------------------------

constexpr size_t kMaxLine = 64 * 1024;  // longer lines are split

struct Stream {
  int fd = -1;
  OutputStream kind = OutputStream::kStdout;
  std::string partial;
  // On a terminal (Note [Redraws through the launcher] in supervisor.cpp):
  bool redraw = false;      // `partial` began after a '\r': a line redrawn in place
  size_t shown = 0;         // how much of `partial` was last drawn (0: not yet)
  bool pending_cr = false;  // the last byte read was '\r' (a "\r\n" may be split)
};

// What the launcher last heard from a worker's heartbeats.
struct Liveness {
  int fd = -1;                 // read end of the heartbeat pipe
  std::string partial;
  bool seen = false;           // it reports progress (a strata program)
  Heartbeat last;
  Clock::time_point heard;     // last heartbeat
  Clock::time_point changed;   // last heartbeat with new events
};

// What a worker said went wrong, from the lines it wrote to stderr
// (error_line.cpp, Note [The last error line]).
class ErrorLines {
 public:
  /// One line of the worker's stderr, as the launcher relays it.
  void add(const std::string& line);
  /// The line its report quotes: its last error line; without one, the
  /// last line that says anything, unless it was killed by a signal; or "".
  std::string quote(bool killed_by_signal) const;

 private:
  std::string error_;     // the last error line
  std::string last_;      // the last line that is no backtrace, model summary or blank
  std::string previous_;  // the line before this one (cleared by a backtrace or summary line)
  int lines_since_error_ = 1 << 20;
};

struct Worker {
  int local_rank = 0;
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  Stream out, err;
  ErrorLines errors;
  Liveness live;
  // Still running when the launcher escalated a stop (SIGTERM after the
  // stop timeout, SIGKILL): its end was forced, not its own.
  bool forced = false;
};

// The fd a worker finds its heartbeat pipe on (Note [Heartbeats]).
constexpr int kHeartbeatChildFd = 3;

// ---- spawning (spawn.cpp) ------------------------------------------------------

/// The path of `program`: as given when it holds a '/', else found on PATH.
std::string find_program(const std::string& program);

// Owns argv/envp strings as the char* arrays execve wants (built before
// fork: the child may only make async-signal-safe calls).
struct ExecArgs {
  std::vector<std::string> storage;
  std::vector<char*> pointers;
  explicit ExecArgs(std::vector<std::string> items) : storage(std::move(items)) {
    for (std::string& s : storage) pointers.push_back(s.data());
    pointers.push_back(nullptr);
  }
  char* const* get() { return pointers.data(); }
};

/// This process's environment with `overrides` applied, as NAME=VALUE.
std::vector<std::string> worker_environment(const std::map<std::string, std::string>& overrides);

/// Forks and execs one worker (Note [Worker process groups] in spawn.cpp);
/// throws LaunchError when it cannot start, with the reason.
pid_t spawn_worker(const std::string& path, ExecArgs& argv, ExecArgs& envp, int out_w, int err_w, int devnull,
                   int heartbeat_w);

/// Sends `sig` to the worker's whole process group.
void signal_worker(const Worker& w, int sig);

// ---- supervision (supervisor.cpp) ------------------------------------------------

/// How often workers send heartbeats: a fifth of the hang timeout, within
/// 50 ms .. 10 s.
std::chrono::milliseconds heartbeat_interval(const LaunchOptions& options);

/// Relays the started workers' output (redrawing lines in place when
/// `terminal`) and watches them until every one has ended (stopping the
/// rest when one fails, hangs, or the launcher is signalled on
/// `signal_fd`), then reports.
LaunchResult supervise(const LaunchOptions& options, std::vector<Worker>& workers, int signal_fd, bool terminal);

}  // namespace strata::runtime::launch
