// One gradient-hook helper for every strategy: a callback after autograd
// accumulated a parameter's gradient, the accumulators kept alive, the
// hooks removed at teardown, and one check for a backward that bypassed
// the strategy. Private to the strategies area.
#pragma once

#include <torch/csrc/autograd/variable.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace strata::strategies {

/// The handle LibTorch gives to a leaf tensor's gradient accumulator (the
/// autograd Node that adds into .grad), whatever smart pointer this
/// LibTorch version uses for Nodes.
using GradAccumulator = decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

/// Note [Gradient hooks]
/// A post hook on a parameter's gradient accumulator runs once autograd
/// has added the parameter's gradient: the moment DDP may copy it into a
/// bucket and FSDP may count its unit complete. LibTorch holds
/// accumulators weakly (a new one is made when none is alive), so the hook
/// lives only while someone keeps its accumulator: this class keeps them,
/// and removes its hooks when it is reset or destroyed. The hooks hold the
/// callback weakly: once the owner is gone they do nothing.
class GradHooks {
 public:
  /// `on_ready(index)` runs after the gradient of the tensor added under
  /// `index` was accumulated (on autograd's thread); it returns whether it
  /// acted on it (false: ignored, e.g. while synchronisation is off).
  explicit GradHooks(std::function<bool(size_t)> on_ready);
  ~GradHooks();
  GradHooks(const GradHooks&) = delete;
  GradHooks& operator=(const GradHooks&) = delete;

  /// Hooks the accumulator of `tensor` (a leaf that requires grad).
  void add(const at::Tensor& tensor, size_t index);
  /// Hooks `accumulator` (made earlier, e.g. while the tensor had its full
  /// shape); a null accumulator is ignored.
  void add(GradAccumulator accumulator, size_t index);
  /// Removes every hook and releases the accumulators.
  void remove_all();

  /// Marks the start and end of a backward run by the strategy; between
  /// two, hooks that fire belong to a backward the strategy did not run.
  /// Throws ConfigError naming `tag` when a hook fired since the last
  /// end_backward() (a loss.backward() that bypassed the strategy).
  void check_no_stray_backward(const std::string& tag) const;
  /// Called when the strategy's backward has consumed what the hooks saw.
  void end_backward() { state_->fired = false; }

 private:
  struct State {
    std::function<bool(size_t)> on_ready;
    bool fired = false;
  };
  class Hook;
  std::shared_ptr<State> state_;
  std::vector<std::pair<GradAccumulator, uintptr_t>> hooked_;
};

}  // namespace strata::strategies
