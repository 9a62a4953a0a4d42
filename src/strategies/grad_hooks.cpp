// GradHooks: accumulator post hooks shared by DDP and FSDP.
#include "grad_hooks.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>

#include "strata/core/error.h"

namespace strata::strategies {

class GradHooks::Hook : public torch::autograd::FunctionPostHook {
 public:
  Hook(std::weak_ptr<State> state, size_t index) : state_(std::move(state)), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    if (auto state = state_.lock()) {
      if (state->on_ready(index_)) state->fired = true;
    }
    return outputs;
  }

 private:
  std::weak_ptr<State> state_;
  size_t index_;
};

GradHooks::GradHooks(std::function<bool(size_t)> on_ready) : state_(std::make_shared<State>()) {
  state_->on_ready = std::move(on_ready);
}

GradHooks::~GradHooks() { remove_all(); }

void GradHooks::add(const at::Tensor& tensor, size_t index) {
  add(torch::autograd::impl::grad_accumulator(tensor), index);
}

void GradHooks::add(GradAccumulator accumulator, size_t index) {
  if (!accumulator) return;
  uintptr_t key = accumulator->add_post_hook(std::make_unique<Hook>(state_, index));
  hooked_.emplace_back(std::move(accumulator), key);
}

void GradHooks::remove_all() {
  for (auto& [accumulator, key] : hooked_) accumulator->del_post_hook(key);
  hooked_.clear();
}

void GradHooks::check_no_stray_backward(const std::string& tag) const {
  STRATA_CHECK(!state_->fired, ConfigError, "[", tag,
               "] the previous backward ran through loss.backward() instead of fabric.backward(): its gradients "
               "were never synchronised across ranks. Call fabric.backward(loss) (or strategy.backward)");
}

}  // namespace strata::strategies
