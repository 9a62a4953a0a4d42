// The Gloo backend: CPU collectives over TCP (Gloo's transport), rendezvous
// through strata's Store.
#pragma once

#include <chrono>
#include <memory>

#include "strata/comm/backend.h"

namespace strata::runtime {
class Store;
}

namespace strata::comm::gloo {

/// True when strata was built with Gloo.
bool is_available();

/// Connects `size` ranks through `store` (all ranks call this with the same
/// store contents) and returns the backend for `rank`. Every operation
/// times out after `timeout`. Throws CommError/TimeoutError when peers do
/// not connect in time.
std::shared_ptr<Backend> create(std::shared_ptr<runtime::Store> store, int rank, int size,
                                std::chrono::milliseconds timeout);

}  // namespace strata::comm::gloo
