// Process-wide worker settings and the end of a re-executed worker.
#include "strata/runtime/process.h"

#include <ATen/Parallel.h>

#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <thread>

namespace strata::runtime {

void apply_worker_settings(const Environment& env, const std::string& device_type) {
  // Note [Threads per worker]
  // N CPU workers on one host each default to all cores, oversubscribing
  // the machine N times over. Split the cores unless the user chose.
  if (device_type == "cpu" && env.local_world_size > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    int cores = static_cast<int>(std::thread::hardware_concurrency());
    at::set_num_threads(std::max(1, cores / env.local_world_size));
  }
  // Note [Allocator settings]
  // glibc returns freed memory at the top of the heap to the kernel after
  // every step (trim) and serves large tensors with fresh mmaps, so each
  // training step page-faults its temporaries in again: measured (bench/
  // run_ddp.sh, LibTorch 1.13 with OpenBLAS) as 2.5x slower MLP steps and
  // 1.5x slower GPT steps than with the heap kept; the LibTorch 2.13 rows
  // of docs/benchmarks.md are measured with it kept. Keep it, unless the
  // user tuned malloc already.
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr && std::getenv("MALLOC_TRIM_THRESHOLD_") == nullptr) {
    ::mallopt(M_MMAP_THRESHOLD, 32 << 20);
    ::mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }
}

void end_relaunched_worker(int exit_code, bool graceful) {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  if (graceful) std::exit(exit_code);
  std::_Exit(exit_code);
}

}  // namespace strata::runtime
