// resolve_placement, make_launcher and launch: Note [One launch
// protocol] (strategies/placement.h).
#include "strata/strategies/placement.h"

#include <ATen/core/Generator.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cstdlib>

#include "strata/core/error.h"
#include "strata/runtime/env.h"
#include "strata/strategies/launchers/in_place.h"
#include "strata/strategies/launchers/subprocess.h"
#include "strata/strategies/launchers/thread_ranks.h"
#include "strata/strategies/make_strategy.h"

namespace strata::strategies {

ResolvedPlacement resolve_placement(const Placement& placement, const std::string& who) {
  STRATA_CHECK(placement.devices == -1 || placement.devices >= 1, ConfigError, "[", who,
               "] devices must be >= 1 (or -1: every visible device, one worker on the CPU), got ",
               placement.devices);
  STRATA_CHECK(placement.num_nodes >= 1, ConfigError, "[", who, "] num_nodes must be >= 1, got ",
               placement.num_nodes);
  STRATA_CHECK(placement.collective_timeout.count() > 0, ConfigError, "[", who,
               "] collective_timeout must be positive, got ", placement.collective_timeout.count(), " ms");
  ResolvedPlacement out;
  out.accelerator = make_accelerator(placement.accelerator);
  out.devices = resolve_devices(*out.accelerator, placement.devices);
  out.num_nodes = placement.num_nodes;
  out.devices_per_process = out.accelerator->devices_per_process(out.devices);
  STRATA_CHECK(out.devices_per_process >= 1 && out.devices % out.devices_per_process == 0, Error, "[", who,
               "] the '", out.accelerator->name(), "' accelerator drives ", out.devices_per_process,
               " devices per process, which does not divide devices=", out.devices);
  out.processes_per_node = out.devices / out.devices_per_process;
  const runtime::Environment env = runtime::Environment::from_env();
  out.launched = env.launched();
  if (out.launched) {
    STRATA_CHECK(env.local_world_size == out.processes_per_node || out.devices == 1, ConfigError, "[", who,
                 "] this worker was started as one of ", env.local_world_size, " per host, but devices=",
                 out.devices, "; start as many workers as devices (or leave devices at 1 when a launcher decides)");
  }
  // The one place a job's size is worked out: the launcher's word when one
  // started this process, else the workers launch() will start.
  out.world_size = out.launched ? env.world_size : out.processes_per_node * out.num_nodes;
  if (out.thread_ranks()) {
    // Note [Ranks as threads] (strategies/xla.h)
    STRATA_CHECK(out.num_nodes == 1, ConfigError, "[", who, "] accelerator '", out.accelerator->name(),
                 "' runs the ranks of a host as threads of one process, on one host for now; got num_nodes=",
                 out.num_nodes);
    STRATA_CHECK(!out.launched || env.world_size == 1, ConfigError, "[", who, "] accelerator '",
                 out.accelerator->name(), "' drives every device from one process, but a launcher started ",
                 env.world_size, " workers; start one process (devices=N runs N ranks as its threads)");
    out.world_size = out.devices;
  }
  STRATA_CHECK(out.accelerator->name() != "xla" || out.world_size == 1 || out.thread_ranks(), ConfigError, "[",
               who, "] accelerator 'xla' runs one process per host, with its devices as ranks; got a job of ",
               out.world_size, " worker processes");
  // The precision, when given, is a strategy object's too (Lightning's rule).
  out.strategy = resolve_strategy(placement.strategy, out.accelerator, placement.precision, out.world_size, who);
  if (!out.strategy->launched()) out.strategy->set_collective_timeout(placement.collective_timeout);
  out.seed = placement.seed;
  out.collective_timeout = placement.collective_timeout;
  out.strategy->set_launcher(make_launcher(out, who));
  return out;
}

std::shared_ptr<Launcher> make_launcher(const ResolvedPlacement& placement, const std::string& who) {
  if (placement.thread_ranks()) return std::make_shared<ThreadRanksLauncher>(placement, who);
  if (placement.needs_spawn()) return std::make_shared<SubprocessLauncher>(placement, who);
  return std::make_shared<InPlaceLauncher>(placement);
}

nlohmann::json launch(const ResolvedPlacement& placement, const std::string& who, WorkerExit exit,
                      const std::function<nlohmann::json()>& call) {
  Strategy& strategy = *placement.strategy;
  // A rank's thread, or a strategy no placement resolved (a thread rank's
  // replica): its environment is this one.
  if (detail::current_thread_rank() != nullptr || strategy.launcher() == nullptr) {
    return run_in_place(strategy, placement.seed, call);
  }
  STRATA_CHECK(!placement.thread_ranks() || exit == WorkerExit::kAfterCall, ConfigError, "[", who,
               "] accelerator '", placement.accelerator->name(), "' runs its ", placement.devices_per_process,
               " ranks as threads of one process: keep the ranks between calls in a ThreadRankJob");
  return strategy.launcher()->launch(call);
}

void seed_everything(uint64_t seed) {
  at::manual_seed(seed);
  std::srand(static_cast<unsigned>(seed));
}

}  // namespace strata::strategies
