#include "strata/core/module_hooks.h"

#include <mutex>
#include <shared_mutex>
#include <unordered_map>

namespace strata {
namespace {

// Hooks by module identity. Set at set-up, read on every hooked forward.
struct Registry {
  std::shared_mutex mutex;
  std::unordered_map<const torch::nn::Module*, std::shared_ptr<ForwardHooks>> hooks;
};

Registry& registry() {
  static Registry* instance = new Registry();  // never destroyed: modules may outlive static teardown
  return *instance;
}

}  // namespace

std::shared_ptr<ForwardHooks> forward_hooks(const torch::nn::Module& module) {
  Registry& r = registry();
  std::shared_lock<std::shared_mutex> lock(r.mutex);
  auto it = r.hooks.find(&module);
  return it == r.hooks.end() ? nullptr : it->second;
}

void set_forward_hooks(const torch::nn::Module& module, std::shared_ptr<ForwardHooks> hooks) {
  Registry& r = registry();
  std::unique_lock<std::shared_mutex> lock(r.mutex);
  if (hooks) {
    r.hooks[&module] = std::move(hooks);
  } else {
    r.hooks.erase(&module);
  }
}

at::Tensor hooked_forward(torch::nn::Module& module, const at::Tensor& input, const ForwardBody& body) {
  std::shared_ptr<ForwardHooks> hooks = forward_hooks(module);
  if (!hooks) return body(input);
  return hooks->run(module, input, body);
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
