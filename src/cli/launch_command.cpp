// `strata launch [options] -- PROGRAM [ARGS...]`: starts PROGRAM as N
// supervised local workers (the torchrun / xmp.spawn role). The flags fill
// a LaunchOptions; runtime::launch_workers does the work. Exit status: 0
// when every worker succeeded, else the failing rank's exit code (128+N
// when it was killed by signal N, 130/143 when the launcher was
// interrupted and the workers stopped), with "[launcher] <what happened>"
// on stderr.
#include "cli/commands.h"
#include "cli/flags.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "strata/core/error.h"
#include "strata/runtime/launcher.h"

namespace strata::cli {
namespace {

/// What `strata launch` was asked to do, as parsed (seconds as typed).
struct LaunchConfig {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  int timeout_s = 300;
  double grace_period_s = 5.0;
  double stop_timeout_s = 300.0;
  double max_time_s = 0.0;
  double hang_timeout_s = 300.0;
  bool no_prefix = false;
  std::vector<std::string> program;  // PROGRAM ARGS..., verbatim
  CLI::Option* master_addr_flag = nullptr;  // to tell whether --master-addr was given
};

// MASTER_ADDR from the environment when --master-addr is not given (the
// flag wins; Note [MASTER_PORT from the environment] in launcher.cpp does
// the same for the port). Checked: one host name or address.
std::string master_addr(const LaunchConfig& c) {
  if (c.master_addr_flag != nullptr && c.master_addr_flag->count() > 0) return c.master_addr;
  const char* text = std::getenv("MASTER_ADDR");
  if (text == nullptr || *text == '\0') return c.master_addr;
  const std::string value(text, ::strnlen(text, 256));
  bool ok = value.size() < 256;
  for (char ch : value) ok = ok && std::isgraph(static_cast<unsigned char>(ch)) != 0;
  STRATA_CHECK(ok, ConfigError, "[launcher] MASTER_ADDR='", value.substr(0, 64), value.size() > 64 ? "..." : "",
               "' in the environment is not a host name or address; set it to rank 0's host, unset it, or give "
               "--master-addr");
  return value;
}

// Seconds as typed (already within their flag's range) to milliseconds.
std::chrono::milliseconds seconds_to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<long long>(std::llround(seconds * 1000.0)));
}

constexpr double kDay = 24 * 3600;

int run_launch(const LaunchConfig& c) {
  STRATA_CHECK(!c.program.empty(), ConfigError,
               "[launcher] no program given; put it after --, e.g. strata launch -n 2 -- ./train --epochs 3");
  runtime::LaunchOptions options;
  options.with_nproc_per_node(c.nproc_per_node)
      .with_nnodes(c.nnodes)
      .with_node_rank(c.node_rank)
      .with_master_addr(master_addr(c))
      .with_master_port(c.master_port)
      .with_timeout_s(c.timeout_s)
      .with_grace_period(seconds_to_ms(c.grace_period_s))
      .with_stop_timeout(seconds_to_ms(c.stop_timeout_s))
      .with_max_time(seconds_to_ms(c.max_time_s))
      .with_hang_timeout(seconds_to_ms(c.hang_timeout_s))
      .with_prefix_output(!c.no_prefix);
  runtime::LaunchResult result = runtime::launch_workers(c.program, options);
  if (!result.summary.empty()) std::cerr << "[launcher] " << result.summary << std::endl;
  for (const std::string& line : result.report) std::cerr << "[launcher] " << line << std::endl;
  // The outcome's status, which `strata train` returns too (Note [Launch
  // outcomes] in strata/core/error.h).
  return result.exit_code;
}

}  // namespace

Command make_launch_command() {
  auto config = std::make_shared<LaunchConfig>();
  auto numbers = std::make_shared<NumericFlags>("launcher");
  Command command;
  command.register_fn = [config, numbers](CLI::App& app) {
    CLI::App* sub = app.add_subcommand(
        "launch",
        "Start PROGRAM as N supervised worker processes on this host.\n"
        "Each worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK,\n"
        "MASTER_ADDR, MASTER_PORT and STRATA_TIMEOUT in its environment; its output\n"
        "is printed line by line with a \"[rank R] \" prefix. When a worker fails, the\n"
        "others are stopped (SIGTERM, then SIGKILL after the grace period) and the\n"
        "exit status is the failing rank's. Ctrl-C (SIGINT), SIGTERM or SIGUSR1 is\n"
        "forwarded to every worker, which may finish its step and save (within\n"
        "--stop-timeout); a second Ctrl-C or SIGTERM stops them at once; the exit\n"
        "status is 128+signal (130 for Ctrl-C). MASTER_ADDR and MASTER_PORT from the\n"
        "environment are used when --master-addr / --master-port are not given (the\n"
        "flags win). PROGRAM and its ARGS follow `--` and are passed unchanged (no\n"
        "shell).\n"
        "Examples:\n"
        "  strata launch -n 4 -- ./my_trainer --epochs 3\n"
        "  strata launch -n 2 --nnodes 2 --node-rank 0 --master-addr node0 --master-port 29500 -- ./my_trainer");
    LaunchConfig& c = *config;
    NumericFlags& n = *numbers;
    n.add_integer(sub, "-n,--nproc-per-node", "Workers to start on this host", 1, 1024,
                  [&c](int64_t v) { c.nproc_per_node = int(v); }, "1");
    n.add_integer(sub, "--nnodes", "Hosts in the job (start strata launch on each)", 1, 1024,
                  [&c](int64_t v) { c.nnodes = int(v); }, "1");
    n.add_integer(sub, "--node-rank", "This host's index, 0..nnodes-1 (ranks start at node_rank*N)", 0, 1023,
                  [&c](int64_t v) { c.node_rank = int(v); }, "0");
    c.master_addr_flag =
        sub->add_option("--master-addr", c.master_addr,
                        "Host of global rank 0, which hosts the rendezvous store (default: MASTER_ADDR when set, "
                        "else 127.0.0.1)")
            ->capture_default_str();
    n.add_integer(sub, "--master-port",
                  "Port of the rendezvous store (required when --nnodes > 1); wins over MASTER_PORT. Two jobs on "
                  "one host need two ports: leave both unset for a free one",
                  1, 65535, [&c](int64_t v) { c.master_port = int(v); }, "MASTER_PORT, else a free port");
    n.add_integer(sub, "--timeout", "Rendezvous timeout in seconds, passed as STRATA_TIMEOUT", 1, 86400,
                  [&c](int64_t v) { c.timeout_s = int(v); }, "300");
    n.add_real(sub, "--grace-period", "Seconds between SIGTERM and SIGKILL when stopping workers",
               Range{false, 0, 3600}, [&c](double v) { c.grace_period_s = v; }, "5");
    n.add_real(sub, "--stop-timeout",
               "Seconds the workers may take to finish their step, save and exit after Ctrl-C/SIGTERM/SIGUSR1 "
               "before they are stopped like after a failure (0: no limit)",
               Range{false, 0, 7 * kDay}, [&c](double v) { c.stop_timeout_s = v; }, "300");
    n.add_real(sub, "--max-time", "Stop the job after this many seconds, exit status 124 (0: no limit)",
               Range{false, 0, 365 * kDay}, [&c](double v) { c.max_time_s = v; }, "0");
    n.add_real(sub, "--hang-timeout",
               "Name a worker that made no progress for this many seconds (stuck in a collective, in user code, "
               "or stopped), report where every worker is, and stop the job, exit status 124 (0: off)",
               Range{false, 0, kDay}, [&c](double v) { c.hang_timeout_s = v; }, "300");
    sub->add_flag("--no-prefix", c.no_prefix, "Print worker output without the \"[rank R] \" prefix");
    sub->add_option("program", c.program, "PROGRAM [ARGS...] to run on every worker (after --)");
    return sub;
  };
  command.run = [config, numbers] {
    numbers->apply();
    return run_launch(*config);
  };
  return command;
}

}  // namespace strata::cli
