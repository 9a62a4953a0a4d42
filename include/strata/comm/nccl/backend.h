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

/// Creates the NCCL backend for `rank` of `size`, exchanging the NCCL id
/// through `store`. Throws ConfigError when NCCL was not built.
std::shared_ptr<Backend> create(std::shared_ptr<runtime::Store> store, int rank, int size,
                                std::chrono::milliseconds timeout);

}  // namespace strata::comm::nccl
