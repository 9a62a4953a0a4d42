// Process-wide worker settings: the intra-op threads of each worker.
#include "strata/runtime/process.h"

#include <sched.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <string>
#include <thread>

#include <ATen/Parallel.h>

#include "strata/core/error.h"
#include "strata/core/log.h"

namespace strata::runtime {

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

// Note [Threads per worker]
// N workers on one host would each default to all cores, oversubscribing
// the machine N times over. The launcher, which knows
// how many workers it starts, exports OMP_NUM_THREADS = cores / N to each
// (the cores of its own affinity mask), unless the user set
// OMP_NUM_THREADS, which then wins; LibTorch reads it when its thread pool
// starts. A worker that another launcher started splits the cores itself
// (Note [Threads under other launchers]).
int threads_per_worker(int cores, int local_workers) {
  return std::max(1, cores / std::max(1, local_workers));
}

// Note [Threads under other launchers]
// srun and mpirun set no thread count, so N workers on a host each took
// every core: a step measured 5.25 s instead of 0.16 s with 2 workers under
// SLURM variables. A worker that strata's launcher did not start therefore
// applies the launcher's rule itself, once, where the strategy sets up the
// process group: OMP_NUM_THREADS unset means at::set_num_threads(usable
// cores / workers on this host). Under SLURM, SLURM_CPUS_PER_TASK (srun
// --cpus-per-task) is the user's own count per task and wins over the
// split: with SLURM binding each task to its CPUs, the affinity mask is
// already the task's share and dividing it again would idle cores.
//
// torchrun exports OMP_NUM_THREADS=1 to its workers when the user did not
// set it (and prints a warning saying so, torch/distributed/run.py), so a
// worker cannot tell torchrun's 1 from a user's 1. strata keeps it, as it
// keeps any OMP_NUM_THREADS: overriding what the environment says would
// surprise a user who did choose 1, and the warning has told them. The
// line strata logs names the count that the split would give, to set.
//
// The line is logged by each host's local rank 0, since the cores and the
// workers per host may differ between hosts. strata's own launcher
// exports OMP_NUM_THREADS to every worker, so its workers never split
// again and say nothing here.
ThreadChoice choose_worker_threads(const Environment& env, const char* omp_num_threads, const char* cpus_per_task,
                                   bool torchrun, int cores) {
  ThreadChoice choice;
  if (!env.launched() || env.world_size <= 1) return choice;
  std::string launcher;
  if (env.source == "slurm") {
    launcher = "srun";
  } else if (env.source == "openmpi") {
    launcher = "mpirun";
  } else if (torchrun) {
    launcher = "torchrun";
  } else if (env.job_token.empty()) {
    launcher = "the launcher that set RANK and WORLD_SIZE";
  } else {
    return choice;  // strata's launcher: it exported OMP_NUM_THREADS
  }
  const int local = std::max(1, env.local_world_size);
  const int split = threads_per_worker(cores, local);
  const std::string situation = detail::cat(launcher, " started ", local, local == 1 ? " worker" : " workers",
                                            " on this host, which has ", cores, " usable cores");
  if (omp_num_threads != nullptr) {
    std::string omp = std::string(omp_num_threads).substr(0, 32);
    for (char& c : omp)
      if (c < 0x20 || c > 0x7e) c = '?';
    if (torchrun && omp == "1" && split > 1) {
      choice.message = detail::cat("[threads] OMP_NUM_THREADS=1 kept (torchrun sets 1 when the user did not): 1 "
                                   "intra-op thread per worker; ", situation, ", so set OMP_NUM_THREADS=", split,
                                   " to use them");
    } else {
      choice.message = detail::cat("[threads] OMP_NUM_THREADS=", omp, " kept: ", situation);
    }
    return choice;
  }
  if (env.source == "slurm" && cpus_per_task != nullptr) {
    const std::string text(cpus_per_task);
    char* end = nullptr;
    errno = 0;
    const long per_task = std::strtol(text.c_str(), &end, 10);
    STRATA_CHECK(!text.empty() && end == text.c_str() + text.size() && errno == 0 && per_task >= 1 &&
                     per_task <= 1 << 20 && std::isdigit(static_cast<unsigned char>(text[0])),
                 ConfigError, "[threads] SLURM_CPUS_PER_TASK='", text.substr(0, 32),
                 "' is not a positive count of CPUs; srun --cpus-per-task sets it");
    choice.threads = std::max(1, std::min(static_cast<int>(per_task), cores));
    choice.message = detail::cat("[threads] ", choice.threads,
                                 choice.threads == 1 ? " intra-op thread" : " intra-op threads",
                                 " per worker: SLURM_CPUS_PER_TASK=",
                                 per_task, " (", situation, "); OMP_NUM_THREADS is unset (set it to choose)");
    return choice;
  }
  choice.threads = split;
  choice.message = detail::cat("[threads] ", split, split == 1 ? " intra-op thread" : " intra-op threads",
                               " per worker: ", situation, ", and OMP_NUM_THREADS is unset (set it to choose)");
  return choice;
}

void apply_worker_threads(const Environment& env) {
  const ThreadChoice choice = choose_worker_threads(env, std::getenv("OMP_NUM_THREADS"),
                                                    std::getenv("SLURM_CPUS_PER_TASK"),
                                                    std::getenv("TORCHELASTIC_RUN_ID") != nullptr, usable_cores());
  if (choice.threads > 0) at::set_num_threads(choice.threads);
  if (!choice.message.empty()) log::write(log::Level::kInfo, choice.message, /*any_rank=*/env.local_rank == 0);
}

}  // namespace strata::runtime
