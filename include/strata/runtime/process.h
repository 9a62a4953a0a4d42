// Process-wide settings a training worker wants, and the end of a worker
// that a launcher re-executed. These touch the whole process (thread pool,
// allocator, exit), so they live here, apart from the strategies, which
// only ask for them.
#pragma once

#include <string>

#include "strata/runtime/env.h"

namespace strata::runtime {

/// Settings for one worker among `env.local_world_size` on this host that
/// trains on `device_type` ("cpu", "cuda"):
/// - Note [Threads per worker]: CPU workers split the cores unless
///   OMP_NUM_THREADS is set;
/// - Note [Allocator settings]: glibc keeps freed memory (no trim, large
///   mmap threshold) unless MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_
///   is set.
/// Idempotent.
void apply_worker_settings(const Environment& env, const std::string& device_type);

/// Ends a worker process that strata's launcher started by re-executing
/// the program (Fabric::launch's workers), once its work is done: flushes
/// the standard streams and leaves with `exit_code`, without running the
/// rest of the program's main() (the launching process does that).
/// `graceful`: run static destructors (std::exit); false skips them
/// (std::_Exit), for a worker that failed and may hold broken state.
[[noreturn]] void end_relaunched_worker(int exit_code, bool graceful);

}  // namespace strata::runtime
