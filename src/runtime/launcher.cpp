// The launcher: starts N local workers with fork+exec, gives each its
// place through environment variables, relays their output line by line
// with a "[rank R] " prefix, and supervises them with poll() on the output
// pipes and a self-pipe fed by SIGCHLD/SIGINT/SIGTERM/SIGUSR1. When one
// worker fails it stops the others (SIGTERM, then SIGKILL after the grace
// period); when the launcher is signalled it forwards the signal and lets
// them finish their step (Note [Stopping on a signal] in supervisor.cpp).
// It reaps every one of them and reports.
#include "strata/runtime/launcher.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <optional>

#include "launch_internal.h"
#include "strata/core/error.h"
#include "strata/runtime/env.h"
#include "strata/runtime/process.h"
#include "strata/runtime/store.h"

namespace strata::runtime {

using namespace launch;

namespace {

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

// Note [MASTER_PORT from the environment]
// A user who pins the job's port often does it the torchrun way, with
// MASTER_PORT in the environment. The launcher honours it when no port was
// given (--master-port wins), and checks it: a value that is not a port is
// an error naming it, never a silent free port.
int port_from_environment() {
  const char* text = std::getenv("MASTER_PORT");
  if (text == nullptr || *text == '\0') return 0;
  const std::string value(text, ::strnlen(text, 64));
  bool digits = !value.empty() && value.size() <= 5 && value.find_first_not_of("0123456789") == std::string::npos;
  int port = digits ? std::stoi(value) : 0;
  STRATA_CHECK(digits && port >= 1 && port <= 65535, ConfigError, "[launcher] MASTER_PORT='", value,
               value.size() == 64 ? "..." : "", "' in the environment is not a TCP port (1..65535); set it to "
               "one, unset it for a free port, or give --master-port");
  return port;
}

// Tells options.on_started the job's place (its first local rank's, the
// calling process's when it is rank 0) and the workers' pids.
void report_started(const LaunchOptions& options, const Environment& base, const std::vector<Worker>& workers) {
  if (!options.on_started) return;
  Environment job = base;
  job.rank = options.node_rank * options.nproc_per_node;
  job.source = "strata";
  std::vector<int> pids;
  for (const Worker& w : workers) pids.push_back(w.pid);
  options.on_started(job, pids);
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
  STRATA_CHECK(nnodes == 1 || master_port != 0 || port_from_environment() != 0, ConfigError,
               "[launcher] master_port (--master-port or MASTER_PORT) is required when the job spans ", nnodes,
               " nodes: every node must use the same port on ", master_addr);
  STRATA_CHECK(timeout_s >= 1, ConfigError, "[launcher] timeout_s (--timeout) must be at least 1 second, got ",
               timeout_s);
  STRATA_CHECK(grace_period.count() >= 0, ConfigError,
               "[launcher] grace_period (--grace-period) must not be negative, got ", grace_period.count(), " ms");
  STRATA_CHECK(max_time.count() >= 0, ConfigError, "[launcher] max_time (--max-time) must not be negative, got ",
               max_time.count(), " ms");
  STRATA_CHECK(stop_timeout.count() >= 0, ConfigError,
               "[launcher] stop_timeout (--stop-timeout) must not be negative, got ", stop_timeout.count(), " ms");
  STRATA_CHECK(hang_timeout.count() >= 0, ConfigError,
               "[launcher] hang_timeout (--hang-timeout) must not be negative, got ", hang_timeout.count(), " ms");
  STRATA_CHECK(first_local_rank >= 0 && first_local_rank < nproc_per_node, ConfigError,
               "[launcher] first_local_rank must be in 0..", nproc_per_node - 1, ", got ", first_local_rank);
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
  base.master_port = options.master_port != 0 ? options.master_port : port_from_environment();
  if (base.master_port == 0) base.master_port = find_free_port(options.master_addr);
  // Output to a sink goes where the caller takes it: a terminal only when said.
  const bool terminal = options.terminal.value_or(!options.on_output && ::isatty(STDOUT_FILENO) != 0);
  base.timeout_s = options.timeout_s;
  base.job_token = job_token(options, base.master_port);

  int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  STRATA_CHECK_SYSCALL(devnull, LaunchError, "[launcher] cannot open /dev/null");
  SignalScope signals;
  std::vector<Worker> workers(options.nproc_per_node - options.first_local_rank);
  ExecArgs exec_argv(argv);
  // Note [Threads per worker] (process.cpp): split the cores, unless the
  // user chose a thread count.
  std::optional<std::string> omp_threads;
  if (std::getenv("OMP_NUM_THREADS") == nullptr && !options.extra_env.contains("OMP_NUM_THREADS")) {
    omp_threads = std::to_string(threads_per_worker(usable_cores(), options.nproc_per_node));
  }
  // Note [The process's malloc] (heap.cpp): workers start on the malloc
  // STRATA_MALLOC asks for.
  const std::map<std::string, std::string> malloc_vars = process_malloc_environment();
  try {
    for (int local = options.first_local_rank; local < options.nproc_per_node; ++local) {
      Worker& w = workers[local - options.first_local_rank];
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
      for (const auto& [name, value] : malloc_vars) vars[name] = value;
      // Note [Redraws through the launcher] (supervisor.cpp)
      vars[kEnvLauncherTty] = terminal ? "1" : "0";
      vars[kEnvLauncherPrefix] = options.prefix_output ? "1" : "0";  // strata/core/log.cpp
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
  report_started(options, base, workers);
  LaunchResult result = supervise(options, workers, signals.read_fd(), terminal);
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
