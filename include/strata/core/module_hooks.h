// Forward hooks for LibTorch C++ modules.
//
// LibTorch's C++ modules have no forward hooks: forward() is an ordinary,
// non-virtual member function that callers invoke directly. A strategy that
// must act around a module's forward (FSDP gathers a unit's parameters
// before it and frees them after; activation checkpointing recomputes it
// during backward) therefore needs the module to run its forward through
// one call:
//
//   at::Tensor BlockImpl::forward(const at::Tensor& x) {
//     return strata::hooked_forward(*this, x, [&](const at::Tensor& x) {
//       auto h = x + attn->forward(ln1->forward(x));
//       return h + mlp->forward(ln2->forward(h));
//     });
//   }
//
// Without a strategy's hooks on the module, hooked_forward(m, x, body) is
// body(x). The body may run more than once (activation checkpointing runs
// it again in backward), so it must depend only on its input and the
// module's parameters and buffers.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>

namespace torch::nn {
class Module;
}

namespace strata {

/// A module's forward computation, from one input tensor to one output.
using ForwardBody = std::function<at::Tensor(const at::Tensor&)>;

/// What a strategy does around the forward of a module it hooked.
class ForwardHooks {
 public:
  virtual ~ForwardHooks() = default;
  /// Runs `body(input)` as `module`'s forward, with the strategy's work
  /// around it, and returns the output.
  virtual at::Tensor run(torch::nn::Module& module, const at::Tensor& input, const ForwardBody& body) = 0;
};

/// Runs `module`'s forward `body(input)` through the hooks a strategy set
/// on `module` (set_forward_hooks); body(input) when there are none.
at::Tensor hooked_forward(torch::nn::Module& module, const at::Tensor& input, const ForwardBody& body);

/// Sets the hooks of `module` (replacing any), or removes them when
/// `hooks` is null. Strategies call this from setup_module and teardown.
void set_forward_hooks(const torch::nn::Module& module, std::shared_ptr<ForwardHooks> hooks);

/// The hooks set on `module`, or null.
std::shared_ptr<ForwardHooks> forward_hooks(const torch::nn::Module& module);

/// Called by a model's constructor when a submodule that may become a
/// sharded unit is complete (the example GPT: after each block), so that a
/// strategy's module_sharded_context can shard it at once and the whole
/// model never exists unsharded. Does nothing unless a handler is set.
void module_built(torch::nn::Module& module);

/// What module_built calls on this thread.
using ModuleBuiltHandler = std::function<void(torch::nn::Module&)>;
/// Sets the handler of this thread (null: none); returns the previous one.
ModuleBuiltHandler set_module_built_handler(ModuleBuiltHandler handler);
/// True when module_built would call a handler on this thread.
bool module_built_handler_active();

/// While alive (on this thread), models that honour it skip initialising
/// their parameters, which are then to be loaded (a strategy's
/// module_init_context(empty_init=true)). The example models honour it;
/// LibTorch's built-in layers initialise in their constructors regardless.
class SkipParameterInit {
 public:
  SkipParameterInit();
  ~SkipParameterInit();
  SkipParameterInit(const SkipParameterInit&) = delete;
  SkipParameterInit& operator=(const SkipParameterInit&) = delete;
  /// True inside a SkipParameterInit scope on this thread.
  static bool active();

 private:
  bool previous_;
};

}  // namespace strata
