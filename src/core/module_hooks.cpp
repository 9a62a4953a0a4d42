// Forward hooks kept inside the module (Note [Hooks live in the module]).
#include "strata/core/module_hooks.h"

#include <torch/nn/module.h>

namespace strata {
namespace {

// The child module that holds a module's hooks: no parameters, no buffers.
class HooksHolder : public torch::nn::Module {
 public:
  explicit HooksHolder(std::shared_ptr<ForwardHooks> hooks)
      : torch::nn::Module("strata::ForwardHooks"), hooks(std::move(hooks)) {}
  std::shared_ptr<ForwardHooks> hooks;
};

HooksHolder* holder_of(const torch::nn::Module& module) {
  // The holder is owned by the module's own dictionary of children, so the
  // pointer outlives this copy of it.
  const auto children = module.named_children();
  const auto* child = children.find(kForwardHooksName);
  return child ? dynamic_cast<HooksHolder*>(child->get()) : nullptr;
}

}  // namespace

std::shared_ptr<ForwardHooks> forward_hooks(const torch::nn::Module& module) {
  HooksHolder* holder = holder_of(module);
  return holder ? holder->hooks : nullptr;
}

void set_forward_hooks(torch::nn::Module& module, std::shared_ptr<ForwardHooks> hooks) {
  HooksHolder* holder = holder_of(module);
  if (holder && hooks) {
    holder->hooks = std::move(hooks);
  } else if (holder) {
    module.unregister_module(kForwardHooksName);
  } else if (hooks) {
    module.register_module(kForwardHooksName, std::make_shared<HooksHolder>(std::move(hooks)));
  }
}

bool is_forward_hooks_holder(const torch::nn::Module& module) {
  return dynamic_cast<const HooksHolder*>(&module) != nullptr;
}

TensorList hooked_forward(torch::nn::Module& module, const TensorList& inputs, const ForwardFn& body) {
  std::shared_ptr<ForwardHooks> hooks = forward_hooks(module);
  if (!hooks) return body(inputs);
  return hooks->run(module, inputs, body);
}

at::Tensor hooked_forward(torch::nn::Module& module, const at::Tensor& input, const ForwardBody& body) {
  std::shared_ptr<ForwardHooks> hooks = forward_hooks(module);
  if (!hooks) return body(input);
  // A copy of the body: activation checkpointing keeps it until backward.
  TensorList out = hooks->run(module, {input}, [body](const TensorList& in) { return TensorList{body(in.at(0))}; });
  return out.at(0);
}

namespace {
thread_local bool skip_parameter_init = false;
thread_local ModuleBuiltHandler built_handler;
}  // namespace

void module_built(torch::nn::Module& module) {
  if (built_handler) built_handler(module);
}

ModuleBuiltHandler set_module_built_handler(ModuleBuiltHandler handler) {
  ModuleBuiltHandler previous = std::move(built_handler);
  built_handler = std::move(handler);
  return previous;
}

bool module_built_handler_active() { return static_cast<bool>(built_handler); }

SkipParameterInit::SkipParameterInit() : previous_(skip_parameter_init) { skip_parameter_init = true; }
SkipParameterInit::~SkipParameterInit() { skip_parameter_init = previous_; }
bool SkipParameterInit::active() { return skip_parameter_init; }

}  // namespace strata
