// c10d's ProcessGroupGloo, built behind one function so that only
// process_group_gloo.cpp includes its header (which needs Gloo's headers
// or strata's declarations of them, see decl/gloo/context.h).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>

namespace strata::comm::gloo {

/// Where this rank's Gloo device listens: a network interface by name, or
/// else the address of `hostname`.
struct DeviceAddress {
  std::string interface;
  std::string hostname;
};

/// Connects every rank of the group through `store` (c10d's full-mesh
/// rendezvous, which may take up to `connect_timeout`) and returns c10d's
/// Gloo backend for `rank`. Throws what c10d throws when peers do not
/// connect.
c10::intrusive_ptr<c10d::Backend> make_process_group_gloo(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                          int size, const DeviceAddress& address,
                                                          std::chrono::milliseconds connect_timeout);

}  // namespace strata::comm::gloo
