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

// The holder, owned by the module's own dictionary of children (null when
// no hooks are set).
std::shared_ptr<HooksHolder> holder_of(const torch::nn::Module& module) {
  const auto children = module.named_children();
  const auto* child = children.find(kForwardHooksName);
  return child ? std::dynamic_pointer_cast<HooksHolder>(*child) : nullptr;
}

}  // namespace

std::shared_ptr<ForwardHooks> forward_hooks(const torch::nn::Module& module) {
  const std::shared_ptr<HooksHolder> holder = holder_of(module);
  return holder ? holder->hooks : nullptr;
}

void set_forward_hooks(torch::nn::Module& module, std::shared_ptr<ForwardHooks> hooks) {
  const std::shared_ptr<HooksHolder> holder = holder_of(module);
  if (holder && hooks) {
    holder->hooks = std::move(hooks);
  } else if (holder) {
    module.unregister_module(kForwardHooksName);
  } else if (hooks) {
    module.register_module(kForwardHooksName, std::make_shared<HooksHolder>(std::move(hooks)));
  }
}

std::weak_ptr<const torch::nn::Module> forward_hooks_holder(const torch::nn::Module& module) {
  return std::weak_ptr<const torch::nn::Module>(holder_of(module));
}

bool is_forward_hooks_holder(const torch::nn::Module& module) {
  return dynamic_cast<const HooksHolder*>(&module) != nullptr;
}

namespace {

// Note [Hooks run once per forward]
// The modules whose forward body runs inside their hooks on this thread,
// innermost last. A module can be reached twice around one forward: its
// own forward calls hooked_forward and its caller used strata::call, or a
// Sequential routes the call to it. The hooks run at the outer call; the
// inner one runs its body plainly. The body is marked wherever it runs,
// so a recomputation in backward (activation checkpointing) does not run
// the hooks again either.
thread_local std::vector<const torch::nn::Module*> running;

class Running {
 public:
  explicit Running(const torch::nn::Module* module) { running.push_back(module); }
  ~Running() { running.pop_back(); }
  Running(const Running&) = delete;
  Running& operator=(const Running&) = delete;
};

bool is_running(const torch::nn::Module& module) {
  for (const torch::nn::Module* m : running) {
    if (m == &module) return true;
  }
  return false;
}

}  // namespace

bool hooks_pending(const torch::nn::Module& module) { return forward_hooks(module) && !is_running(module); }

TensorList hooked_forward(torch::nn::Module& module, const TensorList& inputs, const ForwardFn& body) {
  std::shared_ptr<ForwardHooks> hooks = forward_hooks(module);
  if (!hooks || is_running(module)) return body(inputs);
  const torch::nn::Module* self = &module;  // identity only: never dereferenced by the body
  return hooks->run(module, inputs, [self, body](const TensorList& in) {
    Running mark(self);
    return body(in);
  });
}

at::Tensor hooked_forward(torch::nn::Module& module, const at::Tensor& input, const ForwardBody& body) {
  if (!hooks_pending(module)) return body(input);
  // A copy of the body: activation checkpointing keeps it until backward.
  return hooked_forward(module, TensorList{input}, [body](const TensorList& in) { return TensorList{body(in.at(0))}; })
      .at(0);
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
