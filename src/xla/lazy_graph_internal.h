// What the lazy graph's sources share (lazy_graph.cpp builds programs,
// lazy_executor.cpp compiles and runs them); private to src/xla/.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "strata/xla/lazy_graph.h"

namespace strata::xla::lazy::detail {

/// Each node's place in a walk, by address.
///
/// Note [A walk allocates no node]
/// A step's walk visits every node of its graph (1,300 on GPT tiny), and
/// std::unordered_map made one heap allocation for each: 1,263 of the
/// recording thread's 13,691 mallocs a step on GPT tiny (bench/
/// malloc_count.cc). This table keeps its entries in
/// one array (open addressing, linear probing, at most half full), so a
/// walk allocates only as its array doubles.
class NodeSlots {
 public:
  NodeSlots() : entries_(kInitial) {}
  /// The place of `node`; nullptr when the walk has not placed it.
  const int64_t* find(const Node* node) const {
    for (size_t i = home(node);; i = (i + 1) & mask()) {
      const Entry& e = entries_[i];
      if (e.node == node) return &e.slot;
      if (e.node == nullptr) return nullptr;
    }
  }
  bool contains(const Node* node) const { return find(node) != nullptr; }
  /// The place of a node the walk placed (std::out_of_range otherwise).
  int64_t at(const Node* node) const;
  /// Places `node` at `slot`; false (and no change) when it has a place.
  bool insert(const Node* node, int64_t slot);

 private:
  struct Entry {
    const Node* node = nullptr;
    int64_t slot = 0;
  };
  static constexpr size_t kInitial = 2048;  // a power of two
  size_t mask() const { return entries_.size() - 1; }
  size_t home(const Node* node) const {
    // Nodes are at least 16-byte aligned: mix the address's upper bits down.
    uint64_t h = reinterpret_cast<uintptr_t>(node);
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return static_cast<size_t>(h) & mask();
  }
  void grow();
  std::vector<Entry> entries_;
  size_t size_ = 0;
};

/// A graph in emission order: its ops after their inputs, its parameters
/// in first-visit order.
struct Walk {
  std::vector<const Node*> order;
  std::vector<NodePtr> parameters;
  /// Every node's place: a parameter's index (its argument), or -1 - an
  /// op's index in `order`.
  NodeSlots slot;
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
