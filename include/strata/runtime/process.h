// Process-wide settings a training worker wants. These touch the whole
// process (allocator, threads; the launcher chooses each worker's
// threads), so they live here, apart from the strategies, which only ask
// for them.
#pragma once

#include <cstddef>
#include <map>
#include <string>

#include "strata/runtime/env.h"

namespace strata::runtime {

/// Cores this process may run on: its CPU affinity mask
/// (sched_getaffinity, which taskset, cgroup cpusets and container limits
/// narrow), or std::thread::hardware_concurrency() where that fails; >= 1.
int usable_cores();

/// Note [Threads per worker]: the intra-op threads of each of
/// `local_workers` workers sharing `cores` cores: cores / local_workers,
/// at least 1. strata's launcher exports it to its workers as
/// OMP_NUM_THREADS unless the user set OMP_NUM_THREADS; a worker that
/// another launcher started applies the same split itself
/// (apply_worker_threads).
int threads_per_worker(int cores, int local_workers);

/// What apply_worker_threads decides for a worker (Note [Threads under
/// other launchers] in process.cpp).
struct ThreadChoice {
  int threads = 0;      ///< intra-op threads to set (0: leave LibTorch's as they are)
  std::string message;  ///< the line to log ("": nothing to say)
};

/// The decision alone, from its inputs: `omp_num_threads` is
/// OMP_NUM_THREADS (nullptr: unset), `cpus_per_task` SLURM_CPUS_PER_TASK
/// (nullptr: unset), `torchrun` whether torchrun started the process
/// (TORCHELASTIC_RUN_ID is set), `cores` the usable cores. Throws
/// ConfigError naming SLURM_CPUS_PER_TASK when it is not a positive count.
ThreadChoice choose_worker_threads(const Environment& env, const char* omp_num_threads, const char* cpus_per_task,
                                   bool torchrun, int cores);

/// At the start of a worker of a multi-process job (Strategy::
/// setup_environment): when a launcher other than strata's started it
/// (torchrun, srun, mpirun) and the user did not set OMP_NUM_THREADS, sets
/// LibTorch's intra-op threads to the usable cores / the workers on this
/// host (SLURM_CPUS_PER_TASK, when set, instead), and logs one line per
/// host saying what it chose and why. Nothing for a single process or
/// under strata's own launcher, which exports OMP_NUM_THREADS itself.
void apply_worker_threads(const Environment& env);

/// Note [Allocator settings], Note [The tensor pool] (heap.cpp): sets up
/// the worker's heap from STRATA_HEAP. Unset or "pool": LibTorch's CPU
/// tensors come from a mimalloc pool (c10::SetCPUAllocator) that reuses
/// freed memory across sizes and gives back what stays free; where
/// libmimalloc cannot be loaded, it warns once and falls back to "keep"
/// ("pool" asked for explicitly throws ConfigError there instead).
/// "keep": glibc keeps freed memory (no trim, large mmap threshold).
/// "lean": glibc hands freed blocks of 128 KB or more back to the kernel at
/// once (lowest peak, slower steps). glibc's settings are left alone when
/// MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ is set. Throws
/// ConfigError naming STRATA_HEAP for any other value. The first call
/// decides; later calls only check the value.
void apply_allocator_settings();

/// Note [The process's malloc] (heap.cpp): with STRATA_MALLOC=mimalloc,
/// runs this program again from its start (exec: the same process id,
/// arguments and environment) with libmimalloc preloaded as the whole
/// process's malloc (LD_PRELOAD), unless it already is. Call it first in
/// main(), before any thread starts: the `strata` command and bench_xla
/// do. "system": glibc's malloc, nothing done. Unset: `preferred`, a
/// default rather than a demand (`strata train --accelerator xla` prefers
/// mimalloc): where libmimalloc cannot be loaded it warns and keeps
/// glibc's. Throws ConfigError for another value, or for mimalloc asked
/// for where libmimalloc (STRATA_MIMALLOC names another build) cannot be
/// loaded. Under AddressSanitizer it keeps glibc's malloc, which ASan
/// checks (with a warning when STRATA_MALLOC asked for mimalloc). The
/// program started again logs "[runtime] this process runs on mimalloc".
void apply_process_malloc(const std::string& preferred = "system");

/// The variables a child process needs to start with the malloc
/// STRATA_MALLOC asks for (LD_PRELOAD and mimalloc's options); none for
/// glibc's, or where this process's LD_PRELOAD already carries them. The
/// launcher adds them to its workers' environment. Throws as
/// apply_process_malloc does.
std::map<std::string, std::string> process_malloc_environment();

/// "mimalloc" when libmimalloc serves this process's malloc (preloaded),
/// otherwise "glibc".
std::string process_malloc();

/// What the worker's tensor heap holds.
struct TensorHeapStats {
  std::string mode = "keep";  ///< "pool", "keep" or "lean": what apply_allocator_settings chose
  size_t in_use = 0;          ///< pool only: bytes of the live tensors it serves
  size_t committed = 0;       ///< pool only: bytes it holds from the kernel, in use or free
};
/// The heap apply_allocator_settings chose and, under the pool, its live
/// and committed bytes (for memory reports: bench_ddp --memory-trace).
/// "keep" and zeros before apply_allocator_settings ran.
TensorHeapStats tensor_heap_stats();

/// Whether LibTorch's CPU tensors come from the tensor pool (a cheap
/// check, for code that places its buffers by it).
bool tensor_pool_installed();

/// Hands the pages of the heap's free memory back to the kernel
/// (glibc's malloc_trim), which the settings above otherwise keep: for
/// after a phase that freed much that later phases will not allocate again
/// in the same sizes, such as FSDP's set-up, which frees the unsharded
/// model. Costs a walk over the heap's free blocks (and the tensor pool's).
void release_free_memory();

}  // namespace strata::runtime
