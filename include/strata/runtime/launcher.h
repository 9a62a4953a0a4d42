// The launcher: starts one worker process per device, hands each its place
// through environment variables (runtime/env.h) and supervises them. When a
// worker fails it stops the others and reports which rank failed, how, and
// that rank's last error line. Used by `strata launch` and by
// Fabric::launch (which starts copies of the current program).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "strata/core/error.h"
#include "strata/runtime/env.h"

namespace strata::runtime {

/// Set to "1" in every worker's environment when the launcher's stdout is
/// a terminal: a worker whose stdout is the launcher's pipe may then redraw
/// a line in place ("\r" + text), as on a terminal (trainer::ProgressBar).
inline constexpr const char* kEnvLauncherTty = "STRATA_LAUNCHER_TTY";
/// Set to "1" for the workers whose lines the launcher prefixes with
/// "[rank R] " (prefix_output), so that their log leaves the prefix to it.
inline constexpr const char* kEnvLauncherPrefix = "STRATA_LAUNCHER_PREFIX";

/// Which of a worker's streams a line of output came from.
enum class OutputStream { kStdout, kStderr };

/// Receives one line of a worker's output: its global rank, the stream, and
/// the line as the launcher would print it (with the "[rank R] " prefix
/// when prefix_output, and the trailing newline). Called on the thread that
/// runs launch_workers, one line at a time. On a terminal (LaunchOptions::
/// terminal) a line the worker redraws in place arrives as the bytes the
/// launcher writes for it (Note [Redraws through the launcher] in
/// supervisor.cpp): "\r[rank R] text\x1b[K" without a newline for each
/// redraw, the same with "\n" for its last one, and a lone "\n" that ends
/// a redraw another line interrupts.
using OutputSink = std::function<void(int rank, OutputStream stream, const std::string& line)>;

/// How to start and supervise the workers. Fluent setters return *this.
struct LaunchOptions {
  int nproc_per_node = 1;          ///< workers on this host
  int nnodes = 1;                  ///< hosts in the job
  int node_rank = 0;               ///< this host's index
  std::string master_addr = "127.0.0.1";
  /// 0: MASTER_PORT from the launcher's environment when set, else a free
  /// port (single node only).
  int master_port = 0;
  /// Rendezvous timeout passed to the workers (STRATA_TIMEOUT), seconds.
  int timeout_s = 300;
  /// Between SIGTERM and SIGKILL when stopping workers after a failure, a
  /// hang or max_time, and after stop_timeout.
  std::chrono::milliseconds grace_period = std::chrono::seconds(5);
  /// Note [Stopping on a signal] (supervisor.cpp): after the launcher's
  /// first SIGINT/SIGTERM/SIGUSR1, forwarded to every worker, how long the
  /// workers may take to finish their step, save and exit before they are
  /// stopped as after a failure (SIGTERM, grace_period, SIGKILL). 0: no
  /// limit. A second SIGINT/SIGTERM kills them at once.
  std::chrono::milliseconds stop_timeout = std::chrono::seconds(300);
  /// Whether the launcher's stdout is a terminal (nullopt: isatty(stdout)
  /// without on_output, false with it). On one, workers get
  /// STRATA_LAUNCHER_TTY=1 and lines they redraw in place are redrawn in
  /// place (Note [Redraws through the launcher] in supervisor.cpp).
  std::optional<bool> terminal;
  /// Prefix each line of a worker's output with "[rank R] ".
  bool prefix_output = true;
  /// Extra environment variables for every worker.
  std::map<std::string, std::string> extra_env;
  /// When set, worker output goes here instead of the launcher's
  /// stdout/stderr (tests capture it this way).
  OutputSink on_output;
  /// Stop every worker (SIGTERM, then SIGKILL after grace_period) when the
  /// job is still running after this long; 0 means no limit. A job stopped
  /// this way returns exit code 124.
  std::chrono::milliseconds max_time{0};
  /// Stuck-rank detection (Note [Stuck ranks]): a worker that reports
  /// progress (strata's collectives and training loop do, through
  /// runtime/heartbeat.h) and has made none for this long is named, with
  /// where every worker was last seen, and the job is stopped (exit code
  /// 124). Well under the 30-minute collective timeout; 0 turns it off.
  std::chrono::milliseconds hang_timeout = std::chrono::minutes(5);
  /// The local ranks below this one are not started: the calling process
  /// is them (the subprocess launcher's rank 0, Note [The launching
  /// process is rank 0] in strategies/launchers/subprocess.cpp). Every
  /// worker still counts nproc_per_node local ranks.
  int first_local_rank = 0;
  /// Called once the workers run, before they are supervised, on the
  /// thread that runs launch_workers: the place every worker shares
  /// (world, master address and port, job token; rank 0's own) and the
  /// workers' process ids.
  std::function<void(const Environment& job, const std::vector<int>& pids)> on_started;

  LaunchOptions& with_nproc_per_node(int n) { nproc_per_node = n; return *this; }
  LaunchOptions& with_nnodes(int n) { nnodes = n; return *this; }
  LaunchOptions& with_node_rank(int r) { node_rank = r; return *this; }
  LaunchOptions& with_master_addr(std::string a) { master_addr = std::move(a); return *this; }
  LaunchOptions& with_master_port(int p) { master_port = p; return *this; }
  LaunchOptions& with_timeout_s(int s) { timeout_s = s; return *this; }
  LaunchOptions& with_grace_period(std::chrono::milliseconds g) { grace_period = g; return *this; }
  LaunchOptions& with_stop_timeout(std::chrono::milliseconds t) { stop_timeout = t; return *this; }
  LaunchOptions& with_terminal(std::optional<bool> t) { terminal = t; return *this; }
  LaunchOptions& with_prefix_output(bool p) { prefix_output = p; return *this; }
  LaunchOptions& with_env(const std::string& name, std::string value) { extra_env[name] = std::move(value); return *this; }
  LaunchOptions& with_on_output(OutputSink sink) { on_output = std::move(sink); return *this; }
  LaunchOptions& with_max_time(std::chrono::milliseconds t) { max_time = t; return *this; }
  LaunchOptions& with_hang_timeout(std::chrono::milliseconds t) { hang_timeout = t; return *this; }
  LaunchOptions& with_first_local_rank(int r) { first_local_rank = r; return *this; }

  /// Throws ConfigError naming the first invalid field.
  void validate() const;
};

/// What happened to the workers: the outcome as fields (exit_code,
/// failed_rank, failed_exit_code, failed_signal, interrupted_by, hung_rank;
/// core/error.h) and its text. Fabric throws a failed one as a LaunchError
/// carrying the same outcome.
struct LaunchResult : LaunchOutcome {
  std::string last_error;    ///< the failed rank's last line on stderr
  /// One-line description for the user, "" on success, e.g.
  /// "rank 1 exited with code 3; last error: ...".
  std::string summary;
  /// Process ids of the workers, by local rank (all reaped on return).
  std::vector<int> pids;
  /// Where every worker was last seen, one line each (empty unless the
  /// hang check fired).
  std::vector<std::string> report;
};

/// Starts `argv` (argv[0] is the program, looked up on PATH when it has no
/// slash; arguments are passed as given, never through a shell) as
/// options.nproc_per_node workers of this node and supervises them until
/// all exit, one fails, or the launcher gets SIGINT/SIGTERM/SIGUSR1 (which
/// are forwarded to every worker; Note [Stopping on a signal]). Never
/// leaves a worker running. Throws
/// LaunchError when a worker cannot be started at all.
LaunchResult launch_workers(const std::vector<std::string>& argv, const LaunchOptions& options);

/// The command line of the current process (from /proc/self/cmdline), with
/// argv[0] replaced by the path of the running executable.
std::vector<std::string> current_command_line();

}  // namespace strata::runtime
