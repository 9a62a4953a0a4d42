// What the lazy graph's sources share (lazy_graph.cpp builds programs,
// lazy_executor.cpp compiles and runs them); private to src/xla/.
#pragma once

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "strata/xla/lazy_graph.h"

namespace strata::xla::lazy::detail {

/// A graph in emission order: its ops after their inputs, its parameters
/// in first-visit order.
struct Walk {
  std::vector<const Node*> order;
  std::vector<NodePtr> parameters;
  /// Every node's place: a parameter's index (its argument), or -1 - an
  /// op's index in `order`.
  std::unordered_map<const Node*, int64_t> slot;
};

/// Post-order over the DAG of `outputs`, each node once, without recursion
/// (a long chain of ops cannot overflow the stack).
Walk walk(const std::vector<NodePtr>& outputs);

/// The hash of the program `emit` would build from `w` (Note [Programs
/// known by their structure] in lazy_graph.h); none when an op of the
/// graph has no identity.
std::optional<uint64_t> structure(const Walk& w, const std::vector<NodePtr>& outputs, const std::vector<bool>& donate,
                                  const std::string& name, int64_t num_replicas);

/// ConfigError for no output or a null one.
void check_outputs(const std::vector<NodePtr>& outputs);

/// Which of `w`'s parameters `donatable` lets a program consume (buffers
/// only; Note [Donating what only the step holds] in lazy_graph.h).
std::vector<bool> donations(const Walk& w, const Donatable& donatable);

/// The program of `outputs`, walked as `w`, donating the parameters
/// `donate` marks (never one that is itself an output).
Program emit(Walk w, const std::vector<NodePtr>& outputs, const std::vector<bool>& donate, const std::string& name,
             int64_t num_replicas);

}  // namespace strata::xla::lazy::detail
