// Supervising started workers: one poll() loop over their output pipes,
// heartbeat pipes and the launch's self-pipe, which relays output line by
// line (and lines redrawn in place, on a terminal: output_relay.cpp),
// notices exits, hangs and signals, stops the others when one fails
// (SIGTERM, then SIGKILL after the grace period), lets them finish their
// step when the launcher is signalled, reaps every worker and writes the
// report.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <string_view>

#include "launch_internal.h"
#include "output_relay.h"
#include "strata/core/error.h"
#include "strata/core/strings.h"
#include "strata/runtime/env.h"

namespace strata::runtime::launch {
namespace {

// Note [Stopping on a signal]
// The first SIGINT, SIGTERM or SIGUSR1 the launcher gets is forwarded, as
// that same signal, to every worker's process group. A strata Trainer takes
// it as a request: the ranks agree to stop after the step they are in, save
// a checkpoint and exit with 128+signal. So the launcher waits for them up
// to stop_timeout (long enough for a large model's checkpoint; 0: no
// limit), and only then stops what is left as after a failure: SIGTERM,
// grace_period, SIGKILL. A second SIGINT or SIGTERM kills every worker at
// once (the user means it); a repeated SIGUSR1 changes nothing. The exit
// status is 128+signal. A worker that ends with 128+signal, dies of the
// signal or exits 0 stopped as asked and is no failure; one that exits
// with another code failed while stopping (its checkpoint may be missing),
// and the report names it.
//
// A worker can be signalled without the launcher (a user's kill): a
// Trainer then exits with 128+signal after the ranks agreed to stop and
// saved. The launcher takes such an exit as the start of the same stop,
// not as a failure: it does not signal the others (they may be saving, and
// may have been sent the signal too: a second one would kill them) but
// gives them stop_timeout to end.
constexpr bool is_stop_signal(int sig) { return sig == SIGINT || sig == SIGTERM || sig == SIGUSR1; }

class Supervisor {
 public:
  Supervisor(const LaunchOptions& options, std::vector<Worker>& workers, int signal_fd, bool terminal)
      : options_(options), workers_(workers), signal_fd_(signal_fd), terminal_(terminal), relay_(options, workers, terminal) {}

  LaunchResult run() {
    start_ = Clock::now();
    while (true) {
      reap();
      if (!any_running() && !any_open()) break;
      if (!any_running() && !drain_deadline_) drain_deadline_ = Clock::now() + options_.grace_period;
      poll_once();
      check_deadlines();
    }
    relay_.end_redraw();
    return result();
  }

 private:
  bool any_running() const {
    for (const Worker& w : workers_)
      if (w.running) return true;
    return false;
  }
  bool any_open() const {
    for (const Worker& w : workers_)
      if (w.out.fd >= 0 || w.err.fd >= 0) return true;
    return false;
  }

  void reap() {
    for (Worker& w : workers_) {
      if (!w.running) continue;
      int status = 0;
      pid_t got = ::waitpid(w.pid, &status, WNOHANG);
      if (got != w.pid) continue;
      w.running = false;
      w.status = status;
      // The worker is gone; end whatever it left behind in its group so no
      // orphan outlives the job (Note [Worker process groups]).
      ::kill(-w.pid, SIGKILL);
      bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      if (!failed) continue;
      if (!stopping_) {
        const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
        if (code > 128 && is_stop_signal(code - 128)) {
          // Note [Stopping on a signal]: a worker signalled on its own.
          worker_signal_ = code - 128;
          first_stopped_ = &w;
          begin_graceful_stop(/*forward=*/false);
          say(detail::cat("rank ", w.rank, " stopped on ", signal_name(worker_signal_), " (exit code ", code, "); ",
                          waiting_text("the others")));
          continue;
        }
        failed_ = &w;
        begin_stop(SIGTERM);
      } else if (graceful_ && failed_while_stopping_ == nullptr && !stopped_as_asked(w)) {
        failed_while_stopping_ = &w;
      }
    }
  }

  // How a worker ended once a stop on a signal had begun: as asked (Note
  // [Stopping on a signal]), or forced by the launcher (w.forced).
  bool stopped_as_asked(const Worker& w) const {
    if (w.forced) return true;  // reported apart
    if (WIFSIGNALED(w.status)) return is_stop_signal(WTERMSIG(w.status));
    const int code = WEXITSTATUS(w.status);
    return code == 0 || (code > 128 && is_stop_signal(code - 128));
  }

  void begin_stop(int sig) {
    stopping_ = true;
    kill_deadline_ = Clock::now() + options_.grace_period;
    for (const Worker& w : workers_)
      if (w.running) signal_worker(w, sig);
  }

  // The stop of Note [Stopping on a signal]: the workers get stop_timeout.
  void begin_graceful_stop(bool forward) {
    stopping_ = true;
    graceful_ = true;
    if (options_.stop_timeout.count() > 0) kill_deadline_ = Clock::now() + options_.stop_timeout;
    else kill_deadline_.reset();
    if (!forward) return;
    for (const Worker& w : workers_)
      if (w.running) signal_worker(w, stop_signal_);
  }

  // After stop_timeout: what is left is stopped as after a failure.
  void escalate() {
    escalated_ = true;
    std::vector<std::string> left;
    for (Worker& w : workers_) {
      if (!w.running) continue;
      w.forced = true;
      left.push_back(std::to_string(w.rank));
      signal_worker(w, SIGTERM);
      signal_worker(w, SIGCONT);  // a stopped worker must see its SIGTERM
    }
    say(detail::cat(left.size() == 1 ? "rank " : "ranks ", strata::join(left), " did not end within the stop timeout (",
                    seconds_text(options_.stop_timeout), "); sent SIGTERM, SIGKILL follows in ",
                    seconds_text(options_.grace_period)));
    kill_deadline_ = Clock::now() + options_.grace_period;
  }

  void kill_all() {
    killed_ = true;
    for (Worker& w : workers_) {
      if (!w.running) continue;
      w.forced = true;
      signal_worker(w, SIGKILL);
    }
  }

  // "waiting up to 300.0 s for <what> (...)": the line said when a stop on
  // a signal begins.
  std::string waiting_text(const std::string& what) const {
    std::string limit = options_.stop_timeout.count() > 0
                            ? detail::cat("up to ", seconds_text(options_.stop_timeout), " (stop timeout)")
                            : std::string("with no time limit (stop timeout 0)");
    return detail::cat("waiting ", limit, " for ", what,
                       " to finish their step, save and exit; a second SIGINT (Ctrl-C) or SIGTERM stops them at once");
  }

  // One line from the launcher itself, on its stderr.
  void say(const std::string& text) {
    relay_.end_redraw();
    write_all(STDERR_FILENO, "[launcher] " + text + "\n");
  }

  void poll_once() {
    std::vector<pollfd> fds;
    std::vector<Stream*> streams;
    fds.push_back({signal_fd_, POLLIN, 0});
    streams.push_back(nullptr);
    std::vector<Worker*> beating;
    for (Worker& w : workers_) {
      for (Stream* s : {&w.out, &w.err}) {
        if (s->fd < 0) continue;
        fds.push_back({s->fd, POLLIN, 0});
        streams.push_back(s);
      }
    }
    const size_t first_heartbeat = fds.size();
    for (Worker& w : workers_) {
      if (w.live.fd < 0 || !w.running) continue;
      fds.push_back({w.live.fd, POLLIN, 0});
      beating.push_back(&w);
    }
    int timeout_ms = -1;
    auto consider = [&](Clock::time_point deadline) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count() + 1;
      int ms = static_cast<int>(std::max<long long>(0, std::min<long long>(left, 60 * 60 * 1000)));
      if (timeout_ms < 0 || ms < timeout_ms) timeout_ms = ms;
    };
    if (stopping_ && !killed_ && kill_deadline_) consider(*kill_deadline_);
    if (!stopping_ && options_.max_time.count() > 0) consider(start_ + options_.max_time);
    if (drain_deadline_) consider(*drain_deadline_);
    if (!stopping_ && options_.hang_timeout.count() > 0) consider(Clock::now() + heartbeat_interval(options_));
    int n = ::poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0) {
      STRATA_CHECK(errno == EINTR, LaunchError, "[launcher] poll failed: ", detail::errno_string(errno));
      return;
    }
    if (fds[0].revents & POLLIN) drain_signals();
    for (size_t i = 1; i < first_heartbeat; ++i) {
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) relay_.read_stream(*streams[i]);
    }
    for (size_t i = first_heartbeat; i < fds.size(); ++i) {
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) read_heartbeats(*beating[i - first_heartbeat]);
    }
  }

  void read_heartbeats(Worker& w) {
    char buffer[4096];
    ssize_t n = ::read(w.live.fd, buffer, sizeof(buffer));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n <= 0) {
      ::close(w.live.fd);
      w.live.fd = -1;
      return;
    }
    Liveness& live = w.live;
    live.partial.append(buffer, static_cast<size_t>(n));
    size_t begin = 0;
    for (size_t nl; (nl = live.partial.find('\n', begin)) != std::string::npos; begin = nl + 1) {
      Heartbeat beat;
      if (!Heartbeat::parse(live.partial.substr(begin, nl - begin), beat)) continue;
      auto now = Clock::now();
      if (!live.seen || beat.events != live.last.events) live.changed = now;
      live.seen = true;
      live.heard = now;
      live.last = beat;
    }
    live.partial.erase(0, begin);
    if (live.partial.size() > 4096) live.partial.clear();
  }

  // Note [Stuck ranks]
  // A worker that reports progress and has made none for hang_timeout is
  // stuck, or waits on one that is. Among those stalled, the one to name
  // is, in order: one whose heartbeats stopped (the process is stopped or
  // frozen whole), one outside any collective (stuck in user code while
  // its peers wait for it), else the one stalled longest. When every
  // stalled worker here waits inside a collective, the rank they wait for
  // is on another node (whose launcher names it) or never came; the report
  // says so. Then the job stops as for a failed worker.
  void check_hang(Clock::time_point now) {
    if (stopping_ || options_.hang_timeout.count() <= 0) return;
    const auto silent_after = 2 * heartbeat_interval(options_) + std::chrono::seconds(1);
    bool any_stalled = false;
    for (const Worker& w : workers_)
      any_stalled = any_stalled || (w.running && w.live.seen && now - w.live.changed >= options_.hang_timeout);
    if (!any_stalled) return;
    // Heartbeats reach the launcher at intervals, so the one that stalled
    // first may be seen stalling a little after its peers: the culprit is
    // chosen among every worker stalled for half the timeout.
    Worker* culprit = nullptr;
    int culprit_class = 3;  // 0: silent, 1: in user code, 2: waiting in a collective
    for (Worker& w : workers_) {
      if (!w.running || !w.live.seen || now - w.live.changed < options_.hang_timeout / 2) continue;
      int cls = now - w.live.heard > silent_after ? 0 : (w.live.last.in_collective ? 2 : 1);
      if (cls < culprit_class || (cls == culprit_class && w.live.changed < culprit->live.changed)) {
        culprit = &w;
        culprit_class = cls;
      }
    }
    if (culprit == nullptr) return;
    std::vector<std::string>& report = report_;
    auto where = [](const Heartbeat& b) {
      std::string step = b.step >= 0 ? detail::cat(" at step ", b.step) : std::string();
      if (b.in_collective) return detail::cat("in ", b.label, step);
      return detail::cat("in user code", step, b.label.empty() ? std::string() : ", after " + b.label);
    };
    if (culprit_class == 2) {
      summary_ = detail::cat("every worker here has waited in a collective for at least ",
                             seconds_text(options_.hang_timeout), " (--hang-timeout); the rank they wait for is "
                             "on another node or never called it");
    } else {
      hung_ = culprit;
      const Heartbeat& b = culprit->live.last;
      summary_ = culprit_class == 0
                     ? detail::cat("rank ", culprit->rank, " is stuck: no heartbeat for ",
                                   seconds_text(now - culprit->live.heard), " (the process is stopped or frozen); "
                                   "last seen ", where(b))
                     : detail::cat("rank ", culprit->rank, " is stuck: no progress for ",
                                   seconds_text(now - culprit->live.changed), " ", where(b),
                                   ", outside any collective");
    }
    for (const Worker& w : workers_) {
      std::string line = detail::cat("  rank ", w.rank, ": ");
      if (!w.running) {
        line += "exited";
      } else if (!w.live.seen) {
        line += "no progress reported";
      } else if (now - w.live.heard > silent_after) {
        line += detail::cat("no heartbeat for ", seconds_text(now - w.live.heard), ", last seen ", where(w.live.last));
      } else {
        line += detail::cat(w.live.last.in_collective ? "waiting " : "running ", where(w.live.last), ", for ",
                            seconds_text(now - w.live.changed));
      }
      if (&w == hung_) line += "   <- stuck";
      report.push_back(line);
    }
    report.push_back(detail::cat("stopped the job: no progress within --hang-timeout ",
                                 seconds_text(options_.hang_timeout)));
    begin_stop(SIGTERM);
    for (const Worker& w : workers_)
      if (w.running) signal_worker(w, SIGCONT);  // a stopped worker must see its SIGTERM
  }

  static std::string seconds_text(Clock::duration d) {
    double s = std::chrono::duration<double>(d).count();
    char text[32];
    std::snprintf(text, sizeof(text), "%.1f s", s);
    return text;
  }

  void drain_signals() {
    unsigned char buffer[64];
    ssize_t n;
    while ((n = ::read(signal_fd_, buffer, sizeof(buffer))) > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        int sig = buffer[i];
        if (!is_stop_signal(sig)) continue;  // SIGCHLD: reap() runs next
        if (!stopping_) {
          // Note [Stopping on a signal]: forward it, let them save.
          stop_signal_ = sig;
          begin_graceful_stop(/*forward=*/true);
          say(detail::cat("received ", signal_name(sig), "; forwarded it to the ", running_count(), " workers, ",
                          waiting_text("them")));
        } else if (sig == SIGUSR1) {
          continue;  // a repeated SIGUSR1 asks for nothing new
        } else if (graceful_ && stop_signal_ == 0) {
          // A worker began the stop; this is the launcher's first signal.
          stop_signal_ = sig;
          say(detail::cat("received ", signal_name(sig), "; the workers are already stopping (rank ",
                          first_stopped_->rank, " stopped on ", signal_name(worker_signal_),
                          "); a second SIGINT or SIGTERM stops them at once"));
        } else if (!killed_) {
          // Asked again while stopping: do not wait any longer.
          second_signal_ = graceful_;
          if (graceful_) say(detail::cat("received ", signal_name(sig), " again; killing the workers at once"));
          kill_all();
        }
      }
    }
  }

  int running_count() const {
    int n = 0;
    for (const Worker& w : workers_) n += w.running ? 1 : 0;
    return n;
  }

  void check_deadlines() {
    auto now = Clock::now();
    check_hang(now);
    if (stopping_ && !killed_ && kill_deadline_ && now >= *kill_deadline_) {
      if (graceful_ && !escalated_) escalate();
      else kill_all();
    }
    if (!stopping_ && options_.max_time.count() > 0 && now >= start_ + options_.max_time) {
      timed_out_ = true;
      begin_stop(SIGTERM);
    }
    if (drain_deadline_ && now >= *drain_deadline_) {
      // Every worker is reaped but something that escaped its group still
      // holds a pipe open: take what is buffered (the read ends are
      // non-blocking) and stop waiting for more.
      for (Worker& w : workers_) {
        for (Stream* s : {&w.out, &w.err}) {
          while (s->fd >= 0 && relay_.read_stream(*s)) {
          }
          if (s->fd >= 0) relay_.close_stream(*s);
        }
      }
    }
  }

  LaunchResult result() const {
    LaunchResult r;
    for (const Worker& w : workers_) r.pids.push_back(w.pid);
    if (failed_ != nullptr) {
      const Worker& w = *failed_;
      r.failed_rank = w.rank;
      r.last_error = w.errors.quote(WIFSIGNALED(w.status));
      if (WIFSIGNALED(w.status)) {
        r.failed_signal = WTERMSIG(w.status);
        r.exit_code = 128 + r.failed_signal;
        r.summary = detail::cat("rank ", w.rank, " was killed by signal ", r.failed_signal, " (",
                                signal_name(r.failed_signal), ")");
      } else {
        r.failed_exit_code = WEXITSTATUS(w.status);
        r.exit_code = r.failed_exit_code;
        r.summary = detail::cat("rank ", w.rank, " exited with code ", r.failed_exit_code);
      }
      if (!r.last_error.empty()) r.summary += "; last error: " + r.last_error;
    } else if (!summary_.empty()) {
      r.exit_code = 124;
      r.hung_rank = hung_ != nullptr ? hung_->rank : -1;
      r.summary = summary_;
      r.report = report_;
    } else if (timed_out_) {
      r.exit_code = 124;
      r.summary = detail::cat("the workers were still running after ", options_.max_time.count(),
                              " ms (max_time); stopped them");
    } else if (graceful_) {
      // Note [Stopping on a signal]
      const int sig = stop_signal_ != 0 && first_stopped_ == nullptr ? stop_signal_ : worker_signal_;
      r.interrupted_by = sig;
      r.exit_code = 128 + sig;
      r.summary = first_stopped_ == nullptr
                      ? detail::cat("the launcher received ", signal_name(sig))
                      : detail::cat("rank ", first_stopped_->rank, " stopped on ", signal_name(sig));
      std::vector<std::string> forced;
      for (const Worker& w : workers_)
        if (w.forced) forced.push_back(std::to_string(w.rank));
      const std::string ranks = detail::cat(forced.size() == 1 ? "rank " : "ranks ", strata::join(forced));
      if (second_signal_) {
        r.summary += detail::cat("; killed ", ranks, " at once on a second signal (a checkpoint may be incomplete)");
      } else if (!forced.empty()) {
        r.summary += detail::cat("; ", ranks, " did not end within the stop timeout (", seconds_text(options_.stop_timeout),
                                 ") and ", forced.size() == 1 ? "was" : "were", " stopped (a checkpoint may be "
                                 "incomplete)");
      } else {
        r.summary += detail::cat("; stopped all ", workers_.size(), " workers");
      }
      if (failed_while_stopping_ != nullptr) {
        const Worker& w = *failed_while_stopping_;
        r.summary += WIFSIGNALED(w.status)
                         ? detail::cat("; rank ", w.rank, " was killed by signal ", WTERMSIG(w.status), " (",
                                       signal_name(WTERMSIG(w.status)), ") while stopping")
                         : detail::cat("; rank ", w.rank, " exited with code ", WEXITSTATUS(w.status), " while stopping");
        const std::string last_error = w.errors.quote(WIFSIGNALED(w.status));
        if (!last_error.empty()) r.summary += "; last error: " + last_error;
      }
    }
    return r;
  }

  const LaunchOptions& options_;
  std::vector<Worker>& workers_;
  int signal_fd_;
  bool terminal_;
  Clock::time_point start_;
  bool stopping_ = false;
  bool killed_ = false;
  bool timed_out_ = false;
  int stop_signal_ = 0;      // the launcher's first SIGINT/SIGTERM/SIGUSR1
  // Note [Stopping on a signal]
  bool graceful_ = false;    // a stop on a signal is under way
  bool escalated_ = false;   // its stop timeout passed
  bool second_signal_ = false;
  int worker_signal_ = 0;    // the signal a worker stopped on by itself
  const Worker* first_stopped_ = nullptr;  // that worker
  const Worker* failed_while_stopping_ = nullptr;
  OutputRelay relay_;
  std::optional<Clock::time_point> kill_deadline_;
  std::optional<Clock::time_point> drain_deadline_;
  const Worker* failed_ = nullptr;
  const Worker* hung_ = nullptr;
  std::string summary_;  // set when the hang check stopped the job
  std::vector<std::string> report_;
};

}  // namespace

std::chrono::milliseconds heartbeat_interval(const LaunchOptions& options) {
  auto ms = options.hang_timeout.count() / 5;
  return std::chrono::milliseconds(std::max<long long>(50, std::min<long long>(ms, 10000)));
}

LaunchResult supervise(const LaunchOptions& options, std::vector<Worker>& workers, int signal_fd, bool terminal) {
  return Supervisor(options, workers, signal_fd, terminal).run();
}

}  // namespace strata::runtime::launch
