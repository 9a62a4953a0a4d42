// checkpointed_forward: an autograd Function that recomputes in backward.
#include "strata/strategies/activation_checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/ivalue.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "strata/checkpoint/state.h"

namespace strata::strategies {
namespace {

// What the recomputation needs, kept in the autograd context.
struct Recompute : torch::CustomClassHolder {
  ForwardFn body;
  at::Tensor rng_state;
  bool autocast = false;
  c10::ScalarType autocast_dtype = c10::kBFloat16;
};

// Restores autocast and the CPU generator for the recomputation, and puts
// the caller's state back afterwards.
class ReplayState {
 public:
  explicit ReplayState(const Recompute& saved) {
    was_autocast_ = at::autocast::is_autocast_enabled(c10::kCPU);
    previous_dtype_ = at::autocast::get_autocast_dtype(c10::kCPU);
    rng_ = checkpoint::cpu_rng_state();
    checkpoint::set_cpu_rng_state(saved.rng_state);
    at::autocast::set_autocast_dtype(c10::kCPU, saved.autocast_dtype);
    at::autocast::set_autocast_enabled(c10::kCPU, saved.autocast);
  }
  ~ReplayState() {
    at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(c10::kCPU, was_autocast_);
    at::autocast::set_autocast_dtype(c10::kCPU, previous_dtype_);
    checkpoint::set_cpu_rng_state(rng_);
  }

 private:
  bool was_autocast_;
  c10::ScalarType previous_dtype_;
  at::Tensor rng_;
};

struct CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
  // `anchor` requires grad whenever no input does, so that backward
  // reaches this node even for a first layer whose input is data: the
  // parameters inside still need their gradients.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::TensorList inputs,
                                                const at::Tensor& anchor, c10::intrusive_ptr<Recompute> recompute) {
    (void)anchor;
    ctx->saved_data["recompute"] = c10::IValue::make_capsule(recompute);
    ctx->save_for_backward(inputs.vec());
    torch::NoGradGuard no_grad;
    return recompute->body(inputs.vec());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto recompute = ctx->saved_data["recompute"].toCapsule();
    const Recompute& saved = static_cast<const Recompute&>(*recompute);
    TensorList detached;
    for (const at::Tensor& input : ctx->get_saved_variables()) {
      detached.push_back(input.detach().requires_grad_(input.requires_grad()));
    }
    TensorList outputs;
    {
      ReplayState replay(saved);
      c10::AutoGradMode grad_mode(true);
      outputs = saved.body(detached);
    }
    TensorList roots, root_grads;
    for (size_t i = 0; i < outputs.size() && i < grads.size(); ++i) {
      if (!outputs[i].requires_grad() || !grads[i].defined()) continue;
      roots.push_back(outputs[i]);
      root_grads.push_back(grads[i]);
    }
    if (!roots.empty()) torch::autograd::backward(roots, root_grads);
    torch::autograd::variable_list result;
    for (const at::Tensor& input : detached) result.push_back(input.requires_grad() ? input.grad() : at::Tensor());
    result.push_back(at::Tensor());  // anchor
    result.push_back(at::Tensor());  // recompute
    return result;
  }
};

}  // namespace

TensorList checkpointed_forward(const ForwardFn& body, const TensorList& inputs) {
  if (!c10::GradMode::is_enabled()) return body(inputs);
  auto recompute = c10::make_intrusive<Recompute>();
  recompute->body = body;
  recompute->rng_state = checkpoint::cpu_rng_state();
  recompute->autocast = at::autocast::is_autocast_enabled(c10::kCPU);
  recompute->autocast_dtype = at::autocast::get_autocast_dtype(c10::kCPU);
  bool any_input_grad = false;
  for (const at::Tensor& input : inputs) any_input_grad = any_input_grad || input.requires_grad();
  at::Tensor anchor = at::empty({0}).requires_grad_(!any_input_grad);
  return CheckpointFunction::apply(at::TensorList(inputs), anchor, recompute);
}

at::Tensor checkpointed_forward(const ForwardBody& body, const at::Tensor& input) {
  ForwardFn fn = [body](const TensorList& in) { return TensorList{body(in.at(0))}; };
  return checkpointed_forward(fn, TensorList{input}).at(0);
}

}  // namespace strata::strategies
