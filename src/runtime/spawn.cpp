// Starting workers: the signal handlers of a launch (Note [Self-pipe]),
// the launcher's own output, finding the program, and fork+exec of one
// worker in its own process group (Note [Worker process groups]).
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "launch_internal.h"
#include "strata/core/error.h"

extern char** environ;

namespace strata::runtime::launch {
namespace {

// Note [Self-pipe]
// Signal handlers only write the signal number into a non-blocking pipe;
// the supervision loop polls that pipe together with the workers' output,
// so SIGCHLD, SIGINT, SIGTERM and SIGUSR1 wake it without races and
// without a busy loop. One launch runs at a time per process (the handlers are global).
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


}  // namespace

SignalScope::SignalScope() {
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

SignalScope::~SignalScope() {
  for (size_t i = 0; i < std::size(kHandledSignals); ++i) ::sigaction(kHandledSignals[i], &previous_[i], nullptr);
  g_signal_fd = -1;
  ::close(read_fd_);
  ::close(write_fd_);
}

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
    for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGUSR1, SIGPIPE}) ::sigaction(sig, &dfl, nullptr);
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

}  // namespace strata::runtime::launch
