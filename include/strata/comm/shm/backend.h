// The shared-memory backend: CPU collectives between the ranks of one host
// through one POSIX shared-memory segment per group (no sockets, no copies
// through the kernel). init_process_group picks it when every rank of the
// job is on one host, and uses it inside each host of a multi-host job
// (hierarchical with Gloo between hosts).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "strata/comm/backend.h"

namespace strata::runtime {
class Store;
}

namespace strata::comm::shm {

/// True where POSIX shared memory works (Linux: always).
bool is_available();

/// Options of the segment. Environment variables override the defaults
/// (read by from_env()): STRATA_SHM_SLOT_BYTES, STRATA_SHM_SPIN_US,
/// STRATA_SHM_WHOLE_REDUCE_BYTES.
struct ShmOptions {
  /// Bytes of each rank's staging slot (two slots per rank); large calls
  /// are cut into rounds of this size. 64 KiB .. 256 MiB.
  int64_t slot_bytes = 4 << 20;
  /// How long a waiting rank polls before it yields and then sleeps on a
  /// futex (Note [Waiting for peers]); -1 picks from the core count (5 us
  /// when the group has fewer ranks than cores, else 0).
  int spin_us = -1;
  /// all_reduce rounds up to this many bytes let every rank reduce the
  /// whole round itself: one wait instead of two, more arithmetic
  /// (Note [Reduce in parallel]). 0 .. 256 MiB.
  int64_t whole_reduce_bytes = 64 << 10;

  /// The defaults with STRATA_SHM_* applied; throws ConfigError naming a
  /// malformed or out-of-range variable.
  static ShmOptions from_env();
};

/// Joins the shared-memory group of `size` ranks through `store` (every
/// rank of the group calls this with the same store and the same
/// `name_hint`, which names the segment: the job's token, say). Rank 0
/// creates the segment, every rank maps it, and rank 0 removes its name as
/// soon as all have mapped it, so no file remains in /dev/shm whatever
/// happens afterwards. Setup may take up to `connect_timeout`; each
/// collective then has `timeout`. Throws CommError when the segment cannot
/// be created or opened (the message says why and what to do) and
/// TimeoutError naming the ranks that never joined.
std::shared_ptr<Backend> create(std::shared_ptr<runtime::Store> store, int rank, int size,
                                std::chrono::milliseconds timeout, std::chrono::milliseconds connect_timeout,
                                const std::string& name_hint = "", const ShmOptions& options = ShmOptions::from_env());

/// This host's identity for grouping ranks that can share memory:
/// hostname, boot id and the network, IPC and PID namespaces, or
/// STRATA_HOST_ID when set (1..200 printable characters).
std::string host_identity();

}  // namespace strata::comm::shm
