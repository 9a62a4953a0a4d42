// The calls containers make to their children, routed through the forward
// hooks (core/module_hooks.h), so that any child of a torch::nn::Sequential
// can be an FSDP unit or activation-checkpointed without a change to the
// model.
//
// A Sequential keeps its children twice: as registered children (what
// named_parameters(), state dicts and checkpoints walk) and as a vector of
// AnyModule entries (what its forward calls). route_container_calls
// replaces each entry with one that runs the child through its hooks and
// leaves the registered children alone, so parameter names, state-dict
// keys and `seq[i]` are what they were. The Sequential's own forward is
// routed too: its first entry runs the whole chain inside the Sequential's
// hooks, and the others pass the result on (Note [Sequential's own
// forward] in src/core/container_calls.cpp), so a Sequential may be a
// unit, a checkpointed module or the root.
//
// ModuleList and ModuleDict have no forward: the user's code calls their
// children through typed members, which strata::call opts in. The
// Sequentials inside them are routed like any other.
//
// Limits while routed: `seq->at<T>(i)` and `seq->ptr<T>(i)` refuse (LibTorch
// checks the entry's type); `seq[i]->as<T>()` works. A routed child's
// forward must take tensors (other arguments pass through unchanged) and,
// when it has hooks, return a tensor, a vector of tensors or a tuple of two
// or three tensors.
#pragma once

#include <memory>

namespace torch::nn {
class Module;
}

namespace strata {

/// The routes set up by route_container_calls; destroying it (or calling
/// restore) puts every Sequential's own entries back.
class ContainerRoutes {
 public:
  virtual ~ContainerRoutes() = default;
  /// Puts the original entries back (idempotent).
  virtual void restore() = 0;
  /// Sequentials routed.
  virtual size_t size() const = 0;
};

/// Routes the calls of every torch::nn::Sequential in `root` (itself
/// included) to their children through the children's forward hooks, and
/// the Sequential's own forward through its hooks. Only Sequentials that
/// have hooks, or whose children have, are routed (so set the hooks
/// first); one routed already is left as it is. Strategies call it from
/// setup_module. Throws ConfigError for a root Sequential that no
/// std::shared_ptr owns.
std::unique_ptr<ContainerRoutes> route_container_calls(torch::nn::Module& root);

}  // namespace strata
