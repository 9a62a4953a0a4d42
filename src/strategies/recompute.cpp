// recomputed_forward: an autograd Function that recomputes in backward.
#include "strata/strategies/recompute.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/ivalue.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <vector>

#include "strata/checkpoint/state_dict.h"

namespace strata::strategies {
namespace {

// Note [Replaying the forward]
// The recomputation must draw the same random numbers (dropout) and cast
// to the same dtypes as the forward it replaces, as PyTorch's checkpoint
// does with preserve_rng_state: the CPU generator's state, and the state of
// the default generator of every other device the inputs live on (the
// current GPU's, on CUDA: at::globalContext().defaultGenerator, the
// device-generic API, so no CUDA header is needed), are taken before the
// forward and put back around the recomputation, together with the
// autocast settings of the CPU and of those devices. The caller's states
// are put back afterwards, so the recomputation's own draws leave no trace
// in the random streams.
struct DeviceReplay {
  c10::Device device;
  at::Tensor rng_state;
  bool autocast = false;
  c10::ScalarType autocast_dtype = c10::kBFloat16;
};

// The devices (other than the CPU) that `inputs` live on, each once.
std::vector<c10::Device> devices_of(const TensorList& inputs) {
  std::vector<c10::Device> devices;
  for (const at::Tensor& input : inputs) {
    if (!input.defined() || input.device().is_cpu() || input.is_meta()) continue;
    c10::Device device = input.device();
    if (std::find(devices.begin(), devices.end(), device) == devices.end()) devices.push_back(device);
  }
  return devices;
}

DeviceReplay capture(c10::Device device) {
  DeviceReplay replay{device, checkpoint::device_rng_state(device)};
  replay.autocast = at::autocast::is_autocast_enabled(device.type());
  replay.autocast_dtype = at::autocast::get_autocast_dtype(device.type());
  return replay;
}

void apply(const DeviceReplay& replay) {
  checkpoint::set_device_rng_state(replay.device, replay.rng_state, "activation checkpoint replay");
  at::autocast::set_autocast_dtype(replay.device.type(), replay.autocast_dtype);
  at::autocast::set_autocast_enabled(replay.device.type(), replay.autocast);
}

// Note [One update of the running statistics]
// A BatchNorm layer in training updates its running mean and variance (and
// counts the batch) in every forward, the recomputation in backward
// included: recomputed as it is, a checkpointed block would move them
// twice a step, and its buffers would no longer be one process's without
// checkpointing (PyTorch's checkpoint does that). The recomputation's
// outputs do not read them (training normalises by the batch's own
// statistics), so the buffers the caller names are copied before it and
// put back after it: each forward updates them once. Every buffer is
// copied, read-only ones too (a mask): version counters cannot pick out the
// written ones, as the batch-norm kernels write the running statistics
// without moving them. The cost is a copy of the module's buffers a step.
// What the recomputation needs, kept in the autograd context.
struct SavedForward : torch::CustomClassHolder {
  ForwardFn body;
  std::vector<DeviceReplay> states;  // the CPU first, then the inputs' devices
  std::vector<at::Tensor> unchanged;  // Note [One update of the running statistics]
};

// Restores the saved generators and autocast settings for the
// recomputation, and puts the caller's back afterwards.
class ReplayState {
 public:
  explicit ReplayState(const SavedForward& saved) {
    for (const DeviceReplay& state : saved.states) previous_.push_back(capture(state.device));
    for (const DeviceReplay& state : saved.states) apply(state);
  }
  ~ReplayState() {
    at::autocast::clear_cache();
    for (const DeviceReplay& state : previous_) {
      try {
        apply(state);
      } catch (const std::exception&) {
        // A state this process itself read back cannot be refused.
      }
    }
  }

 private:
  std::vector<DeviceReplay> previous_;
};

struct RecomputeFunction : public torch::autograd::Function<RecomputeFunction> {
  // `anchor` requires grad whenever no input does, so that backward
  // reaches this node even for a first layer whose input is data: the
  // parameters inside still need their gradients.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::TensorList inputs,
                                                const at::Tensor& anchor, c10::intrusive_ptr<SavedForward> recompute) {
    (void)anchor;
    ctx->saved_data["recompute"] = c10::IValue::make_capsule(recompute);
    ctx->save_for_backward(inputs.vec());
    torch::NoGradGuard no_grad;
    return recompute->body(inputs.vec());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto recompute = ctx->saved_data["recompute"].toCapsule();
    const SavedForward& saved = static_cast<const SavedForward&>(*recompute);
    TensorList detached;
    for (const at::Tensor& input : ctx->get_saved_variables()) {
      detached.push_back(input.detach().requires_grad_(input.requires_grad()));
    }
    TensorList outputs;
    {
      std::vector<at::Tensor> before;
      for (const at::Tensor& t : saved.unchanged) before.push_back(t.detach().clone());
      ReplayState replay(saved);
      c10::AutoGradMode grad_mode(true);
      outputs = saved.body(detached);
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < before.size(); ++i) saved.unchanged[i].detach().copy_(before[i]);
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

TensorList recomputed_forward(const ForwardFn& body, const TensorList& inputs, std::vector<at::Tensor> unchanged) {
  if (!c10::GradMode::is_enabled()) return body(inputs);
  auto recompute = c10::make_intrusive<SavedForward>();
  recompute->body = body;
  recompute->unchanged = std::move(unchanged);
  recompute->states.push_back(capture(c10::Device(c10::kCPU)));
  for (c10::Device device : devices_of(inputs)) recompute->states.push_back(capture(device));
  bool any_input_grad = false;
  for (const at::Tensor& input : inputs) any_input_grad = any_input_grad || input.requires_grad();
  // On the inputs' device, so that backward reaches this node on that
  // device's autograd thread like the rest of the unit's graph.
  const c10::Device device = inputs.empty() || !inputs.front().defined() ? c10::Device(c10::kCPU)
                                                                         : inputs.front().device();
  at::Tensor anchor = at::empty({0}, at::TensorOptions().device(device)).requires_grad_(!any_input_grad);
  return RecomputeFunction::apply(at::TensorList(inputs), anchor, recompute);
}

at::Tensor recomputed_forward(const ForwardBody& body, const at::Tensor& input) {
  ForwardFn fn = [body](const TensorList& in) { return TensorList{body(in.at(0))}; };
  return recomputed_forward(fn, TensorList{input}).at(0);
}

}  // namespace strata::strategies
