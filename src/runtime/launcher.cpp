// The launcher: starts N local workers with fork+exec, gives each its
// place through environment variables, relays their output line by line
// with a "[rank R] " prefix, and supervises them with poll() on the output
// pipes and a self-pipe fed by SIGCHLD/SIGINT/SIGTERM. When one worker
// fails, or the launcher is interrupted, it stops the others (SIGTERM, then
// SIGKILL after the grace period), reaps every one of them and reports.
#include "strata/runtime/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <optional>

#include "strata/core/error.h"
#include "strata/runtime/env.h"
#include "strata/runtime/process.h"
#include "strata/runtime/progress.h"
#include "strata/runtime/store.h"

extern char** environ;

namespace strata::runtime {
namespace {

using Clock = std::chrono::steady_clock;

// ---- signals ---------------------------------------------------------------

// Note [Self-pipe]
// Signal handlers only write the signal number into a non-blocking pipe;
// the supervision loop polls that pipe together with the workers' output,
// so SIGCHLD, SIGINT and SIGTERM wake it without races and without a busy
// loop. One launch runs at a time per process (the handlers are global).
volatile sig_atomic_t g_signal_fd = -1;

extern "C" void on_launcher_signal(int sig) {
  int saved = errno;
  unsigned char byte = static_cast<unsigned char>(sig);
  if (g_signal_fd >= 0) {
    ssize_t ignored = ::write(g_signal_fd, &byte, 1);
    (void)ignored;
  }
  errno = saved;
}

constexpr int kHandledSignals[] = {SIGCHLD, SIGINT, SIGTERM};

// Installs the handlers for the lifetime of one launch and restores the
// previous ones afterwards.
class SignalScope {
 public:
  SignalScope() {
    int fds[2];
    STRATA_CHECK_SYSCALL(::pipe2(fds, O_CLOEXEC | O_NONBLOCK), LaunchError, "[launcher] cannot create a pipe");
    read_fd_ = fds[0];
    write_fd_ = fds[1];
    g_signal_fd = write_fd_;
    struct sigaction action {};
    action.sa_handler = on_launcher_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    for (size_t i = 0; i < std::size(kHandledSignals); ++i) ::sigaction(kHandledSignals[i], &action, &previous_[i]);
  }
  ~SignalScope() {
    for (size_t i = 0; i < std::size(kHandledSignals); ++i) ::sigaction(kHandledSignals[i], &previous_[i], nullptr);
    g_signal_fd = -1;
    ::close(read_fd_);
    ::close(write_fd_);
  }
  int read_fd() const { return read_fd_; }

 private:
  int read_fd_ = -1;
  int write_fd_ = -1;
  struct sigaction previous_[std::size(kHandledSignals)] {};
};

std::string signal_name(int sig) {
  switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGXCPU: return "SIGXCPU";
    default: return detail::cat("signal ", sig);
  }
}

// ---- output ----------------------------------------------------------------

void write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the launcher's own output is gone; keep supervising
    done += static_cast<size_t>(n);
  }
}

constexpr size_t kMaxLine = 64 * 1024;  // longer lines are split

struct Worker;

struct Stream {
  int fd = -1;
  OutputStream kind = OutputStream::kStdout;
  std::string partial;
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

struct Worker {
  int local_rank = 0;
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  Stream out, err;
  std::string last_error;
  Liveness live;
};

// The fd a worker finds its heartbeat pipe on (Note [Heartbeats]).
constexpr int kHeartbeatChildFd = 3;

// ---- spawning --------------------------------------------------------------

std::string find_program(const std::string& program) {
  STRATA_CHECK(!program.empty(), LaunchError, "[launcher] the program name is empty");
  if (program.find('/') != std::string::npos) return program;
  const char* path_env = std::getenv("PATH");
  std::string path = path_env != nullptr ? path_env : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    std::string dir = path.substr(start, end - start);
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + program;
    struct stat info {};
    if (::stat(candidate.c_str(), &info) == 0 && S_ISREG(info.st_mode) && ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
    start = end + 1;
  }
  throw LaunchError(detail::cat("[launcher] cannot find program '", program, "' on PATH (", path,
                                "); give its path or add its folder to PATH"));
}

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

std::vector<std::string> worker_environment(const std::map<std::string, std::string>& overrides) {
  std::map<std::string, std::string> vars;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    std::string text(*entry);
    auto eq = text.find('=');
    if (eq != std::string::npos) vars[text.substr(0, eq)] = text.substr(eq + 1);
  }
  for (const auto& [name, value] : overrides) vars[name] = value;
  std::vector<std::string> out;
  for (const auto& [name, value] : vars) out.push_back(name + "=" + value);
  return out;
}

// Note [Worker process groups]
// Each worker leads its own process group, so stopping it with
// kill(-pgid) also reaches the processes it started (a shell's children,
// data-loader helpers). The cost: a terminal's Ctrl-C reaches only the
// launcher, which forwards it. Workers read stdin from /dev/null because a
// background group that reads the terminal would be stopped by SIGTTIN.
// PR_SET_PDEATHSIG kills a worker when the launcher dies without cleaning up
// (SIGKILL); it fires when the forking *thread* exits, which is fine since
// launch_workers blocks that thread until every worker is reaped.
pid_t spawn_worker(const std::string& path, ExecArgs& argv, ExecArgs& envp, int out_w, int err_w, int devnull,
                   int heartbeat_w) {
  int report[2];
  STRATA_CHECK_SYSCALL(::pipe2(report, O_CLOEXEC), LaunchError, "[launcher] cannot create a pipe");
  sigset_t all, previous;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &previous);
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid == 0) {
    // Child: async-signal-safe calls only.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGPIPE}) ::sigaction(sig, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::setpgid(0, 0);  // Note [Worker process groups]
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    bool ok = ::dup2(devnull, 0) >= 0 && ::dup2(out_w, 1) >= 0 && ::dup2(err_w, 2) >= 0;
    if (ok && heartbeat_w >= 0) {
      ok = heartbeat_w == kHeartbeatChildFd ? ::fcntl(heartbeat_w, F_SETFD, 0) >= 0
                                            : ::dup2(heartbeat_w, kHeartbeatChildFd) >= 0;
    }
    if (!ok) {
      int err = errno;
      ssize_t ignored = ::write(report[1], &err, sizeof(err));
      (void)ignored;
      ::_exit(127);
    }
    ::execve(path.c_str(), argv.get(), envp.get());
    int err = errno;
    ssize_t ignored = ::write(report[1], &err, sizeof(err));
    (void)ignored;
    ::_exit(127);
  }
  int fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  ::close(report[1]);
  if (pid < 0) {
    ::close(report[0]);
    throw LaunchError(detail::cat("[launcher] cannot start '", path, "': fork failed: ",
                                  detail::errno_string(fork_errno)));
  }
  ::setpgid(pid, pid);  // also in the parent, so the group exists before any kill
  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(report[0], &child_errno, sizeof(child_errno));
  } while (n < 0 && errno == EINTR);
  ::close(report[0]);
  if (n == static_cast<ssize_t>(sizeof(child_errno))) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    throw LaunchError(detail::cat("[launcher] cannot run '", path, "': ", detail::errno_string(child_errno)));
  }
  return pid;
}

// Sends `sig` to the worker's whole process group (Note [Worker process groups]).
void signal_worker(const Worker& w, int sig) {
  if (::kill(-w.pid, sig) != 0) ::kill(w.pid, sig);
}

// ---- supervision -------------------------------------------------------------

// How often workers send heartbeats: a fifth of the hang timeout, within
// 50 ms .. 10 s.
std::chrono::milliseconds heartbeat_interval(const LaunchOptions& options) {
  auto ms = options.hang_timeout.count() / 5;
  return std::chrono::milliseconds(std::max<long long>(50, std::min<long long>(ms, 10000)));
}

class Supervisor {
 public:
  Supervisor(const LaunchOptions& options, std::vector<Worker>& workers, int signal_fd)
      : options_(options), workers_(workers), signal_fd_(signal_fd) {}

  LaunchResult run() {
    start_ = Clock::now();
    while (true) {
      reap();
      if (!any_running() && !any_open()) break;
      if (!any_running() && !drain_deadline_) drain_deadline_ = Clock::now() + options_.grace_period;
      poll_once();
      check_deadlines();
    }
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
      if (failed && !stopping_) {
        failed_ = &w;
        begin_stop(SIGTERM);
      }
    }
  }

  void begin_stop(int sig) {
    stopping_ = true;
    kill_deadline_ = Clock::now() + options_.grace_period;
    for (const Worker& w : workers_)
      if (w.running) signal_worker(w, sig);
  }

  void kill_all() {
    killed_ = true;
    for (const Worker& w : workers_)
      if (w.running) signal_worker(w, SIGKILL);
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
    if (stopping_ && !killed_) consider(kill_deadline_);
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
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) read_stream(*streams[i]);
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
        if (sig != SIGINT && sig != SIGTERM) continue;  // SIGCHLD: reap() runs next
        if (!stopping_) {
          stop_signal_ = sig;
          begin_stop(sig);  // forward the launcher's signal to every worker
        } else if (!killed_) {
          kill_all();  // asked again while stopping: do not wait for the grace period
        }
      }
    }
  }

  Worker& owner(const Stream& s) {
    for (Worker& w : workers_)
      if (&w.out == &s || &w.err == &s) return w;
    STRATA_ASSERT(false, "stream without a worker");
  }

  // Reads what is available; returns false when nothing was (or at EOF).
  bool read_stream(Stream& s) {
    char buffer[16384];
    ssize_t n = ::read(s.fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) return true;
    if (n < 0 && errno == EAGAIN) return false;
    if (n <= 0) {
      close_stream(s);
      return false;
    }
    s.partial.append(buffer, static_cast<size_t>(n));
    size_t begin = 0;
    while (true) {
      size_t nl = s.partial.find('\n', begin);
      if (nl == std::string::npos) break;
      emit(owner(s), s.kind, s.partial.substr(begin, nl - begin));
      begin = nl + 1;
    }
    s.partial.erase(0, begin);
    if (s.partial.size() > kMaxLine) {
      emit(owner(s), s.kind, s.partial);
      s.partial.clear();
    }
    return true;
  }

  void close_stream(Stream& s) {
    if (!s.partial.empty()) emit(owner(s), s.kind, s.partial);
    s.partial.clear();
    ::close(s.fd);
    s.fd = -1;
  }

  void emit(Worker& w, OutputStream kind, std::string line) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (kind == OutputStream::kStderr && line.find_first_not_of(" \t") != std::string::npos) w.last_error = line;
    std::string text = options_.prefix_output ? detail::cat("[rank ", w.rank, "] ", line, "\n") : line + "\n";
    if (options_.on_output) {
      options_.on_output(w.rank, kind, text);
    } else {
      write_all(kind == OutputStream::kStdout ? STDOUT_FILENO : STDERR_FILENO, text);
    }
  }

  void check_deadlines() {
    auto now = Clock::now();
    check_hang(now);
    if (stopping_ && !killed_ && now >= kill_deadline_) kill_all();
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
          while (s->fd >= 0 && read_stream(*s)) {
          }
          if (s->fd >= 0) close_stream(*s);
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
      r.last_error = w.last_error;
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
      if (!w.last_error.empty()) r.summary += "; last error: " + w.last_error;
    } else if (!summary_.empty()) {
      r.exit_code = 124;
      r.hung_rank = hung_ != nullptr ? hung_->rank : -1;
      r.summary = summary_;
      r.report = report_;
    } else if (timed_out_) {
      r.exit_code = 124;
      r.summary = detail::cat("the workers were still running after ", options_.max_time.count(),
                              " ms (max_time); stopped them");
    } else if (stop_signal_ != 0) {
      r.exit_code = 128 + stop_signal_;
      r.summary = detail::cat("the launcher received ", signal_name(stop_signal_), "; stopped all ",
                              workers_.size(), " workers");
    }
    return r;
  }

  const LaunchOptions& options_;
  std::vector<Worker>& workers_;
  int signal_fd_;
  Clock::time_point start_;
  bool stopping_ = false;
  bool killed_ = false;
  bool timed_out_ = false;
  int stop_signal_ = 0;
  Clock::time_point kill_deadline_;
  std::optional<Clock::time_point> drain_deadline_;
  const Worker* failed_ = nullptr;
  const Worker* hung_ = nullptr;
  std::string summary_;  // set when the hang check stopped the job
  std::vector<std::string> report_;
};

std::mutex g_launch_mutex;  // Note [Self-pipe]: one launch at a time

// Note [Job token]
// Workers prove to the rendezvous store that they belong to the job with a
// token the launcher hands them (STRATA_JOB_TOKEN). A token already in the
// launcher's environment is used as is (several nodes must share one: set
// the same secret on each). Otherwise a one-node job gets 128 random bits;
// a several-node job, whose launchers cannot agree on random bits, gets one
// derived from the job's address and shape: it keeps another job's workers
// out, not an attacker.
std::string job_token(const LaunchOptions& options, int port) {
  if (const char* given = std::getenv(kEnvJobToken); given != nullptr && *given != '\0') return given;
  if (options.nnodes > 1) {
    return detail::cat("job-", options.master_addr, "-", port, "-", options.nnodes, "x", options.nproc_per_node);
  }
  unsigned char bytes[16] = {};
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  STRATA_CHECK_SYSCALL(fd, LaunchError, "[launcher] cannot open /dev/urandom for the job token");
  ssize_t n = ::read(fd, bytes, sizeof(bytes));
  ::close(fd);
  STRATA_CHECK(n == static_cast<ssize_t>(sizeof(bytes)), LaunchError, "[launcher] cannot read /dev/urandom");
  static const char* hex = "0123456789abcdef";
  std::string token;
  for (unsigned char b : bytes) {
    token += hex[b >> 4];
    token += hex[b & 15];
  }
  return token;
}

}  // namespace

void LaunchOptions::validate() const {
  STRATA_CHECK(nproc_per_node >= 1, ConfigError,
               "[launcher] nproc_per_node (-n/--nproc-per-node) must be at least 1, got ", nproc_per_node);
  STRATA_CHECK(nnodes >= 1, ConfigError, "[launcher] nnodes (--nnodes) must be at least 1, got ", nnodes);
  STRATA_CHECK(node_rank >= 0 && node_rank < nnodes, ConfigError, "[launcher] node_rank (--node-rank) must be in 0..",
               nnodes - 1, " for nnodes=", nnodes, ", got ", node_rank);
  STRATA_CHECK(!master_addr.empty(), ConfigError, "[launcher] master_addr (--master-addr) is empty");
  STRATA_CHECK(master_port >= 0 && master_port <= 65535, ConfigError,
               "[launcher] master_port (--master-port) must be a TCP port (1..65535), got ", master_port);
  STRATA_CHECK(nnodes == 1 || master_port != 0, ConfigError, "[launcher] master_port (--master-port) is required when ",
               "the job spans ", nnodes, " nodes: every node must use the same port on ", master_addr);
  STRATA_CHECK(timeout_s >= 1, ConfigError, "[launcher] timeout_s (--timeout) must be at least 1 second, got ",
               timeout_s);
  STRATA_CHECK(grace_period.count() >= 0, ConfigError,
               "[launcher] grace_period (--grace-period) must not be negative, got ", grace_period.count(), " ms");
  STRATA_CHECK(max_time.count() >= 0, ConfigError, "[launcher] max_time (--max-time) must not be negative, got ",
               max_time.count(), " ms");
  STRATA_CHECK(hang_timeout.count() >= 0, ConfigError,
               "[launcher] hang_timeout (--hang-timeout) must not be negative, got ", hang_timeout.count(), " ms");
}

LaunchResult launch_workers(const std::vector<std::string>& argv, const LaunchOptions& options) {
  options.validate();
  STRATA_CHECK(!argv.empty(), ConfigError, "[launcher] no program to launch; give PROGRAM [ARGS...]");
  const std::string path = find_program(argv[0]);
  std::lock_guard<std::mutex> lock(g_launch_mutex);

  Environment base;
  base.world_size = options.nnodes * options.nproc_per_node;
  base.local_world_size = options.nproc_per_node;
  base.num_nodes = options.nnodes;
  base.node_rank = options.node_rank;
  base.master_addr = options.master_addr;
  base.master_port = options.master_port != 0 ? options.master_port : find_free_port(options.master_addr);
  base.timeout_s = options.timeout_s;
  base.job_token = job_token(options, base.master_port);

  int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  STRATA_CHECK_SYSCALL(devnull, LaunchError, "[launcher] cannot open /dev/null");
  SignalScope signals;
  std::vector<Worker> workers(options.nproc_per_node);
  ExecArgs exec_argv(argv);
  // Note [Threads per worker] (process.cpp): split the cores, unless the
  // user chose a thread count.
  std::optional<std::string> omp_threads;
  if (std::getenv("OMP_NUM_THREADS") == nullptr && !options.extra_env.contains("OMP_NUM_THREADS")) {
    omp_threads = std::to_string(threads_per_worker(usable_cores(), options.nproc_per_node));
  }
  try {
    for (int local = 0; local < options.nproc_per_node; ++local) {
      Worker& w = workers[local];
      w.local_rank = local;
      w.rank = options.node_rank * options.nproc_per_node + local;
      Environment env = base;
      env.rank = w.rank;
      env.local_rank = local;
      std::map<std::string, std::string> vars = env.to_vars();
      if (options.hang_timeout.count() > 0) {
        vars[kEnvHeartbeatFd] = std::to_string(kHeartbeatChildFd);
        vars[kEnvHeartbeatMs] = std::to_string(heartbeat_interval(options).count());
      }
      for (const auto& [name, value] : options.extra_env) vars[name] = value;
      if (omp_threads) vars["OMP_NUM_THREADS"] = *omp_threads;
      ExecArgs envp(worker_environment(vars));
      int out[2], err[2];
      STRATA_CHECK_SYSCALL(::pipe2(out, O_CLOEXEC), LaunchError, "[launcher] cannot create a pipe");
      if (::pipe2(err, O_CLOEXEC) != 0) {
        ::close(out[0]);
        ::close(out[1]);
        STRATA_CHECK_SYSCALL(-1, LaunchError, "[launcher] cannot create a pipe");
      }
      // Only the launcher's ends are non-blocking; the workers' stay blocking.
      ::fcntl(out[0], F_SETFL, ::fcntl(out[0], F_GETFL) | O_NONBLOCK);
      ::fcntl(err[0], F_SETFL, ::fcntl(err[0], F_GETFL) | O_NONBLOCK);
      w.out = {out[0], OutputStream::kStdout, {}};
      w.err = {err[0], OutputStream::kStderr, {}};
      int beat[2] = {-1, -1};
      if (options.hang_timeout.count() > 0) {
        if (::pipe2(beat, O_CLOEXEC) != 0) {
          ::close(out[1]);
          ::close(err[1]);
          STRATA_CHECK_SYSCALL(-1, LaunchError, "[launcher] cannot create a pipe");
        }
        ::fcntl(beat[0], F_SETFL, ::fcntl(beat[0], F_GETFL) | O_NONBLOCK);
        w.live.fd = beat[0];
      }
      auto close_child_ends = [&] {
        ::close(out[1]);
        ::close(err[1]);
        if (beat[1] >= 0) ::close(beat[1]);
      };
      try {
        w.pid = spawn_worker(path, exec_argv, envp, out[1], err[1], devnull, beat[1]);
      } catch (...) {
        close_child_ends();
        throw;
      }
      w.running = true;
      close_child_ends();
    }
  } catch (...) {
    for (Worker& w : workers) {
      if (w.running) {
        signal_worker(w, SIGKILL);
        while (::waitpid(w.pid, nullptr, 0) < 0 && errno == EINTR) {
        }
      }
      if (w.out.fd >= 0) ::close(w.out.fd);
      if (w.err.fd >= 0) ::close(w.err.fd);
      if (w.live.fd >= 0) ::close(w.live.fd);
    }
    ::close(devnull);
    throw;
  }
  ::close(devnull);
  Supervisor supervisor(options, workers, signals.read_fd());
  LaunchResult result = supervisor.run();
  for (Worker& w : workers)
    if (w.live.fd >= 0) ::close(w.live.fd);
  return result;
}

std::vector<std::string> current_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  STRATA_CHECK(in.good(), LaunchError, "[launcher] cannot read /proc/self/cmdline");
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  size_t start = 0;
  while (start < all.size()) {
    size_t end = all.find('\0', start);
    if (end == std::string::npos) end = all.size();
    args.push_back(all.substr(start, end - start));
    start = end + 1;
  }
  char exe[4096];
  ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  STRATA_CHECK_SYSCALL(n, LaunchError, "[launcher] cannot read /proc/self/exe");
  std::string self(exe, static_cast<size_t>(n));
  if (args.empty()) args.push_back(self);
  else args[0] = self;
  return args;
}

}  // namespace strata::runtime
