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

/// As above, but connecting to the peers may take up to `connect_timeout`
/// (the rendezvous timeout) while each collective keeps `timeout`. When a
/// peer never joins, throws TimeoutError naming the ranks that did not.
/// The network interface is GLOO_SOCKET_IFNAME when set, else the one that
/// routes to MASTER_ADDR (loopback when MASTER_ADDR is local or unset).
std::shared_ptr<Backend> create(std::shared_ptr<runtime::Store> store, int rank, int size,
                                std::chrono::milliseconds timeout, std::chrono::milliseconds connect_timeout);

/// As above, with the group's store keys under `key_prefix` instead of a
/// per-process group number: for groups only some ranks create (the host
/// leaders of a hierarchical group), whose numbers would differ between
/// ranks. The prefix must be unique in the job.
std::shared_ptr<Backend> create_named(std::shared_ptr<runtime::Store> store, const std::string& key_prefix, int rank,
                                      int size, std::chrono::milliseconds timeout,
                                      std::chrono::milliseconds connect_timeout);

}  // namespace strata::comm::gloo
