// A backend for jobs on several hosts with several ranks on some of them:
// shared memory inside each host, Gloo between hosts (hierarchical.cpp).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "strata/comm/backend.h"

namespace strata::comm::detail {

/// Where the ranks are: hosts in order of their lowest rank, ranks in
/// order within a host.
struct Topology {
  std::vector<std::vector<int>> hosts;  ///< global ranks of each host
  int host = 0;                         ///< this rank's host
  int local_rank = 0;                   ///< this rank's index in its host
  /// Builds it from every rank's host identity (indexed by global rank).
  static Topology from_identities(const std::vector<std::string>& identities, int rank);
};

/// The hierarchical backend of global rank `rank` of `size`. `local` is the
/// shm backend of this rank's host (null when the host has one rank),
/// `leaders` the Gloo backend between the hosts' first ranks (null on the
/// other ranks); `timeout` is what timeout() reports (both groups use it).
std::shared_ptr<Backend> make_hierarchical(Topology topology, int rank, int size, std::shared_ptr<Backend> local,
                                           std::shared_ptr<Backend> leaders, std::chrono::milliseconds timeout);

}  // namespace strata::comm::detail
