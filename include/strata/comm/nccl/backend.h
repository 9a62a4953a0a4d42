// The NCCL backend: CUDA collectives. Built only where CUDA LibTorch and
// NCCL are found (STRATA_WITH_NCCL); elsewhere is_available() is false and
// create() explains how to build it.
#pragma once

#include <chrono>
#include <memory>

#include "strata/comm/backend.h"

namespace strata::runtime {
class Store;
}

namespace strata::comm::nccl {

/// True when strata was built with NCCL support.
bool is_available();

/// Creates the NCCL backend for `rank` of `size` on the CUDA device that
/// is current on this thread (one GPU per rank: the Fabric makes it
/// cuda:LOCAL_RANK), exchanging the NCCL id through `store`. The backend is
/// stream-ordered (Note [Stream-ordered backends] in backend.h): each call
/// enqueues its collective on the group's communication stream after the
/// caller's current stream, and its Work's wait() makes the waiting
/// thread's current stream wait for it, without blocking the host. A
/// collective unfinished after `timeout` aborts the communicator; the next
/// wait() or call throws TimeoutError naming the operation and the ranks
/// that never reached it. Throws ConfigError when NCCL was not built or no
/// CUDA device is visible, TimeoutError naming the ranks that never joined
/// within `timeout`, CommError when NCCL cannot create the communicator.
std::shared_ptr<Backend> create(std::shared_ptr<runtime::Store> store, int rank, int size,
                                std::chrono::milliseconds timeout);

}  // namespace strata::comm::nccl
