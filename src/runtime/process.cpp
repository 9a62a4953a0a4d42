// Process-wide worker settings and the end of a re-executed worker.
#include "strata/runtime/process.h"

#include <malloc.h>
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>

#include "strata/core/error.h"

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
// starts. A process started by another launcher keeps what that launcher
// (torchrun sets OMP_NUM_THREADS=1) or the user chose: a library must not
// change the thread count of the program it runs in.
int threads_per_worker(int cores, int local_workers) {
  return std::max(1, cores / std::max(1, local_workers));
}

void apply_allocator_settings() {
  // Note [Allocator settings]
  // glibc returns freed memory at the top of the heap to the kernel after
  // every step (trim) and serves large tensors with fresh mmaps, so each
  // training step page-faults its temporaries in again: measured (bench/
  // run_ddp.sh, LibTorch 1.13 with OpenBLAS) as 2.5x slower MLP steps and
  // 1.5x slower GPT steps than with the heap kept; the LibTorch 2.13 rows
  // of docs/benchmarks.md are measured with it kept. Keep it (STRATA_HEAP
  // unset or "keep"), unless the user tuned malloc already.
  //
  // The kept heap costs memory, though: what one phase frees stays
  // resident while the next allocates elsewhere, and under FSDP, where the
  // state is small, that is a third of the training peak (GPT large: 0.69x
  // DDP's peak at 2 ranks kept, 0.54x with nothing kept, docs/benchmarks.md).
  // STRATA_HEAP=lean hands every freed block of 128 KB or more back to the
  // kernel at once instead, for runs bound by memory: 12-20% slower steps
  // there, in exchange.
  const char* heap = std::getenv("STRATA_HEAP");
  const std::string mode = heap != nullptr ? heap : "keep";
  STRATA_CHECK(mode == "keep" || mode == "lean", ConfigError, "[runtime] STRATA_HEAP is '", mode.substr(0, 64),
               "'; use keep (the default: freed memory stays in the heap, fastest) or lean (freed blocks of 128 KB "
               "or more go back to the kernel: lower peak memory, slower steps)");
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr || std::getenv("MALLOC_TRIM_THRESHOLD_") != nullptr) return;
  if (mode == "lean") {
    ::mallopt(M_MMAP_THRESHOLD, 128 << 10);
    ::mallopt(M_TRIM_THRESHOLD, 128 << 10);
  } else {
    ::mallopt(M_MMAP_THRESHOLD, 32 << 20);
    ::mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }
}

void release_free_memory() { ::malloc_trim(0); }

void end_relaunched_worker(int exit_code, bool graceful) {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  if (graceful) std::exit(exit_code);
  std::_Exit(exit_code);
}

}  // namespace strata::runtime
